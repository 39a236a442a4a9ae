//! Finalizers as a small state machine around a controller's reconcile.
//!
//! A controller that must clean up before its object goes, what no owner reference can
//! garbage-collect (the PersistentVolumeClaims a StatefulSet leaves behind, something outside
//! the cluster), declares a finalizer with
//! [`Builder::run_with_finalizer`](crate::builder::Builder::run_with_finalizer). Around every
//! reconcile the runtime then:
//!
//! - adds the finalizer to an object that is not being deleted and lacks it, and reconciles
//!   that object in the same pass;
//! - runs the cleanup instead of the reconcile while the object is being deleted and still
//!   holds the finalizer: [`Outcome::Done`] removes the finalizer, [`Outcome::RequeueAfter`]
//!   checks again after the delay, and an error is retried with backoff and reported as a
//!   Warning Event and a `Degraded` condition with the reason [`CLEANUP_FAILED`]. The finalizer
//!   is never removed before the cleanup reports done;
//! - leaves an object being deleted that no longer holds it alone.
//!
//! Both writes are JSON patches that test the list they change, so a finalizer that another
//! controller adds or removes at the same moment is never lost. A finalizer removed by hand
//! from a live object triggers a reconcile, which puts it back without waiting for a resync.
//! The RBAC it needs (`patch` on the resource) is checked at start with the rest.

use std::future::Future;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde_json::{Value, json};

use crate::conditions::{self, DEGRADED, NewCondition};
use crate::driver::Outcome;
use crate::own_writes::OwnWrites;
use crate::{Error, writes};

/// The reason of the `Degraded` condition an object reports while its cleanup fails.
pub const CLEANUP_FAILED: &str = "CleanupFailed";

/// Reconciles `obj` behind `finalizer`: see the module documentation.
///
/// # Errors
/// What `reconcile` returns; [`Error::Cleanup`] when `cleanup` fails; [`Error::Kube`] when
/// adding or removing the finalizer fails (a concurrent change of the list among them).
pub(crate) async fn reconcile<K, C, F, Fut, G, GFut>(
    client: &kube::Client,
    own_writes: &OwnWrites,
    finalizer: &'static str,
    obj: Arc<K>,
    context: Arc<C>,
    reconcile: &F,
    cleanup: &G,
) -> Result<Outcome, Error>
where
    K: Resource<DynamicType = ()> + Serialize,
    F: Fn(Arc<K>, Arc<C>) -> Fut,
    Fut: Future<Output = Result<Outcome, Error>>,
    G: Fn(Arc<K>, Arc<C>) -> GFut,
    GFut: Future<Output = Result<Outcome, Error>>,
{
    let held = obj.finalizers().iter().position(|f| f == finalizer);
    if obj.meta().deletion_timestamp.is_none() {
        let patch = add(obj.finalizers(), finalizer);
        if held.is_none() && !write(client, own_writes, obj.as_ref(), patch).await? {
            return Ok(Outcome::Done);
        }
        return reconcile(obj, context).await;
    }
    let Some(index) = held else {
        return Ok(Outcome::Done);
    };
    match cleanup(obj.clone(), context).await {
        Ok(Outcome::Done) => {
            write(client, own_writes, obj.as_ref(), remove(index, finalizer)).await?;
            Ok(Outcome::Done)
        }
        Ok(waiting) => Ok(waiting),
        Err(source) => {
            let error = Error::Cleanup {
                finalizer,
                source: Box::new(source),
            };
            report(client, obj.as_ref(), &error).await;
            Err(error)
        }
    }
}

/// The JSON patch that adds `finalizer` to `current`, if the list is still `current`.
fn add(current: &[String], finalizer: &str) -> Value {
    if current.is_empty() {
        // A test for null passes where the list is missing as well as where it is null.
        json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": [finalizer]},
        ])
    } else {
        json!([
            {"op": "test", "path": "/metadata/finalizers", "value": current},
            {"op": "add", "path": "/metadata/finalizers/-", "value": finalizer},
        ])
    }
}

/// The JSON patch that removes `finalizer`, if it is still at `index`.
fn remove(index: usize, finalizer: &str) -> Value {
    let path = format!("/metadata/finalizers/{index}");
    json!([
        {"op": "test", "path": path, "value": finalizer},
        {"op": "remove", "path": path},
    ])
}

