//! Volumes on the local runtime, as escape tests: every sandbox is first proven confined (uid
//! 1000, no capabilities, seccomp), then tries to get more out of its volumes than it was
//! given. Targets are files of this test's own directories, never the host's. Runs as root.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use common::{Env, assert_confined, assert_nothing_left, sh};
use paddock_core::runtime::Runtime;
use paddock_core::spec::SandboxSpec;
use paddock_core::volume::{VolumeMount, VolumeSource};
use paddock_runtime_local::VolumeOptions;

fn host(name: &str, path: &Path, at: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: at.into(),
        read_only,
        sub_path: None,
        source: VolumeSource::Host { path: path.to_string_lossy().into_owned() },
    }
}

fn named(name: &str, volume: &str, at: &str, sub_path: Option<&str>, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: at.into(),
        read_only,
        sub_path: sub_path.map(Into::into),
        source: VolumeSource::Named {
            name: volume.into(),
            create: true,
            delete_with_sandbox: false,
            size_bytes: Some(64 << 20),
        },
    }
}

fn spec(volumes: Vec<VolumeMount>) -> SandboxSpec {
    SandboxSpec { volumes, ..Default::default() }
}

#[tokio::test(flavor = "multi_thread")]
async fn host_volumes_map_only_ordinary_owners_and_keep_read_only_and_set_id_out() {
    let roots = tempfile::Builder::new().prefix("pvr").tempdir_in("/tmp").unwrap();
    let shared = roots.path().join("shared");
    let user = shared.join("user");
    std::fs::create_dir_all(&user).unwrap();
    std::fs::set_permissions(roots.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(shared.join("marker"), "root's\n").unwrap();
    std::os::unix::fs::chown(&user, Some(1000), Some(1000)).unwrap();
    let mut env = Env::new();
    env.rt = env.rt.clone().with_volumes(VolumeOptions::new(std::slice::from_ref(&shared)).unwrap());

    let id = env
        .confined(spec(vec![
            host("shared", &shared, "/mnt/shared", false),
            host("user", &user, "/data/user", false),
            host("ro", &user, "/mnt/ro", true),
        ]))
        .await;
    let out = sh(&env.rt, &id, "cat /mnt/shared/marker; stat -c '%u %g' /mnt/shared /data/user").await;
    assert_eq!(out.stdout, "root's\n65534 65534\n1000 1000\n", "{}", out.stderr);

    // Root's directory: readable, and mounted read-only whatever the volume's flag says (a
    // file made there would belong to this sandbox's identity, which a later one may get).
    let out = sh(&env.rt, &id, "touch /mnt/shared/x; grep ' /mnt/shared ' /proc/self/mountinfo").await;
    assert!(out.stderr.contains("Read-only file system"), "{}", out.stderr);
    assert!(out.stdout.contains(" ro,"), "{}", out.stdout);
    assert!(!shared.join("x").exists());
    // /data is new at the top level: this sandbox got a skeleton of its own for it, and the
    // shared ones gained nothing.
    for sk in std::fs::read_dir(env.data().join("skeletons")).into_iter().flatten().flatten() {
        assert!(!sk.path().join("data").exists(), "a shared skeleton grew a /data: {}", sk.path().display());
    }
    // The ordinary owner's directory: written as that owner.
    assert_eq!(sh(&env.rt, &id, "echo w > /data/user/f").await.code(), 0);
    let meta = std::fs::metadata(user.join("f")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (1000, 1000));
    // Read-only holds against writes and remounts.
    let out = sh(&env.rt, &id, "touch /mnt/ro/y; mount -o remount,rw /mnt/ro; touch /mnt/ro/y").await;
    assert!(out.stderr.contains("Read-only file system"), "{}", out.stderr);
    assert!(!user.join("y").exists());
    // No set-id bit, by chmod, by open's mode or by mknod, on a volume or in /tmp.
    let out = sh(
        &env.rt,
        &id,
        "cp /bin/true /data/user/t; chmod 4755 /data/user/t; echo $?; chmod 2755 /data/user/t; echo $?; \
         python3 -c \"import os; os.open('/tmp/s', os.O_CREAT | os.O_WRONLY, 0o6755)\" 2>/dev/null; echo $?; \
         chmod 755 /data/user/t; echo $?",
    )
    .await;
    assert_eq!(out.stdout, "1\n1\n1\n0\n", "{}", out.stderr);
    assert_eq!(std::fs::metadata(user.join("t")).unwrap().mode() & 0o7777, 0o755);
    // Files of the host directory cannot be taken or given away through the file API, which
    // changes owners only between the sandbox user and the shared owners, and only on its own files.
    use paddock_core::runtime::{FileOp, FileOwner};
    for (path, on_host) in [("/mnt/shared/marker", shared.join("marker")), ("/data/user/f", user.join("f"))] {
        let before = std::fs::metadata(&on_host).unwrap();
        for owner in [FileOwner::Nobody, FileOwner::SandboxUser, FileOwner::Id(33)] {
            let r = env.rt.file(&id, FileOp::Chown { path: path.into(), user: Some(owner), group: Some(owner) }).await;
            let after = std::fs::metadata(&on_host).unwrap();
            assert_eq!((after.uid(), after.gid()), (before.uid(), before.gid()), "{path} {owner:?}: {r:?}");
        }
    }
    // Nobody is an owner, never an identity a process can take.
    let out = sh(&env.rt, &id, "python3 -c 'import os; os.setuid(65534)' 2>&1 | tail -1").await;
    assert!(out.stdout.contains("Operation not permitted"), "{}", out.stdout);
    // Nothing outside the volumes is reachable through them.
    let out =
        sh(&env.rt, &id, "ls /mnt/shared/../../ | grep -c pvr; cat /proc/self/mountinfo | grep -c ' /mnt/'").await;
    assert_eq!(out.stdout, "0\n2\n", "{}", out.stderr);
    env.rt.destroy(&id).await.unwrap();
    assert_nothing_left(env.data(), &id);

    // Outside the roots, through a symlink out of them, or without any root: refused.
    let outside = roots.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, shared.join("out")).unwrap();
    for path in [outside.clone(), shared.join("out"), env.data().to_path_buf()] {
        let e = env.rt.create(spec(vec![host("h", &path, "/mnt/h", false)]).validated().unwrap()).await.unwrap_err();
        assert!(e.to_string().contains("outside the directories"), "{path:?}: {e}");
    }
    let plain = Env::new();
    let e = plain.rt.create(spec(vec![host("h", &shared, "/mnt/h", false)]).validated().unwrap()).await.unwrap_err();
    assert!(e.to_string().contains("--volume-root"), "{e}");
}

