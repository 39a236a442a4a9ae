//! A component the local cluster runs on its real node (OLM, the local-path provisioner), as
//! its own manifests would install it: a namespace whose pods go to the real node, a
//! ServiceAccount and its bindings, and a Deployment of one replica running an image loaded
//! into the node.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, DynamicObject};
use localcluster::node::NodeState;
use ociimage::Image;
use serde_json::{Value, json};

const RBAC: &str = "rbac.authorization.k8s.io";

/// One component: its Deployment's name (also its `app` label), its namespace and the
/// ServiceAccount it runs as.
#[derive(Clone, Copy, Debug)]
pub struct Component<'a> {
    pub name: &'a str,
    pub namespace: &'a str,
    pub service_account: &'a str,
}

impl Component<'_> {
    /// The component's namespace, its pods steered to the real node.
    pub fn namespace(&self) -> Value {
        on_real_node(self.namespace)
    }

    pub fn service_account(&self) -> Value {
        json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": self.service_account, "namespace": self.namespace},
        })
    }

    /// A ClusterRoleBinding `name` of the ClusterRole `role` to the ServiceAccount.
    pub fn cluster_role_binding(&self, name: &str, role: &str) -> Value {
        json!({
            "apiVersion": format!("{RBAC}/v1"), "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": role},
            "subjects": [self.subject()],
        })
    }

    /// A RoleBinding `name` of the Role `role`, both in the component's namespace, to the
    /// ServiceAccount.
    pub fn role_binding(&self, name: &str, role: &str) -> Value {
        json!({
            "apiVersion": format!("{RBAC}/v1"), "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": self.namespace},
            "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": role},
            "subjects": [self.subject()],
        })
    }

    fn subject(&self) -> Value {
        json!({"kind": "ServiceAccount", "name": self.service_account, "namespace": self.namespace})
    }

    /// The Deployment: one replica of `container` (named after the component, its image never
    /// pulled, dropping every capability on a read-only root) as a non-root user, with
    /// `volumes`.
    pub fn deployment(&self, mut container: Value, volumes: Value) -> Value {
        container["name"] = json!(self.name);
        container["imagePullPolicy"] = json!("Never");
        container["securityContext"] = json!({
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true,
            "capabilities": {"drop": ["ALL"]},
        });
        let labels = json!({"app": self.name});
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": self.name, "namespace": self.namespace, "labels": labels},
            "spec": {
                "replicas": 1,
                "strategy": {"type": "Recreate"},
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": self.service_account,
                        "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                        "volumes": volumes,
                        "containers": [container],
                    },
                },
            },
        })
    }
}

/// Writes `image` next to the component's `binary`, imports it into the real node's containerd
/// and returns its full name.
pub fn load(image: Image, binary: &Path, node: &NodeState) -> anyhow::Result<String> {
    let reference = image.reference();
    let archive = binary.with_file_name(format!(
        "{}-{}.oci.tar",
        reference.short_name(),
        reference.tag()
    ));
    let built = image
        .write(&archive)
        .with_context(|| format!("writing the image {reference}"))?;
    ociimage::import_into_containerd(&built.archive, &built.reference, &node.containerd_socket)?;
    Ok(built.reference.normalized())
}

/// A namespace whose pods run on the real node.
pub fn on_real_node(namespace: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": namespace, "annotations": localcluster::node::namespace_annotations()},
    })
}

/// `objects` as the dynamic objects the apply takes; `what` names them in an error.
pub fn objects(objects: Vec<Value>, what: &str) -> anyhow::Result<Vec<DynamicObject>> {
    objects
        .into_iter()
        .map(|object| serde_json::from_value(object).with_context(|| format!("building {what}")))
        .collect()
}

/// Waits until the Deployment `namespace/name` has a replica available; `what` names it in
/// the error.
pub async fn wait_available(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    what: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    testkit::wait_for(&format!("{what} to be Available"), timeout, || async {
        let deployment = deployments.get(name).await.map_err(|e| e.to_string())?;
        let status = deployment.status.unwrap_or_default();
        if status.available_replicas.unwrap_or_default() > 0 {
            Ok(())
        } else {
            Err(format!("status {status:?}"))
        }
    })
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deployment_runs_its_loaded_image_locked_down() {
        let component = Component {
            name: "tool",
            namespace: "tools",
            service_account: "tool-sa",
        };
        let deployment =
            component.deployment(json!({"image": "tool:1", "args": ["run"]}), json!([]));
        let pod = &deployment["spec"]["template"]["spec"];
        let container = &pod["containers"][0];
        assert_eq!(container["name"], "tool");
        assert_eq!(container["args"][0], "run");
        assert_eq!(container["imagePullPolicy"], "Never");
        assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
        assert_eq!(pod["serviceAccountName"], "tool-sa");
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
        assert_eq!(
            deployment["spec"]["selector"]["matchLabels"],
            deployment["spec"]["template"]["metadata"]["labels"]
        );
        let binding = component.cluster_role_binding("tool", "tool-role");
        assert_eq!(binding["subjects"][0]["namespace"], "tools");
        assert!(objects(vec![deployment, binding], "the tool").is_ok());
    }
}
