//! Deadlines on every runtime call the server makes. A sandbox can stall its own side of a
//! call (a SIGSTOPped file worker, a server inside it that never answers, a cluster that never
//! schedules a Pod); that must cost the caller a `TIMEOUT` error, never a request that hangs
//! forever and holds a connection and its memory.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use paddock_core::naming::ThreadId;
use paddock_core::runtime::{
    ByteReader, Capabilities, Duplex, ExecRequest, Execution, FileOp, FileReply, IsolationTargets, Process, Runtime,
    RuntimeError, SandboxId, SandboxInfo, SandboxMetrics, SettingCheck,
};
use paddock_core::spec::ValidatedSpec;
use tokio::io::{AsyncRead, ReadBuf};

/// How long runtime calls may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    /// A quick call: get, list, file operations, starting a command, signals, connects, metrics.
    pub call: Duration,
    /// Create, acquire, release, destroy: these may wait for a Pod to start or stop.
    pub lifecycle: Duration,
    /// A file's bytes that stop moving for this long end the transfer.
    pub stream_idle: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Self {
            call: Duration::from_secs(60),
            lifecycle: Duration::from_secs(600),
            stream_idle: Duration::from_secs(120),
        }
    }
}

/// A runtime whose every call has a deadline.
pub struct Deadlined {
    inner: Arc<dyn Runtime>,
    d: Deadlines,
}

impl Deadlined {
    pub fn new(inner: Arc<dyn Runtime>, d: Deadlines) -> Self {
        Self { inner, d }
    }
}

async fn within<T>(
    limit: Duration,
    what: impl FnOnce() -> String,
    fut: impl Future<Output = Result<T, RuntimeError>>,
) -> Result<T, RuntimeError> {
    tokio::time::timeout(limit, fut).await.unwrap_or_else(|_| {
        Err(RuntimeError::Timeout(format!(
            "{} did not finish within {}s: the sandbox may be hung or overloaded; try again, or delete it",
            what(),
            limit.as_secs_f64()
        )))
    })
}

/// A control whose signals have a deadline; waiting for the command to end has none.
struct DeadlinedExecution {
    inner: Box<dyn Execution>,
    call: Duration,
}

#[async_trait::async_trait]
impl Execution for DeadlinedExecution {
    fn pid(&self) -> Option<u32> {
        self.inner.pid()
    }
    async fn signal(&mut self, signal: i32) -> Result<(), RuntimeError> {
        within(self.call, || format!("sending signal {signal} to a command"), self.inner.signal(signal)).await
    }
    async fn wait(&mut self) -> Result<paddock_core::runtime::ExecOutcome, RuntimeError> {
        self.inner.wait().await
    }
}

/// A reader that fails when it waits longer than `idle` for bytes. Time counts only while a
/// read is pending, so a slow consumer never trips it.
pub struct IdleReader<R> {
    inner: R,
    idle: Duration,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    what: String,
}

