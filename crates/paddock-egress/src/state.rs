//! One sandbox's enforcer: its policy (swapped whole on a change), what it counted, its newest
//! denials and the addresses it resolved for names.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use paddock_core::egress::{Denial, EgressCounters, EgressPolicy, EgressStatus, canonical};
use paddock_core::vault::Vault;

use crate::guard::Guard;
use paddock_core::units::unix_ms as now_ms;

/// Denials kept per sandbox for the operator (`GET …/egress`).
pub const DENIAL_LOG: usize = 256;
/// Addresses remembered per sandbox; beyond it the oldest answers are forgotten.
const RESOLVED_CAP: usize = 16_384;
/// How long a resolved address stays bound to its name at least and at most, whatever the
/// answer's TTL: long enough for a client that caches a little, short enough to follow moves.
const MIN_BIND: Duration = Duration::from_secs(60);
const MAX_BIND: Duration = Duration::from_secs(3600);

/// What an enforcer needs besides its policy.
#[derive(Debug, Clone, Default)]
pub struct Config {
    pub guard: Guard,
    /// DNS servers allowed names are resolved with (the host's, from its resolv.conf).
    pub upstream: Vec<SocketAddr>,
    /// Names the operator resolves for every sandbox (`--egress-host NAME=IP`), before DNS.
    pub hosts: HashMap<String, Vec<IpAddr>>,
    /// The sandbox's CA and upstream trust, when its vault may bind `https` hosts.
    pub interception: Option<Arc<crate::intercept::Interception>>,
    /// The operator's proxy every allowed connection is dialed through (`--egress-proxy`).
    pub forward: Option<crate::forward::ForwardProxy>,
}

pub struct Enforcer {
    policy: RwLock<Arc<EgressPolicy>>,
    pub(crate) config: Config,
    connections_allowed: AtomicU64,
    connections_denied: AtomicU64,
    dns_allowed: AtomicU64,
    dns_denied: AtomicU64,
    denials: Mutex<VecDeque<Denial>>,
    resolved: Mutex<Resolved>,
    vault: RwLock<Arc<Vault>>,
    injected: AtomicU64,
}

#[derive(Default)]
struct Resolved {
    by_ip: HashMap<IpAddr, (Vec<String>, Instant)>,
    by_name: HashMap<String, (Vec<IpAddr>, Instant)>,
}

/// Which counter an event goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Tcp,
    Dns,
}

impl Enforcer {
    pub fn new(policy: EgressPolicy, config: Config) -> Arc<Self> {
        Arc::new(Self {
            policy: RwLock::new(Arc::new(policy)),
            config,
            connections_allowed: AtomicU64::new(0),
            connections_denied: AtomicU64::new(0),
            dns_allowed: AtomicU64::new(0),
            dns_denied: AtomicU64::new(0),
            denials: Mutex::new(VecDeque::new()),
            resolved: Mutex::new(Resolved::default()),
            vault: RwLock::new(Arc::new(Vault::default())),
            injected: AtomicU64::new(0),
        })
    }

