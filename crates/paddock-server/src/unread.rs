//! Refusals that come before a request's body was read to its end (a multipart upload refused
//! at its metadata part, a body that breaks a limit half-way). Hyper cannot reuse such a
//! connection: it hangs up after the answer, and a socket closed with unread bytes in it is
//! reset, which can throw away the answer before the client reads it. The Python SDK then sees
//! "Server disconnected without sending a response", on this request or on the next one it had
//! already sent on the connection: a failure that looks like a crash. So the rest of a small
//! body is read and dropped before the answer goes out, and the connection stays usable; a body
//! too large or too slow for that gets an answer that says `Connection: close`.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, Version, header};
use axum::middleware::Next;
use axum::response::Response;
use bytes::Bytes;
use http_body_util::BodyExt;

/// The most of a refused request's body read and dropped to keep its connection.
const DRAIN_BYTES: usize = 4 << 20;
/// How long that may take.
const DRAIN_TIME: Duration = Duration::from_secs(2);

/// What became of a request's body.
#[derive(Default)]
struct Fate {
    ended: AtomicBool,
    /// The unread rest of a body its reader dropped before the end.
    left: Mutex<Option<Body>>,
}

/// A request body that notes when it was read to its end, and keeps its unread rest when it is
/// dropped before.
struct Tracked {
    inner: Option<Body>,
    fate: Arc<Fate>,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let Some(inner) = this.inner.as_mut() else { return Poll::Ready(None) };
        let frame = Pin::new(&mut *inner).poll_frame(cx);
        // A reader may stop at the last byte (multipart's closing boundary) without polling
        // for the end; the inner body knows it is done once its length is read.
        if matches!(frame, Poll::Ready(None)) || inner.is_end_stream() {
            this.fate.ended.store(true, Ordering::Relaxed);
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.as_ref().map(|b| b.size_hint()).unwrap_or_default()
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if !self.fate.ended.load(Ordering::Relaxed)
            && let Ok(mut left) = self.fate.left.lock()
        {
            *left = self.inner.take();
        }
    }
}

/// Reads and drops what is left of `body`; `true` when that reached its end within the bounds.
async fn drain(mut body: Body) -> bool {
    let mut read = 0usize;
    tokio::time::timeout(DRAIN_TIME, async {
        while read <= DRAIN_BYTES {
            match body.frame().await {
                None => return true,
                Some(Ok(frame)) => read += frame.data_ref().map_or(0, |d| d.len()),
                Some(Err(_)) => return false,
            }
        }
        false
    })
    .await
    .unwrap_or(false)
}

