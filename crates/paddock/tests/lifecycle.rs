//! Lifecycle of real sandboxes: exec semantics, workspaces, reattaching from another process,
//! pause, expiry, a dead supervisor, and destroy leaving nothing behind.

mod common;

use std::time::{Duration, Instant};

use common::{Env, assert_nothing_left, exec, sh};
use paddock_core::naming::{NamingMode, ThreadId};
use paddock_core::runtime::{ExecRequest, Runtime, RuntimeError, SandboxState};
use paddock_core::spec::{SandboxSpec, ValidatedSpec};
use paddock_runtime_local::LocalRuntime;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

fn thread(s: &str) -> ThreadId {
    ThreadId::new(s).unwrap()
}

#[tokio::test]
async fn output_streams_before_the_command_ends() {
    let env = Env::new();
    let id = env.confined(SandboxSpec::default()).await;
    let started = Instant::now();
    let request = ExecRequest::shell("echo first; sleep 2; echo second");
    let mut running = env.rt.exec(&id, request).await.unwrap();
    let mut lines = BufReader::new(running.stdout).lines();
    let first = lines.next_line().await.unwrap().unwrap();
    let first_at = started.elapsed();
    let second = lines.next_line().await.unwrap().unwrap();
    let outcome = running.control.wait().await.unwrap();
    let ended = started.elapsed();
    assert_eq!((first.as_str(), second.as_str(), outcome.exit_code), ("first", "second", 0));
    assert!(first_at < Duration::from_millis(1500), "first line took {first_at:?}: output is buffered");
    assert!(ended >= Duration::from_secs(2), "the command ended too early: {ended:?}");
}

#[tokio::test]
async fn exit_codes_signals_stdin_cwd_and_concurrency() {
    let env = Env::new();
    let id = env.confined(SandboxSpec::default()).await;
    assert_eq!(sh(&env.rt, &id, "exit 42").await.code(), 42);

    // A signal sent through the execution reaches the command.
    let mut sleeper = env.rt.exec(&id, ExecRequest::shell("exec sleep 100")).await.unwrap().control;
    tokio::time::sleep(Duration::from_millis(100)).await;
    sleeper.signal(15).await.unwrap();
    let outcome = sleeper.wait().await.unwrap();
    assert_eq!((outcome.exit_code, outcome.signal, outcome.timed_out), (143, Some(15), false));

    // stdin
    let request = ExecRequest { argv: vec!["cat".into()], ..Default::default() };
    let out = exec(&env.rt, &id, request, Some(b"from stdin\n".to_vec())).await;
    assert_eq!(out.stdout, "from stdin\n");

    // cwd, relative to /workspace
    assert_eq!(sh(&env.rt, &id, "mkdir -p sub").await.code(), 0);
    let req = ExecRequest { argv: vec!["pwd".into()], cwd: Some("sub".into()), ..Default::default() };
    assert_eq!(exec(&env.rt, &id, req, None).await.stdout, "/workspace/sub\n");
    let req = ExecRequest { argv: vec!["pwd".into()], cwd: Some("missing".into()), ..Default::default() };
    let out = exec(&env.rt, &id, req, None).await;
    assert_eq!(out.code(), 127);
    assert!(out.stderr.contains("working directory /workspace/missing does not exist"), "{}", out.stderr);

    // A command found in the command's own PATH: a script without `#!` runs under /bin/sh as
    // execvp runs it, one with a missing interpreter gives way to the next PATH entry, and
    // argv[0] stays as given.
    let setup = "mkdir -p a b && printf 'echo no-shebang $0 $1\\n' > b/plain && chmod +x b/plain \
                 && printf '#!/nonexistent/sh\\n' > a/twice && printf '#!/bin/sh\\necho second $0\\n' > b/twice \
                 && chmod +x a/twice b/twice";
    assert_eq!(sh(&env.rt, &id, setup).await.code(), 0);
    let path = "/workspace/a:/workspace/b:/usr/bin:/bin";
    let found = |argv: &[&str]| ExecRequest {
        argv: argv.iter().map(|a| a.to_string()).collect(),
        env: [("PATH".to_string(), path.to_string())].into(),
        ..Default::default()
    };
    assert_eq!(exec(&env.rt, &id, found(&["plain", "x"]), None).await.stdout, "no-shebang /workspace/b/plain x\n");
    assert_eq!(exec(&env.rt, &id, found(&["twice"]), None).await.stdout, "second /workspace/b/twice\n");
    let out = exec(&env.rt, &id, found(&["sh", "-c", "echo $0"]), None).await;
    assert_eq!(out.stdout, "sh\n");

    // Several commands at once: each sleeps 1 s, together they take about 1 s.
    let started = Instant::now();
    let scripts: Vec<String> = (0..4).map(|i| format!("sleep 1; echo {i}")).collect();
    let runs = scripts.iter().map(|s| sh(&env.rt, &id, s));
    let outs = futures_join(runs).await;
    for (i, o) in outs.iter().enumerate() {
        assert_eq!(o.stdout, format!("{i}\n"));
    }
    assert!(started.elapsed() < Duration::from_secs(3), "execs ran one after another: {:?}", started.elapsed());
}

