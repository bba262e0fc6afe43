//! Escape attempts that must fail inside a real sandbox. Each test first proves the sandbox runs
//! as uid 1000 with no capabilities (`Env::confined`), aims only at harmless targets (marker
//! files of its own), and afterwards checks that a bystander sandbox still works.

mod common;

use std::collections::BTreeMap;

use common::{Env, exec, sh};
use paddock_core::runtime::{ExecRequest, Runtime};
use paddock_core::spec::SandboxSpec;

fn spec() -> SandboxSpec {
    SandboxSpec::default()
}

/// A sandbox whose `/workspace` is a plain host directory (no cap), which only library callers
/// can ask for: the one kind of workspace the host can reach into directly.
fn uncapped() -> SandboxSpec {
    let mut s = spec();
    s.resources.workspace_bytes = None;
    s
}

fn marker_name() -> String {
    let mut b = [0u8; 6];
    rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty()).unwrap();
    format!("paddock-marker-{}", b.iter().map(|x| format!("{x:02x}")).collect::<String>())
}

async fn bystander_ok(env: &Env, id: &paddock_core::runtime::SandboxId) {
    let out = sh(&env.rt, id, "echo alive").await;
    assert_eq!((out.code(), out.stdout.as_str()), (0, "alive\n"), "the bystander sandbox broke: {}", out.stderr);
}

#[tokio::test]
async fn environment_is_exactly_the_spec() {
    // SAFETY of the test: a variable set only in this test process; it must not leak inside.
    let env = Env::new();
    let mut s = spec();
    s.env = BTreeMap::from([("GREETING".to_owned(), "hi there".to_owned())]);
    let id = env.confined(s).await;
    let req = ExecRequest {
        argv: vec!["/usr/bin/env".into()],
        env: BTreeMap::from([("PER_CMD".to_owned(), "1".to_owned())]),
        ..Default::default()
    };
    let out = exec(&env.rt, &id, req, None).await;
    let mut lines: Vec<&str> = out.stdout.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "GREETING=hi there",
            "HOME=/workspace",
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "PER_CMD=1"
        ]
    );
    let pwd = sh(&env.rt, &id, "pwd; hostname").await;
    assert_eq!(pwd.stdout, format!("/workspace\n{id}\n"));
}

#[tokio::test]
async fn root_filesystem_is_read_only_and_private_paths_are_hidden() {
    let env = Env::new();
    let id = env.confined(spec()).await;
    let m = marker_name();
    // Writes outside /workspace and /tmp fail; the host is checked afterwards.
    let out = sh(
        &env.rt,
        &id,
        &format!(
            "for d in /usr /etc /var /root /home /run /; do touch $d/{m} 2>/dev/null && echo WROTE $d; done; echo done"
        ),
    )
    .await;
    assert_eq!(out.stdout, "done\n", "a write outside the workspace succeeded");
    for d in ["/usr", "/etc", "/var", "/root", "/home", "/run", "/"] {
        assert!(!std::path::Path::new(d).join(&m).exists(), "marker appeared in host {d}");
    }
    let ok = sh(&env.rt, &id, "touch /workspace/a /tmp/b /dev/shm/c && echo x > /dev/null && echo ok").await;
    assert_eq!(ok.stdout, "ok\n", "{}", ok.stderr);

    // The host's /root, /home and Paddock's data directory are not visible.
    let host_marker = env.data().join(&m);
    std::fs::write(&host_marker, "secret").unwrap();
    let out = sh(
        &env.rt,
        &id,
        &format!("ls -A /root /home /run | tr -d '\\n'; cat {} 2>/dev/null || echo hidden", host_marker.display()),
    )
    .await;
    assert!(out.stdout.ends_with("hidden\n"), "host data dir visible: {:?}", out.stdout);
    assert!(!out.stdout.contains("secret"));
    let listed = out.stdout.trim_end_matches("hidden\n");
    assert!(!listed.contains(".bashrc") && !listed.contains(".cargo"), "/root or /home leaked: {listed:?}");
}

#[tokio::test]
async fn host_processes_are_invisible_and_unreachable() {
    let env = Env::new();
    let id = env.confined(spec()).await;
    let out = sh(&env.rt, &id, "ls /proc | grep -E '^[0-9]+$' | wc -l").await;
    let count: usize = out.stdout.trim().parse().unwrap();
    assert!(count <= 5, "saw {count} processes: host processes are visible");
    // The sandbox's init ignores every signal its own processes send it.
    let out = sh(&env.rt, &id, "kill -KILL 1; kill -TERM 1; kill -INT 1; sleep 0.2; echo sent").await;
    assert_eq!(out.stdout, "sent\n");
    assert_eq!(sh(&env.rt, &id, "echo init-alive").await.stdout, "init-alive\n");
    // The test process's own pid on the host does not exist in the sandbox.
    let me = std::process::id();
    let out = sh(&env.rt, &id, &format!("test -e /proc/{me}/cmdline && cat /proc/{me}/cmdline; echo end")).await;
    assert!(!out.stdout.contains("paddock") || me < 5, "host process visible: {}", out.stdout);
}

