//! Logs and metrics: the tracing subscriber and the one Prometheus registry.

use std::io::IsTerminal as _;

use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::JsonFields;

use crate::Error;
use crate::config::{Config, LogFormat};
use crate::json_log::FlatJson;

/// Installs the global tracing subscriber: flat JSON lines ([`FlatJson`], with the configured
/// key names) when the format is `json`, or `auto` and stdout is not a terminal (in-cluster);
/// human-readable lines otherwise. `RUST_LOG`, when set, filters; else the configured level.
///
/// # Errors
/// [`Error::Telemetry`] when `RUST_LOG` is invalid or a subscriber is already installed.
pub fn init_logging(config: &Config) -> Result<(), Error> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(value) if !value.trim().is_empty() => EnvFilter::try_new(&value)
            .map_err(|e| Error::Telemetry(format!("invalid RUST_LOG {value:?}: {e}")))?,
        _ => EnvFilter::new(config.log_level.directive()),
    };
    let json = match config.log_format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !std::io::stdout().is_terminal(),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stdout);
    let installed = if json {
        builder
            .fmt_fields(JsonFields::new())
            .event_format(FlatJson::with_keys(config.log_keys))
            .try_init()
    } else {
        builder.try_init()
    };
    installed.map_err(|e| Error::Telemetry(e.to_string()))
}

/// A registry with the process metrics (`process_resident_memory_bytes`,
/// `process_cpu_seconds_total`, `process_open_fds`, ...) already in it.
///
/// # Errors
/// [`Error::Metrics`] when registration fails.
pub fn registry() -> Result<Registry, Error> {
    let registry = Registry::new();
    registry.register(Box::new(
        prometheus::process_collector::ProcessCollector::for_self(),
    ))?;
    Ok(registry)
}

/// Registers controller-runtime's `leader_election_master_status{name}` gauge.
///
/// # Errors
/// [`Error::Metrics`] when registration fails.
pub fn leader_gauge(registry: &Registry) -> Result<IntGaugeVec, Error> {
    let gauge = IntGaugeVec::new(
        Opts::new(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease.",
        ),
        &["name"],
    )?;
    registry.register(Box::new(gauge.clone()))?;
    Ok(gauge)
}

/// Registers `operator_manager_shard_member`: 1 while this replica of a sharded manager holds
/// its member Lease (and may write for its slots), 0 otherwise.
///
/// # Errors
/// [`Error::Metrics`] when registration fails.
pub fn shard_member_gauge(registry: &Registry) -> Result<IntGauge, Error> {
    let gauge = IntGauge::new(
        "operator_manager_shard_member",
        "1 while this replica of a sharded manager holds its member lease, 0 otherwise",
    )?;
    registry.register(Box::new(gauge.clone()))?;
    Ok(gauge)
}

/// Registers `leader_election_fenced_writes_total{name}`: controller writes the write fence
/// refused or abandoned because this replica could not be sure it held the Lease `name`.
///
/// # Errors
/// [`Error::Metrics`] when registration fails.
pub fn fenced_writes(registry: &Registry) -> Result<IntCounterVec, Error> {
    let counter = IntCounterVec::new(
        Opts::new(
            "leader_election_fenced_writes_total",
            "Total number of controller writes not sent, or abandoned in flight, because this replica could not be sure it held the leader lease 'name'.",
        ),
        &["name"],
    )?;
    registry.register(Box::new(counter.clone()))?;
    Ok(counter)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_has_process_metrics_and_leader_gauge() {
        let registry = registry().unwrap();
        let gauge = leader_gauge(&registry).unwrap();
        gauge.with_label_values(&["lease"]).set(1);
        fenced_writes(&registry)
            .unwrap()
            .with_label_values(&["lease"])
            .inc();
        let names: Vec<String> = registry
            .gather()
            .iter()
            .map(|f| f.name().to_owned())
            .collect();
        for want in [
            "process_resident_memory_bytes",
            "process_cpu_seconds_total",
            "process_open_fds",
            "leader_election_master_status",
            "leader_election_fenced_writes_total",
        ] {
            assert!(
                names.iter().any(|n| n == want),
                "{want} missing from {names:?}"
            );
        }
    }
}
