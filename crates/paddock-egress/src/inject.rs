//! Credential injection: an HTTP/1 connection to a host the sandbox's vault binds is read
//! request by request (over plain TCP, or decrypted by [`crate::intercept`]). Each request's
//! head is judged and rewritten before it leaves: it must be for the host the connection was
//! dialed to, at most one binding may match it, the headers its binding sets are removed from
//! what the sandbox sent and set with the vault's values, its placeholders are resolved, and a
//! placeholder left over refuses it. Bodies pass through as they come, framed by their own
//! `Content-Length` or chunks, so the next request's head is found; responses are relayed as
//! they are. Hand-written because no HTTP library forwards a request's exact bytes with only
//! its head changed (hyper re-frames bodies and normalises headers).

use std::sync::Arc;
use std::time::Duration;

use paddock_core::vault::{Auth, Binding, PLACEHOLDER_PREFIX, Place, Scheme, Vault};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};

use crate::state::{Enforcer, Kind};

/// Largest request head read (a head past it is refused).
pub(crate) const MAX_HEAD: usize = 64 << 10;
/// Largest body read whole for a body substitution; larger ones pass unchanged.
const MAX_SUBSTITUTED_BODY: usize = 4 << 20;
/// How long a refused request waits for the upstream to finish what it was sent before.
const DRAIN: Duration = Duration::from_secs(30);

/// Shortest credential value redacted from responses (shorter ones would match everywhere).
const MIN_REDACTED: usize = 6;
/// How long the last bytes of a response wait for more before they are sent unchecked for a
/// value that would continue in the next read (a stream, such as server-sent events, must not
/// stall).
const HOLD: Duration = Duration::from_millis(20);

/// Relays responses with every credential value of the vault overwritten by `*` of the same
/// length, so a value an upstream echoes back never reaches the sandbox and the response's
/// framing (lengths, chunk sizes) stays right. Only a tail that could be the start of a value
/// is held back for the next read (or [`HOLD`]), so a value split between reads is caught and
/// nothing else waits. Requests ask for plain responses (`Accept-Encoding: identity`); a body an
/// upstream compresses anyway reaches this decompressed ([`crate::responses`]).
async fn redact_copy<R, W>(r: &mut R, w: &mut W, secrets: &[&[u8]]) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf: Vec<u8> = Vec::with_capacity(RELAY);
    let mut chunk = vec![0u8; RELAY];
    loop {
        let read = if buf.is_empty() {
            r.read(&mut chunk).await
        } else {
            match tokio::time::timeout(HOLD, r.read(&mut chunk)).await {
                Ok(n) => n,
                Err(_) => {
                    w.write_all(&buf).await?;
                    w.flush().await?;
                    buf.clear();
                    continue;
                }
            }
        };
        let n = read?;
        if n == 0 {
            w.write_all(&buf).await?;
            return w.flush().await;
        }
        buf.extend_from_slice(&chunk[..n]);
        mask(&mut buf, secrets);
        let emit = buf.len() - partial_tail(&buf, secrets);
        w.write_all(&buf[..emit]).await?;
        buf.drain(..emit);
        w.flush().await?;
    }
}

/// Overwrites every whole value in `buf` with `*`.
fn mask(buf: &mut [u8], secrets: &[&[u8]]) {
    for s in secrets {
        let mut at = 0;
        while let Some(i) = find(&buf[at..], s) {
            let start = at + i;
            buf[start..start + s.len()].fill(b'*');
            at = start + s.len();
        }
    }
}

/// [`redact_copy`]'s masking for a body that arrives in pieces whose framing the stream
/// puts between them (chunks): what `push` answers is masked and may be sent, a tail that
/// could start a value is held for the next piece, and `finish` answers it at the body's end.
pub(crate) struct Redactor<'a> {
    secrets: &'a [&'a [u8]],
    held: Vec<u8>,
}

impl<'a> Redactor<'a> {
    pub(crate) fn new(secrets: &'a [&'a [u8]]) -> Self {
        Self { secrets, held: Vec::new() }
    }

    pub(crate) fn push(&mut self, piece: &[u8]) -> Vec<u8> {
        self.held.extend_from_slice(piece);
        mask(&mut self.held, self.secrets);
        let emit = self.held.len() - partial_tail(&self.held, self.secrets);
        self.held.drain(..emit).collect()
    }

    pub(crate) fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.held)
    }
}

