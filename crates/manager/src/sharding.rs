//! Sharded mode (`sharding`): every replica reconciles a share of the objects, never two the
//! same object.
//!
//! - **Members.** Each replica holds a Lease of its own, `<group>-member-<identity>`, renewed
//!   like the leader Lease on a thread of its own ([`crate::leader`]); its writes are fenced by
//!   it as a leader's are by the leader Lease. A member whose Lease is released, or not renewed
//!   for its duration (as this replica observes it), has left.
//! - **Holders.** One more Lease, `<group>-shards`, records in an annotation which member holds
//!   which slots of the hash space ([`kube_operator_runtime::slots`]). It is only ever written
//!   with the resourceVersion it was read at, so two members never both take a slot.
//! - **Handover.** Every member computes the same shares from the members and the holders
//!   ([`slots::assign`]). A member lets go of a slot that is no longer its share by first
//!   stopping its reconciles of it ([`ShardControl::released`]) and then writing it free; it
//!   takes a slot that is its share and free (or held by a member that has left) by writing
//!   itself as holder and only then reconciling it. So a slot moves only after its old holder
//!   stopped writing for it: at once when it let go, a lease duration after its last renewal
//!   when it died.
//!
//! The coordinator reacts to every change of the namespace's Leases as its watch brings it, and
//! looks again every retry period for members that stopped renewing.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams, Preconditions};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube_operator_runtime::slots::{self, Slots};
use kube_operator_runtime::{ShardControl, Takeover};
use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::leader::Record;

/// The annotation of the holders' Lease that maps each member's identity to its slots.
pub const HOLDERS_ANNOTATION: &str = concat!(product::name!(), "/shard-holders");

/// What the coordinator needs to know.
#[derive(Debug, Clone)]
pub struct ShardSettings {
    /// The name the Leases of the group start with (`leader_election_id`).
    pub group: String,
    /// Where the Leases live.
    pub namespace: String,
    /// This replica's identity, as its member Lease names it.
    pub identity: String,
    /// How long a member that stopped renewing counts as a member still.
    pub lease_duration: Duration,
    /// How often to look again without a change.
    pub retry_period: Duration,
}

/// The prefix of the member Leases of `group`.
fn member_prefix(group: &str) -> String {
    format!("{group}-member-")
}

/// The member Lease of `identity` in `group`: its identity in the characters a Lease name
/// allows (lower-case letters, digits, `-` and `.`), cut to fit.
pub fn member_lease_name(group: &str, identity: &str) -> String {
    let tail: String = identity
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-' | '.') => c,
            _ => '-',
        })
        .collect();
    let mut name = format!("{}{tail}", member_prefix(group));
    name.truncate(253);
    let trimmed = name.trim_end_matches(['-', '.']).len();
    name.truncate(trimmed);
    name
}

/// The Lease that records the holders of `group`'s slots.
pub fn holders_lease_name(group: &str) -> String {
    format!("{group}-shards")
}

/// Which member holds which slots, as the holders' Lease records it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holders(pub BTreeMap<String, Slots>);

impl Holders {
    /// Reads the holders from the Lease's annotation (none yet: nobody holds anything).
    ///
    /// # Errors
    /// [`Error::Sharding`] naming the annotation when it is not a JSON object of slot sets.
    pub fn from_lease(lease: &Lease) -> Result<Self, Error> {
        let annotations = lease.metadata.annotations.as_ref();
        let Some(text) = annotations.and_then(|a| a.get(HOLDERS_ANNOTATION)) else {
            return Ok(Self::default());
        };
        let bad = |reason: String| {
            Error::Sharding(format!(
                "the annotation {HOLDERS_ANNOTATION} of Lease {} is not a map of members to \
                 slots such as {{\"pod-a\": \"0-31\"}}: {reason}",
                lease.metadata.name.as_deref().unwrap_or_default()
            ))
        };
        let raw: BTreeMap<String, String> =
            serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        let mut holders = BTreeMap::new();
        for (member, slots) in raw {
            let slots: Slots = slots.parse().map_err(|e| bad(format!("{member}: {e}")))?;
            holders.insert(member, slots);
        }
        Ok(Self(holders))
    }

