//! Kubeconfigs for ServiceAccounts, so a process runs with exactly the permissions RBAC grants
//! it, as it would in a user's cluster.

use std::path::{Path, PathBuf};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{Api, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};
use localcluster::{Credentials, KubeconfigSpec};

use crate::manifests::{self, FIELD_MANAGER};
use crate::{Error, Result, TestCluster, namespace::unique_name};

/// How long minted tokens stay valid.
const TOKEN_SECONDS: i64 = 4 * 3600;

/// A kubeconfig that authenticates as a ServiceAccount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceAccountKubeconfig {
    /// The kubeconfig file (its context's namespace is the ServiceAccount's).
    pub path: PathBuf,
    /// The ServiceAccount's namespace.
    pub namespace: String,
    /// The ServiceAccount's name.
    pub service_account: String,
}

/// Installs the manager's generated CRDs and RBAC from `deploy_dir` (normally
/// [`manifests::deploy_dir`]) and returns a kubeconfig for the manager's ServiceAccount.
///
/// Applies every file of `deploy_dir/crds/` and `deploy_dir/rbac/` with server-side apply
/// (creating the ServiceAccount's namespace if the manifests do not), then mints a token with
/// the TokenRequest API. Run the manager with this kubeconfig and it can do exactly what the
/// generated ClusterRole, Role and bindings allow, nothing more.
///
/// # Errors
/// [`Error::Manifest`] when `rbac/` has no ServiceAccount; API errors from applying or from the
/// token request.
pub async fn manager_kubeconfig(
    cluster: &TestCluster,
    deploy_dir: &Path,
) -> Result<ServiceAccountKubeconfig> {
    let client = &cluster.client;
    let crds = deploy_dir.join("crds");
    if crds.is_dir() {
        manifests::apply_dir(client, &crds).await?;
    }
    let rbac = deploy_dir.join("rbac");
    let mut objects: Vec<DynamicObject> = Vec::new();
    for file in manifests::yaml_files(&rbac)? {
        objects.extend(manifests::read_yaml_file(&file)?);
    }
    let sa = objects
        .iter()
        .find(|o| o.types.as_ref().is_some_and(|t| t.kind == "ServiceAccount"))
        .ok_or_else(|| Error::Manifest {
            path: rbac.clone(),
            message: "no ServiceAccount among the RBAC manifests".into(),
        })?;
    let name = sa.metadata.name.clone().unwrap_or_default();
    let namespace = sa
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".to_owned());
    ensure_namespace(client, &namespace).await?;
    manifests::apply_objects(client, objects, None).await?;
    service_account_kubeconfig(cluster, &namespace, &name).await
}

/// A token of an existing ServiceAccount, from the TokenRequest API.
///
/// # Errors
/// API errors from the token request.
pub async fn service_account_token(
    cluster: &TestCluster,
    namespace: &str,
    name: &str,
) -> Result<String> {
    request_token(cluster, namespace, name, None).await
}

/// A token of ServiceAccount `namespace/name`, bound to `bound` if given.
async fn request_token(
    cluster: &TestCluster,
    namespace: &str,
    name: &str,
    bound: Option<BoundObjectReference>,
) -> Result<String> {
    let what = match &bound {
        Some(object) => format!(
            "requesting a token for ServiceAccount {namespace}/{name} bound to {} {}",
            object.kind.as_deref().unwrap_or_default(),
            object.name.as_deref().unwrap_or_default()
        ),
        None => format!("requesting a token for ServiceAccount {namespace}/{name}"),
    };
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(TOKEN_SECONDS),
            bound_object_ref: bound,
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let token = Api::<ServiceAccount>::namespaced(cluster.client.clone(), namespace)
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .map_err(Error::kube(what))?
        .status
        .and_then(|s| s.token)
        .unwrap_or_default();
    Ok(token)
}

/// A kubeconfig for an existing ServiceAccount, with a token from the TokenRequest API.
///
/// # Errors
/// API errors from the token request; [`Error::Cluster`] when the file cannot be written.
pub async fn service_account_kubeconfig(
    cluster: &TestCluster,
    namespace: &str,
    name: &str,
) -> Result<ServiceAccountKubeconfig> {
    let token = service_account_token(cluster, namespace, name).await?;
    write_kubeconfig(cluster, namespace, name, token)
}

/// Writes a kubeconfig with `token` for ServiceAccount `namespace/name`.
fn write_kubeconfig(
    cluster: &TestCluster,
    namespace: &str,
    name: &str,
    token: String,
) -> Result<ServiceAccountKubeconfig> {
    // Next to the cluster's own state, so `cargo xtask cluster down` removes it with the
    // cluster (the token dies with the cluster anyway).
    let dir = cluster
        .state
        .kubeconfig
        .parent()
        .unwrap_or(Path::new("."))
        .join("e2e");
    let path = dir.join(format!(
        "{}.kubeconfig",
        unique_name(&format!("{namespace}-{name}"))
    ));
    KubeconfigSpec {
        name: format!("{namespace}-{name}"),
        server: cluster.state.server.clone(),
        certificate_authority: cluster.state.ca_cert.clone(),
        credentials: Credentials::Token(token),
        namespace: Some(namespace.to_owned()),
    }
    .write(&path)?;
    Ok(ServiceAccountKubeconfig {
        path,
        namespace: namespace.to_owned(),
        service_account: name.to_owned(),
    })
}

async fn ensure_namespace(client: &kube::Client, name: &str) -> Result<()> {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .patch(name, &PatchParams::apply(FIELD_MANAGER), &Patch::Apply(&ns))
        .await
        .map_err(Error::kube(format!("creating namespace {name}")))?;
    Ok(())
}

/// A kubeconfig for `account` that authenticates as a pod of it, as a replica in a cluster does:
/// a pod named `pod` (created if missing, never scheduled: it exists only to be named) and a
/// token bound to it, so the API server's user info carries the pod's name
/// (`authentication.kubernetes.io/pod-name`) and the token dies with the pod.
///
/// # Errors
/// API errors from creating the pod or the token; [`Error::Cluster`] when the file cannot be
/// written.
pub async fn pod_kubeconfig(
    cluster: &TestCluster,
    account: &ServiceAccountKubeconfig,
    pod: &str,
) -> Result<ServiceAccountKubeconfig> {
    let namespace = account.namespace.as_str();
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), namespace);
    let object: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": pod},
        "spec": {
            "serviceAccountName": account.service_account,
            "automountServiceAccountToken": false,
            // No node has this label: the pod stays pending, and nothing collects it.
            "nodeSelector": {"testkit.example.com/never-scheduled": "true"},
            "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "replica",
                "image": "unscheduled.invalid/replica",
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]},
                },
            }],
        },
    }))
    .map_err(|e| Error::Manifest {
        path: PathBuf::from(pod),
        message: e.to_string(),
    })?;
    let created = pods
        .patch(
            pod,
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Apply(&object),
        )
        .await
        .map_err(Error::kube(format!("creating pod {namespace}/{pod}")))?;
    let bound = BoundObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Pod".to_owned()),
        name: Some(pod.to_owned()),
        uid: created.metadata.uid.clone(),
    };
    let name = account.service_account.as_str();
    let token = request_token(cluster, namespace, name, Some(bound)).await?;
    write_kubeconfig(cluster, namespace, name, token)
}
