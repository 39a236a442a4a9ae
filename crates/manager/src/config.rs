//! The manager's configuration: defaults < file < environment < flags.
//!
//! Every setting is declared once, in [`settings!`] below: its key, its type, its default and
//! what it does. From that one declaration come the [`Config`] field, its default, the
//! `MANAGER_*` environment variable, the flag with its `--help` line (default, variable and
//! allowed values), the shell completions and the man page, and the reference table in
//! `docs/configuration.md` (written by `cargo xtask manifests`, checked by a test).
//!
//! The file is named by `--config PATH` (or `MANAGER_CONFIG`) and read as YAML (`.yaml`, `.yml`)
//! or TOML (`.toml`) by its extension; its top level is a map of the keys.
//!
//! - Addresses are `[HOST]:PORT` as in controller-runtime: `:8080` listens on all IPv4
//!   interfaces (in-cluster), `127.0.0.1:8080` on loopback only, `[::]:8080` on all IPv6 (and,
//!   on a dual-stack host, IPv4) interfaces, `0` serves nothing.
//! - Durations are Go-style: `15s`, `500ms`, `1m30s`. The Lease stores whole seconds, so the
//!   lease duration is rounded up to a second. Leader election follows client-go's rules
//!   (`renew_deadline` < `lease_duration`, `retry_period` × 1.2 < `renew_deadline`), each of its
//!   durations at most an hour; `webhook_cert_validity` is at most ten years, the other
//!   durations at most a day.
//! - `leader_election_id` names the Lease, so it must be a DNS subdomain (with room for the
//!   `-shards` and `-duties` suffixes of a sharded group's Leases), and
//!   `leader_election_namespace` a namespace name.
//! - `metrics_secure` serves `/metrics` over HTTPS to scrapers whose bearer token the API
//!   server authenticates and allows `get` on `/metrics` (the generated `metrics-reader`
//!   ClusterRole); off by default for a local run, on in the generated Deployment (port 8443,
//!   as Kubebuilder). `metrics_cert_path` names a directory with the certificate and key,
//!   `metrics_cert_name` and `metrics_cert_key` their files (`tls.crt` and `tls.key`, as a
//!   mounted TLS Secret has them; read again when they change); without it the metrics are served with the webhook certificate
//!   the manager provisions (it carries the metrics Service's names), or, when no webhooks are
//!   served, a certificate self-signed at start.
//! - `webhook_bind_address` serves the admission webhooks the controllers declare, over HTTPS,
//!   on every replica (admission is not leader-gated), e.g. `:9443` (Kubebuilder's port);
//!   `/readyz` fails until it serves. By default the manager provisions its certificate: a CA
//!   and a serving certificate for the webhook Service, kept in a Secret in its namespace (the
//!   leader election namespace), the CA put into the webhook configurations, renewed with a
//!   third of `webhook_cert_validity` left (the CA lives four times as long). With
//!   `webhook_cert_path`, a directory with `webhook_cert_name` and `webhook_cert_key` (read
//!   again when they change), it serves those instead, and their CA is the configurations' business
//!   (cert-manager's CA injector, OLM).
//! - Logs: `log_format` (`--zap-encoder`), `log_level` (`--zap-log-level`) and
//!   `log_development` (`--zap-devel`) take the values of controller-runtime's zap flags, so a
//!   Kubebuilder scaffold's arguments work unchanged; `RUST_LOG`, when set, filters instead of
//!   `log_level`, per module. `log_keys: zap` names the JSON fields as zap does (`ts`, `level`,
//!   `logger`, `msg`) for log pipelines built for controller-runtime.
//! - `leader_elect` defaults to `false`, as in Kubebuilder's scaffold, so a developer running
//!   the manager against their own cluster does not need a Lease; the generated Deployment
//!   passes `--leader-elect`.
//! - `warm_standby` (with `leader_elect`): a replica that does not lead runs its controllers'
//!   watches and caches anyway and reconciles nothing, so when it wins the Lease it starts
//!   reconciling at once, the changes made while it stood by first, instead of listing
//!   everything then. It costs the standby the memory of the caches, which its limit must
//!   allow for when it leads anyway, and the API server one more watch per resource type, so
//!   it is on by default; `false` starts the controllers only once the Lease is won.
//! - `sharding` runs every replica's controllers at once, each reconciling the objects of its
//!   share of the uid hash space, handed over between replicas through Leases (see
//!   [`crate::sharding`]); `leader_elect` and `warm_standby` then do not apply. Off by default:
//!   one leader is what controller-runtime users expect, and what the server-side write
//!   fence (`deploy/leader-fence/`) checks.
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
//! - `wait_for_own_writes` holds a reconcile until the cache shows the controller's last write
//!   to that object or its children (usually milliseconds, at most 2 s), so that it never acts
//!   on what it has already changed: no write repeated, no conflict on a stale version. On by
//!   default; `false` is controller-runtime's behaviour, where a reconcile reads whatever the
//!   cache holds.
//! - `controllers` is a comma-separated list (or, in a file, a list): a name enables that
//!   controller, `-name` disables it, `*` means every controller. `*,-myapp` runs all but MyApp.
//! - `namespace` restricts every watch and cache to the namespaces named: a comma-separated
//!   list (or, in a file, a list), and the flag may be repeated. With it, the manager needs
//!   only Roles in those namespaces (`deploy/namespaced/`), not the ClusterRole. Empty means
//!   every namespace.
//!
//! Every source is read as text the same way: a file's `true`, `4` or list is read as the
//! flag `--key=true`, `--key=4` or `--key=a,b` would be, so a value means the same wherever it
//! is written. The environment is scanned here rather than by figment's `Env` provider, so
//! that tests hand it in without changing the process's own.
//!
//! # Errors
//! A flag with a bad value stops the command line's parsing with a message naming the flag. Any
//! other bad value stops start-up with a message that names the key and where its value came
//! from (`file /etc/manager.yaml`, `env var MANAGER_LEASE_DURATION`, `flag --lease-duration`).
//! The binary exits with status 2 either way.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use figment::value::{Dict, Map, Value as FigmentValue};
use figment::{Figment, Metadata, Profile, Provider};
use serde::{Deserialize, Serialize};

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