    /// The annotation's value.
    pub fn to_annotation(&self) -> String {
        let raw: BTreeMap<&str, String> = self
            .0
            .iter()
            .filter(|(_, slots)| !slots.is_empty())
            .map(|(member, slots)| (member.as_str(), slots.to_string()))
            .collect();
        serde_json::to_string(&raw).unwrap_or_default()
    }

    /// The slots `member` holds.
    pub fn of(&self, member: &str) -> Slots {
        self.0.get(member).copied().unwrap_or_default()
    }

    /// The slots held by members of `live` other than `me`: not to be taken.
    fn held_by_others(&self, me: &str, live: &BTreeSet<String>) -> Slots {
        self.0
            .iter()
            .filter(|(member, _)| member.as_str() != me && live.contains(member.as_str()))
            .fold(Slots::NONE, |held, (_, slots)| held.union(*slots))
    }
}

/// What a member is to do about the holders it read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Plan {
    /// Slots it holds that are no longer its share: to let go of.
    pub release: Slots,
    /// Slots of its share that nobody live holds: to take.
    pub claim: Slots,
}

/// What `me` is to do, given the holders and the members alive now (`me` among them).
pub fn plan(holders: &Holders, live: &BTreeSet<String>, me: &str) -> Plan {
    let members: Vec<&str> = live.iter().map(String::as_str).collect();
    let share = slots::assign(&members, &holders.0)
        .get(me)
        .copied()
        .unwrap_or_default();
    let mine = holders.of(me);
    Plan {
        release: mine.without(share),
        claim: share
            .without(mine)
            .without(holders.held_by_others(me, live)),
    }
}

/// The members alive now, judged from their Leases as first seen unchanged.
#[derive(Debug, Default)]
struct Members {
    /// Each member Lease's record, when this replica first saw it as it is, and its
    /// resourceVersion.
    seen: HashMap<String, (Record, Instant, Option<String>)>,
    /// When the first live member other than this one expires unless renewed.
    next_expiry: Option<Instant>,
}

impl Members {
    /// The identities of the live members among `leases` at `now`, `me` always among them.
    fn live(
        &mut self,
        leases: &[Arc<Lease>],
        prefix: &str,
        me: &str,
        now: Instant,
    ) -> BTreeSet<String> {
        let mut live = BTreeSet::from([me.to_owned()]);
        let mut present = BTreeSet::new();
        self.next_expiry = None;
        for lease in leases {
            let Some(name) = lease
                .metadata
                .name
                .as_deref()
                .filter(|n| n.starts_with(prefix))
            else {
                continue;
            };
            present.insert(name.to_owned());
            let record = Record::from_lease(lease);
            let observed = match self.seen.get(name) {
                Some((seen, at, _)) if *seen == record => *at,
                _ => {
                    let version = lease.metadata.resource_version.clone();
                    self.seen
                        .insert(name.to_owned(), (record.clone(), now, version));
                    now
                }
            };
            let duration =
                Duration::from_secs(u64::try_from(record.lease_duration_seconds).unwrap_or(0));
            if !record.holder.is_empty() && now.saturating_duration_since(observed) < duration {
                if record.holder != me {
                    let expiry = observed + duration;
                    self.next_expiry = Some(self.next_expiry.map_or(expiry, |e| e.min(expiry)));
                }
                live.insert(record.holder);
            }
        }
        self.seen.retain(|name, _| present.contains(name));
        live
    }

    /// The member Leases left behind, with the resourceVersion they were seen at: released
    /// ones (a member that stopped) at once, and those that have stood still for
    /// [`LEFT_BEHIND_AFTER`] lease durations (a member that died). Never `me`'s.
    fn left_behind(&self, me: &str, now: Instant) -> Vec<(String, Option<String>)> {
        self.seen
            .iter()
            .filter(|(_, (record, observed, _))| {
                let duration =
                    Duration::from_secs(u64::try_from(record.lease_duration_seconds).unwrap_or(0));
                let stale =
                    now.saturating_duration_since(*observed) >= duration * LEFT_BEHIND_AFTER;
                record.holder != me && (record.holder.is_empty() || stale)
            })
            .map(|(name, (_, _, version))| (name.clone(), version.clone()))
            .collect()
    }
}

/// How many lease durations a dead member's Lease stands still before it is deleted: past the
/// moment its slots were taken (one lease duration), and soon enough that a replica which joins
/// later does not count it alive: a joiner has never seen it renew, so it would wait a whole
/// lease duration before taking its full share.
const LEFT_BEHIND_AFTER: u32 = 2;

