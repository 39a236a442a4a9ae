//! The Tenant controller: for every (cluster-scoped) `Tenant`, a namespace holding a
//! ResourceQuota, a LimitRange and a RoleBinding of the tenant's group to `edit`.
//!
//! The namespace and what it holds are the Tenant's children (a namespaced child may have a
//! cluster-scoped owner), so deleting the Tenant lets the garbage collector delete the namespace
//! and, with it, everything in it. A namespace of the asked-for name that is not the Tenant's
//! is never touched: `Ready` is `False` with reason `NamespaceNotOwned`, and a Warning Event
//! names it. A hand edit of any child is undone; a child deleted by hand is made again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use apis::Tenant;
use k8s_openapi::api::core::v1::{
    LimitRange, LimitRangeItem, LimitRangeSpec, Namespace, ResourceQuota, ResourceQuotaSpec,
};
use k8s_openapi::api::rbac::v1::{RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::{ResourceExt, api::ObjectMeta};

use kube_operator_runtime::conditions::{self, READY};
use kube_operator_runtime::with_status_writer;
use kube_operator_runtime::{Builder, Child, Error, NewCondition, Outcome, PolicyRule, Progress};
use kube_operator_runtime::{Registration, RunContext, labels, owned_metadata, rbac};

/// The controller's name: metrics label, configuration key, log field.
pub const NAME: &str = "tenant";
/// The name of the quota, the limits and the binding in the tenant's namespace.
pub const CHILD_NAME: &str = "tenant";
/// How often a Tenant blocked by a foreign namespace looks again: that namespace is not watched.
pub const FOREIGN_RECHECK: Duration = Duration::from_secs(60);
/// The ClusterRole the tenant's group is bound to in its namespace.
pub const ROLE: &str = "edit";
/// The requests and limits a container gets when it states none: with a quota on `requests.*`
/// or `limits.*`, the API server refuses pods that state none.
pub const DEFAULT_REQUESTS: [(&str, &str); 2] = [("cpu", "100m"), ("memory", "128Mi")];
/// See [`DEFAULT_REQUESTS`].
pub const DEFAULT_LIMITS: [(&str, &str); 2] = [("cpu", "500m"), ("memory", "256Mi")];

/// The Tenant controller, as registered in [`crate::all`].
pub const CONTROLLER: Registration = Registration::new(NAME, &RULES, |ctx| Box::pin(run(ctx)))
    .with_samples(crate::samples::tenant)
    .cluster_wide();

static RULES: [PolicyRule; 9] = kube_operator_runtime::controller_rules!(
    product::group!(platform),
    "tenants",
    rbac::owns::<Namespace>(),
    rbac::owns::<ResourceQuota>(),
    rbac::owns::<LimitRange>(),
    rbac::owns::<RoleBinding>(),
    rbac::binds_cluster_roles(&[ROLE]),
);

type Context = kube_operator_runtime::Context<Tenant>;

async fn run(ctx: RunContext) -> Result<(), Error> {
    Builder::<Tenant>::new(NAME, &ctx)
        .owns_kind::<Namespace>()
        .owns_kind::<ResourceQuota>()
        .owns_kind::<LimitRange>()
        .owns_kind::<RoleBinding>()
        .run(with_status_writer, reconcile)
        .await
}

/// The metadata of the tenant's child `name` in `namespace`.
fn metadata(tenant: &Tenant, name: String, namespace: Option<String>) -> Result<ObjectMeta, Error> {
    let labels = labels::managed_instance(NAME, &tenant.name_any());
    owned_metadata(tenant, name, namespace, labels)
}

/// The tenant's namespace.
///
/// # Errors
/// [`Error::MissingField`] when `tenant` was not read from the API server.
pub fn desired_namespace(tenant: &Tenant) -> Result<Namespace, Error> {
    let metadata = metadata(tenant, tenant.namespace_name(), None)?;
    Ok(Namespace {
        metadata,
        ..Default::default()
    })
}

/// The quota, the limits and the binding in the tenant's namespace.
///
/// # Errors
/// [`Error::MissingField`] when `tenant` was not read from the API server.
pub fn desired_contents(
    tenant: &Tenant,
) -> Result<(ResourceQuota, LimitRange, RoleBinding), Error> {
    let metadata = metadata(tenant, CHILD_NAME.to_owned(), Some(tenant.namespace_name()))?;
    let quantities = |pairs: [(&str, &str); 2]| {
        let map = pairs.map(|(k, v)| (k.to_owned(), Quantity(v.to_owned())));
        Some(BTreeMap::from(map))
    };
    let quota = ResourceQuota {
        metadata: metadata.clone(),
        spec: Some(ResourceQuotaSpec {
            hard: Some(tenant.spec.quota.clone()),
            ..ResourceQuotaSpec::default()
        }),
        ..ResourceQuota::default()
    };
    let limits = LimitRange {
        metadata: metadata.clone(),
        spec: Some(LimitRangeSpec {
            limits: vec![LimitRangeItem {
                type_: "Container".to_owned(),
                default_request: quantities(DEFAULT_REQUESTS),
                default: quantities(DEFAULT_LIMITS),
                ..LimitRangeItem::default()
            }],
        }),
    };
    let binding = RoleBinding {
        metadata: ObjectMeta {
            name: Some(format!("{CHILD_NAME}-{ROLE}")),
            ..metadata
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "ClusterRole".to_owned(),
            name: ROLE.to_owned(),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "Group".to_owned(),
            name: tenant.spec.group.clone(),
            ..Subject::default()
        }]),
    };
    Ok((quota, limits, binding))
}

