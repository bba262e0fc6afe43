//! Responses on a connection whose requests get credentials ([`crate::inject`]), made plain
//! for the redaction that follows it: each response's head is read and its body followed by
//! its own framing, so the next head is found. A body that is gzip- or deflate-coded — an
//! upstream may compress even though every request asked for `identity` — is decompressed
//! and sent on chunked (or to the connection's end for HTTP/1.0), so a credential it echoes
//! is seen and redacted like any other. Any other content coding is refused with a `502`:
//! its bytes could carry a credential past the redaction. A chunked body is sent in chunks
//! of its own, redacted here, because a value split between two chunks has their framing
//! between its halves in the stream, where the byte-wise redaction after this cannot see it
//! whole. Everything else passes exactly as sent. Hand-written for the reason `inject` is:
//! an HTTP library would re-frame every body.

use std::io::Write;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

use crate::inject::{MAX_HEAD, Redactor, chunk_size, copy_exact};

/// What the response to one request needs to know of it, sent in the order requests went up.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Asked {
    /// A `HEAD` request: its response has no body, whatever its head says.
    pub head: bool,
    /// A `CONNECT` request: a 2xx response turns the connection into a tunnel.
    pub connect: bool,
    /// An HTTP/1.0 client, which cannot read a chunked body.
    pub http10: bool,
}

/// Requests sent up and not yet answered, at most: the sender waits past it.
pub(crate) const MAX_UNANSWERED: usize = 1024;

/// How much compressed input is decoded at once: deflate expands at most about 1032 times,
/// so one step's output stays within a few MiB however the body was made.
const DECODE_STEP: usize = 4 << 10;

/// Why a response cannot be made plain; nothing of that response was written.
#[derive(Debug)]
pub(crate) struct Refused(pub String);

/// Relays responses from `up` to `out` until the upstream ends (`Ok`), a response cannot be
/// made plain (`Err(Refused)`, before any of it was written), or the connection breaks
/// (`Ok`: what was written stays, as a relay's would).
pub(crate) async fn plain<R, W>(
    up: R,
    out: &mut W,
    mut asked: mpsc::Receiver<Asked>,
    secrets: &[&[u8]],
) -> Result<(), Refused>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut up = BufReader::with_capacity(64 << 10, up);
    loop {
        let Some(raw) = read_head(&mut up).await? else { return Ok(()) };
        let head = Head::parse(&raw)?;
        // 1xx answers come before the final one to the same request (101 ends HTTP).
        if (100..200).contains(&head.status) {
            if out.write_all(&raw).await.is_err() {
                return Ok(());
            }
            if head.status == 101 {
                let _ = tokio::io::copy(&mut up, out).await;
                return Ok(());
            }
            continue;
        }
        // Sent before its request went up, so a response to it always finds it here; one
        // the upstream sends unasked (a 408) reads as a GET's.
        let req = asked.try_recv().unwrap_or_default();
        if req.connect && (200..300).contains(&head.status) {
            if out.write_all(&raw).await.is_ok() {
                let _ = tokio::io::copy(&mut up, out).await;
            }
            return Ok(());
        }
        let body = if req.head || head.status == 204 || head.status == 304 { Body::None } else { head.body()? };
        // A body that is not sent (a HEAD's, a 304's) has nothing to decompress: its head
        // still describes it as it would be.
        let coding = if body == Body::None { None } else { head.coding()? };
        let relayed = match (coding, body) {
            (None, Body::Chunked) => {
                let mut red = Redactor::new(secrets);
                rechunk(&mut up, out, &raw, body, None, false, &mut red).await.map(|()| true)
            }
            (None, _) => pass(&mut up, out, &raw, body).await,
            (Some(coding), _) => {
                let close = req.http10 || head.http10;
                let mut red = Redactor::new(secrets);
                rechunk(&mut up, out, &head.plain_head(close), body, Some(coding), close, &mut red)
                    .await
                    .map(|()| !close)
            }
        };
        match relayed {
            Ok(true) => {}
            // The connection ended with the body, or broke: nothing more comes.
            Ok(false) | Err(_) => return Ok(()),
        }
    }
}

