//! The default lane's run of the runtime contract: the fake runtime (no root, no cluster).

use std::sync::Arc;

use paddock_core::spec::SandboxSpec;
use paddock_testkit::contract::{Contract, run_all};
use paddock_testkit::fake::FakeRuntime;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fake_runtime_keeps_the_contract() {
    let spec = SandboxSpec { image: Some("fake".into()), ..SandboxSpec::default() };
    run_all(Arc::new(FakeRuntime::new()), &Contract::new(spec)).await;
}
