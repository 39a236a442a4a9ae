//! Leader election on a `coordination.k8s.io/v1` Lease, with client-go's semantics, and
//! stricter where two leaders could otherwise act at once.
//!
//! - A candidate takes the Lease when it has no holder, or when it has not seen the record
//!   change for `leaseDurationSeconds` on its own monotonic clock (the holder's clock and
//!   `renewTime` are never compared with ours, exactly as client-go does).
//! - Every write is a replace carrying the `resourceVersion` that was read: when two candidates
//!   race, the API server accepts one and answers 409 Conflict to the other, so there is never
//!   more than one holder.
//! - The leader renews every retry period. If it cannot renew within the renew deadline, or
//!   finds the Lease held by someone else, released by someone else or deleted, leadership is
//!   lost and the caller must stop its controllers at once. As the renew deadline is shorter
//!   than the lease duration, a leader cut off from the API server stops before any standby
//!   can take over. The leader never takes a Lease back from another holder.
//! - A renewal counts from when it was sent, and [`LeaderStatus::write_deadline`] turns that
//!   into the write fence ([`crate::fence`]); the fence closes while the leader checks a Lease
//!   the watch showed changed by someone else, and until it has renewed a Lease whose duration
//!   someone shortened (a standby counts the shorter duration, the fence the renew deadline).
//! - `leaseTransitions` is incremented whenever the holder changes; `acquireTime` is set then.
//! - Releasing (on SIGTERM) writes an empty holder and a one-second duration, as client-go's
//!   `ReleaseOnCancel`, so a standby takes over at once. Its `renewTime` says when the leader
//!   stopped reconciling, and its `acquireTime` when it released: the standby that takes over
//!   reads how long before the release the leader stopped acting from the two (one clock), and
//!   checks what changed before that after what changes from then on ([`Acquired`]). It retries within a budget, reads the
//!   Lease first when an earlier write's outcome is unknown (also when shutdown interrupted an
//!   acquisition), and says so when it gives up.
//! - Candidates watch the single Lease object besides polling every retry period, so a standby
//!   notices a release within a round trip, and sleeps no longer than until the Lease it has
//!   observed would expire.
//!
//! The decision itself ([`decide`], [`next_record`]) is pure and unit-tested; the
//! [`LeaderElector`] does the I/O around it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::watcher;
use kube_operator_runtime::backoff::WatchBackoff;
use kube_operator_runtime::events::Events;
use kube_operator_runtime::reconnect::reconnecting;
use prometheus::IntGauge;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Leader election settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// What holding the Lease means, for what the elector says.
    pub role: LeaseRole,
    /// Name of the Lease.
    pub lease_name: String,
    /// Namespace of the Lease.
    pub namespace: String,
    /// This candidate's `holderIdentity`.
    pub identity: String,
    /// How long a standby waits, after it last saw the record change, before taking over.
    pub lease_duration: Duration,
    /// How long the leader tries to renew before giving up.
    pub renew_deadline: Duration,
    /// Interval between attempts.
    pub retry_period: Duration,
}

/// What holding a Lease means: leading every controller, being one member of the sharded
/// group, or carrying out a sharded group's cluster-wide duties ([`crate::duties`]). The
/// election is the same; what it says in logs, Events and refusals differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseRole {
    Leader,
    Member,
    Duties,
}

impl LeaseRole {
    /// Which Lease it is: `leader` or `member`.
    fn kind(self) -> &'static str {
        match self {
            Self::Leader => "leader",
            Self::Member => "member",
            Self::Duties => "cluster-duties",
        }
    }

    /// The Lease, as logs and the write fence name it.
    pub fn lease(self) -> &'static str {
        match self {
            Self::Leader => "leader lease",
            Self::Member => "member lease",
            Self::Duties => "cluster-duties lease",
        }
    }

    /// What taking part is called.
    fn election(self) -> &'static str {
        match self {
            Self::Leader => "leader election",
            Self::Member => "shard membership",
            Self::Duties => "cluster-duties election",
        }
    }

    /// What the holder does once it holds the Lease, and once it let go of it.
    fn began_and_ended(self) -> (&'static str, &'static str) {
        match self {
            Self::Leader => ("became leader", "stopped leading"),
            Self::Member => ("joined the shard group", "left the shard group"),
            Self::Duties => (
                "took the cluster-wide duties",
                "gave up the cluster-wide duties",
            ),
        }
    }
}

impl Settings {
    /// `leaseDurationSeconds` for this candidate's writes: the lease duration rounded up to
    /// whole seconds.
    pub fn lease_duration_seconds(&self) -> i32 {
        let secs =
            self.lease_duration.as_secs() + u64::from(self.lease_duration.subsec_nanos() > 0);
        i32::try_from(secs).unwrap_or(i32::MAX)
    }
}

/// The identity of this candidate: `$POD_NAME` (downward API), else the host name, then `_`
/// and a random suffix, as controller-runtime's. The suffix makes every process a candidate of
/// its own: a second process under the same pod name (a container restarted while the old one
/// still runs) neither leads with it nor renews its Lease. The part before `_` is what the
/// API server's fence compares with the pod name of the request's token; a pod or host name
/// never holds `_`.
pub fn default_identity() -> String {
    let name = std::env::var("POD_NAME")
        .ok()
        .map(|pod| pod.trim().to_owned())
        .filter(|pod| !pod.is_empty())
        .unwrap_or_else(|| {
            hostname::get()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_else(|_| "manager".to_owned())
        });
    format!("{name}_{:08x}", fastrand::u32(..))
}

/// Leadership as the rest of the process sees it: `/healthz`, the
/// `leader_election_master_status` gauge, and the write fence ([`LeaderStatus::write_deadline`]).
#[derive(Debug)]
pub struct LeaderStatus {
    leading: AtomicBool,
    /// When the last successful renewal was sent, on the monotonic clock and on the boot clock
    /// (see [`crate::boot_clock`]); `None` while writes are suspended.
    last_renew: Mutex<Option<(Instant, Option<Duration>)>>,
    /// Reads the boot clock: [`crate::boot_clock::since_boot`], or a test's.
    boot_clock: fn() -> Option<Duration>,
    renew_deadline: Duration,
    role: LeaseRole,
    gauge: IntGauge,
    /// Why the API server refuses this replica's Lease requests, until one succeeds.
    refused: Mutex<Option<String>>,
    /// Wakes the writes in flight when writing stops (a suspension or a step-down), so each
    /// checks at once instead of at its old deadline.
    closed: tokio::sync::Notify,
    /// How many times this replica has taken the Lease, so that work waiting for it starts
    /// at once instead of at its next timer.
    acquisitions: watch::Sender<u64>,
}

