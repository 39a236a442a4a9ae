//! Pod and container security contexts that meet the `restricted` Pod Security Standard, for
//! every workload a controller creates.

use k8s_openapi::api::core::v1::{
    Capabilities, PodSecurityContext, SeccompProfile, SecurityContext,
};

/// A pod security context meeting the `restricted` Pod Security Standard: non-root with a
/// numeric user (an image's named user cannot be verified by the kubelet), seccomp
/// `RuntimeDefault`.
pub fn restricted_pod_security(user: i64) -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(user),
        seccomp_profile: Some(runtime_default_seccomp()),
        ..PodSecurityContext::default()
    }
}

/// A container security context meeting the `restricted` Pod Security Standard: no privilege
/// escalation, every capability dropped, non-root with a numeric user, seccomp `RuntimeDefault`.
pub fn restricted_container_security(user: i64) -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_owned()]),
            add: None,
        }),
        run_as_non_root: Some(true),
        run_as_user: Some(user),
        seccomp_profile: Some(runtime_default_seccomp()),
        ..SecurityContext::default()
    }
}

fn runtime_default_seccomp() -> SeccompProfile {
    SeccompProfile {
        type_: "RuntimeDefault".to_owned(),
        localhost_profile: None,
    }
}

/// Checks a pod template against the `restricted` Pod Security Standard's container rules (for
/// tests of each controller's desired Deployment).
#[cfg(test)]
pub fn assert_restricted(deployment: &k8s_openapi::api::apps::v1::Deployment) {
    let pod = deployment
        .spec
        .template
        .spec
        .as_ref()
        .expect("a pod template");
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
