//! The privileged lane's run of the runtime contract (`paddock_testkit::contract`): the local
//! runtime, with real namespaces and cgroups, as root.

mod common;

use std::sync::Arc;

use paddock_core::runtime::Runtime;
use paddock_core::spec::SandboxSpec;
use paddock_testkit::contract::{Contract, run_all};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_runtime_keeps_the_contract() {
    let env = common::Env::new();
    run_all(Arc::new(env.rt.clone()), &Contract::new(SandboxSpec::default())).await;
    assert!(env.rt.list().await.unwrap().is_empty(), "the contract left sandboxes behind");
}
