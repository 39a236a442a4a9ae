//! RBAC rules as controllers declare them.
//!
//! A controller's rules come from the same types it watches and owns: [`owns`] and [`reads`]
//! take a rule's group and resource from the Kubernetes type itself, and the
//! [`crate::builder::Builder`] refuses to start a controller whose declared watches, owned
//! kinds or custom resource its rules do not cover ([`crate::Error::RbacMissing`]), naming
//! what to add. The generated ClusterRole is the union of the rules, so it cannot drift from
//! what the code watches and writes.

use std::marker::PhantomData;

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
    /// The names of the objects the rule covers; empty for every object.
    pub resource_names: &'static [&'static str],
}

/// Every verb a controller uses on a resource it fully manages.
pub const MANAGE: &[&str] = &[
    "get", "list", "watch", "create", "update", "patch", "delete",
];

/// The verbs on a status subresource.
pub const STATUS: &[&str] = &["get", "update", "patch"];

/// The verbs on a kind a controller only reads, through a shared cache.
pub const READ: &[&str] = &["get", "list", "watch"];

/// The group and resource of a Kubernetes type, as the slices a [`PolicyRule`] holds.
struct Kind<K>(PhantomData<K>);

impl<K: k8s_openapi::Resource> Kind<K> {
    const GROUPS: &'static [&'static str] = &[K::GROUP];
    const RESOURCES: &'static [&'static str] = &[K::URL_PATH_SEGMENT];
}

/// The rule for a kind of child a controller owns: watched through a shared cache, created,
/// applied, deleted.
pub const fn owns<K: k8s_openapi::Resource>() -> PolicyRule {
    PolicyRule {
        api_groups: Kind::<K>::GROUPS,
        resources: Kind::<K>::RESOURCES,
        verbs: MANAGE,
        resource_names: &[],
    }
}

/// The rule for the `verbs` a controller calls directly on a kind, outside the shared caches
/// and its owned children: the PersistentVolumeClaims a StatefulSet leaves behind, listed and
/// deleted by a finalizer's cleanup, are `uses::<PersistentVolumeClaim>(&["list", "delete"])`.
/// Declare the same with [`crate::builder::Builder::uses`] so the start-up check covers it.
pub const fn uses<K: k8s_openapi::Resource>(verbs: &'static [&'static str]) -> PolicyRule {
    PolicyRule {
        api_groups: Kind::<K>::GROUPS,
        resources: Kind::<K>::RESOURCES,
        verbs,
        resource_names: &[],
    }
}

/// The rule for a kind a controller only reads through a shared cache.
pub const fn reads<K: k8s_openapi::Resource>() -> PolicyRule {
    PolicyRule {
        api_groups: Kind::<K>::GROUPS,
        resources: Kind::<K>::RESOURCES,
        verbs: READ,
        resource_names: &[],
    }
}

/// Owned Deployments: watched through the shared cache, applied, deleted.
pub const DEPLOYMENTS: PolicyRule = owns::<k8s_openapi::api::apps::v1::Deployment>();

/// Events through `events.k8s.io/v1` (what kube's `Recorder` uses) and the core group (what
/// `kubectl describe` and older tooling read and write).
pub const EVENTS: [PolicyRule; 2] = [
    PolicyRule {
        api_groups: &["events.k8s.io"],
        resources: &["events"],
        verbs: &["create", "patch"],
        resource_names: &[],
    },
    PolicyRule {
        api_groups: &[""],
        resources: &["events"],
        verbs: &["create", "patch"],
        resource_names: &[],
    },
];

/// The rules of a controller of the custom resource `plural` in API `group`: manage it, write its
/// status and finalizers, and record Events (every controller's [`crate::builder::Builder`]
/// has a recorder); then the `extra` rules for what else it watches or owns.
///
/// ```ignore
/// static RULES: &[PolicyRule] = &controller_rules!("cache.example.com", "memcacheds", DEPLOYMENTS);
/// ```
#[macro_export]
macro_rules! controller_rules {
    ($group:literal, $plural:literal $(, $extra:expr)* $(,)?) => {
        [
            $crate::rbac::PolicyRule {
                api_groups: &[$group],
                resources: &[$plural],
                verbs: $crate::rbac::MANAGE,
                resource_names: &[],
            },
            $crate::rbac::PolicyRule {
                api_groups: &[$group],
                resources: &[concat!($plural, "/status")],
                verbs: $crate::rbac::STATUS,
                resource_names: &[],
            },
            $crate::rbac::PolicyRule {
                api_groups: &[$group],
                resources: &[concat!($plural, "/finalizers")],
                verbs: &["update"],
                resource_names: &[],
            },
            $crate::rbac::EVENTS[0],
            $crate::rbac::EVENTS[1],
            $($extra),*
        ]
    };
}

/// The rule that lets a controller bind the ClusterRoles `names` in RoleBindings it writes. The
/// API server refuses a binding that grants more than its writer holds unless the writer may
/// `bind` that role; this names the roles rather than granting their permissions.
pub const fn binds_cluster_roles(names: &'static [&'static str]) -> PolicyRule {
    PolicyRule {
        api_groups: &["rbac.authorization.k8s.io"],
        resources: &["clusterroles"],
        verbs: &["bind"],
        resource_names: names,
    }
}

/// Pods read through a shared cache.
pub const PODS_READ: PolicyRule = reads::<k8s_openapi::api::core::v1::Pod>();

/// Whether `rules` allow `verb` on every object of `resource` (`memcacheds/status` for a
/// subresource) in the API `group` (`""` for the core group).
pub fn allows(rules: &[PolicyRule], group: &str, resource: &str, verb: &str) -> bool {
    rules.iter().any(|r| {
        r.api_groups.contains(&group)
            && r.resources.contains(&resource)
            && r.verbs.contains(&verb)
            && r.resource_names.is_empty()
    })
}

/// What of `verbs` on `resource` in `group` the `rules` do not allow, as `verb group/resource`
/// (`verb resource` for the core group).
pub fn missing(rules: &[PolicyRule], group: &str, resource: &str, verbs: &[&str]) -> Vec<String> {
    verbs
        .iter()
        .filter(|verb| !allows(rules, group, resource, verb))
        .map(|verb| match group {
            "" => format!("{verb} {resource}"),
            _ => format!("{verb} {group}/{resource}"),
        })
        .collect()
}