#[tokio::test]
async fn network_has_only_loopback_and_reaches_nothing() {
    let env = Env::new();
    let id = env.confined(spec()).await;
    // A listener on the host's loopback must not be reachable from inside.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let out = sh(
        &env.rt,
        &id,
        &format!(
            "ls /sys/class/net; \
             (echo > /dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo REACHED-HOST; \
             (echo > /dev/tcp/192.0.2.1/53) 2>/dev/null && echo REACHED-TEST-NET; \
             python3 -c 'import socket; s=socket.socket(); s.bind((\"127.0.0.1\",0)); s.listen(); c=socket.create_connection(s.getsockname()); print(\"loopback-ok\")'"
        ),
    )
    .await;
    assert!(!out.stdout.contains("REACHED"), "{}", out.stdout);
    let ifaces: Vec<&str> = out.stdout.lines().take_while(|l| *l != "loopback-ok").collect();
    assert_eq!(ifaces, ["lo"], "interfaces other than lo: {ifaces:?}");
    assert!(out.stdout.contains("loopback-ok"), "loopback inside must work: {}", out.stderr);
    listener.set_nonblocking(true).unwrap();
    assert!(listener.accept().is_err(), "a connection reached the host listener");
}

#[tokio::test]
async fn mount_unshare_ptrace_and_new_namespaces_are_denied() {
    let env = Env::new();
    let bystander = env.confined(spec()).await;
    let id = env.confined(spec()).await;
    let script = r#"
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
def call(name, *args):
    r = getattr(libc, name)(*args)
    return "ok" if r >= 0 else errno.errorcode[ctypes.get_errno()]
os.makedirs("/tmp/m", exist_ok=True)
print("mount", call("mount", b"none", b"/tmp/m", b"tmpfs", 0, None))
print("unshare-user", call("unshare", 0x10000000))
print("unshare-net", call("unshare", 0x40000000))
print("ptrace-attach", call("ptrace", 16, 1, 0, 0))
print("clone3", call("syscall", 435, 0, 0))
print("setns", call("setns", 0, 0))
print("bpf", call("syscall", 321, 0, 0, 0))
print("keyctl", call("syscall", 250, 0, 0, 0, 0))
print("io_uring", call("syscall", 425, 1, 0))
print("setuid0", call("setuid", 0))
print("chroot", call("chroot", b"/tmp"))
print("tiocsti", call("ioctl", 0, 0x5412, b"x"))
print("x32-unshare", call("syscall", 272 | 0x40000000, 0x10000000))
print("af_alg", call("socket", 38, 5, 0))
"#;
    let out = exec(
        &env.rt,
        &id,
        ExecRequest { argv: vec!["python3".into(), "-c".into(), script.into()], ..Default::default() },
        None,
    )
    .await;
    let expected = "mount EPERM\nunshare-user EPERM\nunshare-net EPERM\nptrace-attach EPERM\nclone3 ENOSYS\nsetns EPERM\nbpf EPERM\nkeyctl EPERM\nio_uring EPERM\nsetuid0 EINVAL\nchroot EPERM\ntiocsti EPERM\nx32-unshare ENOSYS\naf_alg EPERM\n";
    // setuid(0) is EINVAL, not EPERM: uid 0 does not exist in the sandbox's user namespace.
    assert_eq!(out.stdout, expected, "stderr: {}", out.stderr);
    // Tools a user would reach for fail the same way.
    let out = sh(&env.rt, &id, "unshare -U true 2>/dev/null && echo UNSHARED; mount -t tmpfs none /tmp/m 2>/dev/null && echo MOUNTED; echo end").await;
    assert_eq!(out.stdout, "end\n");
    bystander_ok(&env, &bystander).await;
}

#[tokio::test]
async fn setuid_binaries_do_not_gain_root() {
    let env = Env::new();
    let info = env.create(uncapped()).await;
    common::assert_confined(&env.rt, &info.id).await;
    // A setuid-root copy of `id`, planted by the host in the sandbox's workspace.
    let ws = env.data().join("sandboxes").join(info.id.as_str()).join("workspace");
    let planted = ws.join("suid-id");
    std::fs::copy("/usr/bin/id", &planted).unwrap();
    std::os::unix::fs::chown(&planted, Some(0), Some(0)).unwrap();
    std::fs::set_permissions(&planted, std::os::unix::fs::PermissionsExt::from_mode(0o4755)).unwrap();
    let out = sh(&env.rt, &info.id, "/workspace/suid-id -u; /workspace/suid-id -ru").await;
    assert_eq!(out.stdout, "1000\n1000\n", "{}", out.stderr);
    // The host's own setuid binaries gain nothing either.
    let out =
        sh(&env.rt, &info.id, "ls -l /usr/bin/passwd | cut -c4; python3 -c 'import os; print(os.geteuid())'").await;
    assert_eq!(out.stdout, "s\n1000\n", "{}", out.stderr);
    let out = sh(&env.rt, &info.id, "/usr/bin/mount -t tmpfs none /tmp 2>&1; echo rc=$?").await;
    assert!(out.stdout.ends_with("rc=32\n") || out.stdout.contains("rc=1"), "{}", out.stdout);
}

#[tokio::test]
async fn fork_bomb_stalls_inside_only() {
    let env = Env::new();
    let bystander = env.confined(spec()).await;
    let mut s = spec();
    s.resources.pids = 64;
    let id = env.confined(s).await;
    let bomb = ExecRequest {
        argv: vec!["bash".into(), "-c".into(), "b() { b | b & }; b; sleep 5".into()],
        timeout_ms: Some(3000),
        ..Default::default()
    };
    let out = exec(&env.rt, &id, bomb, None).await;
    assert!(out.outcome.timed_out, "the bomb should run until its timeout: {:?}", out.outcome);
    let peak: u64 = std::fs::read_to_string(format!("/sys/fs/cgroup/pids/paddock/{id}/pids.peak"))
        .map(|s| s.trim().parse().unwrap())
        .unwrap_or(0);
    assert!(peak <= 64, "pids went past the limit: {peak}");
    let events = std::fs::read_to_string(format!("/sys/fs/cgroup/pids/paddock/{id}/pids.events")).unwrap_or_default();
    assert!(events.contains("max") && !events.contains("max 0"), "the limit never bit: {events}");
    // The host can still fork, the sandbox recovers, the bystander is fine.
    assert!(std::process::Command::new("true").status().unwrap().success());
    let again = sh(&env.rt, &id, "echo recovered").await;
    assert_eq!(again.stdout, "recovered\n");
    bystander_ok(&env, &bystander).await;
}

