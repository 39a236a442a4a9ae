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
