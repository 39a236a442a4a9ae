//! RBAC: the ServiceAccount, a ClusterRole that is exactly the union of what the registered
//! controllers declare, the leader-election Role in the manager's namespace, what the webhook
//! certificates need (their Secret, and the named objects that carry their CA), and the
//! bindings; the leader fence the API server enforces ([`leader_fence`], opt-in under
//! `leader-fence/`); and for a namespaced install (`deploy/namespaced/`), the controllers' rules as a
//! Role.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use kube_operator_runtime::ManagedController;

use crate::{Error, GeneratedFile, MANAGER_NAME, NAMESPACE, leader_fence, manager::meta, yaml};

/// Name of the namespaced Role that lets the manager hold its Lease and record Events.
pub const LEADER_ELECTION_ROLE: &str = concat!(product::name!(), "-leader-election");

pub(crate) fn render(
    controllers: &[Box<dyn ManagedController>],
) -> Result<Vec<GeneratedFile>, Error> {
    let role = cluster_role(controllers)?;
    let files: Vec<(&str, Result<String, Error>)> = vec![
        (
            "rbac/service_account.yaml",
            doc("rbac/service_account.yaml", &service_account()),
        ),
        (
            "rbac/cluster_role.yaml",
            doc("rbac/cluster_role.yaml", &role),
        ),
        (
            "rbac/cluster_role_binding.yaml",
            doc("rbac/cluster_role_binding.yaml", &cluster_role_binding()),
        ),
        (
            "rbac/leader_election_role.yaml",
            doc("rbac/leader_election_role.yaml", &leader_election_role()),
        ),
        (
            "rbac/leader_election_role_binding.yaml",
            doc(
                "rbac/leader_election_role_binding.yaml",
                &leader_election_role_binding(),
            ),
        ),
        (
            "rbac/metrics_auth_role.yaml",
            doc("rbac/metrics_auth_role.yaml", &metrics_auth_role()),
        ),
        (
            "rbac/metrics_auth_role_binding.yaml",
            doc(
                "rbac/metrics_auth_role_binding.yaml",
                &metrics_auth_role_binding(),
            ),
        ),
        (
            "rbac/metrics_reader_role.yaml",
            doc("rbac/metrics_reader_role.yaml", &metrics_reader_role()),
        ),
        (
            "rbac/webhook_role.yaml",
            doc("rbac/webhook_role.yaml", &webhook_role()),
        ),
        (
            "rbac/webhook_role_binding.yaml",
            doc(
                "rbac/webhook_role_binding.yaml",
                &cluster_role_binding_to(WEBHOOK_ROLE),
            ),
        ),
        (
            "rbac/webhook_cert_role.yaml",
            doc("rbac/webhook_cert_role.yaml", &webhook_cert_role()),
        ),
        (
            "rbac/webhook_cert_role_binding.yaml",
            doc(
                "rbac/webhook_cert_role_binding.yaml",
                &role_binding_to(WEBHOOK_CERT_ROLE),
            ),
        ),
        (
            "leader-fence/policy.yaml",
            doc(
                "leader-fence/policy.yaml",
                &leader_fence::policy(controllers)?,
            ),
        ),
        (
            "leader-fence/binding.yaml",
            doc("leader-fence/binding.yaml", &leader_fence::binding()),
        ),
        (
            "namespaced/role.yaml",
            doc("namespaced/role.yaml", &namespaced_role(controllers)?),
        ),
        (
            "namespaced/role_binding.yaml",
            doc("namespaced/role_binding.yaml", &namespaced_role_binding()),
        ),
    ];
    files
        .into_iter()
        .map(|(path, contents)| {
            Ok(GeneratedFile {
                path: PathBuf::from(path),
                contents: contents?,
            })
        })
        .collect()
}

fn doc<T: serde::Serialize>(path: &str, value: &T) -> Result<String, Error> {
    yaml::render_documents(std::path::Path::new(path), std::slice::from_ref(value))
}

fn service_account() -> ServiceAccount {
    ServiceAccount {
        metadata: meta(MANAGER_NAME, Some(NAMESPACE)),
        ..ServiceAccount::default()
    }
}