#[tokio::test]
async fn memory_hog_is_oom_killed_inside_and_the_sandbox_survives() {
    let env = Env::new();
    let bystander = env.confined(spec()).await;
    let mut s = spec();
    s.resources.memory_bytes = 64 << 20;
    let id = env.confined(s).await;
    // The kernel's first choice is a command and what it starts; the init (PID 1), whose
    // death would end the sandbox, goes only when nothing else is left. The init is at the top
    // itself for the instant it spawns (its child inherits the score) and puts its own back
    // right after, so a command that reads the init's score at once may still see the top on
    // a busy host: it reads again until the spawn is over, for at most 2 s.
    let read = "cat /proc/self/oom_score_adj; i=0; while [ $i -lt 100 ]; do s=$(cat /proc/1/oom_score_adj); \
                [ \"$s\" -lt 1000 ] && break; i=$((i+1)); sleep 0.02; done; echo \"$s\"";
    let scores = sh(&env.rt, &id, read).await.stdout;
    let scores: Vec<i32> = scores.lines().map(|l| l.parse().unwrap()).collect();
    assert!(scores[0] == 1000 && scores[1] < 1000, "{scores:?}");
    let hog = ExecRequest {
        argv: vec!["python3".into(), "-c".into(), "a = []\nwhile True: a.append(bytearray(8 << 20))".into()],
        timeout_ms: Some(30_000),
        ..Default::default()
    };
    let out = exec(&env.rt, &id, hog, None).await;
    assert_eq!(out.outcome.signal, Some(9), "{:?} {}", out.outcome, out.stderr);
    assert_eq!(out.code(), 137);
    assert!(out.outcome.oom_killed, "the kill should be reported as an OOM kill");
    let again = sh(&env.rt, &id, "echo survived").await;
    assert_eq!(again.stdout, "survived\n");
    bystander_ok(&env, &bystander).await;
}

#[tokio::test]
async fn tmp_is_size_capped() {
    let env = Env::new();
    let mut s = spec();
    s.resources.tmp_bytes = 8 << 20;
    let id = env.confined(s).await;
    let out =
        sh(&env.rt, &id, "dd if=/dev/zero of=/tmp/fill bs=1M count=32 2>&1 | grep -c 'No space'; stat -c %s /tmp/fill")
            .await;
    let mut lines = out.stdout.lines();
    assert_eq!(lines.next(), Some("1"), "{}", out.stdout);
    let size: u64 = lines.next().unwrap().parse().unwrap();
    assert!(size <= 8 << 20, "/tmp grew past its cap: {size}");
    assert_eq!(sh(&env.rt, &id, "rm /tmp/fill && echo freed").await.stdout, "freed\n");
}

#[tokio::test]
async fn another_sandboxes_workspace_is_out_of_reach() {
    let env = Env::new();
    // Plain host directories, so that the host path of A's file is known and B is shown it.
    let a = env.rt.acquire(&"thread-a".parse_thread(), uncapped().validated().unwrap()).await.unwrap();
    let b = env.rt.acquire(&"thread-b".parse_thread(), uncapped().validated().unwrap()).await.unwrap();
    common::assert_confined(&env.rt, &a.id).await;
    common::assert_confined(&env.rt, &b.id).await;
    let m = marker_name();
    assert_eq!(sh(&env.rt, &a.id, &format!("echo secret > /workspace/{m} && echo ok")).await.stdout, "ok\n");
    let host_path = env.data().join("workspaces").join(&a.workspace.as_ref().unwrap().name).join("files").join(&m);
    assert_eq!(std::fs::read_to_string(&host_path).unwrap(), "secret\n");
    let out = sh(
        &env.rt,
        &b.id,
        &format!(
            "cat /workspace/{m} 2>/dev/null; cat {} 2>/dev/null; find / -xdev -name '{m}' 2>/dev/null; echo end",
            host_path.display()
        ),
    )
    .await;
    assert_eq!(out.stdout, "end\n", "sandbox B saw A's workspace");
}

#[tokio::test]
async fn rootfs_directory_replaces_the_host_root() {
    let env = Env::new();
    // A root filesystem inside the data directory (where sandboxes write) is refused.
    let inside = env.data().join("rootfs");
    std::fs::create_dir_all(&inside).unwrap();
    let mut s = spec();
    s.image = Some(inside.to_string_lossy().into_owned());
    let err = env.rt.create(s.validated().unwrap()).await.unwrap_err();
    assert!(err.to_string().contains("inside Paddock's data directory"), "{err}");
    // A tiny root filesystem: dash and the libraries it needs, nothing else.
    let image = tempfile::Builder::new().prefix("pdi").tempdir_in("/tmp").unwrap();
    let root = image.path().join("rootfs");
    for f in ["/usr/bin/dash", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"] {
        let dst = root.join(f.trim_start_matches('/'));
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        std::fs::copy(f, &dst).unwrap();
    }
    let mut s = spec();
    s.image = Some(root.to_string_lossy().into_owned());
    let id = env.create(s).await.id;
    let req = ExecRequest {
        argv: vec![
            "/usr/bin/dash".into(),
            "-c".into(),
            "test -e /etc/passwd && echo host || echo image; echo > /usr/x 2>/dev/null || echo ro".into(),
        ],
        ..Default::default()
    };
    let out = exec(&env.rt, &id, req, None).await;
    assert_eq!(out.stdout, "image\nro\n", "{}", out.stderr);
}

