//! A controller's work queue, with client-go's semantics: the keys of objects to reconcile,
//! first come first served, each queued at most once however often it is triggered, never
//! handed out while its reconcile runs (a trigger meanwhile runs it once more afterwards), and
//! a timer per key for requeues, retries and the debounce of triggers.
//!
//! The debounce folds a burst of triggers into one reconcile without delaying the first: a
//! trigger of an object that is idle (not waiting, not running, and not reconciled within the
//! debounce) queues it at once; one that follows within the debounce of a reconcile, or comes
//! while one is pending or running, waits until the object's triggers have paused for the
//! debounce. So a new object, a deleted child or a changed spec is acted on at once, and the
//! echoes of the reconcile's own writes and the steps of the rollout that follows become one
//! more reconcile.
//!
//! Live changes go first. A trigger is [`Priority::Live`] (a user's edit, a child's change, or
//! a change a list found after a watch broke) or [`Priority::CatchUp`] (the objects of a
//! watch's first list, at start or before taking over; requeues and retries). Catch-up keys run only when no live key
//! waits, so an edit made while thousands of objects are listed runs next, not after them,
//! like controller-runtime's priority queue. A waiting key triggered live moves ahead.
//!
//! It holds keys, not futures: the driver asks it for the next key whenever a worker is free
//! and reads the object from the cache then, so a queue of thousands costs a few maps, and the
//! work per operation is proportional to what it changes, not to the queue.
//!
//! It records controller-runtime's work-queue metrics as it goes: `workqueue_depth` counts the
//! objects waiting (triggered, or with a requeue that has fallen due, and not yet started) by
//! priority,
//! `workqueue_adds_total` every trigger, `workqueue_queue_duration_seconds` the wait from the
//! first trigger (or the due time) to the start, `workqueue_work_duration_seconds` each
//! reconcile, and the unfinished-work gauges the running ones (on [`WorkQueue::refresh`]).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::Hash;
use std::time::Duration;

use tokio::time::Instant;

use crate::leadership::Takeover;
use crate::metrics::QueueMetrics;
use crate::priority::Priority;

/// Where a key stands, apart from running (see [`WorkQueue::running`]).
#[derive(Debug)]
struct Entry {
    /// Waiting for a reconcile since then: its first trigger, or the time its requeue fell due.
    waiting_since: Option<Instant>,
    /// The highest priority it was triggered with since it started waiting.
    priority: Priority,
    /// Its slot in [`WorkQueue::timers`].
    timer: Option<(Instant, u64)>,
    /// In [`WorkQueue::ready`] at this priority, under this sequence number (an older copy
    /// left in the other queue when it moved ahead is skipped).
    queued: Option<(Priority, u64)>,
    /// When it was last triggered.
    last_trigger: Option<Instant>,
}

impl Default for Entry {
    fn default() -> Self {
        Self {
            waiting_since: None,
            priority: Priority::CatchUp,
            timer: None,
            queued: None,
            last_trigger: None,
        }
    }
}

impl Entry {
    fn is_empty(&self) -> bool {
        self.waiting_since.is_none() && self.timer.is_none() && self.queued.is_none()
    }
}

/// Whether a new timer replaces an earlier one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Timer {
    /// Always: a new trigger restarts its debounce.
    Replace,
    /// Only if the new one is earlier: a requeue never postpones a pending trigger.
    Earliest,
}

/// Where an object stands, as its cache shows it, for [`WorkQueue::defer_catch_up`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Its status has observed its generation and says it is ready.
    Converged,
    /// Its spec changed since its status was last written: no reconcile has acted on it.
    Unobserved,
    /// Anything else: a rollout under way, a condition not yet true.
    Unsettled,
}

/// What [`WorkQueue::defer_catch_up`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Deferred {
    /// Settled keys left to their resync.
    pub to_resync: usize,
    /// In a takeover, the keys queued again behind the live changes to come: all but those
    /// left to the resync.
    pub behind_live: usize,
}

/// The work queue of one controller (see the module documentation).
#[derive(Debug)]
pub struct WorkQueue<Key> {
    /// How long a trigger waits for the next one before its key is queued.
    debounce: Duration,
    /// Keys ready to run, live ones first (by [`Priority::index`]), each in the order they
    /// became ready, with the sequence number they were queued under.
    ready: [VecDeque<(u64, Key)>; 2],
    entries: HashMap<Key, Entry>,
    /// Pending timers by due time, with a sequence number that keeps ties in order, and the
    /// priority the key waits with once it falls due.
    timers: BTreeMap<(Instant, u64), (Key, Priority)>,
    sequence: u64,
    /// Keys being reconciled, since when.
    running: HashMap<Key, Instant>,
    /// When each key's last reconcile ended, for those that ended within the debounce (older
    /// ones are pruned as time passes).
    finished: HashMap<Key, Instant>,
    /// The keys of [`WorkQueue::finished`] in the order they ended, to prune the oldest first.
    finished_order: VecDeque<(Instant, Key)>,
    /// Entries with `waiting_since`, running or not, by their priority's index.
    waiting: [usize; 2],
    metrics: QueueMetrics,
}