/// Declares every setting once: `key: Type = "default as text";` after its description (its
/// `--help` line), and `#[alias = "flag-name"]` for a second flag name (controller-runtime's
/// zap flags). Generates [`Config`], its [`Default`] and [`SETTINGS`].
macro_rules! settings {
    (@alias) => { None };
    (@alias $alias:literal) => { Some($alias) };
    ($(
        $(#[doc = $doc:literal])+
        $(#[alias = $alias:literal])?
        $key:ident: $type:ty = $default:expr;
    )+) => {
        /// The manager's effective configuration. See the module documentation and
        /// [`SETTINGS`] for every key.
        #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct Config {
            $(
                $(#[doc = $doc])+
                #[serde(with = "as_text")]
                pub $key: $type,
            )+
        }

        impl Default for Config {
            fn default() -> Self {
                Self {
                    $( $key: built_in::<$type>(stringify!($key), $default), )+
                }
            }
        }

        /// Every setting, in the order of [`Config`]'s fields.
        pub const SETTINGS: &[Setting] = &[
            $(
                Setting {
                    key: stringify!($key),
                    alias: settings!(@alias $($alias)?),
                    description: concat!($($doc, "\n"),+),
                    default: $default,
                    value_name: <$type as SettingValue>::VALUE_NAME,
                    allowed: <$type as SettingValue>::ALLOWED,
                    switch: <$type as SettingValue>::SWITCH,
                    repeatable: <$type as SettingValue>::REPEATABLE,
                    check: check_text::<$type>,
                },
            )+
        ];
    };
}

settings! {
    /// Address of the metrics endpoint, e.g. `:8080` or `127.0.0.1:8080`; `0` disables it.
    metrics_bind_address: BindAddress = ":8080";
    /// Serve `/metrics` over HTTPS to authorized scrapers only.
    metrics_secure: bool = "false";
    /// Directory holding the certificate and key for secure metrics; without it, the
    /// provisioned webhook certificate (self-signed when no webhooks are served).
    metrics_cert_path: Option<PathBuf> = "";
    /// File name of the metrics certificate (PEM, leaf first) in `metrics_cert_path`.
    metrics_cert_name: String = "tls.crt";
    /// File name of the metrics certificate's private key (PEM) in `metrics_cert_path`.
    metrics_cert_key: String = "tls.key";
    /// Address of the health probe endpoints `/healthz` and `/readyz`; `0` disables them.
    health_probe_bind_address: BindAddress = ":8081";
    /// Address of the admission webhook server (HTTPS), e.g. `:9443`; `0` disables it.
    webhook_bind_address: BindAddress = ":9443";
    /// Directory holding the webhooks' certificate and key; provisioned without it.
    webhook_cert_path: Option<PathBuf> = "";
    /// File name of the webhook certificate (PEM, leaf first) in `webhook_cert_path`.
    webhook_cert_name: String = "tls.crt";
    /// File name of the webhook certificate's private key (PEM) in `webhook_cert_path`.
    webhook_cert_key: String = "tls.key";
    /// Validity of a provisioned webhook serving certificate (its CA: four times as long).
    webhook_cert_validity: Duration = "8760h";
    /// Run the controllers only while holding the leader-election Lease.
    leader_elect: bool = "false";
    /// While standing by, keep the controllers' caches current so a takeover reconciles at
    /// once.
    warm_standby: bool = "true";
    /// Split the objects between every replica, each reconciling its share, instead of one
    /// leader reconciling all; the leader Lease's name starts the names of its Leases.
    sharding: bool = "false";
    /// Name of the leader-election Lease.
    leader_election_id: String = concat!(product::name!(), "-leader");
    /// Namespace of the leader-election Lease; without it `$POD_NAMESPACE`, else the client's
    /// default namespace.
    leader_election_namespace: Option<String> = "";
    /// How long a standby waits after the last renewal it saw before taking over.
    lease_duration: Duration = "15s";
    /// How long the leader retries renewing before it gives up leadership.
    renew_deadline: Duration = "10s";
    /// Interval between acquire and renew attempts.
    retry_period: Duration = "2s";
    /// Log format: `json`, `text` (or zap's `console`), or `auto` (JSON unless stdout is a
    /// terminal).
    #[alias = "zap-encoder"]
    log_format: LogFormat = "auto";
    /// Log level: `debug`, `info`, `error` (or zap's `panic`), or a number of verbosity
    /// levels (`1` is `debug`, more is `trace`); `RUST_LOG`, when set, filters instead.
    #[alias = "zap-log-level"]
    log_level: LogLevel = "info";
    /// Development logging: text lines at `debug` level, where `log_format` and `log_level`
    /// are not set.
    #[alias = "zap-devel"]
    log_development: bool = "false";
    /// Key names of JSON log lines: `tracing` (timestamp, level, target, message) or `zap` (ts,
    /// level, logger, msg, as controller-runtime's zap logger writes them).
    log_keys: LogKeys = "tracing";
    /// Controllers to run: comma-separated names, `-name` to leave one out, `*` for all.
    controllers: ControllerSelection = "*";
    /// Maximum concurrent reconciles per controller.
    max_concurrent_reconciles: u16 = "4";
    /// Time controllers get to finish in-flight reconciles at shutdown.
    shutdown_timeout: Duration = "30s";
    /// How long the triggers that follow a reconcile must pause before the next; `0s`
    /// reconciles every trigger at once.
    reconcile_debounce: Duration = "250ms";
    /// Cancel and retry a reconcile that runs longer than this; `0s` for no limit.
    reconcile_timeout: Duration = "0s";
    /// Hold a reconcile (up to 2 s) until the cache shows the controller's own last write to
    /// its object or children; `false` reconciles from the cache as it is.
    wait_for_own_writes: bool = "true";
    /// Watch only these namespaces (comma-separated, or the flag repeated); empty for every
    /// namespace.
    namespace: NamespaceList = "";
}

/// One setting as declared: what its flag, its `--help` line and the reference table show.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    /// The key, as a file spells it.
    pub key: &'static str,
    /// A second name of its flag, without the dashes.
    pub alias: Option<&'static str>,
    /// What it does, as declared (one line or several).
    pub description: &'static str,
    /// Its default, written as a flag's value would be.
    pub default: &'static str,
    /// The placeholder for its value in `--help`.
    pub value_name: &'static str,
    /// The values it allows; empty when any value its type reads is allowed.
    pub allowed: &'static [&'static str],
    /// Whether its flag may be given without a value (`--leader-elect` is `=true`).
    pub switch: bool,
    /// Whether its flag may be repeated, the values joined with commas.
    pub repeatable: bool,
    /// Reads a value as its type would, for the flag's parser.
    check: fn(&str) -> Result<(), String>,
}

