//! Writing a custom resource's status once per change, and holding back the passing states of
//! a rollout for a moment (see [`StatusWriter`]).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use kube::api::{Patch, PatchParams};
use kube::core::object::HasStatus;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use crate::Error;
use crate::status::Progress;
use crate::writes;

/// A namespaced custom resource with a status subresource: every `#[derive(CustomResource)]`
/// type with `#[kube(status = ...)]` (through kube's [`HasStatus`]).
pub trait WithStatus:
    Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
    + HasStatus<Status: Clone + PartialEq + Serialize>
    + Clone
    + DeserializeOwned
    + std::fmt::Debug
{
}

impl<K> WithStatus for K where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + HasStatus<Status: Clone + PartialEq + Serialize>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
{
}

/// Writes the status of one kind of custom resource, once per change.
///
/// A reconcile compares the status it computes with the cached object's. Right after a write
/// the cache still shows the object as it was (the watch event is on its way), and a reconcile
/// triggered meanwhile by a pod or Deployment event would compute from the old status and write
/// again what was just written. So each write is remembered with the resourceVersion the object
/// had before it: while the cache still shows that version, [`StatusWriter::latest`] shows the
/// written status instead.
///
/// A status that moves from one state the rollout passes through to another
/// ([`Progress::Moving`]) waits up to
/// [`PROGRESS_HOLD`] after it first differs from the object's before it is written: when the
/// rollout moves on meanwhile, the newer state is written instead, and when it settles, only
/// the settled one. A rollout that takes a few seconds reports once, not once per pod; one that
/// takes longer still reports its progress, at most once per hold.
pub struct StatusWriter<K: WithStatus> {
    client: kube::Client,
    written: Mutex<Writes<K>>,
}

/// The remembered writes, and the size at which old ones are next looked for.
struct Writes<K: WithStatus> {
    last: HashMap<ObjectRef<K>, LastWrite<K::Status>>,
    /// Since when each object has had a [`Progress::Moving`] status waiting to be written.
    held_since: HashMap<ObjectRef<K>, Instant>,
    prune_at: usize,
}

struct LastWrite<S> {
    /// The resourceVersion the object had when it was written.
    before: Option<String>,
    status: S,
    at: Instant,
}

/// Writes remembered before old ones are first looked for (those of objects deleted before the
/// cache showed the write, which nobody asks about again). After each look, the next waits
/// until the map has doubled, so a burst of writes costs a constant per write.
const PRUNE_AFTER: usize = 1024;
/// How old a remembered write must be to be dropped then.
const PRUNE_OLDER_THAN: Duration = Duration::from_secs(60);

/// How long a status of a rollout in motion may wait for the rollout to move on before it is
/// written (see [`StatusWriter`]). On a busy cluster the steps of one rollout come seconds
/// apart (its controllers are the queue): a hold of one second wrote nearly every step, where
/// controller-runtime's busier queue folds them. The `Progressing` condition is written the
/// moment a rollout starts; its details then refresh at most every five seconds.
pub const PROGRESS_HOLD: Duration = Duration::from_secs(5);

/// What [`StatusWriter::write`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusWrite {
    /// The object already had that status.
    Unchanged,
    /// The status was written.
    Written,
    /// The status reports a rollout in motion and was held back; reconcile again after
    /// `retry` (if no event comes first) to write it or a newer one.
    Held {
        /// When the hold ends.
        retry: Duration,
    },
}

impl<K: WithStatus> std::fmt::Debug for StatusWriter<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusWriter").finish_non_exhaustive()
    }
}