impl<Key: Clone + Eq + Hash> WorkQueue<Key> {
    /// An empty queue whose triggers wait `debounce` for a further one (none when zero).
    pub fn new(debounce: Duration, metrics: QueueMetrics) -> Self {
        Self {
            debounce,
            ready: [VecDeque::new(), VecDeque::new()],
            entries: HashMap::new(),
            timers: BTreeMap::new(),
            sequence: 0,
            running: HashMap::new(),
            finished: HashMap::new(),
            finished_order: VecDeque::new(),
            waiting: [0, 0],
            metrics,
        }
    }

    /// A live change asks for `key` to be reconciled ([`WorkQueue::trigger_with`]).
    pub fn trigger(&mut self, key: Key, now: Instant) {
        self.trigger_with(key, now, Priority::Live);
    }

    /// A watch event asks for `key` to be reconciled with `priority`: it is queued at once if
    /// it was idle, else after its triggers pause for the debounce, unless it is queued
    /// already (a live trigger moves a key queued to catch up ahead). Running, it runs once
    /// more when done.
    pub fn trigger_with(&mut self, key: Key, now: Instant, priority: Priority) {
        self.metrics.adds.inc();
        self.prune_finished(now);
        let idle = !self.running.contains_key(&key) && !self.finished.contains_key(&key);
        let was_waiting = self.wait(&key, now, priority);
        let entry = self.entries.entry(key.clone()).or_default();
        entry.last_trigger = Some(now);
        match entry.queued {
            Some((queued, _)) if queued >= entry.priority => {}
            Some(_) => self.make_ready(key),
            None => {
                if self.debounce.is_zero() || (idle && !was_waiting) {
                    self.make_ready(key);
                } else {
                    let priority = entry.priority;
                    self.set_timer(key, later(now, self.debounce), Timer::Replace, priority);
                }
            }
        }
        self.publish_depth();
    }

    /// Marks `key` waiting since `since` unless it waits already, at `priority` or the higher
    /// one it waits with; whether it was waiting.
    fn wait(&mut self, key: &Key, since: Instant, priority: Priority) -> bool {
        let entry = self.entries.entry(key.clone()).or_default();
        let was_waiting = entry.waiting_since.is_some();
        if !was_waiting {
            entry.waiting_since = Some(since);
            entry.priority = priority;
            self.waiting[priority.index()] += 1;
        } else if priority > entry.priority {
            self.waiting[entry.priority.index()] -= 1;
            self.waiting[priority.index()] += 1;
            entry.priority = priority;
        }
        was_waiting
    }

    /// When the next timer falls due, if any is pending.
    pub fn next_timer(&self) -> Option<Instant> {
        self.timers.first_key_value().map(|((at, _), _)| *at)
    }

    /// Queues the keys whose timers have fallen due by `now`.
    pub fn fire(&mut self, now: Instant) {
        while let Some(timer) = self.timers.first_entry() {
            let at = timer.key().0;
            if at > now {
                break;
            }
            let (key, priority) = timer.remove();
            self.entries.entry(key.clone()).or_default().timer = None;
            self.wait(&key, at, priority);
            self.make_ready(key);
        }
        self.publish_depth();
    }

    /// The next key to reconcile, which counts as running until [`WorkQueue::done`] or
    /// [`WorkQueue::gone`]. Its pending timer is dropped: the reconcile sets the next one.
    pub fn pop(&mut self, now: Instant) -> Option<Key> {
        self.pop_with_priority(now).map(|(key, _)| key)
    }

    /// [`WorkQueue::pop`], with the priority the key waited with.
    pub fn pop_with_priority(&mut self, now: Instant) -> Option<(Key, Priority)> {
        self.pop_preferring(now, Priority::Live)
    }

    /// [`WorkQueue::pop_with_priority`], taking a key of `preferred` priority first when one
    /// is ready, and one of the other otherwise.
    pub fn pop_preferring(&mut self, now: Instant, preferred: Priority) -> Option<(Key, Priority)> {
        let key = self.next_ready(preferred)?;
        let mut priority = Priority::CatchUp;
        if let Some(entry) = self.entries.get_mut(&key) {
            priority = entry.priority;
            entry.queued = None;
            if let Some(since) = entry.waiting_since.take() {
                self.waiting[entry.priority.index()] -= 1;
                self.metrics
                    .queue_duration
                    .observe(now.saturating_duration_since(since).as_secs_f64());
            }
            if let Some(slot) = entry.timer.take() {
                self.timers.remove(&slot);
            }
            if entry.is_empty() {
                self.entries.remove(&key);
            }
        }
        self.running.insert(key.clone(), now);
        self.publish_depth();
        Some((key, priority))
    }

