//! Routes to a port in a sandbox besides the path form (`/v1/sandboxes/{id}/proxy/{port}`):
//!
//! - by Host: `<id>-<port>.<sandbox-domain>` (`paddock serve --sandbox-domain`; the wildcard
//!   DNS name and certificate belong to the operator's ingress);
//! - by header: `OpenSandbox-Ingress-To: <id>-<port>` (OpenSandbox's ingress gateway);
//! - by path: `/r/<id>-<port>/...`, for signed routes on a server without a domain.
//!
//! Each is rewritten to the path form before routing, so it reaches a sandbox's port and
//! nothing else: never the lifecycle API. Unsigned routes need the API key or the sandbox's
//! token like the path form. A signed route (`<id>-<port>-<expires, base 36>-<signature>`, from
//! `GET /sandboxes/{id}/endpoints/{port}?expires=`) is its own credential for that sandbox and
//! port until it expires, so a browser can open it; a ticket (`?paddock_ticket=`, from
//! `POST /v1/sandboxes/{id}/tickets`) opens one request once, such as a WebSocket handshake a
//! browser cannot add headers to.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use paddock_core::runtime::SandboxId;
use serde::Deserialize;
use serde_json::json;

use crate::api::{ApiJson, EGRESS_PORT, InSandbox};
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

pub const INGRESS_HEADER: &str = "opensandbox-ingress-to";
pub const TICKET_PARAM: &str = "paddock_ticket";
/// The longest a signed route may stay valid.
pub const MAX_SIGNED: Duration = Duration::from_secs(7 * 24 * 3600);
/// How long a ticket is good for when the request names no TTL, and at most.
const TICKET_TTL: Duration = Duration::from_secs(30);
const MAX_TICKET_TTL: Duration = Duration::from_secs(300);
/// Unused tickets kept at most; a full table refuses new ones instead of growing.
const MAX_TICKETS: usize = 65_536;

/// Set on a request whose route carried its own credential (a valid signature or ticket) for
/// this sandbox; the sandbox routes' auth accepts it for that sandbox only.
#[derive(Debug, Clone)]
pub struct RouteGrant(pub String);

/// One parsed route: a sandbox, a port, and a signature if it is signed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub id: String,
    pub port: u16,
    pub signed: Option<(u64, String)>,
}

/// `<id>-<port>` or `<id>-<port>-<expires36>-<sig>`. Sandbox ids contain a dash themselves,
/// so the form is told apart by whether what is left is a valid id.
pub fn parse_route(s: &str) -> Option<Route> {
    let parts: Vec<&str> = s.rsplitn(4, '-').collect();
    if parts.len() == 4
        && let (Ok(port), Ok(expires)) = (parts[2].parse::<u16>(), u64::from_str_radix(parts[1], 36))
        && SandboxId::parse(parts[3]).is_ok()
        && port > 0
    {
        return Some(Route { id: parts[3].into(), port, signed: Some((expires, parts[0].to_ascii_lowercase())) });
    }
    let (id, port) = s.rsplit_once('-')?;
    let port = port.parse::<u16>().ok().filter(|p| *p > 0)?;
    SandboxId::parse(id).ok()?;
    Some(Route { id: id.into(), port, signed: None })
}

fn now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// The route of a request, if it names one by header, by Host or by `/r/` path; with the path
/// left for the sandbox's server.
fn route_of(state: &AppState, req: &Request) -> Option<(Route, String)> {
    let path = req.uri().path();
    if let Some(rest) = path.strip_prefix("/r/") {
        let (spec, tail) = rest.split_once('/').map_or((rest, ""), |(s, t)| (s, t));
        return parse_route(spec).map(|r| (r, format!("/{tail}")));
    }
    if let Some(to) = req.headers().get(INGRESS_HEADER).and_then(|v| v.to_str().ok()) {
        return parse_route(to.trim()).map(|r| (r, path.to_owned()));
    }
    let domain = state.config.sandbox_domain.as_deref()?;
    let host = req.headers().get(axum::http::header::HOST).and_then(|h| h.to_str().ok())?;
    let host = host.rsplit_once(':').filter(|(_, p)| p.bytes().all(|b| b.is_ascii_digit())).map_or(host, |(h, _)| h);
    let label = host.strip_suffix(domain)?.strip_suffix('.')?;
    parse_route(label).map(|r| (r, path.to_owned()))
}

