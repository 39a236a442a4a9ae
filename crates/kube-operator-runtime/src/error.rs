//! Errors of the controllers crate.

/// Everything that can go wrong while reconciling or running a controller.
///
/// A reconcile that fails returns one of these; the shared driver counts it
/// (`controller_runtime_reconcile_errors_total`), logs it in the reconcile's span and retries the
/// object with exponential backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request to the API server failed.
    #[error("kubernetes API request failed: {0}")]
    Kube(#[from] kube::Error),

    /// An object from the API server lacks a field the API server always sets (for example
    /// `metadata.uid`); seen only with a stale or hand-made object.
    #[error("{kind} is missing {field}")]
    MissingField {
        /// The kind of the object.
        kind: std::borrow::Cow<'static, str>,
        /// The missing field, as a JSON path.
        field: &'static str,
    },

    /// A desired object written as JSON is not an object of its kind (see
    /// `children::desired`): a mistake in the controller.
    #[error("the desired {kind} is not one: {reason}")]
    InvalidObject {
        /// The kind of the object.
        kind: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A reconcile wrote a kind of child its controller did not declare with
    /// `Builder::owns_kind`: a mistake in the controller, not in the object.
    #[error("{kind} is not a declared child kind of this controller (Builder::owns_kind)")]
    UndeclaredChild {
        /// The kind of the child.
        kind: std::borrow::Cow<'static, str>,
    },

    /// An object's spec holds a value the controller cannot act on (the validating webhook
    /// refuses it; this is seen only for objects written while the webhook was not called).
    #[error("{field} is invalid: {reason}")]
    InvalidSpec {
        /// The field, as a JSON path.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },

    /// The manager or platform name given to [`crate::labels::set_product`] cannot be used.
    #[error("cannot name the product: {reason}")]
    ProductName {
        /// What is wrong with the name.
        reason: String,
    },

    /// Two declared admission webhooks share a name or a path.
    #[error(
        "controller {controller} declares webhook {name} at {path}, but webhook {twin} already has that name or path"
    )]
    DuplicateWebhook {
        /// The controller declaring the second one.
        controller: &'static str,
        /// The second webhook's name.
        name: String,
        /// The second webhook's path.
        path: String,
        /// The webhook declared first.
        twin: String,
    },

    /// An object could not be serialized (to compare it with what was applied before).
    #[error("cannot serialize the desired {kind}")]
    Serialize {
        /// The kind of the object.
        kind: &'static str,
        /// What the serializer reported.
        #[source]
        source: serde_json::Error,
    },

    /// A shared watch stopped before its first complete list, so its cache never became usable.
    #[error("the shared {resource} watch stopped before its cache was ready")]
    WatchStopped {
        /// The watched resource (plural name).
        resource: String,
    },

    /// The API server refused a shared watch before its first list: it can never fill its
    /// cache as asked.
    #[error("cannot watch {resource} (label selector {selector:?}): {reason}")]
    WatchRefused {
        /// The watched resource (plural name).
        resource: String,
        /// Its label selector (empty for every object).
        selector: String,
        /// Why, with the API server's message.
        reason: String,
    },

    /// A controller watches, owns or reconciles what its own RBAC rules do not allow: in a
    /// user's cluster it would fail with 403s, so it does not start.
    #[error(
        "its RBAC rules do not allow {}; add them to its rules (rbac::owns::<K>() for an owned kind, rbac::reads::<K>() for a watched one, rbac::uses::<K>(verbs) for direct calls)",
        missing.join(", ")
    )]
    RbacMissing {
        /// What is missing, as `verb group/resource`.
        missing: Vec<String>,
    },

    /// The cleanup a finalizer stands for failed; the finalizer stays, and it is retried with
    /// backoff.
    #[error("cleanup before removing finalizer {finalizer} failed: {source}")]
    Cleanup {
        /// The finalizer.
        finalizer: &'static str,
        /// What went wrong.
        #[source]
        source: Box<Error>,
    },

    /// The reconcile ran past the reconcile timeout and was cancelled; it counts as an error
    /// and is retried with backoff.
    #[error("the reconcile did not finish within {after:?}")]
    TimedOut {
        /// The timeout.
        after: std::time::Duration,
    },

    /// The reconcile panicked; it counts as an error and is retried.
    #[error("the reconcile panicked: {message}")]
    Panicked {
        /// The panic's message.
        message: String,
    },

    /// A controller stopped with an error; names which.
    #[error("controller {controller} failed")]
    Controller {
        /// The controller's name.
        controller: &'static str,
        /// What went wrong.
        #[source]
        source: Box<Error>,
    },
}

