//! OCI images for Paddock sandboxes: pulling from registries, importing `docker save` and OCI
//! layout archives, and a content-addressed store of unpacked layers that overlayfs mounts as
//! lower directories.
#![forbid(unsafe_code)]

mod error;
mod import;
mod limits;
mod oci;
mod pull;
mod reference;
mod store;
mod unpack;
mod user;

pub use error::ImageError;
pub use limits::Limits;
pub use pull::{Credentials, Progress, PullOptions, RegistryCa, RegistryConfig, layer_downloads};
pub use reference::normalize;
pub use store::{Image, ImageConfig, ImageInfo, PruneReport, Store};
#[cfg(test)]
mod tests;
