#!/usr/bin/env python3
"""Write a single-layer OCI image archive (importable with `ctr images import`).

usage: mkimage.py OUT.tar IMAGE_NAME --entrypoint JSON [--cmd JSON] [--env K=V]...
                  [--file SRC:DST[:MODE]]... [--link TARGET:DST]... [--dir DST]...
The layer is reproducible (uid/gid 0, mtime 0, sorted entries).
"""
import argparse, gzip, hashlib, io, json, os, tarfile

def add_dirs(tf, seen, path):
    parts = path.strip("/").split("/")[:-1]
    for i in range(1, len(parts) + 1):
        d = "/".join(parts[:i])
        if d and d not in seen:
            seen.add(d)
            ti = tarfile.TarInfo(d); ti.type = tarfile.DIRTYPE; ti.mode = 0o755
            tf.addfile(ti)

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out"); ap.add_argument("name")
    ap.add_argument("--entrypoint", default="null"); ap.add_argument("--cmd", default="null")
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--file", action="append", default=[])
    ap.add_argument("--link", action="append", default=[])
    ap.add_argument("--dir", action="append", default=[])
    ap.add_argument("--workdir", default="/")
    a = ap.parse_args()

    entries = []  # (dst, kind, payload)
    for f in a.file:
        p = f.split(":"); mode = int(p[2], 8) if len(p) > 2 else 0o755
        entries.append((p[1].strip("/"), "file", (p[0], mode)))
    for l in a.link:
        tgt, dst = l.split(":"); entries.append((dst.strip("/"), "link", tgt))
    for d in a.dir:
        entries.append((d.strip("/"), "dir", None))
    entries.sort()

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tf:
        seen = set()
        for dst, kind, payload in entries:
            add_dirs(tf, seen, dst)
            ti = tarfile.TarInfo(dst); ti.uid = ti.gid = 0; ti.mtime = 0
            if kind == "file":
                src, mode = payload
                with open(src, "rb") as fh: data = fh.read()
                ti.size = len(data); ti.mode = mode
                tf.addfile(ti, io.BytesIO(data))
            elif kind == "link":
                ti.type = tarfile.SYMTYPE; ti.linkname = payload; ti.mode = 0o777
                tf.addfile(ti)
            else:
                if dst in seen: continue
                seen.add(dst); ti.type = tarfile.DIRTYPE
                ti.mode = 0o1777 if dst == "tmp" else 0o755
                tf.addfile(ti)
    layer = raw.getvalue()
    gz = gzip.compress(layer, mtime=0)
    blobs = {}
    def blob(b):
        d = "sha256:" + hashlib.sha256(b).hexdigest(); blobs[d] = b; return d
    gz_d = blob(gz)
    cfg = {"architecture": "amd64", "os": "linux",
           "config": {"Entrypoint": json.loads(a.entrypoint), "Cmd": json.loads(a.cmd),
                      "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"] + a.env,
                      "WorkingDir": a.workdir},
           "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
           "history": [{"created_by": "paddock dev/k8s/mkimage.py"}]}
    cfg_b = json.dumps(cfg, sort_keys=True).encode(); cfg_d = blob(cfg_b)
    man = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
           "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cfg_d, "size": len(cfg_b)},
           "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": gz_d, "size": len(gz)}]}
    man_b = json.dumps(man, sort_keys=True).encode(); man_d = blob(man_b)
    tag = a.name.rsplit(":", 1)[1] if ":" in a.name.split("/")[-1] else "latest"
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
             "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": man_d,
                            "size": len(man_b), "platform": {"architecture": "amd64", "os": "linux"},
                            "annotations": {"io.containerd.image.name": a.name,
                                            "org.opencontainers.image.ref.name": tag}}]}
    tmp = a.out + ".tmp"
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as out:
        def put(name, data):
            ti = tarfile.TarInfo(name); ti.size = len(data); ti.mode = 0o644; ti.mtime = 0
            out.addfile(ti, io.BytesIO(data))
        put("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        put("index.json", json.dumps(index, sort_keys=True).encode())
        for d, b in sorted(blobs.items()):
            put("blobs/sha256/" + d.split(":")[1], b)
    os.replace(tmp, a.out)

if __name__ == "__main__":
    main()