impl Setting {
    /// Its environment variable, e.g. `MANAGER_LEASE_DURATION`.
    pub fn env_var(&self) -> String {
        format!("{ENV_PREFIX}{}", self.key.to_ascii_uppercase())
    }

    /// Its flag without the dashes, e.g. `lease-duration`.
    pub fn flag(&self) -> String {
        self.key.replace('_', "-")
    }

    /// Its description on one line, for `--help` and the reference.
    pub fn summary(&self) -> String {
        self.description
            .lines()
            .map(str::trim)
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Every key of [`Config`], in the order of its fields.
pub fn keys() -> impl Iterator<Item = &'static str> {
    SETTINGS.iter().map(|s| s.key)
}

/// A setting's type: how its value is read from text, written back, and shown in `--help`.
///
/// Every source reads through [`SettingValue::parse`]: a flag's and a variable's text as
/// given, a file's scalars and lists as the text a flag would carry.
pub trait SettingValue: Sized {
    /// The placeholder for the value in `--help`.
    const VALUE_NAME: &'static str;
    /// The values allowed; empty when `parse` decides.
    const ALLOWED: &'static [&'static str] = &[];
    /// Whether the flag may be given alone, meaning `true`.
    const SWITCH: bool = false;
    /// Whether the flag may be repeated, its values joined with commas.
    const REPEATABLE: bool = false;

    /// Reads the value from text.
    ///
    /// # Errors
    /// A message saying what is wrong with `text`.
    fn parse(text: &str) -> Result<Self, String>;

    /// Writes the value as [`SettingValue::parse`] reads it back.
    fn to_text(&self) -> String;
}

/// Whether `text` reads as a `T`, for a flag's parser.
fn check_text<T: SettingValue>(text: &str) -> Result<(), String> {
    T::parse(text).map(drop)
}

/// A built-in default, read as any other value is.
fn built_in<T: SettingValue>(key: &str, text: &str) -> T {
    T::parse(text).unwrap_or_else(|e| panic!("the built-in default of {key} ({text:?}): {e}"))
}

/// `#[serde(with = "as_text")]`: every setting is written as its text and read from text, a
/// file's number, boolean or list first turned into the text a flag would carry.
mod as_text {
    use serde::{Deserialize, Deserializer, Serializer, de};

    use super::SettingValue;

    pub fn serialize<T: SettingValue, S: Serializer>(
        value: &T,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&value.to_text())
    }

    pub fn deserialize<'de, T: SettingValue, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<T, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Bool(bool),
            Unsigned(u64),
            Signed(i64),
            Float(f64),
            List(Vec<Raw>),
        }
        fn text(raw: Raw) -> Result<String, String> {
            Ok(match raw {
                Raw::Text(text) => text,
                Raw::Bool(value) => value.to_string(),
                Raw::Unsigned(value) => value.to_string(),
                Raw::Signed(value) => value.to_string(),
                Raw::Float(value) => value.to_string(),
                Raw::List(items) => items
                    .into_iter()
                    .map(|item| match item {
                        Raw::List(_) => Err("expected a list of values, not of lists".to_owned()),
                        scalar => text(scalar),
                    })
                    .collect::<Result<Vec<_>, _>>()?
                    .join(","),
            })
        }
        let raw = Raw::deserialize(deserializer)
            .map_err(|_| de::Error::custom(format!("expected {}", T::VALUE_NAME)))?;
        let text = text(raw).map_err(de::Error::custom)?;
        T::parse(&text).map_err(de::Error::custom)
    }
}

