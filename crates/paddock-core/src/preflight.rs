//! `paddock check`'s report: whether a runtime can run sandboxes here, item by item, in one
//! shape for every runtime (the JSON scripts read).

use serde::{Deserialize, Serialize};

/// How one item came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckStatus {
    Pass,
    /// Needed and missing: the runtime cannot run sandboxes here until it is fixed.
    Fail,
    /// Could not tell, or not required.
    Warn,
}

impl CheckStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pass => "pass",
            Self::Fail => "fail",
            Self::Warn => "warn",
        }
    }
}

impl std::fmt::Display for CheckStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Item {
    pub check: String,
    pub status: CheckStatus,
    pub detail: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// Where the runtime puts sandboxes: a Kubernetes namespace, `-` where there is none.
    pub namespace: String,
    pub items: Vec<Item>,
    /// What this identity may not do that the runtime needs, by name (`create pods/exec`).
    pub missing: Vec<String>,
    /// How network isolation is enforced here, in words (`enforced`, `not enforced`, …).
    pub network_policy: String,
}

impl Report {
    /// Whether nothing needed failed.
    pub fn ok(&self) -> bool {
        self.items.iter().all(|i| i.status != CheckStatus::Fail)
    }

    pub fn push(&mut self, check: &str, status: CheckStatus, detail: impl Into<String>) {
        self.items.push(Item { check: check.to_owned(), status, detail: detail.into() });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_fails_on_a_failed_item_only_and_reads_as_before() {
        let mut r = Report { namespace: "-".into(), ..Default::default() };
        r.push("a", CheckStatus::Warn, "could not tell");
        assert!(r.ok());
        r.push("b", CheckStatus::Fail, "missing");
        assert!(!r.ok());
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["items"][1], serde_json::json!({"check": "b", "status": "fail", "detail": "missing"}));
    }
}