/// The length of the longest tail of `buf` that is the start of a value (not the whole of it).
fn partial_tail(buf: &[u8], secrets: &[&[u8]]) -> usize {
    let mut keep = 0;
    for s in secrets {
        let from = buf.len().saturating_sub(s.len() - 1);
        for p in from..buf.len() {
            if buf.len() - p <= keep {
                break;
            }
            if buf[p] == s[0] && s.starts_with(&buf[p..]) {
                keep = buf.len() - p;
                break;
            }
        }
    }
    keep
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

const RELAY: usize = 64 << 10;

/// Where a connection goes: what bindings are matched against.
#[derive(Debug, Clone)]
pub struct Target {
    pub scheme: Scheme,
    /// The name the connection was judged and dialed by (lowercase, no port).
    pub host: String,
    pub port: u16,
}

/// Relays one connection, requests rewritten on the way up. `first` is what was already read
/// from the client.
pub async fn relay<C, U>(enf: &Enforcer, client: C, first: Vec<u8>, upstream: U, target: &Target)
where
    C: AsyncRead + AsyncWrite + Unpin + Send,
    U: AsyncRead + AsyncWrite + Unpin + Send,
{
    let vault = enf.vault();
    let (cr, mut cw) = tokio::io::split(client);
    let (mut ur, mut uw) = tokio::io::split(upstream);
    let mut reader = BufReader::with_capacity(64 << 10, std::io::Cursor::new(first).chain(cr));
    let refusal = std::sync::Mutex::new(None::<String>);
    let refused = tokio::sync::Notify::new();
    // Bounded: a sandbox that pipelines requests an upstream never answers waits for answers
    // instead of growing the queue.
    let (asked_tx, asked_rx) = tokio::sync::mpsc::channel(crate::responses::MAX_UNANSWERED);
    let up = async {
        if let Some(why) = requests(enf, &vault, &mut reader, &mut uw, target, asked_tx).await {
            enf.denied(Kind::Tcp, format!("{} (http request)", target.host), why.clone());
            *refusal.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
            refused.notify_one();
        }
        // The upstream answers what it was sent, then sees the end.
        let _ = uw.shutdown().await;
    };
    let secrets: Vec<&[u8]> =
        vault.credentials.iter().map(|c| c.value.expose().as_bytes()).filter(|v| v.len() >= MIN_REDACTED).collect();
    let down = async {
        {
            // Responses made plain (compressed bodies decompressed), then redacted on their way.
            let (mut plain_w, mut plain_r) = tokio::io::duplex(RELAY);
            let decode = async {
                if let Err(crate::responses::Refused(why)) =
                    crate::responses::plain(&mut ur, &mut plain_w, asked_rx, &secrets).await
                {
                    enf.denied(Kind::Tcp, format!("{} (http response)", target.host), why.clone());
                    let _ = plain_w.write_all(&crate::proxy::bad_gateway(&why, "credential proxy")).await;
                }
                let _ = plain_w.shutdown().await;
            };
            let relay = async {
                tokio::select! {
                    _ = redact_copy(&mut plain_r, &mut cw, &secrets) => {}
                    // A refused request is answered once the upstream finished the earlier ones,
                    // or after a while if it keeps the connection open.
                    _ = async { refused.notified().await; tokio::time::sleep(DRAIN).await } => {}
                }
            };
            tokio::pin!(decode, relay);
            tokio::select! {
                // Relayed to the end (or given up on): what the upstream still sends goes nowhere.
                () = &mut relay => {}
                // The upstream ended: what was made plain is still relayed.
                () = &mut decode => relay.await,
            }
        }
        let why = refusal.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(why) = why {
            let _ = cw.write_all(&crate::proxy::forbidden("refused", &why, "credential proxy")).await;
        }
        // The client sees the end too, so a request it still sends fails instead of hanging.
        let _ = cw.shutdown().await;
    };
    tokio::join!(up, down);
}

/// Forwards requests until the client ends, or returns why one was refused (nothing of it
/// was sent).
async fn requests<R, W>(
    enf: &Enforcer,
    vault: &Arc<Vault>,
    reader: &mut BufReader<R>,
    up: &mut W,
    target: &Target,
    asked: tokio::sync::mpsc::Sender<crate::responses::Asked>,
) -> Option<String>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    loop {
        let head = match read_head(reader).await {
            Ok(Some(h)) => h,
            Ok(None) => return None,
            Err(why) => return Some(why),
        };
        let req = match Request::parse(&head) {
            Ok(r) => r,
            Err(why) => return Some(why),
        };
        if req.host != target.host {
            return Some(format!(
                "a request for {} on a connection made to {}: open a connection of its own",
                req.host, target.host
            ));
        }
        let binding = match vault.binding_for(target.scheme, &req.host, target.port, &req.method, &req.path) {
            Ok(b) => b,
            Err(why) => return Some(why),
        };
        let (mut out, body_subs) = match rewrite(&req, binding, vault) {
            Ok(r) => r,
            Err(why) => return Some(why),
        };
        if binding.is_some() {
            enf.injected();
        }
        let upgrade = req.method == "CONNECT" || req.header("upgrade").is_some();
        // Before the request goes up, so its response always finds it.
        let _ = asked
            .send(crate::responses::Asked {
                head: req.method == "HEAD",
                connect: req.method == "CONNECT",
                http10: req.version == 0,
            })
            .await;
        let framing = match req.framing() {
            Ok(f) => f,
            Err(why) => return Some(why),
        };
        match framing {
            Framing::Length(n) if !body_subs.is_empty() && n <= MAX_SUBSTITUTED_BODY as u64 => {
                let mut body = vec![0u8; usize::try_from(n).unwrap_or(MAX_SUBSTITUTED_BODY)];
                if reader.read_exact(&mut body).await.is_err() {
                    return None;
                }
                let body = substitute_body(&body, &body_subs, req.header("content-type").unwrap_or(""));
                out = set_length(&out, body.len());
                if up.write_all(&out).await.is_err() || up.write_all(&body).await.is_err() {
                    return None;
                }
            }
            Framing::Chunked if !body_subs.is_empty() => {
                // Read whole (bounded) so placeholders split across chunks resolve too, then
                // sent with a length: the chunk sizes would no longer fit the new body.
                let body = match read_chunked(reader, MAX_SUBSTITUTED_BODY).await {
                    Ok(Some(b)) => b,
                    Ok(None) => {
                        return Some(format!(
                            "a chunked request body over {} MiB to a host whose credential binding substitutes into bodies: send it with a Content-Length, or in smaller requests",
                            MAX_SUBSTITUTED_BODY >> 20
                        ));
                    }
                    Err(_) => return None,
                };
                let body = substitute_body(&body, &body_subs, req.header("content-type").unwrap_or(""));
                out = set_length(&out, body.len());
                if up.write_all(&out).await.is_err() || up.write_all(&body).await.is_err() {
                    return None;
                }
            }
            framing => {
                if up.write_all(&out).await.is_err() {
                    return None;
                }
                let sent = match framing {
                    Framing::Length(n) => copy_exact(reader, up, n).await,
                    Framing::Chunked => copy_chunked(reader, up).await,
                    Framing::None => Ok(()),
                };
                if sent.is_err() {
                    return None;
                }
            }
        }
        if upgrade {
            // A WebSocket or a tunnel: what follows is not HTTP.
            let _ = tokio::io::copy(reader, up).await;
            return None;
        }
    }
}

