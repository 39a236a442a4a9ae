//! The KeyValueStore controller: for every `KeyValueStore`, a StatefulSet of redis servers,
//! each with a volume of its own, configured from a ConfigMap, behind a headless Service.
//!
//! The configuration's hash is an annotation of the pod template, so a change of it rolls the
//! pods. `Ready` follows the StatefulSet's rollout. The volumes outlive the StatefulSet (that is
//! what a StatefulSet's claims are for), so the controller holds a finalizer: when the store is
//! deleted it deletes the StatefulSet, then the volume claims, and lets the store go once none
//! is left.

use std::sync::Arc;
use std::time::Duration;

use apis::KeyValueStore;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Service};
use kube::api::ObjectMeta;
use kube::{Resource, ResourceExt};
use serde_json::json;

use kube_operator_runtime::conditions::{self, READY};
use kube_operator_runtime::{Builder, Child, Error, NewCondition, Outcome, PolicyRule, Progress};
use kube_operator_runtime::{Registration, Rollout, RunContext, Workload, labels, rbac};
use kube_operator_runtime::{desired, owned_metadata, pod_security, quantity, with_status_writer};

/// The controller's name: metrics label, configuration key, log field.
pub const NAME: &str = "keyvaluestore";
/// The finalizer that keeps a store until its volumes are gone.
pub const FINALIZER: &str = concat!(product::group!(cache), "/volumes");
/// The port the servers listen on.
pub const PORT: i32 = 6379;
/// The server program, found on the image's `PATH`.
pub const PROGRAM: &str = "redis-server";
/// The user the server runs as (the distribution package's `redis` user).
pub const RUN_AS_USER: i64 = 999;
/// The pod template annotation holding the configuration's hash.
pub const CONFIG_HASH: &str = concat!(product::group!(cache), "/config-hash");
/// The name of each pod's volume claim template (the claims are `data-<store>-<ordinal>`).
pub const DATA: &str = "data";
/// How often a deletion looks again for the volume claims it is waiting on.
const CLEANUP_RECHECK: Duration = Duration::from_secs(2);

/// The KeyValueStore controller, as registered in [`crate::all`].
pub const CONTROLLER: Registration = Registration::new(NAME, &RULES, |ctx| Box::pin(run(ctx)))
    .with_samples(crate::samples::keyvaluestore);

static RULES: [PolicyRule; 8] = kube_operator_runtime::controller_rules!(
    finalizer,
    product::group!(cache),
    "keyvaluestores",
    rbac::owns_and_deletes::<StatefulSet>(),
    rbac::owns::<ConfigMap>(),
    rbac::owns::<Service>(),
    rbac::uses::<PersistentVolumeClaim>(&["list", "delete"]),
);

type Context = kube_operator_runtime::Context<KeyValueStore>;

async fn run(ctx: RunContext) -> Result<(), Error> {
    Builder::<KeyValueStore>::new(NAME, &ctx)
        .owns_whole::<StatefulSet>()
        .owns_kind::<ConfigMap>()
        .owns_kind::<Service>()
        .uses::<PersistentVolumeClaim>(&["list", "delete"])
        .uses::<StatefulSet>(&["delete"])
        .run_with_finalizer(FINALIZER, with_status_writer, reconcile, cleanup)
        .await
}

fn metadata(kvs: &KeyValueStore, name: String) -> Result<ObjectMeta, Error> {
    let labels = labels::managed_instance(NAME, &kvs.name_any());
    owned_metadata(kvs, name, kvs.namespace(), labels)
}

/// The server's configuration file: the port, the data directory, `maxmemory` from
/// `spec.maxMemory`, then `spec.config`'s lines. Protected mode is off: without a password it
/// would refuse every client but loopback, and the clients are the store's Service's.
///
/// # Errors
/// [`Error::InvalidSpec`] for a memory that is not a quantity, or a line that would be two.
pub fn config_text(kvs: &KeyValueStore) -> Result<String, Error> {
    let invalid = |field, reason| Error::InvalidSpec { field, reason };
    let memory =
        quantity::mebibytes(&kvs.spec.max_memory.0).map_err(|r| invalid("spec.maxMemory", r))?;
    let mut text = format!("port {PORT}\nprotected-mode no\ndir /data\nappendonly yes\n");
    text.push_str(&format!("maxmemory {memory}mb\n"));
    for (directive, value) in &kvs.spec.config {
        let line = format!("{directive} {value}\n");
        if directive.contains(['\n', ' ']) || value.contains('\n') {
            return Err(invalid("spec.config", format!("{line:?} is not one line")));
        }
        text.push_str(&line);
    }
    Ok(text)
}

