//! Forward mode: every allowed TCP connection is relayed through the operator's HTTP proxy
//! (`CONNECT`), for networks where nothing reaches out but through one. The policy and the
//! guard judge as always; the proxy is asked for the address they judged, never for a name,
//! so a proxy that resolves a name differently cannot lead anywhere the sandbox may not go.

use std::net::SocketAddr;
use std::time::Duration;

use paddock_core::vault::Secret;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The longest answer head a proxy may send to a `CONNECT`.
const MAX_ANSWER: usize = 16 << 10;

/// The operator's proxy and how to prove ourselves to it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForwardProxy {
    pub addr: SocketAddr,
    /// The `Proxy-Authorization` value (`Basic …`), from the URL's user and password.
    #[serde(default)]
    pub authorization: Option<Secret>,
}

impl std::fmt::Debug for ForwardProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let auth = if self.authorization.is_some() { " (with credentials)" } else { "" };
        write!(f, "ForwardProxy(http://{}{auth})", self.addr)
    }
}

impl ForwardProxy {
    /// Reads `http://[user[:password]@]host:port`; `resolve` gives a host name's address (the
    /// caller may do IO; this crate's judging code does not). Hand-parsed: the `url` crate
    /// leaves the user and password percent-encoded, and nothing else of a URL is accepted here.
    pub fn parse(url: &str, resolve: impl FnOnce(&str, u16) -> Result<SocketAddr, String>) -> Result<Self, String> {
        let rest = url.trim().strip_prefix("http://").ok_or_else(|| {
            format!(
                "{:?}: give the proxy as http://[user:password@]host:port (https proxies are not supported)",
                redact(url)
            )
        })?;
        let rest = rest.trim_end_matches('/');
        if rest.contains('/') || rest.contains('?') || rest.contains('#') {
            return Err(format!("{:?}: a proxy URL has no path: give http://[user:password@]host:port", redact(url)));
        }
        let (userinfo, hostport) = match rest.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, rest),
        };
        let (host, port) = hostport
            .rsplit_once(':')
            .filter(|(h, _)| !h.is_empty() && (!h.contains(':') || (h.starts_with('[') && h.ends_with(']'))))
            .ok_or_else(|| format!("{hostport:?}: give the proxy's host and port, e.g. http://proxy.corp:3128"))?;
        let port: u16 =
            port.parse().ok().filter(|p| *p != 0).ok_or_else(|| format!("{port:?} is not a port: give 1 to 65535"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let addr = match host.parse::<std::net::IpAddr>() {
            Ok(ip) => SocketAddr::new(ip, port),
            Err(_) => resolve(host, port)?,
        };
        let authorization = userinfo.map(|u| {
            use base64::Engine as _;
            let (user, pass) = u.split_once(':').unwrap_or((u, ""));
            let decode = |s: &str| percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned();
            let plain = Secret::new(format!("{}:{}", decode(user), decode(pass)));
            Secret::new(format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(plain.expose())))
        });
        Ok(Self { addr, authorization })
    }

    /// A tunnel to `target` through the proxy, ready for the client's bytes.
    pub async fn connect(&self, target: SocketAddr, within: Duration) -> Result<TcpStream, String> {
        let attempt = async {
            let mut s = TcpStream::connect(self.addr).await.map_err(|e| {
                format!(
                    "the forward proxy {} cannot be reached: {e}; check --egress-proxy and that the proxy runs",
                    self.addr
                )
            })?;
            let auth = self.authorization.as_ref().map(|a| format!("Proxy-Authorization: {}\r\n", a.expose()));
            let head =
                Secret::new(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{}\r\n", auth.unwrap_or_default()));
            s.write_all(head.expose().as_bytes())
                .await
                .map_err(|e| format!("the forward proxy {} closed the connection: {e}", self.addr))?;
            let status = answer(&mut s).await.map_err(|e| format!("the forward proxy {}: {e}", self.addr))?;
            match status {
                200..=299 => Ok(s),
                407 => Err(format!(
                    "the forward proxy {} wants credentials it was not given or refused them (407): give user:password in --egress-proxy",
                    self.addr
                )),
                code => Err(format!(
                    "the forward proxy {} refused CONNECT {target} with status {code}: its own rules refuse this address; allow it there",
                    self.addr
                )),
            }
        };
        tokio::time::timeout(within, attempt).await.unwrap_or_else(|_| {
            Err(format!("the forward proxy {} did not open {target} within {}s", self.addr, within.as_secs()))
        })
    }
}

