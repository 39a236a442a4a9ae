//! A sharded group's cluster-wide duties, carried out by one replica at a time.
//!
//! Every replica of a sharded manager reconciles its share and serves webhooks, probes and
//! metrics, but what exists once in the cluster has one writer: the webhook certificates'
//! Secret (the CA and the serving certificate) and the CA bundles in the webhook
//! configurations and CRDs. The replicas elect it through a Lease of its own,
//! `<leader-election-id>-duties` (not the leader Lease, which a sharded group does not use),
//! renewed and fenced like every other Lease of the manager. The others read the Secret and
//! serve what it holds. When the holder goes, another takes the Lease within a lease
//! duration; certificates are renewed weeks before they expire, so nothing waits on it.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use tokio_util::sync::CancellationToken;

use crate::leader::{LeaderElector, LeaderStatus, LeadershipEnd, Settings};

/// How long releasing the Lease at shutdown may take.
const RELEASE_BUDGET: Duration = Duration::from_secs(5);

/// The Lease of the cluster-wide duties for the group of `leader_election_id`.
pub fn lease_name(leader_election_id: &str) -> String {
    format!("{leader_election_id}-duties")
}

/// Who may carry out the cluster-wide duties in this process.
#[derive(Clone, Debug)]
pub enum Duty {
    /// Any replica, racing on resourceVersions (one replica, or replicas elected as a whole).
    Anyone,
    /// Only while this replica holds the duties Lease, within its renew deadline.
    Elected(Arc<LeaderStatus>),
}

impl Duty {
    /// Whether this replica may write for the duties now.
    pub fn may_act(&self) -> bool {
        match self {
            Self::Anyone => true,
            Self::Elected(status) => status.write_deadline(Instant::now()).is_ok(),
        }
    }

    /// Completes when this replica takes the duties after `seen` was last marked seen; never
    /// for [`Duty::Anyone`], which has them from the start.
    pub async fn taken(seen: &mut Option<watch::Receiver<u64>>) {
        match seen {
            Some(acquisitions) => {
                if acquisitions.changed().await.is_err() {
                    // The status is gone with its replica: nothing more to take.
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending().await,
        }
    }

    /// What [`Duty::taken`] waits on, marked seen now.
    pub fn acquisitions(&self) -> Option<watch::Receiver<u64>> {
        match self {
            Self::Anyone => None,
            Self::Elected(status) => {
                let mut acquisitions = status.acquisitions();
                acquisitions.mark_unchanged();
                Some(acquisitions)
            }
        }
    }
}

/// Takes part in the election for the duties until `shutdown`, standing by again whenever the
/// Lease is lost, and releases it at the end. `status` says meanwhile whether this replica
/// holds it ([`Duty::Elected`]).
pub async fn elect(
    client: kube::Client,
    settings: Settings,
    status: Arc<LeaderStatus>,
    shutdown: CancellationToken,
) {
    let mut elector = LeaderElector::new(client, settings, status);
    loop {
        if elector.acquire(&shutdown).await.is_none() {
            break;
        }
        match elector.hold(&shutdown).await {
            // Another replica takes the duties; this one stands by for them again.
            LeadershipEnd::Lost(_) => {}
            LeadershipEnd::Stopped => break,
        }
    }
    elector.release(RELEASE_BUDGET, None).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leader::LeaseRole;

    /// A duties Lease's status with a 10 s renew deadline, not held yet.
    fn duties_status() -> Arc<LeaderStatus> {
        let gauge = prometheus::IntGauge::new("g", "g").expect("gauge");
        Arc::new(LeaderStatus::new(
            gauge,
            Duration::from_secs(10),
            LeaseRole::Duties,
        ))
    }

    #[test]
    fn the_duties_lease_is_named_after_the_group() {
        assert_eq!(lease_name("operator-manager"), "operator-manager-duties");
    }

    #[test]
    fn an_elected_duty_is_carried_out_only_while_the_lease_is_held() {
        let status = duties_status();
        let duty = Duty::Elected(status.clone());
        assert!(!duty.may_act());
        status.renewed(Instant::now());
        assert!(duty.may_act());
        status.stepped_down();
        assert!(!duty.may_act());
        // A renewal older than the renew deadline no longer lets it act.
        let stale = Instant::now()
            .checked_sub(Duration::from_secs(11))
            .expect("the clock runs for more than 11 s");
        status.renewed(stale);
        assert!(!duty.may_act());
        assert!(Duty::Anyone.may_act());
    }

    #[tokio::test]
    async fn taking_the_duties_wakes_whoever_waits_for_them_once_per_take() {
        let status = duties_status();
        let duty = Duty::Elected(status.clone());
        let mut seen = duty.acquisitions();
        let taken = |seen: &mut Option<watch::Receiver<u64>>| {
            futures::FutureExt::now_or_never(Duty::taken(seen)).is_some()
        };
        assert!(!taken(&mut seen), "nothing taken yet");
        status.renewed(Instant::now());
        assert!(taken(&mut seen), "the first renewal takes the duties");
        status.renewed(Instant::now());
        assert!(
            !taken(&mut seen),
            "a renewal while holding them is no new take"
        );
        status.stepped_down();
        status.renewed(Instant::now());
        assert!(taken(&mut seen), "taking them again after losing them");
        assert!(!taken(&mut Duty::Anyone.acquisitions()));
    }
}
