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
/// ([`Progress::Moving`]) is written once it has stood for [`PROGRESS_HOLD`]: while the rollout
/// keeps moving on, nothing is written, and when it settles, only the settled state. A rollout
/// whose steps come faster than that reports its start and its end, not each pod; a step that
/// lasts (a pod that does not get ready) is reported once it has lasted the hold; and a rollout
/// that keeps moving for [`PROGRESS_MAX_HOLD`] reports where it stands then.
pub struct StatusWriter<K: WithStatus> {
    client: kube::Client,
    written: Mutex<Writes<K>>,
}

/// The remembered writes, and the size at which old ones are next looked for.
struct Writes<K: WithStatus> {
    last: HashMap<ObjectRef<K>, LastWrite<K::Status>>,
    /// Each object's [`Progress::Moving`] status waiting to be written.
    held: HashMap<ObjectRef<K>, Hold>,
    prune_at: usize,
}

struct LastWrite<S> {
    /// The resourceVersion the object had when it was written.
    before: Option<String>,
    status: S,
    at: Instant,
}

/// A status of a rollout in motion, held back.
#[derive(Clone, Copy, Debug)]
struct Hold {
    /// When the first status held since the last write was computed.
    since: Instant,
    /// A digest of the status held now, and since when it has stood.
    digest: u64,
    steady_since: Instant,
}

/// Writes remembered before old ones are first looked for (those of objects deleted before the
/// cache showed the write, which nobody asks about again). After each look, the next waits
/// until the map has doubled, so a burst of writes costs a constant per write.
const PRUNE_AFTER: usize = 1024;
/// How old a remembered write must be to be dropped then.
const PRUNE_OLDER_THAN: Duration = Duration::from_secs(60);

/// How long a status of a rollout in motion must stand before it is written (see
/// [`StatusWriter`]). On a busy cluster the steps of one rollout come seconds apart (its
/// controllers are the queue): a hold of one second wrote nearly every step, where
/// controller-runtime's busier queue folds them, and a hold of five seconds from the first
/// step still wrote a step of most rollouts at a thousand objects. A step, the first of a
/// rollout included, is written once it has lasted this long; a rollout that ends sooner is
/// written once, complete.
pub const PROGRESS_HOLD: Duration = Duration::from_secs(5);

