//! What every handler shares.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use paddock_core::runtime::Runtime;

use crate::config::ServerConfig;
use crate::execd::Commands;
use crate::metrics::Metrics;
use crate::secrets::TokenKey;
use crate::store::Store;

#[derive(Clone)]
pub struct AppState {
    pub rt: Arc<dyn Runtime>,
    pub store: Store,
    pub config: Arc<ServerConfig>,
    /// Commands started through the execd API, for status, logs and interrupt.
    pub commands: Arc<Commands>,
    pub metrics: Arc<Metrics>,
    /// Set on SIGTERM: no new sandboxes are created.
    pub draining: Arc<AtomicBool>,
    /// Derives each sandbox's endpoint token; no token is stored.
    pub token_key: Arc<TokenKey>,
    /// Idle connections of the port proxy.
    pub(crate) pool: Arc<crate::proxy_pool::Pool>,
    /// WebSockets and other upgrades through the port proxy (`tunnels.rs`).
    pub tunnels: Arc<crate::tunnels::Tunnels>,
    /// Single-use tickets for routes (`routes.rs`).
    pub tickets: Arc<crate::tickets::Tickets>,
    /// What requests may hold in memory at once (`budget.rs`).
    pub budget: crate::budget::MemoryBudget,
    /// This start of the server, random: the sandboxes it creates carry it, so that after a
    /// crash the next start knows which creates no live server will finish (`lifecycle::adopt`).
    pub boot: Arc<crate::boot::Boot>,
    /// Runs, their scheduler and their gateway (`runs`).
    pub runs: Arc<crate::runs::Runs>,
    /// When each sandbox was last renewed on access (`lifecycle::renew_on_access`).
    pub renewals: Arc<std::sync::Mutex<std::collections::HashMap<String, i64>>>,
    /// When each sandbox was last used, for the idle reaper (`activity`).
    pub activity: Arc<crate::activity::Activity>,
    /// The API keys of tenants and their quotas (`tenants`).
    pub tenants: Arc<crate::tenants::Tenants>,
    /// Where each tenant's sandboxes reach their model (`llm`).
    pub models: Arc<crate::llm::Routes>,
}

impl axum::extract::FromRef<AppState> for Arc<crate::runs::Runs> {
    fn from_ref(state: &AppState) -> Self {
        state.runs.clone()
    }
}

impl axum::extract::FromRef<AppState> for Arc<crate::tenants::Tenants> {
    fn from_ref(state: &AppState) -> Self {
        state.tenants.clone()
    }
}

impl axum::extract::FromRef<AppState> for crate::execd::ExecdState {
    fn from_ref(state: &AppState) -> Self {
        Self {
            rt: state.rt.clone(),
            store: state.store.clone(),
            config: state.config.clone(),
            commands: state.commands.clone(),
            metrics: state.metrics.clone(),
            budget: state.budget.clone(),
        }
    }
}
