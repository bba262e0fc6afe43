//! Tests against a real cluster, ignored unless asked for (`--ignored`), and then run only with
//! `PADDOCK_K8S_TESTS=1` and a `KUBECONFIG` (see dev/k8s/README.md). Each test makes its own namespace `paddock-test-<random>` and deletes it.
//! The sandbox images are `paddock.local/sandbox:1` (busybox) and `paddock.local/sandbox-workdir:1`
//! (the same with a WorkingDir), never pulled.
//!
//! PADDOCK_K8S_TESTS=1 KUBECONFIG=/var/lib/paddock-k8s/admin.kubeconfig \
//!     cargo test -p paddock-runtime-k8s --test cluster -- --ignored --test-threads 2

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Client;
use kube::api::{Api, AttachParams, DeleteParams, ListParams, PostParams};
use paddock_core::naming::{NamingMode, ThreadId};
use paddock_core::runtime::{
    ExecOutcome, ExecRequest, FileErrorKind, FileKind, FileOp, FileReply, Runtime, RuntimeError, SandboxId,
};
use paddock_core::spec::SandboxSpec;
use paddock_runtime_k8s::{KubeConfig, KubeRuntime, SandboxModel};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const GATE: &str = "PADDOCK_K8S_TESTS";
const IMAGE: &str = "paddock.local/sandbox:1";
/// The same with `WorkingDir` `/srv/app`.
const WORKDIR_IMAGE: &str = "paddock.local/sandbox-workdir:1";

/// Cluster tests are ignored in the default lane; run with `--ignored` they need the cluster,
/// and say so rather than pass without one.
fn require_cluster() {
    assert!(
        std::env::var(GATE).as_deref() == Ok("1"),
        "a cluster test: set {GATE}=1 and KUBECONFIG to the test cluster's (dev/k8s/README.md)"
    );
}

fn random_suffix() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!(
        "{:08x}",
        (u64::try_from(nanos & u128::from(u64::MAX)).unwrap_or(0) ^ u64::from(std::process::id()) << 32)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            >> 32
    )
}

fn config(namespace: &str) -> KubeConfig {
    KubeConfig {
        namespace: namespace.into(),
        default_image: IMAGE.into(),
        image_pull_policy: "Never".into(),
        // Two cores shared by every test Pod.
        cpu_request_millicpus: Some(0),
        // The dev cluster's hostPath volumes are root-owned 0750.
        chown_workspace: true,
        ready_timeout: Duration::from_secs(90),
        // Commands go through the agent once it is up (dev/k8s/paddock sets this).
        agent: std::env::var_os("PADDOCK_K8S_AGENT").map(Into::into),
        ..KubeConfig::default()
    }
}

fn small_spec() -> SandboxSpec {
    let mut spec = SandboxSpec::default();
    spec.resources.millicpus = 500;
    spec.resources.memory_bytes = 128 << 20;
    spec.resources.tmp_bytes = 16 << 20;
    spec.resources.workspace_bytes = Some(64 << 20);
    spec
}

/// Runs `body` with a fresh namespace and deletes the namespace afterwards, even on failure.
async fn with_namespace<F, Fut>(body: F)
where
    F: FnOnce(Client, String) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let client = paddock_runtime_k8s::client::infer().await.expect("a KUBECONFIG for the test cluster");
    let name = format!("paddock-test-{}", random_suffix());
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
    namespaces.create(&PostParams::default(), &ns).await.expect("creating the test namespace");
    let result = tokio::spawn(body(client, name.clone())).await;
    if std::env::var("PADDOCK_K8S_KEEP").is_err() {
        let _ = namespaces.delete(&name, &DeleteParams::default()).await;
    }
    if let Err(e) = result {
        std::panic::resume_unwind(e.into_panic());
    }
}

struct Output {
    stdout: String,
    stderr: String,
    outcome: ExecOutcome,
}

async fn run(rt: &dyn Runtime, id: &SandboxId, request: ExecRequest, input: Option<&[u8]>) -> Output {
    let mut p = rt.exec(id, ExecRequest { stdin: input.is_some(), ..request }).await.expect("exec");
    if let (Some(mut w), Some(data)) = (p.stdin.take(), input) {
        w.write_all(data).await.unwrap();
        w.shutdown().await.unwrap();
    }
    let (mut out, mut err) = (String::new(), String::new());
    let (a, b) = tokio::join!(p.stdout.read_to_string(&mut out), p.stderr.read_to_string(&mut err));
    a.unwrap();
    b.unwrap();
    let outcome = p.control.wait().await.expect("wait");
    Output { stdout: out, stderr: err, outcome }
}

async fn sh(rt: &dyn Runtime, id: &SandboxId, command: &str) -> Output {
    run(rt, id, ExecRequest::shell(command), None).await
}

async fn read_all(rt: &dyn Runtime, id: &SandboxId, path: &str) -> Result<Vec<u8>, RuntimeError> {
    let mut r = rt.read_file(id, path).await?;
    let mut buf = Vec::new();
    r.read_to_end(&mut buf).await.map_err(|e| RuntimeError::System(e.to_string()))?;
    Ok(buf)
}

async fn pods_in(client: &Client, ns: &str) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.list(&ListParams::default()).await.unwrap().items
}

/// The static agent `dev/build-agent --release` made (dev/k8s/paddock sets it).
fn agent_binary() -> std::path::PathBuf {
    std::env::var_os("PADDOCK_K8S_AGENT")
        .map(Into::into)
        .expect("set PADDOCK_K8S_AGENT to the static agent: PADDOCK_K8S_AGENT=$(dev/build-agent --release)")
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "cluster lane: needs a cluster (PADDOCK_K8S_TESTS=1, KUBECONFIG; dev/k8s/paddock runs it)"]
async fn cluster_sandbox_exec_files_and_destroy() {
    require_cluster();
    with_namespace(|client, ns| async move {
        let rt = KubeRuntime::new(client.clone(), KubeConfig { agent: None, ..config(&ns) });
        exec_files_and_destroy(client, ns, rt, false).await;
    })
    .await;
}

/// The same behaviour through Paddock's agent in the Pod, which is also only reachable
/// through a port-forward, and whose death costs only speed.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "cluster lane: needs a cluster (PADDOCK_K8S_TESTS=1, KUBECONFIG; dev/k8s/paddock runs it)"]
async fn cluster_the_agent_serves_the_same_exec_and_files() {
    require_cluster();
    with_namespace(|client, ns| async move {
        let rt = KubeRuntime::new(client.clone(), KubeConfig { agent: Some(agent_binary()), ..config(&ns) });
        exec_files_and_destroy(client, ns, rt, true).await;
    })
    .await;
}