    /// `key`, just handed out, is not to run yet: it waits until `at`, keeping its
    /// `priority`, unless triggered before (which queues it as usual).
    pub fn postpone(&mut self, key: &Key, at: Instant, priority: Priority) {
        self.running.remove(key);
        self.set_timer(key.clone(), at, Timer::Earliest, priority);
        self.publish_depth();
    }

    /// The first ready key, `preferred` ones first, skipping the copies left behind by keys
    /// that moved ahead.
    fn next_ready(&mut self, preferred: Priority) -> Option<Key> {
        let order = match preferred {
            Priority::Live => [Priority::Live, Priority::CatchUp],
            Priority::CatchUp => [Priority::CatchUp, Priority::Live],
        };
        for priority in order {
            while let Some((sequence, key)) = self.ready[priority.index()].pop_front() {
                let current = self
                    .entries
                    .get(&key)
                    .is_some_and(|e| e.queued == Some((priority, sequence)));
                if current {
                    return Some(key);
                }
            }
        }
        None
    }

    /// The reconcile of `key` has ended; it runs again after `requeue` (to catch up), or at
    /// once when it was triggered meanwhile.
    pub fn done(&mut self, key: &Key, requeue: Option<Duration>, now: Instant) {
        if let Some(since) = self.running.remove(key) {
            self.metrics
                .work_duration
                .observe(now.saturating_duration_since(since).as_secs_f64());
        }
        self.prune_finished(now);
        if !self.debounce.is_zero() {
            self.finished.insert(key.clone(), now);
            self.finished_order.push_back((now, key.clone()));
        }
        let triggered = self
            .entries
            .get(key)
            .is_some_and(|e| e.waiting_since.is_some() && e.timer.is_none() && e.queued.is_none());
        if triggered {
            self.make_ready(key.clone());
        }
        if let Some(after) = requeue {
            self.set_timer(
                key.clone(),
                later(now, after),
                Timer::Earliest,
                Priority::CatchUp,
            );
        }
        self.publish_depth();
    }

    /// `key` was handed out but its object is gone: it leaves the queue entirely.
    ///
    /// A handed-out key counts as running, and a running key is never put in the ready keys
    /// ([`WorkQueue::make_ready`]), so there is nothing to look for there: the cost does not
    /// grow with the queue, however many objects go at once.
    pub fn gone(&mut self, key: &Key) {
        self.running.remove(key);
        // Its place in `finished_order` goes when pruned: that skips keys no longer finished.
        self.finished.remove(key);
        if let Some(entry) = self.entries.remove(key) {
            debug_assert!(
                entry.queued.is_none(),
                "a handed-out key is never among the ready ones"
            );
            if entry.waiting_since.is_some() {
                self.waiting[entry.priority.index()] -= 1;
            }
            if let Some(slot) = entry.timer {
                self.timers.remove(&slot);
            }
        }
        self.publish_depth();
    }