impl SettingValue for bool {
    const VALUE_NAME: &'static str = "BOOL";
    const ALLOWED: &'static [&'static str] = &["true", "false"];
    const SWITCH: bool = true;

    fn parse(text: &str) -> Result<Self, String> {
        match text.trim() {
            "true" => Ok(true),
            "false" => Ok(false),
            other => Err(format!("expected `true` or `false`, not {other:?}")),
        }
    }

    fn to_text(&self) -> String {
        self.to_string()
    }
}

impl SettingValue for u16 {
    const VALUE_NAME: &'static str = "N";

    fn parse(text: &str) -> Result<Self, String> {
        text.trim().parse().map_err(|_| {
            format!(
                "expected a whole number from 0 to {}, not {text:?}",
                u16::MAX
            )
        })
    }

    fn to_text(&self) -> String {
        self.to_string()
    }
}

impl SettingValue for Duration {
    const VALUE_NAME: &'static str = "DURATION";

    fn parse(text: &str) -> Result<Self, String> {
        duration::parse(text.trim()).map_err(|e| e.to_string())
    }

    fn to_text(&self) -> String {
        duration::Display(*self).to_string()
    }
}

impl SettingValue for String {
    const VALUE_NAME: &'static str = "NAME";

    fn parse(text: &str) -> Result<Self, String> {
        Ok(text.to_owned())
    }

    fn to_text(&self) -> String {
        self.clone()
    }
}

impl SettingValue for PathBuf {
    const VALUE_NAME: &'static str = "DIR";

    fn parse(text: &str) -> Result<Self, String> {
        Ok(PathBuf::from(text))
    }

    fn to_text(&self) -> String {
        self.display().to_string()
    }
}

/// Optional: empty text is none.
impl<T: SettingValue> SettingValue for Option<T> {
    const VALUE_NAME: &'static str = T::VALUE_NAME;

    fn parse(text: &str) -> Result<Self, String> {
        if text.trim().is_empty() {
            Ok(None)
        } else {
            T::parse(text).map(Some)
        }
    }