/// Whether the API server lists and watches by shard (KEP-5866's `shardSelector`, alpha in
/// 1.36 behind the `ShardedListAndWatch` gate): asked with a list of the Leases of `namespace`
/// that selects the whole hash space. A server that honours the selector says so in the list's
/// `metadata.shardInfo`; one without the gate ignores the parameter and answers without it.
///
/// # Errors
/// [`Error::Sharding`] when the list itself fails.
pub async fn server_side_shards(client: &kube::Client, namespace: &str) -> Result<bool, Error> {
    let selector = Slots::ALL
        .ranges()
        .first()
        .map(slots::HashRange::uid_selector)
        .unwrap_or_default();
    let uri = format!(
        "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases?limit=1&shardSelector={}",
        kube_operator_runtime::shard_watch::query_escape(&selector)
    );
    let request = http::Request::get(uri)
        .body(Vec::new())
        .map_err(|e| Error::Sharding(format!("cannot build the shard probe: {e}")))?;
    let list: serde_json::Value = client.request(request).await.map_err(|e| {
        Error::Sharding(format!(
            "cannot list Leases to probe for sharded lists: {e}"
        ))
    })?;
    Ok(list["metadata"]["shardInfo"].is_object())
}

/// The coordinator's metrics.
#[derive(Debug, Clone)]
pub struct ShardMetrics {
    /// `operator_manager_shard_slots`: the slots of the 64 this replica reconciles.
    slots: IntGauge,
    /// `operator_manager_shard_ranges{start,end}`: 1 for each range of the uid hash space
    /// whose objects this replica reconciles (hex, `end` exclusive), adjacent slots merged.
    ranges: IntGaugeVec,
    /// `operator_manager_shard_members`: the members this replica sees alive.
    members: IntGauge,
    /// `operator_manager_shard_server_side`: 1 when the API server lists and watches by
    /// shard, 0 when each replica filters what it is sent ([`server_side_shards`]).
    server_side: IntGauge,
    /// `operator_manager_shard_rebalances_total{change}`: slots taken (`claimed`) or let go
    /// (`released`).
    rebalances: IntCounterVec,
    /// `operator_manager_shard_rebalance_duration_seconds`: from deciding to let go of or take
    /// slots until the holders' Lease says so (for a release, its reconciles' end included).
    duration: Histogram,
}

impl ShardMetrics {
    /// Shows `slots` as the replica's own.
    fn own(&self, slots: Slots) {
        self.slots.set(i64::from(slots.len()));
        self.ranges.reset();
        for range in slots.ranges() {
            let (start, end) = (
                format!("0x{:016x}", range.start),
                format!("0x{:016x}", range.end),
            );
            self.ranges
                .with_label_values(&[start.as_str(), end.as_str()])
                .set(1);
        }
    }

    /// Registers the metrics in `registry`.
    ///
    /// # Errors
    /// When a metric of the same name is registered already.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let metrics = Self {
            slots: IntGauge::new(
                "operator_manager_shard_slots",
                "Slots of the 64 of the uid hash space whose objects this replica reconciles",
            )?,
            ranges: IntGaugeVec::new(
                Opts::new(
                    "operator_manager_shard_ranges",
                    "Ranges of the uid hash space whose objects this replica reconciles, start inclusive and end exclusive",
                ),
                &["start", "end"],
            )?,
            members: IntGauge::new(
                "operator_manager_shard_members",
                "Replicas of the sharded manager this replica sees alive, itself included",
            )?,
            server_side: IntGauge::new(
                "operator_manager_shard_server_side",
                "1 when the API server lists and watches by shard (KEP-5866), 0 when replicas filter what they are sent",
            )?,
            rebalances: IntCounterVec::new(
                Opts::new(
                    "operator_manager_shard_rebalances_total",
                    "Slots this replica took (claimed) or let go of (released)",
                ),
                &["change"],
            )?,
            duration: Histogram::with_opts(
                HistogramOpts::new(
                    "operator_manager_shard_rebalance_duration_seconds",
                    "How long taking or letting go of slots took, a release's drain included",
                )
                .buckets(vec![
                    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                ]),
            )?,
        };
        registry.register(Box::new(metrics.slots.clone()))?;
        registry.register(Box::new(metrics.ranges.clone()))?;
        registry.register(Box::new(metrics.members.clone()))?;
        registry.register(Box::new(metrics.server_side.clone()))?;
        registry.register(Box::new(metrics.rebalances.clone()))?;
        registry.register(Box::new(metrics.duration.clone()))?;
        for change in ["claimed", "released"] {
            metrics.rebalances.with_label_values(&[change]);
        }
        Ok(metrics)
    }
}