async fn exec_files_and_destroy(client: Client, ns: String, rt: KubeRuntime, agent: bool) {
    {
        let info = rt.create(small_spec().validated().unwrap()).await.expect("create");
        let id = info.id.clone();
        if agent {
            let pod = rt.pod_name(&id).await.unwrap();
            assert!(rt.wait_agent(&pod, Duration::from_secs(30)).await, "the agent came up");
            // It listens on the Pod's loopback only (127.0.0.1:44770 = 0100007F:AEE2).
            let o = sh(&rt, &id, "cat /proc/net/tcp").await;
            let listening: Vec<&str> = o
                .stdout
                .lines()
                .filter(|l| l.split_whitespace().nth(3) == Some("0A"))
                .filter_map(|l| l.split_whitespace().nth(1))
                .collect();
            assert!(listening.contains(&"0100007F:AEE2"), "{listening:?}");
            assert!(!listening.iter().any(|a| a.ends_with(":AEE2") && *a != "0100007F:AEE2"), "{listening:?}");
            let e = rt.connect(&id, 44770).await.err().expect("the agent's port is not proxied");
            assert!(matches!(e, RuntimeError::InvalidArgument(_)), "{e:?}");
            // The code interpreter's readiness probe port answers.
            let o = sh(&rt, &id, "nc -w 2 127.0.0.1 44771 </dev/null && echo open").await;
            assert_eq!(o.stdout, "open\n", "{}", o.stderr);
        }
        assert!(id.as_str().starts_with("sbx-") && id.as_str().len() == 16, "{id}");
        assert_eq!(rt.get(&id).await.unwrap().id, id);
        assert_eq!(rt.list().await.unwrap().len(), 1);
        assert_eq!(info.spec.image.as_deref(), Some(IMAGE));

        // Identity first: everything else runs as this user.
        let o = sh(&rt, &id, "id -u; id -g").await;
        assert_eq!(o.stdout, "1000\n1000\n", "{}", o.stderr);
        // The hardening as the process sees it: no capabilities, no new privileges, seccomp
        // filter on, read-only root, no service account token.
        let o = sh(&rt, &id, "grep -E '^(CapEff|CapPrm|NoNewPrivs|Seccomp):' /proc/self/status").await;
        assert_eq!(
            o.stdout.split_whitespace().collect::<Vec<_>>(),
            ["CapPrm:", "0000000000000000", "CapEff:", "0000000000000000", "NoNewPrivs:", "1", "Seccomp:", "2"]
        );
        let o = sh(&rt, &id, "touch /rootfs-write 2>&1; ls /var/run/secrets 2>&1; echo $KUBERNETES_SERVICE_HOST").await;
        assert!(o.stdout.contains("Read-only file system"), "{}", o.stdout);
        assert!(o.stdout.contains("No such file or directory"), "{}", o.stdout);
        assert!(o.stdout.ends_with("\n\n"), "no API address in the environment: {}", o.stdout);
        let t = std::time::Instant::now();
        for _ in 0..5 {
            sh(&rt, &id, "true").await;
        }
        eprintln!("exec round trip: {:?} on average", t.elapsed() / 5);

        let o = sh(&rt, &id, "echo out; echo err >&2; exit 3").await;
        assert_eq!((o.stdout.as_str(), o.stderr.as_str(), o.outcome.exit_code), ("out\n", "err\n", 3));

        let o = run(&rt, &id, ExecRequest { argv: vec!["cat".into()], ..Default::default() }, Some(b"via stdin")).await;
        assert_eq!((o.stdout.as_str(), o.outcome.exit_code), ("via stdin", 0));

        // Dropping stdin (no shutdown) is EOF too; without stdin a command reads EOF at once.
        let mut p = rt
            .exec(&id, ExecRequest { argv: vec!["wc".into(), "-c".into()], stdin: true, ..Default::default() })
            .await
            .unwrap();
        let mut w = p.stdin.take().unwrap();
        w.write_all(b"1234").await.unwrap();
        drop(w);
        let mut out = String::new();
        p.stdout.read_to_string(&mut out).await.unwrap();
        assert_eq!((out.trim(), p.control.wait().await.unwrap().exit_code), ("4", 0));
        let mut req = ExecRequest { argv: vec!["cat".into()], ..Default::default() };
        req.timeout_ms = Some(10_000);
        let o = run(&rt, &id, req, None).await;
        assert_eq!((o.stdout.as_str(), o.outcome.exit_code), ("", 0));

        let o = run(&rt, &id, ExecRequest { argv: vec!["no-such-program".into()], ..Default::default() }, None).await;
        assert_eq!(o.outcome.exit_code, 127, "{}", o.stderr);

        // The image's environment (paddock.local/sandbox:1 sets PADDOCK_IMAGE_ENV), under the
        // request's; HOME stays the workspace, the Pod's name is no variable.
        let o = sh(&rt, &id, "echo \"$PADDOCK_IMAGE_ENV\"; env | grep -E '^(HOSTNAME|KUBERNETES_)'; true").await;
        assert_eq!(o.stdout, "from-the-image\n", "{}", o.stderr);
        let mut req = ExecRequest::shell("echo \"$PADDOCK_IMAGE_ENV\"");
        req.env.insert("PADDOCK_IMAGE_ENV".into(), "the request's".into());
        assert_eq!(run(&rt, &id, req, None).await.stdout, "the request's\n");
        let mut req = ExecRequest::shell("pwd; echo \"$HOME $GREETING\"");
        req.env.insert("GREETING".into(), "hi 'there'".into());
        sh(&rt, &id, "mkdir -p /workspace/sub").await;
        req.cwd = Some("sub".into());
        let o = run(&rt, &id, req, None).await;
        assert_eq!(o.stdout, "/workspace/sub\n/workspace hi 'there'\n");
        // No directory named: the image's WorkingDir, which is `/` here, so the workspace.
        assert_eq!(sh(&rt, &id, "pwd").await.stdout, "/workspace\n");

        let started = std::time::Instant::now();
        let mut req = ExecRequest::shell("sleep 30");
        req.timeout_ms = Some(1500);
        let o = run(&rt, &id, req, None).await;
        assert_eq!((o.outcome.exit_code, o.outcome.timed_out), (124, true));
        assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());

        let mut p = rt.exec(&id, ExecRequest::shell("sleep 30 & sleep 31; echo never")).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        p.control.signal(15).await.expect("signal");
        let o = tokio::time::timeout(Duration::from_secs(20), p.control.wait()).await.expect("ended").unwrap();
        assert_eq!((o.exit_code, o.signal), (143, Some(15)));
        let ps = sh(&rt, &id, "ps -o comm,args | grep -c 'sleep 3[01]' || true").await;
        assert_eq!(ps.stdout.trim(), "0", "the whole session is killed");

        // Files, with a name that would break any interpolation.
        let weird = "dir one/it's \"quoted\"\nnl.txt";
        rt.write_file(&id, weird, Some(0o600), Box::new(std::io::Cursor::new(b"hello\n".to_vec()))).await.unwrap();
        assert_eq!(read_all(&rt, &id, weird).await.unwrap(), b"hello\n");
        let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        rt.write_file(&id, "/tmp/big.bin", None, Box::new(std::io::Cursor::new(big.clone()))).await.unwrap();
        assert_eq!(read_all(&rt, &id, "/tmp/big.bin").await.unwrap(), big);
        let FileReply::Stat(st) = rt.file(&id, FileOp::Stat { path: weird.into() }).await.unwrap() else { panic!() };
        assert_eq!((st.kind, st.size, st.mode, st.uid), (FileKind::File, 6, 0o600, 1000));
        assert_eq!(st.path, format!("/workspace/{weird}"));
        let FileReply::List { entries } = rt.file(&id, FileOp::List { path: "dir one".into() }).await.unwrap() else {
            panic!()
        };
        assert_eq!(entries.iter().map(|e| e.path.as_str()).collect::<Vec<_>>(), [format!("/workspace/{weird}")]);
        let e = rt.read_file(&id, "missing.txt").await.err().unwrap();
        assert!(matches!(e, RuntimeError::File { kind: FileErrorKind::NotFound, .. }), "{e:?}");
        let e = rt.read_file(&id, "dir one").await.err().unwrap();
        assert!(matches!(e, RuntimeError::File { kind: FileErrorKind::IsADirectory, .. }), "{e:?}");
        let e = rt.write_file(&id, "/etc/x", None, Box::new(std::io::Cursor::new(b"x".to_vec()))).await.unwrap_err();
        assert!(matches!(e, RuntimeError::File { kind: FileErrorKind::PermissionDenied, .. }), "{e:?}");
        let FileReply::Stat(d) = rt.file(&id, FileOp::Mkdir { path: "a/b".into(), mode: Some(0o700) }).await.unwrap()
        else {
            panic!()
        };
        assert_eq!((d.kind, d.mode), (FileKind::Dir, 0o700));
        let moved = rt.file(&id, FileOp::Move { from: weird.into(), to: "a/b/moved".into() }).await.unwrap();
        assert!(matches!(moved, FileReply::Stat(ref s) if s.path == "/workspace/a/b/moved"), "{moved:?}");
        let FileReply::Stat(c) = rt.file(&id, FileOp::Chmod { path: "a/b/moved".into(), mode: 0o640 }).await.unwrap()
        else {
            panic!()
        };
        assert_eq!(c.mode, 0o640);
        let e = rt.file(&id, FileOp::Remove { path: "a".into(), recursive: false }).await.unwrap_err();
        assert!(matches!(e, RuntimeError::File { kind: FileErrorKind::DirectoryNotEmpty, .. }), "{e:?}");
        rt.file(&id, FileOp::Remove { path: "a".into(), recursive: true }).await.unwrap();
        let e = rt.file(&id, FileOp::Stat { path: "a".into() }).await.unwrap_err();
        assert!(matches!(e, RuntimeError::File { kind: FileErrorKind::NotFound, .. }), "{e:?}");

        let m = rt.metrics(&id).await.unwrap();
        assert!(m.memory_used_bytes.is_some_and(|b| b > 0), "{m:?}");
        assert!(m.cpu_used_ns.is_some_and(|n| n > 0), "{m:?}");

        // A server inside the sandbox, reached through connect (port-forward).
        let mut server = rt
            .exec(&id, ExecRequest::shell("mkdir -p /tmp/www && echo served >/tmp/www/index.html && exec httpd -f -p 127.0.0.1:8080 -h /tmp/www"))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut conn = rt.connect(&id, 8080).await.expect("connect");
        conn.write_all(b"GET /index.html HTTP/1.0\r\n\r\n").await.unwrap();
        let mut reply = String::new();
        tokio::time::timeout(Duration::from_secs(10), conn.read_to_string(&mut reply)).await.unwrap().unwrap();
        assert!(reply.starts_with("HTTP/1.") && reply.ends_with("served\n"), "{reply}");
        let mut refused = rt.connect(&id, 8081).await.expect("connect to a closed port");
        let _ = refused.write_all(b"x").await;
        let e = tokio::time::timeout(Duration::from_secs(10), refused.read_to_end(&mut Vec::new()))
            .await
            .unwrap()
            .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
        server.control.signal(9).await.unwrap();
        assert_eq!(server.control.wait().await.unwrap().signal, Some(9));

        let e = rt.pause(&id).await.unwrap_err();
        assert!(matches!(e, RuntimeError::Unsupported(_)), "{e:?}");

        let renewed = rt.renew(&id, Duration::from_secs(3600)).await.unwrap();
        assert!(renewed.expires_unix_ms.is_some());

        rt.destroy(&id).await.unwrap();
        assert!(matches!(rt.get(&id).await, Err(RuntimeError::NotFound(_))));
        assert!(matches!(rt.exec(&id, ExecRequest::shell("true")).await, Err(RuntimeError::NotFound(_))));
        assert!(pods_in(&client, &ns).await.is_empty(), "no Pod is left");
        let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &ns);
        assert!(policies.list(&ListParams::default()).await.unwrap().items.is_empty(), "no NetworkPolicy is left");
    }
    {
        // An image with a WorkingDir: commands that name no directory start there, as in a
        // container of that image; relative directories still start at the workspace.
        let spec = SandboxSpec { image: Some(WORKDIR_IMAGE.into()), ..small_spec() };
        let id = rt.create(spec.validated().unwrap()).await.expect("create from an image with a WorkingDir").id;
        if agent {
            let pod = rt.pod_name(&id).await.unwrap();
            assert!(rt.wait_agent(&pod, Duration::from_secs(30)).await, "the agent came up");
        }
        let o = sh(&rt, &id, "pwd").await;
        assert_eq!(o.stdout, "/srv/app\n", "{}", o.stderr);
        sh(&rt, &id, "mkdir -p /workspace/sub").await;
        let mut req = ExecRequest::shell("pwd");
        req.cwd = Some("sub".into());
        assert_eq!(run(&rt, &id, req, None).await.stdout, "/workspace/sub\n");
        rt.destroy(&id).await.unwrap();
    }
    if agent {
        // A sandbox that kills the agent loses only speed: commands go on over pods/exec,
        // and the agent comes back.
        let info = rt.create(small_spec().validated().unwrap()).await.expect("create");
        let id = info.id.clone();
        let pod = rt.pod_name(&id).await.unwrap();
        assert!(rt.wait_agent(&pod, Duration::from_secs(30)).await, "the agent came up");
        let kill = "for p in /proc/[0-9]*; do case \"$(tr '\\0' ' ' <$p/cmdline 2>/dev/null)\" in *paddock-agent*--id*) kill -9 ${p#/proc/};; esac; done";
        let o = sh(&rt, &id, &format!("(sleep 0.3; {kill}) </dev/null >/dev/null 2>&1 & echo started")).await;
        assert_eq!(o.stdout, "started\n", "{}", o.stderr);
        tokio::time::sleep(Duration::from_secs(2)).await;
        for i in 0..3 {
            let o = sh(&rt, &id, &format!("echo again {i}")).await;
            assert_eq!((o.stdout.clone(), o.outcome.exit_code), (format!("again {i}\n"), 0), "{}", o.stderr);
        }
        assert!(rt.wait_agent(&pod, Duration::from_secs(30)).await, "the agent came back");
        let o = sh(&rt, &id, "echo back").await;
        assert_eq!(o.stdout, "back\n");
        rt.destroy(&id).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "cluster lane: needs a cluster (PADDOCK_K8S_TESTS=1, KUBECONFIG; dev/k8s/paddock runs it)"]
