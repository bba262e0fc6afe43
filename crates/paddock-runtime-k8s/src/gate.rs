//! What a sandbox Pod must never reach, looked up in the cluster for `paddock gate`: the API
//! server at its Service IP and at every address behind it, the cluster DNS, and the kubelet
//! of every node. Reading these needs more than the server's Role (Services in `default` and
//! `kube-system`, EndpointSlices, Nodes): the gate runs as an admin; what it may not read is
//! reported as skipped, never guessed.

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::api::{Api, ListParams};
use paddock_core::runtime::{IsolationTarget, IsolationTargets, TargetKind};

/// The kubelet's API port.
const KUBELET_PORT: u16 = 10250;

fn target(name: String, host: &str, port: u16, kind: TargetKind) -> IsolationTarget {
    IsolationTarget { name, host: host.to_owned(), port, kind }
}

pub async fn targets(client: Client) -> IsolationTargets {
    let mut out = IsolationTargets::default();
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    match services.get("kubernetes").await {
        Ok(s) => {
            let ip = s.spec.and_then(|s| s.cluster_ip).filter(|ip| ip != "None");
            match ip {
                Some(ip) => out.targets.push(target("Kubernetes API (Service IP)".into(), &ip, 443, TargetKind::Tcp)),
                None => out.skipped.push("Kubernetes API Service: it has no cluster IP".into()),
            }
        }
        Err(e) => out.skipped.push(format!("Kubernetes API Service (reading default/kubernetes: {e})")),
    }
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    match slices.list(&ListParams::default().labels("kubernetes.io/service-name=kubernetes")).await {
        Ok(list) => {
            for slice in list.items {
                let port = slice.ports.iter().flatten().find_map(|p| p.port).unwrap_or(6443) as u16;
                for addr in slice.endpoints.iter().flat_map(|e| e.addresses.iter()) {
                    out.targets.push(target(format!("Kubernetes API (endpoint {addr})"), addr, port, TargetKind::Tcp));
                }
            }
        }
        Err(e) => out.skipped.push(format!("Kubernetes API endpoints (listing EndpointSlices in default: {e})")),
    }
    let dns: Api<Service> = Api::namespaced(client.clone(), "kube-system");
    match dns.get("kube-dns").await {
        Ok(s) => match s.spec.and_then(|s| s.cluster_ip).filter(|ip| ip != "None") {
            Some(ip) => out.targets.push(target("cluster DNS (kube-dns)".into(), &ip, 53, TargetKind::Dns)),
            None => out.skipped.push("cluster DNS: kube-system/kube-dns has no cluster IP".into()),
        },
        Err(e) => out.skipped.push(format!("cluster DNS (reading kube-system/kube-dns: {e})")),
    }
    let nodes: Api<Node> = Api::all(client);
    match nodes.list(&ListParams::default()).await {
        Ok(list) => {
            for node in list.items {
                let name = node.metadata.name.unwrap_or_default();
                let addresses = node.status.and_then(|s| s.addresses).unwrap_or_default();
                for a in addresses.iter().filter(|a| a.type_ == "InternalIP" || a.type_ == "ExternalIP") {
                    out.targets.push(target(
                        format!("kubelet on node {name} ({})", a.address),
                        &a.address,
                        KUBELET_PORT,
                        TargetKind::Tcp,
                    ));
                }
            }
        }
        Err(e) => out.skipped.push(format!("nodes (listing Nodes: {e})")),
    }
    out
}