async fn futures_join<F: std::future::Future>(futs: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut handles = Vec::new();
    for f in futs {
        handles.push(f);
    }
    let mut out = Vec::new();
    // Poll all together: a join over boxed futures without pulling in a futures crate.
    let mut pinned: Vec<_> = handles.into_iter().map(Box::pin).collect();
    let mut results: Vec<Option<F::Output>> = pinned.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in pinned.iter_mut().enumerate() {
            if results[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => results[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending { std::task::Poll::Pending } else { std::task::Poll::Ready(()) }
    })
    .await;
    out.extend(results.into_iter().map(|r| r.unwrap()));
    out
}

#[tokio::test]
async fn timeout_kills_the_whole_process_group_and_exits_124() {
    let env = Env::new();
    let id = env.confined(SandboxSpec::default()).await;
    let req = ExecRequest {
        argv: vec!["sh".into(), "-c".into(), "sleep 300 & sleep 300".into()],
        timeout_ms: Some(500),
        ..Default::default()
    };
    let started = Instant::now();
    let out = exec(&env.rt, &id, req, None).await;
    assert!(out.outcome.timed_out);
    assert_eq!(out.code(), 124);
    assert!(started.elapsed() < Duration::from_secs(5));
    let left = sh(&env.rt, &id, "ps -eo comm= | grep -c '^sleep$'").await;
    assert_eq!(left.stdout, "0\n", "the background child of the timed-out command survived");
}

#[tokio::test]
async fn destroy_leaves_nothing_behind() {
    let env = Env::new();
    let info = env.create(SandboxSpec::default()).await;
    let out = sh(&env.rt, &info.id, "sleep 300 >/dev/null 2>&1 & sleep 300 >/dev/null 2>&1 & echo started").await;
    assert_eq!(out.stdout, "started\n");
    let slot = host_identity_slot(env.data(), &info.id);
    assert!(slot.is_file(), "the identity of a live sandbox is not recorded");
    env.rt.destroy(&info.id).await.unwrap();
    // Gone for every caller the moment destroy answers, though its supervisor may still be
    // removing what is left on the host.
    assert!(matches!(env.rt.get(&info.id).await, Err(RuntimeError::NotFound(_))));
    assert!(matches!(env.rt.destroy(&info.id).await, Err(RuntimeError::NotFound(_))));
    assert!(env.rt.list().await.unwrap().is_empty());
    let exec = env.rt.exec(&info.id, ExecRequest::shell("true")).await;
    assert!(matches!(exec, Err(RuntimeError::NotFound(_))), "{:?}", exec.err());
    assert_nothing_left(env.data(), &info.id);
    common::eventually("a destroyed sandbox's identity was not given back", || !slot.exists());
}

/// A command asked for together with its sandbox (a launched supervisor serves it the moment
/// the sandbox is ready; without a launcher it is a create, then an exec) runs confined like
/// any other, with its stdio and exit code; the sandbox exists whatever became of the command
/// and is the caller's to remove.
#[tokio::test]
async fn a_command_asked_for_with_its_sandbox_runs_in_it_confined_and_the_sandbox_is_the_callers() {
    let env = Env::new();
    for (how, rt) in [("launched", env.rt.clone().with_launcher()), ("exec'd", env.rt.clone())] {
        let mut request = ExecRequest::shell(
            "id -u; grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status; cat; ls /proc/self/fd | wc -l; exit 7",
        );
        request.stdin = true;
        let (info, process) = rt.create_and_exec(ValidatedSpec::default(), request).await.expect("create");
        let process = process.unwrap_or_else(|e| panic!("{how}: the command did not start: {e}"));
        let paddock_core::runtime::Process { stdin, stdout, stderr, mut control } = process;
        let mut stdin = stdin.expect("asked for stdin");
        stdin.write_all(b"fed\n").await.unwrap();
        drop(stdin);
        let (stdout, stderr, outcome) = tokio::join!(common::drain(stdout), common::drain(stderr), control.wait());
        assert_eq!(outcome.unwrap().exit_code, 7, "{how}: {stderr}");
        // stdin, stdout, stderr and the directory `ls` reads: no connection came along.
        assert_eq!(stdout, "1000\nCapEff:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\nfed\n4\n", "{how}: {stderr}");
        assert_eq!(rt.get(&info.id).await.unwrap().state, SandboxState::Running, "{how}");
        // Other requests reach it as usual, on connections of their own.
        assert_eq!(sh(&rt, &info.id, "echo again").await.stdout, "again\n", "{how}");
        rt.destroy(&info.id).await.unwrap();
        assert_nothing_left(env.data(), &info.id);

        // A command the sandbox cannot start: the sandbox is made all the same, and said so.
        let (info, process) = rt.create_and_exec(ValidatedSpec::default(), ExecRequest::default()).await.unwrap();
        assert!(matches!(process, Err(RuntimeError::InvalidArgument(_))), "{how}: {:?}", process.err());
        assert_eq!(rt.get(&info.id).await.unwrap().state, SandboxState::Running, "{how}");
        rt.destroy(&info.id).await.unwrap();
    }
}

/// The file that claims the sandbox's host identity in the data directory.
fn host_identity_slot(data: &std::path::Path, id: &paddock_core::runtime::SandboxId) -> std::path::PathBuf {
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data.join("sandboxes").join(id.as_str()).join("record.json")).unwrap())
            .unwrap();
    let uid = u32::try_from(record["host_ids"]["uid"].as_u64().unwrap()).unwrap();
    data.join("ids").join((uid - paddock_runtime_local::identity::BASE).to_string())
}