    /// Orders what waits when the process starts reconciling, `previous` describing the
    /// leader before it ([`Takeover`]); `standing` says where each key's object stands.
    ///
    /// - A settled key waiting to catch up (triggered by nothing live), or last triggered
    ///   before `previous.settled_before`, leaves the queue for a requeue, spread evenly over
    ///   the second half of `after` so they do not all fall due at once: the previous leader
    ///   had time to act on it, and its object shows that it did.
    /// - In a takeover, every other waiting key (a live trigger, or what the first list
    ///   brought) is checked behind the live changes from now on, as controller-runtime's
    ///   initial list is, in a new order: the spec changes no reconcile has acted on first,
    ///   then what changed after `previous.acted_until` (while nobody led), then what was in
    ///   the previous leader's hands (a rollout it started, the echo of its last writes), each
    ///   in the order it was queued.
    ///
    /// Everything else, and every running key, stays as it is.
    pub fn defer_catch_up(
        &mut self,
        now: Instant,
        after: Duration,
        previous: Takeover,
        mut standing: impl FnMut(&Key) -> Standing,
    ) -> Deferred {
        let before = |last: Option<Instant>, until: Option<std::time::Instant>| {
            last.zip(until)
                .is_some_and(|(last, until)| last <= Instant::from_std(until))
        };
        let takeover = previous.settled_before.is_some() || previous.acted_until.is_some();
        let mut to_resync = Vec::new();
        let mut behind_live = Vec::new();
        for (key, e) in &self.entries {
            if e.waiting_since.is_none() || e.queued.is_none() || self.running.contains_key(key) {
                continue;
            }
            let catching_up = e.priority == Priority::CatchUp;
            let stands = standing(key);
            if stands == Standing::Converged
                && (catching_up || before(e.last_trigger, previous.settled_before))
            {
                to_resync.push(key.clone());
            } else if takeover {
                // An edit no reconcile acted on is due, whoever had it in hand.
                let tier = match (stands, before(e.last_trigger, previous.acted_until)) {
                    (Standing::Unobserved, _) => 0,
                    (_, false) => 1,
                    (_, true) => 2,
                };
                let sequence = e.queued.map(|(_, sequence)| sequence);
                behind_live.push(((tier, sequence), key.clone()));
            }
        }
        let count = u32::try_from(to_resync.len()).unwrap_or(u32::MAX).max(1);
        for (i, key) in (0u32..).zip(to_resync.iter()) {
            if let Some(entry) = self.entries.get_mut(key) {
                entry.waiting_since = None;
                entry.queued = None;
                self.waiting[entry.priority.index()] -= 1;
                entry.priority = Priority::CatchUp;
            }
            let at = later(now, after / 2 + (after / 2) * i / count);
            self.set_timer(key.clone(), at, Timer::Earliest, Priority::CatchUp);
        }
        behind_live.sort_unstable_by_key(|(order, _)| *order);
        for (_, key) in &behind_live {
            // A catch-up key too takes its new place.
            if let Some(entry) = self.entries.get_mut(key) {
                self.waiting[entry.priority.index()] -= 1;
                self.waiting[Priority::CatchUp.index()] += 1;
                entry.priority = Priority::CatchUp;
                // Its copy among the live keys is skipped from now on.
                entry.queued = None;
            }
            self.make_ready(key.clone());
        }
        self.publish_depth();
        Deferred {
            to_resync: to_resync.len(),
            behind_live: behind_live.len(),
        }
    }

    /// Drops the waiting keys `which` picks, with their timers: their objects are no longer
    /// this queue's to reconcile (a shard handed to another replica). A running one still ends
    /// with [`WorkQueue::done`]. How many waited.
    pub fn forget(&mut self, mut which: impl FnMut(&Key) -> bool) -> usize {
        let picked: Vec<Key> = self.entries.keys().filter(|k| which(k)).cloned().collect();
        let mut forgotten = 0;
        for key in &picked {
            let Some(entry) = self.entries.remove(key) else {
                continue;
            };
            if entry.waiting_since.is_some() {
                self.waiting[entry.priority.index()] -= 1;
                forgotten += 1;
            }
            if let Some(slot) = entry.timer {
                self.timers.remove(&slot);
            }
            // Its copy among the ready keys is skipped, having no entry.
        }
        self.publish_depth();
        forgotten
    }

    /// Drops every waiting key and timer (at shutdown); running reconciles still end with
    /// [`WorkQueue::done`].
    pub fn clear(&mut self) {
        self.ready.iter_mut().for_each(VecDeque::clear);
        self.entries.clear();
        self.timers.clear();
        self.finished.clear();
        self.finished_order.clear();
        self.waiting = [0, 0];
        self.publish_depth();
        self.refresh(Instant::now());
    }

    /// Reconciles running now.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Updates the gauges of the reconciles in progress.
    pub fn refresh(&self, now: Instant) {
        let running = self
            .running
            .values()
            .map(|since| now.saturating_duration_since(*since));
        let (total, longest) = running.fold((Duration::ZERO, Duration::ZERO), |(t, l), d| {
            (t + d, l.max(d))
        });
        self.metrics.unfinished_work.set(total.as_secs_f64());
        self.metrics.longest_running.set(longest.as_secs_f64());
    }

    /// Objects waiting and not running (a running one that waits runs again when done), by
    /// priority.
    fn depth(&self, priority: Priority) -> usize {
        let running_and_waiting = self
            .running
            .keys()
            .filter(|k| {
                self.entries
                    .get(*k)
                    .is_some_and(|e| e.waiting_since.is_some() && e.priority == priority)
            })
            .count();
        self.waiting[priority.index()] - running_and_waiting
    }

    fn publish_depth(&self) {
        for priority in [Priority::Live, Priority::CatchUp] {
            let depth = i64::try_from(self.depth(priority)).unwrap_or(i64::MAX);
            self.metrics.depth.of(priority).set(depth);
        }
    }

