//! The first bytes of an outbound connection: the server name of a TLS ClientHello or the
//! `Host` of an HTTP request, read whole before anything is decided (a post-quantum key share
//! makes a ClientHello span several segments; a handshake message may span TLS records).

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

/// The most bytes read before a decision: a ClientHello or a request head larger than this is
/// judged without a name.
pub const MAX_HELLO: usize = 16 << 10;

/// What the client said first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// A TLS ClientHello; `None` when it names no server (an IP literal or no SNI).
    Tls(Option<String>),
    /// An HTTP/1 request; its `Host` (or absolute-form authority) without the port.
    Http(Option<String>),
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
        match classify(&buf) {
            Progress::Done(h) => return (h, buf),
            Progress::More if buf.len() < MAX_HELLO => {}
            Progress::More => return (Hello::Opaque, buf),
        }
        match tokio::time::timeout_at(deadline, r.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            _ => return (Hello::Opaque, buf),
        }
    }
}

enum Progress {
    Done(Hello),
    More,
}

fn classify(buf: &[u8]) -> Progress {
    match buf.first() {
        Some(0x16) => tls(buf),
        Some(b'A'..=b'Z') => http(buf),
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
            Err(_) => return Progress::Done(Hello::Opaque),
        }
    }
    match acceptor.accept() {
        Ok(Some(accepted)) => {
            Progress::Done(Hello::Tls(accepted.client_hello().server_name().map(|s| s.to_ascii_lowercase())))
        }
        Ok(None) => Progress::More,
        Err(_) => Progress::Done(Hello::Opaque),
    }
}

fn http(buf: &[u8]) -> Progress {
    let mut headers = [httparse::EMPTY_HEADER; 64];
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
        sni.extend((name.len() as u16).to_be_bytes());
        sni.extend(name.as_bytes());
        let mut sni_list = (sni.len() as u16).to_be_bytes().to_vec();
        sni_list.extend(sni);
        let mut ext = vec![0, 0];
        ext.extend((sni_list.len() as u16).to_be_bytes());
        ext.extend(sni_list);
        ext.extend([0x00, 0x0d, 0, 4, 0, 2, 0x08, 0x04]); // signature_algorithms: rsa_pss_rsae_sha256
        ext.extend([0x00, 0x15]); // padding
        ext.extend((pad as u16).to_be_bytes());
        ext.extend(vec![0u8; pad]);
        let mut body = vec![3, 3];
        body.extend([7u8; 32]); // random
        body.push(0); // session id
        body.extend([0, 2, 0x13, 0x01]); // TLS_AES_128_GCM_SHA256
        body.extend([1, 0]); // null compression
        body.extend((ext.len() as u16).to_be_bytes());
        body.extend(ext);
        let mut hs = vec![1];
        hs.extend(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend(body);
        let mut rec = vec![0x16, 3, 1];
        rec.extend((hs.len() as u16).to_be_bytes());
        rec.extend(hs);
        rec
    }

    #[tokio::test]
    async fn tls_server_names_are_read_even_from_large_hellos() {
        assert_eq!(run(&client_hello("Files.Example.com", 0)).await, Hello::Tls(Some("files.example.com".into())));
        let big = client_hello("big.example.com", 6000);
        assert!(big.len() > 4096);
        assert_eq!(run(&big).await, Hello::Tls(Some("big.example.com".into())));
        // Cut short: the client never finishes its hello, so there is no name.
        assert_eq!(run(&big[..3000]).await, Hello::Opaque);
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
        assert_eq!(run(b"").await, Hello::Opaque);
    }
}
