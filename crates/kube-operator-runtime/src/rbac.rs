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
    /// The kind of child the rule is for, when the controller owns it ([`owns`]): what an OLM
    /// bundle lists as the controller's CRD's `resources`.
    pub owns: Option<crate::OwnedKind>,
}

/// The verbs a controller uses on a kind of child it owns: watched through a shared cache
/// (`list`, `watch`; a list by name also tells who holds a name a create found taken), created
/// and server-side applied (`patch`). Never `update`, since every write is a create or an
/// apply, and never `delete` unless the controller deletes children itself (the garbage
/// collector deletes the rest with their owner): grant that with [`owns_and_deletes`].
pub const MANAGE: &[&str] = &["list", "watch", "create", "patch"];

/// The verbs on a status subresource: the status is written with a patch.
pub const STATUS: &[&str] = &["patch"];

/// The verbs on a kind a controller only reads, through a shared cache (a list, then a watch).
pub const READ: &[&str] = &["list", "watch"];

/// The verbs on the custom resources of a controller that holds a finalizer: it adds and
/// removes it with a patch.
pub const FINALIZED: &[&str] = &["list", "watch", "patch"];

/// The group and resource of a Kubernetes type, as the slices a [`PolicyRule`] holds.
struct Kind<K>(PhantomData<K>);

impl<K: k8s_openapi::Resource> Kind<K> {
    const GROUPS: &'static [&'static str] = &[K::GROUP];
    const RESOURCES: &'static [&'static str] = &[K::URL_PATH_SEGMENT];
}

/// The rule for a kind of child a controller owns: watched through a shared cache, created,
/// applied ([`MANAGE`]).
pub const fn owns<K: k8s_openapi::Resource>() -> PolicyRule {
    PolicyRule {
        api_groups: Kind::<K>::GROUPS,
        resources: Kind::<K>::RESOURCES,
        verbs: MANAGE,
        resource_names: &[],
        owns: Some(crate::OwnedKind::of::<K>()),
    }
}

/// [`MANAGE`], and `delete`: for a kind of child the controller deletes itself
/// ([`crate::builder::Tools::remove`]; declare it with `Builder::uses::<K>(&["delete"])`).
pub const MANAGE_AND_DELETE: &[&str] = &["list", "watch", "create", "patch", "delete"];

/// The rule for a kind of child a controller owns and also deletes itself: a budget it no
/// longer wants, a StatefulSet it removes before the volume claims it leaves behind.
pub const fn owns_and_deletes<K: k8s_openapi::Resource>() -> PolicyRule {
    PolicyRule {
        verbs: MANAGE_AND_DELETE,
        ..owns::<K>()
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
        owns: None,
    }
}

/// The rule for a kind a controller only reads through a shared cache.
pub const fn reads<K: k8s_openapi::Resource>() -> PolicyRule {
    PolicyRule {
        api_groups: Kind::<K>::GROUPS,
        resources: Kind::<K>::RESOURCES,
        verbs: READ,
        resource_names: &[],
        owns: None,
    }
}

/// Owned Deployments: watched through the shared cache, created, applied.
pub const DEPLOYMENTS: PolicyRule = owns::<k8s_openapi::api::apps::v1::Deployment>();

/// Events, through `events.k8s.io/v1` (what kube's `Recorder` and this crate's use; `kubectl
/// describe` shows them as well as core ones).
pub const EVENTS: PolicyRule = PolicyRule {
    api_groups: &["events.k8s.io"],
    resources: &["events"],
    verbs: &["create", "patch"],
    resource_names: &[],
    owns: None,
};

/// The rules of a controller of the custom resource `plural` in API `group` (a constant
/// expression, such as a literal or a macro giving one): watch it, patch its
/// status, update its finalizers (which an owner reference that blocks the owner's deletion
/// needs, where the API server enforces it) and record Events; then the `extra` rules for what
/// else it watches or owns. Written `controller_rules!(finalizer, ..)`, it may also patch the
/// resource, to add and remove the finalizer of
/// [`Builder::run_with_finalizer`](crate::builder::Builder::run_with_finalizer). Nothing more:
/// a controller never creates, updates or deletes the resources it reconciles.
///
/// ```ignore
/// static RULES: &[PolicyRule] = &controller_rules!("cache.example.com", "memcacheds", DEPLOYMENTS);
/// ```
#[macro_export]
macro_rules! controller_rules {
    // The inner arm comes first: a `$group:expr` arm would fail hard on `@verbs`.
    (@verbs $verbs:expr, $group:expr, $plural:literal $(, $extra:expr)*) => {
        [
            $crate::rbac::PolicyRule {
                api_groups: &[$group],
                resources: &[$plural],
                verbs: $verbs,
                resource_names: &[],
                owns: None,
            },
            $crate::rbac::PolicyRule {
                api_groups: &[$group],
                resources: &[concat!($plural, "/status")],
                verbs: $crate::rbac::STATUS,
                resource_names: &[],
                owns: None,
            },
            $crate::rbac::PolicyRule {
                api_groups: &[$group],
                resources: &[concat!($plural, "/finalizers")],
                verbs: &["update"],
                resource_names: &[],
                owns: None,
            },
            $crate::rbac::EVENTS,
            $($extra),*
        ]
    };
    (finalizer, $group:expr, $plural:literal $(, $extra:expr)* $(,)?) => {
        $crate::controller_rules!(@verbs $crate::rbac::FINALIZED, $group, $plural $(, $extra)*)
    };
    ($group:expr, $plural:literal $(, $extra:expr)* $(,)?) => {
        $crate::controller_rules!(@verbs $crate::rbac::READ, $group, $plural $(, $extra)*)
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
        owns: None,
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
