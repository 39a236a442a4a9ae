//! Writes to the API server whose answer is read as metadata only.
//!
//! A create, patch or apply is answered with the whole object as stored, managed fields and
//! all. The controllers read nothing of it but its metadata (the resourceVersion that marks the
//! watch event of their own write, the uid and generation); the watch brings the rest. So these
//! writes ask for `PartialObjectMetadata`, the same projection a metadata-only watch gets, which
//! spares the API server the encoding, the connection the bytes and the manager the parsing of
//! every answer.
//! Should a server answer with the whole object anyway, its metadata is read all the same.

use http::HeaderValue;
use http::header::ACCEPT;
use kube::Resource;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::core::Request;
use serde::{Deserialize, Serialize};

use crate::Error;
use crate::managed_fields::WithoutManagedFields;

/// The `Accept` header that asks for an answer of the object's metadata only.
const METADATA_ONLY: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";

/// What is read of an answer: the metadata, without its managed fields.
#[derive(Deserialize)]
struct Answer {
    #[serde(default)]
    metadata: ObjectMeta,
}

/// Creates `object` in `namespace`; returns the metadata it was stored with.
///
/// # Errors
/// [`Error::Kube`] when the request cannot be built or the API server refuses it.
pub async fn create<K>(
    client: &kube::Client,
    namespace: &str,
    params: &PostParams,
    object: &K,
) -> Result<ObjectMeta, Error>
where
    K: Resource<DynamicType = ()> + Serialize,
{
    let body = serde_json::to_vec(object).map_err(kube::Error::SerdeError)?;
    let request = request_for::<K>(namespace)
        .create(params, body)
        .map_err(kube::Error::BuildRequest)?;
    send(client, request).await
}

/// Patches `namespace/name` (`name` when `namespace` is empty: a cluster-scoped object; its
/// `subresource`, when given, such as `status`); returns the
/// metadata the object has after the patch.
///
/// # Errors
/// [`Error::Kube`] when the request cannot be built or the API server refuses it.
pub async fn patch<K, P>(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    subresource: Option<&str>,
    params: &PatchParams,
    patch: &Patch<P>,
) -> Result<ObjectMeta, Error>
where
    K: Resource<DynamicType = ()>,
    P: Serialize,
{
    let request = request_for::<K>(namespace);
    let request = match subresource {
        Some(subresource) => request.patch_subresource(subresource, name, params, patch),
        None => request.patch(name, params, patch),
    }
    .map_err(kube::Error::BuildRequest)?;
    send(client, request).await
}

/// The requests for `K` in `namespace`; an empty one names a cluster-scoped object.
fn request_for<K: Resource<DynamicType = ()>>(namespace: &str) -> Request {
    Request::new(K::url_path(&(), Some(namespace).filter(|n| !n.is_empty())))
}

async fn send(
    client: &kube::Client,
    mut request: http::Request<Vec<u8>>,
) -> Result<ObjectMeta, Error> {
    request
        .headers_mut()
        .insert(ACCEPT, HeaderValue::from_static(METADATA_ONLY));
    let answer: WithoutManagedFields<Answer> = client.request(request).await?;
    Ok(answer.0.metadata)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;

    use super::*;
    use crate::fake::ApiServer;

    #[tokio::test]
    async fn creates_and_patches_ask_for_metadata_and_return_it() {
        let server = ApiServer::echoing(serde_json::json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"name": "a", "namespace": "ns", "resourceVersion": "9"}
        }));
        let client = server.client();
        let object = ConfigMap {
            metadata: ObjectMeta {
                name: Some("a".to_owned()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        let created = create(&client, "ns", &PostParams::default(), &object)
            .await
            .expect("the create is answered");
        let applied = patch::<ConfigMap, _>(
            &client,
            "ns",
            "a",
            None,
            &PatchParams::apply("me"),
            &Patch::Apply(&object),
        )
        .await
        .expect("the apply is answered");
        let status = patch::<ConfigMap, _>(
            &client,
            "ns",
            "a",
            Some("status"),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {}})),
        )
        .await
        .expect("the status patch is answered");
        for meta in [created, applied, status] {
            assert_eq!(meta.resource_version.as_deref(), Some("9"));
        }
        let requests = server.requests();
        let seen: Vec<(&str, &str)> = requests
            .iter()
            .map(|r| (r.method.as_str(), r.path.as_str()))
            .collect();
        assert_eq!(
            seen,
            [
                ("POST", "/api/v1/namespaces/ns/configmaps"),
                ("PATCH", "/api/v1/namespaces/ns/configmaps/a"),
                ("PATCH", "/api/v1/namespaces/ns/configmaps/a/status"),
            ]
        );
        assert!(requests.iter().all(|r| r.accept == METADATA_ONLY));
        assert_eq!(requests[0].body["metadata"]["name"], "a");
    }

    #[tokio::test]
    async fn a_refusal_is_the_api_servers_error() {
        let server = ApiServer::failing(409, "configmaps \"a\" already exists");
        let refused = create(
            &server.client(),
            "ns",
            &PostParams::default(),
            &ConfigMap::default(),
        )
        .await;
        assert!(
            matches!(&refused, Err(Error::Kube(kube::Error::Api(status))) if status.code == 409),
            "{refused:?}"
        );
    }

    #[test]
    fn an_answer_is_read_for_its_metadata_alone_whether_partial_or_whole() {
        let partial = serde_json::json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {
                "name": "a", "resourceVersion": "7", "uid": "u", "generation": 2,
                "managedFields": [{"manager": "m", "fieldsV1": {"f:spec": {}}}]
            }
        });
        let whole = serde_json::json!({
            "kind": "Deployment",
            "apiVersion": "apps/v1",
            "metadata": {"name": "a", "resourceVersion": "7", "uid": "u", "generation": 2},
            "spec": {"replicas": 3, "template": {"spec": {"containers": [{"name": "c"}]}}},
            "status": {"replicas": 3}
        });
        for json in [partial, whole] {
            let answer: WithoutManagedFields<Answer> =
                serde_json::from_value(json).expect("an answer parses");
            let meta = answer.0.metadata;
            assert_eq!(meta.resource_version.as_deref(), Some("7"));
            assert_eq!(meta.uid.as_deref(), Some("u"));
            assert_eq!(meta.generation, Some(2));
            assert_eq!(meta.managed_fields, None);
        }
    }
}
