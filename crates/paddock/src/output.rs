//! Human and JSON output of the CLI.

use paddock_core::runtime::{FileReply, SandboxInfo};
use paddock_core::units::unix_ms as now_ms;
use paddock_core::units::{format_bytes, format_duration};

fn print_json<T: serde::Serialize>(value: &T) {
    println!("{}", serde_json::to_string_pretty(value).expect("output serializes"));
}

fn ago(ms: u64) -> String {
    let d = std::time::Duration::from_secs(now_ms().saturating_sub(ms) / 1000);
    format!("{} ago", format_duration(d))
}

pub fn created(info: &SandboxInfo, json: bool) {
    if json {
        print_json(info);
    } else {
        println!("{}", info.id);
    }
}

pub fn line(json: bool, what: &str, value: &str) {
    if json {
        print_json(&serde_json::json!({ what: value }));
    } else {
        println!("{value}");
    }
}

/// A sandbox's egress: mode and rules, counters, newest denials.
pub fn egress(s: &paddock_core::egress::EgressStatus, json: bool) {
    if json {
        print_json(s);
        return;
    }
    println!("mode:        {} (enforced by {})", s.policy.mode(), s.enforcement);
    println!("default:     {}", s.policy.default_action);
    for (i, r) in s.policy.egress.iter().enumerate() {
        println!("rule {i:<6} {} {}", r.action, r.describe());
    }
    let c = &s.counters;
    println!(
        "connections: {} allowed, {} denied\ndns queries: {} allowed, {} denied",
        c.connections_allowed, c.connections_denied, c.dns_allowed, c.dns_denied
    );
    if !s.denials.is_empty() {
        println!("newest denials:");
        for d in s.denials.iter().rev().take(20) {
            println!("  {} {:<3} {}: {}", ago(d.at_unix_ms), d.kind, d.target, d.reason);
        }
    }
}

pub fn vault(id: &paddock_core::runtime::SandboxId, v: Option<&paddock_core::vault::Vault>, json: bool) {
    let Some(v) = v else {
        if json {
            println!("null");
        } else {
            println!("sandbox {id} has no credential vault");
        }
        return;
    };
    let state = v.state();
    if json {
        print_json(&state);
        return;
    }
    println!("revision:    {}", v.revision);
    for c in &v.credentials {
        println!("credential  {} (revision {})", c.name, c.revision);
    }
    for b in &v.bindings {
        let m = &b.matcher;
        let schemes: Vec<String> = m.schemes.iter().map(|s| format!("{s:?}").to_ascii_lowercase()).collect();
        println!(
            "binding     {}: {} {} {} {} -> {}",
            b.name,
            schemes.join(","),
            m.hosts.join(","),
            m.methods.join(","),
            m.paths.join(","),
            b.auth.type_name()
        );
    }
}

pub fn volumes(volumes: &[paddock_core::volume::NamedVolume], json: bool) {
    if json {
        print_json(&volumes);
        return;
    }
    println!("{:<32} {:<8} {:<8} {:<14} USED BY", "NAME", "SIZE", "USED", "CREATED");
    for v in volumes {
        let used = v.used_bytes.map_or("-".to_owned(), paddock_core::units::format_bytes);
        let by = v.used_by.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",");
        println!(
            "{:<32} {:<8} {:<8} {:<14} {}",
            v.name,
            paddock_core::units::format_bytes(v.size_bytes),
            used,
            ago(v.created_unix_ms),
            if by.is_empty() { "-" } else { &by }
        );
    }
}

pub fn list(infos: &[SandboxInfo], json: bool) {
    if json {
        print_json(&infos);
        return;
    }
    println!("{:<18} {:<8} {:<8} {:<6} {:<14} WORKSPACE", "ID", "STATE", "MEMORY", "CPUS", "CREATED");
    for i in infos {
        let r = &i.spec.resources;
        let ws = i.workspace.as_ref().map(|w| w.thread.to_string()).unwrap_or_else(|| "-".into());
        println!(
            "{:<18} {:<8} {:<8} {:<6} {:<14} {}",
            i.id,
            i.state,
            format_bytes(r.memory_bytes),
            format!("{}", f64::from(r.millicpus) / 1000.0),
            ago(i.created_unix_ms),
            ws
        );
    }
}

pub fn info(info: &SandboxInfo) {
    print_json(info);
}

pub fn file_reply(reply: &FileReply, json: bool) {
    if json {
        print_json(reply);
    } else if let FileReply::Stat(s) = reply {
        println!("{} ({} bytes)", s.path, s.size);
    }
}