/// The `Ready` condition of a tenant, given what came of its `children` (by kind).
pub fn ready_condition(namespace: &str, children: &[(&str, Child)]) -> NewCondition {
    let blocked = |state| children.iter().find(|(_, child)| *child == state);
    if blocked(Child::NamespaceTerminating).is_some() {
        let message = format!("namespace {namespace} is being deleted; it is made again after");
        return NewCondition::new(READY, false, "NamespaceTerminating", message);
    }
    if let Some(("Namespace", _)) = blocked(Child::Foreign) {
        let message = format!("namespace {namespace} exists and is not this Tenant's; untouched");
        return NewCondition::new(READY, false, "NamespaceNotOwned", message);
    }
    if let Some((kind, _)) = blocked(Child::Foreign) {
        let message = format!("{kind} {namespace}/{CHILD_NAME} exists and is not this Tenant's");
        return NewCondition::new(READY, false, "NotOwned", message);
    }
    let message = format!("namespace {namespace} has its quota, limits and {ROLE} binding");
    NewCondition::new(READY, true, "Provisioned", message)
}

async fn reconcile(tenant: Arc<Tenant>, ctx: Arc<Context>) -> Result<Outcome, Error> {
    let (tools, statuses) = &*ctx;
    let tenant = &*statuses.latest(&tenant);
    if tenant.metadata.deletion_timestamp.is_some() {
        // The garbage collector deletes the namespace; writing now would only recreate it.
        return Ok(Outcome::Done);
    }
    let name = tenant.namespace_name();
    let namespace = tools.ensure(tenant, &desired_namespace(tenant)?).await?;
    let owned = namespace != Child::Foreign;
    let mut children = vec![("Namespace", namespace)];
    if owned {
        let (quota, limits, binding) = desired_contents(tenant)?;
        children.push(("ResourceQuota", tools.ensure(tenant, &quota).await?));
        children.push(("LimitRange", tools.ensure(tenant, &limits).await?));
        children.push(("RoleBinding", tools.ensure(tenant, &binding).await?));
    }
    let ready = ready_condition(&name, &children);
    let generation = tenant.metadata.generation;
    let mut status = tenant.status.clone().unwrap_or_default();
    status.namespace = owned.then_some(name);
    status.observed_generation = generation;
    let now = conditions::now();
    conditions::set(&mut status.conditions, ready, generation, &now);
    statuses.write(tenant, status, Progress::Settled).await?;
    if !owned {
        return Ok(Outcome::RequeueAfter(FOREIGN_RECHECK));
    }
    Ok(Outcome::Done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use apis::TenantSpec;
    use kube_operator_runtime::testing;

    fn tenant(namespace: Option<&str>) -> Tenant {
        let mut tenant = Tenant::new(
            "team-a",
            TenantSpec {
                namespace: namespace.map(str::to_owned),
                group: "team-a-devs".into(),
                quota: BTreeMap::from([("pods".to_owned(), Quantity("10".into()))]),
            },
        );
        tenant.metadata.uid = Some("uid-t".into());
        tenant
    }

    #[test]
    fn the_namespace_is_cluster_scoped_and_the_tenants() {
        let namespace = desired_namespace(&tenant(None)).expect("desired namespace");
        assert_eq!(namespace.metadata.name.as_deref(), Some("team-a"));
        assert_eq!(namespace.metadata.namespace, None);
        testing::assert_controlled_by(&namespace.metadata, "Tenant", "uid-t");
        let named = desired_namespace(&tenant(Some("a-apps"))).expect("desired namespace");
        assert_eq!(named.metadata.name.as_deref(), Some("a-apps"));
    }

    #[test]
    fn quota_limits_and_binding_live_in_the_tenants_namespace() {
        let (quota, limits, binding) = desired_contents(&tenant(Some("a-apps"))).expect("desired");
        for meta in [&quota.metadata, &limits.metadata, &binding.metadata] {
            assert_eq!(meta.namespace.as_deref(), Some("a-apps"));
            testing::assert_controlled_by(meta, "Tenant", "uid-t");
        }
        let hard = quota.spec.and_then(|s| s.hard).expect("hard limits");
        assert_eq!(hard.get("pods"), Some(&Quantity("10".into())));
        let item = &limits.spec.expect("limits").limits[0];
        assert_eq!(item.type_, "Container");
        assert!(item.default.is_some() && item.default_request.is_some());
        assert_eq!(binding.role_ref.name, "edit");
        let subjects = binding.subjects.expect("subjects");
        assert_eq!(
            (subjects[0].kind.as_str(), subjects[0].name.as_str()),
            ("Group", "team-a-devs")
        );
    }

    #[test]
    fn ready_only_when_every_child_is_in_place() {
        let written = [
            ("ResourceQuota", Child::Written),
            ("RoleBinding", Child::Current),
        ];
        let ready = ready_condition("a", &written);
        assert!(ready.status, "{ready:?}");
        let foreign = [
            ("ResourceQuota", Child::Current),
            ("RoleBinding", Child::Foreign),
        ];
        let blocked = ready_condition("a", &foreign);
        assert_eq!(
            (blocked.status, blocked.reason.as_str()),
            (false, "NotOwned")
        );
        assert!(
            blocked.message.contains("RoleBinding a/tenant"),
            "{}",
            blocked.message
        );
        let theirs = [("Namespace", Child::Foreign)];
        let refused = ready_condition("kube-system", &theirs);
        assert_eq!(
            (refused.status, refused.reason.as_str()),
            (false, "NamespaceNotOwned")
        );
        let terminating = [("ResourceQuota", Child::NamespaceTerminating)];
        let waiting = ready_condition("a", &terminating);
        assert_eq!(
            (waiting.status, waiting.reason.as_str()),
            (false, "NamespaceTerminating")
        );
    }

    /// A Tenant's first reconcile against an API server that has nothing yet: it creates the
    /// namespace, then the quota, limits and binding inside it, and reports Ready.
    #[tokio::test]
    async fn a_first_reconcile_creates_everything_and_reports_ready() {
        use kube_operator_runtime::fake::ApiServer;
        let server = ApiServer::answering(|request| match request.method.as_str() {
            // A create is answered with what was sent, as stored.
            "POST" | "PATCH" => (201, request.body.clone()),
            // Every list (the caches' first) is empty, and so is every watch.
            _ => (
                200,
                serde_json::json!({"kind": "List", "metadata": {}, "items": []}),
            ),
        });
        let ctx = RunContext::new(server.client(), CONTROLLER.rbac_rules).expect("metrics");
        let tools = Builder::<Tenant>::new(NAME, &ctx)
            .owns_kind::<Namespace>()
            .owns_kind::<ResourceQuota>()
            .owns_kind::<LimitRange>()
            .owns_kind::<RoleBinding>()
            .tools();
        let mut tenant = tenant(Some("a-apps"));
        tenant.metadata.generation = Some(1);
        let context = Arc::new(with_status_writer(tools));
        let outcome = reconcile(Arc::new(tenant), context)
            .await
            .expect("reconciled");
        assert_eq!(outcome, Outcome::Done);

        let writes: Vec<(String, String)> = server
            .requests()
            .into_iter()
            .filter(|r| r.method != "GET" && !r.path.ends_with("/events"))
            .map(|r| (r.method, r.path))
            .collect();
        let expected = [
            ("POST", "/api/v1/namespaces"),
            ("POST", "/api/v1/namespaces/a-apps/resourcequotas"),
            ("POST", "/api/v1/namespaces/a-apps/limitranges"),
            (
                "POST",
                "/apis/rbac.authorization.k8s.io/v1/namespaces/a-apps/rolebindings",
            ),
            (
                "PATCH",
                concat!(
                    "/apis/",
                    product::group!(platform),
                    "/v1alpha1/tenants/team-a/status"
                ),
            ),
        ];
        let expected: Vec<(String, String)> = expected
            .iter()
            .map(|(m, p)| ((*m).to_owned(), (*p).to_owned()))
            .collect();
        assert_eq!(writes, expected);
        let status = server
            .requests()
            .into_iter()
            .find(|r| r.path.ends_with("/status"))
            .map(|r| r.body)
            .expect("a status write");
        assert_eq!(status["status"]["namespace"], "a-apps");
        assert_eq!(status["status"]["conditions"][0]["reason"], "Provisioned");
    }

    #[test]
    fn rbac_rules_cover_what_the_controller_writes() {
        let rules = CONTROLLER.rbac_rules;
        for resource in ["namespaces", "resourcequotas", "limitranges"] {
            assert!(rbac::missing(rules, "", resource, rbac::MANAGE).is_empty());
        }
        let group = "rbac.authorization.k8s.io";
        assert!(rbac::missing(rules, group, "rolebindings", rbac::MANAGE).is_empty());
        assert!(
            !rbac::allows(rules, group, "clusterroles", "bind"),
            "bind only the roles named"
        );
        let bind = rules
            .iter()
            .find(|r| r.resources == ["clusterroles"])
            .expect("bind");
        assert_eq!(
            (bind.verbs, bind.resource_names),
            (&["bind"][..], &["edit"][..])
        );
    }
}
