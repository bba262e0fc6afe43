//! Deadlines for clients that stop half-way: a request body that stops arriving, a response
//! the client stops reading. Hyper bounds only the wait for request headers; without these, a
//! holder of a key or token could keep a connection slot forever by trickling a body or never
//! reading a download, and enough such connections stop the server accepting.
//!
//! Both deadlines count stalls, not totals: a large upload or a long event stream that keeps
//! moving is never cut, and a command that prints nothing for an hour holds no write pending.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// A request body that fails once no byte of it arrived for `idle`.
struct IdleBody {
    inner: Body,
    idle: Duration,
    timer: Pin<Box<Sleep>>,
}

impl http_body::Body for IdleBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                let next = Instant::now() + this.idle;
                this.timer.as_mut().reset(next);
                Poll::Ready(frame)
            }
            Poll::Pending => match this.timer.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(axum::Error::new(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the request body stopped arriving for {}s", this.idle.as_secs()),
                ))))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Middleware: every request body gets the idle deadline.
pub async fn body_deadline(idle: Duration, req: Request, next: Next) -> Response {
    let req = req.map(|inner| Body::new(IdleBody { inner, idle, timer: Box::pin(tokio::time::sleep(idle)) }));
    next.run(req).await
}

/// A connection whose writes fail once one stayed blocked for `limit`: the client stopped
/// reading what it asked for. Hyper then closes the connection and frees its slot.
pub struct WriteDeadline<T> {
    inner: T,
    limit: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<T> WriteDeadline<T> {
    pub fn new(inner: T, limit: Duration) -> Self {
        Self { inner, limit, stalled: None }
    }

    fn watch<R>(&mut self, cx: &mut Context<'_>, polled: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        match polled {
            Poll::Ready(r) => {
                self.stalled = None;
                Poll::Ready(r)
            }
            Poll::Pending => {
                let limit = self.limit;
                let timer = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client stopped reading the response",
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteDeadline<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.watch(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.watch(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.watch(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test(start_paused = true)]
    async fn a_write_the_peer_never_reads_fails_after_the_limit() {
        let (ours, _theirs) = tokio::io::duplex(16);
        let mut conn = WriteDeadline::new(ours, Duration::from_secs(5));
        conn.write_all(&[0u8; 16]).await.unwrap();
        let started = Instant::now();
        let e = conn.write_all(&[0u8; 16]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn writes_that_keep_moving_are_never_cut() {
        let (ours, mut theirs) = tokio::io::duplex(16);
        let mut conn = WriteDeadline::new(ours, Duration::from_secs(5));
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 16];
            let mut total = 0;
            while total < 16 * 20 {
                tokio::time::sleep(Duration::from_secs(2)).await;
                total += tokio::io::AsyncReadExt::read(&mut theirs, &mut buf).await.unwrap();
            }
        });
        // Twenty buffers, each drained after 2 s: 40 s in all, no stall longer than the limit.
        for _ in 0..20 {
            conn.write_all(&[1u8; 16]).await.unwrap();
        }
        reader.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stops_arriving_fails_and_one_that_moves_does_not() {
        use http_body_util::BodyExt;
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, io::Error>>(4);
        let inner = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
        let mut body = IdleBody {
            inner,
            idle: Duration::from_secs(3),
            timer: Box::pin(tokio::time::sleep(Duration::from_secs(3))),
        };
        let sender = tokio::spawn(async move {
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_secs(2)).await;
                tx.send(Ok(Bytes::from_static(b"x"))).await.unwrap();
            }
            // Then nothing, with the stream still open.
            tokio::time::sleep(Duration::from_secs(3600)).await;
            drop(tx);
        });
        for _ in 0..5 {
            let frame = body.frame().await.unwrap().unwrap();
            assert_eq!(frame.into_data().unwrap(), Bytes::from_static(b"x"));
        }
        let e = body.frame().await.unwrap().unwrap_err();
        assert!(e.to_string().contains("stopped arriving"), "{e}");
        sender.abort();
    }
}