impl<K: WithStatus> StatusWriter<K> {
    /// Writes through `client`.
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            written: Mutex::new(Writes {
                last: HashMap::new(),
                held_since: HashMap::new(),
                prune_at: PRUNE_AFTER,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Writes<K>> {
        // A poisoned lock only means another reconcile panicked mid-insert; the map is valid.
        self.written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `obj` as cached, or, while the cache is behind a status write of ours, with that status.
    pub fn latest<'a>(&self, obj: &'a K) -> Cow<'a, K> {
        let key = ObjectRef::from_obj(obj);
        let mut written = self.lock();
        match written.last.get(&key) {
            Some(last) if last.before.as_deref() == obj.resource_version().as_deref() => {
                let mut newer = obj.clone();
                *newer.status_mut() = Some(last.status.clone());
                Cow::Owned(newer)
            }
            Some(_) => {
                // The cache has caught up (or somebody else wrote since): it is the truth again.
                written.last.remove(&key);
                Cow::Borrowed(obj)
            }
            None => Cow::Borrowed(obj),
        }
    }

    /// Writes `status` to `obj` (as [`StatusWriter::latest`] shows it) unless it already has
    /// it, or it reports a rollout in motion that has not yet waited [`PROGRESS_HOLD`].
    ///
    /// # Errors
    /// [`Error::MissingField`] without a namespace; [`Error::Kube`] when the API server refuses.
    pub async fn write(
        &self,
        obj: &K,
        status: K::Status,
        progress: Progress,
    ) -> Result<StatusWrite, Error> {
        let key = ObjectRef::from_obj(obj);
        if obj.status() == Some(&status) {
            self.lock().held_since.remove(&key);
            return Ok(StatusWrite::Unchanged);
        }
        if progress == Progress::Moving {
            let held = self
                .lock()
                .held_since
                .entry(key.clone())
                .or_insert_with(Instant::now)
                .elapsed();
            if held < PROGRESS_HOLD {
                return Ok(StatusWrite::Held {
                    retry: PROGRESS_HOLD - held,
                });
            }
        }
        patch_status(&self.client, obj, &status).await?;
        let mut written = self.lock();
        written.held_since.remove(&key);
        if written.last.len() + written.held_since.len() >= written.prune_at {
            written
                .last
                .retain(|_, last| last.at.elapsed() < PRUNE_OLDER_THAN);
            written
                .held_since
                .retain(|_, since| since.elapsed() < PRUNE_OLDER_THAN);
            written.prune_at = PRUNE_AFTER.max(2 * (written.last.len() + written.held_since.len()));
        }
        written.last.insert(
            key,
            LastWrite {
                before: obj.resource_version(),
                status,
                at: Instant::now(),
            },
        );
        Ok(StatusWrite::Written)
    }
}

/// Writes `status` to `obj`'s status subresource (a merge patch: it replaces the lists).
///
/// # Errors
/// [`Error::Kube`] when the API server refuses.
async fn patch_status<K, S>(client: &kube::Client, obj: &K, status: &S) -> Result<(), Error>
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
    S: Serialize,
{
    let namespace = obj.namespace().ok_or(Error::MissingField {
        kind: K::kind(&()),
        field: "metadata.namespace",
    })?;
    let patch = serde_json::json!({ "status": status });
    writes::patch::<K, _>(
        client,
        &namespace,
        &obj.name_any(),
        Some("status"),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memcached(resource_version: &str, size: i32) -> apis::Memcached {
        let mut mc = apis::Memcached::new(
            "m",
            apis::MemcachedSpec {
                size,
                image: "memcached".into(),
            },
        );
        mc.metadata.namespace = Some("ns".into());
        mc.metadata.resource_version = Some(resource_version.into());
        mc
    }

    /// A status writer whose API server answers every write with a Memcached at
    /// resourceVersion 2, and the count of its requests.
    fn echo_writer() -> (StatusWriter<apis::Memcached>, crate::fake::ApiServer) {
        let server = crate::fake::ApiServer::echoing(
            serde_json::to_value(memcached("2", 1)).expect("serializable"),
        );
        (StatusWriter::new(server.client()), server)
    }

    fn status(ready: i32) -> apis::MemcachedStatus {
        apis::MemcachedStatus {
            ready_replicas: ready,
            ..apis::MemcachedStatus::default()
        }
    }

    #[tokio::test]
    async fn a_status_write_counts_until_the_cache_shows_it() {
        let (writer, server) = echo_writer();
        let sent = || server.requests().len();

        let cached = memcached("1", 1);
        assert!(
            writer
                .write(&cached, status(0), Progress::Settled)
                .await
                .expect("written")
                == StatusWrite::Written
        );
        assert_eq!(sent(), 1);

        // The cache still shows resourceVersion 1: the written status stands in for its own.
        let latest = writer.latest(&cached);
        assert_eq!(latest.status(), Some(&status(0)));
        assert_eq!(
            writer
                .write(&latest, status(0), Progress::Settled)
                .await
                .expect("no write"),
            StatusWrite::Unchanged,
            "the same status is not written twice"
        );
        assert_eq!(sent(), 1);
        assert!(
            writer
                .write(&latest, status(1), Progress::Settled)
                .await
                .expect("written")
                == StatusWrite::Written
        );
        assert_eq!(sent(), 2, "a new status is written");

        // Once the cache shows a newer version, it is the truth again.
        let mut caught_up = memcached("3", 1);
        caught_up.status = Some(status(1));
        assert!(matches!(writer.latest(&caught_up), Cow::Borrowed(_)));
        assert!(writer.lock().last.is_empty(), "the memory is dropped");
    }

    #[tokio::test(start_paused = true)]
    async fn a_status_in_motion_waits_for_the_next_or_for_the_hold() {
        let (writer, server) = echo_writer();
        let sent = || server.requests().len();
        let cached = memcached("1", 1);

        let held = writer
            .write(&cached, status(1), Progress::Moving)
            .await
            .expect("held");
        assert_eq!(
            held,
            StatusWrite::Held {
                retry: PROGRESS_HOLD
            }
        );
        assert_eq!(sent(), 0);
        // The rollout settles within the hold: only the settled status is written.
        let settled = writer
            .write(&cached, status(2), Progress::Settled)
            .await
            .expect("written");
        assert_eq!((settled, sent()), (StatusWrite::Written, 1));

        // A rollout that does not settle within the hold still reports its progress, the
        // newest state at the end of the hold.
        let other = memcached("5", 1);
        let other = {
            let mut o = other;
            o.metadata.name = Some("other".into());
            o
        };
        let first = writer.write(&other, status(1), Progress::Moving).await;
        assert!(matches!(first, Ok(StatusWrite::Held { .. })));
        tokio::time::advance(PROGRESS_HOLD / 2).await;
        let second = writer.write(&other, status(2), Progress::Moving).await;
        assert_eq!(
            second.expect("held"),
            StatusWrite::Held {
                retry: PROGRESS_HOLD / 2
            },
            "the hold runs from the first unwritten change"
        );
        tokio::time::advance(PROGRESS_HOLD / 2).await;
        let third = writer.write(&other, status(3), Progress::Moving).await;
        assert_eq!((third.expect("written"), sent()), (StatusWrite::Written, 2));
        assert!(writer.lock().held_since.is_empty());
    }
}
