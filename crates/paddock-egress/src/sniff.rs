//! The first bytes of an outbound connection: the server name of a TLS ClientHello or the
//! `Host` of an HTTP request, read whole before anything is decided (a post-quantum key share
//! makes a ClientHello span several segments; a handshake message may span TLS records).

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

/// The most bytes of an HTTP request head read before a decision.
pub const MAX_HEAD: usize = 16 << 10;
/// The most bytes of a TLS ClientHello read before a decision. rustls reads a hello of up to
/// about 16 KiB, which may span records (browsers' post-quantum hellos are under 2 KiB); a
/// larger one is refused, never judged by its address alone.
pub const MAX_CLIENT_HELLO: usize = 20 << 10;

/// What the client said first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// A TLS ClientHello; `None` when it names no server (an IP literal or no SNI).
    Tls(Option<String>),
    /// An HTTP/1 request; its `Host` (or absolute-form authority) without the port.
    Http(Option<String>),
    /// A ClientHello (`tls`) or an HTTP request head that did not end within its bound of
    /// bytes or time, or a TLS handshake too malformed to read. It is refused: judged by its
    /// address alone, the name it carries (which a laxer server may read) would go unjudged.
    Unreadable { tls: bool },
    /// Something else, or nothing yet (a protocol where the server speaks first).
    Opaque,
}

impl Hello {
    /// The name the connection is for, unless it is an address literal.
    pub fn name(&self) -> Option<&str> {
        match self {
            Hello::Tls(Some(n)) | Hello::Http(Some(n)) => {
                let bare = n.trim_start_matches('[').trim_end_matches(']');
                (bare.parse::<std::net::IpAddr>().is_err()).then_some(n.as_str())
            }
            _ => None,
        }
    }
}

/// Reads until the client's first message is whole. `first` bounds the wait for the first
/// byte (after it the protocol is taken to be server-first), `whole` the rest.
pub async fn sniff<R: AsyncRead + Unpin>(r: &mut R, first: Duration, whole: Duration) -> (Hello, Vec<u8>) {
    let mut buf = Vec::with_capacity(2048);
    let mut chunk = [0u8; 4096];
    match tokio::time::timeout(first, r.read(&mut chunk)).await {
        Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
        _ => return (Hello::Opaque, buf),
    }
    let deadline = tokio::time::Instant::now() + whole;
    loop {
        let tls = buf.first() == Some(&0x16);
        let bound = if tls { MAX_CLIENT_HELLO } else { MAX_HEAD };
        match classify(&buf) {
            Progress::Done(h) => return (h, buf),
            Progress::More if buf.len() < bound => {}
            Progress::More => return (unfinished(&buf), buf),
        }
        match tokio::time::timeout_at(deadline, r.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            _ => return (unfinished(&buf), buf),
        }
    }
}

/// What a first message that never ended is: only TLS or HTTP are read on (see `classify`).
fn unfinished(buf: &[u8]) -> Hello {
    if buf.first() == Some(&0x16) { unreadable_tls(buf) } else { Hello::Unreadable { tls: false } }
}

enum Progress {
    Done(Hello),
    More,
}

fn classify(buf: &[u8]) -> Progress {
    match buf.first() {
        Some(0x16) => tls(buf),
        // HTTP servers skip empty lines before a request line (RFC 9112 §2.2), so does httparse.
        Some(b'A'..=b'Z' | b'\r' | b'\n') => http(buf),
        _ => Progress::Done(Hello::Opaque),
    }
}

fn tls(buf: &[u8]) -> Progress {
    let mut acceptor = rustls::server::Acceptor::default();
    let mut rd = buf;
    while !rd.is_empty() {
        match acceptor.read_tls(&mut rd) {
            Ok(0) => break,
            Ok(_) => {}
            Err(_) => return Progress::Done(unreadable_tls(buf)),
        }
    }
    match acceptor.accept() {
        Ok(Some(accepted)) => {
            Progress::Done(Hello::Tls(accepted.client_hello().server_name().map(|s| s.to_ascii_lowercase())))
        }
        Ok(None) => Progress::More,
        Err(_) => Progress::Done(unreadable_tls(buf)),
    }
}

