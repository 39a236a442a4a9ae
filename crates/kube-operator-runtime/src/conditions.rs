//! The condition types the runtime reports for a workload, following the Kubernetes API
//! conventions (`metav1.Condition`), so tooling like `kubectl wait --for=condition=Available`
//! works.
//!
//! A status reports its conditions to the runtime by implementing `AsRef<[Condition]>`: a
//! standard trait, so the crate of API types needs no dependency on this one.

/// The workload is serving: every desired replica is ready.
pub const AVAILABLE: &str = "Available";
/// The workload is moving towards the desired state (rolling out, scaling).
pub const PROGRESSING: &str = "Progressing";
/// Reconciliation is blocked on something a user must fix; the reason and message say what.
pub const DEGRADED: &str = "Degraded";