    /// Puts `key` at the back of the ready keys of the priority it waits with, unless it is
    /// there already (or among those of a higher one) or running.
    fn make_ready(&mut self, key: Key) {
        if self.running.contains_key(&key) {
            return;
        }
        let entry = self.entries.entry(key.clone()).or_default();
        let priority = entry.priority;
        if entry.queued.is_some_and(|(queued, _)| queued >= priority) {
            return;
        }
        self.sequence += 1;
        entry.queued = Some((priority, self.sequence));
        self.ready[priority.index()].push_back((self.sequence, key));
    }

    /// Forgets the reconciles that ended a debounce or more before `now`. Keys end in time
    /// order, so this looks only at those it forgets, and one more.
    fn prune_finished(&mut self, now: Instant) {
        while let Some((ended, _)) = self.finished_order.front() {
            if later(*ended, self.debounce) > now {
                break;
            }
            if let Some((ended, key)) = self.finished_order.pop_front()
                && self.finished.get(&key) == Some(&ended)
            {
                self.finished.remove(&key);
            }
        }
    }

    /// Sets `key`'s timer (see [`Timer`]); it falls due with the higher of `priority` and
    /// that of a timer it replaces or keeps.
    fn set_timer(&mut self, key: Key, at: Instant, rule: Timer, priority: Priority) {
        let entry = self.entries.entry(key.clone()).or_default();
        let mut priority = priority;
        if let Some(old) = entry.timer {
            if let Some((_, old_priority)) = self.timers.get_mut(&old) {
                priority = priority.max(*old_priority);
                if rule == Timer::Earliest && old.0 <= at {
                    *old_priority = priority;
                    return;
                }
            }
            self.timers.remove(&old);
        }
        self.sequence += 1;
        let slot = (at, self.sequence);
        entry.timer = Some(slot);
        self.timers.insert(slot, (key, priority));
    }
}

