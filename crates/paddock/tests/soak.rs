//! Soaks of the real `paddock serve` on the local runtime: thousands of sandboxes made, used
//! and deleted over HTTP leave nothing behind (no zombie, process, descriptor or memory that
//! grows), and a `kill -9` of the server in the middle of a burst of creates leaves nothing
//! the API cannot see. Root only, like every test that makes sandboxes.
//!
//! The two tests take turns (one lock): each counts the host's processes.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::server::{Server, data_dir};
use serde_json::{Value, json};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// How many sandboxes the soak makes; `PADDOCK_SOAK_SANDBOXES` changes it.
fn soak_count() -> usize {
    std::env::var("PADDOCK_SOAK_SANDBOXES").ok().and_then(|v| v.parse().ok()).unwrap_or(2000)
}

fn pids() -> Vec<u32> {
    std::fs::read_dir("/proc").unwrap().flatten().filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok()).collect()
}

/// (parent pid, state letter) of a process, if it still exists.
fn stat(pid: u32) -> Option<(u32, char)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?.chars().next()?;
    Some((fields.next()?.parse().ok()?, state))
}

/// The host's processes other than kernel threads (which the kernel starts and ends as it
/// likes: cgroup release workers come and go with every sandbox).
fn host_processes() -> usize {
    pids().into_iter().filter(|&p| p != 2 && stat(p).is_some_and(|(pp, _)| pp != 2)).count()
}

fn children(of: u32) -> Vec<(u32, char)> {
    pids().into_iter().filter_map(|p| stat(p).filter(|(pp, _)| *pp == of).map(|(_, s)| (p, s))).collect()
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn launcher_of(server: u32) -> u32 {
    children(server)
        .into_iter()
        .map(|(p, _)| p)
        .find(|&p| {
            std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| c.split(|&b| b == 0).any(|a| a == b"__launcher"))
        })
        .expect("the server started no supervisor launcher")
}

/// The first output of a command, over the execd API (the whole stream is read).
fn first_line(s: &Server, id: &str, command: &str) -> Option<String> {
    let req = ureq::http::Request::builder()
        .method("POST")
        .uri(s.url(&format!("/v1/sandboxes/{id}/proxy/44772/command")))
        .header("OPEN-SANDBOX-API-KEY", &s.key)
        .header("content-type", "application/json")
        .body(json!({"command": command}).to_string())
        .ok()?;
    let text = s.agent.run(req).ok()?.into_body().read_to_string().ok()?;
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l.strip_prefix("data: ").unwrap_or(l)).ok())
        .find(|e| e["type"] == "stdout")
        .and_then(|e| e["text"].as_str().map(str::to_owned))
}

/// Sandboxes whose state the runtime keeps in `data`, by `paddock ls` on that directory.
fn runtime_ids(data: &Path) -> BTreeSet<String> {
    let out = std::process::Command::new(common::EXE)
        .args(["--data-dir", data.to_str().unwrap(), "--json", "ls"])
        .output()
        .unwrap();
    assert!(out.status.success(), "paddock ls: {}", String::from_utf8_lossy(&out.stderr));
    let list: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    list.iter().map(|i| i["id"].as_str().unwrap().to_owned()).collect()
}

fn api_ids(s: &Server) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    for page in 1.. {
        let (status, list) = s.api("GET", &format!("/v1/sandboxes?pageSize=200&page={page}"), None);
        assert_eq!(status, 200, "{list}");
        ids.extend(list["items"].as_array().unwrap().iter().map(|i| i["id"].as_str().unwrap().to_owned()));
        if list["pagination"]["hasNextPage"] != true {
            break;
        }
    }
    ids
}

/// What the host still holds of sandbox `id`: its directory, cgroups, mounts, processes.
fn remains(data: &Path, id: &str) -> Vec<String> {
    let mut left = Vec::new();
    for dir in ["sandboxes", "gone"] {
        if data.join(dir).join(id).exists() {
            left.push(format!("{dir}/{id}"));
        }
    }
    for ctl in ["memory", "pids", "cpu", "freezer", "unified"] {
        let p = Path::new("/sys/fs/cgroup").join(ctl).join("paddock").join(id);
        if p.exists() {
            left.push(format!("cgroup {}", p.display()));
        }
    }
    if std::fs::read_to_string("/proc/self/mountinfo").unwrap().contains(id) {
        left.push("a mount".into());
    }
    let procs = std::process::Command::new("pgrep").args(["-f", id]).output().unwrap();
    if !procs.stdout.is_empty() {
        left.push(format!("processes {}", String::from_utf8_lossy(&procs.stdout).trim()));
    }
    left
}