/// OpenSandbox's code-interpreter suite mounts its log directory at
/// `/tmp/opensandbox-e2e/logs`: a volume below the sandbox's fresh /tmp gets its mount point
/// made there, keeps its flags, and leaves the rest of /tmp the sandbox's own.
#[tokio::test(flavor = "multi_thread")]
async fn volumes_mount_below_the_sandboxs_own_tmp() {
    let roots = tempfile::Builder::new().prefix("pvt").tempdir_in("/tmp").unwrap();
    let logs = roots.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    std::fs::set_permissions(roots.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(&logs, Some(1000), Some(1000)).unwrap();
    let mut env = Env::new();
    env.rt = env.rt.clone().with_volumes(VolumeOptions::new(std::slice::from_ref(&logs)).unwrap());
    let id = env
        .confined(spec(vec![
            host("logs", &logs, "/tmp/opensandbox-e2e/logs", false),
            host("ro", &logs, "/tmp/ro", true),
        ]))
        .await;
    let out = sh(
        &env.rt,
        &id,
        "echo line > /tmp/opensandbox-e2e/logs/run.log && echo scratch > /tmp/own && ls /tmp | sort | tr '\n' ' '",
    )
    .await;
    assert_eq!(out.stdout, "opensandbox-e2e own ro ", "{}", out.stderr);
    assert_eq!(std::fs::read_to_string(logs.join("run.log")).unwrap(), "line\n");
    assert!(!logs.join("own").exists(), "the rest of /tmp is the sandbox's, not the volume's");
    let out = sh(&env.rt, &id, "touch /tmp/ro/x").await;
    assert!(out.stderr.contains("Read-only file system"), "{}", out.stderr);
    assert!(!logs.join("x").exists());
    env.rt.destroy(&id).await.unwrap();
    assert_nothing_left(env.data(), &id);
    // At /tmp itself: refused, naming what to do.
    // (A spec's own check, made where it enters: by the server or the CLI, before the runtime.)
    let e = spec(vec![host("t", &logs, "/tmp", false)]).validated().unwrap_err();
    assert!(e.to_string().contains("mount below it"), "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn named_volumes_are_shared_capped_and_never_followed_out_of() {
    let env = Env::new();
    let a = env.confined(spec(vec![named("v", "shared-data", "/mnt/v", None, false)])).await;
    let out = sh(&env.rt, &a, "mkdir -p /mnt/v/sub && echo one > /mnt/v/sub/f && ln -s / /mnt/v/esc && df -B1M --output=size /mnt/v | tail -1").await;
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let size: u64 = out.stdout.trim().parse().unwrap();
    assert!(size <= 64, "the volume's own cap, not the host's disk: {size} MiB");
    // Filling it stops at the cap with ENOSPC.
    let out = sh(&env.rt, &a, "head -c 100M /dev/zero > /mnt/v/big; echo $?; rm /mnt/v/big").await;
    assert!(out.stderr.contains("No space left"), "{}", out.stderr);

    // A second sandbox (another host identity) at once: a subPath, read-only.
    let b = env.confined(spec(vec![named("v", "shared-data", "/mnt/sub", Some("sub"), true)])).await;
    let out = sh(&env.rt, &b, "cat /mnt/sub/f; ls /mnt/sub; touch /mnt/sub/g").await;
    assert_eq!(out.stdout, "one\nf\n");
    assert!(out.stderr.contains("Read-only"), "{}", out.stderr);
    assert_confined(&env.rt, &b).await;

    // Files on a volume (shared: nobody is one id for every sandbox) are not given to nobody.
    use paddock_core::runtime::{FileOp, FileOwner};
    let e = env
        .rt
        .file(&a, FileOp::Chown { path: "/mnt/v/sub/f".into(), user: Some(FileOwner::Nobody), group: None })
        .await
        .unwrap_err();
    assert!(e.to_string().contains("only files in /workspace and /tmp"), "{e}");
    // A subPath through the symlink the first sandbox left is refused, not followed to `/`.
    let e = env
        .rt
        .create(spec(vec![named("v", "shared-data", "/mnt/x", Some("esc/etc"), false)]).validated().unwrap())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("symbolic link"), "{e}");

    let listed = env.rt.volumes().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].used_by.len(), 2);
    let e = env.rt.delete_volume("shared-data").await.unwrap_err();
    assert!(e.to_string().contains("destroy"), "{e}");
    env.rt.destroy(&a).await.unwrap();
    env.rt.destroy(&b).await.unwrap();
    env.rt.delete_volume("shared-data").await.unwrap();
    assert!(env.rt.volumes().await.unwrap().is_empty());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains("shared-data"), "the volume's host mount is gone with it");
    assert_nothing_left(env.data(), &a);
}
