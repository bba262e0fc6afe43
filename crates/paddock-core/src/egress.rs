//! A sandbox's egress policy (OpenSandbox's `networkPolicy`): what it may reach besides its
//! own loopback, and how a name or an address is judged against it. No IO: the runtime that
//! enforces it resolves names and opens connections itself.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// Allow or deny, as a rule's action or a policy's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Allow,
    Deny,
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Action::Allow => "allow",
            Action::Deny => "deny",
        })
    }
}

/// One rule: `target` is a domain (`pypi.org`), a wildcard domain (`*.example.com`: any name
/// below it, not the name itself), an IP address or a CIDR. `ports` (OpenSandbox 1.2) scopes
/// a rule to TCP destination ports: on an IP or CIDR it holds for that network on those ports
/// only, and without a target for every address on them. A domain is judged by its name, which
/// has no port, so a domain with ports is refused, as OpenSandbox refuses it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressRule {
    pub action: Action,
    /// Empty when the rule names ports only (OpenSandbox's read-back writes `""`).
    #[serde(default, deserialize_with = "null_is_blank", skip_serializing_if = "String::is_empty")]
    pub target: String,
    /// Wider than `u16` so that 0 or 70000 get a message naming the range, not serde's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<u32>>,
}

impl EgressRule {
    /// A rule for a target on every port.
    pub fn new(action: Action, target: impl Into<String>) -> Self {
        Self { action, target: target.into(), ports: None }
    }

    /// Whether the rule holds for a connection to this port: a rule without ports holds for
    /// every port; one with ports never holds where the port is unknown (a DNS answer).
    fn covers_port(&self, port: Option<u16>) -> bool {
        match (&self.ports, port) {
            (None, _) => true,
            (Some(ports), Some(p)) => ports.contains(&u32::from(p)),
            (Some(_), None) => false,
        }
    }

    /// The target as a rule is written: `10.0.0.0/8`, `10.0.0.0/8 ports 22,80`, `ports 443`.
    pub fn describe(&self) -> String {
        let ports = self.ports.as_ref().map(|p| {
            let list: Vec<String> = p.iter().map(u32::to_string).collect();
            format!("ports {}", list.join(","))
        });
        match (self.target.trim(), ports) {
            (t, None) => t.to_string(),
            ("", Some(p)) => p,
            (t, Some(p)) => format!("{t} {p}"),
        }
    }

    /// The inverse of [`describe`](Self::describe), for the command line: `TARGET`,
    /// `TARGET ports 22,443` or `ports 22`. The rule is checked when its policy is.
    pub fn from_words(action: Action, words: &str) -> Result<Self, String> {
        let words = words.trim();
        let (target, ports) = match words.strip_prefix("ports ") {
            Some(p) => ("", Some(p)),
            None => match words.split_once(" ports ") {
                Some((t, p)) => (t.trim(), Some(p)),
                None => (words, None),
            },
        };
        let ports = ports
            .map(|p| {
                p.split(',')
                    .map(|n| {
                        n.trim().parse::<u32>().map_err(|_| {
                            format!("{n:?} in {words:?} is not a port: write TARGET ports 22,443 or ports 22")
                        })
                    })
                    .collect::<Result<Vec<u32>, String>>()
            })
            .transpose()?;
        Ok(Self { action, target: target.to_string(), ports })
    }

    fn check(&self) -> Result<(), String> {
        let target = self.target.trim();
        let Some(ports) = &self.ports else {
            return Target::parse(target).map(drop);
        };
        if ports.is_empty() {
            return Err("its ports are empty: give at least one TCP port, or leave ports out".into());
        }
        if ports.len() > MAX_RULE_PORTS {
            return Err(format!("{} ports are too many for one rule: give at most {MAX_RULE_PORTS}", ports.len()));
        }
        let mut seen = std::collections::HashSet::new();
        for &p in ports {
            if !(1..=65535).contains(&p) {
                return Err(format!("port {p} is out of range: give TCP ports from 1 to 65535"));
            }
            if !seen.insert(p) {
                return Err(format!("port {p} is given twice"));
            }
        }
        if target.is_empty() {
            return Ok(());
        }
        match Target::parse(target)? {
            Target::Net(_) => Ok(()),
            _ => Err(format!(
                "{target:?} is a domain, and a domain rule cannot have ports (it is judged by name, which has no port): give an IP or CIDR target, or leave the target out to scope every address"
            )),
        }
    }

