//! What the controllers' tests share.

use kube_operator_runtime::PolicyRule;
use kube_operator_runtime::rbac::{MANAGE, READ, STATUS, allows};

/// Asserts that `rules` cover what every controller of a custom resource that owns a Deployment
/// does, and no more: watch the resource (`plural` in `group`), patch its status, update its
/// finalizers, manage its Deployments, and record Events, all without wildcards.
pub fn assert_deployment_owner_rules(rules: &[PolicyRule], group: &str, plural: &str) {
    for verb in READ {
        assert!(allows(rules, group, plural, verb), "{plural} {verb}");
    }
    for verb in ["get", "create", "update", "patch", "delete"] {
        assert!(!allows(rules, group, plural, verb), "{plural} {verb}");
    }
    for verb in MANAGE {
        assert!(
            allows(rules, "apps", "deployments", verb),
            "deployments {verb}"
        );
    }
    assert!(!allows(rules, "apps", "deployments", "update"));
    for verb in STATUS {
        let status = format!("{plural}/status");
        assert!(allows(rules, group, &status, verb), "{status} {verb}");
    }
    let finalizers = format!("{plural}/finalizers");
    assert!(allows(rules, group, &finalizers, "update"), "{finalizers}");
    for verb in ["create", "patch"] {
        assert!(
            allows(rules, "events.k8s.io", "events", verb),
            "events {verb}"
        );
        assert!(!allows(rules, "", "events", verb), "core events {verb}");
    }
    let words = rules
        .iter()
        .flat_map(|r| r.api_groups.iter().chain(r.resources).chain(r.verbs));
    assert!(words.clone().all(|w| !w.contains('*')), "no wildcards");
}
