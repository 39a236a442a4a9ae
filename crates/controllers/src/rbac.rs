//! RBAC rules as controllers declare them.

/// One rule of a ClusterRole, declared statically next to the controller that needs it.
///
/// Wildcards are deliberately not representable in intent: `codegen` rejects `*` so the generated
/// role grants exactly what is listed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PolicyRule {
    /// API groups; `""` is the core group.
    pub api_groups: &'static [&'static str],
    /// Resources, including subresources such as `memcacheds/status`.
    pub resources: &'static [&'static str],
    /// Verbs: `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`.
    pub verbs: &'static [&'static str],
}

/// Every verb a controller uses on a resource it fully manages.
pub const MANAGE: &[&str] = &[
    "get", "list", "watch", "create", "update", "patch", "delete",
];

/// The verbs on a status subresource.
pub const STATUS: &[&str] = &["get", "update", "patch"];

/// Owned Deployments: watched through the shared cache, applied, deleted.
pub const DEPLOYMENTS: PolicyRule = PolicyRule {
    api_groups: &["apps"],
    resources: &["deployments"],
    verbs: MANAGE,
};

/// Events through `events.k8s.io/v1` (what kube's `Recorder` uses) and the core group (what
/// `kubectl describe` and older tooling read and write).
pub const EVENTS: [PolicyRule; 2] = [
    PolicyRule {
        api_groups: &["events.k8s.io"],
        resources: &["events"],
        verbs: &["create", "patch"],
    },
    PolicyRule {
        api_groups: &[""],
        resources: &["events"],
        verbs: &["create", "patch"],
    },
];
