//! The manager's configuration: defaults < file < environment < flags.
//!
//! Every setting has one key, spelled three ways:
//!
//! | key (file)                   | environment                          | flag                            | default                      |
//! |------------------------------|--------------------------------------|---------------------------------|------------------------------|
//! | `metrics_bind_address`       | `MANAGER_METRICS_BIND_ADDRESS`       | `--metrics-bind-address`        | `:8080` (`0` disables)       |
//! | `metrics_secure`             | `MANAGER_METRICS_SECURE`             | `--metrics-secure[=BOOL]`       | `false`                      |
//! | `metrics_cert_path`          | `MANAGER_METRICS_CERT_PATH`          | `--metrics-cert-path`           | none (webhook certificate)   |
//! | `health_probe_bind_address`  | `MANAGER_HEALTH_PROBE_BIND_ADDRESS`  | `--health-probe-bind-address`   | `:8081` (`0` disables)       |
//! | `webhook_bind_address`       | `MANAGER_WEBHOOK_BIND_ADDRESS`       | `--webhook-bind-address`        | `:9443` (`0` disables)       |
//! | `webhook_cert_path`          | `MANAGER_WEBHOOK_CERT_PATH`          | `--webhook-cert-path`           | none (provisioned)           |
//! | `webhook_cert_validity`      | `MANAGER_WEBHOOK_CERT_VALIDITY`      | `--webhook-cert-validity`       | `8760h` (a year)             |
//! | `leader_elect`               | `MANAGER_LEADER_ELECT`               | `--leader-elect[=BOOL]`         | `false`                      |
//! | `warm_standby`               | `MANAGER_WARM_STANDBY`               | `--warm-standby[=BOOL]`         | `true`                       |
//! | `leader_election_id`         | `MANAGER_LEADER_ELECTION_ID`         | `--leader-election-id`          | `operator-manager-leader`    |
//! | `leader_election_namespace`  | `MANAGER_LEADER_ELECTION_NAMESPACE`  | `--leader-election-namespace`   | see below                    |
//! | `lease_duration`             | `MANAGER_LEASE_DURATION`             | `--lease-duration`              | `15s`                        |
//! | `renew_deadline`             | `MANAGER_RENEW_DEADLINE`             | `--renew-deadline`              | `10s`                        |
//! | `retry_period`               | `MANAGER_RETRY_PERIOD`               | `--retry-period`                | `2s`                         |
//! | `log_format`                 | `MANAGER_LOG_FORMAT`                 | `--log-format`                  | `auto` (`json`, `text`)      |
//! | `controllers`                | `MANAGER_CONTROLLERS`                | `--controllers`                 | `*` (all)                    |
//! | `max_concurrent_reconciles`  | `MANAGER_MAX_CONCURRENT_RECONCILES`  | `--max-concurrent-reconciles`   | `4`                          |
//! | `shutdown_timeout`           | `MANAGER_SHUTDOWN_TIMEOUT`           | `--shutdown-timeout`            | `30s`                        |
//! | `reconcile_debounce`         | `MANAGER_RECONCILE_DEBOUNCE`         | `--reconcile-debounce`          | `250ms`                      |
//! | `reconcile_timeout`          | `MANAGER_RECONCILE_TIMEOUT`          | `--reconcile-timeout`           | `0s` (none)                  |
//! | `namespace`                  | `MANAGER_NAMESPACE`                  | `--namespace` (repeatable)      | every namespace              |
//!
//! The file is named by `--config PATH` (or `MANAGER_CONFIG`) and read as YAML (`.yaml`, `.yml`)
//! or TOML (`.toml`) by its extension; its top level is a map of the keys above.
//!
//! - Addresses are `[HOST]:PORT` as in controller-runtime: `:8080` listens on all IPv4
//!   interfaces (in-cluster), `127.0.0.1:8080` on loopback only, `[::]:8080` on all IPv6 (and,
//!   on a dual-stack host, IPv4) interfaces, `0` serves nothing.
//! - Durations are Go-style: `15s`, `500ms`, `1m30s`. The Lease stores whole seconds, so the
//!   lease duration is rounded up to a second. Leader election follows client-go's rules
//!   (`renew_deadline` < `lease_duration`, `retry_period` × 1.2 < `renew_deadline`), each of its
//!   durations at most an hour; `webhook_cert_validity` is at most ten years, the other
//!   durations at most a day.
//! - `leader_election_id` names the Lease, so it must be a DNS subdomain, and
//!   `leader_election_namespace` a namespace name.
//! - `metrics_secure` serves `/metrics` over HTTPS to scrapers whose bearer token the API
//!   server authenticates and allows `get` on `/metrics` (the generated `metrics-reader`
//!   ClusterRole); off by default for a local run, on in the generated Deployment (port 8443,
//!   as Kubebuilder). `metrics_cert_path` names a directory with `tls.crt` and `tls.key` (read
//!   again when they change); without it the metrics are served with the webhook certificate
//!   the manager provisions (it carries the metrics Service's names), or, when no webhooks are
//!   served, a certificate self-signed at start.
//! - `webhook_bind_address` serves the admission webhooks the controllers declare, over HTTPS,
//!   on every replica (admission is not leader-gated), e.g. `:9443` (Kubebuilder's port);
//!   `/readyz` fails until it serves. By default the manager provisions its certificate: a CA
//!   and a serving certificate for the webhook Service, kept in a Secret in its namespace (the
//!   leader election namespace), the CA put into the webhook configurations, renewed with a
//!   third of `webhook_cert_validity` left (the CA lives four times as long). With
//!   `webhook_cert_path`, a directory with `tls.crt` and `tls.key` (read again when they
//!   change), it serves those instead, and their CA is the configurations' business
//!   (cert-manager's CA injector, OLM).
//! - `leader_elect` defaults to `false`, as in Kubebuilder's scaffold, so a developer running
//!   the manager against their own cluster does not need a Lease; the generated Deployment
//!   passes `--leader-elect`.
//! - `warm_standby` (with `leader_elect`): a replica that does not lead runs its controllers'
//!   watches and caches anyway and reconciles nothing, so when it wins the Lease it starts
//!   reconciling at once, the changes made while it stood by first, instead of listing
//!   everything then. It costs the standby the memory of the caches, which its limit must
//!   allow for when it leads anyway, and the API server one more watch per resource type, so
//!   it is on by default; `false` starts the controllers only once the Lease is won.
//! - `leader_election_namespace` defaults to `$POD_NAMESPACE` (set by the downward API in the
//!   generated Deployment), else the client's default namespace: the service account's namespace
//!   in-cluster, else the current kubeconfig context's namespace, else `default`.
//! - `reconcile_debounce` folds a burst of triggers into one reconcile: an idle object's first
//!   trigger is reconciled at once, and the triggers that follow within that long of its
//!   reconcile (the echoes of its writes, its Deployment's rollout, moments apart) wait until
//!   the object has had no new one for that long, so the burst costs one more reconcile and one
//!   status write instead of one each; `0s` reconciles every trigger at once.
//! - `reconcile_timeout` cancels a reconcile that runs longer, counts it in
//!   `controller_runtime_reconcile_timeouts_total` and retries it with backoff, as
//!   controller-runtime's `ReconciliationTimeout` does; `0s` (the default, as there) lets a
//!   reconcile run as long as it takes. A controller may declare its own.
//! - `controllers` is a comma-separated list (or, in a file, a list): a name enables that
//!   controller, `-name` disables it, `*` means every controller. `*,-myapp` runs all but MyApp.
//! - `namespace` restricts every watch and cache to the namespaces named: a comma-separated
//!   list (or, in a file, a list), and the flag may be repeated. With it, the manager needs
//!   only Roles in those namespaces (`deploy/namespaced/`), not the ClusterRole. Empty means
//!   every namespace.
//!
//! # Errors
//! Any bad value stops start-up with a message that names the key and where its value came
//! from (`file /etc/manager.yaml`, `env var MANAGER_LEASE_DURATION`, `flag --lease-duration`);
//! the binary then exits with status 2.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};
use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