/// A first record that says it is a TLS handshake (0x16, version 3.x) but that rustls cannot
/// read is refused rather than relayed unjudged; anything else starting with 0x16 is opaque.
fn unreadable_tls(buf: &[u8]) -> Hello {
    if buf.get(1) == Some(&3) { Hello::Unreadable { tls: true } } else { Hello::Opaque }
}

fn http(buf: &[u8]) -> Progress {
    let mut headers = [httparse::EMPTY_HEADER; 256];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Complete(_)) => {
            let from_uri =
                req.path.and_then(|p| p.split_once("://")).map(|(_, rest)| rest.split('/').next().unwrap_or(""));
            let host = req
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("host"))
                .and_then(|h| std::str::from_utf8(h.value).ok())
                .or(from_uri)
                .or(if req.method == Some("CONNECT") { req.path } else { None })
                .map(strip_port);
            Progress::Done(Hello::Http(host.filter(|h| !h.is_empty())))
        }
        Ok(httparse::Status::Partial) => Progress::More,
        // A request whose Host the parser could not reach: not judged by its address alone.
        Err(httparse::Error::TooManyHeaders) => Progress::Done(Hello::Unreadable { tls: false }),
        Err(_) => Progress::Done(Hello::Opaque),
    }
}

/// The host of an authority (`host`, `host:port`, `[v6]:port`), lowercase, without a final dot.
pub(crate) fn strip_port(authority: &str) -> String {
    let a = authority.trim();
    let host = if let Some(rest) = a.strip_prefix('[') {
        rest.split(']').next().unwrap_or(rest)
    } else {
        a.rsplit_once(':').filter(|(_, p)| p.bytes().all(|b| b.is_ascii_digit())).map(|(h, _)| h).unwrap_or(a)
    };
    host.trim_end_matches('.').to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn run(bytes: &[u8]) -> Hello {
        let (mut a, mut b) = tokio::io::duplex(1 << 20);
        tokio::io::AsyncWriteExt::write_all(&mut a, bytes).await.unwrap();
        sniff(&mut b, Duration::from_millis(200), Duration::from_millis(200)).await.0
    }

    /// A ClientHello for `name`, built by hand: record header, handshake header, the fixed
    /// fields, one cipher suite, and the server_name extension plus `pad` bytes of padding so
    /// that it spans segments the way a post-quantum key share makes real ones do.
    fn client_hello(name: &str, pad: usize) -> Vec<u8> {
        let mut sni = vec![0u8];
        sni.extend(u16::try_from(name.len()).unwrap().to_be_bytes());
        sni.extend(name.as_bytes());
        let mut sni_list = u16::try_from(sni.len()).unwrap().to_be_bytes().to_vec();
        sni_list.extend(sni);
        let mut ext = vec![0, 0];
        ext.extend(u16::try_from(sni_list.len()).unwrap().to_be_bytes());
        ext.extend(sni_list);
        ext.extend([0x00, 0x0d, 0, 4, 0, 2, 0x08, 0x04]); // signature_algorithms: rsa_pss_rsae_sha256
        ext.extend([0x00, 0x15]); // padding
        ext.extend(u16::try_from(pad).unwrap().to_be_bytes());
        ext.extend(vec![0u8; pad]);
        let mut body = vec![3, 3];
        body.extend([7u8; 32]); // random
        body.push(0); // session id
        body.extend([0, 2, 0x13, 0x01]); // TLS_AES_128_GCM_SHA256
        body.extend([1, 0]); // null compression
        body.extend(u16::try_from(ext.len()).unwrap().to_be_bytes());
        body.extend(ext);
        let mut hs = vec![1];
        hs.extend(&u32::try_from(body.len()).unwrap().to_be_bytes()[1..]);
        hs.extend(body);
        let mut rec = vec![0x16, 3, 1];
        rec.extend(u16::try_from(hs.len()).unwrap().to_be_bytes());
        rec.extend(hs);
        rec
    }

    #[tokio::test]
    async fn tls_server_names_are_read_even_from_large_hellos() {
        assert_eq!(run(&client_hello("Files.Example.com", 0)).await, Hello::Tls(Some("files.example.com".into())));
        let big = client_hello("big.example.com", 6000);
        assert!(big.len() > 4096);
        assert_eq!(run(&big).await, Hello::Tls(Some("big.example.com".into())));
        // Cut short: the client never finishes its hello, so it cannot be judged by name.
        assert_eq!(run(&big[..3000]).await, Hello::Unreadable { tls: true });
    }

    /// A hello longer than one TLS record (16 KiB) is split across records, as TLS allows;
    /// its name is read all the same.
    fn across_records(hello: &[u8], record: usize) -> Vec<u8> {
        let body = &hello[5..];
        let mut out = Vec::new();
        for part in body.chunks(record) {
            out.extend([0x16, 3, 1]);
            out.extend(u16::try_from(part.len()).unwrap().to_be_bytes());
            out.extend(part);
        }
        out
    }

    #[tokio::test]
    async fn a_hello_is_judged_by_its_name_across_records_or_refused_when_unreadable() {
        let big = client_hello("big.example.com", 12_000);
        assert_eq!(run(&across_records(&big, 5000)).await, Hello::Tls(Some("big.example.com".into())));
        // 40 000 bytes of padding: more than rustls reads, split over records as TLS allows.
        // The name is never judged, so the connection is refused, not judged by its address.
        let huge = client_hello("huge.example.com", 40_000);
        assert_eq!(run(&across_records(&huge, 16 << 10)).await, Hello::Unreadable { tls: true });
        // A handshake message declaring more than TLS's largest: never a name, never Opaque.
        let mut endless = vec![0x16, 3, 1, 0x40, 0x00, 1, 0xff, 0xff, 0xff];
        endless.extend(vec![0u8; 0x4000 - 4]);
        for _ in 0..5 {
            endless.extend([0x16, 3, 1, 0x40, 0x00]);
            endless.extend(vec![0u8; 0x4000]);
        }
        assert_eq!(run(&endless).await, Hello::Unreadable { tls: true }, "judged by its address alone");
        // Bytes past its end that rustls cannot parse: refused too, not relayed opaque.
        assert_eq!(run(&[0x16, 3, 1, 0, 4, 9, 9, 9, 9]).await, Hello::Unreadable { tls: true });
        assert_eq!(run(&[0x16, 0x42, 0x42]).await, Hello::Opaque, "not TLS");
        // An HTTP head longer than its bound, or one that stalls.
        let mut head = b"GET / HTTP/1.1\r\nHost: evil.test\r\nX-Pad: ".to_vec();
        head.extend(vec![b'a'; MAX_HEAD]);
        assert_eq!(run(&head).await, Hello::Unreadable { tls: false });
        assert_eq!(run(b"GET / HTTP/1.1\r\nHost: ev").await, Hello::Unreadable { tls: false });
    }

    #[tokio::test]
    async fn http_hosts_come_from_the_header_or_the_request_target() {
        assert_eq!(
            run(b"GET / HTTP/1.1\r\nHost: Api.Example.com:8080\r\n\r\n").await,
            Hello::Http(Some("api.example.com".into()))
        );
        assert_eq!(
            run(b"GET http://x.test/a HTTP/1.1\r\nAccept: */*\r\n\r\n").await,
            Hello::Http(Some("x.test".into()))
        );
        assert_eq!(run(b"CONNECT y.test:443 HTTP/1.1\r\n\r\n").await, Hello::Http(Some("y.test".into())));
        let literal = run(b"GET / HTTP/1.1\r\nHost: [2001:db8::1]:80\r\n\r\n").await;
        assert_eq!(literal, Hello::Http(Some("2001:db8::1".into())));
        assert_eq!(literal.name(), None, "an address literal is not a name");
        assert_eq!(run(b"SSH-2.0-OpenSSH_9.2\r\n").await, Hello::Opaque);
        assert_eq!(run(b"\r\nGET / HTTP/1.1\r\nHost: lead.test\r\n\r\n").await, Hello::Http(Some("lead.test".into())));
        let mut many = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..300 {
            many.extend(format!("X-{i}: y\r\n").as_bytes());
        }
        many.extend(b"Host: far.test\r\n\r\n");
        assert_eq!(run(&many).await, Hello::Unreadable { tls: false });
        assert_eq!(run(b"").await, Hello::Opaque);
    }
}
