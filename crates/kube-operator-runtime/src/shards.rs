//! Which objects a sharded replica reconciles now, and how it lets go of them.
//!
//! A replica of a sharded manager reconciles only the objects of the slots ([`crate::slots`])
//! its coordinator gives it ([`ShardControl::assign`]). Each controller follows the
//! assignment: the objects of a slot it gains are queued to catch up, and for a slot it loses
//! it drops what waits and starts nothing more. Once the reconciles it was running for those
//! slots have ended, it reports them let go ([`ShardControl::released`]): only then may the
//! coordinator hand them to another replica, so that two replicas never write for one object.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;

use crate::Takeover;
use crate::slots::Slots;

/// The slots a replica owns, numbered so that a controller can say which assignment it has
/// caught up with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Assignment {
    /// The slots whose objects this replica reconciles.
    pub slots: Slots,
    /// Counts the assignments, from 0 (the first, owning nothing).
    pub generation: u64,
    /// What is known of whoever reconciled the newly gained slots before.
    pub takeover: Takeover,
}

/// The controllers' side: what they may reconcile; given with [`crate::RunOptions::shards`].
#[derive(Clone, Debug)]
pub struct Shards {
    assigned: watch::Receiver<Assignment>,
    released: Releases,
    by_shard: Arc<AtomicBool>,
}

/// The coordinator's side of [`Shards`].
#[derive(Debug)]
pub struct ShardControl {
    assigned: watch::Sender<Assignment>,
    released: Releases,
    by_shard: Arc<AtomicBool>,
}

/// Each controller's report of the last assignment it has caught up with.
type Releases = Arc<Mutex<Vec<watch::Receiver<u64>>>>;

/// One controller's view of the assignment ([`Shards::follow`]).
#[derive(Debug)]
pub struct ShardFollower {
    assigned: watch::Receiver<Assignment>,
    caught_up: watch::Sender<u64>,
    by_shard: Arc<AtomicBool>,
}

impl Shards {
    /// A replica that owns no slot until its coordinator assigns some.
    pub fn new() -> (ShardControl, Shards) {
        let (assigned, receiver) = watch::channel(Assignment::default());
        let released = Releases::default();
        let by_shard = Arc::new(AtomicBool::new(false));
        let control = ShardControl {
            assigned,
            released: released.clone(),
            by_shard: by_shard.clone(),
        };
        let shards = Shards {
            assigned: receiver,
            released,
            by_shard,
        };
        (control, shards)
    }

    /// The assignments from now on, for a watch of children to follow
    /// ([`crate::SharedWatches::with_shards`]); unlike [`Shards::follow`], nothing waits for
    /// it to let go of a slot.
    pub fn assignments(&self) -> watch::Receiver<Assignment> {
        self.assigned.clone()
    }

    /// A controller starts following the assignment; it reports through the follower what it
    /// has let go of, for as long as it keeps it.
    pub fn follow(&self) -> ShardFollower {
        let mut assigned = self.assigned.clone();
        // The follower starts from owning nothing: the assignment of now is its first change.
        assigned.mark_changed();
        let (caught_up, report) = watch::channel(assigned.borrow().generation);
        let mut reports = self.released.lock().unwrap_or_else(PoisonError::into_inner);
        // Followers of controllers that stopped need no waiting for.
        reports.retain(|report| report.has_changed().is_ok());
        reports.push(report);
        ShardFollower {
            assigned,
            caught_up,
            by_shard: self.by_shard.clone(),
        }
    }
}

impl ShardControl {
    /// From now on the replica owns `slots`, after whoever `takeover` describes for those it
    /// did not own before; the assignment's generation, for [`ShardControl::released`].
    pub fn assign(&self, slots: Slots, takeover: Takeover) -> u64 {
        let mut generation = 0;
        self.assigned.send_modify(|assignment| {
            assignment.generation += 1;
            assignment.slots = slots;
            assignment.takeover = takeover;
            generation = assignment.generation;
        });
        generation
    }

    /// Says whether the API server lists and watches by shard (KEP-5866): the controllers'
    /// watches of their own objects then ask it for their slots only
    /// ([`crate::shard_watch`]) from the next assignment on. Say it before the first.
    pub fn lists_by_shard(&self, by_shard: bool) {
        self.by_shard.store(by_shard, Ordering::Relaxed);
    }

    /// The slots owned now.
    pub fn slots(&self) -> Slots {
        self.assigned.borrow().slots
    }

    /// Completes once every controller has caught up with the assignment of `generation`:
    /// nothing of the slots it took away is running or waiting any more. A controller that
    /// has stopped counts as caught up.
    pub async fn released(&self, generation: u64) {
        let reports = self
            .released
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        for mut report in reports {
            // An error means the controller is gone, and with it its reconciles.
            let _ = report.wait_for(|caught_up| *caught_up >= generation).await;
        }
    }
}

impl ShardFollower {
    /// The assignment now.
    pub fn current(&self) -> Assignment {
        *self.assigned.borrow()
    }

    /// The assignments from now on, for a watch to follow ([`crate::shard_watch::restarting`]).
    pub fn assignments(&self) -> watch::Receiver<Assignment> {
        self.assigned.clone()
    }

    /// Whether the API server lists and watches by shard, as the coordinator last said.
    pub fn by_shard(&self) -> impl Fn() -> bool + Send + Sync + Clone + 'static {
        let by_shard = self.by_shard.clone();
        move || by_shard.load(Ordering::Relaxed)
    }

    /// Completes with the next assignment (at first, the one in force when the follower
    /// started); never, once the coordinator is gone (the replica is then stopping).
    pub async fn changed(&mut self) -> Assignment {
        if self.assigned.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
        *self.assigned.borrow_and_update()
    }

    /// The controller runs nothing and holds nothing of the slots taken away up to the
    /// assignment of `generation`.
    pub fn caught_up(&self, generation: u64) {
        self.caught_up.send_if_modified(|caught_up| {
            let newer = generation > *caught_up;
            if newer {
                *caught_up = generation;
            }
            newer
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn slots_are_released_once_every_following_controller_caught_up() {
        let (control, shards) = Shards::new();
        let mut first = shards.follow();
        let second = shards.follow();
        assert_eq!(
            first.changed().await,
            Assignment::default(),
            "owning nothing"
        );
        let generation = control.assign(Slots::ALL, Takeover::default());
        assert_eq!(first.changed().await.slots, Slots::ALL);
        first.caught_up(generation);
        let released = tokio::time::timeout(Duration::from_secs(1), control.released(generation));
        assert!(released.await.is_err(), "the second has not caught up");
        second.caught_up(generation);
        control.released(generation).await;

        // A controller that stops lets go of everything.
        let shrunk = control.assign(Slots::one(3), Takeover::default());
        drop(first);
        second.caught_up(shrunk);
        control.released(shrunk).await;
        assert_eq!(control.slots(), Slots::one(3));
        assert_eq!(shards.follow().current().generation, shrunk);
    }
}