use crate::duration;

/// Prefix of the environment variables the manager reads.
pub const ENV_PREFIX: &str = "MANAGER_";

/// The environment variable that names the configuration file when `--config` is not given.
pub const CONFIG_ENV: &str = "MANAGER_CONFIG";

/// The shortest webhook certificate validity: renewal starts with a third left and is
/// checked every tenth, at least every second.
pub const MIN_WEBHOOK_CERT_VALIDITY: Duration = Duration::from_secs(30);
/// The longest webhook certificate validity accepted: ten years.
pub const MAX_WEBHOOK_CERT_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 60 * 60);
/// The longest lease duration, renew deadline or retry period accepted. A longer Lease leaves
/// the platform without a leader for as long after a crash; and every duration is added to the
/// clock, which a value near the largest Go duration (`2562047788015215h`) overflows.
pub const MAX_LEADER_ELECTION_DURATION: Duration = Duration::from_secs(60 * 60);
/// The longest value of any other duration key: a day.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 60 * 60);
/// client-go's jitter factor: a retry comes up to 20% late, and must still meet the deadline.
const RETRY_JITTER: f64 = 1.2;

/// Every key of [`Config`], in the order of its fields.
pub const KEYS: &[&str] = &[
    "metrics_bind_address",
    "metrics_secure",
    "metrics_cert_path",
    "health_probe_bind_address",
    "webhook_bind_address",
    "webhook_cert_path",
    "webhook_cert_validity",
    "leader_elect",
    "warm_standby",
    "leader_election_id",
    "leader_election_namespace",
    "lease_duration",
    "renew_deadline",
    "retry_period",
    "log_format",
    "controllers",
    "max_concurrent_reconciles",
    "shutdown_timeout",
    "reconcile_debounce",
    "reconcile_timeout",
    "namespace",
];

/// The manager's effective configuration. See the module documentation for every key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where `/metrics` is served.
    pub metrics_bind_address: BindAddress,
    /// Serve `/metrics` over HTTPS to authorized scrapers only.
    pub metrics_secure: bool,
    /// A directory with `tls.crt` and `tls.key` for secure metrics; without it, the provisioned
    /// webhook certificate (self-signed when no webhooks are served).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_cert_path: Option<PathBuf>,
    /// Where `/healthz` and `/readyz` are served.
    pub health_probe_bind_address: BindAddress,
    /// Where the admission webhooks are served.
    pub webhook_bind_address: BindAddress,
    /// A directory with the webhooks' `tls.crt` and `tls.key`; provisioned without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_cert_path: Option<PathBuf>,
    /// How long a provisioned webhook serving certificate is valid.
    #[serde(with = "duration::serde")]
    pub webhook_cert_validity: Duration,
    /// Run controllers only while holding the leader-election Lease.
    pub leader_elect: bool,
    /// While standing by, keep the controllers' caches current (module docs).
    pub warm_standby: bool,
    /// Name of the Lease.
    #[serde(deserialize_with = "lenient_string")]
    pub leader_election_id: String,
    /// Namespace of the Lease; `None` picks one at start-up (module docs).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_option_string"
    )]
    pub leader_election_namespace: Option<String>,
    /// How long a non-leader waits after the last observed renewal before taking over.
    #[serde(with = "duration::serde")]
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before giving up leadership.
    #[serde(with = "duration::serde")]
    pub renew_deadline: Duration,
    /// How often candidates try to acquire and the leader renews.
    #[serde(with = "duration::serde")]
    pub retry_period: Duration,
    /// Log output format.
    pub log_format: LogFormat,
    /// Which controllers run (module docs).
    pub controllers: ControllerSelection,
    /// Upper bound on concurrent reconciles per controller.
    pub max_concurrent_reconciles: u16,
    /// How long controllers get to finish in-flight reconciles at shutdown.
    #[serde(with = "duration::serde")]
    pub shutdown_timeout: Duration,
    /// How long an object must go without a new trigger before it is reconciled.
    #[serde(with = "duration::serde")]
    pub reconcile_debounce: Duration,
    /// How long a reconcile may run before it is cancelled; zero for no limit.
    #[serde(with = "duration::serde")]
    pub reconcile_timeout: Duration,
    /// The namespaces watched; empty for every namespace.
    pub namespace: NamespaceList,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            metrics_bind_address: BindAddress::Listen(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                8080,
            )),
            metrics_secure: false,
            metrics_cert_path: None,
            health_probe_bind_address: BindAddress::Listen(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                8081,
            )),
            webhook_bind_address: BindAddress::Listen(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                kube_operator_runtime::webhook::PORT,
            )),
            webhook_cert_path: None,
            webhook_cert_validity: Duration::from_secs(365 * 24 * 60 * 60),
            leader_elect: false,
            warm_standby: true,
            leader_election_id: concat!(product::name!(), "-leader").to_owned(),
            leader_election_namespace: None,
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            log_format: LogFormat::Auto,
            controllers: ControllerSelection(vec!["*".to_owned()]),
            max_concurrent_reconciles: 4,
            shutdown_timeout: Duration::from_secs(30),
            reconcile_debounce: kube_operator_runtime::RunOptions::DEFAULT_DEBOUNCE,
            reconcile_timeout: Duration::ZERO,
            namespace: NamespaceList::default(),
        }
    }
}

/// What `--version` prints: the crate's version, the git revision it was built from and the
/// build's date (see the crate's build script).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (revision ",
    env!("MANAGER_GIT_REVISION"),
    ", built ",
    env!("MANAGER_BUILD_DATE"),
    ")"
);