    /// Whether the rule's network holds `ip`: a rule of ports only holds every address, a
    /// domain rule none (it is judged by name).
    fn covers_ip(&self, ip: &IpAddr) -> bool {
        match self.target.trim() {
            "" => self.ports.is_some(),
            t => matches!(Target::parse(t), Ok(Target::Net(n)) if n.contains(ip)),
        }
    }
}

fn null_is_blank<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(d)?.unwrap_or_default())
}

/// A policy in OpenSandbox's shape. Domain rules apply in order, the first that matches a
/// name decides; IP and CIDR rules are unordered, denials before allowances (as OpenSandbox's
/// egress sidecar does); what no rule matches gets `default_action`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EgressPolicy {
    #[serde(default = "deny", deserialize_with = "null_is_deny")]
    pub default_action: Action,
    #[serde(default, deserialize_with = "null_is_empty")]
    pub egress: Vec<EgressRule>,
}

fn deny() -> Action {
    Action::Deny
}

// Generated clients send `null` for unset fields; it means what an absent field means.
fn null_is_deny<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Action, D::Error> {
    Ok(Option::<Action>::deserialize(d)?.unwrap_or(Action::Deny))
}

fn null_is_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<EgressRule>, D::Error> {
    Ok(Option::<Vec<EgressRule>>::deserialize(d)?.unwrap_or_default())
}

/// The most rules one policy may hold (OpenSandbox's sidecar has the same cap).
pub const MAX_RULES: usize = 4096;

/// The most ports one rule may name (OpenSandbox's cap).
pub const MAX_RULE_PORTS: usize = 256;

/// What a rule's target names, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A whole name, lowercase, without a trailing dot.
    Domain(String),
    /// `*.suffix`: names strictly below `suffix`.
    Below(String),
    Net(ipnet::IpNet),
}

impl Target {
    pub fn parse(s: &str) -> Result<Target, String> {
        let t = s.trim();
        if t.is_empty() {
            return Err("a rule's target is empty: give a domain, *.domain, an IP or a CIDR".into());
        }
        if let Ok(ip) = t.parse::<IpAddr>() {
            return Ok(Target::Net(ipnet::IpNet::from(canonical(ip))));
        }
        if t.contains('/') {
            return t
                .parse::<ipnet::IpNet>()
                .map(|n| Target::Net(n.trunc()))
                .map_err(|_| format!("{t:?} is not a valid CIDR: write it like 10.0.0.0/8 or fd00::/8"));
        }
        let lower = t.trim_end_matches('.').to_ascii_lowercase();
        let (wild, name) = match lower.strip_prefix("*.") {
            Some(rest) => (true, rest.to_string()),
            None => (false, lower),
        };
        if !valid_domain(&name) {
            return Err(format!(
                "{t:?} is not a valid target: give a domain (letters, digits, - and _ in dot-separated labels), *.domain, an IP or a CIDR"
            ));
        }
        Ok(if wild { Target::Below(name) } else { Target::Domain(name) })
    }

    fn matches_name(&self, name: &str) -> bool {
        match self {
            Target::Domain(d) => d == name,
            Target::Below(d) => {
                name.len() > d.len() + 1 && name.ends_with(d.as_str()) && {
                    name.as_bytes()[name.len() - d.len() - 1] == b'.'
                }
            }
            Target::Net(_) => false,
        }
    }
}

fn valid_domain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is, so one CIDR rule covers both.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