/// The ConfigMap holding `config`, the configuration file.
///
/// # Errors
/// [`Error::MissingField`] when `kvs` was not read from the API server.
pub fn desired_config_map(kvs: &KeyValueStore, config: &str) -> Result<ConfigMap, Error> {
    let metadata = metadata(kvs, format!("{}-config", kvs.name_any()))?;
    desired(metadata, json!({"data": {"redis.conf": config}}))
}

/// The headless Service that names each pod (`<pod>.<store>.<namespace>.svc`).
///
/// # Errors
/// [`Error::MissingField`] when `kvs` was not read from the API server.
pub fn desired_service(kvs: &KeyValueStore) -> Result<Service, Error> {
    let selector = labels::instance(NAME, &kvs.name_any());
    let ports = [json!({"name": "redis", "port": PORT})];
    let spec = json!({"clusterIP": "None", "selector": selector, "ports": ports});
    desired(metadata(kvs, kvs.name_any())?, json!({ "spec": spec }))
}

/// The StatefulSet: `spec.replicas` servers reading `config`, each with a claim of
/// `spec.storage`, under the `restricted` Pod Security Standard.
///
/// # Errors
/// [`Error::MissingField`] when `kvs` was not read from the API server.
pub fn desired_stateful_set(kvs: &KeyValueStore, config: &str) -> Result<StatefulSet, Error> {
    let name = kvs.name_any();
    let labels = labels::managed_instance(NAME, &name);
    let server = json!({
        "name": "server",
        "image": kvs.spec.image,
        "command": [PROGRAM, "/etc/redis/redis.conf"],
        "ports": [{"name": "redis", "containerPort": PORT}],
        "volumeMounts": [{"name": DATA, "mountPath": "/data"}, {"name": "config", "mountPath": "/etc/redis"}],
        "securityContext": pod_security::restricted_container_security(RUN_AS_USER),
    });
    let claim = json!({
        "metadata": {"name": DATA, "labels": labels},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": kvs.spec.storage_class_name,
            "resources": {"requests": {"storage": kvs.spec.storage}},
        },
    });
    let pod = json!({
        "metadata": {"labels": labels, "annotations": {CONFIG_HASH: labels::content_hash(config)}},
        "spec": {
            "containers": [server],
            "securityContext": pod_security::restricted_pod_security(RUN_AS_USER),
            "volumes": [{"name": "config", "configMap": {"name": format!("{name}-config")}}],
        },
    });
    let selector = json!({"matchLabels": labels::instance(NAME, &name)});
    let spec = json!({
        "replicas": kvs.spec.replicas,
        "serviceName": name,
        "selector": selector,
        "template": pod,
        "volumeClaimTemplates": [claim],
    });
    desired(metadata(kvs, name)?, json!({ "spec": spec }))
}

/// The `Ready` condition, given what came of the StatefulSet and, when the cache shows it as
/// written, the StatefulSet itself.
pub fn ready(kvs: &KeyValueStore, child: Child, set: Option<&StatefulSet>) -> NewCondition {
    match (child, set) {
        (Child::Current, Some(set)) => Rollout::of(kvs.spec.replicas, set).ready(),
        (Child::Foreign, _) => {
            let message = "a StatefulSet of its name is not this store's; it is left untouched";
            NewCondition::new(READY, false, "NotOwned", message)
        }
        _ => NewCondition::new(READY, false, "Updating", "the StatefulSet is being written"),
    }
}

