//! `Memcached`: a memcached cluster of a given size, in two versions of `cache.example.com`.
//!
//! - [`v1beta1`], the version the API server stores and the controller works on, with the
//!   memory and resources of each pod; re-exported here and at the crate root.
//! - [`v1alpha1`], the seed's version (size and image), still served: the API server asks the
//!   manager's webhook to [`conversion`] between the two, losing nothing either way.
//!
//! v1beta1 is stored because it holds every field: a v1alpha1 write keeps the fields it lacks
//! through the conversion, and nothing stored ever needs the annotation that carries them.

pub mod conversion;
pub mod v1alpha1;
pub mod v1beta1;

pub use v1beta1::{Memcached, MemcachedSpec};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The image used when `spec.image` is not set. Written into the CRD schema as the default, so
/// the API server fills it in and `kubectl get -o yaml` shows what actually runs.
pub const DEFAULT_IMAGE: &str = "memcached:1.6.39-alpine";

pub(crate) fn default_image() -> String {
    DEFAULT_IMAGE.to_owned()
}

/// Observed state of a memcached cluster, written by the controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemcachedStatus {
    /// Names of the memcached pods that belong to this cluster, sorted.
    #[serde(default)]
    pub nodes: Vec<String>,

    /// Number of memcached pods that are ready to serve.
    #[serde(default)]
    pub ready_replicas: i32,

    /// The Service in front of the memcached pods (same name, port `memcached`), once it
    /// exists; clients connect to `<service>.<namespace>.svc:11211`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,

    /// The `metadata.generation` this status describes; when it lags behind, the controller has
    /// not yet acted on the latest spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Standard conditions: `Available`, `Progressing` and `Degraded`.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// The conditions, for code that reads any status that reports them.
impl AsRef<[Condition]> for MemcachedStatus {
    fn as_ref(&self) -> &[Condition] {
        &self.conditions
    }
}

/// Every version's CRD merged into one, v1beta1 stored.
///
/// # Errors
/// When the versions disagree on what must be shared (names, scope), which the types prevent.
pub fn crd() -> Result<
    k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    kube::core::crd::MergeError,
> {
    use kube::CustomResourceExt as _;
    kube::core::crd::merge_crds(
        vec![v1alpha1::Memcached::crd(), v1beta1::Memcached::crd()],
        STORAGE_VERSION,
    )
}

/// The version the API server stores.
pub const STORAGE_VERSION: &str = "v1beta1";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_versions_are_served_and_v1beta1_is_stored() {
        let crd = crd().expect("the versions merge");
        let mut versions: Vec<(&str, bool, bool)> = crd
            .spec
            .versions
            .iter()
            .map(|v| (v.name.as_str(), v.served, v.storage))
            .collect();
        versions.sort_unstable();
        assert_eq!(
            versions,
            [("v1alpha1", true, false), ("v1beta1", true, true)]
        );
    }
}