/// Takes and lets go of slots for this replica, telling its controllers through `control`.
#[derive(Debug)]
pub struct ShardCoordinator {
    leases: Api<Lease>,
    settings: ShardSettings,
    control: ShardControl,
    metrics: ShardMetrics,
    /// The resourceVersion of the holders' Lease this replica's last write replaced.
    replaced: Mutex<Option<String>>,
}

impl ShardCoordinator {
    /// A coordinator for the replica `settings` describes.
    pub fn new(
        client: kube::Client,
        settings: ShardSettings,
        control: ShardControl,
        metrics: ShardMetrics,
    ) -> Self {
        let leases = Api::namespaced(client, &settings.namespace);
        Self {
            leases,
            settings,
            control,
            metrics,
            replaced: Mutex::new(None),
        }
    }

    /// Follows the group until `leaving` is cancelled, then lets go of every slot (once the
    /// controllers stopped reconciling them) and returns.
    ///
    /// # Errors
    /// [`Error::Sharding`] when the holders' Lease cannot be read or written while letting
    /// go; its slots then become free when this replica's member Lease expires.
    pub async fn run(self, leaving: CancellationToken) -> Result<(), Error> {
        let client = self.leases.clone().into_client();
        match server_side_shards(&client, &self.settings.namespace).await {
            Ok(true) => {
                self.control.lists_by_shard(true);
                self.metrics.server_side.set(1);
                tracing::info!("the API server lists and watches by shard (ShardedListAndWatch)");
            }
            Ok(false) => tracing::info!(
                "the API server lists and watches whole (no ShardedListAndWatch): each replica filters what it is sent"
            ),
            Err(error) => {
                tracing::warn!(%error, "cannot tell whether the API server lists by shard; filtering here")
            }
        }
        let (store, writer) = reflector::store::<Lease>();
        let changed = Arc::new(Notify::new());
        let watch = {
            let changed = changed.clone();
            watcher(self.leases.clone(), watcher::Config::default())
                .default_backoff()
                .reflect(writer)
                .for_each(move |event| {
                    if let Err(error) = event {
                        tracing::warn!(%error, "watching the shard Leases");
                    }
                    changed.notify_one();
                    std::future::ready(())
                })
        };
        let watching = tokio::spawn(watch);
        let result = self.follow(&store, &changed, &leaving).await;
        let left = self.leave().await;
        watching.abort();
        result.and(left)
    }

    async fn follow(
        &self,
        store: &Store<Lease>,
        changed: &Notify,
        leaving: &CancellationToken,
    ) -> Result<(), Error> {
        tokio::select! {
            () = leaving.cancelled() => return Ok(()),
            ready = store.wait_until_ready() => ready.map_err(|_| {
                Error::Sharding("the watch of the shard Leases ended before its first list".to_owned())
            })?,
        }
        let mut members = Members::default();
        let mut tick = tokio::time::interval(self.settings.retry_period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            self.round(store, &mut members).await?;
            // A member that stops renewing is gone the moment its lease runs out: look then,
            // not a retry period later.
            let expiry = members.next_expiry.map(tokio::time::Instant::from_std);
            tokio::select! {
                () = leaving.cancelled() => return Ok(()),
                () = changed.notified() => {}
                _ = tick.tick() => {}
                () = async { tokio::time::sleep_until(expiry.unwrap_or_else(tokio::time::Instant::now)).await }, if expiry.is_some() => {}
            }
        }
    }