/// How a response's body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Body {
    None,
    Length(u64),
    Chunked,
    /// To the connection's end.
    Close,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Coding {
    Gzip,
    Deflate,
}

struct Head {
    status: u16,
    reason: String,
    http10: bool,
    headers: Vec<(String, String)>,
}

impl Head {
    fn parse(raw: &[u8]) -> Result<Self, Refused> {
        let mut slots = [httparse::EMPTY_HEADER; 128];
        let mut r = httparse::Response::new(&mut slots);
        match r.parse(raw) {
            Ok(httparse::Status::Complete(_)) => {}
            _ => return Err(Refused("the upstream's answer is not an HTTP/1 response".into())),
        }
        let headers =
            r.headers.iter().map(|h| (h.name.to_owned(), String::from_utf8_lossy(h.value).into_owned())).collect();
        Ok(Self {
            status: r.code.unwrap_or(0),
            reason: r.reason.unwrap_or_default().to_owned(),
            http10: r.version == Some(0),
            headers,
        })
    }

    fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.headers.iter().filter(move |(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// The body's framing (RFC 9112 §6.3).
    fn body(&self) -> Result<Body, Refused> {
        let codings: Vec<String> =
            self.all("transfer-encoding").flat_map(|v| v.split(',')).map(|c| c.trim().to_ascii_lowercase()).collect();
        if !codings.is_empty() {
            return match codings.as_slice() {
                [c] if c == "chunked" => Ok(Body::Chunked),
                _ => Err(Refused(format!(
                    "the upstream framed a response with transfer coding {:?}, which the credential proxy cannot check for the vault's secrets",
                    codings.join(", ")
                ))),
            };
        }
        let lengths: Vec<&str> = self.all("content-length").flat_map(|v| v.split(',')).map(str::trim).collect();
        match lengths.split_first() {
            None => Ok(Body::Close),
            Some((first, rest)) => match first.parse::<u64>() {
                Ok(n) if rest.iter().all(|l| l == first) => Ok(Body::Length(n)),
                _ => Err(Refused(format!("the upstream's response has a bad Content-Length {:?}", lengths.join(", ")))),
            },
        }
    }

    /// The body's content coding, when it is one to decompress; `None` for a plain body.
    fn coding(&self) -> Result<Option<Coding>, Refused> {
        let codings: Vec<String> = self
            .all("content-encoding")
            .flat_map(|v| v.split(','))
            .map(|c| c.trim().to_ascii_lowercase())
            .filter(|c| !c.is_empty() && c != "identity")
            .collect();
        match codings.as_slice() {
            [] => Ok(None),
            [c] if c == "gzip" || c == "x-gzip" => Ok(Some(Coding::Gzip)),
            [c] if c == "deflate" => Ok(Some(Coding::Deflate)),
            _ => Err(Refused(format!(
                "the upstream compressed a response with {:?} although the request asked for identity; only gzip and deflate can be decompressed and checked for the vault's secrets",
                codings.join(", ")
            ))),
        }
    }

    /// The head of the decompressed response: no coding and no length of the compressed
    /// body; chunked, or to the connection's end when `close`.
    fn plain_head(&self, close: bool) -> Vec<u8> {
        let drop = |n: &str| {
            ["content-encoding", "content-length", "transfer-encoding"].iter().any(|d| n.eq_ignore_ascii_case(d))
                || (close && n.eq_ignore_ascii_case("connection"))
        };
        let version = if self.http10 { "HTTP/1.0" } else { "HTTP/1.1" };
        let mut out = format!("{version} {} {}\r\n", self.status, self.reason);
        for (n, v) in self.headers.iter().filter(|(n, _)| !drop(n)) {
            out.push_str(&format!("{n}: {v}\r\n"));
        }
        out.push_str(if close { "Connection: close\r\n\r\n" } else { "Transfer-Encoding: chunked\r\n\r\n" });
        out.into_bytes()
    }
}

async fn read_head<R: AsyncRead + Unpin>(r: &mut BufReader<R>) -> Result<Option<Vec<u8>>, Refused> {
    let mut head = Vec::with_capacity(1024);
    loop {
        let room = (MAX_HEAD + 1).saturating_sub(head.len()) as u64;
        let n = match (&mut *r).take(room).read_until(b'\n', &mut head).await {
            Ok(n) => n,
            Err(_) => return Ok(None),
        };
        if n == 0 {
            return Ok(None);
        }
        if head.len() > MAX_HEAD {
            return Err(Refused(format!("the upstream sent a response head larger than {} KiB", MAX_HEAD >> 10)));
        }
        if head.ends_with(b"\r\n\r\n") || head.ends_with(b"\n\n") {
            return Ok(Some(head));
        }
    }
}

/// A plain response, exactly as sent; whether the connection goes on after it.
async fn pass<R, W>(up: &mut BufReader<R>, out: &mut W, head: &[u8], body: Body) -> std::io::Result<bool>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    out.write_all(head).await?;
    match body {
        Body::None | Body::Chunked => {}
        Body::Length(n) => copy_exact(up, out, n).await?,
        Body::Close => {
            tokio::io::copy(up, out).await?;
            return Ok(false);
        }
    }
    out.flush().await?;
    Ok(true)
}

/// A body sent in chunks of its own (or to the connection's end when `close`), redacted as
/// one stream: decompressed first when `coding` says so, else a chunked body as it came.
async fn rechunk<R, W>(
    up: &mut BufReader<R>,
    out: &mut W,
    head: &[u8],
    body: Body,
    coding: Option<Coding>,
    close: bool,
    red: &mut Redactor<'_>,
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    out.write_all(head).await?;
    let mut decoder = match coding {
        None => Decoder::Identity,
        Some(Coding::Gzip) => Decoder::Gzip(flate2::write::MultiGzDecoder::new(Vec::new())),
        Some(Coding::Deflate) => Decoder::Deflate(flate2::write::ZlibDecoder::new(Vec::new())),
    };
    let mut trailers = b"\r\n".to_vec();
    let mut buf = vec![0u8; DECODE_STEP];
    match body {
        Body::None => {}
        Body::Length(n) => {
            relay_exact(up, out, n, &mut buf, &mut decoder, red, close).await?;
        }
        Body::Chunked => loop {
            let (_, size) = chunk_size(up).await?;
            if size == 0 {
                // A compressed body's trailers describe it, not what is sent: only a plain
                // body's are kept.
                let kept = read_trailers(up).await?;
                if coding.is_none() {
                    trailers = kept;
                }
                break;
            }
            relay_exact(up, out, size, &mut buf, &mut decoder, red, close).await?;
            let mut crlf = [0u8; 2];
            up.read_exact(&mut crlf).await?;
        },
        Body::Close => loop {
            let got = up.read(&mut buf).await?;
            if got == 0 {
                break;
            }
            emit(out, red.push(&decoder.feed(&buf[..got])?), close).await?;
        },
    }
    let last = decoder.finish()?;
    let mut rest = red.push(&last);
    rest.extend(red.finish());
    emit(out, rest, close).await?;
    if !close {
        out.write_all(b"0\r\n").await?;
        out.write_all(&trailers).await?;
    }
    out.flush().await
}

/// `n` bytes of a body, decoded, redacted and sent as they arrive.
async fn relay_exact<R, W>(
    up: &mut BufReader<R>,
    out: &mut W,
    n: u64,
    buf: &mut [u8],
    decoder: &mut Decoder,
    red: &mut Redactor<'_>,
    close: bool,
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut left = n;
    while left > 0 {
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let got = up.read(&mut buf[..want]).await?;
        if got == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        left -= got as u64;
        emit(out, red.push(&decoder.feed(&buf[..got])?), close).await?;
    }
    Ok(())
}

/// The trailers after a last chunk, through the blank line.
async fn read_trailers<R: AsyncRead + Unpin>(r: &mut BufReader<R>) -> std::io::Result<Vec<u8>> {
    let mut all = Vec::new();
    loop {
        let mut t = Vec::new();
        if r.take(MAX_HEAD as u64).read_until(b'\n', &mut t).await? == 0 || all.len() > MAX_HEAD {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        all.extend_from_slice(&t);
        if t == b"\r\n" || t == b"\n" {
            return Ok(all);
        }
    }
}

/// Writes decompressed bytes: as one chunk, or bare when the connection's end frames them.
async fn emit<W: AsyncWrite + Unpin>(out: &mut W, data: Vec<u8>, close: bool) -> std::io::Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    if !close {
        out.write_all(format!("{:x}\r\n", data.len()).as_bytes()).await?;
    }
    out.write_all(&data).await?;
    if !close {
        out.write_all(b"\r\n").await?;
    }
    out.flush().await
}

enum Decoder {
    Identity,
    Gzip(flate2::write::MultiGzDecoder<Vec<u8>>),
    Deflate(flate2::write::ZlibDecoder<Vec<u8>>),
}

impl Decoder {
    /// Decodes `input`; answers what came out of it.
    fn feed(&mut self, input: &[u8]) -> std::io::Result<Vec<u8>> {
        match self {
            Self::Identity => Ok(input.to_vec()),
            Self::Gzip(d) => {
                d.write_all(input)?;
                Ok(std::mem::take(d.get_mut()))
            }
            Self::Deflate(d) => {
                d.write_all(input)?;
                Ok(std::mem::take(d.get_mut()))
            }
        }
    }