/// The outermost layer: rewrites a routed request to the path form and checks its signature
/// or ticket. Requests that name no route pass untouched.
pub async fn ingress(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let named = req.headers().contains_key(INGRESS_HEADER) || req.uri().path().starts_with("/r/");
    let Some((route, tail)) = route_of(&state, &req) else {
        if named {
            return ApiError::bad_request(
                "the route names no sandbox port: write it as <sandbox-id>-<port> (signed: <sandbox-id>-<port>-<expires>-<signature>)",
            )
            .into_response();
        }
        return next.run(req).await;
    };
    // The ticket, if any, is Paddock's: it is taken out of the query the sandbox sees.
    let mut ticket = None;
    let query: Vec<(String, String)> = form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
        .into_owned()
        .filter(|(k, v)| {
            if k == TICKET_PARAM {
                ticket = Some(v.clone());
                false
            } else {
                true
            }
        })
        .collect();
    if let Some((expires, sig)) = &route.signed {
        if *expires < now_s() {
            return ApiError::unauthorized("ROUTE_EXPIRED", "this signed route has expired: ask for a new endpoint")
                .into_response();
        }
        let epoch = match state.store.route_epoch(&route.id).await {
            Ok(e) => e,
            Err(e) => return ApiError::from(e).into_response(),
        };
        if !state.token_key.verify_route(&route.id, route.port, *expires, epoch, sig) {
            return ApiError::unauthorized(
                "INVALID_ROUTE_SIGNATURE",
                "this route's signature is not valid for this sandbox and port, or its sandbox's signed routes were revoked",
            )
            .into_response();
        }
        req.extensions_mut().insert(RouteGrant(route.id.clone()));
    } else if let Some(t) = ticket.clone() {
        if !take_ticket(&state, &t, &route) {
            return ApiError::unauthorized(
                "INVALID_TICKET",
                "this ticket is unknown, used, expired, or for another sandbox or port: get a new one with POST /v1/sandboxes/{id}/tickets",
            )
            .into_response();
        }
        req.extensions_mut().insert(RouteGrant(route.id.clone()));
    }
    let had_ticket = ticket.is_some();
    req.headers_mut().remove(INGRESS_HEADER);
    let mut target = format!("/v1/sandboxes/{}/proxy/{}{}", route.id, route.port, tail);
    // The query goes on as it came, unless a ticket had to be taken out of it.
    let raw_query = req.uri().query().unwrap_or("");
    let query = if had_ticket {
        form_urlencoded::Serializer::new(String::new()).extend_pairs(&query).finish()
    } else {
        raw_query.to_owned()
    };
    if !query.is_empty() {
        target.push('?');
        target.push_str(&query);
    }
    match target.parse::<Uri>() {
        Ok(uri) => *req.uri_mut() = uri,
        Err(_) => return ApiError::bad_request("the routed path is not a valid URI").into_response(),
    }
    next.run(req).await
}

/// A signed route for a sandbox's port valid until `expires` (Unix seconds), as an endpoint
/// without scheme: by Host when the server has a sandbox domain, else by `/r/` path on `host`.
pub async fn signed_endpoint(state: &AppState, host: &str, id: &str, port: u16, expires: u64) -> ApiResult<String> {
    let now = now_s();
    if expires <= now {
        return Err(ApiError::bad_request(format!(
            "expires {expires} is in the past: give a future Unix time in seconds"
        )));
    }
    if expires - now > MAX_SIGNED.as_secs() {
        return Err(ApiError::bad_request(format!(
            "expires is more than {} days away: signed routes last at most that long",
            MAX_SIGNED.as_secs() / 86400
        )));
    }
    if port == EGRESS_PORT {
        return Err(ApiError::bad_request(
            "the egress policy port cannot have a signed route: it changes what the sandbox may reach, so it takes the API key",
        ));
    }
    let epoch = state.store.route_epoch(id).await?;
    let sig = state.token_key.route_signature(id, port, expires, epoch);
    let label = format!("{id}-{port}-{}-{sig}", base36(expires));
    Ok(match &state.config.sandbox_domain {
        Some(domain) => format!("{label}.{domain}"),
        None => format!("{host}/r/{label}"),
    })
}

