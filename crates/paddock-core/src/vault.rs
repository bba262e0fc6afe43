//! A sandbox's credential vault: secrets the egress enforcer adds to a sandbox's requests on
//! their way out, so the sandbox never holds them. The wire format is OpenSandbox's
//! (`specs/egress-api.yaml`: credentials, bindings, revisions), so its SDK's
//! `sandbox.credential_vault` works unchanged.
//!
//! A [`Vault`] holds the values (it crosses only the server, the runtime and the enforcer,
//! never the sandbox); what the API answers is its [`Vault::state`], which holds none.

use serde::{Deserialize, Serialize};

use crate::egress::EgressPolicy;

/// Most credentials and bindings one vault holds.
pub const MAX_ENTRIES: usize = 256;
/// Longest credential value, bytes (a JWT or a PEM-sized token fits).
pub const MAX_VALUE: usize = 16 << 10;
const MAX_NAME: usize = 128;

/// Headers a binding may not set: they frame the request, route it or belong to a proxy.
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "proxy-authorization",
    "proxy-authenticate",
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
];

/// A secret value: never printed, wiped from memory when dropped.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(v: impl Into<String>) -> Self {
        Self(v.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.0);
    }
}

/// Where a credential's value comes from (OpenSandbox knows `inline` only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Source {
    #[serde(rename = "type", default = "inline")]
    pub kind: String,
    pub value: Secret,
}

fn inline() -> String {
    "inline".into()
}

/// A named secret, as a create or a change sends it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Credential {
    pub name: String,
    pub source: Source,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scheme {
    Http,
    Https,
}

impl Scheme {
    pub fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }
}

/// Which requests a binding applies to. Empty lists take their defaults in [`Match::normalized`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Match {
    pub hosts: Vec<String>,
    #[serde(default)]
    pub schemes: Vec<Scheme>,
    /// The ports requests go to; empty: each scheme's own (80, 443). Paddock sees every port,
    /// so any may be named (OpenSandbox only takes 80 and 443).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
    #[serde(default)]
    pub methods: Vec<String>,
    #[serde(default)]
    pub paths: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Place {
    Path,
    Query,
    Header,
    Body,
}

/// A placeholder the sandbox sends, replaced with a credential's value on the way out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Substitution {
    pub credential: String,
    pub placeholder: String,
    #[serde(rename = "in")]
    pub places: Vec<Place>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderRef {
    pub name: String,
    pub credential: String,
}

/// What a binding adds to a matching request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase", deny_unknown_fields)]
pub enum Auth {
    Bearer {
        credential: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        substitutions: Vec<Substitution>,
    },
    /// The value is already `base64(user:password)`, as OpenSandbox stores it.
    Basic {
        credential: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        substitutions: Vec<Substitution>,
    },
    ApiKey {
        name: String,
        credential: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        substitutions: Vec<Substitution>,
    },
    CustomHeaders {
        headers: Vec<HeaderRef>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        substitutions: Vec<Substitution>,
    },
    Passthrough {
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        substitutions: Vec<Substitution>,
    },
}