fn manager_subject() -> Vec<Subject> {
    vec![Subject {
        kind: "ServiceAccount".to_owned(),
        name: MANAGER_NAME.to_owned(),
        namespace: Some(NAMESPACE.to_owned()),
        ..Subject::default()
    }]
}

/// The manager's ClusterRole: the union of every controller's declared rules, merged so each
/// API group and verb set appears once, sorted. Wildcards and empty lists are refused.
///
/// # Errors
/// [`Error::WildcardRule`] or [`Error::EmptyRule`] naming the controller at fault.
pub fn cluster_role(controllers: &[Box<dyn ManagedController>]) -> Result<ClusterRole, Error> {
    Ok(ClusterRole {
        metadata: meta(MANAGER_NAME, None),
        rules: Some(union_of_rules(controllers)?),
        ..ClusterRole::default()
    })
}

/// The manager's Role for a namespaced install: the rules of [`cluster_role`] but those of the
/// controllers that need the whole cluster (which such an install does not run), granted only
/// in the namespace the overlay installs it in (the manager's own, unless the user copies it
/// into more namespaces and names them with `--namespace`).
///
/// # Errors
/// As [`cluster_role`].
pub fn namespaced_role(controllers: &[Box<dyn ManagedController>]) -> Result<Role, Error> {
    Ok(Role {
        metadata: meta(MANAGER_NAME, Some(NAMESPACE)),
        rules: Some(union_of(
            controllers
                .iter()
                .map(AsRef::as_ref)
                .filter(|c| !c.cluster_wide()),
        )?),
    })
}

fn namespaced_role_binding() -> RoleBinding {
    RoleBinding {
        metadata: meta(MANAGER_NAME, Some(NAMESPACE)),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "Role".to_owned(),
            name: MANAGER_NAME.to_owned(),
        },
        subjects: Some(manager_subject()),
    }
}

/// Merges the rules of `controllers`: every (group, resource, verb) any controller declares, and
/// nothing else, with resources that share a group and verb set folded into one rule.
///
/// # Errors
/// As [`cluster_role`].
pub fn union_of_rules(
    controllers: &[Box<dyn ManagedController>],
) -> Result<Vec<PolicyRule>, Error> {
    union_of(controllers.iter().map(AsRef::as_ref))
}

