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
