//! The one error type of the manager.

use std::net::SocketAddr;
use std::time::Duration;

use crate::config::ConfigError;

/// Why the manager could not start or had to stop.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration is invalid; nothing was started.
    #[error(transparent)]
    Config(#[from] ConfigError),

    /// Logging could not be set up.
    #[error("cannot set up logging: {0}")]
    Telemetry(String),

    /// A metric could not be created or registered.
    #[error("cannot register metrics")]
    Metrics(#[from] prometheus::Error),

    /// An HTTP endpoint could not listen on its address.
    #[error("cannot listen on {address} for {endpoint}")]
    Bind {
        /// `metrics` or `health probes`.
        endpoint: &'static str,
        /// The configured address.
        address: SocketAddr,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// A TLS certificate (metrics or webhooks) or the TLS configuration is unusable.
    #[error("TLS: {0}")]
    Tls(String),

    /// The webhook certificates' Secret, or an object that carries their CA bundle, could not
    /// be read or written.
    #[error("webhook certificates: cannot {action}")]
    WebhookCerts {
        /// What was being done, naming the object.
        action: String,
        /// The API server's answer.
        #[source]
        source: kube::Error,
    },

    /// The signal handlers could not be installed.
    #[error("cannot install signal handlers")]
    Signals(#[source] std::io::Error),

    /// No cluster configuration was found (in-cluster, `KUBECONFIG`, `~/.kube/config`), or it
    /// is unusable.
    #[error("cannot configure the Kubernetes client")]
    Client(#[source] kube::Error),

    /// The leader election Lease could not be acquired because of a request that can never
    /// succeed (for example the manager lacks permissions on Leases).
    #[error("leader election failed: {0}")]
    LeaderElection(String),

    /// Sharded mode could not hand slots over, or read who holds them.
    #[error("sharding: {0}")]
    Sharding(String),

    /// This manager was leading and lost the Lease: it could not renew within the renew
    /// deadline, or another candidate holds it. The process exits so that its controllers stop
    /// for certain; the kubelet restarts it as a standby.
    #[error("leadership lost: {0}")]
    LeadershipLost(String),

    /// A controller stopped with an error it cannot recover from.
    #[error("controllers failed")]
    Controllers(#[from] kube_operator_runtime::Error),

    /// The controllers' task panicked or was aborted.
    #[error("controllers crashed: {0}")]
    ControllersCrashed(String),

    /// A controller's write was not sent, or was abandoned in flight, because this replica
    /// could not be sure it still held the leader Lease (see [`crate::fence`]).
    #[error("{method} {path} refused by the write fence: {reason}")]
    WriteFenced {
        /// The HTTP method of the write.
        method: http::Method,
        /// The request path, naming the object.
        path: String,
        /// Why the fence was closed.
        reason: String,
    },

    /// Controllers did not finish their in-flight work within the shutdown timeout.
    #[error("controllers did not stop within the shutdown timeout of {}", crate::duration::Display(*.0))]
    ShutdownTimeout(Duration),
}

impl Error {
    /// The process exit status for this error: 2 for a configuration error (nothing started,
    /// like a usage error), 1 for everything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            // A bad certificate directory is bad configuration too.
            Self::Config(_) | Self::Tls(_) => 2,
            _ => 1,
        }
    }

    /// The message with every underlying cause, `outer: inner: innermost`.
    pub fn report(&self) -> String {
        let mut text = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(cause) = source {
            // Some errors repeat their cause in their own message; say it once.
            let cause_text = cause.to_string();
            if !text.contains(&cause_text) {
                text.push_str(": ");
                text.push_str(&cause_text);
            }
            source = cause.source();
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Problem;

    #[test]
    fn configuration_errors_exit_2_and_others_1() {
        let config = Error::Config(ConfigError {
            problems: vec![Problem {
                key: "k".into(),
                origin: "flag --k".into(),
                message: "bad".into(),
            }],
        });
        assert_eq!(config.exit_code(), 2);
        assert_eq!(Error::LeadershipLost("taken".into()).exit_code(), 1);
        assert_eq!(
            Error::Tls("/certs/tls.key: not a PEM private key".into()).exit_code(),
            2,
            "a bad certificate directory is bad configuration"
        );
        assert_eq!(
            Error::ShutdownTimeout(Duration::from_secs(30)).exit_code(),
            1
        );
    }

    #[test]
    fn report_names_each_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::AddrInUse, "address in use");
        let error = Error::Bind {
            endpoint: "metrics",
            address: ([127, 0, 0, 1], 8080).into(),
            source: io,
        };
        assert_eq!(
            error.report(),
            "cannot listen on 127.0.0.1:8080 for metrics: address in use"
        );
        let text = Error::ShutdownTimeout(Duration::from_secs(30)).report();
        assert_eq!(
            text,
            "controllers did not stop within the shutdown timeout of 30s"
        );
    }
}
