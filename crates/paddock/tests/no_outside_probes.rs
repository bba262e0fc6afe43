//! No test, benchmark or CI step aims at an address off this machine. Scans the repository's
//! tests, scripts, benchmarks and CI for literal IPv4 addresses used as targets and for probes
//! of public names, and fails on any that could leave the machine: only loopback, TEST-NET
//! (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24), the dev cluster's own ranges and the
//! network namespaces the tests make are allowed. Needs neither root nor a cluster.
//!
//! A CIDR (`10.0.0.0/8`) is a rule, not a target, and is not checked. A line that names an
//! address without sending it a packet (a parser's test case) says so with `not-a-probe`.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// The files that send packets when they run: tests, scripts, benchmarks, CI.
fn scanned(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            let rel = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                if !matches!(name.as_str(), "target" | ".git" | "node_modules" | "__pycache__" | ".venv") {
                    stack.push(path);
                }
                continue;
            }
            let is_test = rel.contains("/tests/") && rel.ends_with(".rs");
            let is_bench = (rel.starts_with("crates/paddock-bench/")
                || rel.starts_with("crates/") && name.starts_with("bench"))
                && rel.ends_with(".rs");
            let is_script = ["e2e/", "dev/", ".ci/", "charts/test"].iter().any(|p| rel.starts_with(p))
                && (name.ends_with(".sh") || name.ends_with(".py") || !name.contains('.'));
            if is_test || is_bench || is_script {
                out.push(path);
            }
        }
    }
    out.sort();
    assert!(out.len() > 20, "the scan found only {} files: is the repository laid out as expected?", out.len());
    out
}

/// Where a probe of `ip` goes: nowhere off this machine.
fn stays_here(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_broadcast()
        // TEST-NET-1, -2 and -3: documentation ranges, routed nowhere.
        || (a, b, c) == (192, 0, 2)
        || (a, b, c) == (198, 51, 100)
        || (a, b, c) == (203, 0, 113)
        // dev/k8s: its node (10.244.0.1), Pods (10.244.0.0/16) and Services (10.96.0.0/16).
        || (a, b) == (10, 244)
        || (a, b) == (10, 96)
        // The egress tests' worlds (`e2e/egress_world.py --net 10.77.N`), in namespaces they make.
        || (a, b) == (10, 77)
        // The sandbox's end of its egress veth, and the worlds' link-local stand-ins for the
        // metadata address (169.254.N.4, routed into their namespaces).
        || (a, b) == (169, 254) && ip != Ipv4Addr::new(169, 254, 169, 254)
}

fn ipv4_literals(line: &str) -> Vec<(Ipv4Addr, bool)> {
    let bytes = line.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let starts =
            bytes[i].is_ascii_digit() && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'.'));
        if !starts {
            i += 1;
            continue;
        }
        let end = (i..bytes.len()).find(|&j| !(bytes[j].is_ascii_digit() || bytes[j] == b'.')).unwrap_or(bytes.len());
        let word = line[i..end].trim_end_matches('.');
        if let Ok(ip) = word.parse::<Ipv4Addr>() {
            // `/24` makes a CIDR; `/dev/tcp/HOST/PORT` and `http://HOST/path` stay targets.
            let rest = &line[i + word.len()..];
            let prefix: String =
                rest.strip_prefix('/').unwrap_or("").chars().take_while(char::is_ascii_digit).collect();
            let dev_path = line[..i].ends_with("/dev/tcp/") || line[..i].ends_with("/dev/udp/");
            let cidr = !dev_path && prefix.parse::<u8>().is_ok_and(|p| p <= 32);
            out.push((ip, cidr));
        }
        i = end.max(i + 1);
    }
    out
}

/// Commands and calls that send a packet to the name they are given.
const PROBES: [&str; 10] =
    ["curl ", "wget ", "getent ", "nslookup ", "dig ", "create_connection", "/dev/tcp/", "nc ", "ping ", "urlopen"];
