//! Writing a custom resource's status once per change, and holding back the passing states of
//! a rollout for a moment (see [`StatusWriter`]).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use kube::api::{ObjectMeta, Patch, PatchParams};
use kube::core::object::HasStatus;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use crate::Error;
use crate::own_writes::{OwnWrites, Subject};
use crate::writes;

/// A custom resource with a status subresource, namespaced or cluster-scoped: every
/// `#[derive(CustomResource)]` type with `#[kube(status = ...)]` (through kube's [`HasStatus`]).
pub trait WithStatus:
    Resource<DynamicType = ()>
    + 'static
    + HasStatus<Status: Clone + PartialEq + Serialize + Send + 'static>
    + Clone
    + DeserializeOwned
    + std::fmt::Debug
{
}

impl<K> WithStatus for K where
    K: Resource<DynamicType = ()>
        + 'static
        + HasStatus<Status: Clone + PartialEq + Serialize + Send + 'static>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
{
}

/// Whether a status reports a state that lasts, or one a rollout is passing through (which
/// [`StatusWriter`] may hold back for a moment, to report the next instead).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Complete, failed, or blocked: nothing changes until somebody acts.
    Settled,
    /// On its way somewhere else.
    Moving,
}

impl Progress {
    /// [`Progress::Settled`] when `settled`, else [`Progress::Moving`].
    pub fn settled_if(settled: bool) -> Self {
        if settled { Self::Settled } else { Self::Moving }
    }
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
/// A status of a rollout in motion ([`Progress::Moving`]) is held back, so that a rollout
/// writes the states a user acts on rather than each step of each pod:
/// - The first passing state of a rollout is written once its *phase* has stood for
///   [`PROGRESS_HOLD`]: its `observedGeneration` and each condition's type, status and reason
///   (the Kubernetes API conventions' fields; messages, counts and lists are its details). Each
///   newer phase starts the hold again, so a phase the rollout passes straight through is never
///   written; no hold lasts longer than [`PROGRESS_MAX_HOLD`].
/// - After that (or when the object already reports a state of this rollout), only *news* is
///   written: a newer `observedGeneration`, a condition whose status changed, or fewer ready
///   replicas than reported. News is written once it has stood for [`PROGRESS_HOLD`] and
///   [`PROGRESS_MAX_HOLD`] has passed since the rollout's last write.
/// - The rest (a reason within the same condition status, messages, more ready replicas, the
///   list of pods) is progress toward the settled state and waits for it
///   ([`StatusWrite::Deferred`]): a rollout that a busy cluster draws out over minutes writes
///   its start and its end, like one that takes seconds, and never hides bad news.
/// - A settled state (complete, failed, blocked) is written at once, and ends the rollout.
///
/// A rollout that finishes within the hold writes once, complete; one that waits on a slow
/// cluster writes its start once it has stood, then its end.
pub struct StatusWriter<K: WithStatus> {
    client: kube::Client,
    /// The statuses written and not yet shown by the cache, as [`WrittenStatus`]es.
    written: OwnWrites,
    held: Mutex<Holds<K>>,
}

/// Each object's [`Progress::Moving`] status waiting to be written, and the size at which
/// those of deleted objects are next looked for.
struct Holds<K: WithStatus> {
    held: HashMap<ObjectRef<K>, Hold>,
    prune_at: usize,
}

/// A status written, until the cache shows it.
struct WrittenStatus<S> {
    /// The resourceVersion the object had when it was written.
    before: Option<String>,
    status: S,
}

/// An object whose rollout is in motion: the status held back now, and whether a passing state
/// of this rollout was written.
#[derive(Clone, Copy, Debug)]
struct Hold {
    /// When the first status held since the last write was computed, or, once a passing state
    /// of this rollout is written, when that was.
    since: Instant,
    /// The phase of the status held now ([`Summary::phase`]), and since when it has stood.
    phase: u64,
    phase_since: Instant,
    /// Whether a passing state of this rollout was written (at `since`).
    shown: bool,
    /// When the object was last reconciled with a status in motion (to drop what is left of
    /// deleted objects).
    seen: Instant,
}

impl Hold {
    fn new(now: Instant, phase: u64) -> Self {
        Self {
            since: now,
            phase,
            phase_since: now,
            shown: false,
            seen: now,
        }
    }
}

/// Holds remembered before those of deleted objects are first looked for. After each look,
/// the next waits until the map has doubled, so a burst of rollouts costs a constant each.
const PRUNE_AFTER: usize = 1024;
/// How long a status written, or a hold, is remembered at most: past it the cache has long
/// shown the write, or the object is gone.
const REMEMBERED_FOR: Duration = Duration::from_secs(60);

/// How long a new phase of a rollout in motion must stand before it is written (see
/// [`StatusWriter`]). On a busy cluster the steps of one rollout come seconds apart (its
/// controllers are the queue): a hold of one second wrote nearly every step, where
/// controller-runtime's busier queue folds them.
pub const PROGRESS_HOLD: Duration = Duration::from_secs(5);

/// The longest the first passing state of a rollout is held, and how far apart its news is
/// written.
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
    /// The status reports progress of a rollout whose passing state the object shows already,
    /// and nothing a user acts on: it is written with the rollout's next news or its settled
    /// state, which the watched objects' next change brings.
    Deferred,
}