async fn reconcile(kvs: Arc<KeyValueStore>, ctx: Arc<Context>) -> Result<Outcome, Error> {
    let (tools, statuses) = &*ctx;
    let kvs = &*statuses.latest(&kvs);
    let (name, config) = (kvs.name_any(), config_text(kvs)?);
    let config_map = desired_config_map(kvs, &config)?;
    tools.ensure(kvs, &config_map).await?;
    tools.ensure(kvs, &desired_service(kvs)?).await?;
    let stateful_set = desired_stateful_set(kvs, &config)?;
    let child = tools.ensure(kvs, &stateful_set).await?;
    if child == Child::NamespaceTerminating {
        return Ok(Outcome::Done);
    }
    let set = tools.get::<StatefulSet, StatefulSet>(kvs, kvs.namespace().as_deref(), &name)?;
    let ready = ready(kvs, child, set.as_deref());
    let progress = Progress::settled_if(ready.status || child == Child::Foreign);
    let mut status = kvs.status.clone().unwrap_or_default();
    status.ready_replicas = set.as_deref().map_or(0, Workload::ready);
    status.observed_generation = kvs.meta().generation;
    let now = conditions::now();
    conditions::set(&mut status.conditions, ready, kvs.meta().generation, &now);
    statuses.write(kvs, status, progress).await?;
    Ok(Outcome::Done)
}

/// While the store is being deleted: its StatefulSet first (a claim in use is kept until its
/// pod is gone), then its volume claims; done once none is left.
async fn cleanup(kvs: Arc<KeyValueStore>, ctx: Arc<Context>) -> Result<Outcome, Error> {
    let (tools, namespace, name) = (&ctx.0, kvs.namespace().unwrap_or_default(), kvs.name_any());
    tools.remove::<StatefulSet>(&kvs, &namespace, &name).await?;
    let claims = labels::instance(NAME, &name);
    let left = tools.delete_labelled::<PersistentVolumeClaim>(&namespace, &claims);
    Ok(Outcome::done_or_recheck(left.await? == 0, CLEANUP_RECHECK))
}

#[cfg(test)]
mod tests {
    use super::*;
    use apis::KeyValueStoreSpec;
    use k8s_openapi::api::apps::v1::StatefulSetStatus;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use kube_operator_runtime::fake::ApiServer;
    use kube_operator_runtime::testing;