impl Auth {
    pub fn type_name(&self) -> &'static str {
        match self {
            Auth::Bearer { .. } => "bearer",
            Auth::Basic { .. } => "basic",
            Auth::ApiKey { .. } => "apiKey",
            Auth::CustomHeaders { .. } => "customHeaders",
            Auth::Passthrough { .. } => "passthrough",
        }
    }

    pub fn substitutions(&self) -> &[Substitution] {
        match self {
            Auth::Bearer { substitutions, .. }
            | Auth::Basic { substitutions, .. }
            | Auth::ApiKey { substitutions, .. }
            | Auth::CustomHeaders { substitutions, .. }
            | Auth::Passthrough { substitutions } => substitutions,
        }
    }

    /// The headers this auth sets, as (name, credential).
    pub fn headers(&self) -> Vec<(String, String)> {
        match self {
            Auth::Bearer { credential, .. } | Auth::Basic { credential, .. } => {
                vec![("Authorization".into(), credential.clone())]
            }
            Auth::ApiKey { name, credential, .. } => vec![(name.clone(), credential.clone())],
            Auth::CustomHeaders { headers, .. } => {
                headers.iter().map(|h| (h.name.clone(), h.credential.clone())).collect()
            }
            Auth::Passthrough { .. } => Vec::new(),
        }
    }

    /// Every credential this auth refers to.
    fn credentials(&self) -> Vec<&str> {
        let mut out: Vec<&str> = match self {
            Auth::Bearer { credential, .. } | Auth::Basic { credential, .. } | Auth::ApiKey { credential, .. } => {
                vec![credential]
            }
            Auth::CustomHeaders { headers, .. } => headers.iter().map(|h| h.credential.as_str()).collect(),
            Auth::Passthrough { .. } => Vec::new(),
        };
        out.extend(self.substitutions().iter().map(|s| s.credential.as_str()));
        out
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Binding {
    pub name: String,
    #[serde(rename = "match")]
    pub matcher: Match,
    pub auth: Auth,
}

/// A credential as the vault keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stored {
    pub name: String,
    pub value: Secret,
    /// The vault's revision when it was added or last replaced.
    pub revision: u64,
}

/// A sandbox's vault, values included.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Vault {
    pub revision: u64,
    pub credentials: Vec<Stored>,
    pub bindings: Vec<Binding>,
}

/// `POST /credential-vault`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRequest {
    pub credentials: Vec<Credential>,
    pub bindings: Vec<Binding>,
}

/// What a change does to credentials or to bindings: `add` and `replace` take whole entries,
/// `delete` takes names.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Changes<T> {
    #[serde(default = "Vec::new")]
    pub add: Vec<T>,
    #[serde(default = "Vec::new")]
    pub replace: Vec<T>,
    #[serde(default)]
    pub delete: Vec<String>,
}

impl<T> Default for Changes<T> {
    fn default() -> Self {
        Self { add: Vec::new(), replace: Vec::new(), delete: Vec::new() }
    }
}

/// Entries a vault keeps by name.
pub trait Named {
    fn name(&self) -> &str;
}

impl Named for Credential {
    fn name(&self) -> &str {
        &self.name
    }
}

impl Named for Stored {
    fn name(&self) -> &str {
        &self.name
    }
}

impl Named for Binding {
    fn name(&self) -> &str {
        &self.name
    }
}

impl<T: Named> Changes<T> {
    /// Refuses a name in more than one operation.
    fn check_once(&self, what: &str) -> Result<(), VaultError> {
        let mut seen = std::collections::HashSet::new();
        let names = self.delete.iter().map(String::as_str);
        for n in names.chain(self.replace.iter().map(Named::name)).chain(self.add.iter().map(Named::name)) {
            if !seen.insert(n) {
                return Err(invalid(format!("{what} {n} is in more than one operation")));
            }
        }
        Ok(())
    }

    fn len(&self) -> usize {
        self.add.len() + self.replace.len() + self.delete.len()
    }
}

/// Takes the entry named `name` out of `list`, or says it is not there.
fn remove_named<T: Named>(list: &mut Vec<T>, name: &str, what: &str) -> Result<(), VaultError> {
    let i = list
        .iter()
        .position(|x| x.name() == name)
        .ok_or_else(|| VaultError::NotFound(format!("{what} not found: {name}")))?;
    list.remove(i);
    Ok(())
}

/// Refuses a request with more entries than a vault may hold before any of them is looked at.
fn check_bounds(credentials: usize, bindings: usize) -> Result<(), VaultError> {
    if credentials > MAX_ENTRIES || bindings > MAX_ENTRIES {
        return Err(invalid(format!("a vault holds at most {MAX_ENTRIES} credentials and {MAX_ENTRIES} bindings")));
    }
    Ok(())
}

