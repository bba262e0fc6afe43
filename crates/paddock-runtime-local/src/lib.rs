//! Paddock's embedded local runtime.
//!
//! Each sandbox is one supervisor process (the `paddock` binary re-executed, single-threaded)
//! and the sandbox's init, which the supervisor clones into new namespaces. [`LocalRuntime`] is
//! the async client side used by the CLI and the server; [`supervisor::main`] is the entry point
//! of the supervisor process.

mod client;
pub mod egress;
mod fileops;
pub mod identity;
pub mod image;
mod init;
pub mod launcher;
pub mod layout;
mod ownership;
mod protocol;
pub mod registry;
mod remains;
pub mod supervisor;
pub mod vault;
pub mod volumes;
mod wsimage;

pub use client::LocalRuntime;
pub use egress::EgressOptions;
pub use image::ImageOptions;
/// The operator's HTTP proxy of forward mode (`EgressOptions::forward`).
pub use paddock_egress::forward::ForwardProxy;
pub use volumes::VolumeOptions;
