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
    /// `None` while standing by; once leading, the last moment the previous leader was there
    /// to act on what changed, if known.
    leading: watch::Receiver<Option<Takeover>>,
}

/// The switch of a standby's [`Leadership`], held by whoever wins the election.
#[derive(Debug)]
pub struct Lead {
    leading: watch::Sender<Option<Takeover>>,
}

/// What a standby knows when it starts leading.
#[derive(Clone, Copy, Debug)]
struct Takeover {
    handled_until: Option<Instant>,
}

impl Leadership {
    /// Reconciling from the start: a process without an election, or one started after it won.
    pub fn always() -> Self {
        let (_, leading) = watch::channel(Some(Takeover {
            handled_until: None,
        }));
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

    /// Completes once reconciling may start, with the last moment the previous leader was
    /// there to act on what changed, if known ([`Lead::take_over`]); never, if the [`Lead`] is
    /// dropped first (the run is then stopped by its shutdown).
    pub async fn leading(mut self) -> Option<Instant> {
        // The guard `wait_for` returns is not `Send`: copy out of it before awaiting again.
        let takeover = self.leading.wait_for(Option::is_some).await.map(|t| *t);
        match takeover {
            Ok(takeover) => takeover.and_then(|t| t.handled_until),
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
        self.leading.send_replace(Some(Takeover {
            handled_until: None,
        }));
    }

    /// The process leads, and the previous leader was there to act on what changed until
    /// `handled_until` (for a Lease that expired: its last renewal, at the latest). What
    /// changed before then and shows it was acted on is left to the resync; what changed
    /// after is reconciled first.
    pub fn take_over(&self, handled_until: Instant) {
        self.leading.send_replace(Some(Takeover {
            handled_until: Some(handled_until),
        }));
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
