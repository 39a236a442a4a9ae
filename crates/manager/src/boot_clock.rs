//! Time since boot, counting the time the machine was suspended (`CLOCK_BOOTTIME`).
//!
//! The monotonic clock that timers and [`tokio::time::Instant`] use stops while the machine is
//! suspended, so after a resume a renew deadline measured on it has not passed, while the
//! standbys on other machines have counted every second. The write fence checks this clock too.

use std::time::Duration;

use nix::time::{ClockId, clock_gettime};

/// Time since boot, suspended time included. `None` where the clock cannot be read (it can on
/// every Linux the manager runs on); the fence then relies on the monotonic clock alone.
pub fn since_boot() -> Option<Duration> {
    let now = clock_gettime(ClockId::CLOCK_BOOTTIME).ok()?;
    let seconds = u64::try_from(now.tv_sec()).ok()?;
    let nanos = u32::try_from(now.tv_nsec()).ok()?;
    Some(Duration::new(seconds, nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_boot_clock_moves_forward() {
        let first = since_boot().expect("CLOCK_BOOTTIME");
        std::thread::sleep(Duration::from_millis(5));
        let second = since_boot().expect("CLOCK_BOOTTIME");
        assert!(
            second >= first + Duration::from_millis(5),
            "{first:?} then {second:?}"
        );
    }
}
