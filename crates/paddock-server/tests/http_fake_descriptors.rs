//! What one sandbox's commands may hold in the server, against `FakeRuntime` (no isolation:
//! see `fake/mod.rs`). Its own test binary, so counting the process's descriptors sees only
//! this test.

#![expect(clippy::disallowed_methods, reason = "a test's fixtures may block: each test has a runtime of its own")]

mod fake;

use std::time::{Duration, Instant};

use axum::http::StatusCode;
use fake::server::{Server, assert_error};
use paddock_server::execd::MAX_RUNNING_PER_SANDBOX;
use serde_json::json;

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

async fn background(s: &Server, id: &str, command: &str) -> (StatusCode, serde_json::Value) {
    let body = serde_json::to_vec(&json!({"command": command, "background": true})).unwrap();
    let (status, out) = s.raw("POST", &Server::execd(id, "/command"), "application/json", body).await;
    let text = String::from_utf8_lossy(&out).into_owned();
    (status, serde_json::from_str(&text).unwrap_or(json!(text)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_runtime_commands_per_sandbox_are_bounded_and_leftovers_release_descriptors() {
    let s = Server::new().await;
    let (greedy, other) = (s.create().await, s.create().await);
    let before = open_fds();
    // Each command exits at once but leaves a process holding its output open.
    for _ in 0..20 {
        let (status, body) = background(&s, &greedy, "sleep 30 & echo started").await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    assert!(open_fds() >= before + 20, "the leftovers should hold output pipes for a moment");
    let deadline = Instant::now() + Duration::from_secs(10);
    while open_fds() > before + 4 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(open_fds() <= before + 4, "pipes of ended commands are still open: {} > {before}", open_fds());

    // Commands that keep running are bounded per sandbox...
    let mut started = 0;
    let refused = loop {
        let (status, body) = background(&s, &greedy, "exec sleep 30").await;
        if status != StatusCode::OK {
            break (status, body);
        }
        started += 1;
        assert!(started <= MAX_RUNNING_PER_SANDBOX, "no bound on running commands");
    };
    // The sandbox's entrypoint is one of its running commands.
    assert_eq!(started, MAX_RUNNING_PER_SANDBOX - 1);
    assert_eq!(refused.0, StatusCode::TOO_MANY_REQUESTS, "{}", refused.1);
    assert_error(&refused.1, "TOO_MANY_COMMANDS");
    // ... and another sandbox is not affected.
    let (status, body) = background(&s, &other, "echo fine").await;
    assert_eq!(status, StatusCode::OK, "{body}");
}