trait ParseThread {
    fn parse_thread(&self) -> paddock_core::naming::ThreadId;
}
impl ParseThread for str {
    fn parse_thread(&self) -> paddock_core::naming::ThreadId {
        paddock_core::naming::ThreadId::new(self).unwrap()
    }
}

/// Starts a command in `id` that opens inotify instances until the kernel refuses one, keeps
/// them for 30 s, and reports how many it holds. Returns its control and that count (> 0).
async fn hold_every_inotify_instance(
    env: &Env,
    id: &paddock_core::runtime::SandboxId,
) -> (Box<dyn paddock_core::runtime::Execution>, u32) {
    let script = "import ctypes, time\nlibc = ctypes.CDLL(None)\nheld = []\nwhile True:\n    fd = libc.inotify_init1(0)\n    if fd < 0: break\n    held.append(fd)\nprint(len(held), flush=True)\ntime.sleep(30)\n";
    let req = ExecRequest {
        argv: vec!["python3".into(), "-c".into(), script.into()],
        timeout_ms: Some(20_000),
        ..Default::default()
    };
    let process = env.rt.exec(id, req).await.unwrap();
    let mut line = String::new();
    tokio::io::AsyncBufReadExt::read_line(&mut tokio::io::BufReader::new(process.stdout), &mut line).await.unwrap();
    let held = line.trim().parse::<u32>().unwrap_or(0);
    assert!(held > 0, "the sandbox could open no inotify instance at all");
    (process.control, held)
}

#[tokio::test]
async fn exhausting_per_user_kernel_limits_does_not_reach_host_root() {
    let env = Env::new();
    let id = env.confined(spec()).await;
    // Hold as many inotify instances as the kernel allows this user, then check from the host.
    let (mut hog, held) = hold_every_inotify_instance(&env, &id).await;
    let host = rustix::fs::inotify::init(rustix::fs::inotify::CreateFlags::CLOEXEC);
    assert!(host.is_ok(), "host root lost inotify after a sandbox held {held} instances: {host:?}");
    hog.signal(9).await.unwrap();
    hog.wait().await.unwrap();
}

/// The host uid a sandbox's own uid maps to, from its `/proc/self/uid_map`, after checking both
/// maps: the sandbox user to its own identity, every other id but root into the range of owners
/// every sandbox shares (nobody to Paddock's nobody), and nothing else.
async fn host_uid_of(env: &Env, id: &paddock_core::runtime::SandboxId) -> u32 {
    use paddock_runtime_local::identity::{NOBODY, OTHERS, OTHERS_END};
    let mut own_host = None;
    for map in ["uid_map", "gid_map"] {
        let out = sh(&env.rt, id, &format!("cat /proc/self/{map}")).await;
        let lines: Vec<(u32, u32, u32)> = out
            .stdout
            .lines()
            .map(|l| {
                let f: Vec<u32> = l.split_whitespace().map(|x| x.parse().unwrap()).collect();
                (f[0], f[1], f[2])
            })
            .collect();
        let covers = |inside: u32| lines.iter().filter(|(i, _, n)| (*i..*i + *n).contains(&inside)).count();
        assert_eq!(covers(0), 0, "root is mapped: {}", out.stdout);
        assert!((1..=65534).all(|i| covers(i) == 1), "every id 1..=65534 once: {}", out.stdout);
        assert_eq!(lines.iter().map(|l| l.2).sum::<u32>(), 65534, "{map}: {}", out.stdout);
        let own = lines.iter().find(|l| l.0 == 1000).expect("the sandbox user is mapped");
        assert_eq!(own.2, 1, "{}", out.stdout);
        for &(inside, host, count) in lines.iter().filter(|l| l.0 != 1000) {
            assert!(
                OTHERS <= host && host + count - 1 <= OTHERS_END,
                "{map}: {inside} maps outside the shared owners: {}",
                out.stdout
            );
            if inside == 65534 {
                assert_eq!(host, NOBODY, "{}", out.stdout);
            } else {
                assert_eq!(host, OTHERS + inside, "{}", out.stdout);
            }
        }
        if map == "uid_map" {
            own_host = Some(own.1);
        }
    }
    own_host.unwrap()
}

#[tokio::test]
async fn every_sandbox_has_a_host_identity_of_its_own_so_per_user_limits_are_not_shared() {
    use paddock_runtime_local::identity::{BASE, SLOTS};
    let env = Env::new();
    let (hog_id, other) = (env.confined(spec()).await, env.confined(spec()).await);
    let (a, b) = (host_uid_of(&env, &hog_id).await, host_uid_of(&env, &other).await);
    assert_ne!(a, b, "two sandboxes share host uid {a}");
    for uid in [a, b] {
        assert!((BASE..BASE + SLOTS).contains(&uid), "host uid {uid} is outside Paddock's range");
    }
    // One sandbox holds every inotify instance the kernel allows its user...
    let (mut hog, held) = hold_every_inotify_instance(&env, &hog_id).await;
    // ... and another sandbox still has its own.
    let probe = "import ctypes\nfd = ctypes.CDLL(None).inotify_init1(0)\nprint('ok' if fd >= 0 else 'exhausted')";
    let out = exec(
        &env.rt,
        &other,
        ExecRequest { argv: vec!["python3".into(), "-c".into(), probe.into()], ..Default::default() },
        None,
    )
    .await;
    assert_eq!(out.stdout, "ok\n", "the other sandbox lost inotify to the hog ({held} held): {}", out.stderr);
    hog.signal(9).await.unwrap();
    hog.wait().await.unwrap();

    // The identity is recorded while the sandbox lives, and given back when it is destroyed.
    let claimed = |uid: u32| env.data().join("ids").join((uid - BASE).to_string());
    assert!(claimed(a).is_file(), "the identity of a live sandbox is not recorded");
    env.rt.destroy(&hog_id).await.unwrap();
    common::eventually("a destroyed sandbox's identity was not given back", || !claimed(a).exists());
    bystander_ok(&env, &other).await;
}

