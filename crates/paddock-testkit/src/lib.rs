//! Paddock's test kit, for tests only (never a dependency of the product):
//!
//! - [`fake::FakeRuntime`]: a runtime WITHOUT isolation, so the server's HTTP behaviour is
//!   tested without root or a cluster.
//! - [`image`]: layers, configs and manifests built in memory, and a real registry on loopback.
//! - [`contract`]: what every runtime must do, as the server relies on it; run against the fake
//!   in the default lane, the local runtime in the privileged lane and the Kubernetes runtime
//!   in the cluster lane.

pub mod contract;
pub mod fake;
pub mod image;
