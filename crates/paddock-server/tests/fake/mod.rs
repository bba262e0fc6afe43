//! The server's tests run on the test kit's `FakeRuntime` (no isolation, no root).
#![allow(dead_code)]

pub mod server;

pub use paddock_testkit::fake::FakeRuntime;