#[tokio::test]
async fn other_host_users_cannot_reach_sandbox_files_and_the_api_sets_no_set_id_bits() {
    use paddock_core::naming::ThreadId;
    use paddock_core::runtime::{FileOp, FileReply};
    let env = Env::new();
    let thread = ThreadId::new("identity-thread").unwrap();
    // Workspaces on host directories: capped ones (an image, a tmpfs) are mounted only in the
    // sandbox's own mount namespaces, where no host user reaches at all.
    let ws = env.rt.acquire(&thread, uncapped().validated().unwrap()).await.unwrap();
    common::assert_confined(&env.rt, &ws.id).await;
    let scratch = env.confined(uncapped()).await;
    let first = host_uid_of(&env, &ws.id).await;
    // Files the sandboxes make world-readable, and a copy of a shell they try to make set-uid
    // (seccomp refuses the bit, so it stays a plain executable).
    for id in [&ws.id, &scratch] {
        let out = sh(&env.rt, id, "echo secret > /workspace/s && chmod 644 /workspace/s && chmod 755 /workspace && cp /bin/sh /workspace/suid && chmod 755 /workspace/suid && { chmod 4755 /workspace/suid; stat -c %a /workspace/suid; }").await;
        assert_eq!(out.stdout, "755\n", "{}", out.stderr);
        assert!(out.stderr.contains("Operation not permitted"), "{}", out.stderr);
    }
    let name = ws.workspace.as_ref().unwrap().name.clone();
    let targets = [
        env.data().join("workspaces").join(&name).join("files/s"),
        env.data().join("workspaces").join(&name).join("files/suid"),
        env.data().join("sandboxes").join(scratch.as_str()).join("workspace/s"),
    ];
    for target in &targets {
        assert!(target.exists(), "{} should exist for root", target.display());
        // As an ordinary host user (nobody), the files are out of reach.
        let out = std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "cat"])
            .arg(target)
            .output()
            .unwrap();
        assert!(!out.status.success(), "host user nobody read {}", target.display());
        assert!(String::from_utf8_lossy(&out.stderr).contains("Permission denied"), "{out:?}");
    }
    // The file API never sets set-id bits.
    env.rt.file(&ws.id, FileOp::Chmod { path: "/workspace/s".into(), mode: 0o6755 }).await.unwrap();
    match env.rt.file(&ws.id, FileOp::Stat { path: "/workspace/s".into() }).await.unwrap() {
        FileReply::Stat(s) => assert_eq!(s.mode & 0o7777, 0o755, "set-id bits set through the API"),
        other => panic!("{other:?}"),
    }
    // A workspace keeps its identity across sandboxes, so its files stay its own.
    env.rt.release(&thread).await.unwrap();
    let again = env.rt.acquire(&thread, uncapped().validated().unwrap()).await.unwrap();
    common::assert_confined(&env.rt, &again.id).await;
    assert_eq!(host_uid_of(&env, &again.id).await, first, "the workspace changed identity");
    assert_eq!(sh(&env.rt, &again.id, "cat /workspace/s").await.stdout, "secret\n");
    env.rt.destroy_workspace(&thread).await.unwrap();
    let slot = (first - paddock_runtime_local::identity::BASE).to_string();
    assert!(!env.data().join("ids").join(slot).exists(), "a destroyed workspace's identity was not given back");
}