impl LeaderStatus {
    /// Not leading; `gauge` is set to 0.
    pub fn new(gauge: IntGauge, renew_deadline: Duration, role: LeaseRole) -> Self {
        gauge.set(0);
        Self {
            leading: AtomicBool::new(false),
            last_renew: Mutex::new(None),
            boot_clock: crate::boot_clock::since_boot,
            renew_deadline,
            role,
            gauge,
            refused: Mutex::new(None),
            closed: tokio::sync::Notify::new(),
            acquisitions: watch::Sender::new(0),
        }
    }

    /// Why this replica cannot take part in the election, if the API server refused its last
    /// Lease request for a reason that retrying will not change (forbidden, a namespace that
    /// does not exist, a name or object it rejects). `None` once a request succeeds.
    pub fn lease_refused(&self) -> Option<String> {
        self.refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn set_lease_refused(&self, reason: Option<String>) {
        *self
            .refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = reason;
    }

    /// Which Lease this is the status of.
    pub fn role(&self) -> LeaseRole {
        self.role
    }

    /// Whether this process holds the Lease.
    pub fn is_leading(&self) -> bool {
        self.leading.load(Ordering::SeqCst)
    }

    fn last_renew(&self) -> Option<Instant> {
        self.last_renew_on_both().map(|(at, _)| at)
    }

    fn last_renew_on_both(&self) -> Option<(Instant, Option<Duration>)> {
        *self
            .last_renew
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn set_last_renew(&self, at: Option<Instant>) {
        // The boot clock when `at` was, from how long ago `at` is on the monotonic clock.
        let on_boot_clock = |at: Instant| {
            let ago = Instant::now().saturating_duration_since(at);
            (self.boot_clock)().map(|now| now.saturating_sub(ago))
        };
        *self
            .last_renew
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            at.map(|at| (at, on_boot_clock(at)));
    }

    /// A renewal sent at `sent` succeeded. The time it was sent, not answered, counts: the
    /// API server wrote it, and standbys started counting, no earlier than that.
    pub(crate) fn renewed(&self, sent: Instant) {
        self.set_last_renew(Some(sent));
        if !self.leading.swap(true, Ordering::SeqCst) {
            self.acquisitions.send_modify(|count| *count += 1);
        }
        self.gauge.set(1);
    }

    /// Changes each time this replica takes the Lease (after not holding it).
    pub fn acquisitions(&self) -> watch::Receiver<u64> {
        self.acquisitions.subscribe()
    }

    /// Closes the write fence until the next successful renewal, while the elector checks a
    /// Lease that the watch showed changed by someone else.
    pub(crate) fn suspend_writes(&self) {
        self.set_last_renew(None);
        self.closed.notify_waiters();
    }

    pub(crate) fn stepped_down(&self) {
        self.leading.store(false, Ordering::SeqCst);
        self.set_last_renew(None);
        self.gauge.set(0);
        self.closed.notify_waiters();
    }

    /// Completes when writing stops (see [`LeaderStatus::write_deadline`]) after it is first
    /// polled or enabled.
    pub fn closed(&self) -> tokio::sync::futures::Notified<'_> {
        self.closed.notified()
    }

    /// Until when this replica may write: its last renewal plus the renew deadline, on the
    /// monotonic clock. A standby cannot take the Lease before then, as the renew deadline is
    /// shorter than the lease duration it waits. The reason otherwise.
    ///
    /// The deadline is checked on the boot clock too, which counts the time the machine was
    /// suspended: after a resume the monotonic clock shows no time passed, the standbys'
    /// clocks do.
    ///
    /// # Errors
    /// Why writing is not allowed now: not leading, suspended, or the deadline passed (for
    /// example after the process was frozen or the machine suspended), even before the
    /// elector notices.
    pub fn write_deadline(&self, now: Instant) -> Result<Instant, String> {
        let lease = self.role.lease();
        if !self.is_leading() {
            return Err(format!("this replica does not hold the {lease}"));
        }
        let Some((last, last_on_boot_clock)) = self.last_renew_on_both() else {
            return Err(format!(
                "the {lease} is being checked after a change by someone else"
            ));
        };
        if let (Some(then), Some(now)) = (last_on_boot_clock, (self.boot_clock)())
            && now.saturating_sub(then) >= self.renew_deadline
        {
            return Err(format!(
                "the {lease} was last renewed {:.1}s ago, counting time the machine was \
                 suspended, beyond the renew deadline of {}",
                now.saturating_sub(then).as_secs_f64(),
                crate::duration::Display(self.renew_deadline)
            ));
        }
        let deadline = last + self.renew_deadline;
        if now >= deadline {
            return Err(format!(
                "the {lease} was last renewed {:.1}s ago, beyond the renew deadline of {}",
                now.saturating_duration_since(last).as_secs_f64(),
                crate::duration::Display(self.renew_deadline)
            ));
        }
        Ok(deadline)
    }

    /// Why the process is wedged, if it is: it believes it leads but its last successful
    /// renewal is older than the renew deadline.
    pub fn wedged(&self, now: Instant) -> Option<String> {
        if !self.is_leading() {
            return None;
        }
        let last = self.last_renew()?;
        let since = now.saturating_duration_since(last);
        (since > self.renew_deadline).then(|| {
            format!(
                "{}: last renewal {:.1}s ago, renew deadline {:.1}s",
                self.role.election(),
                since.as_secs_f64(),
                self.renew_deadline.as_secs_f64()
            )
        })
    }
}

/// The fields of a Lease that leader election reads and writes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Record {
    /// `holderIdentity`; empty when released or never held.
    pub holder: String,
    /// `leaseDurationSeconds`.
    pub lease_duration_seconds: i32,
    /// `acquireTime`.
    pub acquire_time: Option<Timestamp>,
    /// `renewTime`.
    pub renew_time: Option<Timestamp>,
    /// `leaseTransitions`.
    pub transitions: i32,
}

impl Record {
    /// Reads the record from a Lease (missing fields are empty / zero).
    pub fn from_lease(lease: &Lease) -> Self {
        let spec = lease.spec.clone().unwrap_or_default();
        Self {
            holder: spec.holder_identity.unwrap_or_default(),
            lease_duration_seconds: spec.lease_duration_seconds.unwrap_or_default(),
            acquire_time: spec.acquire_time.map(|t| t.0),
            renew_time: spec.renew_time.map(|t| t.0),
            transitions: spec.lease_transitions.unwrap_or_default(),
        }
    }