/// Middleware: an error answered over HTTP/1 before the request's body was read to its end
/// first reads the rest of a small body already sent, or else says `Connection: close`.
pub async fn close_when_unread(req: Request, next: Next) -> Response {
    if req.version() > Version::HTTP_11 || http_body::Body::is_end_stream(req.body()) {
        return next.run(req).await;
    }
    // Draining is for a body already on its way: not one the client waits to be asked for
    // (`Expect: 100-continue`, which reading it would ask for), nor one too large to read.
    let expects = req.headers().get(header::EXPECT).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let large = http_body::Body::size_hint(req.body()).lower() > DRAIN_BYTES as u64;
    let drainable = !expects && !large;
    let fate = Arc::new(Fate::default());
    let req = req.map(|inner| Body::new(Tracked { inner: Some(inner), fate: fate.clone() }));
    let mut response = next.run(req).await;
    let error = response.status().is_client_error() || response.status().is_server_error();
    if !error || fate.ended.load(Ordering::Relaxed) {
        return response;
    }
    let left = fate.left.lock().ok().and_then(|mut l| l.take());
    // A body its handler still holds (a proxied stream) cannot be drained here.
    let kept = match left {
        Some(body) if drainable => drain(body).await,
        _ => false,
    };
    if !kept {
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::http::StatusCode;
    use axum::routing::post;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

    /// A connection to a real hyper server whose `/early` refuses without reading the body and
    /// whose `/read` refuses after reading it.
    async fn connect() -> (OwnedReadHalf, OwnedWriteHalf) {
        let app = Router::new()
            .route("/early", post(|| async { StatusCode::BAD_REQUEST }))
            .route("/read", post(|_: bytes::Bytes| async { StatusCode::BAD_REQUEST }))
            .layer(axum::middleware::from_fn(super::close_when_unread));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        tokio::net::TcpStream::connect(addr).await.unwrap().into_split()
    }

    /// Sends a POST announcing `len` bytes and sends `sent` of them beside the read, then
    /// returns the answer's head.
    async fn send(
        r: &mut OwnedReadHalf,
        mut w: OwnedWriteHalf,
        path: &str,
        len: usize,
        sent: usize,
    ) -> (String, OwnedWriteHalf) {
        let head = format!("POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {len}\r\n\r\n");
        w.write_all(head.as_bytes()).await.unwrap();
        // The server may answer before it reads the body.
        let writer = tokio::spawn(async move {
            let _ = w.write_all(&vec![b'x'; sent]).await;
            w
        });
        let mut got = Vec::new();
        let mut byte = [0u8; 1];
        while !got.ends_with(b"\r\n\r\n") {
            let n = r.read(&mut byte).await.unwrap();
            assert!(n > 0, "the server hung up without an answer: {:?}", String::from_utf8_lossy(&got));
            got.push(byte[0]);
        }
        (String::from_utf8_lossy(&got).to_lowercase(), writer.await.unwrap())
    }

    #[tokio::test]
    async fn a_refusal_before_the_body_was_read_keeps_the_connection_usable() {
        let (mut r, w) = connect().await;
        // Refused unread, read, refused without a body: each answered on one connection.
        let (head, w) = send(&mut r, w, "/early", 256 << 10, 256 << 10).await;
        assert!(head.starts_with("http/1.1 400") && !head.contains("connection: close"), "{head}");
        let (head, w) = send(&mut r, w, "/read", 64 << 10, 64 << 10).await;
        assert!(head.starts_with("http/1.1 400") && !head.contains("connection: close"), "{head}");
        let (head, _) = send(&mut r, w, "/early", 0, 0).await;
        assert!(head.starts_with("http/1.1 400") && !head.contains("connection: close"), "{head}");
    }

    #[tokio::test]
    async fn a_refused_body_that_is_large_or_awaits_100_continue_is_not_asked_for() {
        // 64 MiB announced: answered at once, closing, without waiting for the body.
        let (mut r, w) = connect().await;
        let asked = std::time::Instant::now();
        let (head, _w) = send(&mut r, w, "/early", 64 << 20, 0).await;
        assert!(head.starts_with("http/1.1 400") && head.contains("\r\nconnection: close\r\n"), "{head}");
        assert!(asked.elapsed() < super::DRAIN_TIME / 2, "the answer waited for the body: {:?}", asked.elapsed());
        // A client that waits for 100 Continue is answered with the refusal, never a 100.
        let (mut r, mut w) = connect().await;
        w.write_all(b"POST /early HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 10\r\n\r\n")
            .await
            .unwrap();
        let mut got = Vec::new();
        let mut byte = [0u8; 1];
        while !got.ends_with(b"\r\n\r\n") {
            assert_eq!(r.read(&mut byte).await.unwrap(), 1, "{:?}", String::from_utf8_lossy(&got));
            got.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&got).to_lowercase();
        assert!(head.starts_with("http/1.1 400") && head.contains("connection: close"), "{head}");
    }

    #[tokio::test]
    async fn a_refused_body_too_slow_to_read_is_answered_with_connection_close() {
        let (mut r, w) = connect().await;
        // 2 MiB announced, 64 KiB sent, then nothing: the answer says the connection ends.
        let (head, _w) = send(&mut r, w, "/early", 2 << 20, 64 << 10).await;
        assert!(head.starts_with("http/1.1 400") && head.contains("\r\nconnection: close\r\n"), "{head}");
    }
}
