//! A Deployment as an owned child read through its [`DeploymentView`]: when the Deployment
//! controller has seen what was written, and the Events for what a write changed (`Scaled`,
//! `Updated`) and for its creation.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use kube::ResourceExt;

use crate::children::{Change, ChildView};
use crate::deployment_view::DeploymentView;
use crate::workload::Workload;

impl ChildView<Deployment> for DeploymentView {
    /// The labels the view keeps: the managed Deployments' cache drops them (the watch's
    /// selector has matched ours), and what is not kept cannot be told apart from what holds.
    fn has_labels(&self, labels: &BTreeMap<String, String>) -> bool {
        self.metadata.labels.as_ref().is_none_or(|kept| {
            labels
                .iter()
                .all(|(key, value)| kept.get(key) == Some(value))
        })
    }

    fn observed(&self) -> bool {
        Workload::observed(self)
    }

    /// `Scaled` for a new replica count, `Updated` for a new (or restored) image.
    fn changes(&self, desired: &Deployment) -> Vec<Change> {
        let name = desired.name_any();
        let (had, replicas) = (self.desired_replicas(), desired.spec.replicas.unwrap_or(1));
        let mut changes = Vec::new();
        if had != replicas {
            changes.push(Change {
                reason: "Scaled",
                action: "ScaleDeployment",
                note: format!("Scaled Deployment {name} from {had} to {replicas} replicas"),
            });
        }
        let runs = |(name, image): (&str, Option<&str>)| {
            self.containers
                .iter()
                .any(|c| c.name == name && c.image.as_deref() == image)
        };
        if !containers(desired).all(runs) {
            changes.push(Change {
                reason: "Updated",
                action: "UpdateDeployment",
                note: format!("Set the image of Deployment {name} to {}", images(desired)),
            });
        }
        changes
    }

    fn created_note(desired: &Deployment) -> String {
        let (name, replicas) = (desired.name_any(), desired.spec.replicas.unwrap_or(1));
        let images = images(desired);
        format!("Created Deployment {name} with {replicas} replicas of {images}")
    }
}

/// The name and image of each container of `desired`'s pod template.
fn containers(desired: &Deployment) -> impl Iterator<Item = (&str, Option<&str>)> {
    desired
        .spec
        .template
        .spec
        .iter()
        .flat_map(|pod| &pod.containers)
        .map(|c| (c.name.as_str(), c.image.as_deref()))
}

/// The images of `desired`'s containers, in order, for a note.
fn images(desired: &Deployment) -> String {
    let images: Vec<&str> = containers(desired).filter_map(|(_, image)| image).collect();
    images.join(", ")
}