    fn to_spec(&self) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.holder.clone()),
            lease_duration_seconds: Some(self.lease_duration_seconds),
            acquire_time: self.acquire_time.map(MicroTime),
            renew_time: self.renew_time.map(MicroTime),
            lease_transitions: Some(self.transitions),
            ..LeaseSpec::default()
        }
    }
}

/// What a candidate should do about a Lease record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// This candidate holds it: renew.
    Renew,
    /// Nobody holds it, or the holder's lease expired: take it.
    Acquire,
    /// Another holder's lease is valid for `remaining` more (on our clock).
    Wait {
        /// The current holder.
        holder: String,
        /// Time until it expires unless renewed.
        remaining: Duration,
    },
}

/// Decides about `record`, first seen unchanged at `observed_at`, at time `now`.
///
/// The lease of another holder expires `leaseDurationSeconds` after this candidate first saw
/// the record as it is (client-go's `observedTime`), never by comparing `renewTime` with the
/// local wall clock, so clock skew between nodes does not matter.
pub fn decide(record: &Record, observed_at: Instant, now: Instant, identity: &str) -> Decision {
    if record.holder == identity {
        return Decision::Renew;
    }
    if record.holder.is_empty() {
        return Decision::Acquire;
    }
    let duration =
        Duration::from_secs(u64::try_from(record.lease_duration_seconds).unwrap_or_default());
    let expires = observed_at + duration;
    if now >= expires {
        Decision::Acquire
    } else {
        Decision::Wait {
            holder: record.holder.clone(),
            remaining: expires - now,
        }
    }
}

/// The record this candidate writes to take or renew `old` at wall-clock time `now`.
pub fn next_record(
    old: &Record,
    identity: &str,
    lease_duration_seconds: i32,
    now: Timestamp,
) -> Record {
    let (acquire_time, transitions) = if old.holder == identity {
        (old.acquire_time.or(Some(now)), old.transitions)
    } else {
        (Some(now), old.transitions.saturating_add(1))
    };
    Record {
        holder: identity.to_owned(),
        lease_duration_seconds,
        acquire_time,
        renew_time: Some(now),
        transitions,
    }
}

/// The record that releases `old` at `now`: no holder, a one-second duration (client-go's
/// `ReleaseOnCancel`), and as `renewTime` the moment the holder stopped reconciling
/// (`stopped_acting`, no later than `now`; `now` when not known).
pub fn released_record(old: &Record, now: Timestamp, stopped_acting: Option<Timestamp>) -> Record {
    Record {
        holder: String::new(),
        lease_duration_seconds: 1,
        acquire_time: Some(now),
        renew_time: Some(stopped_acting.map_or(now, |at| at.min(now))),
        transitions: old.transitions,
    }
}

/// The most a released Lease is believed to say its holder stopped acting before it released
/// it: longer than any shutdown.
const MAX_STOP_BEFORE_RELEASE: Duration = Duration::from_secs(600);

/// How much earlier than seen a release is taken to have been written: what a watch event
/// takes to arrive, with room to spare. A change made in that time before the leader stopped
/// is then still treated as made after.
const RELEASE_SEEN_LATE_BY: Duration = Duration::from_secs(1);

/// The last moment the holder before `record` (first seen as it is at `observed_at`) is known
/// to have acted as leader: when it stopped reconciling, read from its release (how long
/// before the release, on its own clock), or the last renewal seen of a Lease that expired.
pub fn acted_until(record: &Record, observed_at: Instant) -> Instant {
    let released = record.holder.is_empty() && record.lease_duration_seconds == 1;
    if !released {
        return observed_at;
    }
    let stopped_before_release = match (record.renew_time, record.acquire_time) {
        (Some(stopped), Some(released)) => released
            .duration_since(stopped)
            .try_into()
            .unwrap_or(Duration::ZERO)
            .min(MAX_STOP_BEFORE_RELEASE),
        _ => Duration::ZERO,
    };
    observed_at
        .checked_sub(stopped_before_release + RELEASE_SEEN_LATE_BY)
        .unwrap_or(observed_at)
}

/// What [`LeaderElector::acquire`] learned of the leader before this candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Acquired {
    /// The last moment the previous holder is known to have acted ([`acted_until`]); none
    /// when the Lease was created (nobody led before).
    pub previous_acted_until: Option<std::time::Instant>,
}

/// What [`LeaderElector`] remembers of another holder after seeing `record` (first seen
/// unchanged at `at`): that holder and when its lease expires; nothing once this candidate
/// holds it, or once it was released by its holder (client-go's release: no holder, a
/// one-second duration); the holder from before when someone else only emptied it.
fn held_after(
    before: Option<(String, Instant)>,
    record: &Record,
    at: Instant,
    identity: &str,
) -> Option<(String, Instant)> {
    if record.holder == identity {
        return None;
    }
    if record.holder.is_empty() {
        let released = record.lease_duration_seconds == 1;
        return if released { None } else { before };
    }
    let duration = u64::try_from(record.lease_duration_seconds).unwrap_or_default();
    Some((record.holder.clone(), at + Duration::from_secs(duration)))
}

/// The outcome of one attempt to acquire or renew.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Attempt {
    /// This candidate holds the Lease now.
    Leading,
    /// Another candidate holds a valid lease (or, seen by the leader, any other holder).
    HeldBy { holder: String, remaining: Duration },
    /// The Lease this candidate led with was deleted.
    Gone,
    /// Another write got there first (409); look again.
    Conflict,
}

/// How the leader renews.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leading {
    /// From what it wrote last.
    Renew,
    /// After reading the Lease, which the watch showed changed by someone else.
    Verify,
}

/// How leading ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeadershipEnd {
    /// The caller asked to stop; the Lease is still held (release it with
    /// [`LeaderElector::release`]).
    Stopped,
    /// Leadership was lost; the reason.
    Lost(String),
}

/// How releasing the Lease ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    /// The Lease now has no holder and a one-second duration.
    Released,
    /// This candidate did not hold the Lease; nothing was written.
    NotHeld,
    /// No release could be written within the budget (the reason); the Lease expires on its
    /// own.
    GaveUp(String),
}

/// What a watch event on the Lease means to its leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// Held by this leader, as it wrote it.
    AsLeft,
    /// Held by this leader, but with a longer duration (edited by hand).
    Lengthened,
    /// Held by this leader, but with a shorter duration (edited by hand): a standby may take
    /// over sooner than the write fence assumes.
    Shortened,
    /// Held by someone else, or by no one.
    Foreign,
    /// Gone.
    Deleted,
}