async fn read_head<R: AsyncRead + Unpin>(reader: &mut BufReader<R>) -> Result<Option<Vec<u8>>, String> {
    let mut head = Vec::with_capacity(1024);
    loop {
        // Bounded: a line without an end must not grow without limit.
        let room = (MAX_HEAD + 1).saturating_sub(head.len()) as u64;
        let n = (&mut *reader)
            .take(room)
            .read_until(b'\n', &mut head)
            .await
            .map_err(|e| format!("reading a request: {e}"))?;
        if n == 0 {
            return if head.iter().all(|b| b.is_ascii_whitespace()) {
                Ok(None)
            } else {
                Err("the connection ended inside a request head".into())
            };
        }
        if head.len() > MAX_HEAD {
            return Err(format!("a request head is larger than {} KiB", MAX_HEAD >> 10));
        }
        // Blank lines between requests are allowed (RFC 9112 §2.2).
        if head == b"\r\n" || head == b"\n" {
            head.clear();
            continue;
        }
        if head.ends_with(b"\r\n\r\n") || head.ends_with(b"\n\n") {
            return Ok(Some(head));
        }
    }
}

enum Framing {
    None,
    Length(u64),
    Chunked,
}

struct Request {
    method: String,
    /// The path without the query, as sent (percent-encoding kept).
    path: String,
    /// The query without `?`, if any.
    query: Option<String>,
    version: u8,
    host: String,
    headers: Vec<(String, String)>,
}

