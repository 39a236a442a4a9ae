//! What the flood tests watch of the manager's Lease while they flood it.

use std::time::{Duration, Instant};

use anyhow::Result;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;

/// Waits for Lease `name` to name a holder (the manager leads); that holder.
pub async fn wait_for_holder(leases: &Api<Lease>, name: &str) -> Result<String> {
    Ok(
        testkit::wait_for("the manager to lead", Duration::from_secs(60), || async {
            let lease = leases.get(name).await.map_err(|e| e.to_string())?;
            lease
                .spec
                .and_then(|spec| spec.holder_identity)
                .filter(|holder| !holder.is_empty())
                .ok_or_else(|| "no holder yet".to_owned())
        })
        .await?,
    )
}

/// Fails unless the Lease stayed with `holder` (`holders` is all it named) and went no longer
/// than `renew_deadline` without a renewal.
pub fn ensure_kept(
    holder: &str,
    holders: &[String],
    longest_gap: Duration,
    renew_deadline: Duration,
) -> Result<()> {
    anyhow::ensure!(
        holders == [holder],
        "the Lease stayed with {holder:?}, but was held by {holders:?}"
    );
    anyhow::ensure!(
        longest_gap < renew_deadline,
        "the Lease went {longest_gap:?} without a renewal (renew deadline {renew_deadline:?})"
    );
    Ok(())
}

/// Every holder Lease `name` named until `done()`, and the longest interval between two
/// renewals seen (from the first one seen until the last, or until the end).
pub async fn watch_lease(
    leases: Api<Lease>,
    name: String,
    done: impl Fn() -> bool,
) -> Result<(Vec<String>, Duration)> {
    let mut holders: Vec<String> = Vec::new();
    let (mut last_renew, mut last_change) = (None, Instant::now());
    let mut longest = Duration::ZERO;
    while !done() {
        let spec = leases.get(&name).await?.spec.unwrap_or_default();
        let holder = spec.holder_identity.unwrap_or_default();
        if holders.last() != Some(&holder) {
            holders.push(holder);
        }
        let renew = spec.renew_time.map(|t| t.0);
        if renew != last_renew {
            longest = longest.max(last_change.elapsed());
            (last_renew, last_change) = (renew, Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok((holders, longest.max(last_change.elapsed())))
}
