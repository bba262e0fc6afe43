//! Slow request bodies against the server's memory budget, with `FakeRuntime` (no isolation:
//! see `fake/mod.rs`). The attack this answers: 260 clients holding one sandbox's token, each
//! declaring a 2 MiB body and sending a byte now and then, held the whole 512 MiB budget while
//! the server used 10 MiB, and everyone else got 503s.

#![expect(clippy::disallowed_methods, reason = "a test's fixtures may block: each test has a runtime of its own")]

mod fake;

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use fake::server::Server;
use tower::ServiceExt;

fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_runtime_trickling_bodies_from_one_token_leave_room_for_everyone_else() {
    let s = Server::new().await;
    let id = s.create().await;
    let (_, execd) = s.call("GET", &format!("/v1/sandboxes/{id}/endpoints/44772"), None).await;
    let token = execd["headers"]["x-paddock-sandbox-token"].as_str().unwrap().to_owned();
    let path = format!("/v1/sandboxes/{id}/proxy/44772/command");
    // 300 bodies that declare 2 MiB (600 MiB in all, past the 512 MiB budget) and send one byte.
    let mut senders = Vec::new();
    let mut pending = Vec::new();
    for _ in 0..300 {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(1);
        tx.send(Ok(bytes::Bytes::from_static(b"{"))).await.unwrap();
        senders.push(tx);
        let req = Request::builder()
            .method("POST")
            .uri(&path)
            .header("x-paddock-sandbox-token", &token)
            .header("content-type", "application/json")
            .header("content-length", (2u64 << 20).to_string())
            .body(Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx)))
            .unwrap();
        pending.push(tokio::spawn(s.router().oneshot(req)));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(pending.iter().all(|p| !p.is_finished()), "the slow bodies are still being read");

    // Others' creates and commands go on at once.
    let started = Instant::now();
    // In-process requests carry no Content-Length unless given; a real client's would.
    let create = br#"{"image": {"uri": "fake"}}"#.to_vec();
    let len = create.len().to_string();
    let headers = [("content-type", "application/json"), ("content-length", len.as_str())];
    let (status, body) = s.request("POST", "/v1/sandboxes", &headers, create).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{}", String::from_utf8_lossy(&body));
    assert!(started.elapsed() < Duration::from_secs(3), "others waited {:?} for room", started.elapsed());
    println!("peak RSS {} KiB with 300 slow bodies open", peak_rss_kib());

    // When the clients give up, their room comes back.
    drop(senders);
    for p in pending {
        let response = p.await.unwrap().unwrap();
        assert_ne!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
}