impl<R> IdleReader<R> {
    pub fn new(inner: R, idle: Duration, what: String) -> Self {
        Self { inner, idle, timer: None, what }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for IdleReader<R> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                this.timer = None;
                Poll::Ready(r)
            }
            Poll::Pending => {
                let idle = this.idle;
                let timer = this.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("{} stalled: no bytes for {}s", this.what, idle.as_secs_f64()),
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

/// A reader that records when it last produced bytes, for a watchdog on a transfer the
/// reader itself cannot see stall (the sandbox stops taking what it is given).
struct ProgressReader {
    inner: ByteReader,
    last: Arc<AtomicU64>,
    t0: Instant,
}

impl AsyncRead for ProgressReader {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if r.is_ready() {
            self.last.store(paddock_core::units::millis(self.t0.elapsed()), Ordering::Relaxed);
        }
        r
    }
}

#[async_trait::async_trait]
impl Runtime for Deadlined {
    async fn health(&self) -> Result<(), RuntimeError> {
        within(self.d.call, || "checking the runtime's health".to_owned(), self.inner.health()).await
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn isolation_targets(&self) -> Result<IsolationTargets, RuntimeError> {
        within(self.d.call, || "finding what sandboxes must not reach".to_owned(), self.inner.isolation_targets()).await
    }
    async fn sandbox_settings(&self, id: &SandboxId) -> Result<Vec<SettingCheck>, RuntimeError> {
        within(self.d.call, || format!("reading the settings of sandbox {id}"), self.inner.sandbox_settings(id)).await
    }
    async fn check(&self, probe: bool) -> Result<paddock_core::preflight::Report, RuntimeError> {
        within(self.d.lifecycle, || "checking the runtime".to_owned(), self.inner.check(probe)).await
    }
    async fn create_and_exec(
        &self,
        spec: ValidatedSpec,
        request: ExecRequest,
    ) -> Result<(SandboxInfo, Result<Process, RuntimeError>), RuntimeError> {
        let what = || "creating a sandbox and starting its command".to_owned();
        let (info, process) = within(self.d.lifecycle, what, self.inner.create_and_exec(spec, request)).await?;
        let call = self.d.call;
        let process = process.map(|mut p| {
            p.control = Box::new(DeadlinedExecution { inner: p.control, call });
            p
        });
        Ok((info, process))
    }
    async fn create(&self, spec: ValidatedSpec) -> Result<SandboxInfo, RuntimeError> {
        within(self.d.lifecycle, || "creating a sandbox".to_owned(), self.inner.create(spec)).await
    }
    async fn get(&self, id: &SandboxId) -> Result<SandboxInfo, RuntimeError> {
        within(self.d.call, || format!("reading sandbox {id}"), self.inner.get(id)).await
    }
    async fn list(&self) -> Result<Vec<SandboxInfo>, RuntimeError> {
        within(self.d.call, || "listing sandboxes".to_owned(), self.inner.list()).await
    }
    async fn exec(&self, id: &SandboxId, request: ExecRequest) -> Result<Process, RuntimeError> {
        let mut p = within(self.d.call, || format!("starting a command in {id}"), self.inner.exec(id, request)).await?;
        p.control = Box::new(DeadlinedExecution { inner: p.control, call: self.d.call });
        Ok(p)
    }
    async fn file(&self, id: &SandboxId, op: FileOp) -> Result<FileReply, RuntimeError> {
        within(self.d.call, || format!("a file operation in {id}"), self.inner.file(id, op)).await
    }
    async fn read_file(&self, id: &SandboxId, path: &str) -> Result<ByteReader, RuntimeError> {
        let r = within(self.d.call, || format!("opening {path} in {id}"), self.inner.read_file(id, path)).await?;
        Ok(Box::new(IdleReader::new(r, self.d.stream_idle, format!("reading {path} in {id}"))))
    }
    async fn write_file(
        &self,
        id: &SandboxId,
        path: &str,
        mode: Option<u32>,
        data: ByteReader,
    ) -> Result<(), RuntimeError> {
        let (last, t0) = (Arc::new(AtomicU64::new(0)), Instant::now());
        let data = Box::new(ProgressReader { inner: data, last: last.clone(), t0 });
        let write = self.inner.write_file(id, path, mode, data);
        tokio::pin!(write);
        let mut tick = tokio::time::interval(Duration::from_secs(1).min(self.d.stream_idle));
        loop {
            tokio::select! {
                r = &mut write => return r,
                _ = tick.tick() => {
                    let idle = t0.elapsed().saturating_sub(Duration::from_millis(last.load(Ordering::Relaxed)));
                    if idle >= self.d.stream_idle {
                        return Err(RuntimeError::Timeout(format!(
                            "writing {path} in {id} stalled: no progress for {}s; the sandbox may be hung, or the upload stopped",
                            self.d.stream_idle.as_secs_f64()
                        )));
                    }
                }
            }
        }
    }
    async fn connect(&self, id: &SandboxId, port: u16) -> Result<Box<dyn Duplex>, RuntimeError> {
        within(self.d.call, || format!("connecting to port {port} in {id}"), self.inner.connect(id, port)).await
    }
    async fn metrics(&self, id: &SandboxId) -> Result<SandboxMetrics, RuntimeError> {
        within(self.d.call, || format!("measuring {id}"), self.inner.metrics(id)).await
    }
    async fn egress(&self, id: &SandboxId) -> Result<paddock_core::egress::EgressStatus, RuntimeError> {
        within(self.d.call, || format!("reading the egress of {id}"), self.inner.egress(id)).await
    }
    async fn vault(&self, id: &SandboxId) -> Result<Option<paddock_core::vault::Vault>, RuntimeError> {
        within(self.d.call, || format!("reading the credential vault of {id}"), self.inner.vault(id)).await
    }
    async fn set_vault(&self, id: &SandboxId, vault: Option<paddock_core::vault::Vault>) -> Result<(), RuntimeError> {
        within(self.d.call, || format!("changing the credential vault of {id}"), self.inner.set_vault(id, vault)).await
    }
    async fn volumes(&self) -> Result<Vec<paddock_core::volume::NamedVolume>, RuntimeError> {
        within(self.d.call, || "listing the volumes".to_owned(), self.inner.volumes()).await
    }
    async fn delete_volume(&self, name: &str) -> Result<(), RuntimeError> {
        within(self.d.call, || format!("deleting volume {name}"), self.inner.delete_volume(name)).await
    }
    async fn set_egress(
        &self,
        id: &SandboxId,
        policy: paddock_core::egress::ValidatedPolicy,
    ) -> Result<paddock_core::egress::EgressStatus, RuntimeError> {
        within(self.d.call, || format!("changing the egress of {id}"), self.inner.set_egress(id, policy)).await
    }
    async fn pause(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        within(self.d.call, || format!("pausing {id}"), self.inner.pause(id)).await
    }
    async fn resume(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        within(self.d.call, || format!("resuming {id}"), self.inner.resume(id)).await
    }
    async fn renew(&self, id: &SandboxId, ttl: Duration) -> Result<SandboxInfo, RuntimeError> {
        within(self.d.call, || format!("renewing {id}"), self.inner.renew(id, ttl)).await
    }
    async fn destroy(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        within(self.d.lifecycle, || format!("destroying {id}"), self.inner.destroy(id)).await
    }
    async fn acquire(&self, thread: &ThreadId, spec: ValidatedSpec) -> Result<SandboxInfo, RuntimeError> {
        within(self.d.lifecycle, || format!("acquiring thread {thread}"), self.inner.acquire(thread, spec)).await
    }
    async fn release(&self, thread: &ThreadId) -> Result<(), RuntimeError> {
        within(self.d.lifecycle, || format!("releasing thread {thread}"), self.inner.release(thread)).await
    }
    async fn destroy_workspace(&self, thread: &ThreadId) -> Result<(), RuntimeError> {
        within(
            self.d.lifecycle,
            || format!("destroying the workspace of {thread}"),
            self.inner.destroy_workspace(thread),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Mutex;

    use paddock_core::egress::{EgressPolicy, EgressStatus, ValidatedPolicy};
    use paddock_core::vault::Vault;
    use paddock_core::volume::NamedVolume;

    use super::*;

    /// A runtime that records which of its methods were called and fails each call.
    #[derive(Default)]
    struct Recorder(Mutex<BTreeSet<&'static str>>);

    impl Recorder {
        fn saw<T>(&self, method: &'static str) -> Result<T, RuntimeError> {
            self.0.lock().unwrap().insert(method);
            Err(RuntimeError::Unsupported(format!("recorded {method}")))
        }
    }

    #[async_trait::async_trait]
    impl Runtime for Recorder {
        fn capabilities(&self) -> Capabilities {
            let _ = self.saw::<()>("capabilities");
            serde_json::from_value(serde_json::json!({"runtime": "recorder", "pause": false,
                "persistent_workspaces": false, "run_as_other_user": false, "images": "", "network": [],
                "metrics": false}))
            .unwrap()
        }
        async fn isolation_targets(&self) -> Result<IsolationTargets, RuntimeError> {
            self.saw("isolation_targets")
        }
        async fn check(&self, _probe: bool) -> Result<paddock_core::preflight::Report, RuntimeError> {
            self.saw("check")
        }
        async fn sandbox_settings(&self, _: &SandboxId) -> Result<Vec<SettingCheck>, RuntimeError> {
            self.saw("sandbox_settings")
        }
        async fn health(&self) -> Result<(), RuntimeError> {
            self.saw("health")
        }
        async fn create(&self, _: ValidatedSpec) -> Result<SandboxInfo, RuntimeError> {
            self.saw("create")
        }
        async fn get(&self, _: &SandboxId) -> Result<SandboxInfo, RuntimeError> {
            self.saw("get")
        }
        async fn list(&self) -> Result<Vec<SandboxInfo>, RuntimeError> {
            self.saw("list")
        }
        async fn exec(&self, _: &SandboxId, _: ExecRequest) -> Result<Process, RuntimeError> {
            self.saw("exec")
        }
        async fn create_and_exec(
            &self,
            _: ValidatedSpec,
            _: ExecRequest,
        ) -> Result<(SandboxInfo, Result<Process, RuntimeError>), RuntimeError> {
            self.saw("create_and_exec")
        }
        async fn file(&self, _: &SandboxId, _: FileOp) -> Result<FileReply, RuntimeError> {
            self.saw("file")
        }
        async fn read_file(&self, _: &SandboxId, _: &str) -> Result<ByteReader, RuntimeError> {
            self.saw("read_file")
        }
        async fn write_file(&self, _: &SandboxId, _: &str, _: Option<u32>, _: ByteReader) -> Result<(), RuntimeError> {
            self.saw("write_file")
        }
        async fn connect(&self, _: &SandboxId, _: u16) -> Result<Box<dyn Duplex>, RuntimeError> {
            self.saw("connect")
        }
        async fn metrics(&self, _: &SandboxId) -> Result<SandboxMetrics, RuntimeError> {
            self.saw("metrics")
        }
        async fn egress(&self, _: &SandboxId) -> Result<EgressStatus, RuntimeError> {
            self.saw("egress")
        }
        async fn set_egress(&self, _: &SandboxId, _: ValidatedPolicy) -> Result<EgressStatus, RuntimeError> {
            self.saw("set_egress")
        }
        async fn vault(&self, _: &SandboxId) -> Result<Option<Vault>, RuntimeError> {
            self.saw("vault")
        }
        async fn set_vault(&self, _: &SandboxId, _: Option<Vault>) -> Result<(), RuntimeError> {
            self.saw("set_vault")
        }
        async fn volumes(&self) -> Result<Vec<NamedVolume>, RuntimeError> {
            self.saw("volumes")
        }
        async fn delete_volume(&self, _: &str) -> Result<(), RuntimeError> {
            self.saw("delete_volume")
        }
        async fn pause(&self, _: &SandboxId) -> Result<(), RuntimeError> {
            self.saw("pause")
        }
        async fn resume(&self, _: &SandboxId) -> Result<(), RuntimeError> {
            self.saw("resume")
        }
        async fn renew(&self, _: &SandboxId, _: Duration) -> Result<SandboxInfo, RuntimeError> {
            self.saw("renew")
        }
        async fn destroy(&self, _: &SandboxId) -> Result<(), RuntimeError> {
            self.saw("destroy")
        }
        async fn acquire(&self, _: &ThreadId, _: ValidatedSpec) -> Result<SandboxInfo, RuntimeError> {
            self.saw("acquire")
        }
        async fn release(&self, _: &ThreadId) -> Result<(), RuntimeError> {
            self.saw("release")
        }
        async fn destroy_workspace(&self, _: &ThreadId) -> Result<(), RuntimeError> {
            self.saw("destroy_workspace")
        }
    }

    /// The methods `trait Runtime` declares, read from its source: a method added there and
    /// not called below (so not forwarded by `Deadlined`, since the recorder must see it)
    /// fails this test. A default method the decorator did not forward would run the trait's
    /// default instead of the inner runtime's, silently.
    fn trait_methods() -> BTreeSet<String> {
        let src = include_str!("../../paddock-core/src/runtime.rs");
        let body = &src[src.find("pub trait Runtime").expect("the trait")..];
        let body = &body[..body.find("\n}\n").expect("the trait's end")];
        body.lines()
            .filter_map(|l| l.trim_start().strip_prefix("async fn ").or_else(|| l.trim_start().strip_prefix("fn ")))
            .map(|l| l[..l.find(['(', '<']).unwrap()].to_owned())
            .collect()
    }

    #[tokio::test]
    async fn the_deadline_decorator_forwards_every_method() {
        let inner = Arc::new(Recorder::default());
        let rt = Deadlined::new(inner.clone(), Deadlines::default());
        let id = SandboxId::parse("sbx-recorded").unwrap();
        let thread = ThreadId::new("thread-recorded").unwrap();
        let read = || -> ByteReader { Box::new(tokio::io::empty()) };
        let _ = rt.capabilities();
        let _ = rt.isolation_targets().await;
        let _ = rt.check(false).await;
        let _ = rt.sandbox_settings(&id).await;
        let _ = rt.health().await;
        let _ = rt.create(ValidatedSpec::default()).await;
        let _ = rt.get(&id).await;
        let _ = rt.list().await;
        let _ = rt.exec(&id, ExecRequest::shell("true")).await;
        let _ = rt.create_and_exec(ValidatedSpec::default(), ExecRequest::shell("true")).await;
        let _ = rt.file(&id, FileOp::Stat { path: "/x".into() }).await;
        let _ = rt.read_file(&id, "/x").await;
        let _ = rt.write_file(&id, "/x", None, read()).await;
        let _ = rt.connect(&id, 80).await;
        let _ = rt.metrics(&id).await;
        let _ = rt.egress(&id).await;
        let _ = rt.set_egress(&id, EgressPolicy::deny_all().validated().unwrap()).await;
        let _ = rt.vault(&id).await;
        let _ = rt.set_vault(&id, None).await;
        let _ = rt.volumes().await;
        let _ = rt.delete_volume("v").await;
        let _ = rt.pause(&id).await;
        let _ = rt.resume(&id).await;
        let _ = rt.renew(&id, Duration::from_secs(60)).await;
        let _ = rt.destroy(&id).await;
        let _ = rt.acquire(&thread, ValidatedSpec::default()).await;
        let _ = rt.release(&thread).await;
        let _ = rt.destroy_workspace(&thread).await;
        let seen: BTreeSet<String> = inner.0.lock().unwrap().iter().map(|m| m.to_string()).collect();
        let declared = trait_methods();
        assert!(declared.len() > 20, "the trait's methods were not found: {declared:?}");
        assert_eq!(seen, declared, "methods of the trait the decorator did not forward (or this test does not call)");
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_reader_fails_only_while_waiting() {
        let (mut tx, rx) = tokio::io::duplex(16);
        let mut r = IdleReader::new(rx, Duration::from_secs(5), "a test stream".into());
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        tx.write_all(b"ab").await.unwrap();
        let mut buf = [0u8; 2];
        r.read_exact(&mut buf).await.unwrap();
        // Not polled for a long time: no timeout is pending then.
        tokio::time::advance(Duration::from_secs(60)).await;
        tx.write_all(b"c").await.unwrap();
        assert_eq!(r.read(&mut buf).await.unwrap(), 1);
        let e = r.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        assert!(e.to_string().contains("a test stream stalled"), "{e}");
    }
}