/// `now + after`, or a year on when that cannot be represented.
fn later(now: Instant, after: Duration) -> Instant {
    now.checked_add(after)
        .unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Metrics;

    fn queue(debounce: Duration) -> WorkQueue<&'static str> {
        let metrics = Metrics::new().expect("valid metrics");
        WorkQueue::new(debounce, metrics.queue("test"))
    }

    fn drain(q: &mut WorkQueue<&'static str>, now: Instant) -> Vec<&'static str> {
        std::iter::from_fn(|| q.pop(now)).collect()
    }

    #[test]
    fn keys_are_handed_out_first_come_first_served_and_once() {
        let mut q = queue(Duration::ZERO);
        let now = Instant::now();
        for key in ["c", "a", "b", "a", "c"] {
            q.trigger(key, now);
        }
        assert_eq!(q.metrics.depth.get(), 3);
        assert_eq!(q.metrics.adds.get(), 5);
        assert_eq!(drain(&mut q, now), ["c", "a", "b"]);
        assert_eq!(q.metrics.depth.get(), 0);
        assert_eq!(q.running(), 3);
    }

    #[test]
    fn a_key_triggered_while_running_runs_once_more_when_done() {
        let mut q = queue(Duration::ZERO);
        let now = Instant::now();
        q.trigger("a", now);
        assert_eq!(q.pop(now), Some("a"));
        q.trigger("a", now);
        q.trigger("a", now);
        assert_eq!(q.pop(now), None, "never two reconciles of one object");
        assert_eq!(q.metrics.depth.get(), 0, "running, so not waiting");
        q.done(&"a", Some(Duration::from_secs(3600)), now);
        assert_eq!(q.metrics.depth.get(), 1);
        assert_eq!(drain(&mut q, now), ["a"]);
        q.done(&"a", Some(Duration::from_secs(3600)), now);
        assert_eq!(drain(&mut q, now), Vec::<&str>::new());
    }

    #[test]
    fn an_idle_key_is_queued_at_once_and_a_burst_after_it_waits_for_a_pause() {
        let mut q = queue(Duration::from_millis(250));
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        q.trigger("a", start);
        assert_eq!(
            drain(&mut q, start),
            ["a"],
            "the first trigger waits for nothing"
        );
        q.trigger("a", at(5));
        q.done(&"a", None, at(10));
        assert_eq!(
            q.next_timer(),
            Some(at(255)),
            "a trigger while running waits"
        );
        // The echoes of its own writes and the next steps, each within the debounce.
        q.trigger("a", at(20));
        q.trigger("a", at(200));
        q.fire(at(300));
        assert_eq!(
            drain(&mut q, at(300)),
            Vec::<&str>::new(),
            "a's debounce restarted"
        );
        q.fire(at(450));
        assert_eq!(drain(&mut q, at(450)), ["a"], "one reconcile for the burst");
        q.done(&"a", None, at(460));
        q.trigger("a", at(600));
        assert_eq!(
            drain(&mut q, at(600)),
            Vec::<&str>::new(),
            "within the debounce of its last reconcile"
        );
        q.fire(at(850));
        assert_eq!(drain(&mut q, at(850)), ["a"]);
        q.done(&"a", None, at(860));
        q.trigger("a", at(1200));
        assert_eq!(drain(&mut q, at(1200)), ["a"], "idle again: at once");
        assert_eq!(q.next_timer(), None);
    }

    #[test]
    fn triggers_of_a_waiting_key_become_one_queued_key() {
        let mut q = queue(Duration::from_millis(250));
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        for key in ["a", "b"] {
            q.trigger(key, start);
            assert_eq!(q.pop(start), Some(key));
            q.done(&key, None, start);
        }
        q.trigger("a", at(100));
        q.trigger("b", at(110));
        q.trigger("a", at(200));
        assert_eq!(q.metrics.depth.get(), 2, "triggered objects wait");
        q.fire(at(400));
        assert_eq!(drain(&mut q, at(400)), ["b"], "a's debounce restarted");
        q.fire(at(450));
        assert_eq!(drain(&mut q, at(450)), ["a"]);
        assert_eq!(q.next_timer(), None);
    }

    #[test]
    fn finished_keys_are_forgotten_once_their_debounce_has_passed() {
        let mut q = queue(Duration::from_millis(250));
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        for (i, key) in ["a", "b", "c"].into_iter().enumerate() {
            let now = at(100 * i as u64);
            q.trigger(key, now);
            assert_eq!(q.pop(now), Some(key));
            q.done(&key, None, now);
        }
        q.gone(&"b");
        q.trigger("c", at(300));
        assert_eq!(drain(&mut q, at(300)), Vec::<&str>::new());
        assert_eq!(
            q.finished.keys().copied().collect::<Vec<_>>(),
            ["c"],
            "a ended 300 ms ago, b is gone"
        );
        assert_eq!(
            q.finished_order.len(),
            2,
            "b's place goes when its time comes"
        );
        q.trigger("d", at(400));
        assert_eq!(q.finished_order.len(), 1);
        q.clear();
        assert!(q.finished.is_empty() && q.finished_order.is_empty());
    }

    #[test]
    fn requeues_count_once_due_and_the_earliest_time_wins() {
        let mut q = queue(Duration::ZERO);
        let now = Instant::now();
        q.trigger("a", now);
        q.trigger("b", now);
        drain(&mut q, now);
        q.done(&"a", Some(Duration::from_secs(3600)), now);
        q.done(&"b", Some(Duration::from_secs(10)), now);
        assert_eq!(q.metrics.depth.get(), 0, "a requeue counts only once due");
        assert_eq!(q.next_timer(), Some(now + Duration::from_secs(10)));
        q.fire(now + Duration::from_secs(10));
        assert_eq!(q.metrics.depth.get(), 1);
        assert_eq!(drain(&mut q, now), ["b"]);
        q.done(&"b", Some(Duration::from_secs(3600)), now);
        assert_eq!(q.next_timer(), Some(now + Duration::from_secs(3600)));
        q.trigger("a", now + Duration::from_secs(1));
        assert_eq!(drain(&mut q, now), ["a"]);
        assert_eq!(q.timers.len(), 1, "a's requeue went with its start");
    }

    #[test]
    fn a_requeue_does_not_postpone_a_pending_trigger() {
        let mut q = queue(Duration::from_millis(250));
        let now = Instant::now();
        q.trigger("a", now);
        q.fire(now + Duration::from_millis(250));
        assert_eq!(drain(&mut q, now), ["a"]);
        q.trigger("a", now + Duration::from_millis(300));
        q.done(&"a", Some(Duration::from_secs(3600)), now);
        assert_eq!(q.next_timer(), Some(now + Duration::from_millis(550)));
        q.fire(now + Duration::from_millis(550));
        assert_eq!(drain(&mut q, now), ["a"]);
    }

    #[test]
    fn a_gone_key_leaves_nothing_behind() {
        let mut q = queue(Duration::ZERO);
        let now = Instant::now();
        q.trigger("a", now);
        assert_eq!(q.pop(now), Some("a"));
        q.trigger("a", now);
        q.gone(&"a");
        assert_eq!(q.running(), 0);
        assert_eq!(q.metrics.depth.get(), 0);
        assert!(q.entries.is_empty() && q.timers.is_empty());
        assert!(q.ready.iter().all(VecDeque::is_empty));
        q.trigger("b", now);
        q.clear();
        assert_eq!(q.metrics.depth.get(), 0);
        assert_eq!(q.pop(now), None);
    }

    #[test]
    fn time_in_the_queue_and_at_work_is_observed() {
        let mut q = queue(Duration::ZERO);
        let start = Instant::now();
        let at = |secs| start + Duration::from_secs(secs);
        q.trigger("a", start);
        q.trigger("a", at(2));
        assert_eq!(q.pop(at(2)), Some("a"));
        let waited = &q.metrics.queue_duration;
        assert_eq!(waited.get_sample_count(), 1);
        assert!(
            (waited.get_sample_sum() - 2.0).abs() < 0.01,
            "from the first trigger: {}",
            waited.get_sample_sum()
        );
        q.trigger("b", at(5));
        assert_eq!(q.pop(at(5)), Some("b"));
        q.refresh(at(6));
        assert!((q.metrics.unfinished_work.get() - 5.0).abs() < 0.01);
        assert!((q.metrics.longest_running.get() - 4.0).abs() < 0.01);
        q.done(&"a", None, at(6));
        let worked = &q.metrics.work_duration;
        assert_eq!(worked.get_sample_count(), 1);
        assert!((worked.get_sample_sum() - 4.0).abs() < 0.01);
        q.refresh(at(6));
        assert!((q.metrics.longest_running.get() - 1.0).abs() < 0.01);
        q.done(&"b", None, at(6));
        q.refresh(at(6));
        assert_eq!(q.metrics.unfinished_work.get(), 0.0);
        assert_eq!(q.metrics.longest_running.get(), 0.0);
    }

    fn depths(q: &WorkQueue<&'static str>) -> (i64, i64) {
        (q.metrics.depth.live.get(), q.metrics.depth.catch_up.get())
    }

    #[test]
    fn live_changes_run_before_the_catch_up_of_a_list() {
        let mut q = queue(Duration::ZERO);
        let now = Instant::now();
        for key in ["a", "b", "c"] {
            q.trigger_with(key, now, Priority::CatchUp);
        }
        q.trigger("edited", now);
        assert_eq!(depths(&q), (1, 3));
        assert_eq!(q.pop(now), Some("edited"));
        assert_eq!(depths(&q), (0, 3));
        q.trigger("edited-too", now);
        assert_eq!(drain(&mut q, now), ["edited-too", "a", "b", "c"]);
        assert_eq!(depths(&q), (0, 0));
    }

    #[test]
    fn a_key_waiting_to_catch_up_moves_ahead_when_changed_live_and_runs_once() {
        let mut q = queue(Duration::ZERO);
        let now = Instant::now();
        for key in ["a", "b", "c"] {
            q.trigger_with(key, now, Priority::CatchUp);
        }
        q.trigger("c", now);
        q.trigger_with("c", now, Priority::CatchUp);
        assert_eq!(depths(&q), (1, 2), "c counts once, as live");
        assert_eq!(drain(&mut q, now), ["c", "a", "b"]);
    }

    #[test]
    fn requeues_catch_up_and_a_live_change_of_one_runs_it_first() {
        let mut q = queue(Duration::ZERO);
        let now = Instant::now();
        let later = now + Duration::from_secs(1);
        for key in ["a", "b"] {
            q.trigger(key, now);
        }
        assert_eq!(drain(&mut q, now), ["a", "b"]);
        for key in ["a", "b"] {
            q.done(&key, Some(Duration::from_secs(1)), now);
        }
        q.fire(later);
        assert_eq!(depths(&q), (0, 2), "requeues wait to catch up");
        q.trigger("b", later);
        assert_eq!(depths(&q), (1, 1));
        assert_eq!(drain(&mut q, later), ["b", "a"]);
    }

    #[test]
    fn a_debounced_live_trigger_stays_live_when_its_timer_fires() {
        let mut q = queue(Duration::from_millis(100));
        let start = Instant::now();
        let at = |millis| start + Duration::from_millis(millis);
        q.trigger("a", start);
        assert_eq!(q.pop(start), Some("a"));
        q.done(&"a", None, at(10));
        q.trigger("a", at(20));
        q.trigger_with("z", at(20), Priority::CatchUp);
        q.fire(at(200));
        assert_eq!(depths(&q), (1, 1));
        assert_eq!(drain(&mut q, at(200)), ["a", "z"]);
    }

    #[test]
    fn settled_catch_up_keys_are_deferred_and_live_ones_stay() {
        let mut q = queue(Duration::ZERO);
        let now = Instant::now();
        for key in ["a", "b", "c"] {
            q.trigger_with(key, now, Priority::CatchUp);
        }
        q.trigger("d", now);
        let hour = Duration::from_secs(3600);
        let deferred = q.defer_catch_up(now, hour, Takeover::default(), |key| {
            if *key == "b" {
                Standing::Unsettled
            } else {
                Standing::Converged
            }
        });
        assert_eq!(
            deferred,
            Deferred {
                to_resync: 2,
                behind_live: 0
            },
            "a and c; d is live, b is not settled"
        );
        assert_eq!(depths(&q), (1, 1));
        assert_eq!(drain(&mut q, now), ["d", "b"]);
        let due = q.next_timer().expect("requeued");
        assert!(due >= now + hour / 2 && due <= now + hour, "{due:?}");
        q.fire(now + hour);
        let mut resynced = drain(&mut q, now + hour);
        resynced.sort_unstable();
        assert_eq!(resynced, ["a", "c"]);
    }

    #[test]
    fn in_a_takeover_what_was_queued_before_goes_behind_live_changes() {
        let mut q = queue(Duration::ZERO);
        let start = Instant::now();
        // The standby's first list: an object mid-rollout.
        q.trigger_with("listed", start, Priority::CatchUp);
        // What a standby saw while the previous leader worked: its writes' echoes, a rollout
        // it started that is not done yet, and an edit it never got to.
        for key in ["echo-1", "echo-2", "rolling-out", "early-edit"] {
            q.trigger(key, start);
        }
        // Between the moment everything before was surely handled and the last moment the
        // previous leader was seen acting: its last writes' echo, and another change in its
        // hands.
        let settled_before = start + Duration::from_secs(10);
        let acted_until = settled_before + Duration::from_secs(10);
        let late = settled_before + Duration::from_millis(1);
        q.trigger("late-echo", late);
        q.trigger("in-hand", late);
        // After it stopped acting: a user's change.
        q.trigger("at-the-stop", acted_until + Duration::from_millis(1));
        let hour = Duration::from_secs(3600);
        let now = acted_until + Duration::from_secs(5);
        let previous = Takeover {
            settled_before: Some(settled_before.into_std()),
            acted_until: Some(acted_until.into_std()),
        };
        let deferred = q.defer_catch_up(now, hour, previous, |key| match *key {
            "early-edit" | "at-the-stop" => Standing::Unobserved,
            "listed" | "rolling-out" | "in-hand" => Standing::Unsettled,
            _ => Standing::Converged,
        });
        assert_eq!(
            deferred,
            Deferred {
                to_resync: 2,
                behind_live: 6
            },
            "the early echoes go to the resync; the rest waits behind live changes"
        );
        assert_eq!(depths(&q), (0, 6));
        q.trigger("after-takeover", now);
        assert_eq!(
            drain(&mut q, now),
            [
                "after-takeover",
                "early-edit",
                "at-the-stop",
                "listed",
                "rolling-out",
                "late-echo",
                "in-hand"
            ],
            "live changes first, then the edits nobody acted on, then the rest; what changed \
             while nobody led before what was in hand; each in the order it was queued"
        );
    }

    #[test]
    fn without_a_takeover_live_keys_keep_their_place() {
        let mut q = queue(Duration::ZERO);
        let now = Instant::now();
        for key in ["settled", "unsettled"] {
            q.trigger(key, now);
        }
        let deferred =
            q.defer_catch_up(now, Duration::from_secs(3600), Takeover::default(), |key| {
                if *key == "settled" {
                    Standing::Converged
                } else {
                    Standing::Unsettled
                }
            });
        assert_eq!(deferred, Deferred::default());
        assert_eq!(drain(&mut q, now), ["settled", "unsettled"]);
    }

    #[test]
    fn a_preferred_priority_goes_first_when_one_is_ready() {
        let mut q = queue(Duration::ZERO);
        let now = Instant::now();
        q.trigger_with("catch-up", now, Priority::CatchUp);
        q.trigger("live", now);
        assert_eq!(
            q.pop_preferring(now, Priority::CatchUp),
            Some(("catch-up", Priority::CatchUp))
        );
        assert_eq!(
            q.pop_preferring(now, Priority::CatchUp),
            Some(("live", Priority::Live)),
            "the other priority when none of the preferred is ready"
        );
    }

    #[test]
    fn forgotten_keys_leave_the_queue_and_their_timers() {
        let mut q = queue(Duration::ZERO);
        let now = Instant::now();
        for key in ["a", "b", "c", "d"] {
            q.trigger(key, now);
        }
        assert_eq!(q.pop(now), Some("a"));
        q.done(&"a", Some(Duration::from_secs(1)), now);
        assert_eq!(q.pop(now), Some("b"));
        assert_eq!(q.forget(|key| matches!(*key, "a" | "b" | "c")), 1);
        assert_eq!(q.depth(Priority::Live), 1);
        assert_eq!(q.next_timer(), None, "a's requeue went with it");
        // The running key ends as usual and may run again if asked.
        q.done(&"b", None, now);
        assert_eq!(drain(&mut q, now), ["d"]);
        q.trigger("c", now);
        assert_eq!(drain(&mut q, now), ["c"]);
    }
}