impl Error {
    /// Whether the API server refused to create something because its namespace is being
    /// deleted (the `NamespaceTerminating` cause of a 403). Nothing is wrong then: the custom
    /// resource goes with its namespace, and retrying only makes noise.
    pub fn is_namespace_terminating(&self) -> bool {
        match self {
            Error::Kube(kube::Error::Api(status)) => {
                status.code == 403
                    && (status.details.as_ref().is_some_and(|d| {
                        d.causes.iter().any(|c| c.reason == "NamespaceTerminating")
                    }) || status.message.contains("because it is being terminated"))
            }
            _ => false,
        }
    }

    /// Whether the API server refused to create something because an object of that name
    /// exists (a 409 `AlreadyExists`).
    pub fn is_already_exists(&self) -> bool {
        matches!(self, Error::Kube(kube::Error::Api(status))
            if status.code == 409 && status.reason == "AlreadyExists")
    }

    /// Whether the object asked for does not exist (a 404).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Kube(kube::Error::Api(status)) if status.code == 404)
    }

    /// Whether retrying cannot help: the same object fails the same way until it changes
    /// (controller-runtime's terminal errors). Such a failure is counted in
    /// `controller_runtime_terminal_reconcile_errors_total` and not retried.
    pub fn is_terminal(&self) -> bool {
        match self {
            Error::MissingField { .. }
            | Error::Serialize { .. }
            | Error::InvalidSpec { .. }
            | Error::UndeclaredChild { .. }
            | Error::InvalidObject { .. } => true,
            Error::Controller { source, .. } => source.is_terminal(),
            _ => false,
        }
    }

    /// A short, bounded label for the error-kind breakdown of the reconcile error counter.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(status)) if status.code == 409 => "conflict",
            Error::Kube(kube::Error::Api(status)) if status.code == 403 => "forbidden",
            Error::Kube(kube::Error::Api(status)) if status.code == 422 => "invalid",
            Error::Kube(_) => "kube",
            Error::MissingField { .. } => "missing_field",
            Error::UndeclaredChild { .. } => "undeclared_child",
            Error::InvalidObject { .. } => "invalid_object",
            Error::InvalidSpec { .. } => "invalid_spec",
            Error::WatchStopped { .. } => "watch_stopped",
            Error::WatchRefused { .. } => "watch_refused",
            Error::RbacMissing { .. } => "rbac_missing",
            Error::Panicked { .. } => "panic",
            Error::Serialize { .. } => "serialize",
            Error::DuplicateWebhook { .. } => "duplicate_webhook",
            Error::ProductName { .. } => "product_name",
            Error::Controller { source, .. } => source.metric_label(),
            Error::Cleanup { .. } => "cleanup",
            Error::TimedOut { .. } => "timeout",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_bounded_and_distinct() {
        let missing = Error::MissingField {
            kind: "Memcached".into(),
            field: "metadata.uid",
        };
        assert_eq!(missing.metric_label(), "missing_field");
        assert_eq!(missing.to_string(), "Memcached is missing metadata.uid");
        assert_eq!(
            Error::WatchStopped {
                resource: "pods".into()
            }
            .metric_label(),
            "watch_stopped"
        );
    }

    #[test]
    fn namespace_termination_is_recognised() {
        let status = kube::core::Status::failure(
            "deployments.apps \"m\" is forbidden: unable to create new content in namespace ns \
             because it is being terminated",
            "Forbidden",
        )
        .with_code(403);
        let error = Error::Kube(kube::Error::Api(status.boxed()));
        assert!(error.is_namespace_terminating());
        assert_eq!(error.metric_label(), "forbidden");
        let rbac = kube::core::Status::failure("forbidden: User cannot create", "Forbidden")
            .with_code(403);
        assert!(!Error::Kube(kube::Error::Api(rbac.boxed())).is_namespace_terminating());
    }

    #[test]
    fn a_taken_name_is_recognised() {
        let taken =
            kube::core::Status::failure("deployments.apps \"m\" already exists", "AlreadyExists")
                .with_code(409);
        let error = Error::Kube(kube::Error::Api(taken.boxed()));
        assert!(error.is_already_exists());
        assert_eq!(error.metric_label(), "conflict");
        let conflict =
            kube::core::Status::failure("the object has been modified", "Conflict").with_code(409);
        assert!(!Error::Kube(kube::Error::Api(conflict.boxed())).is_already_exists());
    }
}
