//! `paddock gate` on the local runtime, as a user runs it: every check passes from a sandbox
//! on the host's root and from one on an image root, and the report names what it tried.

mod common;

use std::process::Command;

fn gate(data: &std::path::Path, extra: &[&str]) -> (i32, serde_json::Value, String) {
    common::require_root();
    let out = Command::new(common::EXE)
        .args(["--data-dir", data.to_str().unwrap(), "--json"])
        .args(extra)
        .arg("gate")
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
    for want in ["positive control", "not root", "no capabilities", "cloud metadata", "the outside world (DNS)"] {
        assert!(names.iter().any(|n| n == want), "no {want:?} check in {names:?}");
    }
    assert!(names.iter().any(|n| n.starts_with("this host at ")), "the host's addresses were not tried: {names:?}");
    assert!(names.iter().any(|n| n.starts_with("another sandbox")), "{names:?}");
    // The gate removes what it made.
    let left = std::fs::read_dir(dir.path().join("sandboxes")).unwrap().count();
    assert_eq!(left, 0, "the gate left sandboxes behind");
}