impl Request {
    fn parse(head: &[u8]) -> Result<Request, String> {
        let mut slots = [httparse::EMPTY_HEADER; 128];
        let mut r = httparse::Request::new(&mut slots);
        match r.parse(head) {
            Ok(httparse::Status::Complete(_)) => {}
            _ => return Err("a request that is not HTTP/1".into()),
        }
        let mut headers = Vec::with_capacity(r.headers.len());
        for h in r.headers.iter() {
            let v = std::str::from_utf8(h.value).map_err(|_| format!("header {} is not text", h.name))?;
            headers.push((h.name.to_string(), v.to_string()));
        }
        let mut target = r.path.unwrap_or("/").to_string();
        let mut uri_host = None;
        if let Some((_, rest)) = target.split_once("://") {
            let (authority, path) = match rest.find('/') {
                Some(i) => (&rest[..i], &rest[i..]),
                None => (rest, "/"),
            };
            uri_host = Some(authority.to_string());
            target = path.to_string();
        }
        let host_header: Vec<&str> =
            headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case("host")).map(|(_, v)| v.as_str()).collect();
        if host_header.len() > 1 {
            return Err("a request with more than one Host".into());
        }
        let host =
            uri_host.as_deref().or(host_header.first().copied()).map(crate::sniff::strip_port).unwrap_or_default();
        if host.is_empty() {
            return Err("a request without a Host".into());
        }
        let (path, query) = match target.split_once('?') {
            Some((p, q)) => (p.to_string(), Some(q.to_string())),
            None => (target, None),
        };
        Ok(Request {
            method: r.method.unwrap_or("GET").to_string(),
            path,
            query,
            version: r.version.unwrap_or(1),
            host,
            headers,
        })
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// Where the body ends, as the upstream will see it. A request two parsers could frame
    /// differently (both lengths, lengths that disagree, an encoding that is not chunked last)
    /// is refused: the bytes the enforcer takes for a body must never be a request the upstream
    /// runs unchecked, nor the other way round.
    fn framing(&self) -> Result<Framing, String> {
        let values = |name: &str| -> Vec<&str> {
            self.headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str()).collect()
        };
        let (te, cl) = (values("transfer-encoding"), values("content-length"));
        if !te.is_empty() {
            let last = te.iter().flat_map(|v| v.split(',')).last().unwrap_or("").trim();
            if !cl.is_empty() || !last.eq_ignore_ascii_case("chunked") {
                return Err("a request whose body length is ambiguous (Transfer-Encoding with Content-Length, or not chunked last)".into());
            }
            return Ok(Framing::Chunked);
        }
        let mut lengths = cl.iter().flat_map(|v| v.split(',')).map(|v| v.trim().parse::<u64>());
        match lengths.next() {
            None => Ok(Framing::None),
            Some(Ok(n)) if lengths.all(|m| m.as_ref().is_ok_and(|m| *m == n)) => {
                Ok(if n == 0 { Framing::None } else { Framing::Length(n) })
            }
            _ => Err("a request whose Content-Length is not one number".into()),
        }
    }
}

/// (placeholder, value) pairs to replace in a request's body, borrowed from the vault.
type BodySubstitutions<'v> = Vec<(String, &'v str)>;

