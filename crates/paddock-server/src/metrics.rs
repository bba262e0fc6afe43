//! Prometheus metrics: sandboxes by state, create and exec latency, errors by code.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub state: String,
}

/// One sandbox's egress events of one verdict (`allowed` or `denied`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EgressLabel {
    pub sandbox: String,
    pub verdict: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabel {
    pub tenant: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QuotaLabel {
    pub tenant: String,
    pub quota: String,
}

pub struct Metrics {
    registry: Registry,
    pub sandboxes: Family<StateLabel, Gauge>,
    pub create_seconds: Histogram,
    pub exec_seconds: Histogram,
    pub errors: Family<CodeLabel, Counter>,
    /// Refilled from the runtime at each scrape, so sandboxes that are gone drop out.
    pub egress_connections: Family<EgressLabel, Counter>,
    pub egress_dns: Family<EgressLabel, Counter>,
    /// Per tenant, refilled by the reaper's reconcile: sandboxes that exist and their memory.
    pub tenant_sandboxes: Family<TenantLabel, Gauge>,
    pub tenant_memory: Family<TenantLabel, Gauge>,
    pub tenant_model_tokens: Family<TenantLabel, Gauge>,
    pub quota_refusals: Family<QuotaLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("paddock");
        let sandboxes = Family::<StateLabel, Gauge>::default();
        let create_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 14));
        let exec_seconds = Histogram::new(exponential_buckets(0.0005, 2.0, 16));
        let errors = Family::<CodeLabel, Counter>::default();
        registry.register("sandboxes", "Sandboxes by state", sandboxes.clone());
        registry.register("create_seconds", "Time to create a sandbox", create_seconds.clone());
        registry.register("exec_seconds", "Duration of foreground commands", exec_seconds.clone());
        registry.register("api_errors", "API errors by code", errors.clone());
        let egress_connections = Family::<EgressLabel, Counter>::default();
        let egress_dns = Family::<EgressLabel, Counter>::default();
        registry.register(
            "egress_connections",
            "Outbound TCP connections of a sandbox by verdict of its egress policy",
            egress_connections.clone(),
        );
        registry.register(
            "egress_dns_queries",
            "DNS queries of a sandbox by verdict of its egress policy",
            egress_dns.clone(),
        );
        let tenant_sandboxes = Family::<TenantLabel, Gauge>::default();
        let tenant_memory = Family::<TenantLabel, Gauge>::default();
        let tenant_model_tokens = Family::<TenantLabel, Gauge>::default();
        let quota_refusals = Family::<QuotaLabel, Counter>::default();
        registry.register("tenant_sandboxes", "Sandboxes of a tenant that exist", tenant_sandboxes.clone());
        registry.register(
            "tenant_memory_bytes",
            "Memory limits of a tenant's sandboxes, summed",
            tenant_memory.clone(),
        );
        registry.register(
            "tenant_model_tokens",
            "Tokens a tenant's sandboxes spent through the model route",
            tenant_model_tokens.clone(),
        );
        registry.register("quota_refusals", "Requests refused by a tenant's quota (429)", quota_refusals.clone());
        Self {
            registry,
            sandboxes,
            create_seconds,
            exec_seconds,
            errors,
            egress_connections,
            egress_dns,
            tenant_sandboxes,
            tenant_memory,
            tenant_model_tokens,
            quota_refusals,
        }
    }
}

impl Metrics {
    pub fn quota_refused(&self, tenant: &str, quota: &str) {
        self.quota_refusals.get_or_create(&QuotaLabel { tenant: tenant.to_owned(), quota: quota.to_owned() }).inc();
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