    fn finish(self) -> std::io::Result<Vec<u8>> {
        match self {
            Self::Identity => Ok(Vec::new()),
            Self::Gzip(d) => d.finish(),
            Self::Deflate(d) => d.finish(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn deflate(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    const SECRET: &[u8] = b"T0K-SECRET-VALUE";

    /// What the client gets for `upstream`, the requests being `asked` (redacted here only
    /// where a body is re-chunked: the stream's own redaction comes after).
    async fn relay(upstream: Vec<u8>, asked: &[Asked]) -> (Vec<u8>, Result<(), Refused>) {
        let (tx, rx) = mpsc::channel(MAX_UNANSWERED);
        for a in asked {
            tx.try_send(*a).unwrap();
        }
        let mut out = Vec::new();
        let r = plain(std::io::Cursor::new(upstream), &mut out, rx, &[SECRET]).await;
        (out, r)
    }

    #[tokio::test]
    async fn plain_responses_pass_exactly_and_framing_finds_each_next_head() {
        let mut up = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello".to_vec();
        up.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
        up.extend_from_slice(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n");
        // A HEAD's answer names a length but has no body: the next head follows at once.
        up.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\nContent-Encoding: gzip\r\n\r\n");
        up.extend_from_slice(b"HTTP/1.1 204 No Content\r\n\r\n");
        up.extend_from_slice(b"HTTP/1.1 200 OK\r\n\r\nto the end");
        let asked = [Asked::default(), Asked::default(), Asked { head: true, ..Default::default() }, Asked::default()];
        let (out, r) = relay(up.clone(), &asked).await;
        assert!(r.is_ok());
        assert_eq!(out, up, "plain responses are relayed byte for byte");
    }

    #[tokio::test]
    async fn compressed_bodies_are_decompressed_and_rechunked_so_a_secret_in_them_shows() {
        let secret = b"{\"echo\": \"Bearer T0K-SECRET-VALUE\"}";
        let z = gzip(secret);
        let mut up =
            format!("HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: {}\r\nX-Keep: 1\r\n\r\n", z.len())
                .into_bytes();
        up.extend_from_slice(&z);
        // Chunked deflate next, split mid-stream across chunks.
        let d = deflate(b"second T0K-SECRET-VALUE");
        up.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Encoding: deflate\r\nTransfer-Encoding: chunked\r\n\r\n");
        let (a, b) = d.split_at(d.len() / 2);
        up.extend_from_slice(format!("{:x}\r\n", a.len()).as_bytes());
        up.extend_from_slice(a);
        up.extend_from_slice(format!("\r\n{:x}\r\n", b.len()).as_bytes());
        up.extend_from_slice(b);
        up.extend_from_slice(b"\r\n0\r\nDigest: x\r\n\r\n");
        up.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
        let (out, r) = relay(up, &[Asked::default(); 3]).await;
        assert!(r.is_ok());
        let text = String::from_utf8_lossy(&out);
        let parts: Vec<&str> = text.split("HTTP/1.1 ").filter(|p| !p.is_empty()).collect();
        assert_eq!(parts.len(), 3, "{text}");
        let first = parts[0].to_ascii_lowercase();
        assert!(first.contains("transfer-encoding: chunked") && first.contains("x-keep: 1"), "{text}");
        assert!(!first.contains("content-encoding") && !first.contains("content-length"), "{text}");
        // Decompressed, the echoed value is found and masked, even split between two
        // decoded pieces that went out as two chunks.
        assert!(parts[0].contains("Bearer ****************") && parts[0].ends_with("0\r\n\r\n"), "{text}");
        assert!(!text.contains("T0K") && text.matches('*').count() == 32, "{text}");
        assert!(parts[1].contains("second ") && !parts[1].contains("Digest"), "{text}");
        assert_eq!(parts[2], "200 OK\r\nContent-Length: 2\r\n\r\nok");
    }

    #[tokio::test]
    async fn a_value_split_between_two_chunks_of_a_plain_body_is_masked_and_trailers_kept() {
        let up = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\necho T0K-\r\nb\r\nSECRET-VALU\r\n1\r\nE\r\n0\r\nX-T: 1\r\n\r\n".to_vec();
        let (out, r) = relay(up, &[Asked::default()]).await;
        assert!(r.is_ok());
        let text = String::from_utf8_lossy(&out);
        assert!(!text.contains("T0K") && !text.contains("SECRET"), "{text}");
        assert!(text.contains("echo ") && text.matches('*').count() == 16, "{text}");
        assert!(text.ends_with("0\r\nX-T: 1\r\n\r\n"), "{text}");
    }

    #[tokio::test]
    async fn an_http10_client_gets_the_decompressed_body_to_the_connections_end() {
        let z = gzip(b"plain now");
        let mut up =
            format!("HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: {}\r\n\r\n", z.len()).into_bytes();
        up.extend_from_slice(&z);
        let (out, r) = relay(up, &[Asked { http10: true, ..Default::default() }]).await;
        assert!(r.is_ok());
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("Connection: close\r\n\r\nplain now") && !text.contains("chunked"), "{text}");
    }

    #[tokio::test]
    async fn codings_that_cannot_be_checked_are_refused_before_anything_is_written() {
        for (head, want) in [
            ("Content-Encoding: br\r\nContent-Length: 3", "\"br\""),
            ("Content-Encoding: gzip, br\r\nContent-Length: 3", "gzip, br"),
            ("Transfer-Encoding: gzip, chunked", "transfer coding"),
            ("Content-Length: 3\r\nContent-Length: 4", "Content-Length"),
        ] {
            let up = format!("HTTP/1.1 200 OK\r\n{head}\r\n\r\nabc").into_bytes();
            let (out, r) = relay(up, &[Asked::default()]).await;
            let why = r.unwrap_err().0;
            assert!(why.contains(want), "{head}: {why}");
            assert!(out.is_empty(), "{head}: nothing of a refused response is written");
        }
    }

    #[tokio::test]
    async fn a_corrupt_compressed_body_ends_the_connection_without_its_last_chunk() {
        let up = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 8\r\n\r\nnotgzip!".to_vec();
        let (out, r) = relay(up, &[Asked::default()]).await;
        assert!(r.is_ok());
        assert!(!out.ends_with(b"0\r\n\r\n"), "{}", String::from_utf8_lossy(&out));
    }
}
