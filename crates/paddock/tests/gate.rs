//! `paddock gate` on the local runtime, as a user runs it: every check passes from a sandbox
//! on the host's root, the report names what it tried, and an address it must reach and
//! cannot fails it. Nothing aims off this machine: the outside world is stood in for by
//! TEST-NET addresses (`--no-outside-probes`).

mod common;

use std::process::Command;

/// The stand-ins for the outside world every run of the gate here uses.
const OFFLINE: [&str; 5] = ["--no-outside-probes", "--forbid", "TEST-NET-1=192.0.2.1:443", "--dns", "198.51.100.53"];

fn gate(data: &std::path::Path, extra: &[&str]) -> (i32, serde_json::Value, String) {
    common::require_root();
    let out = Command::new(common::EXE)
        .args(["--data-dir", data.to_str().unwrap(), "--json"])
        .arg("gate")
        .args(OFFLINE)
        .args(extra)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let report = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (out.status.code().unwrap_or(-1), report, stderr)
}

fn names(report: &serde_json::Value) -> Vec<String> {
    report["checks"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap().to_owned()).collect()
}

#[test]
fn the_gate_passes_on_the_local_runtime_and_says_what_it_tried() {
    let dir = tempfile::Builder::new().prefix("pgate").tempdir_in("/tmp").unwrap();
    let (code, report, stderr) = gate(dir.path(), &[]);
    assert_eq!(code, 0, "{report:#}\n{stderr}");
    assert_eq!(report["passed"], true);
    let names = names(&report);
    for want in [
        "positive control",
        "reaches its gateway",
        "not root",
        "no capabilities",
        "no_new_privs",
        "own user namespace or gVisor kernel",
        "unreachable 10 s after the start",
        "TEST-NET-1",
        "DNS server 198.51.100.53",
    ] {
        assert!(names.iter().any(|n| n == want), "no {want:?} check in {names:?}");
    }
    assert!(report["checks"].as_array().unwrap().iter().all(|c| c.get("skipped").is_none()), "{report:#}");
    // The way home was tried end to end: the gate's own gateway answered with its nonce.
    let home = report["checks"].as_array().unwrap().iter().find(|c| c["name"] == "reaches its gateway").unwrap();
    assert!(home["detail"].as_str().unwrap().contains("answered with the gate's nonce"), "{home}");
    for never in ["cloud metadata", "the outside world (HTTPS)", "the outside world (DNS)"] {
        assert!(!names.iter().any(|n| n == never), "{never:?} was probed despite --no-outside-probes: {names:?}");
    }
    // The host's resolvers are off this machine (or its loopback): not probed.
    let targets: Vec<&str> = report["checks"].as_array().unwrap().iter().filter_map(|c| c["target"].as_str()).collect();
    for t in &targets {
        let host = t.split(' ').next().unwrap_or_default().rsplit_once(':').map_or(*t, |(h, _)| h);
        if let Ok(ip) = host.parse::<std::net::IpAddr>() {
            let here = std::net::UdpSocket::bind((ip, 0)).is_ok();
            let test_net = ["192.0.2.", "198.51.100.", "203.0.113."].iter().any(|p| host.starts_with(p));
            assert!(here || test_net, "the gate aimed at {t}, neither on this machine nor TEST-NET");
        }
    }
    assert!(names.iter().any(|n| n.starts_with("this host at ")), "the host's addresses were not tried: {names:?}");
    assert!(names.iter().any(|n| n.starts_with("another sandbox")), "{names:?}");
    // The gate removes what it made.
    let left = std::fs::read_dir(dir.path().join("sandboxes")).unwrap().count();
    assert_eq!(left, 0, "the gate left sandboxes behind");
}

#[test]
fn an_address_the_sandbox_must_reach_and_cannot_fails_the_gate() {
    let dir = tempfile::Builder::new().prefix("pgate").tempdir_in("/tmp").unwrap();
    // A sandbox with no network reaches nothing: the gate must say so and fail.
    let (code, report, stderr) = gate(dir.path(), &["--reach", "the gateway=192.0.2.10:8081"]);
    assert_eq!(code, 1, "{report:#}\n{stderr}");
    let check = report["checks"].as_array().unwrap().iter().find(|c| c["name"] == "reaches the gateway").cloned();
    let check = check.unwrap_or_else(|| panic!("no reach check: {report:#}"));
    assert_eq!(check["passed"], false, "{check}");
    assert_eq!(check["target"], "192.0.2.10:8081 (tcp)");
    // Everything else still held.
    let failed: Vec<_> = report["checks"].as_array().unwrap().iter().filter(|c| c["passed"] == false).collect();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(std::fs::read_dir(dir.path().join("sandboxes")).unwrap().count(), 0, "the gate left sandboxes behind");
    // A target that is not NAME=HOST:PORT is refused before anything is made.
    let (code, _, stderr) = gate(dir.path(), &["--forbid", "nowhere"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("HOST:PORT"), "{stderr}");
}

#[test]
fn a_check_skipped_by_name_is_shown_as_skipped_not_passed() {
    let dir = tempfile::Builder::new().prefix("pgate").tempdir_in("/tmp").unwrap();
    let (code, report, stderr) = gate(dir.path(), &["--skip", "No_New_Privs"]);
    assert_eq!(code, 0, "{report:#}\n{stderr}");
    let skipped: Vec<&str> = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["skipped"] == true)
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(skipped, ["no_new_privs"], "{report:#}");
    assert!(!stderr.contains("names no check"), "{stderr}");
    // A name that matches nothing skips nothing, and the user is told.
    let (code, report, stderr) = gate(dir.path(), &["--skip", "no new privs"]);
    assert_eq!(code, 0, "{report:#}\n{stderr}");
    assert!(report["checks"].as_array().unwrap().iter().all(|c| c.get("skipped").is_none()), "{report:#}");
    assert!(stderr.contains("--skip \"no new privs\" names no check"), "{stderr}");
}