/// Reads the proxy's answer head a byte at a time (what follows it is the upstream's and must
/// stay in the socket) and returns its status code.
async fn answer(s: &mut TcpStream) -> Result<u16, String> {
    let mut head = Vec::with_capacity(256);
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() >= MAX_ANSWER {
            return Err(format!("its answer head is over {} KiB", MAX_ANSWER >> 10));
        }
        match s.read_u8().await {
            Ok(b) => head.push(b),
            Err(e) => return Err(format!("it closed the connection before answering CONNECT ({e})")),
        }
    }
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    match (parts.next(), parts.next().and_then(|c| c.parse().ok())) {
        (Some(v), Some(code)) if v.starts_with("HTTP/1.") => Ok(code),
        _ => Err(format!("its answer {:?} is not HTTP", line.trim_end())),
    }
}

/// The URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://…@{}", &url[..s], &url[at + 1..]),
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_dns(host: &str, _: u16) -> Result<SocketAddr, String> {
        Err(format!("{host} not resolved in a unit test"))
    }

    #[test]
    fn proxy_urls_give_an_address_and_a_basic_credential() {
        let p = ForwardProxy::parse("http://u%40corp:p%3Ass@192.0.2.8:3128/", no_dns).unwrap();
        assert_eq!(p.addr, "192.0.2.8:3128".parse().unwrap());
        // base64("u@corp:p:ss")
        assert_eq!(p.authorization.as_ref().unwrap().expose(), "Basic dUBjb3JwOnA6c3M=");
        assert!(!format!("{p:?}").contains("dUBj"), "the credential is not printed");
        let v6 = ForwardProxy::parse("http://[2001:db8::1]:8080", no_dns).unwrap();
        assert_eq!((v6.addr, v6.authorization), ("[2001:db8::1]:8080".parse().unwrap(), None));
        let named = ForwardProxy::parse("http://proxy.corp:3128", |h, p| {
            assert_eq!((h, p), ("proxy.corp", 3128));
            Ok("198.51.100.2:3128".parse().unwrap())
        })
        .unwrap();
        assert_eq!(named.addr, "198.51.100.2:3128".parse().unwrap());
        for (bad, why) in [
            ("https://u:secret@192.0.2.8:3128", "https proxies"),
            ("192.0.2.8:3128", "http://"),
            ("http://192.0.2.8", "host and port"),
            ("http://192.0.2.8:0", "not a port"),
            ("http://192.0.2.8:3128/path", "no path"),
            ("http://proxy.corp:3128", "not resolved"),
        ] {
            let e = ForwardProxy::parse(bad, no_dns).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
            assert!(!e.contains("secret"), "{bad}: the password is in {e}");
        }
    }

    /// A proxy on loopback that answers one CONNECT as told, then relays nothing but its own
    /// greeting.
    async fn proxy_once(answer: &'static str) -> (SocketAddr, tokio::task::JoinHandle<String>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let (mut c, _) = l.accept().await.unwrap();
            let mut got = Vec::new();
            while !got.ends_with(b"\r\n\r\n") {
                got.push(c.read_u8().await.unwrap());
            }
            c.write_all(answer.as_bytes()).await.unwrap();
            String::from_utf8(got).unwrap()
        });
        (addr, task)
    }

    #[tokio::test]
    async fn a_tunnel_opens_on_2xx_keeps_what_follows_and_names_a_refusal() {
        let (addr, seen) = proxy_once("HTTP/1.1 200 Connection established\r\n\r\nSSH-2.0-upstream\r\n").await;
        let p = ForwardProxy { addr, authorization: Some(Secret::new("Basic eDp5")) };
        let mut s = p.connect("192.0.2.10:22".parse().unwrap(), Duration::from_secs(5)).await.unwrap();
        let mut greeting = [0u8; 18];
        s.read_exact(&mut greeting).await.unwrap();
        assert_eq!(&greeting, b"SSH-2.0-upstream\r\n", "the upstream's first bytes stay for the client");
        assert_eq!(
            seen.await.unwrap(),
            "CONNECT 192.0.2.10:22 HTTP/1.1\r\nHost: 192.0.2.10:22\r\nProxy-Authorization: Basic eDp5\r\n\r\n"
        );
        let (addr, _) = proxy_once("HTTP/1.1 407 Proxy Authentication Required\r\n\r\n").await;
        let e = ForwardProxy { addr, authorization: None }
            .connect("192.0.2.10:443".parse().unwrap(), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(e.contains("407"), "{e}");
        let (addr, _) = proxy_once("HTTP/1.1 403 Forbidden\r\n\r\n").await;
        let e = ForwardProxy { addr, authorization: None }
            .connect("192.0.2.10:443".parse().unwrap(), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(e.contains("status 403"), "{e}");
    }
}
