//! What the flood tests watch of the manager's Lease while they flood it.

use std::time::{Duration, Instant};

use anyhow::Result;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;

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