    fn store(config: &[(&str, &str)]) -> KeyValueStore {
        let config = config
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()));
        let mut kvs = KeyValueStore::new(
            "kv",
            KeyValueStoreSpec {
                replicas: 3,
                image: "redis:7".into(),
                max_memory: Quantity("64Mi".into()),
                config: config.collect(),
                storage: Quantity("2Gi".into()),
                storage_class_name: Some("fast".into()),
            },
        );
        kvs.metadata.namespace = Some("ns".into());
        kvs.metadata.uid = Some("uid-kv".into());
        kvs.metadata.generation = Some(1);
        kvs
    }

    #[test]
    fn the_config_file_holds_the_memory_and_the_extra_lines() {
        let text = config_text(&store(&[("maxmemory-policy", "allkeys-lru")])).expect("valid");
        assert!(text.contains("maxmemory 64mb\n"), "{text}");
        // Without a password, protected mode would refuse every client but loopback.
        assert!(text.contains("protected-mode no\n"), "{text}");
        assert!(text.ends_with("maxmemory-policy allkeys-lru\n"), "{text}");
        let error = config_text(&store(&[("save", "60 1\nrequirepass x")])).expect_err("two lines");
        assert!(error.to_string().contains("spec.config"), "{error}");
        let mut bad = store(&[]);
        bad.spec.max_memory = Quantity("lots".into());
        assert!(config_text(&bad).is_err());
    }

    #[test]
    fn the_stateful_set_runs_restricted_servers_on_claims_of_the_asked_size() {
        let kvs = store(&[]);
        let set = desired_stateful_set(&kvs, "port 6379\n").expect("desired");
        testing::assert_controlled_by(&set.metadata, "KeyValueStore", "uid-kv");
        let spec = set.spec;
        assert_eq!(
            (spec.replicas, spec.service_name.as_deref()),
            (Some(3), Some("kv"))
        );
        testing::assert_selects_its_pods(&spec.selector, &spec.template);
        testing::assert_restricted(&spec.template);
        let claim = &spec.volume_claim_templates.expect("claims")[0];
        let claim_spec = claim.spec.as_ref().expect("claim spec");
        assert_eq!(claim_spec.storage_class_name.as_deref(), Some("fast"));
        let size = claim_spec
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref());
        assert_eq!(
            size.and_then(|r| r.get("storage")),
            Some(&Quantity("2Gi".into()))
        );
    }

    #[test]
    fn a_config_change_changes_the_pod_template() {
        let kvs = store(&[]);
        let hash = |config: &str| {
            let set = desired_stateful_set(&kvs, config).expect("desired");
            let template = set.spec.template.metadata.expect("metadata");
            template.annotations.expect("annotations")[CONFIG_HASH].clone()
        };
        assert_eq!(hash("port 6379\n"), hash("port 6379\n"));
        assert_ne!(hash("port 6379\n"), hash("port 6379\nmaxmemory 1mb\n"));
    }

    #[test]
    fn ready_once_every_pod_runs_the_current_revision() {
        let kvs = store(&[]);
        let mut set = StatefulSet {
            status: Some(StatefulSetStatus {
                replicas: 3,
                ready_replicas: Some(3),
                available_replicas: Some(3),
                updated_replicas: Some(3),
                current_revision: Some("kv-1".into()),
                update_revision: Some("kv-2".into()),
                ..StatefulSetStatus::default()
            }),
            ..StatefulSet::default()
        };
        assert_eq!(ready(&kvs, Child::Current, Some(&set)).reason, "RollingOut");
        if let Some(status) = set.status.as_mut() {
            status.current_revision = Some("kv-2".into());
        }
        assert!(ready(&kvs, Child::Current, Some(&set)).status);
        assert_eq!(ready(&kvs, Child::Written, Some(&set)).reason, "Updating");
        assert_eq!(ready(&kvs, Child::Foreign, None).reason, "NotOwned");
    }

    /// A deletion removes the StatefulSet, then every claim not already going, and waits until
    /// the list comes back empty.
    #[tokio::test]
    async fn cleanup_deletes_the_claims_and_waits_for_them_to_go() {
        let claims = std::sync::Arc::new(std::sync::Mutex::new(2));
        let left = claims.clone();
        let server = ApiServer::answering(move |request| {
            let left = *left
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let claim = |i: i32| serde_json::json!({"metadata": {"name": format!("data-kv-{i}")}});
            match request.method.as_str() {
                "GET" if request.path.ends_with("/persistentvolumeclaims") => {
                    let items: Vec<_> = (0..left).map(claim).collect();
                    (
                        200,
                        serde_json::json!({"kind": "List", "metadata": {}, "items": items}),
                    )
                }
                "GET" => (
                    200,
                    serde_json::json!({"kind": "List", "metadata": {}, "items": []}),
                ),
                _ => (
                    200,
                    serde_json::json!({"kind": "Status", "status": "Success"}),
                ),
            }
        });
        let ctx = RunContext::new(server.client(), CONTROLLER.rbac_rules).expect("metrics");
        let tools = Builder::<KeyValueStore>::new(NAME, &ctx)
            .owns_whole::<StatefulSet>()
            .tools();
        let context = Arc::new(with_status_writer(tools));
        let kvs = Arc::new(store(&[]));
        let outcome = cleanup(kvs.clone(), context.clone())
            .await
            .expect("cleaned");
        assert_eq!(
            outcome,
            Outcome::RequeueAfter(CLEANUP_RECHECK),
            "two claims left"
        );
        let deleted: Vec<String> = server
            .requests()
            .into_iter()
            .filter(|r| r.method == "DELETE")
            .map(|r| r.path)
            .collect();
        assert_eq!(
            deleted,
            [
                "/api/v1/namespaces/ns/persistentvolumeclaims/data-kv-0",
                "/api/v1/namespaces/ns/persistentvolumeclaims/data-kv-1",
            ]
        );
        *claims
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = 0;
        assert_eq!(cleanup(kvs, context).await.expect("cleaned"), Outcome::Done);
    }

    #[test]
    fn rbac_rules_cover_the_claims_the_cleanup_deletes() {
        let rules = CONTROLLER.rbac_rules;
        for verb in ["list", "delete"] {
            assert!(
                rbac::allows(rules, "", "persistentvolumeclaims", verb),
                "{verb}"
            );
        }
        assert!(!rbac::allows(rules, "", "persistentvolumeclaims", "create"));
        assert!(rbac::missing(rules, "apps", "statefulsets", rbac::MANAGE).is_empty());
    }
}