/// A supervisor that dies after moving a destroyed sandbox's directory out of `sandboxes/`
/// leaves it in `gone/`: the next listing removes it with the sandbox's cgroups and identity,
/// unless a supervisor still holds its lock. Simulated by killing a supervisor and moving its
/// directory by hand, which is the state such a death leaves.
#[tokio::test]
async fn remains_of_a_destroy_cut_short_are_swept_by_the_next_listing() {
    let env = Env::new();
    let info = env.create(SandboxSpec::default()).await;
    let slot = host_identity_slot(env.data(), &info.id);
    let dir = env.data().join("sandboxes").join(info.id.as_str());
    let record: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("record.json")).unwrap()).unwrap();
    let supervisor = i32::try_from(record["supervisor_pid"].as_u64().unwrap()).unwrap();
    rustix::process::kill_process(rustix::process::Pid::from_raw(supervisor).unwrap(), rustix::process::Signal::KILL)
        .unwrap();
    common::eventually("the killed supervisor's sandbox is still running", || {
        std::process::Command::new("pgrep").args(["-f", info.id.as_str()]).output().unwrap().stdout.is_empty()
    });
    let gone = env.data().join("gone");
    std::fs::create_dir_all(&gone).unwrap();
    std::fs::rename(&dir, gone.join(info.id.as_str())).unwrap();

    // Locked: a supervisor is still at work on it.
    let lock = std::fs::File::open(gone.join(info.id.as_str())).unwrap();
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).unwrap();
    assert!(env.rt.list().await.unwrap().is_empty());
    assert!(gone.join(info.id.as_str()).exists(), "a locked directory in gone/ was swept");
    assert!(slot.is_file(), "the identity of a sandbox still being removed was given back");
    drop(lock);

    assert!(env.rt.list().await.unwrap().is_empty());
    assert!(!slot.exists(), "the identity of the swept sandbox was not given back");
    assert_nothing_left(env.data(), &info.id);
}