    fn to_text(&self) -> String {
        self.as_ref().map(T::to_text).unwrap_or_default()
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

/// The command line: `--config` and one flag per setting. Every setting's flag is optional: an
/// absent flag leaves the value from the environment, the file or the default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Flags {
    /// The configuration file (`--config`).
    pub config: Option<PathBuf>,
    /// The settings given on the command line, as given: a repeated flag's values joined
    /// with commas when it may be repeated, else its last value (as with Go's flag package).
    given: Vec<(&'static str, String)>,
}

impl Flags {
    /// The command line's definition: what `--help`, the completions and the man page show.
    pub fn command() -> clap::Command {
        let config = clap::Arg::new("config")
            .long("config")
            .value_name("PATH")
            .value_parser(clap::value_parser!(PathBuf))
            .help(format!(
                "Configuration file, YAML (.yaml, .yml) or TOML (.toml) [env: {CONFIG_ENV}]"
            ));
        let settings = SETTINGS.iter().map(|setting| {
            let check = setting.check;
            let mut arg = clap::Arg::new(setting.key)
                .long(setting.flag())
                .value_name(setting.value_name)
                .help(Self::help_line(setting))
                .value_parser(move |text: &str| check(text).map(|()| text.to_owned()));
            if setting.switch {
                arg = arg
                    .num_args(0..=1)
                    .require_equals(true)
                    .default_missing_value("true");
            }
            if setting.repeatable {
                arg = arg.action(clap::ArgAction::Append);
            }
            if let Some(alias) = setting.alias {
                arg = arg.visible_alias(alias);
            }
            arg
        });
        clap::Command::new("manager")
            .version(VERSION)
            .about("Runs the platform's controllers behind leader election.")
            // As with Go's flag package, a repeated flag takes its last value.
            .args_override_self(true)
            .arg(config)
            .args(settings)
    }

    /// A setting's `--help` line: what it does, its default, its variable and its values.
    fn help_line(setting: &Setting) -> String {
        let default = if setting.default.is_empty() {
            "none".to_owned()
        } else {
            setting.default.to_owned()
        };
        let allowed = if setting.allowed.is_empty() {
            String::new()
        } else {
            format!(" [possible values: {}]", setting.allowed.join(", "))
        };
        format!(
            "{} [default: {default}] [env: {}]{allowed}",
            setting.summary(),
            setting.env_var()
        )
    }

    /// Reads the process's command line; prints the error and exits 2 (0 for `--help` and
    /// `--version`) when it cannot.
    pub fn parse() -> Self {
        Self::from_matches(&Self::command().get_matches())
    }

    /// Reads `args`, the first being the program's name.
    ///
    /// # Errors
    /// clap's, naming the flag and what is wrong with its value.
    pub fn try_parse_from<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        Self::command()
            .try_get_matches_from(args)
            .map(|matches| Self::from_matches(&matches))
    }

    fn from_matches(matches: &clap::ArgMatches) -> Self {
        let given = SETTINGS
            .iter()
            .filter_map(|setting| {
                let values: Vec<&String> = matches.get_many::<String>(setting.key)?.collect();
                let value = if setting.repeatable {
                    values
                        .iter()
                        .map(|v| v.as_str())
                        .collect::<Vec<_>>()
                        .join(",")
                } else {
                    (*values.last()?).clone()
                };
                Some((setting.key, value))
            })
            .collect();
        Self {
            config: matches.get_one::<PathBuf>("config").cloned(),
            given,
        }
    }

    /// The settings given, as keys and values.
    fn values(&self) -> &[(&'static str, String)] {
        &self.given
    }
}

/// The reference table of every setting, as `docs/configuration.md` holds it.
pub fn reference() -> String {
    use std::fmt::Write as _;
    let mut out = String::from(
        "# Configuration\n\n\
         The manager reads its settings from its defaults, then an optional file (`--config \
         manager.yaml` or `.toml`, or `MANAGER_CONFIG`), then `MANAGER_*` environment \
         variables, then flags; each later source overrides the earlier. A file's top level is \
         a map of the keys below. `manager --help` shows the same.\n\n\
         | key (file) | environment | flag | default | |\n|---|---|---|---|---|\n",
    );
    for setting in SETTINGS {
        let mut flag = if setting.switch {
            format!("`--{}[=BOOL]`", setting.flag())
        } else if setting.repeatable {
            format!("`--{}` (repeatable)", setting.flag())
        } else {
            format!("`--{}`", setting.flag())
        };
        if let Some(alias) = setting.alias {
            let _ = write!(flag, " or `--{alias}`");
        }
        let default = if setting.default.is_empty() {
            "none".to_owned()
        } else {
            format!("`{}`", setting.default)
        };
        let _ = writeln!(
            out,
            "| `{}` | `{}` | {flag} | {default} | {} |",
            setting.key,
            setting.env_var(),
            setting.summary().replace('|', "\\|")
        );
    }
    out
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

impl SettingValue for BindAddress {
    const VALUE_NAME: &'static str = "ADDR";

    fn parse(text: &str) -> Result<Self, String> {
        text.parse()
    }

    fn to_text(&self) -> String {
        self.to_string()
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// One JSON object per line.
    Json,
    /// Human-readable lines.
    Text,
    /// JSON unless stdout is a terminal.
    Auto,
}

impl SettingValue for LogFormat {
    const VALUE_NAME: &'static str = "FORMAT";
    const ALLOWED: &'static [&'static str] = &["json", "text", "console", "auto"];

    fn parse(text: &str) -> Result<Self, String> {
        match text.trim() {
            "json" => Ok(Self::Json),
            "text" | "console" => Ok(Self::Text),
            "auto" => Ok(Self::Auto),
            other => Err(format!(
                "unknown log format {other:?}; expected one of: {}",
                Self::ALLOWED.join(", ")
            )),
        }
    }

    fn to_text(&self) -> String {
        match self {
            Self::Json => "json",
            Self::Text => "text",
            Self::Auto => "auto",
        }
        .to_owned()
    }
}

/// The most detailed level logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    /// Errors only.
    Error,
    /// What an operator of the platform wants to see.
    Info,
    /// What a developer of a controller wants to see.
    Debug,
    /// Everything.
    Trace,
}

impl LogLevel {
    /// The level as a `RUST_LOG` directive.
    pub fn directive(self) -> &'static str {
        match self {
            Self::Error => "error",
            Self::Info => "info",
            Self::Debug => "debug",
            Self::Trace => "trace",
        }
    }
}

impl SettingValue for LogLevel {
    const VALUE_NAME: &'static str = "LEVEL";

    fn parse(text: &str) -> Result<Self, String> {
        match text.trim() {
            "error" | "panic" => Ok(Self::Error),
            "info" => Ok(Self::Info),
            "debug" | "1" => Ok(Self::Debug),
            "trace" => Ok(Self::Trace),
            // zap's custom levels: each number more verbose than the one before.
            other => match other.parse::<u32>() {
                Ok(n) if n > 1 => Ok(Self::Trace),
                _ => Err(format!(
                    "unknown log level {other:?}; expected `debug`, `info`, `error`, `panic`, \
                     `trace` or a number of verbosity levels above 0"
                )),
            },
        }
    }

    fn to_text(&self) -> String {
        self.directive().to_owned()
    }
}

/// The key names of JSON log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogKeys {
    /// `timestamp`, `level`, `target`, `message`.
    Tracing,
    /// `ts` (seconds since the epoch), `level` (lower case), `logger`, `msg`: what log
    /// pipelines built for controller-runtime's zap logger read.
    Zap,
}

impl SettingValue for LogKeys {
    const VALUE_NAME: &'static str = "KEYS";
    const ALLOWED: &'static [&'static str] = &["tracing", "zap"];

    fn parse(text: &str) -> Result<Self, String> {
        match text.trim() {
            "tracing" => Ok(Self::Tracing),
            "zap" => Ok(Self::Zap),
            other => Err(format!(
                "unknown log keys {other:?}; expected one of: {}",
                Self::ALLOWED.join(", ")
            )),
        }
    }

    fn to_text(&self) -> String {
        match self {
            Self::Tracing => "tracing",
            Self::Zap => "zap",
        }
        .to_owned()
    }
}

/// Which controllers run: names, `-name` exclusions and `*` for all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerSelection(pub Vec<String>);

impl SettingValue for ControllerSelection {
    const VALUE_NAME: &'static str = "LIST";

