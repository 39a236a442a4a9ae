//! What the controllers read of a managed Deployment, and all the cache keeps of one.
//!
//! A k8s-openapi `Deployment` is 2,472 bytes before any of its contents, and each `Container`
//! of its pod template another 2,336, even when all but its name and image are empty. The
//! managed Deployments' cache holds one per custom resource, so at thousands of them those empty
//! fields were most of the cache. [`DeploymentView`] is the same API resource (kind, group,
//! version, plural), read from the same JSON with everything else skipped while it is parsed:
//! nothing of the pod template is built only to be dropped.

use std::borrow::Cow;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};
use kube::Resource;
use kube::api::ObjectMeta;
use kube::core::NamespaceResourceScope;
use serde::Deserialize;

/// A Deployment as the controllers read it: its metadata, the replicas its spec asks for, the
/// name and image of each container of its pod template, and its status.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "Wire")]
pub struct DeploymentView {
    /// The Deployment's metadata.
    pub metadata: ObjectMeta,
    /// `spec.replicas`: `None` when unset (the API server defaults it to 1).
    pub replicas: Option<i32>,
    /// The pod template's containers (`spec.template.spec.containers`), by name and image.
    pub containers: Vec<ContainerImage>,
    /// The Deployment controller's report.
    pub status: Option<DeploymentStatus>,
}

/// The name and image of one container of a pod template.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct ContainerImage {
    /// The container's name.
    pub name: String,
    /// Its image, when set.
    pub image: Option<String>,
}

impl DeploymentView {
    /// The replicas the spec asks for, with the API server's default (1) when unset.
    pub fn desired_replicas(&self) -> i32 {
        self.replicas.unwrap_or(1)
    }
}

impl From<Deployment> for DeploymentView {
    fn from(deployment: Deployment) -> Self {
        let containers = deployment
            .spec
            .template
            .spec
            .as_ref()
            .map(|pod| {
                pod.containers
                    .iter()
                    .map(|c| ContainerImage {
                        name: c.name.clone(),
                        image: c.image.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        Self {
            replicas: deployment.spec.replicas,
            containers,
            metadata: deployment.metadata,
            status: deployment.status,
        }
    }
}

impl Resource for DeploymentView {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        Deployment::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        Deployment::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        Deployment::version(dt)
    }

    fn api_version(dt: &()) -> Cow<'_, str> {
        Deployment::api_version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        Deployment::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// A Deployment as sent, down to the fields the view keeps; serde skips every other key
/// without building anything of it.
#[derive(Deserialize)]
struct Wire {
    #[serde(default)]
    metadata: ObjectMeta,
    spec: Option<WireSpec>,
    status: Option<DeploymentStatus>,
}

#[derive(Deserialize)]
struct WireSpec {
    replicas: Option<i32>,
    template: Option<WireTemplate>,
}

#[derive(Deserialize)]
struct WireTemplate {
    spec: Option<WirePodSpec>,
}

#[derive(Deserialize)]
struct WirePodSpec {
    containers: Option<Vec<ContainerImage>>,
}

impl From<Wire> for DeploymentView {
    fn from(wire: Wire) -> Self {
        let (replicas, containers) = match wire.spec {
            Some(spec) => (
                spec.replicas,
                spec.template
                    .and_then(|t| t.spec)
                    .and_then(|pod| pod.containers)
                    .unwrap_or_default(),
            ),
            None => (None, Vec::new()),
        };
        Self {
            metadata: wire.metadata,
            replicas,
            containers,
            status: wire.status,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::managed_fields::WithoutManagedFields;
    use serde_json::json;

    fn sent() -> serde_json::Value {
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": "m", "namespace": "ns", "uid": "u1", "generation": 2,
                "resourceVersion": "7",
                "labels": {"app": "m"},
                "managedFields": [{"manager": "x", "fieldsV1": {"f:spec": {}}}],
            },
            "spec": {
                "replicas": 3,
                "selector": {"matchLabels": {"app": "m"}},
                "template": {
                    "metadata": {"labels": {"app": "m"}},
                    "spec": {"containers": [{
                        "name": "memcached", "image": "memcached:1.6",
                        "ports": [{"containerPort": 11211}],
                        "securityContext": {"runAsNonRoot": true},
                    }]},
                },
            },
            "status": {"observedGeneration": 2, "replicas": 3, "readyReplicas": 2},
        })
    }

    #[test]
    fn reads_what_the_controllers_use_and_nothing_else() {
        let view: DeploymentView = serde_json::from_value(sent()).expect("a Deployment parses");
        assert_eq!(view.metadata.name.as_deref(), Some("m"));
        assert_eq!(view.metadata.generation, Some(2));
        assert_eq!(view.replicas, Some(3));
        assert_eq!(
            view.containers,
            [ContainerImage {
                name: "memcached".into(),
                image: Some("memcached:1.6".into()),
            }]
        );
        let status = view.status.as_ref().expect("a status");
        assert_eq!(
            (status.observed_generation, status.ready_replicas),
            (Some(2), Some(2))
        );
    }

    #[test]
    fn reads_the_same_as_a_whole_deployment_converted() {
        let whole: Deployment = serde_json::from_value(sent()).expect("a Deployment parses");
        let view: DeploymentView = serde_json::from_value(sent()).expect("a Deployment parses");
        assert_eq!(DeploymentView::from(whole), view);
    }

    #[test]
    fn parses_without_managed_fields_like_every_watched_object() {
        let text = serde_json::to_string(&sent()).expect("serializes");
        let WithoutManagedFields(view) =
            serde_json::from_str::<WithoutManagedFields<DeploymentView>>(&text)
                .expect("a Deployment parses");
        assert_eq!(view.metadata.managed_fields, None);
        assert_eq!(view.replicas, Some(3));
    }

    #[test]
    fn a_bare_deployment_parses_with_defaults() {
        let view: DeploymentView =
            serde_json::from_value(json!({"metadata": {"name": "m"}, "spec": {"template": {}}}))
                .expect("a bare Deployment parses");
        assert_eq!(view.desired_replicas(), 1);
        assert!(view.containers.is_empty());
        assert_eq!(view.status, None);
    }

    #[test]
    fn is_the_deployments_resource() {
        assert_eq!(DeploymentView::kind(&()), "Deployment");
        assert_eq!(DeploymentView::api_version(&()), "apps/v1");
        assert_eq!(DeploymentView::plural(&()), "deployments");
        assert_eq!(
            DeploymentView::url_path(&(), Some("ns")),
            Deployment::url_path(&(), Some("ns"))
        );
    }

    #[test]
    fn is_a_fraction_of_a_deployment() {
        assert!(
            std::mem::size_of::<DeploymentView>() * 4 < std::mem::size_of::<Deployment>(),
            "{} bytes against {}",
            std::mem::size_of::<DeploymentView>(),
            std::mem::size_of::<Deployment>()
        );
    }
}
