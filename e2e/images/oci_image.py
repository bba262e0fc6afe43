#!/usr/bin/env python3
"""Write an OCI image archive (an OCI image layout in a tar, what `skopeo copy oci-archive:`
and `paddock image import` read) from root directories and whiteouts.

usage: oci_image.py OUT.tar [--layer DIR]... [--whiteout PATH]... [--opaque DIR]...
                    [--env K=V]... [--workdir DIR] [--cmd JSON] [--entrypoint JSON] [--user U]

Each --layer DIR becomes one layer, in order. --whiteout and --opaque entries go into one more
layer on top: a whiteout deletes PATH from the layers below, an opaque DIR hides what they had
in it. Ownership and modes are kept (numeric ids); device nodes and the contents of /dev, /proc
and /sys are left out, as container images do.
"""
import argparse, gzip, hashlib, io, json, os, shutil, sys, tarfile, tempfile

SKIP_CONTENTS = {"dev", "proc", "sys"}


def add_tree(tf, root):
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        dirnames.sort()
        if rel != "." and rel.split(os.sep)[0] in SKIP_CONTENTS:
            dirnames[:] = []
            continue
        for name in sorted(dirnames) + sorted(filenames):
            path = os.path.join(dirpath, name)
            arc = os.path.normpath(os.path.join(rel, name))
            info = tf.gettarinfo(path, arcname=arc)
            if info.ischr() or info.isblk():
                continue
            info.uname = info.gname = ""
            if info.isreg():
                with open(path, "rb") as f:
                    tf.addfile(info, f)
            else:
                tf.addfile(info)


def blob(blobs, data):
    digest = hashlib.sha256(data).hexdigest()
    with open(os.path.join(blobs, digest), "wb") as f:
        f.write(data)
    return "sha256:" + digest


def layer_from(blobs, fill):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tf:
        fill(tf)
    diff_id = "sha256:" + hashlib.sha256(raw.getvalue()).hexdigest()
    packed = gzip.compress(raw.getvalue(), compresslevel=1, mtime=0)
    return {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": blob(blobs, packed), "size": len(packed)}, diff_id


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layer", action="append", default=[])
    ap.add_argument("--whiteout", action="append", default=[])
    ap.add_argument("--opaque", action="append", default=[])
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--workdir")
    ap.add_argument("--cmd")
    ap.add_argument("--entrypoint")
    ap.add_argument("--user")
    ap.add_argument("--name", help="the image's name for `ctr images import` (io.containerd.image.name)")
    a = ap.parse_args()

    work = tempfile.mkdtemp(prefix="oci-image-")
    try:
        blobs = os.path.join(work, "blobs", "sha256")
        os.makedirs(blobs)
        layers, diff_ids = [], []
        for d in a.layer:
            print(f"oci_image: layer from {d}", file=sys.stderr)
            desc, diff = layer_from(blobs, lambda tf, d=d: add_tree(tf, d))
            layers.append(desc); diff_ids.append(diff)
        if a.whiteout or a.opaque:
            def marks(tf):
                for p in a.whiteout:
                    head, name = os.path.split(p.strip("/"))
                    info = tarfile.TarInfo(os.path.join(head, ".wh." + name)); info.mode = 0o644
                    tf.addfile(info, io.BytesIO(b""))
                for p in a.opaque:
                    info = tarfile.TarInfo(p.strip("/")); info.type = tarfile.DIRTYPE; info.mode = 0o755
                    tf.addfile(info)
                    info = tarfile.TarInfo(os.path.join(p.strip("/"), ".wh..wh..opq")); info.mode = 0o644
                    tf.addfile(info, io.BytesIO(b""))
            desc, diff = layer_from(blobs, marks)
            layers.append(desc); diff_ids.append(diff)
        config = {"Env": a.env}
        if a.workdir: config["WorkingDir"] = a.workdir
        if a.cmd: config["Cmd"] = json.loads(a.cmd)
        if a.entrypoint: config["Entrypoint"] = json.loads(a.entrypoint)
        if a.user: config["User"] = a.user
        arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
        cfg = json.dumps({"architecture": arch, "os": "linux", "config": config,
                          "rootfs": {"type": "layers", "diff_ids": diff_ids}}, sort_keys=True).encode()
        cfg_desc = {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": blob(blobs, cfg), "size": len(cfg)}
        manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                               "config": cfg_desc, "layers": layers}, sort_keys=True).encode()
        index = {"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                 "digest": blob(blobs, manifest), "size": len(manifest)}]}
        if a.name:
            index["manifests"][0]["annotations"] = {"io.containerd.image.name": a.name,
                                                    "org.opencontainers.image.ref.name": a.name.rsplit(":", 1)[-1]}
        with open(os.path.join(work, "index.json"), "w") as f: json.dump(index, f)
        with open(os.path.join(work, "oci-layout"), "w") as f: json.dump({"imageLayoutVersion": "1.0.0"}, f)
        tmp = a.out + ".tmp"
        with tarfile.open(tmp, "w") as tf:
            for name in ["oci-layout", "index.json", "blobs"]:
                tf.add(os.path.join(work, name), arcname=name)
        os.replace(tmp, a.out)
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