    /// Looks at the Leases as cached, and lets go of or takes what the plan says.
    async fn round(&self, store: &Store<Lease>, members: &mut Members) -> Result<(), Error> {
        let me = self.settings.identity.as_str();
        let prefix = member_prefix(&self.settings.group);
        let holders_name = holders_lease_name(&self.settings.group);
        let live = members.live(&store.state(), &prefix, me, Instant::now());
        self.metrics
            .members
            .set(i64::try_from(live.len()).unwrap_or(i64::MAX));
        let holders_ref = ObjectRef::new(&holders_name).within(&self.settings.namespace);
        let Some(lease) = store.get(&holders_ref) else {
            self.create_holders(&holders_name).await;
            return Ok(());
        };
        let holders = match Holders::from_lease(&lease) {
            Ok(holders) => holders,
            Err(error) => {
                // Nothing is taken on a record that cannot be read: someone must fix it.
                tracing::error!(%error, "cannot read who holds which slots; taking none");
                return Ok(());
            }
        };
        // Slots this replica reconciles that the record no longer gives it (written there by
        // hand, or a record restored from a backup) are another's to take: stop at once.
        // (A record this replica has since replaced is not it: the watch has not brought the
        // write yet.)
        let replaced = self
            .replaced
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let stale = replaced.is_some() && replaced == lease.metadata.resource_version;
        let stray = self.control.slots().without(holders.of(me));
        if !stray.is_empty() && !stale {
            tracing::warn!(slots = %stray, "the shard holders' Lease no longer gives this replica slots it reconciles; stopping them");
            let keep = self.control.slots().without(stray);
            let generation = self.control.assign(keep, Takeover::default());
            self.control.released(generation).await;
            self.metrics.own(keep);
        }
        let plan = plan(&holders, &live, me);
        if !plan.release.is_empty() {
            self.release(plan.release).await?;
        } else if !plan.claim.is_empty() {
            self.claim(&lease, holders, plan.claim, &live).await;
        }
        // After the slots moved, not before: a handover waits for no cleanup.
        self.delete_left_behind(members).await;
        Ok(())
    }

