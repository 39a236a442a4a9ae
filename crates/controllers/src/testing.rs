//! What the controllers' tests share.

use kube_operator_runtime::PolicyRule;
use kube_operator_runtime::rbac::{MANAGE, STATUS, allows};

/// Asserts that `rules` cover what every controller of a custom resource that owns a Deployment
/// does: manage the resource (`plural` in `group`), its status and finalizers, its Deployments,
/// and Events, all without wildcards.
pub fn assert_deployment_owner_rules(rules: &[PolicyRule], group: &str, plural: &str) {
    for verb in MANAGE {
        assert!(allows(rules, group, plural, verb), "{plural} {verb}");
        assert!(
            allows(rules, "apps", "deployments", verb),
            "deployments {verb}"
        );
    }
    for verb in STATUS {
        let status = format!("{plural}/status");
        assert!(allows(rules, group, &status, verb), "{status} {verb}");
    }
    let finalizers = format!("{plural}/finalizers");
    assert!(allows(rules, group, &finalizers, "update"), "{finalizers}");
    for group in ["", "events.k8s.io"] {
        for verb in ["create", "patch"] {
            assert!(
                allows(rules, group, "events", verb),
                "events {verb} in {group:?}"
            );
        }
    }
    let words = rules
        .iter()
        .flat_map(|r| r.api_groups.iter().chain(r.resources).chain(r.verbs));
    assert!(words.clone().all(|w| !w.contains('*')), "no wildcards");
}