/// What the Lease as `seen` by the watch means to its leader `identity`, whose own duration
/// is `own_seconds`.
fn assess_as_leader(seen: Option<&Watched>, identity: &str, own_seconds: i32) -> Seen {
    match seen {
        None => Seen::AsLeft,
        Some(Watched::Absent) => Seen::Deleted,
        Some(Watched::Present(lease)) => {
            let record = Record::from_lease(lease);
            if record.holder != identity {
                Seen::Foreign
            } else if record.lease_duration_seconds < own_seconds {
                Seen::Shortened
            } else if record.lease_duration_seconds > own_seconds {
                Seen::Lengthened
            } else {
                Seen::AsLeft
            }
        }
    }
}

/// What the watch on the Lease last reported.
#[derive(Debug, Clone)]
enum Watched {
    Present(Box<Lease>),
    Absent,
}

/// One candidate for one Lease.
pub struct LeaderElector {
    api: Api<Lease>,
    settings: Settings,
    status: Arc<LeaderStatus>,
    /// The last record seen and when it was first seen unchanged.
    observed: Option<(Record, Instant)>,
    /// Another holder last seen, and when its lease expires as seen from here: a Lease deleted
    /// or emptied by someone else is free only then (a holder's own release frees it at once).
    last_held: Option<(String, Instant)>,
    /// The record this candidate last tried to take over from someone else, and when it
    /// first saw it so.
    taken_over: Option<(Record, Instant)>,
    /// The `resourceVersion` of the last Lease read or written.
    resource_version: Option<String>,
    /// When the last successful acquisition or renewal was sent.
    last_renew: Option<Instant>,
    /// A write may have reached the API server without this candidate seeing the answer (a
    /// timeout, a transport error, or shutdown in the middle): only a read tells who holds
    /// the Lease now.
    uncertain: bool,
    changes: watch::Receiver<Option<Watched>>,
    watch_alive: bool,
    watch_stop: CancellationToken,
    /// Records "became leader" and "stopped leading" on the Lease, as client-go does.
    events: Option<Events>,
    /// The Lease's uid, once seen (for the Events' reference).
    lease_uid: Option<String>,
    /// What others set on the Lease (labels, annotations, owners), kept by every write.
    kept: ObjectMeta,
}

impl std::fmt::Debug for LeaderElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderElector")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Drop for LeaderElector {
    fn drop(&mut self) {
        self.watch_stop.cancel();
    }
}

/// What a write of the Lease keeps of `metadata` as last seen: what others set on it (labels,
/// annotations, owners, finalizers), which a replace would otherwise wipe.
fn kept_metadata(metadata: &ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        labels: metadata.labels.clone(),
        annotations: metadata.annotations.clone(),
        owner_references: metadata.owner_references.clone(),
        finalizers: metadata.finalizers.clone(),
        ..ObjectMeta::default()
    }
}

fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409)
}

/// Whether retrying a Lease request that failed with `error` cannot help: the API server
/// answered with a client error other than a conflict, a throttle or a timeout.
fn is_refusal(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status)
        if (400..500).contains(&status.code) && ![408, 409, 429].contains(&status.code))
}

impl LeaderElector {
    /// A candidate; starts watching the Lease at once.
    pub fn new(client: kube::Client, settings: Settings, status: Arc<LeaderStatus>) -> Self {
        let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
        let (sender, changes) = watch::channel(None);
        let watch_stop = CancellationToken::new();
        tokio::spawn(watch_lease(
            api.clone(),
            settings.lease_name.clone(),
            // Reconnect within a retry period: while the watch is down, the leader notices a change
            // by someone else only at its next renewal.
            WatchBackoff::new(settings.retry_period),
            sender,
            watch_stop.clone(),
        ));
        Self {
            api,
            settings,
            status,
            observed: None,
            last_held: None,
            taken_over: None,
            resource_version: None,
            last_renew: None,
            uncertain: false,
            changes,
            watch_alive: true,
            watch_stop,
            events: None,
            lease_uid: None,
            kept: ObjectMeta::default(),
        }
    }

    /// Records leadership changes as Events on the Lease through `events`.
    #[must_use]
    pub fn with_events(mut self, events: Events) -> Self {
        self.events = Some(events);
        self
    }