    /// Deletes the member Leases that members which stopped or died left behind, each only as
    /// it was seen (another member may have deleted it already).
    async fn delete_left_behind(&self, members: &Members) {
        for (name, version) in members.left_behind(&self.settings.identity, Instant::now()) {
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: version,
                    uid: None,
                }),
                ..DeleteParams::default()
            };
            match self.leases.delete(&name, &params).await {
                Ok(_) => tracing::debug!(lease = name, "deleted a member Lease left behind"),
                Err(kube::Error::Api(status)) if matches!(status.code, 404 | 409) => {}
                Err(error) => {
                    tracing::warn!(%error, lease = name, "cannot delete a member Lease left behind");
                }
            }
        }
    }

    /// Creates the holders' Lease, empty; another member may have just done so.
    async fn create_holders(&self, name: &str) {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(self.settings.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: None,
        };
        match self.leases.create(&PostParams::default(), &lease).await {
            Ok(_) => tracing::info!(lease = name, "created the shard holders' Lease"),
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(error) => {
                tracing::warn!(%error, lease = name, "cannot create the shard holders' Lease")
            }
        }
    }

    /// Takes `claim`, free in `lease` as read: written with its resourceVersion, so a member
    /// that wrote since makes this attempt fail (and the next round decide again).
    async fn claim(
        &self,
        lease: &Lease,
        mut holders: Holders,
        claim: Slots,
        live: &BTreeSet<String>,
    ) {
        let started = Instant::now();
        let me = self.settings.identity.clone();
        let mine = holders.of(&me).union(claim);
        // A member that left gives up what it held: what it held is now either ours or free.
        let gone: Vec<String> = holders
            .0
            .keys()
            .filter(|m| !live.contains(*m))
            .cloned()
            .collect();
        let mut previous = Vec::new();
        for member in gone {
            if let Some(slots) = holders.0.get_mut(&member) {
                if !slots.intersection(claim).is_empty() {
                    previous.push(member.clone());
                }
                *slots = slots.without(claim);
            }
        }
        holders.0.retain(|_, slots| !slots.is_empty());
        holders.0.insert(me.clone(), mine);
        match self.write(lease, &holders).await {
            Ok(()) => {
                self.control.assign(mine, Takeover::default());
                self.metrics.own(mine);
                self.metrics
                    .rebalances
                    .with_label_values(&["claimed"])
                    .inc_by(u64::from(claim.len()));
                self.metrics
                    .duration
                    .observe(started.elapsed().as_secs_f64());
                tracing::info!(
                    claimed = %claim,
                    slots = %mine,
                    from_members_gone = ?previous,
                    "took slots"
                );
            }
            Err(error) if is_conflict(&error) => {
                tracing::debug!("the shard holders changed meanwhile; deciding again");
            }
            Err(error) => tracing::warn!(%error, "cannot take slots"),
        }
    }

    /// Lets go of `release`: the controllers stop reconciling its objects, then the holders'
    /// Lease says it is free.
    async fn release(&self, release: Slots) -> Result<(), Error> {
        let started = Instant::now();
        let keep = self.control.slots().without(release);
        let generation = self.control.assign(keep, Takeover::default());
        self.control.released(generation).await;
        self.metrics.own(keep);
        self.write_free(release).await?;
        self.metrics
            .rebalances
            .with_label_values(&["released"])
            .inc_by(u64::from(release.len()));
        self.metrics
            .duration
            .observe(started.elapsed().as_secs_f64());
        tracing::info!(released = %release, slots = %keep, "let go of slots");
        Ok(())
    }

    /// At shutdown: lets go of everything.
    async fn leave(&self) -> Result<(), Error> {
        let held = self.control.slots();
        let generation = self.control.assign(Slots::NONE, Takeover::default());
        self.control.released(generation).await;
        self.metrics.own(Slots::NONE);
        if held.is_empty() {
            return Ok(());
        }
        self.write_free(Slots::ALL).await?;
        tracing::info!(released = %held, "left the shard group");
        Ok(())
    }

    /// Writes `slots` free of this member, reading the holders' Lease afresh for each try.
    async fn write_free(&self, slots: Slots) -> Result<(), Error> {
        let name = holders_lease_name(&self.settings.group);
        let me = self.settings.identity.as_str();
        let mut last = None;
        for _ in 0..5 {
            let lease = self.leases.get(&name).await.map_err(|e| {
                Error::Sharding(format!("cannot read the shard holders' Lease {name}: {e}"))
            })?;
            let mut holders = Holders::from_lease(&lease)?;
            let kept = holders.of(me).without(slots);
            if kept == holders.of(me) {
                return Ok(());
            }
            holders.0.insert(me.to_owned(), kept);
            holders.0.retain(|_, s| !s.is_empty());
            match self.write(&lease, &holders).await {
                Ok(()) => return Ok(()),
                Err(error) if is_conflict(&error) => last = Some(error),
                Err(error) => {
                    return Err(Error::Sharding(format!(
                        "cannot write slots {slots} free in Lease {name}: {error}"
                    )));
                }
            }
        }
        Err(Error::Sharding(format!(
            "cannot write slots {slots} free in Lease {name}: it kept changing ({})",
            last.map(|e| e.to_string()).unwrap_or_default()
        )))
    }

    /// Replaces the holders' Lease `lease` (as read) with `holders`.
    async fn write(&self, lease: &Lease, holders: &Holders) -> Result<(), kube::Error> {
        let mut next = lease.clone();
        next.metadata.managed_fields = None;
        next.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(HOLDERS_ANNOTATION.to_owned(), holders.to_annotation());
        let name = holders_lease_name(&self.settings.group);
        self.leases
            .replace(&name, &PostParams::default(), &next)
            .await?;
        *self.replaced.lock().unwrap_or_else(PoisonError::into_inner) =
            lease.metadata.resource_version.clone();
        Ok(())
    }
}

fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(members: &[&str]) -> BTreeSet<String> {
        members.iter().map(|m| (*m).to_owned()).collect()
    }

    /// Holders as every member of `members` holding its share.
    fn settled(members: &[&str]) -> Holders {
        let mut holders = Holders::default();
        for count in 1..=members.len() {
            holders = Holders(slots::assign(&members[..count], &holders.0));
        }
        holders
    }

    #[test]
    fn a_newcomer_takes_only_what_the_others_let_go() {
        let before = settled(&["a", "b"]);
        let members = live(&["a", "b", "c"]);
        let (a, c) = (plan(&before, &members, "a"), plan(&before, &members, "c"));
        assert!(!a.release.is_empty() && a.claim.is_empty(), "{a:?}");
        assert!(c.claim.is_empty(), "nothing is free yet: {c:?}");
        // Once a and b have let go, c takes exactly that.
        let mut after = before.clone();
        for m in ["a", "b"] {
            let release = plan(&before, &members, m).release;
            after.0.insert(m.to_owned(), after.of(m).without(release));
        }
        let c = plan(&after, &members, "c");
        assert_eq!(c.claim.len(), 21);
        assert_eq!(
            c.claim.union(after.of("a")).union(after.of("b")),
            Slots::ALL
        );
        after.0.insert("c".to_owned(), c.claim);
        for m in ["a", "b", "c"] {
            assert_eq!(plan(&after, &members, m), Plan::default(), "{m} settled");
        }
    }

    #[test]
    fn a_member_gone_leaves_its_slots_to_the_others() {
        let before = settled(&["a", "b", "c"]);
        let members = live(&["a", "b"]);
        let a = plan(&before, &members, "a");
        let b = plan(&before, &members, "b");
        assert!(a.release.is_empty() && b.release.is_empty());
        assert_eq!(a.claim.union(b.claim), before.of("c"));
        assert!(a.claim.intersection(b.claim).is_empty());
        // While c is alive, its slots are not taken.
        assert_eq!(plan(&before, &live(&["a", "b", "c"]), "a"), Plan::default());
    }

    #[test]
    fn holders_read_back_what_was_written_and_bad_ones_are_named() {
        let holders = settled(&["pod-a_1", "pod-b_2"]);
        let mut lease = Lease::default();
        lease.metadata.name = Some("g-shards".into());
        lease.metadata.annotations = Some(BTreeMap::from([(
            HOLDERS_ANNOTATION.to_owned(),
            holders.to_annotation(),
        )]));
        assert_eq!(Holders::from_lease(&lease).expect("holders"), holders);
        assert_eq!(
            Holders::from_lease(&Lease::default()).expect("none"),
            Holders::default()
        );
        for bad in ["[1]", r#"{"a": "0-70"}"#] {
            lease.metadata.annotations = Some(BTreeMap::from([(
                HOLDERS_ANNOTATION.to_owned(),
                bad.to_owned(),
            )]));
            let error = Holders::from_lease(&lease).expect_err(bad).to_string();
            assert!(
                error.contains(HOLDERS_ANNOTATION) && error.contains("g-shards"),
                "{error}"
            );
        }
    }

    #[test]
    fn member_lease_names_are_valid_lease_names() {
        assert_eq!(
            member_lease_name("mgr-leader", "Pod-7d9f_0a1b2c3d"),
            "mgr-leader-member-pod-7d9f-0a1b2c3d"
        );
        let long = member_lease_name("g", &"x".repeat(300));
        assert!(long.len() <= 253);
        assert_eq!(member_lease_name("g", "pod_"), "g-member-pod");
    }

    #[test]
    fn a_member_is_alive_until_its_lease_stood_still_for_its_duration() {
        let lease = |name: &str, holder: &str, renewed: &str| {
            let mut lease = Lease::default();
            lease.metadata.name = Some(name.into());
            lease.spec = Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_duration_seconds: Some(15),
                renew_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                    renewed.parse().expect("a time"),
                )),
                ..Default::default()
            });
            Arc::new(lease)
        };
        let mut members = Members::default();
        let start = Instant::now();
        let leases = [
            lease("g-member-b", "b", "2026-01-01T00:00:00Z"),
            lease("g-member-c", "", "2026-01-01T00:00:00Z"),
            lease("other", "x", "2026-01-01T00:00:00Z"),
        ];
        assert_eq!(
            members.live(&leases, "g-member-", "a", start),
            live(&["a", "b"])
        );
        assert_eq!(members.next_expiry, Some(start + Duration::from_secs(15)));
        let later = start + Duration::from_secs(16);
        assert_eq!(
            members.live(&leases, "g-member-", "a", later),
            live(&["a"]),
            "b expired"
        );
        assert_eq!(
            members
                .left_behind("a", later)
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>(),
            ["g-member-c"],
            "a released Lease at once; b's not yet"
        );
        let long_after = start + Duration::from_secs(15 * 2);
        let mut behind: Vec<String> = members
            .left_behind("a", long_after)
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        behind.sort();
        assert_eq!(
            behind,
            ["g-member-b", "g-member-c"],
            "b's after two lease durations"
        );
        assert!(
            members
                .left_behind("b", long_after)
                .iter()
                .all(|(n, _)| n != "g-member-b")
        );
        let renewed = [lease("g-member-b", "b", "2026-01-01T00:00:02Z")];
        assert_eq!(
            members.live(&renewed, "g-member-", "a", later),
            live(&["a", "b"])
        );
    }
}
