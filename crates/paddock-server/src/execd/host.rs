//! What the execd emulation needs of the server, and no more: the runtime, the store, the
//! command registry, metrics, limits and the memory budget (`ExecdState`, which the server's
//! whole state converts to by `FromRef`); a sandbox is looked up through `api::SandboxLookup`,
//! on the router's state. So execd imports no module that knows every handler.

use std::sync::Arc;

use paddock_core::runtime::Runtime;

use super::Commands;
use crate::budget::MemoryBudget;
use crate::config::ServerConfig;
use crate::metrics::Metrics;
use crate::store::Store;

#[derive(Clone)]
pub struct ExecdState {
    pub rt: Arc<dyn Runtime>,
    pub store: Store,
    pub config: Arc<ServerConfig>,
    /// Commands started through the execd API, for status, logs and interrupt.
    pub commands: Arc<Commands>,
    pub metrics: Arc<Metrics>,
    /// What requests may hold in memory at once (`budget.rs`).
    pub budget: MemoryBudget,
}
