//! Where a gateway call comes from, and the check that a token is used only from its own
//! sandbox. Apart from the gateway's handlers so that the model route (`llm`) can check the
//! same way without importing them.

use std::net::IpAddr;
use std::sync::Arc;

use axum::http::StatusCode;

use crate::error::ApiError;

/// Where a gateway connection comes from: the sandbox its forwarder named, or (`sandbox`
/// `None`) a direct connection from `peer`, as a Kubernetes Pod dials the gateway's address.
#[derive(Clone)]
pub(crate) struct Origin {
    pub(crate) sandbox: Option<String>,
    pub(super) peer: IpAddr,
    pub(super) addresses: Arc<SandboxAddresses>,
}

impl Origin {
    /// Refuses a call whose token names `sandbox` when its connection comes from elsewhere:
    /// another sandbox's forwarder, or an address that is not the sandbox's. A token that
    /// leaked out of its sandbox is then worth nothing anywhere else.
    pub(crate) async fn vouch(&self, sandbox: &str) -> Result<(), ApiError> {
        match &self.sandbox {
            Some(from) if from != sandbox => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "FOREIGN_TOKEN",
                "this token belongs to another sandbox's attempt: a sandbox may use only its own",
            )),
            Some(_) => Ok(()),
            None => self.addresses.check(sandbox, self.peer).await,
        }
    }
}

/// The addresses of sandboxes that called the gateway directly (`SandboxInfo::addresses`),
/// asked of the runtime once each: a Pod keeps its IP for its life, and a sandbox id names one
/// Pod.
pub(crate) struct SandboxAddresses {
    rt: Arc<dyn paddock_core::runtime::Runtime>,
    /// Whether the runtime's sandboxes dial the gateway directly. Where a forwarder names
    /// each sandbox, a direct connection is no sandbox's (a host process), and no address is
    /// asked for on every call.
    direct: bool,
    known: std::sync::Mutex<std::collections::HashMap<String, Vec<IpAddr>>>,
}

/// Sandboxes whose addresses are remembered at once; past it the memory starts again.
const REMEMBERED: usize = 4096;

impl SandboxAddresses {
    pub(crate) fn new(rt: Arc<dyn paddock_core::runtime::Runtime>) -> Arc<Self> {
        let direct = !rt.capabilities().gateway_names_sandbox;
        Arc::new(Self { rt, direct, known: Default::default() })
    }

    async fn check(&self, sandbox: &str, peer: IpAddr) -> Result<(), ApiError> {
        if !self.direct {
            return Ok(());
        }
        let known = self.known.lock().unwrap_or_else(|e| e.into_inner()).get(sandbox).cloned();
        let addresses = match known {
            Some(a) => a,
            None => {
                // A token names a sandbox id the server made; one that does not parse is no
                // sandbox's, and the run's row refuses it.
                let Ok(id) = paddock_core::runtime::SandboxId::parse(sandbox) else { return Ok(()) };
                let addresses = match self.rt.get(&id).await {
                    Ok(info) => info.addresses,
                    // A sandbox that is gone has an attempt that is over: the run's row
                    // refuses the call, saying which epoch is current.
                    Err(paddock_core::runtime::RuntimeError::NotFound(_)) => return Ok(()),
                    Err(e) => return Err(e.into()),
                };
                // A sandbox whose address is not known yet is asked again next time.
                if !addresses.is_empty() {
                    let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
                    if known.len() >= REMEMBERED {
                        known.clear();
                    }
                    known.insert(sandbox.to_owned(), addresses.clone());
                }
                addresses
            }
        };
        let peer = peer.to_canonical();
        if addresses.is_empty() || addresses.contains(&peer) {
            return Ok(());
        }
        let theirs: Vec<String> = addresses.iter().map(ToString::to_string).collect();
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "FOREIGN_TOKEN",
            format!(
                "this token belongs to the attempt in sandbox {sandbox}, whose connections come from {}, but this call came from {peer}: a sandbox may use only its own token",
                theirs.join(", ")
            ),
        ))
    }
}