fn assert_nothing_left(data: &Path, ids: &BTreeSet<String>) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left: Vec<String> = ids.iter().flat_map(|id| remains(data, id)).collect();
        let dirs: Vec<String> = ["sandboxes", "gone"]
            .iter()
            .flat_map(|d| std::fs::read_dir(data.join(d)).into_iter().flatten().flatten())
            .map(|e| e.path().display().to_string())
            .collect();
        if left.is_empty() && dirs.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "left behind: {left:?}; directories: {dirs:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn thousands_of_sandboxes_over_http_leave_no_zombie_process_descriptor_or_memory() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = data_dir();
    let s = Arc::new(Server::start(dir.path(), &[]));
    let server = s.child.id();
    // Warm up (the first sandboxes build shared skeletons and pools), then take the baseline.
    for _ in 0..20 {
        let id = s.create();
        assert_eq!(first_line(&s, &id, "echo warm").as_deref(), Some("warm"));
        assert_eq!(s.api("DELETE", &format!("/v1/sandboxes/{id}"), None).0, 204);
    }
    std::thread::sleep(Duration::from_millis(500));
    let launcher = launcher_of(server);
    let (host_before, fds_before, rss_before) = (host_processes(), fd_count(server), rss_kib(server));
    let launcher_fds_before = fd_count(launcher);
    assert_eq!(children(launcher), [], "the launcher holds children after the warm-up");

    let total = soak_count();
    let next = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(Mutex::new((0usize, 0u64, 0usize)));
    let started = Instant::now();
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let (s, next, failed) = (s.clone(), next.clone(), failed.clone());
            std::thread::spawn(move || {
                while next.fetch_add(1, Ordering::SeqCst) < total && !failed.load(Ordering::SeqCst) {
                    let id = s.create();
                    let out = first_line(&s, &id, "echo $((6 * 7))");
                    let deleted = s.api("DELETE", &format!("/v1/sandboxes/{id}"), None).0;
                    if out.as_deref() != Some("42") || deleted != 204 {
                        failed.store(true, Ordering::SeqCst);
                        panic!("sandbox {id}: output {out:?}, delete {deleted}");
                    }
                }
            })
        })
        .collect();
    let watcher = {
        let (peak, next) = (peak.clone(), next.clone());
        std::thread::spawn(move || {
            while next.load(Ordering::SeqCst) < total + 8 {
                let mut p = peak.lock().unwrap();
                p.0 = p.0.max(fd_count(server));
                p.1 = p.1.max(rss_kib(server));
                p.2 = p.2.max(children(launcher).iter().filter(|(_, st)| *st == 'Z').count());
                drop(p);
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    for c in clients {
        c.join().expect("a client failed");
    }
    next.store(usize::MAX / 2, Ordering::SeqCst);
    watcher.join().unwrap();
    let elapsed = started.elapsed();

    // What a destroy's supervisor removes after answering may take a moment.
    let deadline = Instant::now() + Duration::from_secs(20);
    let settled = loop {
        let now = (children(launcher), host_processes(), fd_count(server), fd_count(launcher));
        let done = now.0.is_empty() && now.1 <= host_before + 2 && now.2 <= fds_before + 4;
        if done || Instant::now() > deadline {
            break now;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let (launcher_children, host_after, fds_after, launcher_fds_after) = settled;
    let rss_after = rss_kib(server);
    let (peak_fds, peak_rss, peak_zombies) = *peak.lock().unwrap();
    eprintln!(
        "soak: {total} sandboxes in {:.1} s ({:.0}/s); server descriptors {fds_before} -> peak {peak_fds} -> {fds_after}; \
         server RSS {rss_before} KiB -> peak {peak_rss} KiB -> {rss_after} KiB; launcher zombies at peak {peak_zombies}; \
         host processes {host_before} -> {host_after}",
        elapsed.as_secs_f64(),
        total as f64 / elapsed.as_secs_f64()
    );
    assert_eq!(launcher_children, [], "the launcher's children (pid, state) after the soak");
    assert!(peak_zombies <= 16, "{peak_zombies} zombies under the launcher at once: they are not reaped");
    assert_eq!(children(server).into_iter().filter(|(_, st)| *st == 'Z').count(), 0, "zombies under the server");
    assert!(host_after <= host_before + 2, "host processes {host_before} -> {host_after}");
    assert!(fds_after <= fds_before + 4, "server descriptors {fds_before} -> {fds_after}");
    assert!(
        launcher_fds_after <= launcher_fds_before,
        "launcher descriptors {launcher_fds_before} -> {launcher_fds_after}"
    );
    // Allocators keep some of what they freed; a leak of even 4 KiB per sandbox would show.
    assert!(
        rss_after <= rss_before + 8 * 1024,
        "server RSS {rss_before} KiB -> {rss_after} KiB after {total} sandboxes"
    );
    assert_eq!(api_ids(&s), BTreeSet::new());
    assert_nothing_left(dir.path(), &BTreeSet::new());
}

#[test]
fn a_kill_9_mid_burst_of_creates_leaves_nothing_the_api_cannot_see() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = data_dir();
    let mut s = Server::start(dir.path(), &[]);
    let (port, key) = (s.port, s.key.clone());
    let made = Arc::new(Mutex::new(BTreeSet::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..16)
        .map(|_| {
            let (made, stop, key) = (made.clone(), stop.clone(), key.clone());
            std::thread::spawn(move || {
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .timeout_global(Some(Duration::from_secs(30)))
                    .build()
                    .into();
                while !stop.load(Ordering::SeqCst) {
                    let body = json!({"image": {"uri": "host"}, "timeout": 600}).to_string();
                    let resp = agent
                        .post(format!("http://127.0.0.1:{port}/v1/sandboxes"))
                        .header("OPEN-SANDBOX-API-KEY", &key)
                        .header("content-type", "application/json")
                        .send(body);
                    match resp {
                        Ok(r) if r.status().as_u16() == 202 => {
                            let v: Value = serde_json::from_str(&r.into_body().read_to_string().unwrap()).unwrap();
                            made.lock().unwrap().insert(v["id"].as_str().unwrap().to_owned());
                        }
                        // The server is gone: this client's burst is over.
                        _ => return,
                    }
                }
            })
        })
        .collect();
    // Mid-burst: creates are under way in every client.
    let deadline = Instant::now() + Duration::from_secs(60);
    while made.lock().unwrap().len() < 24 {
        assert!(Instant::now() < deadline, "the burst did not get going");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(150));
    s.kill9();
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.join().unwrap();
    }
    let answered = made.lock().unwrap().clone();
    // Every sandbox directory the runtime started, whatever state the crash left it in.
    let started: BTreeSet<String> = std::fs::read_dir(dir.path().join("sandboxes"))
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str().filter(|n| n.starts_with("sbx-")).map(str::to_owned))
        .collect();
    drop(s);

    let s = Server::start(dir.path(), &[]);
    let listed = api_ids(&s);
    let running = runtime_ids(dir.path());
    eprintln!(
        "crash: {} creates answered, {} sandbox directories at the kill; after the restart the API lists {}, the runtime {}",
        answered.len(),
        started.len(),
        listed.len(),
        running.len()
    );
    assert!(answered.is_subset(&listed), "answered creates the API lost: {:?}", answered.difference(&listed));
    assert_eq!(listed, running, "the API and the runtime disagree after the restart");
    for id in &listed {
        let (status, row) = s.api("GET", &format!("/v1/sandboxes/{id}"), None);
        assert_eq!((status, row["status"]["state"].as_str()), (200, Some("Running")), "{row}");
    }
    // An adopted sandbox serves commands like any other.
    if let Some(id) = listed.iter().find(|id| !answered.contains(*id)) {
        assert_eq!(first_line(&s, id, "echo adopted").as_deref(), Some("adopted"));
    }
    for id in &listed {
        assert_eq!(s.api("DELETE", &format!("/v1/sandboxes/{id}"), None).0, 204, "{id}");
    }
    let all: BTreeSet<String> = started.union(&listed).cloned().collect();
    assert_nothing_left(dir.path(), &all);
    assert_eq!(runtime_ids(dir.path()), BTreeSet::new());
}
