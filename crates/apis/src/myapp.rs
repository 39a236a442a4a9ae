//! `MyApp` (`myscheme.example.com/v1`): a stateless application run from an image.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

product::custom_resource! {
    myscheme,
    /// Desired state of an application.
    #[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
    #[kube(
        version = "v1",
        kind = "MyApp",
        plural = "myapps",
        namespaced,
        status = "MyAppStatus",
        derive = "PartialEq",
        doc = "An application managed by the platform: a Deployment of `spec.replicas` pods running `spec.image`.",
        printcolumn(
            name = "Replicas",
            type_ = "integer",
            json_path = ".spec.replicas",
            description = "Desired number of pods"
        ),
        printcolumn(
            name = "Ready",
            type_ = "integer",
            json_path = ".status.readyReplicas",
            description = "Pods that are ready"
        ),
        printcolumn(
            name = "Image",
            type_ = "string",
            json_path = ".spec.image",
            priority = 1
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
    pub struct MyAppSpec {
        /// Number of pods to run (0 or more). Defaults to 1.
        #[serde(default = "default_replicas")]
        #[schemars(range(min = 0))]
        pub replicas: i32,

        /// Container image the application runs, for example `nginx:1.29`.
        #[schemars(length(min = 1))]
        pub image: String,
    }
}

fn default_replicas() -> i32 {
    1
}

/// Observed state of an application, written by the controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MyAppStatus {
    /// Number of pods the Deployment currently has.
    #[serde(default)]
    pub replicas: i32,

    /// Number of pods that are ready to serve.
    #[serde(default)]
    pub ready_replicas: i32,

    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Standard conditions: `Available`, `Progressing` and `Degraded`.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// The conditions, for code that reads any status that reports them.
impl AsRef<[Condition]> for MyAppStatus {
    fn as_ref(&self) -> &[Condition] {
        &self.conditions
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;
    use serde_json::{Value, json};

    fn spec_schema() -> Value {
        let crd = serde_json::to_value(MyApp::crd()).expect("CRD serializes");
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"].clone()
    }

    #[test]
    fn group_version_and_status_subresource() {
        let crd = serde_json::to_value(MyApp::crd()).expect("CRD serializes");
        assert_eq!(
            crd["metadata"]["name"],
            concat!("myapps.", product::group!(myscheme))
        );
        assert_eq!(crd["spec"]["versions"][0]["name"], "v1");
        assert_eq!(crd["spec"]["scope"], "Namespaced");
        assert_eq!(
            crd["spec"]["versions"][0]["subresources"]["status"],
            json!({})
        );
    }

    #[test]
    fn image_required_replicas_non_negative_with_default() {
        let spec = spec_schema();
        assert_eq!(spec["required"], json!(["image"]));
        assert_eq!(spec["properties"]["image"]["minLength"], 1);
        let replicas = &spec["properties"]["replicas"];
        assert_eq!(replicas["minimum"].as_f64(), Some(0.0));
        assert!(replicas["maximum"].is_null());
        assert_eq!(replicas["default"], 1);
        assert_eq!(replicas["format"], "int32");
    }

    #[test]
    fn image_is_required_when_deserializing() {
        let err = serde_json::from_value::<MyAppSpec>(json!({"replicas": 2}))
            .expect_err("image is required");
        assert!(err.to_string().contains("image"), "{err}");
    }
}