/// The rewritten head, and the substitutions still to do in the body.
fn rewrite<'v>(
    req: &Request,
    binding: Option<&Binding>,
    vault: &'v Vault,
) -> Result<(Vec<u8>, BodySubstitutions<'v>), String> {
    let subs: Vec<(Place, String, &'v str)> = match binding {
        Some(b) => {
            let mut s = Vec::new();
            for sub in b.auth.substitutions() {
                let v = vault.value(&sub.credential).ok_or("a binding refers to a missing credential")?;
                for p in &sub.places {
                    s.push((*p, sub.placeholder.clone(), v.expose()));
                }
            }
            // `paddock:secret:NAME` resolves to any of the vault's credentials, on a request a
            // binding matches only.
            for c in &vault.credentials {
                let ph = format!("{PLACEHOLDER_PREFIX}{}", c.name);
                for p in [Place::Header, Place::Query, Place::Path] {
                    s.push((p, ph.clone(), c.value.expose()));
                }
            }
            s
        }
        None => Vec::new(),
    };
    let apply = |place: Place, text: &str, encode: bool| -> String {
        let mut out = text.to_string();
        for (p, ph, v) in &subs {
            if *p == place && out.contains(ph.as_str()) {
                let v = if encode { percent_encode(v) } else { (*v).to_string() };
                out = out.replace(ph.as_str(), &v);
            }
        }
        out
    };
    let path = apply(Place::Path, &req.path, true);
    let query = req.query.as_deref().map(|q| apply(Place::Query, q, true));
    let set: Vec<(String, String)> = match binding {
        Some(b) => b
            .auth
            .headers()
            .into_iter()
            .map(|(name, cred)| {
                let v = vault.value(&cred).map(|s| s.expose().to_string()).unwrap_or_default();
                let v = match &b.auth {
                    Auth::Bearer { .. } => format!("Bearer {v}"),
                    Auth::Basic { .. } => format!("Basic {v}"),
                    _ => v,
                };
                (name, v)
            })
            .collect(),
        None => Vec::new(),
    };
    let mut out = format!("{} {path}", req.method);
    if let Some(q) = &query {
        out.push('?');
        out.push_str(q);
    }
    out.push_str(if req.version == 0 { " HTTP/1.0\r\n" } else { " HTTP/1.1\r\n" });
    // Responses are searched for the vault's values, which a compressed body would hide: ask
    // for it plain.
    let plain = !vault.credentials.is_empty();
    for (name, value) in &req.headers {
        if set.iter().any(|(n, _)| n.eq_ignore_ascii_case(name))
            || (plain && name.eq_ignore_ascii_case("accept-encoding"))
        {
            continue;
        }
        let mut value = apply(Place::Header, value, false);
        if name.eq_ignore_ascii_case("authorization")
            && let Some(basic) = value.strip_prefix("Basic ")
            && let Some(resolved) = resolve_basic(basic, &subs)
        {
            value = format!("Basic {resolved}");
        }
        out.push_str(name);
        out.push_str(": ");
        out.push_str(&value);
        out.push_str("\r\n");
    }
    for (name, value) in &set {
        out.push_str(name);
        out.push_str(": ");
        out.push_str(value);
        out.push_str("\r\n");
    }
    if plain {
        out.push_str("Accept-Encoding: identity\r\n");
    }
    out.push_str("\r\n");
    if out.contains(PLACEHOLDER_PREFIX) || (binding.is_none() && contains_encoded_placeholder(&out)) {
        return Err(match binding {
            Some(_) => "a paddock:secret: placeholder names no credential of this sandbox's vault".into(),
            None => format!(
                "a paddock:secret: placeholder in a request to {}, which no credential binding matches: placeholders resolve only for bound hosts",
                req.host
            ),
        });
    }
    let body_subs = subs.into_iter().filter(|(p, _, _)| *p == Place::Body).map(|(_, ph, v)| (ph, v)).collect();
    Ok((out.into_bytes(), body_subs))
}

fn contains_encoded_placeholder(s: &str) -> bool {
    s.contains("paddock%3Asecret%3A") || s.contains("paddock%3asecret%3a")
}

/// Placeholders inside `Basic base64(user:password)`: decoded, resolved, encoded again.
fn resolve_basic(b64: &str, subs: &[(Place, String, &str)]) -> Option<String> {
    use base64::Engine as _;
    let e = base64::engine::general_purpose::STANDARD;
    let plain = String::from_utf8(e.decode(b64.trim()).ok()?).ok()?;
    let mut out = plain.clone();
    for (p, ph, v) in subs {
        if *p == Place::Header {
            out = out.replace(ph.as_str(), v);
        }
    }
    if out.contains(PLACEHOLDER_PREFIX) {
        // Left for the caller's check, which refuses it.
        return Some(format!("{PLACEHOLDER_PREFIX}unresolved"));
    }
    (out != plain).then(|| e.encode(out))
}

/// Everything but RFC 3986's unreserved characters, so a value stays one path segment or one
/// query value.
const COMPONENT: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

fn percent_encode(v: &str) -> String {
    percent_encoding::utf8_percent_encode(v, COMPONENT).to_string()
}

fn substitute_body(body: &[u8], subs: &[(String, &str)], content_type: &str) -> Vec<u8> {
    let Ok(text) = std::str::from_utf8(body) else { return body.to_vec() };
    let ct = content_type.to_ascii_lowercase();
    let mut out = text.to_string();
    for (ph, v) in subs {
        let v = if ct.contains("json") {
            // The value inside a JSON string: quoted, then without its quotes.
            let quoted = serde_json::Value::from(*v).to_string();
            let inner = quoted.strip_prefix('"').and_then(|q| q.strip_suffix('"'));
            inner.unwrap_or(&quoted).to_string()
        } else if ct.contains("x-www-form-urlencoded") {
            percent_encode(v)
        } else {
            (*v).to_string()
        };
        out = out.replace(ph.as_str(), &v);
    }
    out.into_bytes()
}

