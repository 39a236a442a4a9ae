//! Errors of the controllers crate.

/// Everything that can go wrong while reconciling or running a controller.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request to the API server failed.
    #[error("kubernetes API request failed: {0}")]
    Kube(#[source] kube::Error),
}

impl Error {
    /// A short, bounded label for the `controller_runtime_reconcile_errors_total` breakdown.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
        }
    }
}
