//! The two priorities of a work queue's triggers.

/// How soon a trigger is to run: live changes go ahead of catch-up ([`crate::workqueue`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// Catching up: the objects of a watch's first list, requeues and retries.
    CatchUp,
    /// A live change: runs before every catch-up key.
    Live,
}

impl Priority {
    /// The `priority` label of `workqueue_depth`, as controller-runtime's priority queue
    /// writes it.
    pub fn label(self) -> &'static str {
        match self {
            Priority::Live => "0",
            Priority::CatchUp => "-100",
        }
    }

    pub(crate) fn index(self) -> usize {
        match self {
            Priority::Live => 0,
            Priority::CatchUp => 1,
        }
    }
}