/// The head with `Content-Length: len` as its only framing (a `Transfer-Encoding` goes).
fn set_length(head: &[u8], len: usize) -> Vec<u8> {
    let text = String::from_utf8_lossy(head);
    let mut out = String::with_capacity(text.len() + 24);
    for line in text.split_inclusive("\r\n") {
        let lower = line.to_ascii_lowercase();
        if lower.starts_with("content-length:") || lower.starts_with("transfer-encoding:") {
            continue;
        }
        if line == "\r\n" {
            out.push_str(&format!("Content-Length: {len}\r\n"));
        }
        out.push_str(line);
    }
    out.into_bytes()
}

/// A chunked body, its chunks joined (extensions and trailers dropped), or `None` once it
/// grows past `max`.
async fn read_chunked<R: AsyncRead + Unpin>(r: &mut BufReader<R>, max: usize) -> std::io::Result<Option<Vec<u8>>> {
    let mut body = Vec::new();
    loop {
        let (_, size) = chunk_size(r).await?;
        if size == 0 {
            trailers(r, &mut tokio::io::sink()).await?;
            return Ok(Some(body));
        }
        if body.len() as u64 + size > max as u64 {
            return Ok(None);
        }
        let start = body.len();
        body.resize(start + usize::try_from(size).unwrap_or(max), 0);
        r.read_exact(&mut body[start..]).await?;
        let mut crlf = [0u8; 2];
        r.read_exact(&mut crlf).await?;
        if &crlf != b"\r\n" {
            return Err(std::io::Error::other("a chunk not ended by CRLF"));
        }
    }
}