    /// An Event `<identity> <what>` on the Lease (reason `LeaderElection`, as client-go's),
    /// for `action` (distinct per kind of change, so one is never counted as a repeat of the
    /// other).
    fn record(&self, action: &'static str, what: &str) {
        let Some(events) = &self.events else {
            return;
        };
        let lease = ObjectReference {
            api_version: Some("coordination.k8s.io/v1".to_owned()),
            kind: Some("Lease".to_owned()),
            name: Some(self.settings.lease_name.clone()),
            namespace: Some(self.settings.namespace.clone()),
            uid: self.lease_uid.clone(),
            ..ObjectReference::default()
        };
        events.normal(
            &lease,
            "LeaderElection",
            action,
            format!("{} {what}", self.settings.identity),
        );
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    fn observe(&mut self, lease: &Lease) {
        let record = Record::from_lease(lease);
        match &self.observed {
            Some((seen, _)) if *seen == record => {}
            _ => self.observed = Some((record, Instant::now())),
        }
        if let Some((record, at)) = &self.observed {
            self.last_held =
                held_after(self.last_held.take(), record, *at, &self.settings.identity);
        }
        self.resource_version = lease.metadata.resource_version.clone();
        if lease.metadata.uid.is_some() {
            self.lease_uid = lease.metadata.uid.clone();
        }
        self.kept = kept_metadata(&lease.metadata);
    }

    fn lease_object(&self, record: &Record, resource_version: Option<String>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(self.settings.lease_name.clone()),
                namespace: Some(self.settings.namespace.clone()),
                resource_version,
                ..self.kept.clone()
            },
            spec: Some(record.to_spec()),
        }
    }

    /// Writes `record` over the Lease at the `resourceVersion` last seen.
    async fn replace(&mut self, record: &Record) -> Result<Attempt, kube::Error> {
        let lease = self.lease_object(record, self.resource_version.clone());
        match self
            .api
            .replace(&self.settings.lease_name, &PostParams::default(), &lease)
            .await
        {
            Ok(written) => {
                self.observe(&written);
                Ok(Attempt::Leading)
            }
            Err(e) if is_conflict(&e) => Ok(Attempt::Conflict),
            // Deleted since it was read: for the leader, lost; for a standby, look again.
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(Attempt::Gone),
            Err(e) => Err(e),
        }
    }

    /// The holder last seen and the time its lease has left, while it has some: a Lease gone
    /// or emptied by someone else is not free before.
    fn still_held(&self) -> Option<Attempt> {
        let (holder, expires) = self.last_held.as_ref()?;
        let remaining = expires.checked_duration_since(Instant::now())?;
        (!remaining.is_zero()).then(|| Attempt::HeldBy {
            holder: holder.clone(),
            remaining,
        })
    }

    /// One round of client-go's `tryAcquireOrRenew`. `leading`: this candidate leads, so any
    /// other holder, or no Lease at all, means it has lost.
    async fn try_acquire_or_renew(
        &mut self,
        leading: Option<Leading>,
    ) -> Result<Attempt, kube::Error> {
        let identity = self.settings.identity.clone();
        let seconds = self.settings.lease_duration_seconds();

        // Fast path: the leader renews from what it wrote last; a 409 means the Lease changed
        // since, and the slow path below looks at it. Not when the watch showed the Lease
        // changed: a replace of a deleted Lease would create it again.
        if leading != Some(Leading::Verify)
            && let Some((record, _)) = &self.observed
            && record.holder == identity
            && self.resource_version.is_some()
        {
            let next = next_record(record, &identity, seconds, Timestamp::now());
            if self.replace(&next).await? == Attempt::Leading {
                return Ok(Attempt::Leading);
            }
        }

        let Some(lease) = self.api.get_opt(&self.settings.lease_name).await? else {
            if leading.is_some() {
                return Ok(Attempt::Gone);
            }
            if let Some(held) = self.still_held() {
                return Ok(held);
            }
            let record = next_record(&Record::default(), &identity, seconds, Timestamp::now());
            let record = Record {
                transitions: 0,
                ..record
            };
            self.taken_over = None;
            let lease = self.lease_object(&record, None);
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.observe(&created);
                    Ok(Attempt::Leading)
                }
                Err(e) if is_conflict(&e) => Ok(Attempt::Conflict),
                Err(e) => Err(e),
            };
        };
        self.observe(&lease);
        let Some((record, observed_at)) = self.observed.clone() else {
            return Ok(Attempt::Conflict);
        };
        if leading.is_some() && record.holder != identity {
            // Written by someone else (a takeover, or an edit by hand): never take it back.
            return Ok(Attempt::HeldBy {
                holder: record.holder,
                remaining: Duration::ZERO,
            });
        }
        match decide(&record, observed_at, Instant::now(), &identity) {
            Decision::Wait { holder, remaining } => Ok(Attempt::HeldBy { holder, remaining }),
            Decision::Acquire
                if record.holder.is_empty()
                    && let Some(held) = self.still_held() =>
            {
                Ok(held)
            }
            Decision::Renew | Decision::Acquire => {
                if record.holder != identity {
                    self.taken_over = Some((record.clone(), observed_at));
                }
                let next = next_record(&record, &identity, seconds, Timestamp::now());
                self.replace(&next).await
            }
        }
    }

    /// One attempt, bounded by `limit`; errors are logged and reported as `None`.
    async fn attempt(&mut self, limit: Duration, leading: Option<Leading>) -> Option<Attempt> {
        // Until an answer arrives, a write of this attempt may have been applied.
        self.uncertain = true;
        let outcome = match tokio::time::timeout(limit, self.try_acquire_or_renew(leading)).await {
            Ok(Ok(attempt)) => {
                self.status.set_lease_refused(None);
                Some(attempt)
            }
            Ok(Err(error)) => {
                tracing::warn!(lease = %self.settings.lease_name, %error, "{} request failed", self.settings.role.election());
                if is_refusal(&error) {
                    let (namespace, name) = (&self.settings.namespace, &self.settings.lease_name);
                    self.status.set_lease_refused(Some(format!(
                        "the API server refuses requests for the {} Lease {namespace}/{name}: {error}",
                        self.settings.role.kind()
                    )));
                }
                return None;
            }
            Err(_) => {
                tracing::warn!(lease = %self.settings.lease_name, "{} request timed out", self.settings.role.election());
                return None;
            }
        };
        self.uncertain = false;
        outcome
    }

    fn jittered_retry(&self) -> Duration {
        // Up to 10 % later, so candidates started together do not stay in lockstep.
        self.settings
            .retry_period
            .mul_f64(1.0 + fastrand::f64() * 0.1)
    }

    /// Waits until the Lease is acquired (with what is known of the leader before), or
    /// `shutdown` is cancelled (`None`; then [`LeaderElector::release`] finds out whether an
    /// interrupted attempt took the Lease).
    pub async fn acquire(&mut self, shutdown: &CancellationToken) -> Option<Acquired> {
        tracing::info!(
            lease = %self.settings.lease_name,
            namespace = %self.settings.namespace,
            identity = %self.settings.identity,
            "attempting to acquire the {}",
            self.settings.role.lease()
        );
        let mut last_holder = String::new();
        loop {
            let sent = Instant::now();
            let attempt = tokio::select! {
                () = shutdown.cancelled() => return None,
                attempt = self.attempt(self.settings.renew_deadline, None) => attempt,
            };
            let wait = match attempt {
                Some(Attempt::Leading) => {
                    self.last_renew = Some(sent);
                    self.status.renewed(sent);
                    // What the watch showed so far is no newer than this write's answer.
                    self.changes.borrow_and_update();
                    tracing::info!(lease = %self.settings.lease_name, identity = %self.settings.identity, "acquired the {}", self.settings.role.lease());
                    self.record("Acquire", self.settings.role.began_and_ended().0);
                    let previous_acted_until = self
                        .taken_over
                        .take()
                        .map(|(record, at)| acted_until(&record, at).into_std());
                    return Some(Acquired {
                        previous_acted_until,
                    });
                }
                Some(Attempt::HeldBy { holder, remaining }) => {
                    if holder != last_holder {
                        tracing::info!(lease = %self.settings.lease_name, %holder, "the lease is held by another candidate; standing by");
                        last_holder = holder;
                    }
                    self.jittered_retry()
                        .min(remaining + Duration::from_millis(20))
                }
                Some(Attempt::Gone | Attempt::Conflict) | None => self.jittered_retry(),
            };
            if !self.wait_as_standby(shutdown, wait).await {
                return None;
            }
        }
    }

    /// Sleeps for `wait`, or less when the watch shows the Lease free or gone. `false` when
    /// `shutdown` was cancelled.
    async fn wait_as_standby(&mut self, shutdown: &CancellationToken, wait: Duration) -> bool {
        let mut deadline = Instant::now() + wait;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return false,
                () = tokio::time::sleep_until(deadline) => return true,
                changed = self.changes.changed(), if self.watch_alive => {
                    if changed.is_err() {
                        self.watch_alive = false;
                        continue;
                    }
                    let seen = self.changes.borrow_and_update().clone();
                    match seen {
                        Some(Watched::Absent) => return true,
                        Some(Watched::Present(lease)) => {
                            self.observe(&lease);
                            let Some((record, at)) = &self.observed else { continue };
                            match decide(record, *at, Instant::now(), &self.settings.identity) {
                                Decision::Acquire | Decision::Renew => return true,
                                Decision::Wait { remaining, .. } => {
                                    // Wake when the observed lease would expire, if that comes
                                    // before the planned retry.
                                    deadline = deadline.min(Instant::now() + remaining + Duration::from_millis(20));
                                }
                            }
                        }
                        None => {}
                    }
                }
            }
        }
    }

    /// Keeps renewing until `stop` is cancelled ([`LeadershipEnd::Stopped`]) or leadership is
    /// lost ([`LeadershipEnd::Lost`]; the status is then "not leading", so the write fence
    /// is closed).
    pub async fn hold(&mut self, stop: &CancellationToken) -> LeadershipEnd {
        let end = self.renew_loop(stop).await;
        if let LeadershipEnd::Lost(reason) = &end {
            self.status.stepped_down();
            tracing::error!(lease = %self.settings.lease_name, %reason, "{} lost", self.settings.role.election());
            self.record("StopLeading", self.settings.role.began_and_ended().1);
        }
        end
    }

    async fn renew_loop(&mut self, stop: &CancellationToken) -> LeadershipEnd {
        let mut next_attempt = Instant::now() + self.settings.retry_period;
        // Read the Lease before writing it: the watch showed it changed by someone else.
        let mut verify = false;
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => return LeadershipEnd::Stopped,
                changed = self.changes.changed(), if self.watch_alive => {
                    if changed.is_err() {
                        self.watch_alive = false;
                        continue;
                    }
                    let seen = self.changes.borrow_and_update().clone();
                    let seen = assess_as_leader(
                        seen.as_ref(),
                        &self.settings.identity,
                        self.settings.lease_duration_seconds(),
                    );
                    match seen {
                        Seen::AsLeft => continue,
                        // Stop writing, and check at once with a read: the event may be stale
                        // (from before this replica acquired the Lease), the read is not.
                        Seen::Foreign | Seen::Deleted => {
                            self.status.suspend_writes();
                            verify = true;
                        }
                        // Still ours, but a standby may count the shorter duration from now:
                        // no writes until a renewal has put ours back.
                        Seen::Shortened => self.status.suspend_writes(),
                        // Still ours: renew at once to put the right duration back.
                        Seen::Lengthened => {}
                    }
                }
                () = tokio::time::sleep_until(next_attempt) => {}
            }
            let Some(last_renew) = self.last_renew else {
                return LeadershipEnd::Lost("never acquired the lease".to_owned());
            };
            let deadline = last_renew + self.settings.renew_deadline;
            let sent = Instant::now();
            if sent >= deadline {
                return self.deadline_missed(last_renew);
            }
            let leading = if verify {
                Leading::Verify
            } else {
                Leading::Renew
            };
            match self.attempt(deadline - sent, Some(leading)).await {
                Some(Attempt::Leading) => {
                    self.last_renew = Some(sent);
                    self.status.renewed(sent);
                    verify = false;
                }
                Some(Attempt::HeldBy { holder, .. }) if holder.is_empty() => {
                    return LeadershipEnd::Lost(
                        "the lease was released by someone else".to_owned(),
                    );
                }
                Some(Attempt::HeldBy { holder, .. }) => {
                    return LeadershipEnd::Lost(format!("the lease is now held by {holder:?}"));
                }
                Some(Attempt::Gone) => {
                    return LeadershipEnd::Lost("the lease was deleted".to_owned());
                }
                Some(Attempt::Conflict) | None => {}
            }
            if Instant::now() >= deadline && self.last_renew == Some(last_renew) {
                return self.deadline_missed(last_renew);
            }
            next_attempt = Instant::now() + self.settings.retry_period;
        }
    }

    fn deadline_missed(&self, last_renew: Instant) -> LeadershipEnd {
        LeadershipEnd::Lost(format!(
            "could not renew the lease within the renew deadline of {} (last renewal {:.1}s ago)",
            crate::duration::Display(self.settings.renew_deadline),
            last_renew.elapsed().as_secs_f64()
        ))
    }

    /// Gives the Lease up if this candidate holds it: empty holder, one-second duration, so
    /// a standby takes over at once, and when its controllers stopped reconciling
    /// (`stopped_acting`, if they ran; see [`released_record`]). Retries with backoff within
    /// `budget`; when the outcome of an earlier write is unknown, reads the Lease first. Logs
    /// the outcome.
    pub async fn release(
        &mut self,
        budget: Duration,
        stopped_acting: Option<Timestamp>,
    ) -> Release {
        self.status.stepped_down();
        let outcome = self.try_release(budget, stopped_acting).await;
        let (lease, role) = (&self.settings.lease_name, self.settings.role.lease());
        match &outcome {
            Release::Released => {
                tracing::info!(%lease, "released the {role}");
                self.record("StopLeading", self.settings.role.began_and_ended().1);
            }
            Release::NotHeld => {
                tracing::debug!(%lease, "not holding the {role}; nothing to release")
            }
            Release::GaveUp(reason) => {
                tracing::warn!(%lease, %reason, "could not release the {role}; it expires on its own")
            }
        }
        outcome
    }

    async fn try_release(
        &mut self,
        budget: Duration,
        stopped_acting: Option<Timestamp>,
    ) -> Release {
        let deadline = Instant::now() + budget;
        let timed_out = || {
            Release::GaveUp(format!(
                "no answer within the release budget of {}",
                crate::duration::Display(budget)
            ))
        };
        let mut must_read = self.uncertain;
        let mut delay = Duration::from_millis(50);
        loop {
            let failure = if must_read {
                match tokio::time::timeout_at(deadline, self.api.get_opt(&self.settings.lease_name))
                    .await
                {
                    Err(_) => return timed_out(),
                    Ok(Ok(None)) => return Release::NotHeld,
                    Ok(Ok(Some(lease))) => {
                        self.observe(&lease);
                        self.uncertain = false;
                        must_read = false;
                        None
                    }
                    Ok(Err(error)) => Some(error),
                }
            } else {
                let Some((record, _)) = self.observed.clone() else {
                    return Release::NotHeld;
                };
                if record.holder != self.settings.identity {
                    return Release::NotHeld;
                }
                let released = released_record(&record, Timestamp::now(), stopped_acting);
                let lease = self.lease_object(&released, self.resource_version.clone());
                let params = PostParams::default();
                let written = self.api.replace(&self.settings.lease_name, &params, &lease);
                match tokio::time::timeout_at(deadline, written).await {
                    Err(_) => return timed_out(),
                    Ok(Ok(written)) => {
                        self.observe(&written);
                        return Release::Released;
                    }
                    // Changed since the last renewal: look again; release only if still ours.
                    Ok(Err(error)) if is_conflict(&error) => {
                        must_read = true;
                        None
                    }
                    Ok(Err(error)) => {
                        must_read = true;
                        Some(error)
                    }
                }
            };
            if let Some(error) = failure {
                if Instant::now() + delay >= deadline {
                    return Release::GaveUp(error.to_string());
                }
                tracing::debug!(%error, "releasing the {} failed; retrying", self.settings.role.lease());
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// Forwards the state of the one Lease to `sender` until `stop` is cancelled or nobody
/// listens. Errors are retried with `backoff`, as the controllers' watches are
/// ([`kube_operator_runtime::reconnect::reconnecting`]: kube's own `StreamBackoff` would start it over at
/// each new watcher's `Init`, so retrying ten times a second through an outage).
async fn watch_lease(
    api: Api<Lease>,
    name: String,
    backoff: WatchBackoff,
    sender: watch::Sender<Option<Watched>>,
    stop: CancellationToken,
) {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = std::pin::pin!(reconnecting(
        move || watcher(api.clone(), config.clone()),
        backoff
    ));
    let mut seen_in_init = false;
    loop {
        let event = tokio::select! {
            () = stop.cancelled() => return,
            () = sender.closed() => return,
            event = events.next() => event,
        };
        match event {
            None => return,
            Some(Err(error)) => tracing::debug!(%error, "lease watch error; retrying"),
            Some(Ok(watcher::Event::Init)) => seen_in_init = false,
            Some(Ok(watcher::Event::InitApply(lease))) => {
                seen_in_init = true;
                sender.send_replace(Some(Watched::Present(Box::new(lease))));
            }
            Some(Ok(watcher::Event::InitDone)) => {
                if !seen_in_init {
                    sender.send_replace(Some(Watched::Absent));
                }
            }
            Some(Ok(watcher::Event::Apply(lease))) => {
                sender.send_replace(Some(Watched::Present(Box::new(lease))));
            }
            Some(Ok(watcher::Event::Delete(_))) => {
                sender.send_replace(Some(Watched::Absent));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16) -> kube::Error {
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": code, "message": "m", "reason": "r",
        }))
        .expect("status");
        kube::Error::Api(Box::new(status))
    }

    #[test]
    fn a_lease_emptied_by_someone_else_stays_held_until_the_holder_seen_expires() {
        let at = Instant::now();
        let held = held_after(None, &record("a", 15), at, "me");
        assert_eq!(held, Some(("a".to_owned(), at + Duration::from_secs(15))));
        // Emptied by hand (the duration left as it was): still a's until then.
        let later = at + Duration::from_secs(3);
        assert_eq!(held_after(held.clone(), &record("", 15), later, "me"), held);
        // Released by its holder (no holder, one second): free at once.
        assert_eq!(held_after(held.clone(), &record("", 1), later, "me"), None);
        // Renewed by another holder: that one's, from when it was seen.
        let b = held_after(held.clone(), &record("b", 10), later, "me");
        assert_eq!(b, Some(("b".to_owned(), later + Duration::from_secs(10))));
        // Taken by this candidate: nothing to wait for.
        assert_eq!(held_after(held, &record("me", 15), later, "me"), None);
        // Never seen held: an empty Lease is free.
        assert_eq!(held_after(None, &record("", 15), at, "me"), None);
    }

    /// A boot clock the test moves: milliseconds.
    static BOOT_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1_000_000);

    fn test_boot_clock() -> Option<Duration> {
        Some(Duration::from_millis(BOOT_MS.load(Ordering::SeqCst)))
    }

    #[test]
    fn time_the_machine_was_suspended_counts_against_the_renew_deadline() {
        let gauge = IntGauge::new("leading", "h").expect("gauge");
        let mut status = LeaderStatus::new(gauge, Duration::from_secs(10), LeaseRole::Leader);
        status.boot_clock = test_boot_clock;
        let now = Instant::now();
        status.renewed(now);
        assert!(status.write_deadline(now).is_ok());
        // Suspended for 11 s: the monotonic clock stood still, the boot clock did not.
        BOOT_MS.fetch_add(11_000, Ordering::SeqCst);
        let error = status.write_deadline(now).expect_err("past the deadline");
        assert!(error.contains("suspended"), "{error}");
        // The next renewal opens the fence again.
        status.renewed(Instant::now());
        assert!(status.write_deadline(Instant::now()).is_ok());
    }

    #[test]
    fn only_lasting_client_errors_count_as_refusals() {
        for code in [400, 403, 404, 422] {
            assert!(is_refusal(&api_error(code)), "{code}");
        }
        for code in [408, 409, 429, 500, 503] {
            assert!(!is_refusal(&api_error(code)), "{code}");
        }
    }

    fn record(holder: &str, seconds: i32) -> Record {
        Record {
            holder: holder.to_owned(),
            lease_duration_seconds: seconds,
            transitions: 3,
            ..Record::default()
        }
    }

    #[test]
    fn own_lease_is_renewed() {
        let now = Instant::now();
        assert_eq!(decide(&record("me", 15), now, now, "me"), Decision::Renew);
    }

    #[test]
    fn free_lease_is_acquired() {
        let now = Instant::now();
        assert_eq!(decide(&record("", 15), now, now, "me"), Decision::Acquire);
    }

    #[test]
    fn foreign_lease_waits_until_expired_on_local_clock() {
        let seen = Instant::now();
        let held = record("other", 15);
        assert_eq!(
            decide(&held, seen, seen + Duration::from_secs(5), "me"),
            Decision::Wait {
                holder: "other".to_owned(),
                remaining: Duration::from_secs(10)
            }
        );
        assert_eq!(
            decide(&held, seen, seen + Duration::from_secs(15), "me"),
            Decision::Acquire
        );
        assert_eq!(
            decide(&held, seen, seen + Duration::from_secs(60), "me"),
            Decision::Acquire
        );
        // A negative duration from a broken writer does not make the lease eternal.
        assert_eq!(
            decide(&record("other", -5), seen, seen, "me"),
            Decision::Acquire
        );
    }

    #[test]
    fn renewal_keeps_acquire_time_and_transitions() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let t1 = Timestamp::from_second(1_002).unwrap();
        let mine = Record {
            acquire_time: Some(t0),
            renew_time: Some(t0),
            ..record("me", 15)
        };
        let next = next_record(&mine, "me", 15, t1);
        assert_eq!(next.acquire_time, Some(t0));
        assert_eq!(next.renew_time, Some(t1));
        assert_eq!(next.transitions, 3);
    }

    #[test]
    fn takeover_counts_a_transition() {
        let t1 = Timestamp::from_second(1_002).unwrap();
        let next = next_record(&record("other", 15), "me", 4, t1);
        assert_eq!(
            next,
            Record {
                holder: "me".to_owned(),
                lease_duration_seconds: 4,
                acquire_time: Some(t1),
                renew_time: Some(t1),
                transitions: 4
            }
        );
        // Taking a released lease is a transition too, as in client-go.
        assert_eq!(next_record(&record("", 1), "me", 15, t1).transitions, 4);
    }

    #[test]
    fn writes_keep_what_others_set_on_the_lease() {
        let seen = ObjectMeta {
            name: Some("lease".into()),
            resource_version: Some("7".into()),
            uid: Some("uid".into()),
            labels: Some([("team".to_owned(), "platform".to_owned())].into()),
            annotations: Some([("note".to_owned(), "keep".to_owned())].into()),
            ..ObjectMeta::default()
        };
        let kept = kept_metadata(&seen);
        assert_eq!(kept.labels, seen.labels);
        assert_eq!(kept.annotations, seen.annotations);
        // What the API server owns is not sent back.
        assert_eq!(
            (kept.resource_version, kept.uid, kept.name),
            (None, None, None)
        );
    }

    #[test]
    fn release_empties_the_holder() {
        let t = Timestamp::from_second(5).unwrap();
        let released = released_record(&record("me", 15), t, None);
        assert_eq!(
            (
                released.holder.as_str(),
                released.lease_duration_seconds,
                released.transitions
            ),
            ("", 1, 3)
        );
        let now = Instant::now();
        assert_eq!(decide(&released, now, now, "other"), Decision::Acquire);
    }

    #[test]
    fn a_release_tells_how_long_before_it_its_holder_stopped_acting() {
        let stopped = Timestamp::from_second(100).unwrap();
        let released_at = Timestamp::from_second(103).unwrap();
        let released = released_record(&record("me", 15), released_at, Some(stopped));
        assert_eq!(
            (released.renew_time, released.acquire_time),
            (Some(stopped), Some(released_at))
        );
        let seen = Instant::now() + Duration::from_secs(60);
        assert_eq!(
            acted_until(&released, seen),
            seen - Duration::from_secs(3) - RELEASE_SEEN_LATE_BY
        );
        // A moment after the release is taken as the release (a clock that went back).
        let later = released_record(
            &record("me", 15),
            released_at,
            Some(Timestamp::from_second(108).unwrap()),
        );
        assert_eq!(later.renew_time, Some(released_at));
        // A release without it (client-go's): stopped when released.
        let theirs = released_record(&record("me", 15), released_at, None);
        assert_eq!(acted_until(&theirs, seen), seen - RELEASE_SEEN_LATE_BY);
        // An expired holder acted until its last renewal was seen.
        assert_eq!(acted_until(&record("other", 15), seen), seen);
    }

    #[test]
    fn record_round_trips_through_a_lease() {
        let t = Timestamp::from_second(7).unwrap();
        let rec = Record {
            acquire_time: Some(t),
            renew_time: Some(t),
            ..record("me", 15)
        };
        let lease = Lease {
            metadata: ObjectMeta::default(),
            spec: Some(rec.to_spec()),
        };
        assert_eq!(Record::from_lease(&lease), rec);
        assert_eq!(Record::from_lease(&Lease::default()), Record::default());
    }

    #[test]
    fn a_lease_shortened_by_hand_is_told_from_other_changes() {
        let present = |holder: &str, seconds: i32| {
            Watched::Present(Box::new(Lease {
                metadata: ObjectMeta::default(),
                spec: Some(record(holder, seconds).to_spec()),
            }))
        };
        let seen = |watched: Option<Watched>| assess_as_leader(watched.as_ref(), "me", 15);
        assert_eq!(seen(None), Seen::AsLeft);
        assert_eq!(seen(Some(present("me", 15))), Seen::AsLeft);
        assert_eq!(seen(Some(present("me", 1))), Seen::Shortened);
        assert_eq!(seen(Some(present("me", i32::MAX))), Seen::Lengthened);
        assert_eq!(seen(Some(present("other", 15))), Seen::Foreign);
        assert_eq!(seen(Some(present("", 1))), Seen::Foreign);
        assert_eq!(seen(Some(Watched::Absent)), Seen::Deleted);
    }

    #[test]
    fn lease_seconds_round_up() {
        let settings = |d| Settings {
            role: LeaseRole::Leader,
            lease_name: "l".into(),
            namespace: "n".into(),
            identity: "i".into(),
            lease_duration: d,
            renew_deadline: Duration::ZERO,
            retry_period: Duration::ZERO,
        };
        assert_eq!(
            settings(Duration::from_secs(15)).lease_duration_seconds(),
            15
        );
        assert_eq!(
            settings(Duration::from_millis(1500)).lease_duration_seconds(),
            2
        );
    }

    #[test]
    fn status_reports_a_missed_deadline() {
        let gauge = IntGauge::new("g", "h").unwrap();
        let status = LeaderStatus::new(gauge.clone(), Duration::from_secs(10), LeaseRole::Leader);
        let now = Instant::now();
        assert_eq!(
            status.wedged(now + Duration::from_secs(60)),
            None,
            "a standby is never wedged"
        );
        status.renewed(now);
        assert_eq!(gauge.get(), 1);
        assert_eq!(status.wedged(now + Duration::from_secs(5)), None);
        assert!(status.wedged(now + Duration::from_secs(11)).is_some());
        status.stepped_down();
        assert_eq!(gauge.get(), 0);
        assert_eq!(status.wedged(now + Duration::from_secs(11)), None);
    }

    #[test]
    fn a_member_lease_is_named_as_one() {
        let gauge = IntGauge::new("g", "h").unwrap();
        let status = LeaderStatus::new(gauge, Duration::from_secs(10), LeaseRole::Member);
        let now = Instant::now();
        assert_eq!(
            status.write_deadline(now),
            Err("this replica does not hold the member lease".to_owned())
        );
        status.renewed(now);
        let late = status.write_deadline(now + Duration::from_secs(11));
        assert!(
            late.as_ref()
                .is_err_and(|e| e.starts_with("the member lease was last renewed")),
            "{late:?}"
        );
        assert!(
            status
                .wedged(now + Duration::from_secs(11))
                .is_some_and(|w| w.starts_with("shard membership: ")),
        );
    }
}