/// Lowercase and without a trailing dot: the form names are compared in.
pub fn normalize_name(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// What decided a verdict, for the denial's message and the deny log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Because {
    /// The rule at this index of `egress`.
    Rule(usize),
    Default,
}

/// A verdict and what gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub action: Action,
    pub because: Because,
}

impl Decision {
    pub fn allowed(&self) -> bool {
        self.action == Action::Allow
    }
}

impl EgressPolicy {
    /// Everything allowed (subject to the operator's always-denied addresses).
    pub fn allow_all() -> Self {
        Self { default_action: Action::Allow, egress: Vec::new() }
    }

    /// Nothing allowed.
    pub fn deny_all() -> Self {
        Self { default_action: Action::Deny, egress: Vec::new() }
    }

    /// Checks every target and the rule count; the message names the rule at fault.
    pub fn validate(&self) -> Result<(), String> {
        if self.egress.len() > MAX_RULES {
            return Err(format!("{} egress rules are too many: give at most {MAX_RULES}", self.egress.len()));
        }
        for (i, rule) in self.egress.iter().enumerate() {
            rule.check().map_err(|e| format!("egress rule {i}: {e}"))?;
        }
        Ok(())
    }

    /// OpenSandbox's mode names: `deny_all`, `allow_all` or `enforcing` (rules apply).
    pub fn mode(&self) -> &'static str {
        match (self.default_action, self.egress.is_empty()) {
            (Action::Deny, true) => "deny_all",
            (Action::Allow, true) => "allow_all",
            _ => "enforcing",
        }
    }

    /// Whether the sandbox may reach anything at all.
    pub fn denies_everything(&self) -> bool {
        self.default_action == Action::Deny && self.egress.iter().all(|r| r.action == Action::Deny)
    }

    fn targets(&self) -> impl Iterator<Item = (usize, &EgressRule, Target)> {
        // A policy is validated before it is stored, so an unparsable target (never expected)
        // is skipped rather than matched; so is a rule of ports only, which names no target.
        self.egress.iter().enumerate().filter_map(|(i, r)| Target::parse(&r.target).ok().map(|t| (i, r, t)))
    }

    /// Whether any rule is scoped to ports.
    pub fn has_port_rules(&self) -> bool {
        self.egress.iter().any(|r| r.ports.is_some())
    }

    /// The verdict for a name: the first domain rule that matches it, else the default.
    pub fn decide_name(&self, name: &str) -> Decision {
        let name = normalize_name(name);
        self.targets()
            .find(|(_, _, t)| t.matches_name(&name))
            .map(|(i, r, _)| Decision { action: r.action, because: Because::Rule(i) })
            .unwrap_or(Decision { action: self.default_action, because: Because::Default })
    }

    /// Whether every name is allowed (allow by default, no domain rule denies): then a
    /// connection's name cannot change its verdict, only its address can.
    pub fn allows_every_name(&self) -> bool {
        self.default_action == Action::Allow
            && !self.targets().any(|(_, r, t)| r.action == Action::Deny && !matches!(t, Target::Net(_)))
    }

    /// The verdict of the IP and CIDR rules (and rules of ports only) for an address and, for
    /// a TCP connection, its port (denials first), or `None` when none of them matches. Where
    /// the port is unknown (a DNS answer), rules scoped to ports do not apply.
    pub fn decide_ip_rules(&self, ip: IpAddr, port: Option<u16>) -> Option<Decision> {
        let ip = canonical(ip);
        let hit = |action: Action| {
            self.egress
                .iter()
                .enumerate()
                .filter(|(_, r)| r.action == action && r.covers_port(port))
                .find(|(_, r)| r.covers_ip(&ip))
                .map(|(i, _)| Decision { action, because: Because::Rule(i) })
        };
        hit(Action::Deny).or_else(|| hit(Action::Allow))
    }

    /// The verdict for an address reached without a name: its IP rules, else the default.
    pub fn decide_ip(&self, ip: IpAddr, port: Option<u16>) -> Decision {
        self.decide_ip_rules(ip, port).unwrap_or(Decision { action: self.default_action, because: Because::Default })
    }

    /// Says in words what gave a decision, e.g. `egress rule 2 (deny *.example.com)`.
    pub fn explain(&self, decision: Decision) -> String {
        match decision.because {
            Because::Rule(i) => match self.egress.get(i) {
                Some(r) => format!("egress rule {i} ({} {})", r.action, r.describe()),
                None => format!("egress rule {i}"),
            },
            Because::Default => format!("the policy's defaultAction ({})", self.default_action),
        }
    }

    /// OpenSandbox's PATCH: the given rules go before the existing ones, and for each target
    /// (case-insensitive) and set of ports only its first rule is kept.
    pub fn patched(&self, rules: &[EgressRule]) -> EgressPolicy {
        let mut seen = std::collections::HashSet::new();
        let egress = rules
            .iter()
            .chain(self.egress.iter())
            .filter(|r| {
                let mut ports = r.ports.clone();
                if let Some(p) = ports.as_mut() {
                    p.sort_unstable();
                }
                seen.insert((r.target.trim().to_ascii_lowercase(), ports))
            })
            .cloned()
            .collect();
        EgressPolicy { default_action: self.default_action, egress }
    }

    /// OpenSandbox's DELETE: drops the rules for these targets (case-insensitive); returns the
    /// new policy and how many rules went.
    pub fn without(&self, targets: &[String]) -> (EgressPolicy, usize) {
        let gone: std::collections::HashSet<String> = targets.iter().map(|t| t.trim().to_ascii_lowercase()).collect();
        let egress: Vec<EgressRule> =
            self.egress.iter().filter(|r| !gone.contains(&r.target.trim().to_ascii_lowercase())).cloned().collect();
        let removed = self.egress.len() - egress.len();
        (EgressPolicy { default_action: self.default_action, egress }, removed)
    }
}