/// Command-line flags. Every flag is optional: an absent flag leaves the value from the
/// environment, the file or the default. Values are checked together with the other sources,
/// so a bad flag is reported like any other bad value.
#[derive(Debug, Clone, Default, clap::Parser)]
// As with Go's flag package, a repeated flag takes its last value.
#[command(
    name = "manager",
    version = VERSION,
    about = "Runs the platform's controllers behind leader election.",
    args_override_self = true
)]
pub struct Flags {
    /// Configuration file, YAML (.yaml, .yml) or TOML (.toml) [env: MANAGER_CONFIG]
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Address of the metrics endpoint, e.g. `:8080` or `127.0.0.1:8080`; `0` disables it
    #[arg(long, value_name = "ADDR")]
    pub metrics_bind_address: Option<String>,
    /// Serve metrics over HTTPS to authorized scrapers only (`--metrics-secure` or `=false`)
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub metrics_secure: Option<String>,
    /// Directory holding `tls.crt` and `tls.key` for secure metrics (without it, the provisioned
    /// webhook certificate, or self-signed)
    #[arg(long, value_name = "DIR")]
    pub metrics_cert_path: Option<String>,
    /// Address of the health probe endpoints; `0` disables them
    #[arg(long, value_name = "ADDR")]
    pub health_probe_bind_address: Option<String>,
    /// Address of the admission webhook server (HTTPS), e.g. `:9443`; `0` disables it
    #[arg(long, value_name = "ADDR")]
    pub webhook_bind_address: Option<String>,
    /// Directory holding the webhooks' `tls.crt` and `tls.key` (provisioned without it)
    #[arg(long, value_name = "DIR")]
    pub webhook_cert_path: Option<String>,
    /// Validity of a provisioned webhook serving certificate, e.g. `8760h`
    #[arg(long, value_name = "DURATION")]
    pub webhook_cert_validity: Option<String>,
    /// Enable leader election (`--leader-elect` or `--leader-elect=false`)
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub leader_elect: Option<String>,
    /// While standing by, keep the controllers' caches current so a takeover reconciles at once
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub warm_standby: Option<String>,
    /// Name of the leader-election Lease
    #[arg(long, value_name = "NAME")]
    pub leader_election_id: Option<String>,
    /// Namespace of the leader-election Lease
    #[arg(long, value_name = "NAMESPACE")]
    pub leader_election_namespace: Option<String>,
    /// Lease duration, e.g. `15s`
    #[arg(long, value_name = "DURATION")]
    pub lease_duration: Option<String>,
    /// How long the leader retries renewing before giving up, e.g. `10s`
    #[arg(long, value_name = "DURATION")]
    pub renew_deadline: Option<String>,
    /// Interval between acquire and renew attempts, e.g. `2s`
    #[arg(long, value_name = "DURATION")]
    pub retry_period: Option<String>,
    /// Log format: `json`, `text` or `auto` (JSON unless stdout is a terminal)
    #[arg(long, value_name = "FORMAT")]
    pub log_format: Option<String>,
    /// Controllers to run: comma-separated names, `-name` to disable one, `*` for all
    #[arg(long, value_name = "LIST")]
    pub controllers: Option<String>,
    /// Maximum concurrent reconciles per controller
    #[arg(long, value_name = "N")]
    pub max_concurrent_reconciles: Option<String>,
    /// Time controllers get to finish in-flight work at shutdown, e.g. `30s`
    #[arg(long, value_name = "DURATION")]
    pub shutdown_timeout: Option<String>,
    /// How long the triggers that follow a reconcile must pause before the next, e.g. `250ms`
    #[arg(long, value_name = "DURATION")]
    pub reconcile_debounce: Option<String>,
    /// Cancel and retry a reconcile that runs longer than this, e.g. `2m`; `0s` for no limit
    #[arg(long, value_name = "DURATION")]
    pub reconcile_timeout: Option<String>,
    /// Watch only these namespaces (comma-separated, or the flag repeated); default: all
    #[arg(long, value_name = "LIST", action = clap::ArgAction::Append)]
    pub namespace: Vec<String>,
}

impl Flags {
    /// The flags that were given, as configuration keys and raw values.
    fn values(&self) -> Vec<(&'static str, String)> {
        let all = [
            ("metrics_bind_address", &self.metrics_bind_address),
            ("metrics_secure", &self.metrics_secure),
            ("metrics_cert_path", &self.metrics_cert_path),
            ("health_probe_bind_address", &self.health_probe_bind_address),
            ("webhook_bind_address", &self.webhook_bind_address),
            ("webhook_cert_path", &self.webhook_cert_path),
            ("webhook_cert_validity", &self.webhook_cert_validity),
            ("leader_elect", &self.leader_elect),
            ("warm_standby", &self.warm_standby),
            ("leader_election_id", &self.leader_election_id),
            ("leader_election_namespace", &self.leader_election_namespace),
            ("lease_duration", &self.lease_duration),
            ("renew_deadline", &self.renew_deadline),
            ("retry_period", &self.retry_period),
            ("log_format", &self.log_format),
            ("controllers", &self.controllers),
            ("max_concurrent_reconciles", &self.max_concurrent_reconciles),
            ("shutdown_timeout", &self.shutdown_timeout),
            ("reconcile_debounce", &self.reconcile_debounce),
            ("reconcile_timeout", &self.reconcile_timeout),
        ];
        let namespace = (!self.namespace.is_empty()).then(|| self.namespace.join(","));
        all.into_iter()
            .filter_map(|(key, value)| value.clone().map(|v| (key, v)))
            .chain(namespace.map(|list| ("namespace", list)))
            .collect()
    }
}

/// A listen address, or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindAddress {
    /// `0`: the endpoint is not served.
    Disabled,
    /// Listen on this socket address.
    Listen(SocketAddr),
}

impl BindAddress {
    /// The socket address, unless disabled.
    pub fn socket_addr(self) -> Option<SocketAddr> {
        match self {
            Self::Disabled => None,
            Self::Listen(addr) => Some(addr),
        }
    }
}

impl FromStr for BindAddress {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        if text == "0" {
            return Ok(Self::Disabled);
        }
        let bad = || {
            format!(
                "invalid address {text:?}: expected `[HOST]:PORT` such as `:8080` or `127.0.0.1:8080`, or `0` to disable"
            )
        };
        let (host, port) = text.rsplit_once(':').ok_or_else(bad)?;
        let port: u16 = port.parse().map_err(|_| bad())?;
        let ip = match host {
            "" => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            "localhost" => IpAddr::V4(Ipv4Addr::LOCALHOST),
            _ => {
                let host = host
                    .strip_prefix('[')
                    .and_then(|h| h.strip_suffix(']'))
                    .unwrap_or(host);
                host.parse().map_err(|_| bad())?
            }
        };
        Ok(Self::Listen(SocketAddr::new(ip, port)))
    }
}

impl fmt::Display for BindAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Disabled => f.write_str("0"),
            Self::Listen(addr) => write!(f, "{addr}"),
        }
    }
}

impl Serialize for BindAddress {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for BindAddress {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Number(i64),
        }
        match Raw::deserialize(deserializer) {
            Ok(Raw::Text(text)) => text.parse().map_err(de::Error::custom),
            Ok(Raw::Number(0)) => Ok(Self::Disabled),
            Ok(Raw::Number(n)) => Err(de::Error::custom(format!(
                "invalid address {n}: expected `[HOST]:PORT` such as `:{n}`, or `0` to disable"
            ))),
            Err(_) => Err(de::Error::custom(
                "expected an address such as `:8080`, or `0` to disable",
            )),
        }
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One JSON object per line.
    Json,
    /// Human-readable lines.
    Text,
    /// JSON unless stdout is a terminal.
    Auto,
}

/// Which controllers run: names, `-name` exclusions and `*` for all.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ControllerSelection(pub Vec<String>);

impl<'de> Deserialize<'de> for ControllerSelection {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        list_of_names(deserializer, "controller names").map(Self)
    }
}

/// A comma-separated list (from a flag or the environment) or a list (in a file) of `what`,
/// trimmed, without empty entries.
fn list_of_names<'de, D: Deserializer<'de>>(
    deserializer: D,
    what: &str,
) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Text(String),
        List(Vec<String>),
    }
    let entries = match Raw::deserialize(deserializer) {
        Ok(Raw::Text(text)) => text.split(',').map(str::to_owned).collect(),
        Ok(Raw::List(list)) => list,
        Err(_) => {
            return Err(de::Error::custom(format!(
                "expected a comma-separated list of {what}"
            )));
        }
    };
    Ok(entries
        .into_iter()
        .map(|e| e.trim().to_owned())
        .filter(|e| !e.is_empty())
        .collect())
}