/// The longest a rollout that keeps moving goes without its status written.
pub const PROGRESS_MAX_HOLD: Duration = Duration::from_secs(30);

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
                held: HashMap::new(),
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
        let key = crate::object_key(obj);
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
        let key = crate::object_key(obj);
        if obj.status() == Some(&status) {
            self.lock().held.remove(&key);
            return Ok(StatusWrite::Unchanged);
        }
        if progress == Progress::Moving
            && let Some(retry) = self.hold(key.clone(), &status)
        {
            return Ok(StatusWrite::Held { retry });
        }
        patch_status(&self.client, obj, &status).await?;
        let mut written = self.lock();
        written.held.remove(&key);
        if written.last.len() + written.held.len() >= written.prune_at {
            written
                .last
                .retain(|_, last| last.at.elapsed() < PRUNE_OLDER_THAN);
            written
                .held
                .retain(|_, hold| hold.since.elapsed() < PRUNE_OLDER_THAN);
            written.prune_at = PRUNE_AFTER.max(2 * (written.last.len() + written.held.len()));
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

impl<K: WithStatus> StatusWriter<K> {
    /// Holds `status`, a state of a rollout in motion, and returns how long until it may be
    /// written; `None` when it has stood for [`PROGRESS_HOLD`] or the rollout has been held for
    /// [`PROGRESS_MAX_HOLD`], so it is to be written now.
    fn hold(&self, key: ObjectRef<K>, status: &K::Status) -> Option<Duration> {
        let (now, digest) = (Instant::now(), digest_of(status));
        let mut written = self.lock();
        let hold = written.held.entry(key).or_insert(Hold {
            since: now,
            digest,
            steady_since: now,
        });
        if hold.digest != digest {
            hold.digest = digest;
            hold.steady_since = now;
        }
        let steady_left = PROGRESS_HOLD.checked_sub(now - hold.steady_since)?;
        let held_left = PROGRESS_MAX_HOLD.checked_sub(now - hold.since)?;
        Some(steady_left.min(held_left)).filter(|left| !left.is_zero())
    }
}

/// A digest of `status` without its conditions' transition times: a condition that changes
/// while its status is held gets the time of each reconcile that computes it, which is no new
/// state of the rollout. Equal for equal states, without keeping a copy of each held status.
fn digest_of<S: Serialize>(status: &S) -> u64 {
    struct HashWriter(std::collections::hash_map::DefaultHasher);
    impl std::io::Write for HashWriter {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            std::hash::Hasher::write(&mut self.0, bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    fn without_transition_times(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(map) => {
                map.remove("lastTransitionTime");
                map.values_mut().for_each(without_transition_times);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(without_transition_times),
            _ => {}
        }
    }
    // A status that does not serialize cannot be written either; the write reports that.
    let mut value = serde_json::to_value(status).unwrap_or_default();
    without_transition_times(&mut value);
    let mut writer = HashWriter(std::collections::hash_map::DefaultHasher::new());
    let _ = serde_json::to_writer(&mut writer, &value);
    std::hash::Hasher::finish(&writer.0)
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

    #[test]
    fn a_condition_changing_again_is_the_same_state() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
        let with_condition = |second: i64, status: &str| apis::MemcachedStatus {
            conditions: vec![Condition {
                type_: "Available".into(),
                status: status.into(),
                reason: "ReplicasNotReady".into(),
                message: "1 of 2 replicas ready".into(),
                last_transition_time: Time(
                    k8s_openapi::jiff::Timestamp::from_second(second).expect("a time"),
                ),
                observed_generation: None,
            }],
            ..apis::MemcachedStatus::default()
        };
        assert_eq!(
            digest_of(&with_condition(1, "False")),
            digest_of(&with_condition(2, "False"))
        );
        assert_ne!(
            digest_of(&with_condition(1, "False")),
            digest_of(&with_condition(1, "True"))
        );
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

        // A state that stands for the hold is written; each new state starts the hold again.
        let named = |name: &str| {
            let mut o = memcached("5", 1);
            o.metadata.name = Some(name.into());
            o
        };
        let other = named("other");
        let first = writer.write(&other, status(1), Progress::Moving).await;
        assert!(matches!(first, Ok(StatusWrite::Held { .. })));
        tokio::time::advance(PROGRESS_HOLD / 2).await;
        let second = writer.write(&other, status(2), Progress::Moving).await;
        assert_eq!(
            second.expect("held"),
            StatusWrite::Held {
                retry: PROGRESS_HOLD
            },
            "a new state stands from now"
        );
        tokio::time::advance(PROGRESS_HOLD / 2).await;
        let again = writer.write(&other, status(2), Progress::Moving).await;
        assert_eq!(
            again.expect("held"),
            StatusWrite::Held {
                retry: PROGRESS_HOLD / 2
            },
            "the same state keeps its time"
        );
        tokio::time::advance(PROGRESS_HOLD / 2).await;
        let stood = writer.write(&other, status(2), Progress::Moving).await;
        assert_eq!((stood.expect("written"), sent()), (StatusWrite::Written, 2));

        // A rollout that never stands still is written once it has been held the longest.
        let busy = named("busy");
        let step = PROGRESS_HOLD - Duration::from_secs(1);
        let mut ready = 0;
        while writer
            .write(&busy, status(ready), Progress::Moving)
            .await
            .expect("held or written")
            != StatusWrite::Written
        {
            tokio::time::advance(step).await;
            ready += 1;
        }
        let waited = step * u32::try_from(ready).expect("a few steps");
        assert!(
            (PROGRESS_MAX_HOLD..PROGRESS_MAX_HOLD + step).contains(&waited),
            "written after {waited:?}"
        );
        assert!(writer.lock().held.is_empty());
    }
}