/// What an egress enforcer counted for one sandbox since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressCounters {
    pub connections_allowed: u64,
    pub connections_denied: u64,
    pub dns_allowed: u64,
    pub dns_denied: u64,
    /// Requests a credential binding was applied to.
    #[serde(default)]
    pub credentials_injected: u64,
}

/// One denied connection or DNS query.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Denial {
    pub at_unix_ms: u64,
    /// `tcp` or `dns`.
    pub kind: String,
    /// The name and/or address:port the sandbox tried.
    pub target: String,
    /// Why, in words (the rule or the operator's list that denied it).
    pub reason: String,
}

/// What enforces a sandbox's egress policy (shown as OpenSandbox's `enforcementMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Enforcement {
    /// A network namespace with loopback only: no egress at all, no DNS.
    #[serde(rename = "network-namespace")]
    NetworkNamespace,
    /// Paddock's enforcer answers DNS and dials every connection itself, by the rules.
    #[serde(rename = "dns+proxy")]
    DnsProxy,
    /// A Kubernetes NetworkPolicy allows or drops connections by address.
    #[serde(rename = "networkpolicy")]
    NetworkPolicy,
    /// The policy is kept but nothing enforces it (a test runtime with no network).
    #[serde(rename = "none")]
    NotEnforced,
}

impl Enforcement {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NetworkNamespace => "network-namespace",
            Self::DnsProxy => "dns+proxy",
            Self::NetworkPolicy => "networkpolicy",
            Self::NotEnforced => "none",
        }
    }
}

impl std::fmt::Display for Enforcement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A sandbox's egress as its runtime enforces it now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressStatus {
    pub policy: EgressPolicy,
    /// How the runtime enforces it.
    pub enforcement: Enforcement,
    pub counters: EgressCounters,
    /// The newest denials, oldest first (bounded by the runtime).
    pub denials: Vec<Denial>,
}

impl EgressStatus {
    /// A policy enforced by something that counts nothing and logs no denials (a network
    /// namespace with loopback only, a NetworkPolicy).
    pub fn uncounted(policy: EgressPolicy, enforcement: Enforcement) -> Self {
        Self { policy, enforcement, counters: EgressCounters::default(), denials: Vec::new() }
    }
}