fn base36(mut n: u64) -> String {
    let digits = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(digits[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).expect("ascii")
}

fn take_ticket(state: &AppState, ticket: &str, route: &Route) -> bool {
    let mut t = state.tickets.0.lock().unwrap_or_else(|e| e.into_inner());
    match t.remove(ticket) {
        Some((id, port, until)) => id == route.id && port == route.port && until >= now_s(),
        None => false,
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TicketRequest {
    port: u16,
    ttl_seconds: Option<u64>,
}

/// `POST /v1/sandboxes/{id}/signatures/revoke`: every signed route and endpoint of the sandbox
/// made before stops working (its route epoch moves on), and its unused tickets are dropped.
/// Links made after are signed anew.
pub async fn revoke_signatures(State(state): State<AppState>, InSandbox(sid, _): InSandbox) -> ApiResult<Response> {
    let epoch = state.store.bump_route_epoch(sid.as_str()).await?;
    let dropped = {
        let mut t = state.tickets.0.lock().unwrap_or_else(|e| e.into_inner());
        let before = t.len();
        t.retain(|_, (owner, _, _)| owner != sid.as_str());
        before - t.len()
    };
    Ok(axum::Json(json!({"id": sid.as_str(), "signingEpoch": epoch, "ticketsDropped": dropped})).into_response())
}

/// `POST /v1/sandboxes/{id}/tickets {port, ttlSeconds?}`: a single-use credential for one
/// request to that port, e.g. a browser's WebSocket handshake.
pub async fn issue_ticket(
    State(state): State<AppState>,
    InSandbox(sid, _): InSandbox,
    headers: axum::http::HeaderMap,
    ApiJson(req): ApiJson<TicketRequest>,
) -> ApiResult<Response> {
    if req.port == 0 || req.port == EGRESS_PORT {
        return Err(ApiError::bad_request("a ticket opens a port from 1 to 65535 other than the egress policy port"));
    }
    let ttl = req.ttl_seconds.map(Duration::from_secs).unwrap_or(TICKET_TTL);
    if ttl.is_zero() || ttl > MAX_TICKET_TTL {
        return Err(ApiError::bad_request(format!("ttlSeconds must be from 1 to {}", MAX_TICKET_TTL.as_secs())));
    }
    let mut raw = [0u8; 24];
    rustix::rand::getrandom(&mut raw, rustix::rand::GetRandomFlags::empty())
        .map_err(|e| ApiError::internal(format!("getrandom: {e}")))?;
    let ticket = hex::encode(raw);
    let until = now_s() + ttl.as_secs();
    {
        let mut t = state.tickets.0.lock().unwrap_or_else(|e| e.into_inner());
        let now = now_s();
        t.retain(|_, (_, _, u)| *u >= now);
        if t.len() >= MAX_TICKETS {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "TOO_MANY_TICKETS",
                "too many unused tickets: use or let some expire first",
            ));
        }
        t.insert(ticket.clone(), (sid.to_string(), req.port, until));
    }
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .unwrap_or_else(|| state.config.listen.to_string());
    let endpoint = match &state.config.sandbox_domain {
        Some(domain) => format!("{sid}-{}.{domain}", req.port),
        None => format!("{host}/r/{sid}-{}", req.port),
    };
    let mut response = axum::Json(json!({
        "ticket": ticket,
        "expiresAt": crate::time_fmt::rfc3339((until * 1000).cast_signed()),
        "endpoint": endpoint,
        "query": format!("{TICKET_PARAM}={ticket}"),
    }))
    .into_response();
    response.headers_mut().insert(axum::http::header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_parse_plain_and_signed_and_refuse_the_rest() {
        assert_eq!(
            parse_route("sbx-0123456789ab-8080"),
            Some(Route { id: "sbx-0123456789ab".into(), port: 8080, signed: None })
        );
        assert_eq!(
            parse_route("sbx-0123456789ab-8080-t1x2y3-abcdef"),
            Some(Route {
                id: "sbx-0123456789ab".into(),
                port: 8080,
                signed: Some((u64::from_str_radix("t1x2y3", 36).unwrap(), "abcdef".into()))
            })
        );
        for bad in
            ["sbx-0123456789ab", "sbx-0123456789ab-0", "sbx-0123456789ab-70000", "", "-80", "sbx-0123456789ab-80-zz"]
        {
            assert_eq!(parse_route(bad), None, "{bad:?}");
        }
        assert_eq!(base36(0), "0");
        assert_eq!(u64::from_str_radix(&base36(4_102_444_800), 36).unwrap(), 4_102_444_800);
    }
}
