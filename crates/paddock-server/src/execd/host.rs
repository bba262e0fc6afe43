//! What the execd emulation needs of the server, and no more: the runtime, the store, the
//! command registry, metrics, limits and the memory budget (`ExecdState`, which the server's
//! whole state converts to by `FromRef`), and a way to look a sandbox up (`SandboxLookup`, on
//! the router's state). So execd imports no module that knows every handler.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use paddock_core::runtime::{Runtime, SandboxId};

use super::Commands;
use crate::budget::MemoryBudget;
use crate::config::ServerConfig;
use crate::error::ApiResult;
use crate::metrics::Metrics;
use crate::store::{SandboxRow, Store};

/// How execd finds the sandbox a request names: the API's own rows, and one the server has
/// not seen yet adopted (the lifecycle's business, hence behind a trait).
pub trait SandboxLookup: Send + Sync {
    fn sandbox<'a>(&'a self, id: &'a str) -> Lookup<'a>;
}

/// A lookup under way.
pub type Lookup<'a> = Pin<Box<dyn Future<Output = ApiResult<(SandboxId, SandboxRow)>> + Send + 'a>>;

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
