//! `Memcached` (`cache.example.com/v1beta1`): v1alpha1 plus what the seed's fixed `-m=64`
//! cannot express, the memory memcached may use for items and the resources of each pod.
//!
//! Objects of either version are the same objects: the API server stores one version and asks
//! the manager's conversion webhook ([`super::conversion`]) for the other.

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{MemcachedStatus, default_image};

/// The item memory when `spec.memory` is not set: the seed's `-m=64`.
pub const DEFAULT_MEMORY: &str = "64Mi";

product::custom_resource! {
    cache,
    /// Desired state of a memcached cluster.
    #[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
    #[kube(
        version = "v1beta1",
        kind = "Memcached",
        plural = "memcacheds",
        shortname = "mc",
        namespaced,
        status = "MemcachedStatus",
        derive = "PartialEq",
        doc = "A memcached cluster managed by the platform: a Deployment of `spec.size` memcached pods, each with `spec.memory` for items.",
        printcolumn(
            name = "Size",
            type_ = "integer",
            json_path = ".spec.size",
            description = "Desired number of memcached pods"
        ),
        printcolumn(
            name = "Memory",
            type_ = "string",
            json_path = ".spec.memory",
            description = "Memory each pod's memcached may use for items"
        ),
        printcolumn(
            name = "Ready",
            type_ = "integer",
            json_path = ".status.readyReplicas",
            description = "Memcached pods that are ready"
        ),
        printcolumn(
            name = "Available",
            type_ = "string",
            json_path = ".status.conditions[?(@.type==\"Available\")].status",
            description = "Whether every desired pod is ready"
        ),
        printcolumn(
            name = "Age",
            type_ = "date",
            json_path = ".metadata.creationTimestamp"
        )
    )]
    #[serde(rename_all = "camelCase")]
    pub struct MemcachedSpec {
        /// Number of memcached pods to run, from 0 to 100. 0 keeps the object but stops every pod.
        #[schemars(range(min = 0, max = 100))]
        pub size: i32,

        /// Container image for the memcached pods. Defaults to a current memcached 1.6 Alpine image.
        #[serde(default = "default_image")]
        #[schemars(length(min = 1))]
        pub image: String,

        /// Memory each memcached may use for items (its `-m`), as a quantity such as `64Mi` or
        /// `1Gi`, from 1Mi, in whole MiB. Defaults to 64Mi. Must fit in `resources.limits.memory`
        /// when both are set.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub memory: Option<Quantity>,

        /// CPU and memory of each memcached container. Without a memory request, the admission
        /// webhook requests `memory` plus memcached's own overhead.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub resources: Option<ResourceRequirements>,
    }
}

impl Default for MemcachedSpec {
    /// No pods, the default image and memory, no resources.
    fn default() -> Self {
        Self::new(0, default_image())
    }
}

impl MemcachedSpec {
    /// A spec of `size` pods of `image`, with the default memory and no resources.
    pub fn new(size: i32, image: impl Into<String>) -> Self {
        Self {
            size,
            image: image.into(),
            memory: None,
            resources: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;
    use serde_json::json;

    #[test]
    fn the_new_fields_are_optional_and_documented() {
        let crd = serde_json::to_value(Memcached::crd()).expect("CRD serializes");
        let version = &crd["spec"]["versions"][0];
        assert_eq!(version["name"], "v1beta1");
        let spec = &version["schema"]["openAPIV3Schema"]["properties"]["spec"];
        assert_eq!(spec["required"], json!(["size"]));
        for field in ["memory", "resources"] {
            assert!(
                spec["properties"][field]["description"].is_string(),
                "spec.{field} is documented: {}",
                spec["properties"][field]
            );
        }
        assert_eq!(
            spec["properties"]["memory"]["x-kubernetes-int-or-string"],
            true
        );
    }

    #[test]
    fn unset_fields_stay_out_of_the_object() {
        let mc = Memcached::new("m", MemcachedSpec::new(3, "memcached:1.6"));
        let value = serde_json::to_value(&mc).expect("serializes");
        assert_eq!(value["spec"], json!({"size": 3, "image": "memcached:1.6"}));
    }
}