    fn parse(text: &str) -> Result<Self, String> {
        Ok(Self(list_of_names(text)))
    }

    fn to_text(&self) -> String {
        self.0.join(",")
    }
}

/// The entries of a comma-separated list, trimmed, without empty ones.
fn list_of_names(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(str::to_owned)
        .collect()
}

impl ControllerSelection {
    /// The enabled controllers among `known`, in `known`'s order.
    ///
    /// # Errors
    /// A message naming the first unknown controller and listing the known ones.
    pub fn resolve<'a>(&self, known: &[&'a str]) -> Result<Vec<&'a str>, String> {
        self.resolve_among(known, controllers::NOT_BUILT)
    }

    /// [`Self::resolve`], where `not_built` are controllers of the workspace this build left
    /// out: naming one says so, instead of calling it unknown.
    fn resolve_among<'a>(
        &self,
        known: &[&'a str],
        not_built: &[&str],
    ) -> Result<Vec<&'a str>, String> {
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
                if not_built.contains(&name) {
                    return Err(format!(
                        "controller {name:?} is not in this build (it was built without the \
                         cargo feature {name:?}); built-in controllers: {}",
                        known.join(", ")
                    ));
                }
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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespaceList(pub Vec<String>);

impl SettingValue for NamespaceList {
    const VALUE_NAME: &'static str = "LIST";
    const REPEATABLE: bool = true;

    fn parse(text: &str) -> Result<Self, String> {
        let names = list_of_names(text);
        if let Some(bad) = names.iter().find(|n| !is_dns_label(n)) {
            return Err(format!(
                "{bad:?} is not a namespace name: lower-case letters, digits and '-', \
                 starting and ending with a letter or digit, at most 63 characters"
            ));
        }
        Ok(Self(names))
    }

    fn to_text(&self) -> String {
        self.0.join(",")
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
        env_dict.insert(key.to_ascii_lowercase(), FigmentValue::from(value.clone()));
    }
    layers.push(LayerProvider {
        layer: Layer::Env,
        path: None,
        dict: env_dict,
    });

