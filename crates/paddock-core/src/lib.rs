//! Paddock's domain: what a sandbox is, what may be asked of one, and the `Runtime` trait the
//! local and Kubernetes runtimes implement. Pure: no IO, no async runtime.

pub mod egress;
pub mod naming;
pub mod preflight;
pub mod requires;
pub mod runtime;
pub mod spec;
pub mod units;
pub mod vault;
pub mod volume;
