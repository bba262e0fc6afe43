//! `paddock check` against a real cluster, ignored unless asked for (`--ignored`), then run
//! with `PADDOCK_K8S_TESTS=1` and a `KUBECONFIG` (see dev/k8s/README.md): the admin passes everything and proves NetworkPolicy
//! enforcement; a service account whose Role lacks two verbs is told exactly those two.
//!
//! PADDOCK_K8S_TESTS=1 KUBECONFIG=/var/lib/paddock-k8s/admin.kubeconfig \
//!     cargo test -p paddock-runtime-k8s --test check_cluster -- --ignored

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, Config};
use paddock_runtime_k8s::KubeConfig;
use paddock_runtime_k8s::check::{self, CheckStatus, NEEDED};
use serde_json::json;

const GATE: &str = "PADDOCK_K8S_TESTS";

/// Ignored in the default lane; run with `--ignored`, it needs the cluster and says so.
fn require_cluster() {
    assert!(
        std::env::var(GATE).as_deref() == Ok("1"),
        "a cluster test: set {GATE}=1 and KUBECONFIG to the test cluster's (dev/k8s/README.md)"
    );
}

fn config(namespace: &str) -> KubeConfig {
    KubeConfig {
        namespace: namespace.into(),
        default_image: "paddock.local/sandbox:1".into(),
        image_pull_policy: "Never".into(),
        ..KubeConfig::default()
    }
}

/// A client that authenticates as `sa` in `ns`, with a short-lived token.
async fn client_as(admin: &Client, ns: &str, sa: &str) -> Client {
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), ns);
    let request: TokenRequest = serde_json::from_value(json!({"spec": {"expirationSeconds": 600}})).unwrap();
    let token = accounts.create_token_request(sa, &PostParams::default(), &request).await.unwrap();
    let token = token.status.expect("a token").token;
    let mut cfg = Config::infer().await.unwrap();
    // Only the token: the admin's client certificate must not come along.
    cfg.auth_info = serde_json::from_value(json!({"token": token})).unwrap();
    Client::try_from(cfg).unwrap()
}

#[tokio::test]
#[ignore = "cluster lane: needs a cluster (PADDOCK_K8S_TESTS=1, KUBECONFIG; dev/k8s/paddock runs it)"]
async fn check_passes_for_the_admin_and_names_exactly_the_missing_verbs_of_a_restricted_account() {
    require_cluster();
    let admin = Client::try_default().await.unwrap();
    let mut b = [0u8; 4];
    rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty()).unwrap();
    let ns = format!("paddock-check-{}", b.iter().map(|x| format!("{x:02x}")).collect::<String>());
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    namespaces
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap())
        .await
        .unwrap();

    let result = async {
        // The admin: every permission, and the probe proves enforcement.
        let report = check::run(&admin, &config(&ns), true).await;
        assert!(report.ok(), "{report:#?}");
        assert!(report.missing.is_empty());
        assert_eq!(report.network_policy, "enforced", "{report:#?}");
        let userns = report.items.iter().find(|i| i.check == "user-namespaces").unwrap();
        assert_eq!(userns.status, CheckStatus::Warn, "off by default, and said so: {userns:?}");

        // With --user-namespaces the probe answers for this cluster: the dev cluster's
        // containerd 1.6 cannot run `hostUsers: false` Pods, and check must say so (a cluster
        // that can would pass with a real uid map).
        let mut with_userns = config(&ns);
        with_userns.host_users_false = true;
        let report = check::run(&admin, &with_userns, true).await;
        let userns = report.items.iter().find(|i| i.check == "user-namespaces").unwrap();
        match userns.status {
            CheckStatus::Pass => {
                assert!(userns.detail.contains("uid_map") && !userns.detail.contains("0 0 4294967295"))
            }
            CheckStatus::Fail => {
                assert!(!report.ok());
                assert!(userns.detail.contains("--user-namespaces"), "the fix is named: {}", userns.detail);
            }
            other => panic!("user-namespaces probe gave {other}: {userns:?}"),
        }
        eprintln!("user-namespaces on this cluster: {} — {}", userns.status, userns.detail);

        // A service account whose Role grants all but two of the runtime's verbs.
        let withheld = ["create pods/portforward", "delete networkpolicies.networking.k8s.io"];
        let rules: Vec<_> = NEEDED
            .iter()
            .filter(|n| !withheld.contains(&n.name().as_str()))
            .map(|n| {
                let res = if n.subresource.is_empty() {
                    n.resource.to_owned()
                } else {
                    format!("{}/{}", n.resource, n.subresource)
                };
                json!({"apiGroups": [n.group], "resources": [res], "verbs": [n.verb]})
            })
            .collect();
        let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "restricted"}})).unwrap();
        Api::<ServiceAccount>::namespaced(admin.clone(), &ns).create(&PostParams::default(), &sa).await.unwrap();
        let role: Role = serde_json::from_value(json!({"metadata": {"name": "restricted"}, "rules": rules})).unwrap();
        Api::<Role>::namespaced(admin.clone(), &ns).create(&PostParams::default(), &role).await.unwrap();
        let binding: RoleBinding = serde_json::from_value(json!({
            "metadata": {"name": "restricted"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "restricted"},
            "subjects": [{"kind": "ServiceAccount", "name": "restricted", "namespace": ns}],
        }))
        .unwrap();
        Api::<RoleBinding>::namespaced(admin.clone(), &ns).create(&PostParams::default(), &binding).await.unwrap();

        let restricted = client_as(&admin, &ns, "restricted").await;
        let report = check::run(&restricted, &config(&ns), true).await;
        assert!(!report.ok(), "a restricted account must not pass: {report:#?}");
        assert_eq!(report.missing, withheld, "{report:#?}");
        for name in withheld {
            let item = report.items.iter().find(|i| i.check == name).unwrap();
            assert_eq!(item.status, CheckStatus::Fail);
            assert!(item.detail.contains("Role rule"), "the fix is named: {}", item.detail);
        }
        assert_eq!(report.network_policy, "skipped");
    }
    .await;
    let _ = namespaces.delete(&ns, &DeleteParams::default()).await;
    result
}
