//! A port-forwarded connection that reports why it ended.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};

type ErrorFuture = Pin<Box<dyn Future<Output = Option<String>> + Send>>;

/// The kubelet reports a refused or failed port on a side channel and then just closes the
/// stream; without this, a refused connection would look like an empty reply.
pub struct PortStream {
    inner: DuplexStream,
    error: Option<ErrorFuture>,
}

impl PortStream {
    pub fn new(inner: DuplexStream, error: ErrorFuture) -> Self {
        Self { inner, error: Some(error) }
    }
}

impl AsyncRead for PortStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) if buf.filled().len() == before => {
                // The forwarder ends the error channel before the data stream, so at EOF
                // it has either reported or closed.
                let Some(error) = this.error.as_mut() else { return Poll::Ready(Ok(())) };
                let reported = match error.as_mut().poll(cx) {
                    Poll::Ready(r) => r,
                    Poll::Pending => None,
                };
                this.error = None;
                match reported {
                    Some(message) => Poll::Ready(Err(io::Error::new(io::ErrorKind::ConnectionRefused, message))),
                    None => Poll::Ready(Ok(())),
                }
            }
            other => other,
        }
    }
}

impl AsyncWrite for PortStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn a_reported_error_replaces_a_silent_end() {
        let (mut far, near) = tokio::io::duplex(64);
        let mut s = PortStream::new(near, Box::pin(async { Some("connection refused".to_owned()) }));
        far.shutdown().await.unwrap();
        drop(far);
        let e = s.read_to_end(&mut Vec::new()).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);

        let (mut far, near) = tokio::io::duplex(64);
        let mut s = PortStream::new(near, Box::pin(async { None }));
        far.write_all(b"hi").await.unwrap();
        drop(far);
        let mut got = Vec::new();
        s.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"hi");
    }
}
