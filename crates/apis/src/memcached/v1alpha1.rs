//! `Memcached` (`cache.example.com/v1alpha1`), the seed's version: a memcached cluster of a
//! given size and image. Still served; the API server stores [`super::v1beta1`] and converts.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[cfg(test)]
use super::DEFAULT_IMAGE;
use super::{MemcachedStatus, default_image};

product::custom_resource! {
    cache,
    /// Desired state of a memcached cluster.
    #[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
    #[kube(
        version = "v1alpha1",
        kind = "Memcached",
        plural = "memcacheds",
        shortname = "mc",
        namespaced,
        status = "MemcachedStatus",
        derive = "PartialEq",
        doc = "A memcached cluster managed by the platform: a Deployment of `spec.size` memcached pods.",
        printcolumn(
            name = "Size",
            type_ = "integer",
            json_path = ".spec.size",
            description = "Desired number of memcached pods"
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;
    use serde_json::{Value, json};

    fn crd() -> Value {
        serde_json::to_value(Memcached::crd()).expect("CRD serializes")
    }

    fn schema(crd: &Value) -> &Value {
        &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    }

    #[test]
    fn names_scope_and_version() {
        let crd = crd();
        assert_eq!(
            crd["metadata"]["name"],
            concat!("memcacheds.", product::group!(cache))
        );
        assert_eq!(crd["spec"]["group"], product::group!(cache));
        assert_eq!(crd["spec"]["scope"], "Namespaced");
        assert_eq!(crd["spec"]["names"]["kind"], "Memcached");
        assert_eq!(crd["spec"]["names"]["plural"], "memcacheds");
        assert_eq!(crd["spec"]["names"]["shortNames"], json!(["mc"]));
        let version = &crd["spec"]["versions"][0];
        assert_eq!(version["name"], "v1alpha1");
        assert_eq!(version["served"], true);
        assert_eq!(version["storage"], true);
        assert_eq!(version["subresources"]["status"], json!({}));
    }

    #[test]
    fn size_is_required_and_bounded() {
        let crd = crd();
        let spec = &schema(&crd)["properties"]["spec"];
        assert_eq!(spec["required"], json!(["size"]));
        let size = &spec["properties"]["size"];
        assert_eq!(size["type"], "integer");
        assert_eq!(size["format"], "int32");
        assert_eq!(size["minimum"].as_f64(), Some(0.0));
        assert_eq!(size["maximum"].as_f64(), Some(100.0));
        assert!(
            size["description"]
                .as_str()
                .is_some_and(|d| d.contains("0 to 100")),
            "size is documented for kubectl explain: {size}"
        );
    }

    #[test]
    fn image_defaults_in_schema() {
        let crd = crd();
        let image = &schema(&crd)["properties"]["spec"]["properties"]["image"];
        assert_eq!(image["type"], "string");
        assert_eq!(image["default"], DEFAULT_IMAGE);
        assert_eq!(image["minLength"], 1);
    }

    #[test]
    fn status_is_optional() {
        let crd = crd();
        let root = schema(&crd);
        let required = root["required"].as_array().cloned().unwrap_or_default();
        assert!(
            !required.contains(&json!("status")),
            "status must be optional: {required:?}"
        );
        let status = &root["properties"]["status"];
        assert!(
            status["required"].is_null(),
            "no status field is required: {status}"
        );
        for field in ["nodes", "readyReplicas", "observedGeneration", "conditions"] {
            assert!(
                status["properties"][field].is_object(),
                "status.{field} is in the schema"
            );
        }
        assert_eq!(
            status["properties"]["conditions"]["x-kubernetes-list-type"],
            "map"
        );
    }

    #[test]
    fn printer_columns() {
        let crd = crd();
        let columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let names: Vec<&str> = columns.iter().filter_map(|c| c["name"].as_str()).collect();
        assert_eq!(names, ["Size", "Ready", "Available", "Age"]);
        assert_eq!(columns[0]["jsonPath"], ".spec.size");
        assert_eq!(columns[3]["type"], "date");
    }

    #[test]
    fn a_new_object_round_trips_without_status() {
        let mc: Memcached = serde_json::from_value(json!({
            "apiVersion": concat!(product::group!(cache), "/v1alpha1"),
            "kind": "Memcached",
            "metadata": {"name": "m"},
            "spec": {"size": 3}
        }))
        .expect("minimal object deserializes");
        assert_eq!(mc.spec.size, 3);
        assert_eq!(mc.spec.image, DEFAULT_IMAGE);
        assert!(mc.status.is_none());
    }
}