fn union_of<'a>(
    controllers: impl Iterator<Item = &'a dyn ManagedController>,
) -> Result<Vec<PolicyRule>, Error> {
    // Keyed by the object names too: a rule for named objects stays a rule of its own.
    type Resource<'a> = (&'a str, &'a str, &'a [&'a str]);
    let mut verbs_by_resource: BTreeMap<Resource, BTreeSet<&str>> = BTreeMap::new();
    for controller in controllers {
        for rule in controller.rbac_rules() {
            validate(controller.name(), rule)?;
            for group in rule.api_groups {
                for resource in rule.resources {
                    verbs_by_resource
                        .entry((group, resource, rule.resource_names))
                        .or_default()
                        .extend(rule.verbs.iter().copied());
                }
            }
        }
    }
    type Grant<'a> = (&'a str, BTreeSet<&'a str>, &'a [&'a str]);
    let mut resources_by_verbs: BTreeMap<Grant, Vec<&str>> = BTreeMap::new();
    for ((group, resource, names), verbs) in verbs_by_resource {
        resources_by_verbs
            .entry((group, verbs, names))
            .or_default()
            .push(resource);
    }
    Ok(resources_by_verbs
        .into_iter()
        .map(|((group, verbs, names), resources)| PolicyRule {
            api_groups: Some(vec![group.to_owned()]),
            resources: Some(resources.into_iter().map(str::to_owned).collect()),
            verbs: verbs.into_iter().map(str::to_owned).collect(),
            resource_names: (!names.is_empty())
                .then(|| names.iter().copied().map(str::to_owned).collect()),
            ..PolicyRule::default()
        })
        .collect())
}

fn validate(controller: &str, rule: &kube_operator_runtime::PolicyRule) -> Result<(), Error> {
    let fields: [(&'static str, &[&str]); 3] = [
        ("apiGroups", rule.api_groups),
        ("resources", rule.resources),
        ("verbs", rule.verbs),
    ];
    for (field, values) in fields {
        if values.is_empty() {
            return Err(Error::EmptyRule {
                controller: controller.to_owned(),
                field,
            });
        }
        if values.iter().any(|v| v.contains('*')) {
            return Err(Error::WildcardRule {
                controller: controller.to_owned(),
                field,
            });
        }
    }
    Ok(())
}

fn cluster_role_binding() -> ClusterRoleBinding {
    ClusterRoleBinding {
        metadata: meta(MANAGER_NAME, None),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "ClusterRole".to_owned(),
            name: MANAGER_NAME.to_owned(),
        },
        subjects: Some(manager_subject()),
    }
}

/// Name of the ClusterRole that lets the manager check the tokens of its metrics scrapers.
pub const METRICS_AUTH_ROLE: &str = concat!(product::name!(), "-metrics-auth");
/// Name of the ClusterRole a scraper needs to read the manager's secure `/metrics`.
pub const METRICS_READER_ROLE: &str = concat!(product::name!(), "-metrics-reader");

/// What `--metrics-secure` asks of the API server for each scraper: a TokenReview and a
/// SubjectAccessReview (both cluster-wide APIs, so a ClusterRole even for a namespaced install).
pub(crate) fn metrics_auth_role() -> ClusterRole {
    let create = |group: &str, resource: &str| PolicyRule {
        api_groups: Some(vec![group.to_owned()]),
        resources: Some(vec![resource.to_owned()]),
        verbs: vec!["create".to_owned()],
        ..PolicyRule::default()
    };
    ClusterRole {
        metadata: meta(METRICS_AUTH_ROLE, None),
        rules: Some(vec![
            create("authentication.k8s.io", "tokenreviews"),
            create("authorization.k8s.io", "subjectaccessreviews"),
        ]),
        ..ClusterRole::default()
    }
}

fn metrics_auth_role_binding() -> ClusterRoleBinding {
    ClusterRoleBinding {
        metadata: meta(METRICS_AUTH_ROLE, None),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "ClusterRole".to_owned(),
            name: METRICS_AUTH_ROLE.to_owned(),
        },
        subjects: Some(manager_subject()),
    }
}

/// For scrapers (Prometheus's ServiceAccount): `get` on the non-resource URL `/metrics`. Bind
/// it to whoever scrapes; nothing is bound by default.
pub(crate) fn metrics_reader_role() -> ClusterRole {
    ClusterRole {
        metadata: meta(METRICS_READER_ROLE, None),
        rules: Some(vec![PolicyRule {
            non_resource_urls: Some(vec!["/metrics".to_owned()]),
            verbs: vec!["get".to_owned()],
            ..PolicyRule::default()
        }]),
        ..ClusterRole::default()
    }
}

/// Name of the ClusterRole that lets the manager put its CA into its webhook configurations.
pub const WEBHOOK_ROLE: &str = concat!(product::name!(), "-webhook");
/// Name of the Role that lets the manager keep its webhook certificates in a Secret.
pub const WEBHOOK_CERT_ROLE: &str = concat!(product::name!(), "-webhook-certs");

/// The manager's own webhook configurations, and the CRDs that convert through its webhook
/// ([`kube_operator_runtime::conversions`], the ones it injects its CA into), by name: it reads them and
/// writes their `caBundle`, nothing else. Cluster-scoped objects, so a ClusterRole even for a
/// namespaced install.
pub(crate) fn webhook_role() -> ClusterRole {
    let named = |group: &str, resource: &str, names: Vec<String>| PolicyRule {
        api_groups: Some(vec![group.to_owned()]),
        resources: Some(vec![resource.to_owned()]),
        resource_names: Some(names),
        verbs: ["get", "update"].map(String::from).to_vec(),
        ..PolicyRule::default()
    };
    let mut rules = vec![
        named(
            "admissionregistration.k8s.io",
            "mutatingwebhookconfigurations",
            vec![product::MUTATING_CONFIGURATION.to_owned()],
        ),
        named(
            "admissionregistration.k8s.io",
            "validatingwebhookconfigurations",
            vec![product::VALIDATING_CONFIGURATION.to_owned()],
        ),
    ];
    let crds: Vec<String> = kube_operator_runtime::conversions(&controllers::all())
        .into_iter()
        .map(|conversion| conversion.crd_name)
        .collect();
    // An empty `resourceNames` means every object, so no conversion means no rule at all.
    if !crds.is_empty() {
        rules.push(named(
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            crds,
        ));
    }
    ClusterRole {
        metadata: meta(WEBHOOK_ROLE, None),
        rules: Some(rules),
        ..ClusterRole::default()
    }
}

/// The webhook certificates' Secret in the manager's namespace. Kubernetes cannot limit
/// `create` to a name (the object has none until created), so `create` is granted on Secrets
/// in this one namespace, and everything else only on the Secret the manager names.
pub(crate) fn webhook_cert_role() -> Role {
    Role {
        metadata: meta(WEBHOOK_CERT_ROLE, Some(NAMESPACE)),
        rules: Some(vec![
            PolicyRule {
                api_groups: Some(vec![String::new()]),
                resources: Some(vec!["secrets".to_owned()]),
                verbs: vec!["create".to_owned()],
                ..PolicyRule::default()
            },
            PolicyRule {
                api_groups: Some(vec![String::new()]),
                resources: Some(vec!["secrets".to_owned()]),
                resource_names: Some(vec![product::WEBHOOK_CERT_SECRET.to_owned()]),
                verbs: ["get", "update"].map(String::from).to_vec(),
                ..PolicyRule::default()
            },
        ]),
    }
}

fn cluster_role_binding_to(role: &str) -> ClusterRoleBinding {
    ClusterRoleBinding {
        metadata: meta(role, None),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "ClusterRole".to_owned(),
            name: role.to_owned(),
        },
        subjects: Some(manager_subject()),
    }
}