#[tokio::test]
async fn another_process_can_list_and_drive_running_sandboxes() {
    let env = Env::new();
    let info = env.create(SandboxSpec::default()).await;
    // A second runtime over the same data directory stands for a new `paddock` process.
    let other = LocalRuntime::new(env.data(), common::EXE, NamingMode::Hashed).unwrap();
    let listed = other.list().await.unwrap();
    assert_eq!(listed.iter().map(|i| &i.id).collect::<Vec<_>>(), [&info.id]);
    assert_eq!(listed[0].state, SandboxState::Running);
    assert_eq!(sh(&other, &info.id, "echo reattached").await.stdout, "reattached\n");
    other.destroy(&info.id).await.unwrap();
    assert!(env.rt.list().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_dead_supervisor_means_failed_with_the_workspace_kept() {
    let env = Env::new();
    let t = thread("thread-supervisor-dies");
    let info = env.rt.acquire(&t, ValidatedSpec::default()).await.unwrap();
    assert_eq!(sh(&env.rt, &info.id, "echo keep > /workspace/kept").await.code(), 0);
    let record: serde_json::Value = serde_json::from_slice(
        &std::fs::read(env.data().join("sandboxes").join(info.id.as_str()).join("record.json")).unwrap(),
    )
    .unwrap();
    let supervisor = i32::try_from(record["supervisor_pid"].as_u64().unwrap()).unwrap();
    rustix::process::kill_process(rustix::process::Pid::from_raw(supervisor).unwrap(), rustix::process::Signal::KILL)
        .unwrap();
    // The kernel kills the sandbox's init with it (parent-death signal).
    let deadline = Instant::now() + Duration::from_secs(5);
    let state = loop {
        let s = env.rt.get(&info.id).await.unwrap();
        if s.state == SandboxState::Failed || Instant::now() > deadline {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(state.state, SandboxState::Failed);
    assert!(state.failure.unwrap().contains("supervisor"));
    // Acquire again: a new sandbox, same files.
    let again = env.rt.acquire(&t, ValidatedSpec::default()).await.unwrap();
    assert_ne!(again.id, info.id);
    assert_eq!(sh(&env.rt, &again.id, "cat /workspace/kept").await.stdout, "keep\n");
    assert_nothing_left(env.data(), &info.id);
}

#[tokio::test]
async fn pause_freezes_and_resume_continues_with_memory_intact() {
    let env = Env::new();
    let id = env.confined(SandboxSpec::default()).await;
    // A counter that keeps its state in memory and reports it to a file.
    // Renamed into place, so a read never sees the file between truncation and write.
    let script =
        "i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.05; done";
    let process = env.rt.exec(&id, ExecRequest::shell(script)).await.unwrap();
    let mut counter = process.control;
    tokio::time::sleep(Duration::from_millis(300)).await;
    env.rt.pause(&id).await.unwrap();
    assert_eq!(env.rt.get(&id).await.unwrap().state, SandboxState::Paused);
    let count_file = env.data().join("sandboxes").join(id.as_str()).join("workspace");
    let _ = count_file; // /tmp is private to the sandbox: read it after resume instead.
    let err = env.rt.exec(&id, ExecRequest::shell("true")).await.expect_err("exec while paused");
    assert!(matches!(err, RuntimeError::Unavailable(ref m) if m.contains("paused")), "{err}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    env.rt.resume(&id).await.unwrap();
    let a: u64 = sh(&env.rt, &id, "cat /tmp/count").await.stdout.trim().parse().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b: u64 = sh(&env.rt, &id, "cat /tmp/count").await.stdout.trim().parse().unwrap();
    assert!(a >= 3, "the counter never ran: {a}");
    assert!(b > a, "the counter did not continue after resume: {a} -> {b}");
    // 300 ms paused: had it kept running, it would be about 6 counts further than it is.
    counter.signal(9).await.unwrap();
    assert_eq!(counter.wait().await.unwrap().signal, Some(9));
}

#[tokio::test]
async fn expired_sandboxes_are_destroyed_and_renew_moves_expiry() {
    let env = Env::new();
    let spec = SandboxSpec { timeout_secs: Some(1), ..Default::default() };
    let short = env.create(spec.clone()).await;
    let renewed = env.create(spec).await;
    let info = env.rt.renew(&renewed.id, Duration::from_secs(30)).await.unwrap();
    assert!(info.expires_unix_ms.unwrap() > short.expires_unix_ms.unwrap() + 20_000);
    tokio::time::sleep(Duration::from_millis(1800)).await;
    assert!(matches!(env.rt.get(&short.id).await, Err(RuntimeError::NotFound(_))), "expired sandbox still exists");
    assert_nothing_left(env.data(), &short.id);
    assert_eq!(env.rt.get(&renewed.id).await.unwrap().state, SandboxState::Running);
}

#[tokio::test]
async fn workspaces_persist_and_concurrent_acquires_share_one_sandbox() {
    let env = Env::new();
    let t = thread("Thread_ABC");
    let acquires = (0..4).map(|_| env.rt.acquire(&t, ValidatedSpec::default()));
    let infos: Vec<_> = futures_join(acquires).await.into_iter().map(Result::unwrap).collect();
    assert!(infos.iter().all(|i| i.id == infos[0].id), "concurrent acquires made several sandboxes");
    let first = &infos[0];
    assert_eq!(sh(&env.rt, &first.id, "echo remembered > /workspace/note").await.code(), 0);
    env.rt.release(&t).await.unwrap();
    assert_nothing_left(env.data(), &first.id);
    let second = env.rt.acquire(&t, ValidatedSpec::default()).await.unwrap();
    assert_ne!(second.id, first.id);
    assert_eq!(sh(&env.rt, &second.id, "cat /workspace/note").await.stdout, "remembered\n");

    // A look-alike thread id gets a workspace of its own.
    let alias = env.rt.acquire(&thread("thread.abc"), ValidatedSpec::default()).await.unwrap();
    assert_ne!(alias.workspace.as_ref().unwrap().name, second.workspace.as_ref().unwrap().name);
    assert_eq!(sh(&env.rt, &alias.id, "ls -A /workspace").await.stdout, "");

    env.rt.destroy_workspace(&t).await.unwrap();
    assert!(!env.data().join("workspaces").join(&second.workspace.as_ref().unwrap().name).exists());
    assert_nothing_left(env.data(), &second.id);
    let fresh = env.rt.acquire(&t, ValidatedSpec::default()).await.unwrap();
    assert_eq!(sh(&env.rt, &fresh.id, "ls -A /workspace").await.stdout, "", "a destroyed workspace came back");
    assert!(matches!(env.rt.destroy_workspace(&thread("never-used")).await, Err(RuntimeError::NotFound(_))));
}

#[tokio::test]
async fn creating_a_second_sandbox_on_a_busy_workspace_is_a_conflict() {
    let env = Env::new();
    let t = thread("busy");
    env.rt.acquire(&t, ValidatedSpec::default()).await.unwrap();
    let spec = SandboxSpec {
        workspace: Some(paddock_core::spec::WorkspaceRef { thread: t, naming: NamingMode::Hashed }),
        ..Default::default()
    };
    assert!(matches!(env.rt.create(spec.validated().unwrap()).await, Err(RuntimeError::Conflict(_))));
}

#[tokio::test]
async fn connect_reaches_a_server_inside_the_sandbox_only() {
    let env = Env::new();
    let id = env.confined(SandboxSpec::default()).await;
    assert!(matches!(env.rt.connect(&id, 8000).await, Err(RuntimeError::Unavailable(_))), "nothing listens yet");
    let serve = "echo served > /workspace/index.html; \
                 nohup python3 -m http.server 8000 --bind 127.0.0.1 -d /workspace >/dev/null 2>&1 & \
                 for i in $(seq 50); do (echo > /dev/tcp/127.0.0.1/8000) 2>/dev/null && break; sleep 0.1; done; echo up";
    assert_eq!(sh(&env.rt, &id, serve).await.stdout, "up\n");
    let mut stream = env.rt.connect(&id, 8000).await.unwrap();
    stream.write_all(b"GET /index.html HTTP/1.0\r\n\r\n").await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.0 200"), "{response}");
    assert!(response.ends_with("served\n"), "{response}");
}

#[tokio::test]
async fn the_code_interpreter_readiness_probe_is_answered_inside_and_the_listener_is_not_inherited() {
    let env = Env::new();
    let id = env.confined(SandboxSpec::default()).await;
    // The probe of the code-interpreter SDK, verbatim; repeated, since the init accepts and closes.
    let probe = "for i in 1 2 3; do bash -c 'exec 3<>/dev/tcp/127.0.0.1/${JUPYTER_PORT:-44771}' && echo ok; done; \
                 ls /proc/self/fd | tr '\\n' ' '";
    let out = sh(&env.rt, &id, probe).await;
    assert_eq!(out.stdout, "ok\nok\nok\n0 1 2 3 ", "{}", out.stderr);
    // Only loopback inside the sandbox: the host's 44771 is not the sandbox's.
    assert!(std::net::TcpStream::connect(("127.0.0.1", 44771)).is_err(), "the probe port is open on the host");
    common::assert_confined(&env.rt, &id).await;
}

#[tokio::test]
async fn workspace_size_is_capped_persistent_and_never_mounted_on_the_host() {
    let env = Env::new();
    let t = thread("sized");
    let mut spec = SandboxSpec::default();
    spec.resources.workspace_bytes = Some(32 << 20);
    spec.resources.workspace_inodes = 4096;
    let first = env.rt.acquire(&t, spec.clone().validated().unwrap()).await.unwrap();
    common::assert_confined(&env.rt, &first.id).await;
    let out = sh(&env.rt, &first.id, "dd if=/dev/zero of=/workspace/big bs=1M count=64 2>&1 | grep -c 'No space'; echo keep > /workspace/small; stat -c %U /workspace").await;
    assert_eq!(out.stdout, "1\ncloudsdk\n".replace("cloudsdk", &user_name_1000()), "{}", out.stderr);
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains("files.img") && !mounts.contains("wsmnt"), "the workspace image is mounted on the host");
    env.rt.release(&t).await.unwrap();
    assert_nothing_left(env.data(), &first.id);
    let second = env.rt.acquire(&t, spec.clone().validated().unwrap()).await.unwrap();
    assert_eq!(sh(&env.rt, &second.id, "cat /workspace/small").await.stdout, "keep\n");
    // The caps are fixed at creation (an ext4 image: df shows its own size and inodes, which
    // ext4 rounds up to whole block groups); a later acquire asking for others gets it as it is.
    env.rt.release(&t).await.unwrap();
    spec.resources.workspace_bytes = Some(64 << 20);
    spec.resources.workspace_inodes = 100_000;
    let third = env.rt.acquire(&t, spec.validated().unwrap()).await.unwrap();
    let out = sh(&env.rt, &third.id, "cat /workspace/small; df -B1 --output=size,itotal /workspace | tail -1").await;
    let mut lines = out.stdout.lines();
    assert_eq!(lines.next(), Some("keep"), "{}", out.stderr);
    let df: Vec<u64> = lines.next().unwrap().split_whitespace().map(|f| f.parse().unwrap()).collect();
    // Less the journal and inode tables.
    assert!((24 << 20..=32 << 20).contains(&df[0]), "df shows {} bytes for a 32 MiB workspace", df[0]);
    assert!((4096..8192).contains(&df[1]), "df shows {} inodes for a cap of 4096", df[1]);
    env.rt.release(&t).await.unwrap();
    // A sandbox without a persistent workspace can be capped too.
    let mut scratch = SandboxSpec::default();
    scratch.resources.workspace_bytes = Some(16 << 20);
    let id = env.create(scratch).await.id;
    let out = sh(&env.rt, &id, "dd if=/dev/zero of=/workspace/big bs=1M count=32 2>&1 | grep -c 'No space'").await;
    assert_eq!(out.stdout, "1\n");
    env.rt.destroy(&id).await.unwrap();
    assert_nothing_left(env.data(), &id);
}

fn user_name_1000() -> String {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    passwd
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.get(2) == Some(&"1000")).then(|| f[0].to_owned())
        })
        .unwrap_or_else(|| "1000".to_owned())
}

#[tokio::test]
async fn sandboxes_get_their_own_descriptor_limit_not_their_starters() {
    // The server raises its own limit to the hard limit; a sandbox must not inherit that.
    let env = Env::new();
    let id = env.confined(SandboxSpec::default()).await;
    let (soft, hard) = paddock_runtime_local::supervisor::SANDBOX_NOFILE;
    assert_eq!(sh(&env.rt, &id, "ulimit -Sn; ulimit -Hn").await.stdout, format!("{soft}\n{hard}\n"));
}

/// A descriptor the starting process holds without close-on-exec (as one inherited from a shell
/// or a service manager would be) reaches neither the supervisor's commands nor anything else
/// in the sandbox.
#[tokio::test]
async fn a_leaked_descriptor_of_the_starter_never_reaches_the_sandbox() {
    let env = Env::new();
    let marker = env.data().join("leak-marker");
    std::fs::write(&marker, "host secret").unwrap();
    let leaked = std::fs::File::open(&marker).unwrap();
    rustix::io::fcntl_setfd(&leaked, rustix::io::FdFlags::empty()).unwrap();
    let id = env.confined(SandboxSpec::default()).await;
    let out = sh(&env.rt, &id, "ls -l /proc/self/fd/ | grep -- '->'").await;
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert!(!out.stdout.contains("leak-marker"), "the starter's descriptor reached the sandbox: {}", out.stdout);
    let fds = out.stdout.lines().count();
    // stdin, stdout, stderr and the directory `ls` reads; nothing else.
    assert!(fds <= 4, "a command holds more than stdio: {}", out.stdout);
    drop(leaked);
}
