//! Assertions for the unit tests of a controller's desired objects.
//!
//! Each one panics with a message naming what is wrong, like `assert!`; use them in
//! `#[cfg(test)]` code.

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use crate::labels::{MANAGED_BY, manager};

/// Asserts that a child (its `metadata`) is controlled by its owner of `kind` with `uid`, and
/// that garbage collection waits for it (`blockOwnerDeletion`).
///
/// # Panics
/// When it has no owner reference, another owner, or a reference that does not control it.
pub fn assert_controlled_by(metadata: &ObjectMeta, kind: &str, uid: &str) {
    let owners = metadata.owner_references.as_deref().unwrap_or_default();
    let owner = owners.first().expect("an owner reference");
    assert_eq!((owner.kind.as_str(), owner.uid.as_str()), (kind, uid));
    assert_eq!(
        (owner.controller, owner.block_owner_deletion),
        (Some(true), Some(true)),
        "a controller reference that blocks the owner's deletion"
    );
}

/// Asserts that a workload's `selector` selects the pods of its `template`, and that the
/// shared pod watch sees them (they carry the managed-by label).
///
/// # Panics
/// When a selector label is missing from the pods, or they lack the managed-by label.
pub fn assert_selects_its_pods(selector: &LabelSelector, template: &PodTemplateSpec) {
    let selector = selector.match_labels.clone().unwrap_or_default();
    let labels = template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    assert!(
        selector.iter().all(|(k, v)| labels.get(k) == Some(v)),
        "the selector {selector:?} selects the pods labelled {labels:?}"
    );
    assert_eq!(
        labels.get(MANAGED_BY).map(String::as_str),
        Some(manager()),
        "the shared pod watch sees the pods"
    );
}

/// Asserts that a pod template meets the `restricted` Pod Security Standard's rules: a
/// non-root numeric user, the RuntimeDefault seccomp profile, and containers that drop every
/// capability and cannot escalate privileges.
///
/// # Panics
/// On the first rule the template breaks.
pub fn assert_restricted(template: &PodTemplateSpec) {
    let pod = template.spec.as_ref().expect("a pod template");
    let pod_ctx = pod
        .security_context
        .as_ref()
        .expect("a pod security context");
    assert_eq!(pod_ctx.run_as_non_root, Some(true));
    assert!(pod_ctx.run_as_user.is_some_and(|u| u > 0));
    assert_eq!(
        pod_ctx.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
        Some("RuntimeDefault")
    );
    for c in &pod.containers {
        let ctx = c
            .security_context
            .as_ref()
            .expect("a container security context");
        assert_eq!(ctx.allow_privilege_escalation, Some(false), "{}", c.name);
        assert_eq!(ctx.run_as_non_root, Some(true), "{}", c.name);
        assert!(ctx.run_as_user.is_some_and(|u| u > 0), "{}", c.name);
        let drop = ctx
            .capabilities
            .as_ref()
            .and_then(|c| c.drop.clone())
            .unwrap_or_default();
        assert_eq!(drop, ["ALL"], "{}", c.name);
        assert!(ctx.capabilities.as_ref().is_some_and(|c| c.add.is_none()));
        assert_eq!(ctx.privileged, None);
    }
}