fn role_binding_to(role: &str) -> RoleBinding {
    RoleBinding {
        metadata: meta(role, Some(NAMESPACE)),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "Role".to_owned(),
            name: role.to_owned(),
        },
        subjects: Some(manager_subject()),
    }
}

/// Leases for leader election and Events about them, only in the manager's own namespace.
pub(crate) fn leader_election_role() -> Role {
    let rule = |group: &str, resource: &str, verbs: &[&str]| PolicyRule {
        api_groups: Some(vec![group.to_owned()]),
        resources: Some(vec![resource.to_owned()]),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        ..PolicyRule::default()
    };
    Role {
        metadata: meta(LEADER_ELECTION_ROLE, Some(NAMESPACE)),
        rules: Some(vec![
            // Read and watched (every candidate watches the one Lease), taken (create), and
            // renewed or released (update); never patched. A sharded manager's member Leases
            // are deleted once released or long expired. Its Events, on the Lease.
            rule(
                "coordination.k8s.io",
                "leases",
                &["create", "delete", "get", "list", "update", "watch"],
            ),
            rule("events.k8s.io", "events", &["create", "patch"]),
        ]),
    }
}

fn leader_election_role_binding() -> RoleBinding {
    RoleBinding {
        metadata: meta(LEADER_ELECTION_ROLE, Some(NAMESPACE)),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "Role".to_owned(),
            name: LEADER_ELECTION_ROLE.to_owned(),
        },
        subjects: Some(manager_subject()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use controllers::all;
    use kube_operator_runtime::RunContext;

    /// A controller that only declares rules, for testing the union.
    struct Declares(&'static str, &'static [kube_operator_runtime::PolicyRule]);

    impl ManagedController for Declares {
        fn name(&self) -> &'static str {
            self.0
        }
        fn rbac_rules(&self) -> &'static [kube_operator_runtime::PolicyRule] {
            self.1
        }
        fn run(
            &self,
            _ctx: RunContext,
        ) -> futures::future::BoxFuture<'static, Result<(), kube_operator_runtime::Error>> {
            Box::pin(async { Ok(()) })
        }
    }

    /// Every (group, resource, verb) in the rules, flattened.
    fn triples<'a>(
        rules: impl IntoIterator<Item = &'a PolicyRule>,
    ) -> BTreeSet<(String, String, String)> {
        let mut out = BTreeSet::new();
        for rule in rules {
            for group in rule.api_groups.iter().flatten() {
                for resource in rule.resources.iter().flatten() {
                    for verb in &rule.verbs {
                        out.insert((group.clone(), resource.clone(), verb.clone()));
                    }
                }
            }
        }
        out
    }

    fn declared(controllers: &[Box<dyn ManagedController>]) -> BTreeSet<(String, String, String)> {
        let mut out = BTreeSet::new();
        for c in controllers {
            for rule in c.rbac_rules() {
                for g in rule.api_groups {
                    for r in rule.resources {
                        for v in rule.verbs {
                            out.insert(((*g).to_owned(), (*r).to_owned(), (*v).to_owned()));
                        }
                    }
                }
            }
        }
        out
    }

    #[test]
    fn cluster_role_is_exactly_the_union_of_the_registered_controllers() {
        let registered = all();
        let role = cluster_role(&registered).expect("valid rules");
        let rules = role.rules.expect("rules");
        assert_eq!(triples(&rules), declared(&registered));
        assert!(
            !rules.is_empty(),
            "the registered controllers need permissions"
        );
    }

    #[test]
    fn adding_a_rule_to_a_controller_changes_the_cluster_role() {
        const BASE: &[kube_operator_runtime::PolicyRule] = &[kube_operator_runtime::PolicyRule {
            api_groups: &["apps"],
            resources: &["deployments"],
            verbs: &["get", "list", "watch"],
            resource_names: &[],
            owns: None,
        }];
        const EXTENDED: &[kube_operator_runtime::PolicyRule] = &[
            BASE[0],
            kube_operator_runtime::PolicyRule {
                api_groups: &[""],
                resources: &["configmaps"],
                verbs: &["get"],
                resource_names: &[],
                owns: None,
            },
        ];
        let before = union_of_rules(&[Box::new(Declares("a", BASE)) as Box<dyn ManagedController>])
            .expect("valid");
        let after =
            union_of_rules(&[Box::new(Declares("a", EXTENDED)) as Box<dyn ManagedController>])
                .expect("valid");
        assert_ne!(before, after);
        assert!(triples(&after).contains(&("".into(), "configmaps".into(), "get".into())));
    }

    #[test]
    fn overlapping_declarations_merge_into_one_rule_per_verb_set() {
        const A: &[kube_operator_runtime::PolicyRule] = &[kube_operator_runtime::PolicyRule {
            api_groups: &["apps"],
            resources: &["deployments"],
            verbs: &["get", "watch", "list"],
            resource_names: &[],
            owns: None,
        }];
        const B: &[kube_operator_runtime::PolicyRule] = &[kube_operator_runtime::PolicyRule {
            api_groups: &["apps"],
            resources: &["deployments", "statefulsets"],
            verbs: &["list", "get", "watch"],
            resource_names: &[],
            owns: None,
        }];
        let rules = union_of_rules(&[
            Box::new(Declares("a", A)) as Box<dyn ManagedController>,
            Box::new(Declares("b", B)),
        ])
        .expect("valid");
        assert_eq!(rules.len(), 1, "{rules:?}");
        assert_eq!(
            rules[0].resources,
            Some(vec!["deployments".to_owned(), "statefulsets".to_owned()])
        );
        assert_eq!(rules[0].verbs, ["get", "list", "watch"]);
    }

    #[test]
    fn a_rule_for_named_objects_stays_apart_from_one_for_all() {
        const NAMED: &[kube_operator_runtime::PolicyRule] = &[
            kube_operator_runtime::rbac::binds_cluster_roles(&["edit"]),
            kube_operator_runtime::PolicyRule {
                api_groups: &["rbac.authorization.k8s.io"],
                resources: &["clusterroles"],
                verbs: &["bind"],
                resource_names: &["view"],
                owns: None,
            },
        ];
        let rules = union_of_rules(&[Box::new(Declares("a", NAMED)) as Box<dyn ManagedController>])
            .expect("valid");
        let names: Vec<_> = rules.iter().map(|r| r.resource_names.clone()).collect();
        assert_eq!(
            names,
            [Some(vec!["edit".to_owned()]), Some(vec!["view".to_owned()])]
        );
    }

    #[test]
    fn wildcards_are_refused_with_the_controller_named() {
        const WILD: &[kube_operator_runtime::PolicyRule] = &[kube_operator_runtime::PolicyRule {
            api_groups: &["apps"],
            resources: &["*"],
            verbs: &["get"],
            resource_names: &[],
            owns: None,
        }];
        let err =
            union_of_rules(&[Box::new(Declares("greedy", WILD)) as Box<dyn ManagedController>])
                .expect_err("wildcard refused");
        let message = err.to_string();
        assert!(
            message.contains("greedy") && message.contains("resources"),
            "{message}"
        );
    }

    #[test]
    fn empty_lists_are_refused() {
        const EMPTY: &[kube_operator_runtime::PolicyRule] = &[kube_operator_runtime::PolicyRule {
            api_groups: &["apps"],
            resources: &["deployments"],
            verbs: &[],
            resource_names: &[],
            owns: None,
        }];
        let err =
            union_of_rules(&[Box::new(Declares("lazy", EMPTY)) as Box<dyn ManagedController>])
                .expect_err("empty refused");
        assert!(err.to_string().contains("verbs"), "{err}");
    }

    #[test]
    fn the_webhook_rules_name_the_objects_they_cover() {
        for rule in webhook_role().rules.expect("rules") {
            let names = rule.resource_names.expect("resource names");
            assert!(!names.is_empty(), "{:?}", rule.resources);
            assert!(!rule.verbs.iter().any(|v| v == "create" || v == "delete"));
        }
        let secrets = webhook_cert_role().rules.expect("rules");
        for rule in &secrets {
            if rule.verbs != ["create"] {
                assert_eq!(
                    rule.resource_names,
                    Some(vec![product::WEBHOOK_CERT_SECRET.to_owned()])
                );
            }
        }
        assert_eq!(
            webhook_cert_role().metadata.namespace.as_deref(),
            Some(NAMESPACE)
        );
    }

    /// The manager may write the `caBundle` of exactly the CRDs whose rendered conversion calls
    /// its webhook, and of no other CRD.
    #[test]
    fn the_webhook_role_names_exactly_the_crds_that_convert_through_the_webhook() {
        let converting: BTreeSet<String> = crate::crds::crds(&crate::WebhookTarget::Service {
            namespace: NAMESPACE.to_owned(),
        })
        .expect("CRDs")
        .into_iter()
        .filter(|crd| {
            crd.spec
                .conversion
                .as_ref()
                .is_some_and(|c| c.strategy == "Webhook")
        })
        .filter_map(|crd| crd.metadata.name)
        .collect();
        assert!(!converting.is_empty(), "a CRD converts through the webhook");
        let rules = webhook_role().rules.expect("rules");
        let named: BTreeSet<String> = rules
            .iter()
            .filter(|rule| {
                rule.resources.as_deref() == Some(&["customresourcedefinitions".to_owned()])
            })
            .flat_map(|rule| rule.resource_names.clone().unwrap_or_default())
            .collect();
        assert_eq!(named, converting);
    }

    #[test]
    fn leader_election_role_is_namespaced_to_leases_and_events() {
        let role = leader_election_role();
        assert_eq!(role.metadata.namespace.as_deref(), Some(NAMESPACE));
        let t = triples(role.rules.iter().flatten());
        assert!(t.contains(&(
            "coordination.k8s.io".into(),
            "leases".into(),
            "update".into()
        )));
        assert!(t.iter().all(|(_, r, _)| r == "leases" || r == "events"));
    }
}