impl<K: WithStatus> std::fmt::Debug for StatusWriter<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusWriter").finish_non_exhaustive()
    }
}

impl<K: WithStatus> StatusWriter<K> {
    /// Writes through `client`, remembering what it wrote in `own_writes`, the controller's
    /// ([`Tools::own_writes`](crate::Tools::own_writes)).
    pub fn new(client: kube::Client, own_writes: OwnWrites) -> Self {
        Self {
            client,
            written: own_writes,
            held: Mutex::new(Holds {
                held: HashMap::new(),
                prune_at: PRUNE_AFTER,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Holds<K>> {
        // A poisoned lock only means another reconcile panicked mid-insert; the map is valid.
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `obj` as cached, or, while the cache is behind a status write of ours, with that status.
    pub fn latest<'a>(&self, obj: &'a K) -> Cow<'a, K> {
        let subject = Subject::object(&crate::object_key(obj));
        let version = obj.resource_version();
        let ahead = self
            .written
            .recall(&subject, |written: &mut WrittenStatus<K::Status>, _| {
                (written.before == version).then(|| written.status.clone())
            });
        match ahead {
            Some(Some(status)) => {
                let mut newer = obj.clone();
                *newer.status_mut() = Some(status);
                Cow::Owned(newer)
            }
            Some(None) => {
                // The cache has caught up (or somebody else wrote since): it is the truth again.
                self.written.forget(&subject);
                Cow::Borrowed(obj)
            }
            None => Cow::Borrowed(obj),
        }
    }

    /// Writes `status` to `obj` (as [`StatusWriter::latest`] shows it) unless it already has
    /// it, or it reports a rollout in motion that has not yet waited [`PROGRESS_HOLD`].
    ///
    /// # Errors
    /// [`Error::Kube`] when the API server refuses.
    pub async fn write(
        &self,
        obj: &K,
        status: K::Status,
        progress: Progress,
    ) -> Result<StatusWrite, Error> {
        let key = crate::object_key(obj);
        if obj.status() == Some(&status) {
            if progress == Progress::Settled {
                self.lock().held.remove(&key);
            }
            return Ok(StatusWrite::Unchanged);
        }
        if progress == Progress::Moving
            && let Some(held) = self.hold(key.clone(), &status, obj.status())
        {
            return Ok(held);
        }
        let answered = patch_status(&self.client, obj, &status).await?;
        if let Some(uid) = obj.uid() {
            (self.written).wrote_object(&uid, obj.resource_version(), answered.resource_version);
        }
        let now = Instant::now();
        let mut holds = self.lock();
        match progress {
            Progress::Settled => {
                holds.held.remove(&key);
            }
            Progress::Moving => {
                // The rollout goes on: its next passing state waits for the longest hold.
                let hold = Hold {
                    shown: true,
                    ..Hold::new(now, Summary::of(Some(&status)).phase)
                };
                holds.held.insert(key.clone(), hold);
                if holds.held.len() >= holds.prune_at {
                    holds
                        .held
                        .retain(|_, hold| hold.seen.elapsed() < REMEMBERED_FOR);
                    holds.prune_at = PRUNE_AFTER.max(2 * holds.held.len());
                }
            }
        }
        drop(holds);
        let written = WrittenStatus {
            before: obj.resource_version(),
            status,
        };
        let until = std::time::Instant::now() + REMEMBERED_FOR;
        (self.written).keep(Subject::object(&key), written, until);
        Ok(StatusWrite::Written)
    }
}

impl<K: WithStatus> StatusWriter<K> {
    /// Holds `status`, a state of a rollout in motion, of an object that reports `reported`:
    /// what to answer instead of writing it, or `None` when it is to be written now (see
    /// [`StatusWriter`]).
    fn hold(
        &self,
        key: ObjectRef<K>,
        status: &K::Status,
        reported: Option<&K::Status>,
    ) -> Option<StatusWrite> {
        let now = Instant::now();
        let (held, shown) = (Summary::of(Some(status)), Summary::of(reported));
        let mut written = self.lock();
        let hold = written
            .held
            .entry(key)
            .or_insert_with(|| Hold::new(now, held.phase));
        hold.seen = now;
        if hold.phase != held.phase {
            hold.phase = held.phase;
            hold.phase_since = now;
        }
        let stood_left = PROGRESS_HOLD.saturating_sub(now - hold.phase_since);
        let spaced_left = PROGRESS_MAX_HOLD.saturating_sub(now - hold.since);
        // The same signal as a passing state means the object shows one of this rollout (a
        // settled state differs in its conditions), written by us or before a restart.
        let left = if hold.shown || held.signal == shown.signal {
            // The object shows a passing state of this rollout: only news is worth a write.
            if !held.is_news_over(&shown) {
                return Some(StatusWrite::Deferred);
            }
            stood_left.max(spaced_left)
        } else {
            // Its first passing state: once its phase has stood, or once held for the longest.
            stood_left.min(spaced_left)
        };
        (!left.is_zero()).then_some(StatusWrite::Held { retry: left })
    }
}

/// What the hold compares of a status (see [`StatusWriter`]), read through its JSON form so
/// that it works for any kind's status with the Kubernetes API conventions' field names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Summary {
    /// A digest of its phase: its `observedGeneration`, and each condition's type, status and
    /// reason. Messages (which carry counts) and transition times are left out: a condition
    /// that changes while its status is held gets the time of each reconcile that computes it.
    phase: u64,
    /// The same without the reasons: what a user acts on.
    signal: u64,
    /// `readyReplicas`, where the status has it.
    ready: Option<i64>,
}

impl Summary {
    fn of<S: Serialize>(status: Option<&S>) -> Self {
        use serde_json::Value;
        use std::hash::{Hash, Hasher};
        let value = status
            .and_then(|s| serde_json::to_value(s).ok())
            .unwrap_or_default();
        let field = |v: &Value, key: &str| v.get(key).map(Value::to_string).unwrap_or_default();
        let mut phase = std::collections::hash_map::DefaultHasher::new();
        let mut signal = std::collections::hash_map::DefaultHasher::new();
        field(&value, "observedGeneration").hash(&mut phase);
        field(&value, "observedGeneration").hash(&mut signal);
        for condition in value
            .get("conditions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            for key in ["type", "status"] {
                field(condition, key).hash(&mut phase);
                field(condition, key).hash(&mut signal);
            }
            field(condition, "reason").hash(&mut phase);
        }
        Self {
            phase: phase.finish(),
            signal: signal.finish(),
            ready: value.get("readyReplicas").and_then(Value::as_i64),
        }
    }

    /// Whether this status tells a user something to act on that `shown` does not.
    fn is_news_over(&self, shown: &Self) -> bool {
        let fewer_ready = matches!((self.ready, shown.ready), (Some(now), Some(was)) if now < was);
        self.signal != shown.signal || fewer_ready
    }
}

/// Writes `status` to `obj`'s status subresource (a merge patch: it replaces the lists).
///
/// # Errors
/// [`Error::Kube`] when the API server refuses.
pub(crate) async fn patch_status<K, S>(
    client: &kube::Client,
    obj: &K,
    status: &S,
) -> Result<ObjectMeta, Error>
where
    K: Resource<DynamicType = ()>,
    S: Serialize,
{
    let namespace = obj.namespace().unwrap_or_default();
    let patch = serde_json::json!({ "status": status });
    writes::patch::<K, _>(
        client,
        &namespace,
        &obj.name_any(),
        Some("status"),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memcached(resource_version: &str, size: i32) -> crate::test_resource::Memcached {
        let mut mc = crate::test_resource::Memcached::new(
            "m",
            crate::test_resource::MemcachedSpec {
                size,
                image: "memcached".into(),
                ..Default::default()
            },
        );
        mc.metadata.namespace = Some("ns".into());
        mc.metadata.resource_version = Some(resource_version.into());
        mc
    }

    /// A status writer whose API server answers every write with a Memcached at
    /// resourceVersion 2, and the count of its requests.
    fn echo_writer() -> (
        StatusWriter<crate::test_resource::Memcached>,
        crate::fake::ApiServer,
    ) {
        let server = crate::fake::ApiServer::echoing(
            serde_json::to_value(memcached("2", 1)).expect("serializable"),
        );
        (
            StatusWriter::new(server.client(), OwnWrites::default()),
            server,
        )
    }

    fn status(ready: i32) -> crate::test_resource::MemcachedStatus {
        crate::test_resource::MemcachedStatus {
            ready_replicas: ready,
            ..crate::test_resource::MemcachedStatus::default()
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
        assert!(writer.written.is_empty(), "the memory is dropped");
    }

    /// A status whose `Available` condition is `available` and whose `Progressing` condition
    /// has `reason`, with `ready` replicas, whose conditions changed at `second`.
    fn rollout(
        available: bool,
        reason: &str,
        ready: i32,
        second: i64,
    ) -> crate::test_resource::MemcachedStatus {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
        let at = Time(k8s_openapi::jiff::Timestamp::from_second(second).expect("a time"));
        let condition = |type_: &str, status: bool, reason: &str| Condition {
            type_: type_.into(),
            status: if status { "True" } else { "False" }.into(),
            reason: reason.into(),
            message: format!("{ready} of 3 replicas available"),
            last_transition_time: at.clone(),
            observed_generation: None,
        };
        crate::test_resource::MemcachedStatus {
            ready_replicas: ready,
            observed_generation: Some(2),
            conditions: vec![
                condition("Available", available, "Replicas"),
                condition("Progressing", true, reason),
            ],
            ..crate::test_resource::MemcachedStatus::default()
        }
    }

    /// A status of a rollout in the phase `reason`, with `ready` of 3 replicas.
    fn phase(reason: &str, ready: i32, second: i64) -> crate::test_resource::MemcachedStatus {
        rollout(false, reason, ready, second)
    }

    #[test]
    fn a_phase_is_the_generation_and_the_conditions_without_their_details() {
        let of = |s: crate::test_resource::MemcachedStatus| Summary::of(Some(&s));
        assert_eq!(
            of(phase("ScalingUp", 1, 1)).phase,
            of(phase("ScalingUp", 2, 2)).phase,
            "counts, messages and transition times are details"
        );
        let (scaling, rolling) = (of(phase("ScalingUp", 1, 1)), of(phase("RollingOut", 1, 1)));
        assert_ne!(scaling.phase, rolling.phase, "a reason is part of a phase");
        assert!(!rolling.is_news_over(&scaling), "and no news");
        let mut older = phase("ScalingUp", 1, 1);
        older.observed_generation = Some(1);
        assert!(
            scaling.is_news_over(&of(older.clone())),
            "a generation is news"
        );
        assert_ne!(
            of(older).phase,
            Summary::of::<crate::test_resource::MemcachedStatus>(None).phase
        );
        let available = of(rollout(true, "ScalingUp", 1, 1));
        assert!(
            available.is_news_over(&scaling),
            "so is a condition's status"
        );
        assert!(scaling.is_news_over(&available));
        let fewer = of(phase("ScalingUp", 0, 1));
        assert!(fewer.is_news_over(&scaling), "and fewer ready replicas");
        assert!(!scaling.is_news_over(&fewer), "but not more");
    }

    #[tokio::test(start_paused = true)]
    async fn a_status_in_motion_waits_for_the_next_or_for_the_hold() {
        let (writer, server) = echo_writer();
        let sent = || server.requests().len();
        let named = |name: &str| {
            let mut o = memcached("5", 1);
            o.metadata.name = Some(name.into());
            o
        };

        // A rollout that settles within the hold writes only the settled status.
        let quick = named("quick");
        let held = writer
            .write(&quick, phase("ScalingUp", 1, 0), Progress::Moving)
            .await;
        assert_eq!(
            held.expect("held"),
            StatusWrite::Held {
                retry: PROGRESS_HOLD
            }
        );
        let settled = writer.write(&quick, status(3), Progress::Settled).await;
        assert_eq!(
            (settled.expect("written"), sent()),
            (StatusWrite::Written, 1)
        );

        // A new phase is written once it has stood for the hold; a newer one starts it again,
        // and new details within it do not.
        let slow = named("slow");
        assert!(matches!(
            writer
                .write(&slow, phase("ScalingUp", 1, 0), Progress::Moving)
                .await,
            Ok(StatusWrite::Held { .. })
        ));
        tokio::time::advance(PROGRESS_HOLD / 2).await;
        assert_eq!(
            writer
                .write(&slow, phase("RollingOut", 1, 2), Progress::Moving)
                .await
                .expect("held"),
            StatusWrite::Held {
                retry: PROGRESS_HOLD
            },
            "a new phase stands from now"
        );
        tokio::time::advance(PROGRESS_HOLD / 2).await;
        assert_eq!(
            writer
                .write(&slow, phase("RollingOut", 2, 5), Progress::Moving)
                .await
                .expect("held"),
            StatusWrite::Held {
                retry: PROGRESS_HOLD / 2
            },
            "new details keep the phase's time"
        );
        tokio::time::advance(PROGRESS_HOLD / 2).await;
        let stood = writer
            .write(&slow, phase("RollingOut", 2, 7), Progress::Moving)
            .await;
        assert_eq!((stood.expect("written"), sent()), (StatusWrite::Written, 2));
        assert!(
            writer.lock().held.values().all(|hold| hold.shown),
            "only the written rollout is remembered, as in motion"
        );

        // A rollout that never stops changing phase is written once held for the longest.
        let restless = named("restless");
        let mut waited = Duration::ZERO;
        let reasons = ["ScalingUp", "RollingOut"];
        while writer
            .write(
                &restless,
                phase(reasons[sent() % 2], 1, 0),
                Progress::Moving,
            )
            .await
            .expect("held or written")
            != StatusWrite::Written
        {
            tokio::time::advance(PROGRESS_HOLD / 2).await;
            waited += PROGRESS_HOLD / 2;
            let next = phase(reasons[(sent() + 1) % 2], 1, 0);
            let _ = writer.write(&restless, next, Progress::Moving).await;
            tokio::time::advance(PROGRESS_HOLD / 2).await;
            waited += PROGRESS_HOLD / 2;
        }
        assert_eq!(waited, PROGRESS_MAX_HOLD, "no hold is longer");
        assert_eq!(sent(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn progress_within_a_shown_state_waits_for_the_settled_one() {
        let (writer, server) = echo_writer();
        let sent = || server.requests().len();

        // The object reports a passing state already (written before a restart, say).
        let mut reporting = memcached("5", 3);
        reporting.status = Some(phase("DeploymentUpdating", 0, 0));
        for (ready, reason) in [(0, "ScalingUp"), (1, "ScalingUp"), (2, "RollingOut")] {
            tokio::time::advance(PROGRESS_MAX_HOLD).await;
            assert_eq!(
                writer
                    .write(&reporting, phase(reason, ready, 0), Progress::Moving)
                    .await
                    .expect("deferred"),
                StatusWrite::Deferred,
                "{ready} ready, {reason}: progress is no news"
            );
        }
        assert_eq!(sent(), 0);

        // Fewer ready replicas than it reports are news, written once they have stood.
        reporting.status = Some(phase("ScalingUp", 2, 0));
        let fewer = phase("ScalingUp", 1, 0);
        assert_eq!(
            writer
                .write(&reporting, fewer.clone(), Progress::Moving)
                .await
                .expect("held"),
            StatusWrite::Held {
                retry: PROGRESS_HOLD
            }
        );
        tokio::time::advance(PROGRESS_HOLD).await;
        let written = writer.write(&reporting, fewer, Progress::Moving).await;
        assert_eq!(
            (written.expect("written"), sent()),
            (StatusWrite::Written, 1)
        );

        let settled = writer.write(&reporting, status(3), Progress::Settled).await;
        assert_eq!(
            (settled.expect("written"), sent()),
            (StatusWrite::Written, 2)
        );
        assert!(writer.lock().held.is_empty(), "the rollout is over");
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_passing_state_news_waits_for_the_longest_hold() {
        let (writer, server) = echo_writer();
        let sent = || server.requests().len();
        let mut mc = memcached("5", 2);

        // The first passing state is written once it has stood.
        let first = rollout(true, "RollingOut", 3, 0);
        assert!(matches!(
            writer.write(&mc, first.clone(), Progress::Moving).await,
            Ok(StatusWrite::Held { .. })
        ));
        tokio::time::advance(PROGRESS_HOLD).await;
        let written = writer.write(&mc, first.clone(), Progress::Moving).await;
        assert_eq!(
            (written.expect("written"), sent()),
            (StatusWrite::Written, 1)
        );
        mc.status = Some(first);

        // Another reason within the same condition statuses waits for the settled state.
        tokio::time::advance(PROGRESS_HOLD).await;
        let quiet = rollout(true, "ScalingUp", 3, 10);
        let deferred = writer.write(&mc, quiet, Progress::Moving).await;
        assert_eq!(deferred.expect("deferred"), StatusWrite::Deferred);

        // News (no longer available) is held until the longest hold has passed since that
        // write.
        let news = rollout(false, "RollingOut", 2, 10);
        let held = writer.write(&mc, news.clone(), Progress::Moving).await;
        assert_eq!(
            held.expect("held"),
            StatusWrite::Held {
                retry: PROGRESS_MAX_HOLD - PROGRESS_HOLD
            }
        );
        tokio::time::advance(PROGRESS_MAX_HOLD - 2 * PROGRESS_HOLD).await;
        let still = writer.write(&mc, news.clone(), Progress::Moving).await;
        assert_eq!(
            still.expect("held"),
            StatusWrite::Held {
                retry: PROGRESS_HOLD
            }
        );
        tokio::time::advance(PROGRESS_HOLD).await;
        let written = writer.write(&mc, news.clone(), Progress::Moving).await;
        assert_eq!(
            (written.expect("written"), sent()),
            (StatusWrite::Written, 2)
        );
        mc.status = Some(news);

        // Long after that write, news is written once it has stood.
        tokio::time::advance(PROGRESS_MAX_HOLD).await;
        let back = rollout(true, "RollingOut", 3, 50);
        let held = writer.write(&mc, back.clone(), Progress::Moving).await;
        assert_eq!(
            held.expect("held"),
            StatusWrite::Held {
                retry: PROGRESS_HOLD
            }
        );
        tokio::time::advance(PROGRESS_HOLD).await;
        let written = writer.write(&mc, back.clone(), Progress::Moving).await;
        assert_eq!(
            (written.expect("written"), sent()),
            (StatusWrite::Written, 3)
        );
        mc.status = Some(back);

        // The end of the rollout is written at once, and the next rollout starts afresh.
        let settled = writer.write(&mc, status(2), Progress::Settled).await;
        assert_eq!(
            (settled.expect("written"), sent()),
            (StatusWrite::Written, 4)
        );
        assert!(writer.lock().held.is_empty(), "the rollout is over");
    }
}