impl ControllerSelection {
    /// The enabled controllers among `known`, in `known`'s order.
    ///
    /// # Errors
    /// A message naming the first unknown controller and listing the known ones.
    pub fn resolve<'a>(&self, known: &[&'a str]) -> Result<Vec<&'a str>, String> {
        let mut all = false;
        let mut enabled = Vec::new();
        let mut disabled = Vec::new();
        for entry in &self.0 {
            if entry == "*" {
                all = true;
                continue;
            }
            let (name, list) = match entry.strip_prefix('-') {
                Some(name) => (name, &mut disabled),
                None => (entry.as_str(), &mut enabled),
            };
            if !known.contains(&name) {
                let known = if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                };
                return Err(format!(
                    "unknown controller {name:?}; known controllers: {known}"
                ));
            }
            list.push(name);
        }
        Ok(known
            .iter()
            .copied()
            .filter(|name| (all || enabled.contains(name)) && !disabled.contains(name))
            .collect())
    }
}

impl fmt::Display for ControllerSelection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join(","))
    }
}

/// The namespaces the manager watches (`namespace`); empty for every namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NamespaceList(pub Vec<String>);

impl<'de> Deserialize<'de> for NamespaceList {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let names = list_of_names(deserializer, "namespace names")?;
        if let Some(bad) = names.iter().find(|n| !is_dns_label(n)) {
            return Err(de::Error::custom(format!(
                "{bad:?} is not a namespace name: lower-case letters, digits and '-', \
                 starting and ending with a letter or digit, at most 63 characters"
            )));
        }
        Ok(Self(names))
    }
}

/// Why `name` cannot name an object such as a Lease (an RFC 1123 DNS subdomain), if it cannot.
fn dns_subdomain(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("it is empty");
    }
    if name.len() > 253 {
        return Err("it is longer than 253 characters");
    }
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let parts_ok = name
        .split('.')
        .all(|part| !part.is_empty() && part.starts_with(alnum) && part.ends_with(alnum));
    if !name.chars().all(|c| alnum(c) || c == '-' || c == '.') || !parts_ok {
        return Err(
            "use lower-case letters, digits, '-' and '.', each part between dots starting and \
             ending with a letter or digit",
        );
    }
    Ok(())
}

/// Whether `name` is a valid namespace name (an RFC 1123 DNS label).
fn is_dns_label(name: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !name.is_empty()
        && name.len() <= 63
        && name.chars().all(|c| alnum(c) || c == '-')
        && name.starts_with(alnum)
        && name.ends_with(alnum)
}

fn lenient_string<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    // The environment and flags are parsed like YAML scalars, so `MANAGER_LEADER_ELECTION_ID=42`
    // arrives as a number; a name is still what was meant.
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Text(String),
        Unsigned(u64),
        Signed(i64),
        Bool(bool),
    }
    match Raw::deserialize(deserializer) {
        Ok(Raw::Text(s)) => Ok(s),
        Ok(Raw::Unsigned(n)) => Ok(n.to_string()),
        Ok(Raw::Signed(n)) => Ok(n.to_string()),
        Ok(Raw::Bool(b)) => Ok(b.to_string()),
        Err(_) => Err(de::Error::custom("expected a string")),
    }
}

fn lenient_option_string<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<String>, D::Error> {
    lenient_string(deserializer).map(|s| Some(s).filter(|s| !s.is_empty()))
}

/// One problem in the configuration: which key, where its value came from, what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The configuration key (file spelling).
    pub key: String,
    /// Where the value came from: `file PATH`, `env var NAME`, `flag --name`, `built-in default`.
    pub origin: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (from {}): {}", self.key, self.origin, self.message)
    }
}

/// The configuration could not be loaded; every problem found is listed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// What is wrong, at least one entry.
    pub problems: Vec<Problem>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("invalid configuration:")?;
        for problem in &self.problems {
            write!(f, "\n  {problem}")?;
        }
        Ok(())
    }
}

impl ConfigError {
    fn one(key: impl Into<String>, origin: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            problems: vec![Problem {
                key: key.into(),
                origin: origin.into(),
                message: message.into(),
            }],
        }
    }
}

/// Where a layer of configuration comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layer {
    Default,
    File,
    Env,
    Flag,
}

impl Layer {
    const DEFAULT_NAME: &'static str = "built-in default";

    fn name(self) -> &'static str {
        match self {
            Self::Default => Self::DEFAULT_NAME,
            Self::File => "file",
            Self::Env => "env var",
            Self::Flag => "flag",
        }
    }

    /// How a key is spelled in this source.
    fn spell(self, key: &str) -> String {
        match self {
            Self::Default | Self::File => key.to_owned(),
            Self::Env => format!("{ENV_PREFIX}{}", key.to_ascii_uppercase()),
            Self::Flag => format!("--{}", key.replace('_', "-")),
        }
    }
}

/// A figment provider for one layer, with metadata that lets errors name their source.
struct LayerProvider {
    layer: Layer,
    path: Option<PathBuf>,
    dict: Dict,
}

impl Provider for LayerProvider {
    fn metadata(&self) -> Metadata {
        let layer = self.layer;
        let metadata = Metadata::named(layer.name())
            .interpolater(move |_: &Profile, keys: &[&str]| layer.spell(&keys.join(".")));
        match &self.path {
            Some(path) => metadata.source(path.as_path()),
            None => metadata,
        }
    }

    fn data(&self) -> figment::Result<Map<Profile, Dict>> {
        Ok(Profile::Default.collect(self.dict.clone()))
    }
}

/// Describes where the value of `key` came from, e.g. `env var MANAGER_RETRY_PERIOD`.
fn origin(metadata: &Metadata, key: &str) -> String {
    if let Some(figment::Source::File(path)) = &metadata.source {
        return format!("file {}", path.display());
    }
    if metadata.name == Layer::DEFAULT_NAME {
        return Layer::DEFAULT_NAME.to_owned();
    }
    format!(
        "{} {}",
        metadata.name,
        metadata.interpolate(&Profile::Default, &[key])
    )
}

/// Loads the configuration from the defaults, the file named by `--config` (or `MANAGER_CONFIG`
/// in `env`), the `MANAGER_*` variables in `env` and the flags, then checks it, including that
/// every controller named is one of `known_controllers`.
///
/// # Errors
/// [`ConfigError`] naming each bad key and its source.
pub fn load(
    flags: &Flags,
    env: impl IntoIterator<Item = (String, String)>,
    known_controllers: &[&str],
) -> Result<Config, ConfigError> {
    let env: Vec<(String, String)> = env.into_iter().collect();
    let mut layers = vec![LayerProvider {
        layer: Layer::Default,
        path: None,
        dict: defaults()?,
    }];

    let config_path = match (&flags.config, env.iter().find(|(k, _)| k == CONFIG_ENV)) {
        (Some(path), _) => Some((path.clone(), "flag --config".to_owned())),
        (None, Some((_, path))) if !path.is_empty() => {
            Some((PathBuf::from(path), format!("env var {CONFIG_ENV}")))
        }
        _ => None,
    };
    if let Some((path, named_by)) = config_path {
        layers.push(LayerProvider {
            layer: Layer::File,
            dict: read_file(&path, &named_by)?,
            path: Some(path),
        });
    }

    let mut env_dict = Dict::new();
    for (name, value) in &env {
        let Some(key) = name.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        if name == CONFIG_ENV {
            continue;
        }
        env_dict.insert(key.to_ascii_lowercase(), parse_scalar(value));
    }
    layers.push(LayerProvider {
        layer: Layer::Env,
        path: None,
        dict: env_dict,
    });

    let flag_dict = flags
        .values()
        .into_iter()
        .map(|(key, value)| (key.to_owned(), parse_scalar(&value)))
        .collect();
    layers.push(LayerProvider {
        layer: Layer::Flag,
        path: None,
        dict: flag_dict,
    });

    // Unknown keys first, so the message names the source precisely.
    let mut problems = Vec::new();
    for layer in &layers {
        for key in layer.dict.keys() {
            if !KEYS.contains(&key.as_str()) {
                let origin = match &layer.path {
                    Some(path) => format!("file {}", path.display()),
                    None => format!("{} {}", layer.layer.name(), layer.layer.spell(key)),
                };
                problems.push(Problem {
                    key: key.clone(),
                    origin,
                    message: format!("unknown key; known keys: {}", KEYS.join(", ")),
                });
            }
        }
    }
    if !problems.is_empty() {
        return Err(ConfigError { problems });
    }

    let figment = layers.into_iter().fold(Figment::new(), Figment::merge);
    let config: Config = figment.extract().map_err(|error| ConfigError {
        problems: error
            .into_iter()
            .map(|e| {
                let key = e.path.join(".");
                let origin = e
                    .metadata
                    .as_ref()
                    .map_or_else(|| "configuration".to_owned(), |md| origin(md, &key));
                Problem {
                    key,
                    origin,
                    message: e.kind.to_string(),
                }
            })
            .collect(),
    })?;
    check(&config, &figment, known_controllers)?;
    Ok(config)
}