#[tokio::test]
async fn files_can_be_given_to_any_id_but_root_and_no_process_of_the_sandbox_takes_them_back() {
    use paddock_core::runtime::{FileOp, FileOwner, RuntimeError};
    use paddock_runtime_local::identity::{NOBODY, OTHERS};
    use std::os::unix::fs::MetadataExt;
    let env = Env::new();
    let id = env.confined(uncapped()).await;
    let own = host_uid_of(&env, &id).await;
    let f = env.data().join("sandboxes").join(id.as_str()).join("workspace/f");
    let on_host = || {
        let m = std::fs::metadata(&f).unwrap();
        (m.uid(), m.gid())
    };
    let inside = |id| {
        let env = &env;
        async move { sh(&env.rt, id, "stat -c %u:%g /workspace/f").await.stdout }
    };
    let out = sh(&env.rt, &id, "echo data > /workspace/f && chmod 640 /workspace/f && mkdir -m 755 /workspace/d").await;
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let chown = |path: &str, user, group| env.rt.file(&id, FileOp::Chown { path: path.into(), user, group });

    // To www-data (33): the sandbox sees 33, the host a shared owner's id, never a real user's.
    chown("/workspace/f", Some(FileOwner::Id(33)), Some(FileOwner::Id(33))).await.unwrap();
    assert_eq!(inside(&id).await, "33:33\n");
    assert_eq!(on_host(), (OTHERS + 33, OTHERS + 33));
    // The sandbox user is now "other" to it (mode 640), and cannot take it back or become 33.
    let out = sh(
        &env.rt,
        &id,
        "cat /workspace/f; echo more >> /workspace/f; chown 1000 /workspace/f; \
         python3 -c 'import os; os.setuid(33)' 2>&1 | tail -1; python3 -c 'import os; os.setgroups([33])' 2>&1 | tail -1",
    )
    .await;
    assert_eq!(out.stderr.matches("Permission denied").count(), 2, "{}", out.stderr);
    assert!(out.stderr.contains("Operation not permitted"), "{}", out.stderr);
    assert_eq!(out.stdout.matches("Operation not permitted").count(), 2, "{}", out.stdout);
    assert_eq!(on_host(), (OTHERS + 33, OTHERS + 33));

    // On to another id and nobody, then back to the sandbox user by its id.
    chown("/workspace/f", Some(FileOwner::Id(4242)), Some(FileOwner::Nobody)).await.unwrap();
    assert_eq!(inside(&id).await, "4242:65534\n");
    assert_eq!(on_host(), (OTHERS + 4242, NOBODY));
    chown("/workspace/f", Some(FileOwner::Id(1000)), Some(FileOwner::SandboxUser)).await.unwrap();
    assert_eq!(on_host().0, own);
    assert_eq!(sh(&env.rt, &id, "echo more >> /workspace/f && cat /workspace/f").await.stdout, "data\nmore\n");

    // Root and ids that do not exist inside are refused, and change nothing.
    for bad in [0, 65535, u32::MAX] {
        let e = chown("/workspace/f", Some(FileOwner::Id(bad)), None).await.unwrap_err();
        assert!(matches!(e, RuntimeError::InvalidArgument(_)), "{bad}: {e:?}");
        assert!(e.to_string().contains(if bad == 0 { "root" } else { "does not exist" }), "{e}");
        let e = chown("/workspace/f", None, Some(FileOwner::Id(bad))).await.unwrap_err();
        assert!(matches!(e, RuntimeError::InvalidArgument(_)), "{bad}: {e:?}");
    }
    assert_eq!(inside(&id).await, "1000:1000\n");

    // A directory given away takes no new files from the sandbox user.
    chown("/workspace/d", Some(FileOwner::Id(33)), None).await.unwrap();
    let out = sh(&env.rt, &id, "touch /workspace/d/x").await;
    assert!(out.stderr.contains("Permission denied"), "{}", out.stderr);
    // Files outside the sandbox's own storage keep their owners.
    let e = chown("/etc/hostname", Some(FileOwner::Id(33)), None).await.unwrap_err();
    assert!(e.to_string().contains("only files in /workspace and /tmp"), "{e}");
    env.rt.destroy(&id).await.unwrap();
}

/// Runs a python3 script in a confined sandbox that calls raw syscalls through ctypes and prints
/// one `name result` line per call (`ok <value>` or the errno's name).
const SYSCALL_PRELUDE: &str = r#"
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(name, nr, *args):
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_ulong(a) for a in args])
    print(name, ("ok %d" % r) if r >= 0 else errno.errorcode[ctypes.get_errno()])
"#;

async fn syscalls(env: &Env, id: &paddock_core::runtime::SandboxId, calls: &str) -> String {
    let script = format!("{SYSCALL_PRELUDE}{calls}");
    let out = exec(
        &env.rt,
        id,
        ExecRequest { argv: vec!["python3".into(), "-c".into(), script], ..Default::default() },
        None,
    )
    .await;
    assert_eq!(out.code(), 0, "the syscall script failed: {}", out.stderr);
    out.stdout
}

#[tokio::test]
async fn memfd_secret_is_denied() {
    let env = Env::new();
    let bystander = env.confined(spec()).await;
    let id = env.confined(spec()).await;
    // memfd_secret(0): EPERM from the filter, where the kernel would give a descriptor (or
    // ENOSYS when secretmem is off); memfd_create, its harmless cousin, still works.
    let out = syscalls(
        &env,
        &id,
        "call('memfd_secret', 447, 0)\nimport os; os.memfd_create('x'); print('memfd_create ok')\n",
    )
    .await;
    assert_eq!(out, "memfd_secret EPERM\nmemfd_create ok\n");
    bystander_ok(&env, &bystander).await;
}

#[cfg(target_arch = "x86_64")]
#[tokio::test]
async fn modify_ldt_is_denied() {
    let env = Env::new();
    let bystander = env.confined(spec()).await;
    let id = env.confined(spec()).await;
    // modify_ldt(0 = read, NULL, 0) would return 0 (an empty LDT); writing an entry (1) is the
    // dangerous part and fails the same way.
    let out = syscalls(&env, &id, "call('read', 154, 0, 0, 0)\ncall('write', 154, 1, 0, 16)\n").await;
    assert_eq!(out, "read EPERM\nwrite EPERM\n");
    bystander_ok(&env, &bystander).await;
}

#[tokio::test]
async fn personality_flags_are_denied_and_harmless_values_work() {
    let env = Env::new();
    let bystander = env.confined(spec()).await;
    let id = env.confined(spec()).await;
    let out = syscalls(
        &env,
        &id,
        "call('query', 135, 0xffffffff)
call('read-implies-exec', 135, 0x0400000)
call('addr-no-randomize', 135, 0x0040000)
call('linux32-with-flag', 135, 8 | 0x0040000)
call('high-bits', 135, 0x100000000 | 0x0400000)
call('linux32', 135, 8)
call('query-after-linux32', 135, 0xffffffff)
call('linux', 135, 0)
call('query-after-linux', 135, 0xffffffff)
",
    )
    .await;
    assert_eq!(
        out,
        "query ok 0\nread-implies-exec EPERM\naddr-no-randomize EPERM\nlinux32-with-flag EPERM\nhigh-bits EPERM\nlinux32 ok 0\nquery-after-linux32 ok 8\nlinux ok 8\nquery-after-linux ok 0\n"
    );
    // What people actually run: `setarch -R` (no ASLR) fails, `linux32` works.
    let out = sh(&env.rt, &id, "setarch -R true 2>/dev/null && echo NO-ASLR; linux32 uname -m").await;
    assert_eq!(out.stdout, "i686\n", "{}", out.stderr);
    bystander_ok(&env, &bystander).await;
}

