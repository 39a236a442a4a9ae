//! When the controllers may reconcile: always, or from the moment the process leads.
//!
//! A warm standby runs its controllers before it leads: their watches list and follow every
//! object, and their work queues collect what changes, but nothing is reconciled (so nothing
//! is written) until the embedding binary says it leads ([`Lead::start`]). Then reconciling
//! starts at once, live changes first, with caches that are already current.
//!
//! Until every controller's caches have synced, the standby is not yet warm ([`Warmth`]): an
//! embedding binary keeps its readiness probe failing until then, so that a rolling update
//! stops the old leader only once its successor could take over at once.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use tokio::sync::watch;

/// Whether the controllers of a run may reconcile now; given with
/// [`crate::RunOptions::leadership`].
#[derive(Clone, Debug)]
pub struct Leadership {
    /// `None` while standing by; once leading, what is known of the previous leader.
    leading: watch::Receiver<Option<Takeover>>,
    /// The controllers of the run whose caches have not synced yet.
    warmth: Warmth,
    /// The controller this copy was handed to by [`crate::run`], which reports through it
    /// that its caches have synced.
    controller: Option<&'static str>,
}

/// Which controllers of a run have not yet synced their caches: shared by every copy of its
/// [`Leadership`] ([`Leadership::warmth`]).
///
/// [`crate::run`] counts each controller cold from its start, and its driver reports it warm
/// once the controller's caches hold a complete list of every type it watches (or once the
/// controller has returned).
#[derive(Clone, Debug, Default)]
pub struct Warmth {
    cold: Arc<Mutex<BTreeSet<&'static str>>>,
}

impl Warmth {
    /// The controllers whose caches have not synced yet, by name, in order.
    pub fn cold(&self) -> Vec<&'static str> {
        self.lock().iter().copied().collect()
    }

    /// Counts `controllers` cold from now on, until their runs report them synced: for a
    /// binary that spawns [`crate::run`] on another task, which counts them itself only once
    /// it is first polled.
    pub fn expect(&self, controllers: impl IntoIterator<Item = &'static str>) {
        self.lock().extend(controllers);
    }

    /// Whether every controller started has synced its caches.
    pub fn is_warm(&self) -> bool {
        self.lock().is_empty()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<&'static str>> {
        // A poisoned lock only means a panic elsewhere; the set stays valid.
        self.cold.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The switch of a standby's [`Leadership`], held by whoever wins the election.
#[derive(Debug)]
pub struct Lead {
    leading: watch::Sender<Option<Takeover>>,
}

/// What a standby knows of the leader before it when it starts leading
/// ([`Lead::take_over`]), to order the work its queues collected while it stood by.
///
/// Both are moments on this process's monotonic clock; the earlier `settled_before` guards
/// what is left to the resync, the later `acted_until` only the order of what is checked
/// after the changes made from the takeover on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Takeover {
    /// The previous leader had time to act on every change before this: an object changed
    /// before it that shows it converged is left to the periodic resync.
    pub settled_before: Option<Instant>,
    /// The previous leader was seen acting until this moment (its last renewal seen, or when
    /// it stopped reconciling before it released the Lease): what changed before it was in
    /// its hands, and is checked after what changed while nobody led.
    pub acted_until: Option<Instant>,
}

impl Leadership {
    /// Reconciling from the start: a process without an election, or one started after it won.
    pub fn always() -> Self {
        let (_, leading) = watch::channel(Some(Takeover::default()));
        Self::from(leading)
    }

    /// A standby: it watches but does not reconcile until [`Lead::start`].
    pub fn standby() -> (Lead, Self) {
        let (lead, leading) = watch::channel(None);
        (Lead { leading: lead }, Self::from(leading))
    }

    fn from(leading: watch::Receiver<Option<Takeover>>) -> Self {
        Self {
            leading,
            warmth: Warmth::default(),
            controller: None,
        }
    }

    /// Which controllers of the run have not yet synced their caches.
    pub fn warmth(&self) -> Warmth {
        self.warmth.clone()
    }

    /// The copy to hand to `controller`, counted cold until its driver has synced its caches.
    /// [`crate::run`] hands one to each controller it runs; a binary that runs a controller
    /// itself does the same, for the run's [`Warmth`] to wait for it.
    pub fn for_controller(&self, controller: &'static str) -> Self {
        self.warmth.lock().insert(controller);
        Self {
            controller: Some(controller),
            ..self.clone()
        }
    }

    /// The controller this copy was handed to has synced its caches, or has returned.
    pub(crate) fn synced(&self) {
        if let Some(controller) = self.controller {
            self.warmth.lock().remove(controller);
        }
    }

    /// Whether reconciling has started.
    pub fn is_leading(&self) -> bool {
        self.leading.borrow().is_some()
    }

    /// Completes once reconciling may start, with what is known of the previous leader
    /// ([`Lead::take_over`]); never, if the [`Lead`] is dropped first (the run is then stopped
    /// by its shutdown).
    pub async fn leading(mut self) -> Takeover {
        // The guard `wait_for` returns is not `Send`: copy out of it before awaiting again.
        let takeover = self.leading.wait_for(Option::is_some).await.map(|t| *t);
        match takeover {
            Ok(takeover) => takeover.unwrap_or_default(),
            Err(_) => std::future::pending().await,
        }
    }
}

impl Default for Leadership {
    fn default() -> Self {
        Self::always()
    }
}

impl Lead {
    /// The process leads: the controllers start reconciling, what they were triggered with
    /// live first.
    pub fn start(&self) {
        self.take_over(Takeover::default());
    }

    /// The process leads, after the leader `previous` describes: what that leader settled is
    /// left to the resync, and what it had in hands goes after what changes from now on.
    pub fn take_over(&self, previous: Takeover) {
        self.leading.send_replace(Some(previous));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_standby_leads_only_once_started() {
        assert!(Leadership::always().is_leading());
        let (lead, leadership) = Leadership::standby();
        assert!(!leadership.is_leading());
        let waiting = tokio::spawn(leadership.clone().leading());
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished());
        lead.start();
        waiting.await.expect("led");
        assert!(leadership.is_leading());
    }

    #[test]
    fn a_run_is_warm_once_each_controller_has_synced() {
        let (_lead, leadership) = Leadership::standby();
        let warmth = leadership.warmth();
        assert!(warmth.is_warm(), "nothing started yet");
        let memcached = leadership.for_controller("memcached");
        let myapp = leadership.for_controller("myapp");
        assert_eq!(warmth.cold(), ["memcached", "myapp"]);
        myapp.synced();
        assert_eq!(warmth.cold(), ["memcached"]);
        leadership.synced();
        assert!(
            !warmth.is_warm(),
            "the run's own copy stands for no controller"
        );
        memcached.synced();
        memcached.synced();
        assert!(warmth.is_warm());
        warmth.expect(["tenant"]);
        assert_eq!(warmth.cold(), ["tenant"], "expected before its run starts");
        leadership.for_controller("tenant").synced();
        assert!(warmth.is_warm());
    }

    #[tokio::test(start_paused = true)]
    async fn a_standby_whose_lead_is_dropped_never_leads() {
        let (lead, leadership) = Leadership::standby();
        drop(lead);
        let waited = tokio::time::timeout(Duration::from_secs(3600), leadership.leading()).await;
        assert!(waited.is_err());
    }
}