async fn cluster_acquire_release_and_destroy_workspace() {
    require_cluster();
    with_namespace(|client, ns| async move {
        let mut cfg = config(&ns);
        cfg.storage_class = Some("standard".into());
        let rt = KubeRuntime::new(client.clone(), cfg.clone());
        let thread = ThreadId::new("Thread/ü 42").unwrap();
        let first = rt.acquire(&thread, small_spec().validated().unwrap()).await.expect("acquire");
        assert_eq!(first.workspace.as_ref().unwrap().thread, thread);
        rt.write_file(&first.id, "notes.txt", None, Box::new(std::io::Cursor::new(b"kept".to_vec()))).await.unwrap();
        let again = rt.acquire(&thread, small_spec().validated().unwrap()).await.unwrap();
        assert_eq!(again.id, first.id, "a running sandbox is reattached");
        // A command through the agent: this server now knows where `first` runs.
        if cfg.agent.is_some() {
            assert!(rt.wait_agent(&rt.pod_name(&first.id).await.unwrap(), Duration::from_secs(30)).await);
        }
        assert_eq!(sh(&rt, &first.id, "echo hi").await.stdout, "hi\n");

        // Another server releases the thread and acquires it again.
        let other = KubeRuntime::new(client.clone(), cfg);
        other.release(&thread).await.unwrap();
        assert!(pods_in(&client, &ns).await.is_empty());
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
        assert_eq!(claims.list(&ListParams::default()).await.unwrap().items.len(), 1, "the workspace is kept");

        let second = other.acquire(&thread, small_spec().validated().unwrap()).await.unwrap();
        assert_ne!(second.id, first.id);
        // The thread's new Pod has the old one's name: the released sandbox's commands must
        // not reach it.
        match rt.exec(&first.id, ExecRequest::shell("touch /workspace/wrong")).await {
            Err(RuntimeError::NotFound(_)) => {}
            Err(e) => panic!("{e:?}"),
            Ok(_) => panic!("a command for the released sandbox was started"),
        }
        assert_eq!(sh(&rt, &second.id, "ls /workspace/wrong 2>/dev/null; echo end").await.stdout, "end\n");
        assert_eq!(read_all(&rt, &second.id, "notes.txt").await.unwrap(), b"kept");
        let o = sh(&rt, &second.id, "stat -c '%u %g' /workspace/notes.txt").await;
        assert_eq!(o.stdout, "1000 1000\n");

        // A keeper that ended (its Pod Succeeded) is replaced by the next acquire.
        // Whether this command's own end is reported depends on the path: the agent dies
        // with the keeper.
        if let Ok(mut p) = rt.exec(&second.id, ExecRequest::shell("kill 1")).await {
            let _ = p.control.wait().await;
        }
        for _ in 0..40 {
            if rt.get(&second.id).await.unwrap().state == paddock_core::runtime::SandboxState::Failed {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        assert_eq!(rt.get(&second.id).await.unwrap().state, paddock_core::runtime::SandboxState::Failed);
        let revived = rt.acquire(&thread, small_spec().validated().unwrap()).await.unwrap();
        assert_ne!(revived.id, second.id);
        assert_eq!(read_all(&rt, &revived.id, "notes.txt").await.unwrap(), b"kept");

        rt.destroy_workspace(&thread).await.unwrap();
        assert!(pods_in(&client, &ns).await.is_empty());
        assert!(claims.list(&ListParams::default()).await.unwrap().items.is_empty(), "the PVC is gone");
        let third = rt.acquire(&thread, small_spec().validated().unwrap()).await.unwrap();
        let e = read_all(&rt, &third.id, "notes.txt").await.unwrap_err();
        assert!(matches!(e, RuntimeError::File { kind: FileErrorKind::NotFound, .. }), "{e:?}");
        rt.destroy_workspace(&thread).await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "cluster lane: needs a cluster (PADDOCK_K8S_TESTS=1, KUBECONFIG; dev/k8s/paddock runs it)"]
async fn cluster_concurrent_acquires_make_one_pod() {
    require_cluster();
    with_namespace(|client, ns| async move {
        // Two runtimes with their own clients: as if two servers acquired at once.
        let a = Arc::new(KubeRuntime::new(client.clone(), config(&ns)));
        let b = Arc::new(KubeRuntime::new(paddock_runtime_k8s::client::infer().await.unwrap(), config(&ns)));
        let thread = ThreadId::new("race").unwrap();
        let (x, y) = tokio::join!(
            a.acquire(&thread, small_spec().validated().unwrap()),
            b.acquire(&thread, small_spec().validated().unwrap())
        );
        let (x, y) = (x.expect("first acquire"), y.expect("second acquire"));
        assert_eq!(x.id, y.id);
        assert_eq!(pods_in(&client, &ns).await.len(), 1);
        // Dawn's names in compatibility mode.
        let mut cfg = config(&ns);
        cfg.naming = NamingMode::DawnCompat;
        let dawn = KubeRuntime::new(client.clone(), cfg);
        let t = ThreadId::new("Thread_ABC").unwrap();
        dawn.acquire(&t, small_spec().validated().unwrap()).await.unwrap();
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        assert!(pods.get_opt("dawn-sbx-thread-abc").await.unwrap().is_some());
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
        assert!(claims.get_opt("dawn-sbx-vol-thread-abc").await.unwrap().is_some());
        dawn.destroy_workspace(&t).await.unwrap();
        a.destroy_workspace(&thread).await.unwrap();
    })
    .await;
}

/// The API server's addresses (its Service and its endpoint) as `host port` pairs.
async fn api_server_addresses(client: &Client) -> Vec<String> {
    let services: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(client.clone(), "default");
    let svc = services.get("kubernetes").await.unwrap();
    let mut out = vec![format!("{} 443", svc.spec.unwrap().cluster_ip.unwrap())];
    let slices: Api<k8s_openapi::api::discovery::v1::EndpointSlice> = Api::namespaced(client.clone(), "default");
    let lp = ListParams::default().labels("kubernetes.io/service-name=kubernetes");
    for slice in slices.list(&lp).await.unwrap().items {
        let port = slice.ports.iter().flatten().find_map(|p| p.port).unwrap_or(6443);
        for e in slice.endpoints {
            out.extend(e.addresses.into_iter().map(|a| format!("{a} {port}")));
        }
    }
    out
}

/// A plain Pod reaches the API server (the control); the sandbox reaches none of its addresses.
async fn api_server_unreachable(rt: &dyn Runtime, id: &SandboxId, client: &Client, ns: &str) {
    let addresses = api_server_addresses(client).await;
    assert!(addresses.len() >= 2, "the Service and at least one endpoint: {addresses:?}");
    for a in &addresses {
        let probe = format!("timeout 3 nc {a} </dev/null");
        // The control may miss once on a busy node (a fresh Pod's route, the API server slow to
        // accept): it has to connect once in ten tries; the sandbox never may.
        let mut control = 1;
        for _ in 0..10 {
            control = plain_exec(client, ns, "plain-client", &probe).await;
            if control == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        assert_eq!(control, 0, "control: a plain Pod reaches {a}");
        let o = sh(rt, id, &probe).await;
        assert_ne!(o.outcome.exit_code, 0, "the sandbox must not reach the API server at {a}: {}", o.stdout);
    }
}

/// A Pod outside Paddock (no policy) in the same namespace, as a control.
async fn plain_pod(client: &Client, ns: &str, name: &str, command: &str) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "automountServiceAccountToken": false,
            "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": true},
            "containers": [{
                "name": "main", "image": IMAGE, "imagePullPolicy": "Never",
                "command": ["sh", "-c", command],
                "resources": {"requests": {"cpu": "0", "memory": "32Mi"}, "limits": {"cpu": "200m", "memory": "64Mi"}},
            }],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    for _ in 0..240 {
        let p = pods.get(name).await.unwrap();
        if let Some(ip) = p.status.as_ref().and_then(|s| s.pod_ip.clone())
            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        {
            return ip;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("Pod {name} did not start");
}

async fn plain_exec(client: &Client, ns: &str, name: &str, command: &str) -> i32 {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut p = pods.exec(name, vec!["sh", "-c", command], &AttachParams::default()).await.unwrap();
    let status = p.take_status().unwrap();
    let (mut out, mut err) = (p.stdout().unwrap(), p.stderr().unwrap());
    let (mut o, mut e) = (Vec::new(), Vec::new());
    let _ = tokio::join!(out.read_to_end(&mut o), err.read_to_end(&mut e));
    let st = status.await.unwrap();
    paddock_runtime_k8s::exec::exit_code(&st).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "cluster lane: needs a cluster (PADDOCK_K8S_TESTS=1, KUBECONFIG; dev/k8s/paddock runs it)"]
async fn cluster_deny_policy_blocks_other_pods() {
    require_cluster();
    with_namespace(|client, ns| async move {
        let rt = KubeRuntime::new(client.clone(), config(&ns));
        let serve = "mkdir -p /tmp/w && echo ok >/tmp/w/index.html && exec httpd -f -p 8080 -h /tmp/w";
        let server_ip = plain_pod(&client, &ns, "plain-server", serve).await;
        plain_pod(&client, &ns, "plain-client", "exec sleep 3600").await;
        // busybox 1.35's `wget -T` crashes (SIGSEGV): bound it with `timeout` instead.
        let get = |ip: &str| format!("timeout 3 wget -qO- http://{ip}:8080/index.html");
        // Control: without a policy the network works.
        let mut ok = 1;
        for _ in 0..20 {
            ok = plain_exec(&client, &ns, "plain-client", &get(&server_ip)).await;
            if ok == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        assert_eq!(ok, 0, "the control Pods can talk");

        let sbx = rt.create(small_spec().validated().unwrap()).await.unwrap();
        let ready = std::time::Instant::now();
        let o = sh(&rt, &sbx.id, "id -u").await;
        assert_eq!(o.stdout, "1000\n");
        // The policy exists before the Pod, but kube-router enforces it asynchronously: note
        // how long egress stayed open, and require it closed within a few seconds.
        let mut first_blocked = None;
        for i in 0..20 {
            let o = sh(&rt, &sbx.id, &get(&server_ip)).await;
            if o.outcome.exit_code != 0 {
                first_blocked = Some((i, ready.elapsed()));
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        eprintln!("egress blocked at attempt/after: {first_blocked:?}");
        assert!(first_blocked.is_some(), "egress from the sandbox is denied");
        let o = sh(&rt, &sbx.id, &get(&server_ip)).await;
        assert_ne!(o.outcome.exit_code, 0, "egress stays denied: {}", o.stdout);
        let o = sh(&rt, &sbx.id, "nslookup kubernetes.default.svc.cluster.local 10.244.0.1").await;
        assert_ne!(o.outcome.exit_code, 0, "no DNS either: {}", o.stdout);
        api_server_unreachable(&rt, &sbx.id, &client, &ns).await;

        // Ingress: a server in the sandbox is unreachable from a plain Pod.
        let _server = rt.exec(&sbx.id, ExecRequest::shell(serve)).await.unwrap();
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let sbx_pod = pods
            .list(&ListParams::default().labels(&format!("paddock.dev/sandbox={}", sbx.id)))
            .await
            .unwrap()
            .items
            .remove(0);
        let sbx_ip = sbx_pod.status.unwrap().pod_ip.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_ne!(plain_exec(&client, &ns, "plain-client", &get(&sbx_ip)).await, 0, "ingress is denied");
        // ... while the sandbox itself still reaches its own loopback.
        let o = sh(&rt, &sbx.id, "timeout 3 wget -qO- http://127.0.0.1:8080/index.html").await;
        assert_eq!(o.stdout, "ok\n", "{}", o.stderr);
        rt.destroy(&sbx.id).await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "cluster lane: needs a cluster (PADDOCK_K8S_TESTS=1, KUBECONFIG; dev/k8s/paddock runs it)"]
async fn cluster_expired_sandboxes_are_reaped() {
    require_cluster();
    with_namespace(|client, ns| async move {
        let rt = KubeRuntime::new(client.clone(), config(&ns));
        let mut spec = small_spec();
        spec.timeout_secs = Some(1);
        let info = rt.create(spec.validated().unwrap()).await.unwrap();
        let keep = rt.create(small_spec().validated().unwrap()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert_eq!(rt.reap_expired().await.unwrap(), 1);
        assert!(matches!(rt.get(&info.id).await, Err(RuntimeError::NotFound(_))));
        assert!(rt.get(&keep.id).await.is_ok());
        rt.destroy(&keep.id).await.unwrap();

        // The background reaper does the same on its own.
        let mut cfg = config(&ns);
        cfg.reap_interval = Duration::from_millis(500);
        let rt = Arc::new(KubeRuntime::new(client.clone(), cfg));
        let reaper = rt.spawn_reaper();
        // Short-lived only once it runs: a Pod may take more than a second to start on a busy
        // node, and the reaper rightly deletes a sandbox that expires while starting.
        let short = rt.create(small_spec().validated().unwrap()).await.unwrap();
        rt.renew(&short.id, Duration::from_secs(1)).await.unwrap();
        let mut gone = false;
        for _ in 0..40 {
            if matches!(rt.get(&short.id).await, Err(RuntimeError::NotFound(_))) {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        reaper.abort();
        assert!(gone, "the reaper deleted the expired sandbox");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "cluster lane: needs a cluster (PADDOCK_K8S_TESTS=1, KUBECONFIG; dev/k8s/paddock runs it)"]
async fn cluster_oom_kill_is_reported() {
    require_cluster();
    with_namespace(|client, ns| async move {
        // The server's default: CPU requested as limited, so the Pod is Guaranteed and its
        // keeper's OOM score far below its commands'.
        let rt = KubeRuntime::new(client.clone(), KubeConfig { cpu_request_millicpus: None, ..config(&ns) });
        let mut spec = small_spec();
        spec.resources.memory_bytes = 48 << 20;
        let sbx = rt.create(spec.validated().unwrap()).await.unwrap();
        let pod = rt.pod_name(&sbx.id).await.unwrap();
        // Over pods/exec (the shell wrapper's counters), then through the agent (its own).
        for through_agent in [false, true] {
            if through_agent && !rt.wait_agent(&pod, Duration::from_secs(30)).await {
                assert!(std::env::var_os("PADDOCK_K8S_AGENT").is_none(), "the agent did not come up");
                break;
            }
            // A command is the kernel's first choice, the keeper (PID 1) its last: after the
            // command's kill frees its memory, a charge already under way may still call the
            // OOM killer once more, and that must not take the keeper and the whole sandbox.
            // The keeper has the kubelet's -997 for a Guaranteed Pod, or 0 where containerd
            // may not go below its own score (dev/k8s: no CAP_SYS_RESOURCE).
            let o = sh(&rt, &sbx.id, "cat /proc/self/oom_score_adj /proc/1/oom_score_adj").await;
            let scores: Vec<i32> = o.stdout.lines().map(|l| l.parse().unwrap()).collect();
            assert!(scores[0] == 1000 && scores[1] <= 0, "through the agent: {through_agent}: {scores:?}");
            if through_agent {
                // The agent between them: taken after the commands, before the keeper. It is
                // at the top itself for the instant it spawns this very command, and puts its
                // own back right after: read again until then (2 s at most).
                let agent = "for p in /proc/[0-9]*; do case $(readlink $p/exe) in /tmp/.paddock-agent/*) \
                             i=0; while s=$(cat $p/oom_score_adj); [ \"$s\" = 1000 ] && [ $i -lt 100 ]; do i=$((i+1)); sleep 0.02; done; \
                             echo \"$s\";; esac; done";
                assert_eq!(sh(&rt, &sbx.id, agent).await.stdout, "500\n");
            }
            let o = sh(&rt, &sbx.id, "x=$(head -c 300000000 /dev/zero | tr '\\0' a); echo ${#x}").await;
            assert_eq!((o.outcome.exit_code, o.outcome.oom_killed), (137, true), "{:?} {}", o.outcome, o.stdout);
            let o = sh(&rt, &sbx.id, "echo still here").await;
            assert_eq!(o.stdout, "still here\n");
            let o = sh(&rt, &sbx.id, "kill -9 $$").await;
            assert_eq!((o.outcome.exit_code, o.outcome.oom_killed), (137, false));
        }
        rt.destroy(&sbx.id).await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "cluster lane: needs a cluster (PADDOCK_K8S_TESTS=1, KUBECONFIG; dev/k8s/paddock runs it)"]
async fn cluster_missing_image_fails_fast_and_cleans_up() {
    require_cluster();
    with_namespace(|client, ns| async move {
        let rt = KubeRuntime::new(client.clone(), config(&ns));
        let spec = SandboxSpec { image: Some("paddock.local/no-such-image:1".into()), ..small_spec() };
        let started = std::time::Instant::now();
        let e = rt.create(spec.validated().unwrap()).await.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(60), "{:?}", started.elapsed());
        let text = e.to_string();
        assert!(matches!(e, RuntimeError::Unavailable(_)) && text.contains("ErrImageNeverPull"), "{text}");
        eprintln!("missing image: {text}");
        for _ in 0..40 {
            if pods_in(&client, &ns).await.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        assert!(pods_in(&client, &ns).await.is_empty(), "the failed Pod is removed");

        // A workspace that can never bind: the bounded wait names the PVC.
        let mut cfg = config(&ns);
        cfg.storage_class = Some("no-such-class".into());
        cfg.ready_timeout = Duration::from_secs(5);
        let rt = KubeRuntime::new(client.clone(), cfg);
        let thread = ThreadId::new("unbindable").unwrap();
        let e = rt.acquire(&thread, small_spec().validated().unwrap()).await.unwrap_err();
        let text = e.to_string();
        eprintln!("unbindable workspace: {text}");
        assert!(matches!(e, RuntimeError::Timeout(_)) && text.contains("is Pending"), "{text}");
        rt.destroy_workspace(&thread).await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "cluster lane: needs a cluster (PADDOCK_K8S_TESTS=1, KUBECONFIG; dev/k8s/paddock runs it)"]
async fn cluster_dawn_workspace_is_adopted() {
    require_cluster();
    with_namespace(|client, ns| async move {
        // What Dawn leaves behind: its PVC and keeper Pod, with Dawn's names and labels only.
        let labels = serde_json::json!({"app.kubernetes.io/managed-by": "dawn", "dawn.sh/thread": "legacy-thread"});
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
        let claim: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "dawn-sbx-vol-legacy-thread", "labels": labels},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        }))
        .unwrap();
        claims.create(&PostParams::default(), &claim).await.unwrap();
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let keeper: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "dawn-sbx-legacy-thread", "labels": labels},
            "spec": {
                "automountServiceAccountToken": false,
                "containers": [{
                    "name": "sandbox", "image": IMAGE, "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "echo from-dawn >/workspace/old.txt && exec sleep 3600"],
                    "volumeMounts": [{"name": "workspace", "mountPath": "/workspace"}],
                }],
                "volumes": [{"name": "workspace", "persistentVolumeClaim": {"claimName": "dawn-sbx-vol-legacy-thread"}}],
            },
        }))
        .unwrap();
        pods.create(&PostParams::default(), &keeper).await.unwrap();
        for _ in 0..240 {
            let p = pods.get("dawn-sbx-legacy-thread").await.unwrap();
            if p.status.and_then(|s| s.phase).as_deref() == Some("Running") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }

        let mut cfg = config(&ns);
        cfg.naming = NamingMode::DawnCompat;
        let rt = KubeRuntime::new(client.clone(), cfg);
        let thread = ThreadId::new("Legacy_Thread").unwrap();
        let info = rt.acquire(&thread, small_spec().validated().unwrap()).await.expect("acquire adopts Dawn's objects");
        assert_eq!(info.workspace.as_ref().unwrap().name, "dawn-sbx-vol-legacy-thread");
        assert_eq!(read_all(&rt, &info.id, "old.txt").await.unwrap(), b"from-dawn\n");
        let now = pods.get("dawn-sbx-legacy-thread").await.unwrap();
        assert_eq!(
            now.metadata.labels.as_ref().unwrap().get("paddock.dev/sandbox").map(String::as_str),
            Some(info.id.as_str()),
            "Dawn's keeper was replaced by Paddock's under the same name"
        );
        assert_eq!(claims.list(&ListParams::default()).await.unwrap().items.len(), 1, "no second PVC");
        rt.destroy_workspace(&thread).await.unwrap();
        assert!(claims.list(&ListParams::default()).await.unwrap().items.is_empty());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "cluster lane: needs a cluster (PADDOCK_K8S_TESTS=1, KUBECONFIG; dev/k8s/paddock runs it)"]
async fn cluster_large_environments_reach_the_command() {
    require_cluster();
    with_namespace(|client, ns| async move {
        let rt = KubeRuntime::new(client.clone(), config(&ns));
        let sbx = rt.create(small_spec().validated().unwrap()).await.unwrap();
        // Both through the stage script and through a user command's stdin.
        for n in [491_000usize, 3_000_000] {
            let data = vec![b'y'; n];
            let o = run(&rt, &sbx.id, ExecRequest::shell("wc -c"), Some(&data)).await;
            assert_eq!(o.stdout.trim(), n.to_string());
        }
        // Past the 64 KiB URL limit of an exec request: staged through /tmp.
        let mut req = ExecRequest::shell("echo ${#A} ${#B} ${#C} ${#D}; printf %s \"$Q\"");
        for k in ["A", "B", "C", "D"] {
            req.env.insert(k.into(), "x".repeat(120 << 10));
        }
        req.env.insert("Q".into(), "it's \"q\"\n$(x)".into());
        let o = run(&rt, &sbx.id, req, None).await;
        assert_eq!(o.stdout, "122880 122880 122880 122880\nit's \"q\"\n$(x)", "{}", o.stderr);
        // No staged words are left: at most the running `ls`'s own session record (over
        // pods/exec; the agent keeps its records in memory).
        let o = sh(&rt, &sbx.id, "ls -A /tmp/.paddock-exec 2>/dev/null; true").await;
        assert!(o.stdout.lines().count() <= 1, "the staged file is gone: {}", o.stdout);
        assert!(!o.stdout.contains(".args"), "{}", o.stdout);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "cluster lane: needs a cluster (PADDOCK_K8S_TESTS=1, KUBECONFIG; dev/k8s/paddock runs it)"]
async fn cluster_claim_model_serves_from_a_warm_pool() {
    require_cluster();
    with_namespace(|client, ns| async move {
        use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
        let resource =
            |kind: &str| ApiResource::from_gvk(&GroupVersionKind::gvk("extensions.agents.x-k8s.io", "v1beta1", kind));
        let claims: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &resource("SandboxClaim"));
        let pools: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &resource("SandboxWarmPool"));
        let mut cfg = config(&ns);
        cfg.model = SandboxModel::Claim;
        cfg.warm_pool = 1;
        let rt = KubeRuntime::new(client.clone(), cfg);
        let said = rt.preflight().await.unwrap();
        assert!(said.contains("warm pool"), "{said}");
        // The default profile's pool fills up on its own; only a ready warm Pod is handed out.
        let pool = pools.list(&ListParams::default()).await.unwrap().items.remove(0);
        let pool_name = pool.metadata.name.clone().unwrap();
        let mut ready = 0;
        for _ in 0..240 {
            let p = pools.get(&pool_name).await.unwrap();
            ready = p.data.pointer("/status/readyReplicas").and_then(|v| v.as_u64()).unwrap_or(0);
            if ready >= 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        assert_eq!(ready, 1, "the warm pool of {pool_name} has its one ready Pod");
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);

        // A default sandbox is that warm Pod, adopted: same name, now Paddock's.
        let mut spec = SandboxSpec::default();
        spec.env.insert("GREETING".into(), "from-the-spec".into());
        spec.timeout_secs = Some(600);
        let started = std::time::Instant::now();
        let sbx = rt.create(spec.validated().unwrap()).await.unwrap();
        eprintln!("claimed from the warm pool in {:?}", started.elapsed());
        let o = sh(&rt, &sbx.id, "id -u; hostname; echo $GREETING").await;
        let lines: Vec<&str> = o.stdout.lines().collect();
        assert_eq!(lines[0], "1000", "{}", o.stderr);
        assert!(lines[1].starts_with(&pool_name), "served by a warm Pod: {}", lines[1]);
        assert_eq!(lines[2], "from-the-spec", "the spec's environment reaches commands of a warm Pod");
        assert_eq!(rt.list().await.unwrap().iter().filter(|i| i.id == sbx.id).count(), 1);
        let claim_name = format!("paddock-{}", sbx.id);
        assert!(claims.get_opt(&claim_name).await.unwrap().is_some());

        // Deny-all holds on a claimed Pod: no other Pod, no API server.
        plain_pod(&client, &ns, "plain-client", "exec sleep 3600").await;
        api_server_unreachable(&rt, &sbx.id, &client, &ns).await;

        // Renew moves the claim's own shutdown time too.
        let renewed = rt.renew(&sbx.id, Duration::from_secs(7200)).await.unwrap();
        let c = claims.get(&claim_name).await.unwrap();
        let shutdown = c.data.pointer("/spec/lifecycle/shutdownTime").and_then(|v| v.as_str()).unwrap().to_owned();
        assert_eq!(shutdown, paddock_runtime_k8s::claim::rfc3339(renewed.expires_unix_ms.unwrap()));

        // Another profile has no warm Pods: it starts one from its template.
        let cold = rt.create(small_spec().validated().unwrap()).await.unwrap();
        assert_eq!(sh(&rt, &cold.id, "id -u").await.stdout, "1000\n");

        // Destroy deletes the claim in the foreground: claim and Pod are gone on return.
        let pod_name = lines[1].to_owned();
        rt.destroy(&sbx.id).await.unwrap();
        assert!(claims.get_opt(&claim_name).await.unwrap().is_none(), "the claim is gone");
        assert!(pods.get_opt(&pod_name).await.unwrap().is_none(), "its Pod is gone");
        assert!(matches!(rt.get(&sbx.id).await, Err(RuntimeError::NotFound(_))));

        // An expired claimed sandbox is reaped like any other.
        let short = rt
            .create(SandboxSpec { timeout_secs: Some(600), ..Default::default() }.validated().unwrap())
            .await
            .unwrap();
        rt.renew(&short.id, Duration::from_secs(1)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1200)).await;
        // Whichever comes first deletes it: Paddock's reaper or the controller acting on the
        // claim's own shutdown time.
        rt.reap_expired().await.unwrap();
        let mut gone = false;
        for _ in 0..120 {
            if claims.get_opt(&format!("paddock-{}", short.id)).await.unwrap().is_none() {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        assert!(gone, "the expired sandbox's claim was deleted");

        // A claim whose Pod never got Paddock's labels (its server died) is reaped once old.
        let orphan_id = SandboxId::parse("sbx-0000000000aa").unwrap();
        let orphan =
            paddock_runtime_k8s::claim::claim(&ns, &orphan_id, &pool_name, &SandboxSpec::default(), 1, None).unwrap();
        claims.create(&PostParams::default(), &orphan).await.unwrap();
        assert!(rt.reap_expired().await.unwrap() >= 1);
        let c = claims.get_opt("paddock-sbx-0000000000aa").await.unwrap();
        assert!(c.is_none_or(|c| c.metadata.deletion_timestamp.is_some()), "the orphan claim is being deleted");
        rt.destroy(&cold.id).await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "cluster lane: needs a cluster (PADDOCK_K8S_TESTS=1, KUBECONFIG; dev/k8s/paddock runs it)"]
async fn cluster_unused_workspace_pvcs_are_reaped_after_their_ttl() {
    require_cluster();
    with_namespace(|client, ns| async move {
        use paddock_runtime_k8s::reap_pvcs::{UNUSED_SINCE_ANNOTATION, unused_since};
        let rt = KubeRuntime::new(client.clone(), config(&ns));
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
        let pvc_of = |t: &ThreadId| paddock_runtime_k8s::objects::thread_names(t, NamingMode::Hashed).pvc.unwrap();
        let (used, idle) = (ThreadId::new("reap-used").unwrap(), ThreadId::new("reap-idle").unwrap());
        rt.acquire(&used, small_spec().validated().unwrap()).await.unwrap();
        rt.acquire(&idle, small_spec().validated().unwrap()).await.unwrap();
        rt.release(&idle).await.unwrap();
        // A PVC Paddock did not make is never touched.
        let foreign: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "not-paddocks"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}},
        }))
        .unwrap();
        claims.create(&PostParams::default(), &foreign).await.unwrap();

        // First sighting: the released workspace is marked, the used one is not.
        let r = rt.reap_pvcs(Duration::from_secs(3600)).await.unwrap();
        assert_eq!(
            (r.in_use.clone(), r.waiting.clone(), r.deleted.len()),
            (vec![pvc_of(&used)], vec![pvc_of(&idle)], 0)
        );
        let now = paddock_core::units::unix_ms();
        let since = |pvc: &PersistentVolumeClaim| unused_since(pvc, now + 60_000, NamingMode::Hashed);
        assert!(since(&claims.get(&pvc_of(&idle)).await.unwrap()).is_some());
        assert!(since(&claims.get(&pvc_of(&used)).await.unwrap()).is_none());

        // Used again: the mark goes, even with a zero TTL.
        rt.acquire(&idle, small_spec().validated().unwrap()).await.unwrap();
        let r = rt.reap_pvcs(Duration::ZERO).await.unwrap();
        assert!(r.deleted.is_empty() && r.in_use.contains(&pvc_of(&idle)), "{r:?}");
        let idle_pvc = claims.get(&pvc_of(&idle)).await.unwrap();
        assert!(!idle_pvc.metadata.annotations.unwrap_or_default().contains_key(UNUSED_SINCE_ANNOTATION));

        // Released for good: marked on one run, deleted on a later one past the TTL.
        rt.release(&idle).await.unwrap();
        let r = rt.reap_pvcs(Duration::ZERO).await.unwrap();
        assert_eq!(r.waiting, vec![pvc_of(&idle)]);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let r = rt.reap_pvcs(Duration::ZERO).await.unwrap();
        assert_eq!(r.deleted, vec![pvc_of(&idle)]);
        let gone = claims.get_opt(&pvc_of(&idle)).await.unwrap();
        assert!(gone.is_none_or(|c| c.metadata.deletion_timestamp.is_some()), "the unused PVC is deleted");
        assert!(claims.get_opt(&pvc_of(&used)).await.unwrap().is_some(), "the used one stays");
        assert!(claims.get_opt("not-paddocks").await.unwrap().is_some(), "a foreign PVC stays");
        rt.destroy_workspace(&used).await.unwrap();
    })
    .await;
}

/// The dev cluster's Pods have no route out of the cluster and its DNS is not a Pod, so an
/// allowed outside address cannot be reached from here: what is proven on the real cluster is
/// that the API server takes the objects, that allow-all still keeps the cluster closed, and
/// that changes land on the NetworkPolicy and the Pod while the sandbox runs.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "cluster lane: needs a cluster (PADDOCK_K8S_TESTS=1, KUBECONFIG; dev/k8s/paddock runs it)"]
async fn cluster_egress_rules_become_the_network_policy_and_never_open_the_cluster() {
    require_cluster();
    use paddock_core::egress::{Action, EgressPolicy, EgressRule};
    with_namespace(move |client, ns| async move {
        let rt = KubeRuntime::new(client.clone(), config(&ns));
        let serve = "mkdir -p /tmp/w && echo ok >/tmp/w/index.html && exec httpd -f -p 8080 -h /tmp/w";
        let server_ip = plain_pod(&client, &ns, "plain-server", serve).await;
        // The control that the API server answers Pods without a policy.
        plain_pod(&client, &ns, "plain-client", "exec sleep 3600").await;
        let mut spec = small_spec();
        spec.network = paddock_core::spec::NetworkPolicy::Egress(EgressPolicy::allow_all());
        let sbx = rt.create(spec.validated().unwrap()).await.unwrap();
        let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &ns);
        let name = format!("paddock-net-{}", sbx.id);
        let egress_of = |np: NetworkPolicy| serde_json::to_value(np.spec.unwrap().egress.unwrap_or_default()).unwrap();
        let all = egress_of(policies.get(&name).await.unwrap());
        assert_eq!(all[0]["to"][0]["ipBlock"]["cidr"], "0.0.0.0/0", "{all}");
        assert!(
            all[0]["to"][0]["ipBlock"]["except"].as_array().unwrap().contains(&serde_json::json!("10.0.0.0/8")),
            "{all}"
        );
        // Allow-all is the outside world: another Pod and the API server stay out of reach.
        let get = format!("timeout 3 wget -qO- http://{server_ip}:8080/index.html");
        let mut blocked = false;
        for _ in 0..20 {
            if sh(&rt, &sbx.id, &get).await.outcome.exit_code != 0 {
                blocked = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        assert!(blocked, "allow-all must not open the cluster's Pods");
        api_server_unreachable(&rt, &sbx.id, &client, &ns).await;

        // Changes while it runs land on the NetworkPolicy and the Pod's spec.
        let one = EgressPolicy {
            default_action: Action::Deny,
            egress: vec![
                EgressRule::new(Action::Allow, "203.0.113.0/24"),
                EgressRule::new(Action::Deny, "203.0.113.128/25"),
            ],
        };
        let status = rt.set_egress(&sbx.id, one.clone().validated().unwrap()).await.unwrap();
        assert_eq!((status.policy.clone(), status.enforcement.as_str()), (one.clone(), "networkpolicy"));
        assert_eq!(
            egress_of(policies.get(&name).await.unwrap()),
            serde_json::json!([{"to": [{"ipBlock": {"cidr": "203.0.113.0/24", "except": ["203.0.113.128/25"]}}]}])
        );
        assert_eq!(rt.get(&sbx.id).await.unwrap().spec.network.policy(), one);
        rt.set_egress(&sbx.id, EgressPolicy::deny_all().validated().unwrap()).await.unwrap();
        assert_eq!(egress_of(policies.get(&name).await.unwrap()), serde_json::json!([]));

        // What a NetworkPolicy cannot enforce is refused, and changes nothing.
        let refused = ["pypi.org", "10.96.0.1", "169.254.169.254"]; // not-a-probe: refused rules, nothing is sent
        for target in refused {
            let bad =
                EgressPolicy { default_action: Action::Deny, egress: vec![EgressRule::new(Action::Allow, target)] };
            assert!(
                matches!(rt.set_egress(&sbx.id, bad.validated().unwrap()).await, Err(RuntimeError::Unsupported(_))),
                "{target}"
            );
        }
        assert_eq!(rt.egress(&sbx.id).await.unwrap().policy, EgressPolicy::deny_all());
        rt.destroy(&sbx.id).await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "cluster lane: needs a cluster (PADDOCK_K8S_TESTS=1, KUBECONFIG; dev/k8s/paddock runs it)"]
async fn cluster_named_volumes_are_pvcs_shared_kept_and_deleted() {
    use paddock_core::volume::{VolumeMount, VolumeSource};
    require_cluster();
    with_namespace(|client, ns| async move {
        let mut cfg = config(&ns);
        cfg.storage_class = Some("standard".into());
        let rt = KubeRuntime::new(client.clone(), cfg);
        let mount = |at: &str, sub: Option<&str>, ro: bool, create: bool| VolumeMount {
            name: "data".into(),
            mount_path: at.into(),
            read_only: ro,
            sub_path: sub.map(Into::into),
            source: VolumeSource::Named {
                name: "shared-data".into(),
                create,
                delete_with_sandbox: false,
                size_bytes: Some(64 << 20),
            },
        };
        let with = |v: Vec<VolumeMount>| SandboxSpec { volumes: v, ..small_spec() };

        let a = rt
            .create(with(vec![mount("/mnt/data", None, false, true)]).validated().unwrap())
            .await
            .expect("create with a volume");
        let o = sh(
            &rt,
            &a.id,
            "id -u; echo one > /mnt/data/f && mkdir -p /mnt/data/sub && echo two > /mnt/data/sub/g && cat /mnt/data/f",
        )
        .await;
        assert_eq!(o.stdout, "1000\none\n", "{}", o.stderr);
        // A second sandbox at once: read-only, and a subPath of it.
        let b = rt
            .create(
                with(vec![
                    mount("/mnt/ro", None, true, false),
                    VolumeMount { name: "sub".into(), ..mount("/mnt/sub", Some("sub"), false, false) },
                ])
                .validated()
                .unwrap(),
            )
            .await
            .expect("create with the existing volume");
        let o = sh(&rt, &b.id, "cat /mnt/ro/f /mnt/sub/g; ls /mnt/sub; touch /mnt/ro/x").await;
        assert_eq!(o.stdout, "one\ntwo\ng\n", "{}", o.stderr);
        assert!(o.stderr.contains("Read-only"), "{}", o.stderr);

        let listed = rt.volumes().await.unwrap();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(listed[0].name, "shared-data");
        assert_eq!(listed[0].used_by.len(), 2);
        let e = rt.delete_volume("shared-data").await.unwrap_err();
        assert!(matches!(e, RuntimeError::Conflict(_)), "{e:?}");

        // Missing and not to be made; host paths; a thread's workspace claim: refused.
        let missing = VolumeMount {
            source: VolumeSource::Named {
                name: "nope".into(),
                create: false,
                delete_with_sandbox: false,
                size_bytes: None,
            },
            ..mount("/mnt/n", None, false, false)
        };
        assert!(matches!(
            rt.create(with(vec![missing]).validated().unwrap()).await.unwrap_err(),
            RuntimeError::NotFound(_)
        ));
        let host =
            VolumeMount { source: VolumeSource::Host { path: "/etc".into() }, ..mount("/mnt/h", None, false, false) };
        assert!(matches!(
            rt.create(with(vec![host]).validated().unwrap()).await.unwrap_err(),
            RuntimeError::Unsupported(_)
        ));
        let thread = ThreadId::new("volume-thread").unwrap();
        let ws = rt.acquire(&thread, small_spec().validated().unwrap()).await.unwrap();
        let ws_claim = ws.workspace.as_ref().unwrap().name.clone();
        let steal = VolumeMount {
            source: VolumeSource::Named { name: ws_claim, create: false, delete_with_sandbox: false, size_bytes: None },
            ..mount("/mnt/steal", None, false, false)
        };
        let e = rt.create(with(vec![steal]).validated().unwrap()).await.unwrap_err();
        assert!(e.to_string().contains("workspace"), "{e}");

        // The files outlive the sandboxes, until the volume is deleted.
        rt.destroy(&a.id).await.unwrap();
        rt.destroy(&b.id).await.unwrap();
        let c = rt.create(with(vec![mount("/mnt/data", None, true, false)]).validated().unwrap()).await.unwrap();
        assert_eq!(sh(&rt, &c.id, "cat /mnt/data/sub/g").await.stdout, "two\n");
        rt.destroy(&c.id).await.unwrap();
        for _ in 0..40 {
            if rt.volumes().await.unwrap()[0].used_by.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        rt.delete_volume("shared-data").await.expect("delete an unused volume");
        assert!(rt.volumes().await.unwrap().is_empty(), "a volume being deleted is no longer listed");
        // The claim itself goes once the kubelet has let go of it.
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
        let mut gone = false;
        for _ in 0..120 {
            if claims.get_opt("shared-data").await.unwrap().is_none() {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        assert!(gone, "the volume's PVC was not deleted");
        rt.destroy_workspace(&thread).await.unwrap();
    })
    .await;
}

/// Claim profiles do not pile up: one no server used for `profile_idle` and no claim names is
/// deleted (pool and template), one a claim still uses is kept, and with `MAX_PROFILES` (32)
/// profiles in the namespace a further shape gets a keeper Pod instead of a new profile.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "cluster lane: needs a cluster (PADDOCK_K8S_TESTS=1, KUBECONFIG; dev/k8s/paddock runs it)"]
async fn cluster_idle_claim_profiles_are_reaped_and_too_many_fall_back_to_keeper_pods() {
    require_cluster();
    with_namespace(|client, ns| async move {
        use kube::api::DynamicObject;
        use paddock_runtime_k8s::claim;
        let idle = Duration::from_secs(3);
        let cfg = KubeConfig { model: SandboxModel::Claim, warm_pool: 0, profile_idle: idle, ..config(&ns) };
        let rt = KubeRuntime::new(client.clone(), cfg);
        let templates: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &ns, &claim::resource("SandboxTemplate"));
        let pools: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &claim::resource("SandboxWarmPool"));
        let names = |api: Api<DynamicObject>| async move {
            let mut n: Vec<String> = api
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .filter_map(|o| o.metadata.name)
                .collect();
            n.sort();
            n
        };
        let claimed = |client: Client, ns: String, id: SandboxId| async move {
            let pods = pods_in(&client, &ns).await;
            let pod = pods
                .iter()
                .find(|p| {
                    p.metadata.labels.as_ref().and_then(|l| l.get("paddock.dev/sandbox")) == Some(&id.to_string())
                })
                .expect("the sandbox's Pod");
            pod.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(claim::CLAIM_ANNOTATION))
        };
        let shaped = |mib: u64| {
            let mut s = small_spec();
            s.resources.memory_bytes = mib << 20;
            s
        };

        let a = rt.create(shaped(96).validated().unwrap()).await.expect("a claim on a new profile");
        assert!(claimed(client.clone(), ns.clone(), a.id.clone()).await);
        let profile = names(templates.clone()).await;
        assert_eq!(profile.len(), 1, "{profile:?}");
        assert_eq!(names(pools.clone()).await, profile);
        // Idle, but a claim uses it: kept.
        tokio::time::sleep(idle + Duration::from_secs(1)).await;
        rt.reap_expired().await.unwrap();
        assert_eq!(names(templates.clone()).await, profile, "a profile in use is kept");
        rt.destroy(&a.id).await.unwrap();
        rt.reap_expired().await.unwrap();
        assert!(names(templates.clone()).await.is_empty(), "an idle, unused profile is deleted");
        assert!(names(pools.clone()).await.is_empty(), "and its pool");

        // 32 profiles (made by other servers, say): the next new shape gets a keeper Pod.
        let pod_spec = serde_json::json!({"containers": [{"name": "sandbox", "image": IMAGE}]});
        let now = paddock_core::units::unix_ms();
        for i in 0..32 {
            let t = claim::template(&ns, &format!("paddock-other-{i}"), &pod_spec, now).unwrap();
            templates.create(&PostParams::default(), &t).await.unwrap();
        }
        let b = rt.create(shaped(80).validated().unwrap()).await.expect("a keeper Pod");
        assert!(!claimed(client.clone(), ns.clone(), b.id.clone()).await, "no 33rd profile");
        assert_eq!(names(templates.clone()).await.len(), 32);
        let o = sh(&rt, &b.id, "echo keeper").await;
        assert_eq!(o.stdout, "keeper\n");
        rt.destroy(&b.id).await.unwrap();
        // Once they are idle the reaper frees the room, and the shape gets a profile again.
        tokio::time::sleep(idle + Duration::from_secs(1)).await;
        rt.reap_expired().await.unwrap();
        assert!(names(templates.clone()).await.is_empty());
        let c = rt.create(shaped(80).validated().unwrap()).await.expect("a claim");
        assert!(claimed(client.clone(), ns.clone(), c.id.clone()).await);
        rt.destroy(&c.id).await.unwrap();
    })
    .await;
}

/// The runtime contract every runtime keeps (`paddock_testkit::contract`), on a real cluster.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "cluster lane: needs a cluster (PADDOCK_K8S_TESTS=1, KUBECONFIG; dev/k8s/paddock runs it)"]
async fn cluster_the_kubernetes_runtime_keeps_the_contract() {
    require_cluster();
    with_namespace(|client, ns| async move {
        let rt = Arc::new(KubeRuntime::new(client, config(&ns)));
        let contract = paddock_testkit::contract::Contract::new(small_spec());
        paddock_testkit::contract::run_all(rt, &contract).await;
    })
    .await;
}
