//! What the workload controllers share about their Deployments: finding one without touching
//! somebody else's, applying it, pod security, and writing status.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    Capabilities, PodSecurityContext, SeccompProfile, SecurityContext,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::Error;

/// The Deployment a custom resource wants, as it stands.
#[derive(Clone, Debug)]
pub enum Existing {
    /// No Deployment of that name: it will be created.
    Missing,
    /// The custom resource's own Deployment.
    Owned(Arc<Deployment>),
    /// A Deployment of that name that the custom resource does not control: never touched.
    Foreign(Arc<Deployment>),
}

/// Finds the Deployment `namespace/name` and whether `owner_uid` controls it.
///
/// The shared cache answers first. It holds only managed Deployments, so when it has none the API
/// server is asked directly (once per creation): applying over a Deployment that exists but is
/// not in the cache would take it over.
///
/// # Errors
/// [`Error::Kube`] when the direct lookup fails.
pub async fn find_deployment(
    client: &kube::Client,
    cache: &Store<Deployment>,
    namespace: &str,
    name: &str,
    owner_uid: &str,
) -> Result<Existing, Error> {
    let cached = cache.get(&ObjectRef::new(name).within(namespace));
    let found = match cached {
        Some(d) => Some(d),
        None => Api::<Deployment>::namespaced(client.clone(), namespace)
            .get_opt(name)
            .await?
            .map(Arc::new),
    };
    Ok(match found {
        None => Existing::Missing,
        Some(d) if is_controlled_by(d.as_ref(), owner_uid) => Existing::Owned(d),
        Some(d) => Existing::Foreign(d),
    })
}

/// Whether `owner_uid` is `obj`'s controller.
pub fn is_controlled_by(obj: &impl Resource, owner_uid: &str) -> bool {
    obj.meta()
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == owner_uid)
}

/// The controller of `obj` when it is of kind `kind` in `api_version`.
pub fn controller_of<'a>(
    obj: &'a impl Resource,
    api_version: &str,
    kind: &str,
) -> Option<&'a OwnerReference> {
    obj.meta()
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && o.kind == kind && o.api_version == api_version)
}

/// A controller owner reference to `owner` that blocks its foreground deletion until the owned
/// object is gone.
///
/// # Errors
/// [`Error::MissingField`] when `owner` has no name or uid (it was not read from the API server).
pub fn owner_reference<K: Resource<DynamicType = ()>>(owner: &K) -> Result<OwnerReference, Error> {
    let mut reference = owner.controller_owner_ref(&()).ok_or(Error::MissingField {
        kind: "owner",
        field: "metadata.uid",
    })?;
    reference.block_owner_deletion = Some(true);
    Ok(reference)
}

/// Server-side applies `deployment` under `field_manager`, forcing conflicts (the controller is
/// the authority on every field it sets; a hand edit of one of them is undone).
///
/// # Errors
/// [`Error::Kube`] when the API server refuses.
pub async fn apply_deployment(
    client: &kube::Client,
    namespace: &str,
    field_manager: &str,
    deployment: &Deployment,
) -> Result<Deployment, Error> {
    let name = deployment.name_any();
    let params = PatchParams::apply(field_manager).force();
    Ok(Api::<Deployment>::namespaced(client.clone(), namespace)
        .patch(&name, &params, &Patch::Apply(deployment))
        .await?)
}

/// Writes `status` to `obj`'s status subresource (a merge patch: it replaces the lists).
///
/// # Errors
/// [`Error::Kube`] when the API server refuses.
pub async fn patch_status<K, S>(client: &kube::Client, obj: &K, status: &S) -> Result<(), Error>
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
    S: Serialize,
{
    let namespace = obj.namespace().ok_or(Error::MissingField {
        kind: "object",
        field: "metadata.namespace",
    })?;
    let patch = serde_json::json!({ "status": status });
    Api::<K>::namespaced(client.clone(), &namespace)
        .patch_status(
            &obj.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    Ok(())
}

/// A pod security context meeting the `restricted` Pod Security Standard: non-root with a
/// numeric user (an image's named user cannot be verified by the kubelet), seccomp
/// `RuntimeDefault`.
pub fn restricted_pod_security(user: i64) -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(user),
        seccomp_profile: Some(runtime_default_seccomp()),
        ..PodSecurityContext::default()
    }
}

/// A container security context meeting the `restricted` Pod Security Standard: no privilege
/// escalation, every capability dropped, non-root with a numeric user, seccomp `RuntimeDefault`.
pub fn restricted_container_security(user: i64) -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_owned()]),
            add: None,
        }),
        run_as_non_root: Some(true),
        run_as_user: Some(user),
        seccomp_profile: Some(runtime_default_seccomp()),
        ..SecurityContext::default()
    }
}

fn runtime_default_seccomp() -> SeccompProfile {
    SeccompProfile {
        type_: "RuntimeDefault".to_owned(),
        localhost_profile: None,
    }
}

/// Checks a pod template against the `restricted` Pod Security Standard's container rules (for
/// tests of each controller's desired Deployment).
#[cfg(test)]
pub fn assert_restricted(deployment: &Deployment) {
    let pod = deployment
        .spec
        .template
        .spec
        .as_ref()
        .expect("a pod template");
    let pod_ctx = pod
        .security_context
        .as_ref()
        .expect("a pod security context");
    assert_eq!(pod_ctx.run_as_non_root, Some(true));
    assert!(pod_ctx.run_as_user.is_some_and(|u| u > 0));
    assert_eq!(
        pod_ctx.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
        Some("RuntimeDefault")
    );
    for c in &pod.containers {
        let ctx = c
            .security_context
            .as_ref()
            .expect("a container security context");
        assert_eq!(ctx.allow_privilege_escalation, Some(false), "{}", c.name);
        assert_eq!(ctx.run_as_non_root, Some(true), "{}", c.name);
        assert!(ctx.run_as_user.is_some_and(|u| u > 0), "{}", c.name);
        let drop = ctx
            .capabilities
            .as_ref()
            .and_then(|c| c.drop.clone())
            .unwrap_or_default();
        assert_eq!(drop, ["ALL"], "{}", c.name);
        assert!(ctx.capabilities.as_ref().is_some_and(|c| c.add.is_none()));
        assert_eq!(ctx.privileged, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    fn owned_by(uid: &str, controller: bool) -> Deployment {
        Deployment {
            metadata: ObjectMeta {
                owner_references: Some(vec![OwnerReference {
                    api_version: "cache.example.com/v1alpha1".into(),
                    kind: "Memcached".into(),
                    name: "m".into(),
                    uid: uid.into(),
                    controller: Some(controller),
                    block_owner_deletion: None,
                }]),
                ..ObjectMeta::default()
            },
            ..Deployment::default()
        }
    }

    #[test]
    fn control_is_by_uid_and_controller_flag() {
        assert!(is_controlled_by(&owned_by("u1", true), "u1"));
        assert!(
            !is_controlled_by(&owned_by("u1", true), "u2"),
            "a namesake from an older object"
        );
        assert!(
            !is_controlled_by(&owned_by("u1", false), "u1"),
            "an owner that is not the controller"
        );
        assert!(!is_controlled_by(&Deployment::default(), "u1"));
        assert!(
            controller_of(
                &owned_by("u1", true),
                "cache.example.com/v1alpha1",
                "Memcached"
            )
            .is_some()
        );
        assert!(controller_of(&owned_by("u1", true), "myscheme.example.com/v1", "MyApp").is_none());
    }
}