/// Sends the JSON patch `patch` to `obj`, noting it in `own_writes`; `Ok(false)` when the
/// object is gone.
async fn write<K: Resource<DynamicType = ()>>(
    client: &kube::Client,
    own_writes: &OwnWrites,
    obj: &K,
    patch: Value,
) -> Result<bool, Error> {
    let patch: json_patch::Patch =
        serde_json::from_value(patch).map_err(kube::Error::SerdeError)?;
    let namespace = obj.namespace().unwrap_or_default();
    let sent = writes::patch::<K, ()>(
        client,
        &namespace,
        &obj.name_any(),
        None,
        &PatchParams::default(),
        &Patch::Json(patch),
    )
    .await;
    match sent {
        Ok(answered) => {
            if let Some(uid) = obj.uid() {
                own_writes.wrote_object(&uid, obj.resource_version(), answered.resource_version);
            }
            Ok(true)
        }
        Err(Error::Kube(kube::Error::Api(status))) if status.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Reports a failed cleanup as the `Degraded` condition of `obj`'s status, where its status
/// has conditions; a failure to write it is logged, the cleanup's error is what counts.
async fn report<K: Resource<DynamicType = ()> + Serialize>(
    client: &kube::Client,
    obj: &K,
    error: &Error,
) {
    let mut current: Vec<Condition> = serde_json::to_value(obj)
        .ok()
        .and_then(|v| v.pointer("/status/conditions").cloned())
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default();
    let failed = NewCondition::new(DEGRADED, true, CLEANUP_FAILED, error.to_string());
    let generation = obj.meta().generation;
    if !conditions::set(&mut current, failed, generation, &conditions::now()) {
        return;
    }
    let status = json!({ "conditions": current });
    if let Err(e) = crate::status_writer::patch_status(client, obj, &status).await {
        tracing::debug!(error = %e, "could not report the failed cleanup in the status");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::fake::{ApiServer, failure};
    use crate::test_resource::{Memcached, MemcachedSpec, MemcachedStatus};

    const FINALIZER: &str = "cache.example.com/cleanup";

    fn memcached(finalizers: &[&str], deleting: bool) -> Arc<Memcached> {
        let mut mc = Memcached::new("m", MemcachedSpec::default());
        mc.metadata.namespace = Some("ns".into());
        mc.metadata.generation = Some(3);
        mc.metadata.finalizers = Some(finalizers.iter().map(|f| (*f).to_owned()).collect());
        mc.metadata.deletion_timestamp = deleting.then(conditions::now);
        mc.status = Some(MemcachedStatus::default());
        Arc::new(mc)
    }

    /// Runs one finalized reconcile against `server`; returns its result and how often the
    /// reconcile and the cleanup ran.
    async fn run(
        server: &ApiServer,
        obj: Arc<Memcached>,
        cleanup: Result<Outcome, Error>,
    ) -> (Result<Outcome, Error>, usize, usize) {
        let (reconciled, cleaned) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let cleanup = std::sync::Mutex::new(Some(cleanup));
        let result = reconcile(
            &server.client(),
            &OwnWrites::default(),
            FINALIZER,
            obj,
            Arc::new(()),
            &|_, _| {
                reconciled.fetch_add(1, Ordering::SeqCst);
                std::future::ready(Ok(Outcome::Done))
            },
            &|_, _| {
                cleaned.fetch_add(1, Ordering::SeqCst);
                let answer = cleanup.lock().ok().and_then(|mut c| c.take());
                std::future::ready(answer.unwrap_or(Ok(Outcome::Done)))
            },
        )
        .await;
        (
            result,
            reconciled.load(Ordering::SeqCst),
            cleaned.load(Ordering::SeqCst),
        )
    }

    fn ok() -> ApiServer {
        ApiServer::echoing(json!({"metadata": {"name": "m", "resourceVersion": "9"}}))
    }

    #[tokio::test]
    async fn a_live_object_gets_the_finalizer_and_is_reconciled_in_the_same_pass() {
        let server = ok();
        let (result, reconciled, cleaned) =
            run(&server, memcached(&[], false), Ok(Outcome::Done)).await;
        assert_eq!(result.ok(), Some(Outcome::Done));
        assert_eq!((reconciled, cleaned), (1, 0));
        let requests = server.requests();
        assert_eq!(requests.len(), 1);
        assert_eq!(requests[0].method, "PATCH");
        assert_eq!(
            requests[0].path,
            "/apis/cache.example.com/v1beta1/namespaces/ns/memcacheds/m"
        );
        assert_eq!(
            requests[0].body,
            json!([
                {"op": "test", "path": "/metadata/finalizers", "value": null},
                {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]},
            ])
        );

        let server = ok();
        let (result, _, _) = run(&server, memcached(&["other"], false), Ok(Outcome::Done)).await;
        assert!(result.is_ok());
        assert_eq!(
            server.requests()[0].body,
            json!([
                {"op": "test", "path": "/metadata/finalizers", "value": ["other"]},
                {"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER},
            ]),
            "another controller's finalizer is kept"
        );

        let server = ok();
        let (_, reconciled, _) =
            run(&server, memcached(&[FINALIZER], false), Ok(Outcome::Done)).await;
        assert_eq!(reconciled, 1);
        assert!(
            server.requests().is_empty(),
            "held already: nothing to write"
        );
    }

    #[tokio::test]
    async fn an_object_gone_before_its_finalizer_is_added_is_not_reconciled() {
        let server = ApiServer::answering(|_| failure(404, "NotFound", "gone"));
        let (result, reconciled, _) = run(&server, memcached(&[], false), Ok(Outcome::Done)).await;
        assert_eq!(result.ok(), Some(Outcome::Done));
        assert_eq!(reconciled, 0);
    }

    #[tokio::test]
    async fn a_finished_cleanup_removes_the_finalizer_where_it_stands() {
        let server = ok();
        let obj = memcached(&["other", FINALIZER], true);
        let (result, reconciled, cleaned) = run(&server, obj, Ok(Outcome::Done)).await;
        assert_eq!(result.ok(), Some(Outcome::Done));
        assert_eq!((reconciled, cleaned), (0, 1));
        assert_eq!(
            server.requests()[0].body,
            json!([
                {"op": "test", "path": "/metadata/finalizers/1", "value": FINALIZER},
                {"op": "remove", "path": "/metadata/finalizers/1"},
            ])
        );
    }

    #[tokio::test]
    async fn an_unfinished_cleanup_keeps_the_finalizer() {
        let server = ok();
        let wait = Outcome::RequeueAfter(Duration::from_secs(5));
        let (result, _, cleaned) = run(&server, memcached(&[FINALIZER], true), Ok(wait)).await;
        assert_eq!(result.ok(), Some(wait));
        assert_eq!(cleaned, 1);
        assert!(server.requests().is_empty());
    }

    #[tokio::test]
    async fn a_failed_cleanup_keeps_the_finalizer_and_says_why_in_a_condition() {
        let server = ok();
        let failed = Err(Error::InvalidSpec {
            field: "spec.storage",
            reason: "volumes still attached".into(),
        });
        let (result, _, _) = run(&server, memcached(&[FINALIZER], true), failed).await;
        let error = result.expect_err("fails").to_string();
        assert!(
            error.contains(FINALIZER) && error.contains("volumes still attached"),
            "{error}"
        );
        let requests = server.requests();
        assert_eq!(requests.len(), 1, "no removal, only the condition");
        assert!(requests[0].path.ends_with("/memcacheds/m/status"));
        let condition = &requests[0].body["status"]["conditions"][0];
        assert_eq!(condition["type"], DEGRADED);
        assert_eq!(condition["status"], "True");
        assert_eq!(condition["reason"], CLEANUP_FAILED);
        assert_eq!(condition["observedGeneration"], 3);
    }

    #[tokio::test]
    async fn an_object_being_deleted_without_the_finalizer_is_left_alone() {
        let server = ok();
        let (result, reconciled, cleaned) =
            run(&server, memcached(&["other"], true), Ok(Outcome::Done)).await;
        assert_eq!(result.ok(), Some(Outcome::Done));
        assert_eq!((reconciled, cleaned), (0, 0));
        assert!(server.requests().is_empty());
    }
}
