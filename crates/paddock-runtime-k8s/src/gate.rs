//! What a sandbox Pod must never reach, looked up in the cluster for `paddock gate`: the API
//! server at its Service IP and at every address behind it, the cluster DNS, and the kubelet
//! of every node. Reading these needs more than the server's Role (Services in `default` and
//! `kube-system`, EndpointSlices, Nodes): the gate runs as an admin; what it may not read is
//! reported as skipped, never guessed.

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::api::{Api, ListParams};
use paddock_core::runtime::{IsolationTarget, IsolationTargets, NotChecked, TargetKind};

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
                None => out.skipped.push(NotChecked::new("Kubernetes API Service", "it has no cluster IP")),
            }
        }
        Err(e) => {
            out.skipped.push(NotChecked::new("Kubernetes API Service", format!("reading default/kubernetes: {e}")))
        }
    }
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    match slices.list(&ListParams::default().labels("kubernetes.io/service-name=kubernetes")).await {
        Ok(list) => {
            for slice in list.items {
                let port = slice
                    .ports
                    .iter()
                    .flatten()
                    .find_map(|p| p.port)
                    .and_then(|p| u16::try_from(p).ok())
                    .unwrap_or(6443);
                for addr in slice.endpoints.iter().flat_map(|e| e.addresses.iter()) {
                    out.targets.push(target(format!("Kubernetes API (endpoint {addr})"), addr, port, TargetKind::Tcp));
                }
            }
        }
        Err(e) => out
            .skipped
            .push(NotChecked::new("Kubernetes API endpoints", format!("listing EndpointSlices in default: {e}"))),
    }
    // The cluster DNS: the Service kube-system/kube-dns, else the Services labelled as it is
    // (RKE2 names its own rke2-coredns-rke2-coredns), else what each kubelet is told to give
    // Pods (`clusterDNS`, read from its configz below: DNS that runs outside the cluster).
    let dns: Api<Service> = Api::namespaced(client.clone(), "kube-system");
    let mut dns_found = false;
    let mut dns_errors = Vec::new();
    match dns.get("kube-dns").await {
        Ok(s) => match s.spec.and_then(|s| s.cluster_ip).filter(|ip| ip != "None") {
            Some(ip) => {
                out.targets.push(target("cluster DNS (kube-dns)".into(), &ip, 53, TargetKind::Dns));
                dns_found = true;
            }
            None => dns_errors.push("kube-system/kube-dns has no cluster IP".to_owned()),
        },
        Err(e) => dns_errors.push(format!("reading kube-system/kube-dns: {e}")),
    }
    if !dns_found {
        match dns.list(&ListParams::default().labels("k8s-app=kube-dns")).await {
            Ok(list) => {
                for s in list.items {
                    let name = s.metadata.name.unwrap_or_default();
                    if let Some(ip) = s.spec.and_then(|s| s.cluster_ip).filter(|ip| ip != "None") {
                        out.targets.push(target(format!("cluster DNS ({name})"), &ip, 53, TargetKind::Dns));
                        dns_found = true;
                    }
                }
                if !dns_found {
                    dns_errors.push("no Service in kube-system has the label k8s-app=kube-dns".into());
                }
            }
            Err(e) => dns_errors.push(format!("listing Services labelled k8s-app=kube-dns: {e}")),
        }
    }
    let nodes: Api<Node> = Api::all(client.clone());
    match nodes.list(&ListParams::default()).await {
        Ok(list) => {
            for node in list.items {
                let name = node.metadata.name.unwrap_or_default();
                if !dns_found {
                    match kubelet_cluster_dns(&client, &name).await {
                        Ok(addrs) => {
                            for a in addrs {
                                if !out.targets.iter().any(|t| t.host == a && t.kind == TargetKind::Dns) {
                                    out.targets.push(target(
                                        format!("cluster DNS (clusterDNS of the kubelet on {name})"),
                                        &a,
                                        53,
                                        TargetKind::Dns,
                                    ));
                                }
                            }
                        }
                        Err(e) => dns_errors.push(format!("reading the kubelet configuration of node {name}: {e}")),
                    }
                }
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
        Err(e) => out.skipped.push(NotChecked::new("nodes", format!("listing Nodes: {e}"))),
    }
    if !out.targets.iter().any(|t| t.kind == TargetKind::Dns) {
        out.skipped.push(NotChecked::new("cluster DNS", dns_errors.join("; ")));
    }
    out
}

/// The `clusterDNS` addresses the kubelet of node `name` gives Pods (its `/configz`, through
/// the API server's node proxy).
async fn kubelet_cluster_dns(client: &Client, name: &str) -> Result<Vec<String>, String> {
    let request = hyper::Request::get(format!("/api/v1/nodes/{name}/proxy/configz"))
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    let config: serde_json::Value = client.request(request).await.map_err(|e| e.to_string())?;
    let addrs: Vec<String> = config["kubeletconfig"]["clusterDNS"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    if addrs.is_empty() {
        return Err("its configuration names no clusterDNS".into());
    }
    Ok(addrs)
}
