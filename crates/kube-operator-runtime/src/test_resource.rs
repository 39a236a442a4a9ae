//! The custom resource the runtime's unit tests reconcile: a cache of `size` pods, with the
//! status shape of a workload that owns a Deployment.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The desired state of a test cache.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cache.example.com",
    version = "v1beta1",
    kind = "Memcached",
    namespaced,
    status = "MemcachedStatus"
)]
pub struct MemcachedSpec {
    /// How many pods.
    pub size: i32,
    /// Their image.
    #[serde(default)]
    pub image: String,
    /// Item memory, a quantity; the newer version's field that the older one lacks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
}

/// The observed state of a test cache.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemcachedStatus {
    /// Names of its pods.
    #[serde(default)]
    pub nodes: Vec<String>,
    /// Ready pods.
    #[serde(default)]
    pub ready_replicas: i32,
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Available`, `Progressing`, `Degraded`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

impl AsRef<[Condition]> for MemcachedStatus {
    fn as_ref(&self) -> &[Condition] {
        &self.conditions
    }
}

/// The annotation in which [`convert`] keeps `spec.memory` on the older version.
pub const PRESERVED_FIELDS: &str = "cache.example.com/preserved-fields";

/// Converts a test cache between `v1alpha1` (no `spec.memory`) and `v1beta1`, keeping the
/// memory in an annotation on the way down.
pub fn convert(mut object: serde_json::Value, desired: &str) -> Result<serde_json::Value, String> {
    let down = match desired {
        "cache.example.com/v1alpha1" => true,
        "cache.example.com/v1beta1" => false,
        other => return Err(format!("unknown version {other}")),
    };
    if down && let Some(memory) = object["spec"]["memory"].take().as_str() {
        let kept = serde_json::json!({ "memory": memory }).to_string();
        object["metadata"]["annotations"][PRESERVED_FIELDS] = kept.into();
        if let Some(spec) = object["spec"].as_object_mut() {
            spec.remove("memory");
        }
    }
    object["apiVersion"] = desired.into();
    Ok(object)
}
