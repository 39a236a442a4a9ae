//! `KeyValueStore` (`cache.example.com/v1alpha1`, short name `kvs`): a redis-protocol key-value
//! server with persistent storage, one StatefulSet pod per replica.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The image used when `spec.image` is not set: the distribution's redis server, as
/// `cargo xtask image` packages it for the local cluster.
pub const DEFAULT_IMAGE: &str = concat!(product::name!(), ".local/redis:7.0.15");
/// The memory the server keeps its data in when `spec.maxMemory` is not set.
pub const DEFAULT_MAX_MEMORY: &str = "64Mi";
/// The size of each replica's volume when `spec.storage` is not set.
pub const DEFAULT_STORAGE: &str = "1Gi";

product::custom_resource! {
    cache,
    /// Desired state of a key-value store.
    #[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
    #[kube(
        version = "v1alpha1",
        kind = "KeyValueStore",
        plural = "keyvaluestores",
        shortname = "kvs",
        namespaced,
        status = "KeyValueStoreStatus",
        derive = "PartialEq",
        doc = "A key-value server speaking the redis protocol: a StatefulSet of `spec.replicas` pods, each with a volume of `spec.storage`, configured from a ConfigMap (a change rolls the pods), behind a headless Service. Deleting it deletes the volumes too.",
        printcolumn(
            name = "Replicas",
            type_ = "integer",
            json_path = ".spec.replicas",
            description = "Desired number of pods"
        ),
        printcolumn(
            name = "Ready",
            type_ = "string",
            json_path = ".status.conditions[?(@.type==\"Ready\")].status",
            description = "Whether every pod runs the current configuration and is ready"
        ),
        printcolumn(
            name = "Age",
            type_ = "date",
            json_path = ".metadata.creationTimestamp"
        )
    )]
    #[serde(rename_all = "camelCase")]
    pub struct KeyValueStoreSpec {
        /// Number of pods, 1 to 7. Defaults to 1.
        #[serde(default = "default_replicas")]
        #[schemars(range(min = 1, max = 7))]
        pub replicas: i32,

        /// Container image of the server; it must run `redis-server`.
        #[serde(default = "default_image")]
        #[schemars(length(min = 1))]
        pub image: String,

        /// The memory the server keeps its data in (its `maxmemory`), a quantity such as `64Mi`.
        #[serde(default = "default_max_memory")]
        pub max_memory: Quantity,

        /// Extra lines of the server's configuration, by directive (`maxmemory-policy:
        /// allkeys-lru`). A change rolls the pods.
        #[serde(default)]
        pub config: BTreeMap<String, String>,

        /// The size of each pod's volume, a quantity such as `1Gi`.
        #[serde(default = "default_storage")]
        pub storage: Quantity,

        /// The StorageClass of the volumes; the cluster's default when unset.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub storage_class_name: Option<String>,
    }
}

fn default_replicas() -> i32 {
    1
}

fn default_image() -> String {
    DEFAULT_IMAGE.to_owned()
}

fn default_max_memory() -> Quantity {
    Quantity(DEFAULT_MAX_MEMORY.to_owned())
}

fn default_storage() -> Quantity {
    Quantity(DEFAULT_STORAGE.to_owned())
}

/// Observed state of a key-value store, written by the controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeyValueStoreStatus {
    /// Pods that are ready to serve.
    #[serde(default)]
    pub ready_replicas: i32,

    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Ready`: every pod runs the current configuration and is ready.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// The conditions, for code that reads any status that reports them.
impl AsRef<[Condition]> for KeyValueStoreStatus {
    fn as_ref(&self) -> &[Condition] {
        &self.conditions
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;
    use serde_json::json;

    #[test]
    fn short_name_bounds_and_defaults() {
        let crd = serde_json::to_value(KeyValueStore::crd()).expect("CRD serializes");
        assert_eq!(
            crd["metadata"]["name"],
            concat!("keyvaluestores.", product::group!(cache))
        );
        assert_eq!(crd["spec"]["names"]["shortNames"], json!(["kvs"]));
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let replicas = &spec["properties"]["replicas"];
        assert_eq!(
            (replicas["minimum"].as_f64(), replicas["maximum"].as_f64()),
            (Some(1.0), Some(7.0))
        );
        assert_eq!(
            spec["properties"]["maxMemory"]["default"],
            DEFAULT_MAX_MEMORY
        );
        assert_eq!(spec["properties"]["image"]["default"], DEFAULT_IMAGE);
    }

    #[test]
    fn an_empty_spec_reads_with_every_default() {
        let spec: KeyValueStoreSpec = serde_json::from_value(json!({})).expect("defaults");
        assert_eq!(spec.replicas, 1);
        assert_eq!(spec.storage, Quantity(DEFAULT_STORAGE.into()));
        assert!(spec.config.is_empty() && spec.storage_class_name.is_none());
    }
}