pub(crate) async fn copy_exact<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    r: &mut BufReader<R>,
    w: &mut W,
    n: u64,
) -> std::io::Result<()> {
    let copied = tokio::io::copy(&mut r.take(n), w).await?;
    if copied < n {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

/// A chunk's size line as sent, and the size it gives.
pub(crate) async fn chunk_size<R: AsyncRead + Unpin>(r: &mut BufReader<R>) -> std::io::Result<(Vec<u8>, u64)> {
    let mut line = Vec::new();
    if r.take(4096).read_until(b'\n', &mut line).await? == 0 || !line.ends_with(b"\n") {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    let size_text = String::from_utf8_lossy(&line);
    let size_hex = size_text.split(';').next().unwrap_or("").trim();
    let size = u64::from_str_radix(size_hex, 16).map_err(|_| std::io::Error::other("a bad chunk size"))?;
    Ok((line, size))
}

/// The trailers after the last chunk, through the blank line, written to `w` as sent.
async fn trailers<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(r: &mut BufReader<R>, w: &mut W) -> std::io::Result<()> {
    loop {
        let mut t = Vec::new();
        if r.take(MAX_HEAD as u64).read_until(b'\n', &mut t).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        w.write_all(&t).await?;
        if t == b"\r\n" || t == b"\n" {
            return Ok(());
        }
    }
}

/// Forwards a chunked body through its last chunk and trailers, exactly as sent.
pub(crate) async fn copy_chunked<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    r: &mut BufReader<R>,
    w: &mut W,
) -> std::io::Result<()> {
    loop {
        let (line, size) = chunk_size(r).await?;
        w.write_all(&line).await?;
        if size == 0 {
            return trailers(r, w).await;
        }
        copy_exact(r, w, size + 2).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_core::egress::{Action, EgressPolicy, EgressRule};
    use paddock_core::vault::CreateRequest;

    fn vault() -> Vault {
        let req: CreateRequest = serde_json::from_value(serde_json::json!({
            "credentials": [{"name": "tok", "source": {"value": "T0K"}}, {"name": "q", "source": {"value": "a b&c"}}],
            "bindings": [
                {"name": "bearer", "match": {"schemes": ["http"], "hosts": ["api.test"], "paths": ["/b/*"]}, "auth": {"type": "bearer", "credential": "tok"}},
                {"name": "pass", "match": {"schemes": ["http"], "hosts": ["api.test"], "paths": ["/p/*"]},
                 "auth": {"type": "passthrough", "substitutions": [{"credential": "q", "placeholder": "__Q__", "in": ["query", "body"]}]}}
            ]
        }))
        .unwrap();
        let policy =
            EgressPolicy { default_action: Action::Deny, egress: vec![EgressRule::new(Action::Allow, "api.test")] };
        Vault::create(req, &policy).unwrap()
    }

    /// Where `requests` notes what it sent when no response is read here (a closed queue).
    fn unanswered() -> tokio::sync::mpsc::Sender<crate::responses::Asked> {
        tokio::sync::mpsc::channel(1).0
    }

    fn head(s: &str) -> Request {
        Request::parse(s.as_bytes()).unwrap()
    }

    #[test]
    fn a_bound_request_gets_the_credential_and_loses_the_sandboxs_own() {
        let v = vault();
        let r = head("GET /b/x HTTP/1.1\r\nHost: API.test:80\r\nauthorization: Bearer fake\r\nAccept: */*\r\n\r\n");
        let b = v.binding_for(Scheme::Http, &r.host, 80, &r.method, &r.path).unwrap();
        let (out, _) = rewrite(&r, b, &v).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(out.contains("\r\nAuthorization: Bearer T0K\r\n"), "{out}");
        assert!(!out.contains("fake"), "{out}");
        // Asked for plain, so that an echoed value is found in the response.
        let r =
            head("GET /b/x HTTP/1.1\r\nHost: api.test\r\nAccept-Encoding: gzip, br\r\naccept-encoding: zstd\r\n\r\n");
        let (out, _) = rewrite(&r, v.binding_for(Scheme::Http, &r.host, 80, &r.method, &r.path).unwrap(), &v).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(
            out.ends_with("\r\nAccept-Encoding: identity\r\n\r\n") && !out.contains("gzip") && !out.contains("zstd"),
            "{out}"
        );
        assert!(out.starts_with("GET /b/x HTTP/1.1\r\n"), "{out}");
    }

    #[test]
    fn placeholders_resolve_only_where_a_binding_matches() {
        let v = vault();
        let r = head("GET /p/x?k=__Q__&t=paddock:secret:tok HTTP/1.1\r\nHost: api.test\r\n\r\n");
        let b = v.binding_for(Scheme::Http, &r.host, 80, &r.method, &r.path).unwrap();
        let (out, body) = rewrite(&r, b, &v).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(out.starts_with("GET /p/x?k=a%20b%26c&t=T0K HTTP/1.1\r\n"), "{out}");
        assert_eq!(body, vec![("__Q__".to_string(), "a b&c")]);
        let unbound = head("GET /other?t=paddock:secret:tok HTTP/1.1\r\nHost: api.test\r\n\r\n");
        let e = rewrite(&unbound, None, &v).unwrap_err();
        assert!(e.contains("no credential binding matches"), "{e}");
        let unknown = head("GET /b/x HTTP/1.1\r\nHost: api.test\r\nX-T: paddock:secret:nope\r\n\r\n");
        let b = v.binding_for(Scheme::Http, &unknown.host, 80, &unknown.method, &unknown.path).unwrap();
        assert!(rewrite(&unknown, b, &v).unwrap_err().contains("names no credential"));
        assert_eq!(
            substitute_body(br#"{"s": "__Q__"}"#, &[("__Q__".into(), "a\"b")], "application/json"),
            br#"{"s": "a\"b"}"#.to_vec()
        );
        assert_eq!(
            substitute_body(br#"{"s": "__Q__"}"#, &[("__Q__".into(), "ends\"")], "application/json"),
            br#"{"s": "ends\""}"#.to_vec()
        );
    }

    #[test]
    fn a_body_two_parsers_could_frame_differently_is_refused() {
        let framing = |h: &str| head(&format!("POST /b/x HTTP/1.1\r\nHost: api.test\r\n{h}\r\n")).framing();
        assert!(matches!(framing("Content-Length: 3\r\n"), Ok(Framing::Length(3))));
        assert!(matches!(framing("Content-Length: 3, 3\r\n"), Ok(Framing::Length(3))));
        assert!(matches!(framing("Transfer-Encoding: gzip, chunked\r\n"), Ok(Framing::Chunked)));
        for bad in [
            "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n",
            "Content-Length: 3\r\nContent-Length: 4\r\n",
            "Content-Length: -1\r\n",
            "Transfer-Encoding: chunked, gzip\r\n",
        ] {
            assert!(framing(bad).is_err(), "{bad:?} was framed");
        }
    }

    #[tokio::test]
    async fn a_head_without_an_end_is_refused_at_its_bound() {
        let endless = vec![b'A'; MAX_HEAD * 4];
        let mut reader = BufReader::new(&endless[..]);
        let e = read_head(&mut reader).await.unwrap_err();
        assert!(e.contains("larger than"), "{e}");
    }

    #[tokio::test]
    async fn values_echoed_back_are_overwritten_even_across_reads() {
        let (mut tx, mut rx) = tokio::io::duplex(64);
        let writer = tokio::spawn(async move {
            for part in [&b"HTTP/1.1 200 OK\r\n\r\nyour token is T0K-SEC"[..], b"RET-VALUE and again T0K-SECRET-VALUE."]
            {
                tx.write_all(part).await.unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        let mut out = Vec::new();
        redact_copy(&mut rx, &mut out, &[b"T0K-SECRET-VALUE"]).await.unwrap();
        writer.await.unwrap();
        let out = String::from_utf8(out).unwrap();
        assert_eq!(out, "HTTP/1.1 200 OK\r\n\r\nyour token is **************** and again ****************.");
        // Only a tail that could start a value is held back.
        let secrets: [&[u8]; 1] = [b"T0K-SECRET-VALUE"];
        assert_eq!(partial_tail(b"ends with T0K-S", &secrets), 5);
        assert_eq!(partial_tail(b"ends with T0K-X", &secrets), 0);
        assert_eq!(partial_tail(b"ends plainly\n", &secrets), 0);
    }

    #[tokio::test]
    async fn a_chunked_body_is_substituted_whole_and_sent_with_its_length() {
        let v = Arc::new(vault());
        let enf = Enforcer::new(EgressPolicy::allow_all(), crate::state::Config::default());
        enf.set_vault(Some((*v).clone()));
        // The placeholder split between two chunks, an extension and a trailer; then the next
        // request on the connection.
        let input =
            b"POST /p/1 HTTP/1.1\r\nHost: api.test\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n\
4;ext=1\r\nv=__\r\n7\r\nQ__ end\r\n0\r\nX-Trailer: t\r\n\r\n\
GET /b/2 HTTP/1.1\r\nHost: api.test\r\n\r\n";
        let mut reader = BufReader::new(&input[..]);
        let mut up = Vec::new();
        let target = Target { scheme: Scheme::Http, host: "api.test".into(), port: 80 };
        assert_eq!(requests(&enf, &v, &mut reader, &mut up, &target, unanswered()).await, None);
        let up = String::from_utf8(up).unwrap();
        let (first, next) = up.split_once("GET /b/2").unwrap();
        assert!(first.ends_with("\r\nContent-Length: 11\r\n\r\nv=a b&c end"), "{first}");
        assert!(!first.to_ascii_lowercase().contains("transfer-encoding"), "{first}");
        assert!(next.contains("Authorization: Bearer T0K"), "{next}");
        // Over the bound: refused, not sent with the placeholder in it.
        let big = format!(
            "POST /p/2 HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{}\r\n0\r\n\r\n",
            MAX_SUBSTITUTED_BODY + 1,
            "x".repeat(MAX_SUBSTITUTED_BODY + 1)
        );
        let mut reader = BufReader::new(big.as_bytes());
        let mut up = Vec::new();
        let why = requests(&enf, &v, &mut reader, &mut up, &target, unanswered()).await.unwrap();
        assert!(why.contains("chunked request body over 4 MiB"), "{why}");
        assert!(up.is_empty(), "nothing of it was sent");
    }

    #[tokio::test]
    async fn bodies_are_framed_so_the_next_head_is_found() {
        let v = Arc::new(vault());
        let enf = Enforcer::new(EgressPolicy::allow_all(), crate::state::Config::default());
        enf.set_vault(Some((*v).clone()));
        let input = b"POST /b/1 HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n\
POST /b/2 HTTP/1.1\r\nHost: api.test\r\nContent-Length: 3\r\n\r\nxyz\
GET /b/3 HTTP/1.1\r\nHost: evil.test\r\n\r\n";
        let mut reader = BufReader::new(&input[..]);
        let mut up = Vec::new();
        let target = Target { scheme: Scheme::Http, host: "api.test".into(), port: 80 };
        let why = requests(&enf, &v, &mut reader, &mut up, &target, unanswered()).await.unwrap();
        assert!(why.contains("a request for evil.test on a connection made to api.test"), "{why}");
        let up = String::from_utf8(up).unwrap();
        assert_eq!(up.matches("Authorization: Bearer T0K").count(), 2, "{up}");
        assert!(up.contains("\r\n\r\n3\r\nabc\r\n0\r\n\r\nPOST /b/2"), "{up}");
        assert!(up.ends_with("\r\n\r\nxyz"), "{up}");
    }
}