/// Top-level domains of names that resolve off this machine.
const PUBLIC_TLDS: [&str; 9] = [".com", ".org", ".net", ".io", ".dev", ".ai", ".cloud", ".co", ".internal"];

fn public_names_probed(line: &str) -> Vec<String> {
    if !PROBES.iter().any(|p| line.contains(p)) {
        return Vec::new();
    }
    line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '-'))
        .filter(|w| w.contains('.') && w.chars().next().is_some_and(|c| c.is_ascii_alphabetic()))
        .filter(|w| PUBLIC_TLDS.iter().any(|t| w.to_ascii_lowercase().ends_with(t)))
        .map(str::to_owned)
        .collect()
}

#[test]
fn no_test_script_benchmark_or_ci_step_aims_off_this_machine() {
    let root = repo();
    let mut found = Vec::new();
    for file in scanned(&root) {
        let Ok(text) = std::fs::read_to_string(&file) else { continue };
        let rel = file.strip_prefix(&root).unwrap().display().to_string();
        if rel == "crates/paddock/tests/no_outside_probes.rs" {
            continue;
        }
        for (n, line) in text.lines().enumerate() {
            if line.contains("not-a-probe") {
                continue;
            }
            for (ip, cidr) in ipv4_literals(line) {
                if !cidr && !stays_here(ip) {
                    found.push(format!("{rel}:{}: {ip} could leave this machine: {}", n + 1, line.trim()));
                }
            }
            for name in public_names_probed(line) {
                found.push(format!("{rel}:{}: probes the public name {name}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "aimed off this machine (use TEST-NET or an address in a namespace the test makes):\n{}",
        found.join("\n")
    );
}

#[test]
fn every_gate_that_ci_runs_leaves_out_the_outside_probes() {
    let root = repo();
    let mut runs = 0;
    for rel in [".ci/run", "dev/k8s/gate-part.sh", "dev/k8s/helm-part.sh"] {
        let text = std::fs::read_to_string(root.join(rel)).unwrap();
        // A command may go on over lines ending in a backslash.
        let mut command = String::new();
        for line in text.lines() {
            command.push_str(line.trim_end_matches('\\'));
            if line.ends_with('\\') {
                continue;
            }
            let invokes = command.contains("paddock") || command.contains("$bin");
            let is_gate = command.split_whitespace().any(|w| w == "gate");
            if invokes && is_gate && !command.trim_start().starts_with('#') && !command.contains("step ") {
                runs += 1;
                let offline = command.contains("--no-outside-probes") || command.contains("gate_offline");
                assert!(offline, "{rel}: a gate that probes the outside world: {command}");
            }
            command.clear();
        }
    }
    assert!(runs >= 4, "found only {runs} gate runs in CI's scripts: is the scan still reading them?");
    let lane = std::fs::read_to_string(root.join("dev/k8s/paddock")).unwrap();
    let offline = lane.lines().find(|l| l.starts_with("gate_offline=")).expect("dev/k8s/paddock defines gate_offline");
    assert!(offline.contains("--no-outside-probes"), "{offline}");
}

#[test]
fn the_scan_catches_what_it_is_for() {
    let bad = |line: &str| {
        ipv4_literals(line).iter().any(|(ip, cidr)| !cidr && !stays_here(*ip)) || !public_names_probed(line).is_empty()
    };
    for line in [
        "python3 -c \"socket.create_connection(('1.1.1.1', 80))\"",
        "curl http://169.254.169.254/latest/meta-data",
        "(echo > /dev/tcp/8.8.8.8/53)",
        "getent hosts example.com",
        "for target in [\"10.1.2.3\"] {",
    ] {
        assert!(bad(line), "{line}");
    }
    for line in [
        "(echo > /dev/tcp/192.0.2.1/53)",
        "127.0.0.1:8080",
        "deny 10.0.0.0/8",
        "curl -sS https://allowed.test/",
        "nslookup kubernetes.default.svc.cluster.local",
        "version 1.2.3",
    ] {
        assert!(!bad(line), "{line}");
    }
}