    /// The policy now; a connection keeps the one it was judged by.
    pub fn policy(&self) -> Arc<EgressPolicy> {
        self.policy.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the policy: the next connection and query follow the new one.
    pub fn set_policy(&self, policy: EgressPolicy) {
        *self.policy.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(policy);
    }

    /// Whether the sandbox may dial `ip` at all, whatever name led there: the operator's guard
    /// (checked live for the host's own addresses), then the policy's IP and CIDR denials, which
    /// hold for an address reached by a name, a false `Host` or an SNI as for a raw one. `port`
    /// is the connection's (rules scoped to ports hold on it), `None` for a DNS answer.
    pub(crate) fn reachable(&self, ip: IpAddr, port: Option<u16>) -> Result<(), String> {
        self.config.guard.check(ip)?;
        let policy = self.policy();
        match policy.decide_ip_rules(ip, port) {
            Some(d) if !d.allowed() => {
                Err(format!("{ip} is denied by the sandbox's egress policy: {}", policy.explain(d)))
            }
            _ => Ok(()),
        }
    }

    /// The credential vault now (empty when there is none); a request keeps the one it was
    /// judged by.
    pub fn vault(&self) -> Arc<Vault> {
        self.vault.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the vault: the next request follows it. `None` empties it.
    pub fn set_vault(&self, vault: Option<Vault>) {
        *self.vault.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(vault.unwrap_or_default());
    }

    pub(crate) fn injected(&self) {
        self.injected.fetch_add(1, Ordering::Relaxed);
    }

    pub fn status(&self) -> EgressStatus {
        EgressStatus {
            policy: (*self.policy()).clone(),
            enforcement: paddock_core::egress::Enforcement::DnsProxy,
            counters: self.counters(),
            denials: self.denials.lock().unwrap_or_else(|e| e.into_inner()).iter().cloned().collect(),
        }
    }

    pub fn counters(&self) -> EgressCounters {
        EgressCounters {
            connections_allowed: self.connections_allowed.load(Ordering::Relaxed),
            connections_denied: self.connections_denied.load(Ordering::Relaxed),
            dns_allowed: self.dns_allowed.load(Ordering::Relaxed),
            dns_denied: self.dns_denied.load(Ordering::Relaxed),
            credentials_injected: self.injected.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn allowed(&self, kind: Kind) {
        match kind {
            Kind::Tcp => &self.connections_allowed,
            Kind::Dns => &self.dns_allowed,
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a denial and logs it (bounded; repeats of the newest entry are not logged twice
    /// in a row, so a retry loop does not push everything else out).
    pub(crate) fn denied(&self, kind: Kind, target: String, reason: String) {
        match kind {
            Kind::Tcp => &self.connections_denied,
            Kind::Dns => &self.dns_denied,
        }
        .fetch_add(1, Ordering::Relaxed);
        tracing::info!(kind = ?kind, %target, %reason, "egress denied");
        let kind = match kind {
            Kind::Tcp => "tcp",
            Kind::Dns => "dns",
        };
        let mut log = self.denials.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(last) = log.back_mut()
            && last.kind == kind
            && last.target == target
            && last.reason == reason
        {
            last.at_unix_ms = now_ms();
            return;
        }
        if log.len() == DENIAL_LOG {
            log.pop_front();
        }
        log.push_back(Denial { at_unix_ms: now_ms(), kind: kind.into(), target, reason });
    }

    /// Remembers that `name` resolved to `ips` (for `ttl` seconds, within bounds).
    pub(crate) fn bind(&self, name: &str, ips: &[IpAddr], ttl: u32) {
        if ips.is_empty() {
            return;
        }
        let until = Instant::now() + Duration::from_secs(ttl.into()).clamp(MIN_BIND, MAX_BIND);
        let mut r = self.resolved.lock().unwrap_or_else(|e| e.into_inner());
        if r.by_ip.len() >= RESOLVED_CAP {
            let now = Instant::now();
            r.by_ip.retain(|_, (_, t)| *t > now);
            r.by_name.retain(|_, (_, t)| *t > now);
            if r.by_ip.len() >= RESOLVED_CAP {
                r.by_ip.clear();
                r.by_name.clear();
            }
        }
        for ip in ips {
            let entry = r.by_ip.entry(canonical(*ip)).or_insert_with(|| (Vec::new(), until));
            entry.1 = entry.1.max(until);
            if !entry.0.iter().any(|n| n == name) && entry.0.len() < 16 {
                entry.0.push(name.to_string());
            }
        }
        r.by_name.insert(name.to_string(), (ips.iter().map(|ip| canonical(*ip)).collect(), until));
    }

    /// The names Paddock resolved to this address that have not expired.
    pub(crate) fn names_of(&self, ip: IpAddr) -> Vec<String> {
        let r = self.resolved.lock().unwrap_or_else(|e| e.into_inner());
        match r.by_ip.get(&canonical(ip)) {
            Some((names, until)) if *until > Instant::now() => names.clone(),
            _ => Vec::new(),
        }
    }

    /// The addresses a recent answer gave for this name.
    pub(crate) fn cached(&self, name: &str) -> Option<Vec<IpAddr>> {
        let r = self.resolved.lock().unwrap_or_else(|e| e.into_inner());
        match r.by_name.get(name) {
            Some((ips, until)) if *until > Instant::now() => Some(ips.clone()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_denial_log_is_bounded_and_folds_repeats() {
        let e = Enforcer::new(EgressPolicy::deny_all(), Config::default());
        for i in 0..(DENIAL_LOG + 10) {
            e.denied(Kind::Tcp, format!("t{i}"), "r".into());
            e.denied(Kind::Tcp, format!("t{i}"), "r".into());
        }
        let s = e.status();
        assert_eq!(s.denials.len(), DENIAL_LOG);
        assert_eq!(s.denials.last().unwrap().target, format!("t{}", DENIAL_LOG + 9));
        assert_eq!(s.counters.connections_denied, 2 * (DENIAL_LOG as u64 + 10));
    }

    #[test]
    fn resolved_addresses_map_back_to_their_names() {
        let e = Enforcer::new(EgressPolicy::deny_all(), Config::default());
        let ip: IpAddr = "192.0.2.5".parse().unwrap();
        e.bind("a.test", &[ip], 5);
        e.bind("b.test", &[ip], 5);
        assert_eq!(e.names_of(ip), vec!["a.test".to_string(), "b.test".to_string()]);
        assert_eq!(e.cached("a.test"), Some(vec![ip]));
        assert!(e.names_of("192.0.2.6".parse().unwrap()).is_empty());
    }
}