/// Parses a value from the environment or a flag the way figment parses environment values:
/// `true` is a boolean, `4` a number, anything else a string.
fn parse_scalar(value: &str) -> Value {
    match Value::from_str(value) {
        Ok(parsed @ (Value::Bool(..) | Value::Num(..) | Value::String(..))) => parsed,
        _ => Value::from(value.to_owned()),
    }
}

fn defaults() -> Result<Dict, ConfigError> {
    Value::serialize(Config::default())
        .ok()
        .and_then(Value::into_dict)
        .ok_or_else(|| {
            ConfigError::one(
                "*",
                Layer::DEFAULT_NAME,
                "the built-in defaults do not serialize",
            )
        })
}

fn read_file(path: &Path, named_by: &str) -> Result<Dict, ConfigError> {
    let origin = format!("file {}", path.display());
    let extension = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigError::one(
            "config",
            named_by,
            format!("cannot read {}: {e}", path.display()),
        )
    })?;
    let parsed: Result<Option<Dict>, String> = match extension.as_deref() {
        Some("yaml" | "yml") => {
            serde_saphyr::from_str(&text).map_err(|e| format!("invalid YAML: {e}"))
        }
        Some("toml") => {
            use figment::providers::Format as _;
            figment::providers::Toml::from_str(&text)
                .map(Some)
                .map_err(|e| format!("invalid TOML: {e}"))
        }
        _ => {
            return Err(ConfigError::one(
                "config",
                named_by,
                format!(
                    "{}: unknown file type; use .yaml, .yml or .toml",
                    path.display()
                ),
            ));
        }
    };
    // An empty YAML document is an empty configuration.
    parsed
        .map(Option::unwrap_or_default)
        .map_err(|message| ConfigError::one("config", origin, message))
}