/// `PATCH /credential-vault`: deletes, then replaces, then adds, all or nothing.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MutationRequest {
    #[serde(default)]
    pub expected_revision: Option<u64>,
    #[serde(default)]
    pub credentials: Option<Changes<Credential>>,
    #[serde(default)]
    pub bindings: Option<Changes<Binding>>,
}

/// Why a vault change is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VaultError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
}

fn invalid(m: impl Into<String>) -> VaultError {
    VaultError::Invalid(m.into())
}

fn is_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn check_name(what: &str, name: &str) -> Result<(), VaultError> {
    if name.trim().is_empty() || name.len() > MAX_NAME || name.chars().any(char::is_control) {
        return Err(invalid(format!(
            "{what} name {name:?} must be 1 to {MAX_NAME} characters without control characters"
        )));
    }
    Ok(())
}

fn check_host(host: &str) -> Result<(), VaultError> {
    let bare = host.strip_prefix("*.").unwrap_or(host);
    let ok = !bare.is_empty()
        && bare.len() <= 253
        && !bare.contains('*')
        && bare.split('.').all(|l| {
            !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    if !ok {
        return Err(invalid(format!("host {host:?} is not a host name or a wildcard of one label (*.example.com)")));
    }
    Ok(())
}

/// A path pattern with `*` matching any run of characters (slashes included).
pub fn path_matches(pattern: &str, path: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == path;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !path.starts_with(first) || path.len() < first.len() + last.len() || !path.ends_with(last) {
        return false;
    }
    let mut rest = &path[first.len()..path.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    true
}

fn host_matches(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(suffix) => {
            host.len() > suffix.len() + 1 && host.ends_with(suffix) && {
                let head = &host[..host.len() - suffix.len()];
                head.ends_with('.') && !head[..head.len() - 1].contains('.')
            }
        }
        None => pattern == host,
    }
}

fn hosts_overlap(a: &str, b: &str) -> bool {
    match (a.strip_prefix("*."), b.strip_prefix("*.")) {
        (Some(x), Some(y)) => x == y,
        (Some(_), None) => host_matches(a, b),
        (None, Some(_)) => host_matches(b, a),
        (None, None) => a == b,
    }
}

/// Whether two path patterns can match one path: a conservative answer (true when unsure),
/// so two bindings are only both accepted when no request can match both.
fn paths_overlap(a: &str, b: &str) -> bool {
    let lit = |p: &str| p.split('*').next().unwrap_or("").to_string();
    match (a.contains('*'), b.contains('*')) {
        (false, false) => a == b,
        (true, false) => path_matches(a, b),
        (false, true) => path_matches(b, a),
        (true, true) => {
            let (x, y) = (lit(a), lit(b));
            x.starts_with(&y) || y.starts_with(&x)
        }
    }
}

impl Match {
    /// Defaults filled (https, every common method, every path), hosts lowercased, methods
    /// uppercased, lists sorted and without repeats.
    pub fn normalized(&self) -> Match {
        let mut m = self.clone();
        if m.schemes.is_empty() {
            m.schemes = vec![Scheme::Https];
        }
        if m.methods.is_empty() {
            m.methods = ["DELETE", "GET", "PATCH", "POST", "PUT"].map(String::from).to_vec();
        }
        if m.paths.is_empty() {
            m.paths = vec!["/*".into()];
        }
        m.hosts = m.hosts.iter().map(|h| h.trim().to_ascii_lowercase()).collect();
        m.methods = m.methods.iter().map(|h| h.trim().to_ascii_uppercase()).collect();
        for l in [&mut m.hosts, &mut m.methods, &mut m.paths] {
            l.sort();
            l.dedup();
        }
        m.schemes.sort();
        m.schemes.dedup();
        m.ports.sort();
        m.ports.dedup();
        m
    }

    fn ports(&self) -> Vec<u16> {
        if self.ports.is_empty() { self.schemes.iter().map(|s| s.default_port()).collect() } else { self.ports.clone() }
    }

    fn validate(&self) -> Result<(), VaultError> {
        if self.hosts.is_empty() {
            return Err(invalid("match.hosts must name at least one host"));
        }
        for h in &self.hosts {
            check_host(h)?;
        }
        if self.ports.contains(&0) {
            return Err(invalid("match.ports: 0 is not a port"));
        }
        for m in &self.methods {
            if !is_token(m) {
                return Err(invalid(format!("match.methods: {m:?} is not an HTTP method")));
            }
        }
        for p in &self.paths {
            if !p.starts_with('/') || p.chars().any(|c| c.is_control() || c == ' ') {
                return Err(invalid(format!("match.paths: {p:?} must start with / and hold no spaces")));
            }
        }
        Ok(())
    }

    /// Whether a request to `host:port` over `scheme` with this method and path matches.
    pub fn matches(&self, scheme: Scheme, host: &str, port: u16, method: &str, path: &str) -> bool {
        self.schemes.contains(&scheme)
            && self.ports().contains(&port)
            && self.hosts.iter().any(|h| host_matches(h, host))
            && self.methods.iter().any(|m| m.eq_ignore_ascii_case(method))
            && self.paths.iter().any(|p| path_matches(p, path))
    }

    /// Whether this match takes connections to `host:port` over `scheme` at all: the enforcer
    /// only looks into those.
    pub fn takes(&self, scheme: Scheme, host: &str, port: u16) -> bool {
        self.schemes.contains(&scheme)
            && self.ports().contains(&port)
            && self.hosts.iter().any(|h| host_matches(h, host))
    }

    fn overlaps(&self, o: &Match) -> bool {
        let ports = self.ports();
        self.schemes.iter().any(|s| o.schemes.contains(s))
            && o.ports().iter().any(|p| ports.contains(p))
            && self.hosts.iter().any(|a| o.hosts.iter().any(|b| hosts_overlap(a, b)))
            && self.methods.iter().any(|m| o.methods.contains(m))
            && self.paths.iter().any(|a| o.paths.iter().any(|b| paths_overlap(a, b)))
    }
}

impl Binding {
    fn validate(&self, credentials: &[Stored]) -> Result<(), VaultError> {
        check_name("binding", &self.name)?;
        self.matcher.validate().map_err(|e| invalid(format!("binding {}: {e}", self.name)))?;
        for (header, _) in self.auth.headers() {
            if !is_token(&header) || RESERVED_HEADERS.contains(&header.to_ascii_lowercase().as_str()) {
                return Err(invalid(format!(
                    "binding {}: {header:?} is not a header a binding may set (a token, and not one of {})",
                    self.name,
                    RESERVED_HEADERS.join(", ")
                )));
            }
        }
        if let Auth::CustomHeaders { headers, .. } = &self.auth
            && headers.is_empty()
        {
            return Err(invalid(format!("binding {}: customHeaders needs at least one header", self.name)));
        }
        for s in self.auth.substitutions() {
            if s.placeholder.is_empty() || s.places.is_empty() {
                return Err(invalid(format!(
                    "binding {}: a substitution needs a placeholder and where to look for it (in)",
                    self.name
                )));
            }
        }
        for c in self.auth.credentials() {
            if !credentials.iter().any(|s| s.name == c) {
                return Err(invalid(format!(
                    "binding {} refers to credential {c:?}, which the vault does not hold",
                    self.name
                )));
            }
        }
        Ok(())
    }
}

/// The placeholder a sandbox may send for a credential it must name but may not hold
/// (`paddock:secret:NAME`), resolved only on a request its binding matches.
pub const PLACEHOLDER_PREFIX: &str = "paddock:secret:";

impl Vault {
    /// The vault a create makes (revision 1).
    pub fn create(req: CreateRequest, policy: &EgressPolicy) -> Result<Vault, VaultError> {
        Self::replacing(None, req, policy)
    }

    /// A whole new vault in place of `previous` (its next revision), or a first one.
    pub fn replacing(previous: Option<&Vault>, req: CreateRequest, policy: &EgressPolicy) -> Result<Vault, VaultError> {
        check_bounds(req.credentials.len(), req.bindings.len())?;
        let revision = previous.map_or(1, |p| p.revision + 1);
        let mut v = Vault { revision, credentials: Vec::new(), bindings: Vec::new() };
        for c in req.credentials {
            v.add_credential(c)?;
        }
        for b in req.bindings {
            v.add_binding(b)?;
        }
        v.validate(policy)?;
        Ok(v)
    }

    fn add_credential(&mut self, c: Credential) -> Result<(), VaultError> {
        check_name("credential", &c.name)?;
        if c.source.kind != "inline" {
            return Err(invalid(format!("credential {}: source.type must be inline", c.name)));
        }
        let value = c.source.value.expose();
        if value.is_empty() || value.len() > MAX_VALUE {
            return Err(invalid(format!("credential {}: a value of 1 to {MAX_VALUE} bytes is needed", c.name)));
        }
        if value.chars().any(char::is_control) {
            // It goes into a header line: CR or LF would let it add headers of its own.
            return Err(invalid(format!("credential {}: the value may not hold control characters", c.name)));
        }
        if self.credentials.iter().any(|s| s.name == c.name) {
            return Err(invalid(format!(
                "credential {} is in the vault already (or given twice): replace it instead",
                c.name
            )));
        }
        self.credentials.push(Stored { name: c.name, value: c.source.value, revision: self.revision });
        Ok(())
    }

    fn add_binding(&mut self, mut b: Binding) -> Result<(), VaultError> {
        if self.bindings.iter().any(|x| x.name == b.name) {
            return Err(invalid(format!(
                "binding {} is in the vault already (or given twice): replace it instead",
                b.name
            )));
        }
        b.matcher = b.matcher.normalized();
        self.bindings.push(b);
        Ok(())
    }

    /// Applies a change to a copy: deletes, then replaces, then adds; the revision moves on by
    /// one even when nothing changed.
    pub fn mutate(&self, req: MutationRequest, policy: &EgressPolicy) -> Result<Vault, VaultError> {
        if let Some(e) = req.expected_revision
            && e != self.revision
        {
            return Err(VaultError::Conflict(format!(
                "expectedRevision {e} does not match current revision {}",
                self.revision
            )));
        }
        let creds = req.credentials.unwrap_or_default();
        let binds = req.bindings.unwrap_or_default();
        check_bounds(self.credentials.len() + creds.len(), self.bindings.len() + binds.len())?;
        creds.check_once("credential")?;
        binds.check_once("binding")?;
        let mut v = self.clone();
        v.revision += 1;
        for n in &binds.delete {
            remove_named(&mut v.bindings, n, "binding")?;
        }
        for n in &creds.delete {
            remove_named(&mut v.credentials, n, "credential")?;
        }
        for c in creds.replace {
            remove_named(&mut v.credentials, &c.name, "credential")?;
            v.add_credential(c)?;
        }
        for b in binds.replace {
            remove_named(&mut v.bindings, &b.name, "binding")?;
            v.add_binding(b)?;
        }
        for c in creds.add {
            v.add_credential(c)?;
        }
        for b in binds.add {
            v.add_binding(b)?;
        }
        v.validate(policy)?;
        Ok(v)
    }

    /// Everything a vault must be, checked whole: names, references, bounds, hosts the egress
    /// policy allows, and no two bindings that could match one request.
    pub fn validate(&self, policy: &EgressPolicy) -> Result<(), VaultError> {
        check_bounds(self.credentials.len(), self.bindings.len())?;
        for b in &self.bindings {
            b.validate(&self.credentials)?;
            for h in &b.matcher.hosts {
                // A wildcard is judged by a name it covers.
                let probe = match h.strip_prefix("*.") {
                    Some(s) => format!("paddock-vault-probe.{s}"),
                    None => h.clone(),
                };
                let decision = policy.decide_name(&probe);
                if !decision.allowed() {
                    return Err(invalid(format!(
                        "binding {}: host {h} is not allowed by the sandbox's egress policy ({}): allow it first",
                        b.name,
                        policy.explain(decision)
                    )));
                }
            }
        }
        for (i, a) in self.bindings.iter().enumerate() {
            for b in &self.bindings[i + 1..] {
                if a.matcher.overlaps(&b.matcher) {
                    return Err(invalid(format!(
                        "bindings {} and {} can match the same request: narrow one (hosts, methods or paths)",
                        a.name, b.name
                    )));
                }
            }
        }
        Ok(())
    }

    /// Whether a binding needs the sandbox's TLS decrypted (`SandboxSpec::credential_proxy`).
    pub fn needs_credential_proxy(&self) -> bool {
        self.bindings.iter().any(|b| b.matcher.schemes.contains(&Scheme::Https))
    }

    pub fn value(&self, credential: &str) -> Option<&Secret> {
        self.credentials.iter().find(|c| c.name == credential).map(|c| &c.value)
    }

    /// Whether the enforcer must look into connections to `host:port` over `scheme`.
    pub fn takes(&self, scheme: Scheme, host: &str, port: u16) -> bool {
        self.bindings.iter().any(|b| b.matcher.takes(scheme, host, port))
    }

    /// The binding a request matches; more than one fails closed.
    pub fn binding_for(
        &self,
        scheme: Scheme,
        host: &str,
        port: u16,
        method: &str,
        path: &str,
    ) -> Result<Option<&Binding>, String> {
        let mut found = self.bindings.iter().filter(|b| b.matcher.matches(scheme, host, port, method, path));
        let first = found.next();
        if let Some(second) = found.next() {
            return Err(format!(
                "more than one credential binding matches ({} and {}): none is used",
                first.map(|b| b.name.as_str()).unwrap_or_default(),
                second.name
            ));
        }
        Ok(first)
    }

    /// What the API shows: names, revisions, matches and auth types, never a value.
    pub fn state(&self) -> serde_json::Value {
        let mut creds: Vec<_> = self
            .credentials
            .iter()
            .map(|c| serde_json::json!({"name": c.name, "sourceType": "inline", "revision": c.revision}))
            .collect();
        creds.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
        let mut binds: Vec<_> = self.bindings.iter().map(|b| self.binding_state(b)).collect();
        binds.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
        serde_json::json!({"revision": self.revision, "credentials": creds, "bindings": binds})
    }

    pub fn binding_state(&self, b: &Binding) -> serde_json::Value {
        let mut auth = serde_json::json!({"type": b.auth.type_name()});
        if let Auth::ApiKey { name, .. } = &b.auth {
            auth["name"] = serde_json::json!(name);
        }
        serde_json::json!({"name": b.name, "revision": self.revision, "match": b.matcher, "auth": auth})
    }

    pub fn credential_state(&self, name: &str) -> Option<serde_json::Value> {
        self.credentials
            .iter()
            .find(|c| c.name == name)
            .map(|c| serde_json::json!({"name": c.name, "sourceType": "inline", "revision": c.revision}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::{Action, EgressRule};

    fn policy(hosts: &[&str]) -> EgressPolicy {
        EgressPolicy {
            default_action: Action::Deny,
            egress: hosts.iter().map(|h| EgressRule::new(Action::Allow, *h)).collect(),
        }
    }

    fn cred(name: &str, v: &str) -> Credential {
        Credential { name: name.into(), source: Source { kind: "inline".into(), value: Secret::new(v) } }
    }

    fn binding(json: serde_json::Value) -> Binding {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn opensandbox_shapes_parse_and_state_holds_no_value() {
        let req: CreateRequest = serde_json::from_value(serde_json::json!({
            "credentials": [{"name": "t", "source": {"type": "inline", "value": "s3cret-value"}}],
            "bindings": [{"name": "b", "match": {"schemes": ["http"], "hosts": ["API.test"], "methods": ["get"], "paths": ["/x/*"]},
                          "auth": {"type": "apiKey", "name": "X-Api-Key", "credential": "t"}}]
        }))
        .unwrap();
        let v = Vault::create(req, &policy(&["api.test"])).unwrap();
        let s = v.state().to_string();
        assert!(!s.contains("s3cret"), "{s}");
        assert_eq!(v.state()["bindings"][0]["match"]["hosts"][0], "api.test");
        assert_eq!(v.state()["bindings"][0]["auth"], serde_json::json!({"type": "apiKey", "name": "X-Api-Key"}));
        assert_eq!(format!("{:?}", v.credentials[0].value), "Secret(..)");
        let b = v.binding_for(Scheme::Http, "api.test", 80, "GET", "/x/y%2fz").unwrap().unwrap();
        assert_eq!(b.name, "b");
        assert!(v.binding_for(Scheme::Https, "api.test", 443, "GET", "/x/y").unwrap().is_none());
        assert!(v.binding_for(Scheme::Http, "api.test", 80, "POST", "/x/y").unwrap().is_none());
        assert!(v.binding_for(Scheme::Http, "evil.test", 80, "GET", "/x/y").unwrap().is_none());
    }

    #[test]
    fn bad_vaults_are_refused_with_the_reason() {
        let p = policy(&["api.test", "*.wild.test"]);
        let b = |j| binding(j);
        let cases: Vec<(CreateRequest, &str)> = vec![
            (
                CreateRequest {
                    credentials: vec![cred("t", "v")],
                    bindings: vec![b(
                        serde_json::json!({"name": "x", "match": {"hosts": ["other.test"]}, "auth": {"type": "bearer", "credential": "t"}}),
                    )],
                },
                "not allowed by the sandbox's egress policy",
            ),
            (
                CreateRequest {
                    credentials: vec![],
                    bindings: vec![b(
                        serde_json::json!({"name": "x", "match": {"hosts": ["api.test"]}, "auth": {"type": "bearer", "credential": "t"}}),
                    )],
                },
                "does not hold",
            ),
            (CreateRequest { credentials: vec![cred("t", "a\r\nX-Evil: 1")], bindings: vec![] }, "control characters"),
            (
                CreateRequest {
                    credentials: vec![cred("t", "v")],
                    bindings: vec![b(
                        serde_json::json!({"name": "x", "match": {"hosts": ["api.test"]}, "auth": {"type": "apiKey", "name": "Host", "credential": "t"}}),
                    )],
                },
                "not a header a binding may set",
            ),
            (
                CreateRequest {
                    credentials: vec![cred("t", "v")],
                    bindings: vec![
                        b(
                            serde_json::json!({"name": "x", "match": {"hosts": ["*.wild.test"], "paths": ["/a/*"]}, "auth": {"type": "bearer", "credential": "t"}}),
                        ),
                        b(
                            serde_json::json!({"name": "y", "match": {"hosts": ["q.wild.test"], "paths": ["/a/b"]}, "auth": {"type": "bearer", "credential": "t"}}),
                        ),
                    ],
                },
                "can match the same request",
            ),
        ];
        for (req, want) in cases {
            let e = Vault::create(req, &p).unwrap_err().to_string();
            assert!(e.contains(want), "{e} does not say {want}");
        }
        // Disjoint paths on one host are two bindings, not a conflict.
        let ok = CreateRequest {
            credentials: vec![cred("t", "v")],
            bindings: vec![
                b(
                    serde_json::json!({"name": "x", "match": {"hosts": ["api.test"], "paths": ["/a/*"]}, "auth": {"type": "bearer", "credential": "t"}}),
                ),
                b(
                    serde_json::json!({"name": "y", "match": {"hosts": ["api.test"], "paths": ["/b/*"]}, "auth": {"type": "bearer", "credential": "t"}}),
                ),
            ],
        };
        Vault::create(ok, &p).unwrap();
        assert!(serde_json::from_value::<Binding>(serde_json::json!({"name": "x", "match": {"hosts": ["a"]}, "auth": {"type": "customHeader", "credential": "t"}})).is_err());
    }

    #[test]
    fn mutations_follow_revisions_and_are_all_or_nothing() {
        let p = policy(&["api.test"]);
        let v = Vault::create(CreateRequest { credentials: vec![], bindings: vec![] }, &p).unwrap();
        assert_eq!(v.revision, 1);
        let m: MutationRequest = serde_json::from_value(serde_json::json!({
            "expectedRevision": 1,
            "credentials": {"add": [{"name": "t", "source": {"value": "v1"}}]},
            "bindings": {"add": [{"name": "b", "match": {"schemes": ["http"], "hosts": ["api.test"]}, "auth": {"type": "bearer", "credential": "t"}}]}
        }))
        .unwrap();
        let v2 = v.mutate(m, &p).unwrap();
        assert_eq!((v2.revision, v2.credentials[0].revision), (2, 2));
        let stale: MutationRequest = serde_json::from_value(serde_json::json!({"expectedRevision": 1})).unwrap();
        assert!(matches!(v2.mutate(stale, &p), Err(VaultError::Conflict(_))));
        // Deleting a credential a binding still uses fails, and changes nothing.
        let del: MutationRequest =
            serde_json::from_value(serde_json::json!({"credentials": {"delete": ["t"]}})).unwrap();
        assert!(v2.mutate(del, &p).unwrap_err().to_string().contains("does not hold"));
        let replace: MutationRequest = serde_json::from_value(
            serde_json::json!({"credentials": {"replace": [{"name": "t", "source": {"value": "v2"}}]}}),
        )
        .unwrap();
        let v3 = v2.mutate(replace, &p).unwrap();
        assert_eq!((v3.revision, v3.value("t").unwrap().expose()), (3, "v2"));
        let missing: MutationRequest =
            serde_json::from_value(serde_json::json!({"bindings": {"delete": ["nope"]}})).unwrap();
        assert!(matches!(v3.mutate(missing, &p), Err(VaultError::NotFound(_))));
    }

    #[test]
    fn a_request_past_the_bounds_is_refused_before_its_entries_are_read() {
        let many = (0..=MAX_ENTRIES).map(|i| cred(&format!("c{i}"), "v")).collect();
        let e = Vault::create(CreateRequest { credentials: many, bindings: vec![] }, &policy(&[])).unwrap_err();
        assert!(e.to_string().contains("at most"), "{e}");
        let v = Vault::create(CreateRequest { credentials: vec![], bindings: vec![] }, &policy(&[])).unwrap();
        let add: Vec<serde_json::Value> =
            (0..=MAX_ENTRIES).map(|i| serde_json::json!({"name": format!("c{i}"), "source": {"value": "v"}})).collect();
        let m: MutationRequest = serde_json::from_value(serde_json::json!({"credentials": {"add": add}})).unwrap();
        assert!(v.mutate(m, &policy(&[])).unwrap_err().to_string().contains("at most"));
    }

    #[test]
    fn patterns_match_as_documented() {
        assert!(path_matches("/*", "/"));
        assert!(path_matches("/npm/*", "/npm/@a%2fb"));
        assert!(!path_matches("/npm/*", "/npmx"));
        assert!(path_matches("/a/*/c", "/a/b/x/c"));
        assert!(host_matches("*.x.test", "a.x.test"));
        assert!(!host_matches("*.x.test", "a.b.x.test"));
        assert!(!host_matches("*.x.test", "x.test"));
        assert!(!host_matches("*.x.test", "evilx.test"));
    }
}