/// An egress policy that passed [`EgressPolicy::validate`]: what `Runtime::set_egress` takes,
/// so the server (or the CLI) checks a new policy once and no runtime again. Made only by
/// [`EgressPolicy::validated`]; a sandbox's first policy is checked with its spec
/// (`ValidatedSpec`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidatedPolicy(EgressPolicy);

impl ValidatedPolicy {
    pub fn into_inner(self) -> EgressPolicy {
        self.0
    }
}

impl std::ops::Deref for ValidatedPolicy {
    type Target = EgressPolicy;

    fn deref(&self) -> &EgressPolicy {
        &self.0
    }
}

impl EgressPolicy {
    /// This policy, checked once (see [`ValidatedPolicy`]).
    pub fn validated(self) -> Result<ValidatedPolicy, String> {
        self.validate()?;
        Ok(ValidatedPolicy(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(action: Action, target: &str) -> EgressRule {
        EgressRule::new(action, target)
    }

    fn ported(action: Action, target: &str, ports: &[u32]) -> EgressRule {
        EgressRule { action, target: target.into(), ports: Some(ports.to_vec()) }
    }

    #[test]
    fn every_name_is_allowed_only_by_default_allow_without_a_domain_denial() {
        let p = |default, rules: &[(Action, &str)]| EgressPolicy {
            default_action: default,
            egress: rules.iter().map(|(a, t)| EgressRule::new(*a, *t)).collect(),
        };
        assert!(EgressPolicy::allow_all().allows_every_name());
        assert!(p(Action::Allow, &[(Action::Deny, "192.0.2.0/24"), (Action::Allow, "a.test")]).allows_every_name());
        assert!(!p(Action::Allow, &[(Action::Deny, "*.evil.test")]).allows_every_name());
        assert!(!p(Action::Allow, &[(Action::Deny, "evil.test")]).allows_every_name());
        assert!(!EgressPolicy::deny_all().allows_every_name());
    }

    #[test]
    fn targets_parse_into_domains_wildcards_and_networks() {
        assert_eq!(Target::parse("PyPI.org.").unwrap(), Target::Domain("pypi.org".into()));
        assert_eq!(Target::parse("*.example.com").unwrap(), Target::Below("example.com".into()));
        assert_eq!(Target::parse("10.1.2.3").unwrap(), Target::Net("10.1.2.3/32".parse().unwrap()));
        assert_eq!(Target::parse("10.1.2.3/8").unwrap(), Target::Net("10.0.0.0/8".parse().unwrap()));
        assert_eq!(Target::parse("::ffff:10.0.0.1").unwrap(), Target::Net("10.0.0.1/32".parse().unwrap()));
        for bad in ["", "a..b", "exa mple.com", "*.", "10.0.0.0/33", "*.*.x", "a/b"] {
            assert!(Target::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn domain_rules_are_first_match_and_wildcards_exclude_the_apex() {
        let p = EgressPolicy {
            default_action: Action::Deny,
            egress: vec![rule(Action::Deny, "bad.example.com"), rule(Action::Allow, "*.example.com")],
        };
        assert!(p.decide_name("a.b.example.com").allowed());
        assert!(p.decide_name("WWW.example.com.").allowed());
        assert!(!p.decide_name("bad.example.com").allowed());
        assert_eq!(p.decide_name("bad.example.com").because, Because::Rule(0));
        assert!(!p.decide_name("example.com").allowed(), "the apex is not below itself");
        assert!(!p.decide_name("notexample.com").allowed());
        assert_eq!(p.decide_name("other.org").because, Because::Default);
        assert_eq!(p.explain(p.decide_name("bad.example.com")), "egress rule 0 (deny bad.example.com)");
    }

    #[test]
    fn ip_rules_deny_before_allow_and_cover_mapped_addresses() {
        let p = EgressPolicy {
            default_action: Action::Deny,
            egress: vec![rule(Action::Allow, "10.0.0.0/8"), rule(Action::Deny, "10.9.0.0/16")],
        };
        assert!(p.decide_ip("10.1.1.1".parse().unwrap(), None).allowed());
        assert!(!p.decide_ip("10.9.1.1".parse().unwrap(), Some(80)).allowed());
        assert!(p.decide_ip("::ffff:10.1.1.1".parse().unwrap(), None).allowed());
        assert!(!p.decide_ip("192.0.2.1".parse().unwrap(), None).allowed());
        assert_eq!(p.decide_ip_rules("192.0.2.1".parse().unwrap(), None), None);
    }

    #[test]
    fn port_rules_hold_on_their_ports_only_and_deny_before_allow() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let p = EgressPolicy {
            default_action: Action::Deny,
            egress: vec![
                ported(Action::Allow, "192.0.2.0/24", &[80, 443]),
                ported(Action::Deny, "192.0.2.9", &[443]),
                ported(Action::Allow, "", &[22]),
            ],
        };
        assert!(p.decide_ip(ip("192.0.2.1"), Some(443)).allowed());
        assert!(!p.decide_ip(ip("192.0.2.1"), Some(8080)).allowed(), "a port the rule does not name");
        assert!(!p.decide_ip(ip("192.0.2.9"), Some(443)).allowed(), "the port-scoped denial wins");
        assert!(p.decide_ip(ip("192.0.2.9"), Some(80)).allowed(), "and holds on its port only");
        assert!(p.decide_ip(ip("198.51.100.4"), Some(22)).allowed(), "a rule of ports only holds for every address");
        assert!(p.decide_ip(ip("2001:db8::1"), Some(22)).allowed());
        assert!(!p.decide_ip(ip("198.51.100.4"), Some(23)).allowed());
        assert_eq!(p.decide_ip_rules(ip("192.0.2.1"), None), None, "no port, no port-scoped rule");
        assert_eq!(p.explain(p.decide_ip(ip("192.0.2.9"), Some(443))), "egress rule 1 (deny 192.0.2.9 ports 443)");
        assert_eq!(p.explain(p.decide_ip(ip("192.0.2.7"), Some(22))), "egress rule 2 (allow ports 22)");
        // A blanket port denial holds for names' addresses too, whatever allowed them.
        let q = EgressPolicy {
            default_action: Action::Allow,
            egress: vec![ported(Action::Deny, "", &[25]), rule(Action::Allow, "mail.test")],
        };
        assert!(!q.decide_ip(ip("203.0.113.5"), Some(25)).allowed());
        assert!(q.decide_ip(ip("203.0.113.5"), Some(587)).allowed());
        assert!(q.allows_every_name(), "a rule of ports only is not a domain denial");
        assert!(q.decide_name("mail.test").allowed());
    }

    #[test]
    fn port_rules_are_checked_as_opensandbox_checks_them() {
        let check = |r: EgressRule| EgressPolicy { default_action: Action::Deny, egress: vec![r] }.validate();
        assert!(check(ported(Action::Allow, "10.0.0.0/8", &[22])).is_ok());
        assert!(check(ported(Action::Allow, "", &[1, 65535])).is_ok());
        assert!(check(ported(Action::Allow, "pypi.org", &[443])).unwrap_err().contains("domain"));
        assert!(check(ported(Action::Allow, "*.pypi.org", &[443])).unwrap_err().contains("domain"));
        assert!(check(ported(Action::Allow, "", &[])).unwrap_err().contains("empty"));
        assert!(check(ported(Action::Allow, "", &[0])).unwrap_err().contains("out of range"));
        assert!(check(ported(Action::Allow, "", &[65536])).unwrap_err().contains("out of range"));
        assert!(check(ported(Action::Allow, "", &[80, 80])).unwrap_err().contains("twice"));
        let many: Vec<u32> = (1..=257).collect();
        assert!(check(ported(Action::Allow, "", &many)).unwrap_err().contains("at most 256"));
        assert!(check(rule(Action::Allow, "")).unwrap_err().contains("empty"), "no target and no ports");
        // OpenSandbox's JSON: target omitted, null or blank with ports.
        for json in [
            r#"{"action":"allow","ports":[22]}"#,
            r#"{"action":"allow","target":null,"ports":[22]}"#,
            r#"{"action":"allow","target":"","ports":[22]}"#,
        ] {
            let r: EgressRule = serde_json::from_str(json).unwrap();
            assert_eq!(r, ported(Action::Allow, "", &[22]), "{json}");
            assert_eq!(serde_json::to_value(&r).unwrap(), serde_json::json!({"action": "allow", "ports": [22]}));
        }
        for words in ["10.0.0.0/8 ports 22,443", "ports 22", "a.test", "2001:db8::/32 ports 80"] {
            assert_eq!(EgressRule::from_words(Action::Allow, words).unwrap().describe(), words);
        }
        assert!(EgressRule::from_words(Action::Allow, "ports x").unwrap_err().contains("not a port"));
        let plain = serde_json::to_value(rule(Action::Deny, "a.test")).unwrap();
        assert_eq!(
            plain,
            serde_json::json!({"action": "deny", "target": "a.test"}),
            "no ports key when there are none"
        );
        // PATCH keeps one rule per target and set of ports.
        let p = EgressPolicy { default_action: Action::Deny, egress: vec![ported(Action::Allow, "", &[22, 80])] };
        let q = p.patched(&[ported(Action::Deny, "", &[80, 22]), ported(Action::Allow, "", &[443])]);
        assert_eq!(q.egress, vec![ported(Action::Deny, "", &[80, 22]), ported(Action::Allow, "", &[443])]);
    }

    #[test]
    fn patch_puts_new_rules_first_and_keeps_one_per_target() {
        let p = EgressPolicy { default_action: Action::Deny, egress: vec![rule(Action::Allow, "a.test")] };
        let q = p.patched(&[rule(Action::Deny, "A.test"), rule(Action::Allow, "b.test")]);
        assert_eq!(q.egress, vec![rule(Action::Deny, "A.test"), rule(Action::Allow, "b.test")]);
        let (r, n) = q.without(&["a.TEST".into(), "nothing".into()]);
        assert_eq!((r.egress, n), (vec![rule(Action::Allow, "b.test")], 1));
    }

    #[test]
    fn policies_read_opensandbox_json_and_check_their_size() {
        let p: EgressPolicy = serde_json::from_str(r#"{"egress":[{"action":"allow","target":"pypi.org"}]}"#).unwrap();
        let nulls: EgressPolicy = serde_json::from_str(r#"{"defaultAction":null,"egress":null}"#).unwrap();
        assert_eq!(nulls, EgressPolicy::deny_all());
        assert_eq!(p.default_action, Action::Deny, "a missing defaultAction denies");
        assert_eq!(p.mode(), "enforcing");
        assert_eq!(EgressPolicy::allow_all().mode(), "allow_all");
        assert!(EgressPolicy::deny_all().denies_everything());
        let many =
            EgressPolicy { default_action: Action::Deny, egress: vec![rule(Action::Allow, "a.b"); MAX_RULES + 1] };
        assert!(many.validate().unwrap_err().contains("too many"));
        let bad = EgressPolicy { default_action: Action::Deny, egress: vec![rule(Action::Allow, "x y")] };
        assert!(bad.validate().unwrap_err().starts_with("egress rule 0"));
    }

    #[test]
    fn a_validated_policy_is_made_only_by_validating() {
        let bad = EgressPolicy { default_action: Action::Deny, egress: vec![EgressRule::new(Action::Allow, "")] };
        assert!(bad.validated().unwrap_err().starts_with("egress rule 0"));
        let fine =
            EgressPolicy { default_action: Action::Deny, egress: vec![EgressRule::new(Action::Allow, "a.test")] };
        assert_eq!(fine.clone().validated().unwrap().into_inner(), fine);
    }
}