    let flag_dict = flags
        .values()
        .iter()
        .map(|(key, value)| ((*key).to_owned(), FigmentValue::from(value.clone())))
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
            if !keys().any(|known| known == key) {
                let origin = match &layer.path {
                    Some(path) => format!("file {}", path.display()),
                    None => format!("{} {}", layer.layer.name(), layer.layer.spell(key)),
                };
                problems.push(Problem {
                    key: key.clone(),
                    origin,
                    message: format!(
                        "unknown key; known keys: {}",
                        keys().collect::<Vec<_>>().join(", ")
                    ),
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
    Ok(development_logging(config, &figment))
}

/// With `log_development`, the log format and level nobody set become text and `debug`, as
/// zap's development mode has them.
fn development_logging(mut config: Config, figment: &Figment) -> Config {
    let unset = |key: &str| {
        figment
            .find_metadata(key)
            .is_none_or(|metadata| metadata.name == Layer::DEFAULT_NAME)
    };
    if config.log_development {
        if unset("log_format") {
            config.log_format = LogFormat::Text;
        }
        if unset("log_level") {
            config.log_level = LogLevel::Debug;
        }
    }
    config
}

/// A certificate or key file's name: relative to its directory, and inside it.
fn check_file_name(name: &str) -> Result<(), String> {
    let path = Path::new(name);
    if name.trim().is_empty() {
        return Err("is empty: name the file in the certificate directory".to_owned());
    }
    if path.is_absolute()
        || path
            .components()
            .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return Err(format!(
            "{name:?} is not a file name inside the certificate directory (no leading '/',              no '..')"
        ));
    }
    Ok(())
}

fn defaults() -> Result<Dict, ConfigError> {
    FigmentValue::serialize(Config::default())
        .ok()
        .and_then(FigmentValue::into_dict)
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
    } else if config.sharding {
        // A sharded group's Leases are named after it with a suffix; member Leases are cut to
        // fit, these two must fit whole.
        let longest = [
            crate::sharding::holders_lease_name(&config.leader_election_id),
            crate::duties::lease_name(&config.leader_election_id),
        ]
        .into_iter()
        .max_by_key(String::len)
        .unwrap_or_default();
        if let Err(reason) = dns_subdomain(&longest) {
            problem(
                "leader_election_id",
                format!(
                    "{:?} cannot name the sharded group's Lease {longest:?}: {reason}",
                    config.leader_election_id
                ),
            );
        }
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
    for (path_key, path, names) in [
        (
            "metrics_cert_path",
            &config.metrics_cert_path,
            [
                ("metrics_cert_name", &config.metrics_cert_name),
                ("metrics_cert_key", &config.metrics_cert_key),
            ],
        ),
        (
            "webhook_cert_path",
            &config.webhook_cert_path,
            [
                ("webhook_cert_name", &config.webhook_cert_name),
                ("webhook_cert_key", &config.webhook_cert_key),
            ],
        ),
    ] {
        for (key, name) in names {
            if let Err(why) = check_file_name(name) {
                problem(key, why);
            } else if path.is_none() && from(key) != Layer::DEFAULT_NAME {
                problem(
                    key,
                    format!("is set, but {path_key} is not: the file would not be read"),
                );
            }
        }
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

    /// The message of a command line refused for a bad value.
    fn refused(args: &[&str]) -> String {
        let error = Flags::try_parse_from(std::iter::once("manager").chain(args.iter().copied()))
            .expect_err("refused");
        assert_eq!(
            error.kind(),
            clap::error::ErrorKind::ValueValidation,
            "{error}"
        );
        error.to_string()
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
        let message = refused(&["--reconcile-debounce=soon"]);
        assert!(
            message.contains("--reconcile-debounce") && message.contains("invalid duration"),
            "{message}"
        );
    }

    #[test]
    fn the_wait_for_own_writes_is_on_unless_turned_off() {
        let config = load(&Flags::default(), env(&[]), KNOWN).unwrap();
        assert!(config.wait_for_own_writes);
        let config = load(&flags(&["--wait-for-own-writes=false"]), env(&[]), KNOWN).unwrap();
        assert!(!config.wait_for_own_writes);
        let message = refused(&["--wait-for-own-writes=sometimes"]);
        assert!(message.contains("--wait-for-own-writes"), "{message}");
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
        let message = refused(&["--reconcile-timeout=forever"]);
        assert!(message.contains("--reconcile-timeout"), "{message}");
    }

    #[test]
    fn certificate_file_names_default_to_a_tls_secret_and_need_their_directory() {
        let config = load(
            &flags(&[
                "--metrics-secure",
                "--metrics-cert-path=/certs",
                "--metrics-cert-name=serving.pem",
                "--metrics-cert-key=keys/serving.key",
            ]),
            env(&[]),
            KNOWN,
        )
        .unwrap();
        assert_eq!(
            (
                config.metrics_cert_name.as_str(),
                config.metrics_cert_key.as_str()
            ),
            ("serving.pem", "keys/serving.key")
        );
        assert_eq!(
            (
                config.webhook_cert_name.as_str(),
                config.webhook_cert_key.as_str()
            ),
            ("tls.crt", "tls.key")
        );
        let p = one_problem(load(
            &Flags::default(),
            env(&[("MANAGER_WEBHOOK_CERT_KEY", "other.key")]),
            KNOWN,
        ));
        assert_eq!(
            (p.key.as_str(), p.origin.as_str()),
            ("webhook_cert_key", "env var MANAGER_WEBHOOK_CERT_KEY")
        );
        assert!(
            p.message.contains("webhook_cert_path is not"),
            "{}",
            p.message
        );
        for bad in ["", "/etc/tls.crt", "../tls.crt"] {
            let p = one_problem(load(
                &flags(&[
                    "--webhook-cert-path=/certs",
                    &format!("--webhook-cert-name={bad}"),
                ]),
                env(&[]),
                KNOWN,
            ));
            assert_eq!(p.key, "webhook_cert_name", "{bad:?}");
        }
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
    fn every_setting_has_one_field_a_flag_a_variable_and_a_default() {
        let serialized: Vec<String> = defaults().unwrap().into_keys().collect();
        let mut declared: Vec<&str> = keys().collect();
        declared.sort_unstable();
        assert_eq!(serialized, declared);
        assert!(Flags::default().values().is_empty());
        let command = Flags::command();
        for setting in SETTINGS {
            let arg = command
                .get_arguments()
                .find(|a| a.get_id() == setting.key)
                .unwrap_or_else(|| panic!("no flag for {}", setting.key));
            assert_eq!(arg.get_long(), Some(setting.flag().as_str()));
            // Every default reads back as itself.
            assert!((setting.check)(setting.default).is_ok(), "{}", setting.key);
        }
        assert_eq!(
            Config::default()
                .webhook_bind_address
                .socket_addr()
                .map(|a| a.port()),
            Some(kube_operator_runtime::webhook::PORT)
        );
        assert_eq!(
            Config::default().reconcile_debounce,
            kube_operator_runtime::RunOptions::DEFAULT_DEBOUNCE
        );
    }

    #[test]
    fn help_shows_each_default_variable_and_allowed_value() {
        let help = Flags::command().render_long_help().to_string();
        for needle in [
            "--lease-duration <DURATION>",
            "[default: 15s] [env: MANAGER_LEASE_DURATION]",
            "[default: :8080] [env: MANAGER_METRICS_BIND_ADDRESS]",
            "[default: none] [env: MANAGER_WEBHOOK_CERT_PATH]",
            "[env: MANAGER_LOG_FORMAT] [possible values: json, text, console, auto]",
            "--log-level <LEVEL>",
            "[alias: --zap-log-level]",
            "--leader-elect[=<BOOL>]",
            "[env: MANAGER_CONFIG]",
        ] {
            assert!(help.contains(needle), "{needle:?} missing from:\n{help}");
        }
    }

    #[test]
    fn the_configuration_reference_is_current() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration.md");
        let written = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            written == reference(),
            "{} is not current: run `cargo xtask manifests`",
            path.display()
        );
        for setting in SETTINGS {
            assert!(written.contains(&setting.env_var()), "{}", setting.key);
        }
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
    fn a_bad_namespace_name_is_named_with_its_flag_or_variable() {
        let message = refused(&["--namespace", "team-a,Team_B"]);
        assert!(
            message.contains("--namespace")
                && message.contains("\"Team_B\" is not a namespace name"),
            "{message}"
        );
        let p = one_problem(load(
            &Flags::default(),
            env(&[("MANAGER_NAMESPACE", "Team_B")]),
            KNOWN,
        ));
        assert_eq!(
            (p.key.as_str(), p.origin.as_str()),
            ("namespace", "env var MANAGER_NAMESPACE")
        );
    }

    #[test]
    fn bad_address_names_its_flag_or_variable() {
        let message = refused(&["--metrics-bind-address", "nope"]);
        assert!(
            message.contains("--metrics-bind-address") && message.contains("invalid address"),
            "{message}"
        );
        let p = one_problem(load(
            &Flags::default(),
            env(&[("MANAGER_METRICS_BIND_ADDRESS", "nope")]),
            KNOWN,
        ));
        assert_eq!(
            (p.key.as_str(), p.origin.as_str()),
            (
                "metrics_bind_address",
                "env var MANAGER_METRICS_BIND_ADDRESS"
            )
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
        // Room for the sharded group's suffixed Leases.
        let long = "a".repeat(250);
        assert!(load(&flags(&["--leader-election-id", &long]), env(&[]), KNOWN).is_ok());
        let p = one_problem(load(
            &flags(&["--leader-election-id", &long, "--sharding"]),
            env(&[]),
            KNOWN,
        ));
        assert_eq!(p.key, "leader_election_id");
        assert!(p.message.contains("longer than 253"), "{p}");
        let p = one_problem(load(
            &flags(&["--leader-election-namespace", "Operator_System"]),
            env(&[]),
            KNOWN,
        ));
        assert_eq!(p.key, "leader_election_namespace");
    }

    #[test]
    fn a_controller_left_out_of_the_build_is_named_as_such() {
        let selection = ControllerSelection(vec!["memcached".to_owned(), "tenant".to_owned()]);
        let message = selection
            .resolve_among(&["memcached", "myapp"], &["tenant"])
            .expect_err("tenant is not built");
        assert!(
            message.contains("\"tenant\" is not in this build")
                && message.contains("cargo feature \"tenant\"")
                && message.contains("built-in controllers: memcached, myapp"),
            "{message}"
        );
        assert_eq!(
            selection.resolve_among(&["memcached", "tenant"], &[]),
            Ok(vec!["memcached", "tenant"])
        );
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
        let message = refused(&["--max-concurrent-reconciles", "many"]);
        assert!(
            message.contains("--max-concurrent-reconciles") && message.contains("whole number"),
            "{message}"
        );
        let file = TempFile::new("m.yaml", "max_concurrent_reconciles: many\n");
        let path = file.0.to_string_lossy().into_owned();
        let p = one_problem(load(&flags(&["--config", &path]), env(&[]), KNOWN));
        assert_eq!(
            (p.key.as_str(), p.origin.clone()),
            ("max_concurrent_reconciles", format!("file {path}"))
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
        let message = refused(&["--leader-elect=maybe"]);
        assert!(message.contains("--leader-elect"), "{message}");
        let p = one_problem(load(
            &Flags::default(),
            env(&[("MANAGER_LEADER_ELECT", "maybe")]),
            KNOWN,
        ));
        assert_eq!(
            (p.key.as_str(), p.origin.as_str()),
            ("leader_elect", "env var MANAGER_LEADER_ELECT")
        );
        let p = one_problem(load(
            &flags(&["--max-concurrent-reconciles", "0"]),
            env(&[]),
            KNOWN,
        ));
        assert_eq!(p.key, "max_concurrent_reconciles");
    }

    #[test]
    fn zap_flags_set_the_log_settings() {
        let config = load(
            &flags(&["--zap-log-level=debug", "--zap-encoder=console"]),
            env(&[]),
            KNOWN,
        )
        .unwrap();
        assert_eq!(
            (config.log_level, config.log_format),
            (LogLevel::Debug, LogFormat::Text)
        );
        for (level, expected) in [
            ("error", LogLevel::Error),
            ("panic", LogLevel::Error),
            ("info", LogLevel::Info),
            ("1", LogLevel::Debug),
            ("3", LogLevel::Trace),
        ] {
            let config = load(
                &Flags::default(),
                env(&[("MANAGER_LOG_LEVEL", level)]),
                KNOWN,
            )
            .unwrap();
            assert_eq!(config.log_level, expected, "{level}");
        }
        for bad in ["0", "loud"] {
            let p = one_problem(load(
                &Flags::default(),
                env(&[("MANAGER_LOG_LEVEL", bad)]),
                KNOWN,
            ));
            assert_eq!(p.origin, "env var MANAGER_LOG_LEVEL");
        }
        assert!(refused(&["--zap-log-level=loud"]).contains("--log-level"));
        let config = load(&flags(&["--log-keys=zap"]), env(&[]), KNOWN).unwrap();
        assert_eq!(config.log_keys, LogKeys::Zap);
    }

    #[test]
    fn development_logging_fills_only_what_is_unset() {
        let config = load(&flags(&["--zap-devel"]), env(&[]), KNOWN).unwrap();
        assert_eq!(
            (config.log_level, config.log_format),
            (LogLevel::Debug, LogFormat::Text)
        );
        let config = load(
            &flags(&["--zap-devel", "--zap-log-level=info"]),
            env(&[("MANAGER_LOG_FORMAT", "json")]),
            KNOWN,
        )
        .unwrap();
        assert_eq!(
            (config.log_level, config.log_format),
            (LogLevel::Info, LogFormat::Json)
        );
        let config = load(&Flags::default(), env(&[]), KNOWN).unwrap();
        assert_eq!(
            (config.log_level, config.log_format),
            (LogLevel::Info, LogFormat::Auto)
        );
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