#[tokio::test]
async fn a_sandbox_cannot_take_every_pseudo_terminal() {
    let env = Env::new();
    let bystander = env.confined(spec()).await;
    let id = env.confined(spec()).await;
    let max = paddock_sys::mounts::MAX_PTYS;
    // Holds every pty it can get in the background, so the host and the bystander are tried
    // while the sandbox still holds them; the count is written once it hits the limit.
    let hog = "import os, time\n\
               fds = []\n\
               try:\n\
               \x20   while len(fds) < 100000: fds.append(os.openpty())\n\
               except OSError as e: err = e.strerror\n\
               open('/tmp/ptys.tmp', 'w').write(f'{len(fds)} {err}')\n\
               os.rename('/tmp/ptys.tmp', '/tmp/ptys')\n\
               time.sleep(60)\n";
    let started = exec(
        &env.rt,
        &id,
        ExecRequest {
            argv: vec![
                "/bin/sh".into(),
                "-c".into(),
                "python3 -c \"$HOG\" </dev/null >/dev/null 2>/tmp/hog.err & echo started".into(),
            ],
            env: BTreeMap::from([("HOG".to_owned(), hog.to_owned())]),
            ..Default::default()
        },
        None,
    )
    .await;
    assert_eq!(started.stdout, "started\n", "{}", started.stderr);
    let mut held = String::new();
    for _ in 0..200 {
        held = sh(&env.rt, &id, "cat /tmp/ptys 2>/dev/null").await.stdout;
        if !held.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let err = sh(&env.rt, &id, "cat /tmp/hog.err").await.stdout;
    let (count, why) = held.split_once(' ').unwrap_or_else(|| panic!("the pty hog never finished: {err}"));
    assert_eq!(count.parse::<u32>().unwrap(), max, "the sandbox got {count} ptys ({why}); the limit is {max}");
    assert_eq!(why, "No space left on device", "the hog stopped for another reason than the pty limit");

    // The host still gets a terminal (closed again when dropped), and so does the bystander.
    let host = std::fs::OpenOptions::new().read(true).write(true).open("/dev/ptmx");
    assert!(host.is_ok(), "the host could not open a pty while the sandbox held {max}: {host:?}");
    drop(host);
    let out = sh(&env.rt, &bystander, "python3 -c 'import os; os.openpty(); print(\"pty-ok\")'").await;
    assert_eq!(out.stdout, "pty-ok\n", "the bystander could not open a pty: {}", out.stderr);
    bystander_ok(&env, &bystander).await;
    env.rt.destroy(&id).await.unwrap();
}

/// A file only a data directory holds, readable by anyone who can reach it, so that only the
/// mask keeps a sandbox from it.
fn plant_marker(env: &Env) -> (std::path::PathBuf, String) {
    use std::os::unix::fs::PermissionsExt;
    let m = marker_name();
    let path = env.data().join(&m);
    let secret = format!("secret-{m}");
    std::fs::write(&path, format!("{secret}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    (path, secret)
}

#[tokio::test]
async fn no_sandbox_sees_another_instances_data_directory() {
    use std::os::unix::fs::PermissionsExt;
    let first = Env::new();
    let bystander = first.confined(spec()).await;
    // /tmp is never bound into a sandbox, so the other instance lives where a host root shows it.
    let second = Env::new_in(std::path::Path::new("/var/tmp"));
    let (marker, text) = plant_marker(&second);
    let id = first.confined(spec()).await;
    let out =
        sh(&first.rt, &id, &format!("cat {} 2>&1; ls -A {} 2>&1; echo end", marker.display(), second.data().display()))
            .await;
    assert!(!out.stdout.contains(&text), "a host-root sandbox read another instance's data: {}", out.stdout);
    assert!(out.stdout.ends_with("\nend\n") && out.stdout.contains("No such file"), "{}", out.stdout);
    // The instance's own data directory stays hidden too.
    let (own, own_text) = plant_marker(&first);
    let out = sh(&first.rt, &id, &format!("cat {} 2>&1; echo end", own.display())).await;
    assert!(!out.stdout.contains(&own_text), "{}", out.stdout);

    // An image root that holds the second instance's data directory somewhere below it.
    let image = tempfile::Builder::new().prefix("pdi").tempdir_in("/tmp").unwrap();
    let root = image.path().join("rootfs");
    for f in ["/usr/bin/dash", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"] {
        let dst = root.join(f.trim_start_matches('/'));
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        std::fs::copy(f, &dst).unwrap();
    }
    let srv = root.join("srv/deep");
    std::fs::create_dir_all(&srv).unwrap();
    for dir in [image.path(), &root, &root.join("srv"), &srv] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let nested = Env::new_in(&srv);
    let (marker, text) = plant_marker(&nested);
    let inside = std::path::Path::new("/").join(marker.strip_prefix(&root).unwrap());
    let mut s = spec();
    s.image = Some(root.to_string_lossy().into_owned());
    let id = first.create(s).await.id;
    let req = ExecRequest {
        argv: vec![
            "/usr/bin/dash".into(),
            "-c".into(),
            format!("test -e /srv/deep && echo root-ok; read -r x < {} && echo \"$x\"; echo end", inside.display()),
        ],
        ..Default::default()
    };
    let out = exec(&first.rt, &id, req, None).await;
    assert!(
        out.stdout.starts_with("root-ok\n"),
        "the image root is not the one expected: {} {}",
        out.stdout,
        out.stderr
    );
    assert!(!out.stdout.contains(&text), "an image-root sandbox read a data directory inside its root: {}", out.stdout);
    assert_eq!(out.stdout, "root-ok\nend\n", "{}", out.stderr);
    bystander_ok(&first, &bystander).await;
    drop(nested);
}

#[tokio::test]
async fn a_sandbox_cannot_fill_the_host_disk_or_its_inodes_through_the_workspace() {
    let env = Env::new();
    let bystander = env.confined(spec()).await;
    // By default the workspace is capped too: at the memory limit, since it is memory.
    let out = sh(&env.rt, &bystander, "df -B1 --output=size,itotal /workspace | tail -1").await;
    let fields: Vec<u64> = out.stdout.split_whitespace().map(|f| f.parse().unwrap()).collect();
    let defaults = SandboxSpec::default().resources;
    assert_eq!(
        fields,
        [defaults.memory_bytes.min(defaults.workspace_bytes.unwrap()), defaults.workspace_inodes],
        "df inside does not show the default caps: {}",
        out.stderr
    );

    let mut s = spec();
    s.resources.workspace_bytes = Some(16 << 20);
    s.resources.workspace_inodes = 2048;
    let id = env.confined(s).await;
    let out = sh(&env.rt, &id, "df -B1 --output=size,itotal /workspace | tail -1").await;
    assert_eq!(out.stdout.split_whitespace().collect::<Vec<_>>(), ["16777216", "2048"], "{}", out.stderr);
    // Past the size cap: a clean ENOSPC, and nothing of it on the host's disk.
    let out = sh(
        &env.rt,
        &id,
        "dd if=/dev/zero of=/workspace/fill bs=1M count=64 2>&1 | grep -c 'No space'; stat -c %s /workspace/fill",
    )
    .await;
    let mut lines = out.stdout.lines();
    assert_eq!(lines.next(), Some("1"), "writing past the cap did not fail with ENOSPC: {}", out.stdout);
    let size: u64 = lines.next().unwrap().parse().unwrap();
    assert!(size <= 16 << 20, "/workspace grew past its cap: {size}");
    let du = std::process::Command::new("du").args(["-sk"]).arg(env.data()).output().unwrap();
    let used_kib: u64 = String::from_utf8_lossy(&du.stdout).split_whitespace().next().unwrap().parse().unwrap();
    assert!(used_kib < 1024, "the workspace's bytes reached the host disk: {used_kib} KiB in the data directory");
    assert_eq!(sh(&env.rt, &id, "rm /workspace/fill && echo freed").await.stdout, "freed\n");
    // Past the inode cap: ENOSPC as well, at the cap.
    let out = sh(
        &env.rt,
        &id,
        "python3 -c '\n\
         import errno\n\
         n = 0\n\
         try:\n\
         \x20   while n < 100000: open(f\"/workspace/f{n}\", \"w\").close(); n += 1\n\
         except OSError as e: print(n, errno.errorcode[e.errno])'",
    )
    .await;
    let (n, why) = out.stdout.trim().split_once(' ').unwrap_or_else(|| panic!("{} {}", out.stdout, out.stderr));
    assert_eq!(why, "ENOSPC", "{}", out.stdout);
    let n: u64 = n.parse().unwrap();
    assert!((2000..2048).contains(&n), "created {n} files under an inode cap of 2048");
    bystander_ok(&env, &bystander).await;
    assert_eq!(sh(&env.rt, &bystander, "touch /workspace/x && echo wrote").await.stdout, "wrote\n");
}

#[tokio::test]
async fn every_file_paddock_keeps_in_its_data_directory_is_root_only() {
    use paddock_core::naming::ThreadId;
    use paddock_core::volume::{VolumeMount, VolumeSource};
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let env = Env::new();
    // A capped persistent workspace (an image), a named volume, a scratch sandbox.
    let thread = ThreadId::new("private-thread").unwrap();
    let mut ws_spec = spec();
    ws_spec.resources.workspace_bytes = Some(32 << 20);
    let ws = env.rt.acquire(&thread, ws_spec.validated().unwrap()).await.unwrap();
    common::assert_confined(&env.rt, &ws.id).await;
    let volume = VolumeMount {
        name: "v".into(),
        mount_path: "/mnt/v".into(),
        read_only: false,
        sub_path: None,
        source: VolumeSource::Named {
            name: "private-vol".into(),
            create: true,
            delete_with_sandbox: false,
            size_bytes: Some(32 << 20),
        },
    };
    let scratch = env.confined(SandboxSpec { volumes: vec![volume], ..spec() }).await;
    let mut open = Vec::new();
    let mut stack = vec![env.data().to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            let rel = path.strip_prefix(env.data()).unwrap().to_string_lossy().into_owned();
            // Mount points, the image store (0700) and what sandboxes themselves keep.
            if ["skeletons", "images", "volume-mounts"].iter().any(|p| rel.starts_with(p))
                || rel.contains("/files")
                || rel.ends_with("/workspace")
                || rel.ends_with("/wsmnt")
                || rel.ends_with("/volumes")
                || rel.ends_with("/image")
            {
                continue;
            }
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                stack.push(path);
            } else if meta.is_file() && !meta.file_type().is_socket() && meta.permissions().mode() & 0o077 != 0 {
                open.push(format!("{rel} {:o}", meta.permissions().mode() & 0o777));
            }
        }
    }
    assert!(open.is_empty(), "files others may read: {open:?}");
    env.rt.destroy(&scratch).await.unwrap();
    env.rt.destroy_workspace(&thread).await.unwrap();
    env.rt.delete_volume("private-vol").await.unwrap();
}