/// Checks relations between values that serde cannot.
fn check(
    config: &Config,
    figment: &Figment,
    known_controllers: &[&str],
) -> Result<(), ConfigError> {
    let from = |key: &str| {
        figment
            .find_metadata(key)
            .map_or_else(|| Layer::DEFAULT_NAME.to_owned(), |md| origin(md, key))
    };
    let show = |d: Duration| duration::Display(d).to_string();
    let mut problems = Vec::new();
    let mut problem = |key: &str, message: String| {
        problems.push(Problem {
            key: key.to_owned(),
            origin: from(key),
            message,
        });
    };

    if config.lease_duration < Duration::from_secs(1) {
        problem(
            "lease_duration",
            format!(
                "{} is shorter than the minimum of 1s",
                show(config.lease_duration)
            ),
        );
    }
    if config.renew_deadline >= config.lease_duration {
        problem(
            "renew_deadline",
            format!(
                "{} must be shorter than lease_duration ({} from {})",
                show(config.renew_deadline),
                show(config.lease_duration),
                from("lease_duration")
            ),
        );
    }
    if config.retry_period.is_zero() {
        problem("retry_period", "must be longer than 0s".to_owned());
    } else if config.renew_deadline.as_secs_f64()
        <= RETRY_JITTER * config.retry_period.as_secs_f64()
    {
        // client-go's rule: a retry, jittered by up to 20%, must still fit in the deadline.
        problem(
            "retry_period",
            format!(
                "{} × {RETRY_JITTER} must be shorter than renew_deadline ({} from {}): a retry \
                 comes up to 20% late",
                show(config.retry_period),
                show(config.renew_deadline),
                from("renew_deadline")
            ),
        );
    }
    for (key, value, most) in [
        (
            "lease_duration",
            config.lease_duration,
            MAX_LEADER_ELECTION_DURATION,
        ),
        (
            "renew_deadline",
            config.renew_deadline,
            MAX_LEADER_ELECTION_DURATION,
        ),
        (
            "retry_period",
            config.retry_period,
            MAX_LEADER_ELECTION_DURATION,
        ),
        ("shutdown_timeout", config.shutdown_timeout, MAX_DURATION),
        (
            "reconcile_debounce",
            config.reconcile_debounce,
            MAX_DURATION,
        ),
        ("reconcile_timeout", config.reconcile_timeout, MAX_DURATION),
        (
            "webhook_cert_validity",
            config.webhook_cert_validity,
            MAX_WEBHOOK_CERT_VALIDITY,
        ),
    ] {
        if value > most {
            problem(
                key,
                format!(
                    "{} is longer than the maximum of {}",
                    show(value),
                    show(most)
                ),
            );
        }
    }
    if let Err(reason) = dns_subdomain(&config.leader_election_id) {
        problem(
            "leader_election_id",
            format!(
                "{:?} cannot name a Lease: {reason}",
                config.leader_election_id
            ),
        );
    }
    if let Some(namespace) = &config.leader_election_namespace
        && !is_dns_label(namespace)
    {
        problem(
            "leader_election_namespace",
            format!(
                "{namespace:?} is not a namespace name: lower-case letters, digits and '-', \
                 starting and ending with a letter or digit, at most 63 characters"
            ),
        );
    }
    if config.metrics_cert_path.is_some() && !config.metrics_secure {
        problem(
            "metrics_cert_path",
            format!(
                "is set, but metrics_secure is off (from {}): the certificate would not be used",
                from("metrics_secure")
            ),
        );
    }
    if config.webhook_cert_path.is_some() && config.webhook_bind_address == BindAddress::Disabled {
        problem(
            "webhook_cert_path",
            format!(
                "is set, but webhook_bind_address is 0 (from {}): the certificate would not be used",
                from("webhook_bind_address")
            ),
        );
    }
    if config.webhook_cert_validity < MIN_WEBHOOK_CERT_VALIDITY {
        problem(
            "webhook_cert_validity",
            format!(
                "{} is shorter than the minimum of {}",
                show(config.webhook_cert_validity),
                show(MIN_WEBHOOK_CERT_VALIDITY)
            ),
        );
    }
    if config.max_concurrent_reconciles == 0 {
        problem("max_concurrent_reconciles", "must be at least 1".to_owned());
    }
    if let Err(message) = config.controllers.resolve(known_controllers) {
        problem("controllers", message);
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(ConfigError { problems })
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use clap::Parser as _;

    use super::*;

    const KNOWN: &[&str] = &["memcached", "myapp"];

    fn env(vars: &[(&str, &str)]) -> Vec<(String, String)> {
        vars.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn flags(args: &[&str]) -> Flags {
        Flags::try_parse_from(std::iter::once("manager").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn the_version_names_the_revision_and_the_build_date() {
        let error = Flags::try_parse_from(["manager", "--version"]).expect_err("prints, exits");
        assert_eq!(error.kind(), clap::error::ErrorKind::DisplayVersion);
        let printed = error.to_string();
        let revision = env!("MANAGER_GIT_REVISION");
        assert!(
            printed.starts_with(&format!(
                "manager {} (revision {revision}, built ",
                env!("CARGO_PKG_VERSION")
            )),
            "{printed}"
        );
        assert!(
            revision == "unknown" || revision.chars().all(|c| c.is_ascii_hexdigit()),
            "{revision}"
        );
        let date = env!("MANAGER_BUILD_DATE");
        assert!(
            date.len() == 20 && date.ends_with('Z') && date.as_bytes()[10] == b'T',
            "{date}"
        );
    }

    struct TempFile(PathBuf);

    impl TempFile {
        fn new(name: &str, contents: &str) -> Self {
            let dir = std::env::temp_dir().join(format!(
                "manager-config-test-{}-{}",
                std::process::id(),
                fastrand::u64(..)
            ));
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join(name);
            std::fs::File::create(&path)
                .unwrap()
                .write_all(contents.as_bytes())
                .unwrap();
            Self(path)
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            if let Some(dir) = self.0.parent() {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }

    fn one_problem(result: Result<Config, ConfigError>) -> Problem {
        let error = result.unwrap_err();
        assert_eq!(error.problems.len(), 1, "{error}");
        error.problems[0].clone()
    }

    #[test]
    fn defaults_match_the_documentation() {
        let config = load(&Flags::default(), env(&[]), KNOWN).unwrap();
        assert_eq!(config, Config::default());
        assert_eq!(config.metrics_bind_address.to_string(), "0.0.0.0:8080");
        assert_eq!(config.health_probe_bind_address.to_string(), "0.0.0.0:8081");
        assert!(!config.leader_elect);
        assert_eq!(
            config.leader_election_id,
            concat!(product::name!(), "-leader")
        );
        assert_eq!(
            (
                config.lease_duration,
                config.renew_deadline,
                config.retry_period
            ),
            (
                Duration::from_secs(15),
                Duration::from_secs(10),
                Duration::from_secs(2)
            )
        );
        assert_eq!(config.controllers.resolve(KNOWN).unwrap(), KNOWN);
        assert_eq!(config.reconcile_debounce, Duration::from_millis(250));
    }

    #[test]
    fn reconcile_debounce_takes_a_duration_and_zero() {
        let config = load(&flags(&["--reconcile-debounce=1s"]), env(&[]), KNOWN).unwrap();
        assert_eq!(config.reconcile_debounce, Duration::from_secs(1));
        let config = load(
            &Flags::default(),
            env(&[("MANAGER_RECONCILE_DEBOUNCE", "0s")]),
            KNOWN,
        )
        .unwrap();
        assert_eq!(config.reconcile_debounce, Duration::ZERO);
        let problem = one_problem(load(
            &flags(&["--reconcile-debounce=soon"]),
            env(&[]),
            KNOWN,
        ));
        assert_eq!(
            (problem.key.as_str(), problem.origin.as_str()),
            ("reconcile_debounce", "flag --reconcile-debounce")
        );
    }

    #[test]
    fn reconcile_timeout_is_off_unless_set() {
        let config = load(&Flags::default(), env(&[]), KNOWN).unwrap();
        assert_eq!(config.reconcile_timeout, Duration::ZERO);
        let config = load(
            &Flags::default(),
            env(&[("MANAGER_RECONCILE_TIMEOUT", "2m")]),
            KNOWN,
        )
        .unwrap();
        assert_eq!(config.reconcile_timeout, Duration::from_secs(120));
        let config = load(&flags(&["--reconcile-timeout=30s"]), env(&[]), KNOWN).unwrap();
        assert_eq!(config.reconcile_timeout, Duration::from_secs(30));
        let problem = one_problem(load(
            &flags(&["--reconcile-timeout=forever"]),
            env(&[]),
            KNOWN,
        ));
        assert_eq!(
            (problem.key.as_str(), problem.origin.as_str()),
            ("reconcile_timeout", "flag --reconcile-timeout")
        );
    }

    #[test]
    fn secure_metrics_from_flags_and_a_cert_path_without_them_refused() {
        let config = load(
            &flags(&["--metrics-secure", "--metrics-cert-path=/certs"]),
            env(&[]),
            KNOWN,
        )
        .unwrap();
        assert!(config.metrics_secure);
        assert_eq!(config.metrics_cert_path, Some(PathBuf::from("/certs")));
        let p = one_problem(load(
            &Flags::default(),
            env(&[("MANAGER_METRICS_CERT_PATH", "/certs")]),
            KNOWN,
        ));
        assert_eq!(
            (p.key.as_str(), p.origin.as_str()),
            ("metrics_cert_path", "env var MANAGER_METRICS_CERT_PATH")
        );
        assert!(p.message.contains("metrics_secure is off"), "{p}");
    }

    #[test]
    fn webhooks_are_served_on_9443_with_a_provisioned_certificate_by_default() {
        let config = load(&Flags::default(), env(&[]), KNOWN).unwrap();
        assert_eq!(
            config.webhook_bind_address,
            BindAddress::Listen(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 9443))
        );
        assert_eq!(config.webhook_cert_path, None);
        assert_eq!(
            config.webhook_cert_validity,
            Duration::from_secs(365 * 24 * 3600)
        );
        let config = load(
            &flags(&[
                "--webhook-bind-address=127.0.0.1:0",
                "--webhook-cert-path=/certs",
                "--webhook-cert-validity=1m",
            ]),
            env(&[]),
            KNOWN,
        )
        .unwrap();
        assert_eq!(config.webhook_cert_path, Some(PathBuf::from("/certs")));
        assert_eq!(config.webhook_cert_validity, Duration::from_secs(60));
        let p = one_problem(load(
            &flags(&["--webhook-cert-path=/certs"]),
            env(&[("MANAGER_WEBHOOK_BIND_ADDRESS", "0")]),
            KNOWN,
        ));
        assert_eq!(
            (p.key.as_str(), p.origin.as_str()),
            ("webhook_cert_path", "flag --webhook-cert-path")
        );
        assert!(
            p.message.contains("env var MANAGER_WEBHOOK_BIND_ADDRESS"),
            "{p}"
        );
        let p = one_problem(load(
            &Flags::default(),
            env(&[("MANAGER_WEBHOOK_CERT_VALIDITY", "10s")]),
            KNOWN,
        ));
        assert_eq!(
            (p.key.as_str(), p.message.as_str()),
            (
                "webhook_cert_validity",
                "10s is shorter than the minimum of 30s"
            )
        );
    }

    #[test]
    fn keys_cover_every_field() {
        let mut serialized: Vec<String> = defaults().unwrap().into_keys().collect();
        // The optional keys with no default.
        serialized.push("leader_election_namespace".to_owned());
        serialized.push("metrics_cert_path".to_owned());
        serialized.push("webhook_cert_path".to_owned());
        serialized.sort();
        let mut keys: Vec<String> = KEYS.iter().map(|k| (*k).to_owned()).collect();
        keys.sort();
        assert_eq!(serialized, keys);
        let cli: Vec<&str> = Flags::default()
            .values()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert!(cli.is_empty());
    }

    #[test]
    fn file_then_env_then_flags() {
        let file = TempFile::new(
            "manager.yaml",
            "lease_duration: 20s\nrenew_deadline: 12s\nretry_period: 3s\nleader_election_id: from-file\nmax_concurrent_reconciles: 7\n",
        );
        let path = file.0.to_string_lossy().into_owned();
        let vars = env(&[
            ("MANAGER_RENEW_DEADLINE", "11s"),
            ("MANAGER_RETRY_PERIOD", "1s"),
            ("OTHER", "x"),
        ]);
        let config = load(
            &flags(&["--config", &path, "--retry-period=500ms", "--leader-elect"]),
            vars,
            KNOWN,
        )
        .unwrap();
        assert_eq!(
            config.lease_duration,
            Duration::from_secs(20),
            "file over default"
        );
        assert_eq!(
            config.renew_deadline,
            Duration::from_secs(11),
            "env over file"
        );
        assert_eq!(
            config.retry_period,
            Duration::from_millis(500),
            "flag over env"
        );
        assert_eq!(config.leader_election_id, "from-file");
        assert_eq!(config.max_concurrent_reconciles, 7);
        assert!(config.leader_elect);
    }

    #[test]
    fn toml_file_and_config_from_env() {
        let file = TempFile::new(
            "manager.toml",
            "metrics_bind_address = \"127.0.0.1:9090\"\ncontrollers = [\"memcached\"]\n",
        );
        let vars = env(&[("MANAGER_CONFIG", &file.0.to_string_lossy())]);
        let config = load(&Flags::default(), vars, KNOWN).unwrap();
        assert_eq!(config.metrics_bind_address.to_string(), "127.0.0.1:9090");
        assert_eq!(config.controllers.resolve(KNOWN).unwrap(), ["memcached"]);
    }

    #[test]
    fn a_repeated_flag_takes_its_last_value() {
        let config = load(
            &flags(&["--retry-period=1s", "--retry-period=3s"]),
            env(&[]),
            KNOWN,
        )
        .unwrap();
        assert_eq!(config.retry_period, Duration::from_secs(3));
    }

    #[test]
    fn leader_elect_flag_forms() {
        assert!(
            load(&flags(&["--leader-elect"]), env(&[]), KNOWN)
                .unwrap()
                .leader_elect
        );
        let vars = env(&[("MANAGER_LEADER_ELECT", "true")]);
        assert!(
            !load(&flags(&["--leader-elect=false"]), vars, KNOWN)
                .unwrap()
                .leader_elect
        );
    }

    #[test]
    fn addresses() {
        let parse = |s: &str| s.parse::<BindAddress>();
        assert_eq!(parse("0"), Ok(BindAddress::Disabled));
        assert_eq!(parse(":8080").unwrap().to_string(), "0.0.0.0:8080");
        assert_eq!(
            parse("127.0.0.1:1234").unwrap().to_string(),
            "127.0.0.1:1234"
        );
        assert_eq!(
            parse("localhost:1234").unwrap().to_string(),
            "127.0.0.1:1234"
        );
        assert_eq!(parse("[::1]:1234").unwrap().to_string(), "[::1]:1234");
        for bad in ["8080", "host:80", ":99999", "1.2.3.4", ""] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        let config = load(
            &flags(&["--metrics-bind-address", "0"]),
            env(&[("MANAGER_HEALTH_PROBE_BIND_ADDRESS", "0")]),
            KNOWN,
        )
        .unwrap();
        assert_eq!(config.metrics_bind_address, BindAddress::Disabled);
        assert_eq!(config.health_probe_bind_address, BindAddress::Disabled);
    }

    #[test]
    fn controller_selection() {
        let sel = |s: &[&str]| ControllerSelection(s.iter().map(|e| (*e).to_owned()).collect());
        assert_eq!(sel(&["*", "-myapp"]).resolve(KNOWN).unwrap(), ["memcached"]);
        assert_eq!(sel(&["myapp"]).resolve(KNOWN).unwrap(), ["myapp"]);
        assert_eq!(sel(&[]).resolve(KNOWN).unwrap(), Vec::<&str>::new());
        let err = sel(&["memcache"]).resolve(KNOWN).unwrap_err();
        assert!(
            err.contains("\"memcache\"") && err.contains("memcached, myapp"),
            "{err}"
        );
        let config = load(
            &flags(&["--controllers", " myapp, memcached"]),
            env(&[]),
            KNOWN,
        )
        .unwrap();
        assert_eq!(config.controllers.resolve(KNOWN).unwrap(), KNOWN);
    }

    #[test]
    fn namespaces_from_repeated_or_comma_separated_flags_env_and_file() {
        let names = |config: Config| config.namespace.0;
        let config = load(
            &flags(&["--namespace", "team-a", "--namespace=team-b, team-c"]),
            env(&[("MANAGER_NAMESPACE", "ignored")]),
            KNOWN,
        )
        .unwrap();
        assert_eq!(names(config), ["team-a", "team-b", "team-c"]);
        let config = load(
            &Flags::default(),
            env(&[("MANAGER_NAMESPACE", "one")]),
            KNOWN,
        )
        .unwrap();
        assert_eq!(names(config), ["one"]);
        let file = TempFile::new("ns.yaml", "namespace: [a, b]\n");
        let path = file.0.to_string_lossy().into_owned();
        let config = load(&flags(&["--config", &path]), env(&[]), KNOWN).unwrap();
        assert_eq!(names(config), ["a", "b"]);
        let config = load(&Flags::default(), env(&[]), KNOWN).unwrap();
        assert!(names(config).is_empty(), "every namespace by default");
        // What OLM's `olm.targetNamespaces` annotation gives the bundle's Deployment: empty for
        // every namespace, else a comma-separated list.
        let config = load(&Flags::default(), env(&[("MANAGER_NAMESPACE", "")]), KNOWN).unwrap();
        assert!(names(config).is_empty(), "an empty list is every namespace");
        let config = load(
            &Flags::default(),
            env(&[("MANAGER_NAMESPACE", "a,b")]),
            KNOWN,
        )
        .unwrap();
        assert_eq!(names(config), ["a", "b"]);
    }

    #[test]
    fn a_bad_namespace_name_is_named_with_its_flag() {
        let p = one_problem(load(
            &flags(&["--namespace", "team-a,Team_B"]),
            env(&[]),
            KNOWN,
        ));
        assert_eq!(
            (p.key.as_str(), p.origin.as_str()),
            ("namespace", "flag --namespace")
        );
        assert!(
            p.message.contains("\"Team_B\" is not a namespace name"),
            "{p}"
        );
    }

    #[test]
    fn bad_address_names_key_and_flag() {
        let p = one_problem(load(
            &flags(&["--metrics-bind-address", "nope"]),
            env(&[]),
            KNOWN,
        ));
        assert_eq!(
            (p.key.as_str(), p.origin.as_str()),
            ("metrics_bind_address", "flag --metrics-bind-address")
        );
        assert!(p.message.contains("invalid address"), "{p}");
    }

    #[test]
    fn bad_duration_names_key_and_env_var() {
        let p = one_problem(load(
            &Flags::default(),
            env(&[("MANAGER_LEASE_DURATION", "15")]),
            KNOWN,
        ));
        assert_eq!(
            (p.key.as_str(), p.origin.as_str()),
            ("lease_duration", "env var MANAGER_LEASE_DURATION")
        );
        assert!(p.message.contains("missing unit"), "{p}");
    }

    #[test]
    fn renew_deadline_must_be_shorter_than_lease_duration() {
        let file = TempFile::new("m.yaml", "renew_deadline: 15s\n");
        let path = file.0.to_string_lossy().into_owned();
        let p = one_problem(load(&flags(&["--config", &path]), env(&[]), KNOWN));
        assert_eq!(p.key, "renew_deadline");
        assert_eq!(p.origin, format!("file {path}"));
        assert!(
            p.message
                .contains("shorter than lease_duration (15s from built-in default)"),
            "{p}"
        );
    }

    #[test]
    fn a_jittered_retry_must_fit_in_the_renew_deadline() {
        // 9s is shorter than the 10s deadline, but a retry 20% late would miss it.
        let p = one_problem(load(&flags(&["--retry-period", "9s"]), env(&[]), KNOWN));
        assert_eq!(
            (p.key.as_str(), p.origin.as_str()),
            ("retry_period", "flag --retry-period")
        );
        assert!(
            p.message.contains(
                "9s × 1.2 must be shorter than renew_deadline (10s from built-in default)"
            ),
            "{p}"
        );
        assert!(load(&flags(&["--retry-period", "8s"]), env(&[]), KNOWN).is_ok());
    }

    #[test]
    fn durations_have_upper_bounds() {
        // The largest Go duration: once added to the clock, it overflowed.
        let error = load(
            &flags(&[
                "--lease-duration",
                "2562047788015215h",
                "--renew-deadline",
                "2562047788015214h",
            ]),
            env(&[]),
            KNOWN,
        )
        .unwrap_err();
        let keys: Vec<&str> = error.problems.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(keys, ["lease_duration", "renew_deadline"], "{error}");
        let text = error.to_string();
        assert!(
            text.contains("is longer than the maximum of 3600s"),
            "{text}"
        );

        let p = one_problem(load(
            &Flags::default(),
            env(&[("MANAGER_SHUTDOWN_TIMEOUT", "25h")]),
            KNOWN,
        ));
        assert_eq!(
            (p.key.as_str(), p.origin.as_str()),
            ("shutdown_timeout", "env var MANAGER_SHUTDOWN_TIMEOUT")
        );
        assert!(p.message.contains("maximum of 86400s"), "{p}");
    }

    #[test]
    fn the_lease_must_be_nameable() {
        for (id, says) in [
            ("", "it is empty"),
            ("Leader", "lower-case"),
            ("a..b", "lower-case"),
            ("-a", "lower-case"),
        ] {
            let p = one_problem(load(
                &Flags::default(),
                env(&[("MANAGER_LEADER_ELECTION_ID", id)]),
                KNOWN,
            ));
            assert_eq!(p.key, "leader_election_id");
            assert!(p.message.contains(says), "{id:?}: {p}");
        }
        assert!(load(&flags(&["--leader-election-id", "a.b-c"]), env(&[]), KNOWN).is_ok());
        let p = one_problem(load(
            &flags(&["--leader-election-namespace", "Operator_System"]),
            env(&[]),
            KNOWN,
        ));
        assert_eq!(p.key, "leader_election_namespace");
    }

    #[test]
    fn unknown_controller_lists_known_ones() {
        let p = one_problem(load(
            &Flags::default(),
            env(&[("MANAGER_CONTROLLERS", "memcached,nope")]),
            KNOWN,
        ));
        assert_eq!(
            (p.key.as_str(), p.origin.as_str()),
            ("controllers", "env var MANAGER_CONTROLLERS")
        );
        assert!(
            p.message.contains("\"nope\"") && p.message.contains("memcached, myapp"),
            "{p}"
        );
    }

    #[test]
    fn unreadable_file() {
        let p = one_problem(load(
            &flags(&["--config", "/nonexistent/manager.yaml"]),
            env(&[]),
            KNOWN,
        ));
        assert_eq!(
            (p.key.as_str(), p.origin.as_str()),
            ("config", "flag --config")
        );
        assert!(
            p.message.contains("cannot read /nonexistent/manager.yaml"),
            "{p}"
        );
        let p = one_problem(load(
            &Flags::default(),
            env(&[("MANAGER_CONFIG", "/nonexistent/m.toml")]),
            KNOWN,
        ));
        assert_eq!(p.origin, "env var MANAGER_CONFIG");
    }

    #[test]
    fn invalid_file_contents() {
        // Broken YAML, and YAML that is not a mapping of keys.
        for text in ["lease_duration: [unclosed\n", "- lease_duration\n"] {
            let file = TempFile::new("m.yaml", text);
            let p = one_problem(load(
                &flags(&["--config", &file.0.to_string_lossy()]),
                env(&[]),
                KNOWN,
            ));
            assert!(
                p.origin.starts_with("file ") && p.message.starts_with("invalid YAML"),
                "{text:?}: {p}"
            );
        }
        let file = TempFile::new("m.json", "{}");
        let p = one_problem(load(
            &flags(&["--config", &file.0.to_string_lossy()]),
            env(&[]),
            KNOWN,
        ));
        assert!(p.message.contains("unknown file type"), "{p}");
    }

    #[test]
    fn an_empty_yaml_file_is_an_empty_configuration() {
        for text in ["", "\n", "# nothing set yet\n", "---\n"] {
            let file = TempFile::new("m.yaml", text);
            let config = load(
                &flags(&["--config", &file.0.to_string_lossy()]),
                env(&[]),
                KNOWN,
            )
            .unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert_eq!(config.lease_duration, Config::default().lease_duration);
        }
    }

    #[test]
    fn unknown_keys_in_file_and_env() {
        let file = TempFile::new("m.yaml", "lease_duraton: 20s\n");
        let path = file.0.to_string_lossy().into_owned();
        let p = one_problem(load(&flags(&["--config", &path]), env(&[]), KNOWN));
        assert_eq!(
            (p.key.as_str(), p.origin.clone()),
            ("lease_duraton", format!("file {path}"))
        );
        assert!(p.message.contains("unknown key"), "{p}");
        let p = one_problem(load(&Flags::default(), env(&[("MANAGER_FOO", "1")]), KNOWN));
        assert_eq!(
            (p.key.as_str(), p.origin.as_str()),
            ("foo", "env var MANAGER_FOO")
        );
    }

    #[test]
    fn wrong_types() {
        let p = one_problem(load(
            &flags(&["--max-concurrent-reconciles", "many"]),
            env(&[]),
            KNOWN,
        ));
        assert_eq!(
            (p.key.as_str(), p.origin.as_str()),
            (
                "max_concurrent_reconciles",
                "flag --max-concurrent-reconciles"
            )
        );
        let p = one_problem(load(
            &Flags::default(),
            env(&[("MANAGER_LOG_FORMAT", "xml")]),
            KNOWN,
        ));
        assert_eq!(
            (p.key.as_str(), p.origin.as_str()),
            ("log_format", "env var MANAGER_LOG_FORMAT")
        );
        let p = one_problem(load(&flags(&["--leader-elect=maybe"]), env(&[]), KNOWN));
        assert_eq!(
            (p.key.as_str(), p.origin.as_str()),
            ("leader_elect", "flag --leader-elect")
        );
        let p = one_problem(load(
            &flags(&["--max-concurrent-reconciles", "0"]),
            env(&[]),
            KNOWN,
        ));
        assert_eq!(p.key, "max_concurrent_reconciles");
    }

    #[test]
    fn numeric_lease_name_is_a_name() {
        let config = load(
            &Flags::default(),
            env(&[("MANAGER_LEADER_ELECTION_ID", "42")]),
            KNOWN,
        )
        .unwrap();
        assert_eq!(config.leader_election_id, "42");
    }
}
