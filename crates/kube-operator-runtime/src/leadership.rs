//! When the controllers may reconcile: always, or from the moment the process leads.
//!
//! A warm standby runs its controllers before it leads: their watches list and follow every
//! object, and their work queues collect what changes, but nothing is reconciled (so nothing
//! is written) until the embedding binary says it leads ([`Lead::start`]). Then reconciling
//! starts at once, live changes first, with caches that are already current.

use std::time::Instant;

use tokio::sync::watch;

/// Whether the controllers of a run may reconcile now; given with
/// [`crate::RunOptions::leadership`].
#[derive(Clone, Debug)]
pub struct Leadership {
    /// `None` while standing by; once leading, what is known of the previous leader.
    leading: watch::Receiver<Option<Takeover>>,
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
        Self { leading }
    }

    /// A standby: it watches but does not reconcile until [`Lead::start`].
    pub fn standby() -> (Lead, Self) {
        let (lead, leading) = watch::channel(None);
        (Lead { leading: lead }, Self { leading })
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

    #[tokio::test(start_paused = true)]
    async fn a_standby_whose_lead_is_dropped_never_leads() {
        let (lead, leadership) = Leadership::standby();
        drop(lead);
        let waited = tokio::time::timeout(Duration::from_secs(3600), leadership.leading()).await;
        assert!(waited.is_err());
    }
}
