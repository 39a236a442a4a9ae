//! The KeyValueStore controller end to end on the fake nodes, with only the generated RBAC: the
//! real StatefulSet controller, scheduler and garbage collector, and volume claims bound to
//! volumes the test makes (the fake nodes mount nothing).

mod workloads;

use std::collections::BTreeMap;

use anyhow::{Result, ensure};
use apis::{KeyValueStore, KeyValueStoreSpec};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube_operator_runtime::conditions::READY;
use serde_json::json;
use workloads::{Env, TIMEOUT, has_condition};

const CLAIMS: &str = "app.kubernetes.io/name=keyvaluestore,app.kubernetes.io/instance=store";

/// A volume for one claim of class `class`, on a path nothing mounts.
fn volume(name: &str, class: &str) -> Result<PersistentVolume> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": class,
            "hostPath": {"path": format!("/tmp/{name}")},
        },
    }))?)
}

/// Waits until the store reports `Ready=True` with `replicas` ready.
async fn ready(env: &Env, replicas: i32) -> Result<()> {
    let stores = env.api::<KeyValueStore>();
    testkit::wait_for(
        &format!("the store to be Ready with {replicas} replicas"),
        TIMEOUT,
        || async {
            let store = stores.get("store").await.map_err(|e| e.to_string())?;
            let status = store.status.unwrap_or_default();
            if status.ready_replicas == replicas && has_condition(&status.conditions, READY, "True")
            {
                Ok(())
            } else {
                Err(format!("{status:?}"))
            }
        },
    )
    .await?;
    Ok(())
}

/// The configuration hash of `set`'s pod template.
fn config_hash(set: &StatefulSet) -> Option<String> {
    let template = set.spec.template.metadata.as_ref()?;
    template
        .annotations
        .as_ref()?
        .get("cache.example.com/config-hash")
        .cloned()
}

#[tokio::test]
async fn a_store_converges_rolls_on_a_config_change_and_takes_its_volumes_along() -> Result<()> {
    let env = Env::start("kvs", None, "keyvaluestore").await?;
    let class = format!("{}-volumes", env.namespace());
    let volumes = Api::<PersistentVolume>::all(env.cluster.client.clone());
    let names: Vec<String> = (0..2).map(|i| format!("{class}-{i}")).collect();
    let result = async {
        for name in &names {
            volumes
                .create(&PostParams::default(), &volume(name, &class)?)
                .await?;
        }
        let store = KeyValueStore::new(
            "store",
            KeyValueStoreSpec {
                replicas: 2,
                image: apis::keyvaluestore::DEFAULT_IMAGE.to_owned(),
                max_memory: Quantity("64Mi".into()),
                config: BTreeMap::new(),
                storage: Quantity("1Gi".into()),
                storage_class_name: Some(class.clone()),
            },
        );
        env.api::<KeyValueStore>()
            .create(&PostParams::default(), &store)
            .await?;
        ready(&env, 2).await?;
        let sets = env.api::<StatefulSet>();
        let before = config_hash(&sets.get("store").await?);
        ensure!(before.is_some(), "the pod template carries the config hash");

        // A config line changes: the pods roll to a template of another hash.
        let patch = json!({"spec": {"config": {"maxmemory-policy": "allkeys-lru"}}});
        env.api::<KeyValueStore>()
            .patch("store", &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        testkit::wait_for("the StatefulSet to roll", TIMEOUT, || async {
            let set = sets.get("store").await.map_err(|e| e.to_string())?;
            let status = set.status.clone().unwrap_or_default();
            let rolled = config_hash(&set) != before
                && status.update_revision.is_some()
                && status.update_revision == status.current_revision
                && status.updated_replicas == Some(2);
            if rolled {
                Ok(())
            } else {
                Err(format!("{status:?}"))
            }
        })
        .await?;
        ready(&env, 2).await?;
        let config = env.kubectl(&[
            "get",
            "configmap",
            "store-config",
            "-o",
            "jsonpath={.data.redis\\.conf}",
        ])?;
        ensure!(config.contains("maxmemory-policy allkeys-lru"), "{config}");

        // Deleting the store deletes its claims before it goes.
        let claims = env.api::<PersistentVolumeClaim>();
        let bound = claims.list(&ListParams::default().labels(CLAIMS)).await?;
        ensure!(
            bound.items.len() == 2,
            "a claim per replica: {}",
            bound.items.len()
        );
        env.api::<KeyValueStore>()
            .delete("store", &DeleteParams::default())
            .await?;
        testkit::wait_for("the store and its claims to be gone", TIMEOUT, || async {
            let left = claims
                .list(&ListParams::default().labels(CLAIMS))
                .await
                .map_err(|e| e.to_string())?;
            let store = env
                .api::<KeyValueStore>()
                .get_opt("store")
                .await
                .map_err(|e| e.to_string())?;
            if left.items.is_empty() && store.is_none() {
                Ok(())
            } else {
                Err(format!(
                    "{} claims, store {}",
                    left.items.len(),
                    store.is_some()
                ))
            }
        })
        .await?;
        Ok(())
    }
    .await;
    for name in &names {
        let _ = volumes.delete(name, &DeleteParams::default()).await;
    }
    env.finish(result)
}
