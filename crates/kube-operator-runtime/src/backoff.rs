//! Backoff: per object for failed reconciles ([`Backoff`]), and for watches reconnecting
//! ([`WatchBackoff`]).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

/// The first retry delay after a failure, as controller-runtime's default rate limiter.
pub const BASE_DELAY: Duration = Duration::from_millis(5);

/// The longest retry delay.
///
/// controller-runtime caps at 1000 s; this is shorter because every failing object is also
/// re-triggered by any watch event that concerns it, and a cap of minutes bounds how long a fix
/// that produces no event (a missing RBAC rule granted, an admission webhook repaired) waits to
/// be noticed. 5 ms doubling reaches the cap at the 17th consecutive failure, after about
/// 5.5 minutes of retries.
pub const MAX_DELAY: Duration = Duration::from_secs(300);

/// Failure counts per object: the n-th consecutive failure waits `base * 2^(n-1)`, capped at
/// `max`; a success forgets the object, so its next failure starts at `base` again.
#[derive(Debug)]
pub struct Backoff<Key> {
    base: Duration,
    max: Duration,
    failures: Mutex<HashMap<Key, u32>>,
}

impl<Key: Eq + Hash> Default for Backoff<Key> {
    fn default() -> Self {
        Self::new(BASE_DELAY, MAX_DELAY)
    }
}

impl<Key: Eq + Hash> Backoff<Key> {
    /// Backoff from `base` doubling up to `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// Records a failure of `key` and returns how long to wait before retrying it.
    pub fn next_delay(&self, key: Key) -> Duration {
        let mut failures = self
            .failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let count = failures.entry(key).or_insert(0);
        let delay = delay_for(self.base, self.max, *count);
        *count = count.saturating_add(1);
        delay
    }

    /// Forgets `key` after a successful reconcile (or once it is gone).
    pub fn reset(&self, key: &Key) {
        self.failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(key);
    }

    /// Number of objects currently backing off.
    pub fn len(&self) -> usize {
        self.failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// Whether no object is backing off.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How long a broken watch waits before it reconnects: from 100 ms, doubling up to a cap.
///
/// kube's default grows to 30 s, so after an API-server outage of 20 s a watch could stay down
/// for another half minute, and every controller behind it idle. A watch that fails is one cheap
/// request per retry; reconnecting within [`WATCH_MAX_DELAY`] of the API server's return keeps
/// recovery in seconds.
#[derive(Debug, Clone)]
pub struct WatchBackoff {
    next: Duration,
    max: Duration,
}

/// The longest wait between reconnection attempts of the controllers' watches.
pub const WATCH_MAX_DELAY: Duration = Duration::from_secs(2);

impl WatchBackoff {
    const FIRST: Duration = Duration::from_millis(100);

    /// From 100 ms up to `max` (never below 100 ms, so a tiny `max` does not spin).
    pub fn new(max: Duration) -> Self {
        Self {
            next: Self::FIRST,
            max: max.max(Self::FIRST),
        }
    }
}

/// The backoff of the controllers' watches: up to [`WATCH_MAX_DELAY`].
pub fn watch_backoff() -> WatchBackoff {
    WatchBackoff::new(WATCH_MAX_DELAY)
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let delay = self.next;
        self.next = (self.next * 2).min(self.max);
        Some(delay)
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

fn delay_for(base: Duration, max: Duration, previous_failures: u32) -> Duration {
    let factor = 2u32.checked_pow(previous_failures).unwrap_or(u32::MAX);
    base.checked_mul(factor).map_or(max, |d| d.min(max))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_five_milliseconds() {
        let backoff = Backoff::default();
        let delays: Vec<u128> = (0..5)
            .map(|_| backoff.next_delay("a").as_millis())
            .collect();
        assert_eq!(delays, [5, 10, 20, 40, 80]);
    }

    #[test]
    fn is_capped_and_never_overflows() {
        let backoff = Backoff::default();
        let delays: Vec<Duration> = (0..100).map(|_| backoff.next_delay("a")).collect();
        assert_eq!(
            delays[15],
            Duration::from_millis(5 * (1 << 15)).min(MAX_DELAY)
        );
        assert_eq!(delays[16], MAX_DELAY);
        assert_eq!(delays[99], MAX_DELAY);
        assert!(delays.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn watches_reconnect_within_the_cap() {
        use kube::runtime::utils::Backoff as _;
        let mut backoff = WatchBackoff::new(Duration::from_secs(2));
        let delays: Vec<u128> = backoff.by_ref().take(7).map(|d| d.as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1600, 2000, 2000]);
        backoff.reset();
        assert_eq!(backoff.next(), Some(Duration::from_millis(100)));
        let mut tiny = WatchBackoff::new(Duration::from_millis(1));
        assert_eq!(tiny.nth(3), Some(Duration::from_millis(100)));
        assert_eq!(watch_backoff().nth(10), Some(WATCH_MAX_DELAY));
    }

    #[test]
    fn is_per_object_and_reset_on_success() {
        let backoff = Backoff::default();
        backoff.next_delay("a");
        backoff.next_delay("a");
        assert_eq!(
            backoff.next_delay("b"),
            BASE_DELAY,
            "other objects are unaffected"
        );
        assert_eq!(backoff.next_delay("a"), BASE_DELAY * 4);
        backoff.reset(&"a");
        assert_eq!(backoff.next_delay("a"), BASE_DELAY);
        assert_eq!(backoff.len(), 2);
    }
}
