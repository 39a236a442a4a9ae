//! A real Prometheus (built from source with the control plane) for tests: it discovers pods through the
//! local API server's Kubernetes service discovery, as it would in a user's cluster, and is
//! asked through its HTTP API.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use tokio::process::{Child, Command};

use crate::manager::{free_port, log_dir};
use crate::namespace::unique_name;
use crate::{
    Error, FIELD_MANAGER, Result, TestCluster, service_account_kubeconfig, service_account_token,
};

/// The ServiceAccount (and ClusterRole) Prometheus discovers pods as: read-only on pods,
/// what the Prometheus Operator's own RBAC grants for pod discovery.
const IDENTITY: &str = "e2e-prometheus";

/// A running Prometheus, killed (and its data removed) when dropped.
#[derive(Debug)]
pub struct Prometheus {
    child: Child,
    port: u16,
    dir: PathBuf,
    log: PathBuf,
    token: String,
}

/// One target as Prometheus's `/api/v1/targets` reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// The URL it scrapes.
    pub scrape_url: String,
    /// `up`, `down` or `unknown`.
    pub health: String,
    /// The last scrape's error, if any.
    pub last_error: String,
    /// The target's labels after relabelling.
    pub labels: serde_json::Value,
}

/// How Prometheus verifies the certificates of the targets it discovers: the CA bundle (PEM)
/// they are signed by, and the name they must carry.
#[derive(Clone, Debug)]
pub struct TargetTls {
    /// The trusted CAs, PEM.
    pub ca: String,
    /// The name each target's certificate must carry.
    pub server_name: String,
}

/// The file in Prometheus's directory holding its ServiceAccount's token.
const TOKEN_FILE: &str = "token";
/// The file in Prometheus's directory holding [`TargetTls::ca`].
const CA_FILE: &str = "ca.crt";

impl Prometheus {
    /// Starts Prometheus on a free loopback port, scraping every 2 s the pods of `namespace`
    /// that carry the `prometheus.io/scrape: "true"` annotation, at the port and path their
    /// `prometheus.io/port` and `prometheus.io/path` annotations name (the convention the
    /// generated manager Deployment follows), verifying their certificates as `tls` says (the
    /// generated ServiceMonitor's `tlsConfig`).
    ///
    /// # Errors
    /// [`Error::PrometheusMissing`] when it is not installed; API errors from creating its
    /// ServiceAccount; [`Error::Timeout`] when it does not become ready.
    pub async fn start(cluster: &TestCluster, namespace: &str, tls: &TargetTls) -> Result<Self> {
        let (identity, token) = identity(cluster).await?;
        let files = vec![(CA_FILE, tls.ca.clone())];
        Self::launch(cluster, token, files, |dir| {
            scrape_config(&identity.path, dir, namespace, &tls.server_name)
        })
        .await
    }

    /// Starts Prometheus on a free loopback port, scraping `https://<target>/metrics` every 2 s
    /// as the scrape job `job`, with its ServiceAccount's token (which holds the generated
    /// metrics-reader ClusterRole), and evaluating the alerting rules in `rules` (a Prometheus
    /// rule file) every 2 s.
    ///
    /// # Errors
    /// As [`Prometheus::start`].
    pub async fn start_static(
        cluster: &TestCluster,
        job: &str,
        target: &str,
        rules: &Path,
    ) -> Result<Self> {
        let (_, token) = identity(cluster).await?;
        Self::launch(cluster, token, Vec::new(), |dir| {
            static_config(job, target, &dir.join(TOKEN_FILE), rules)
        })
        .await
    }

    /// Runs Prometheus with the configuration `config` writes, given the directory holding
    /// [`TOKEN_FILE`] (with `token`) and `files` (name and contents).
    async fn launch(
        cluster: &TestCluster,
        token: String,
        files: Vec<(&str, String)>,
        config: impl FnOnce(&Path) -> String,
    ) -> Result<Self> {
        let binary = cluster.state.bin_dir.join("prometheus");
        if !binary.is_file() {
            return Err(Error::PrometheusMissing { path: binary });
        }
        let dir = std::env::temp_dir().join(unique_name("e2e-prometheus"));
        std::fs::create_dir_all(&dir).map_err(Error::io("creating", &dir))?;
        for (name, contents) in files.iter().chain([&(TOKEN_FILE, token.clone())]) {
            let file = dir.join(name);
            std::fs::write(&file, contents).map_err(Error::io("writing", &file))?;
        }
        let config_file = dir.join("prometheus.yml");
        std::fs::write(&config_file, config(&dir)).map_err(Error::io("writing", &config_file))?;

        let logs = log_dir();
        std::fs::create_dir_all(&logs).map_err(Error::io("creating", &logs))?;
        let log = logs.join(format!("{}.log", unique_name("prometheus")));
        let out = std::fs::File::create(&log).map_err(Error::io("creating", &log))?;
        let err = out.try_clone().map_err(Error::io("opening", &log))?;
        let port = free_port()?;
        let child = Command::new(&binary)
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| Error::Spawn {
                binary: binary.clone(),
                source,
            })?;
        let prometheus = Self {
            child,
            port,
            dir,
            log,
            token,
        };
        crate::wait_for(
            "Prometheus to be ready",
            Duration::from_secs(60),
            || async { get(port, "/-/ready").await.map(drop) },
        )
        .await
        .map_err(|e| prometheus.with_log(e))?;
        Ok(prometheus)
    }

    /// Every alerting rule loaded: its name, health (`ok`, `err`, `unknown`) and last error.
    ///
    /// # Errors
    /// [`Error::Prometheus`] when the API answers with an error or unexpected JSON.
    pub async fn rules(&self) -> Result<Vec<(String, String, String)>> {
        let body = self.api("/api/v1/rules?type=alert").await?;
        let groups = body["data"]["groups"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        Ok(groups
            .iter()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .map(|r| {
                let text = |key: &str| r[key].as_str().unwrap_or_default().to_owned();
                (text("name"), text("health"), text("lastError"))
            })
            .collect())
    }

    /// The alerts pending or firing now: each one's name and state.
    ///
    /// # Errors
    /// [`Error::Prometheus`] when the API answers with an error or unexpected JSON.
    pub async fn alerts(&self) -> Result<Vec<(String, String)>> {
        let body = self.api("/api/v1/alerts").await?;
        let alerts = body["data"]["alerts"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        Ok(alerts
            .iter()
            .map(|a| {
                (
                    a["labels"]["alertname"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    a["state"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect())
    }

    /// The token it scrapes with: its ServiceAccount's, which holds the generated
    /// metrics-reader ClusterRole.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Its log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The last lines of its log, appended to an error.
    pub fn with_log(&self, error: Error) -> Error {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(20)..].join("\n");
        Error::Timeout {
            what: format!("{error}"),
            seconds: 0.0,
            last: format!("Prometheus log ({}):\n{tail}", self.log.display()),
        }
    }

    /// The active targets.
    ///
    /// # Errors
    /// [`Error::Prometheus`] when the API answers with an error or unexpected JSON.
    pub async fn targets(&self) -> Result<Vec<Target>> {
        let body = self.api("/api/v1/targets?state=active").await?;
        let targets = body["data"]["activeTargets"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        Ok(targets
            .into_iter()
            .map(|t| Target {
                scrape_url: t["scrapeUrl"].as_str().unwrap_or_default().to_owned(),
                health: t["health"].as_str().unwrap_or_default().to_owned(),
                last_error: t["lastError"].as_str().unwrap_or_default().to_owned(),
                labels: t["labels"].clone(),
            })
            .collect())
    }

    /// Evaluates an instant PromQL query; returns each series' labels and value.
    ///
    /// # Errors
    /// [`Error::Prometheus`] when the query fails.
    pub async fn query(&self, promql: &str) -> Result<Vec<(serde_json::Value, f64)>> {
        let body = self
            .api(&format!("/api/v1/query?query={}", percent_encode(promql)))
            .await?;
        let results = body["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        Ok(results
            .into_iter()
            .filter_map(|r| {
                let value = r["value"][1].as_str()?.parse().ok()?;
                Some((r["metric"].clone(), value))
            })
            .collect())
    }

    /// The series `promql` gives over `[start, end]` (Unix seconds), a sample every `step`:
    /// each series' labels and its `(time, value)` samples, a value that is not a number
    /// (`NaN`, a quantile of nothing) as NaN.
    ///
    /// # Errors
    /// [`Error::Prometheus`] when the query fails.
    pub async fn query_range(
        &self,
        promql: &str,
        start: f64,
        end: f64,
        step: Duration,
    ) -> Result<Vec<(serde_json::Value, Vec<(f64, f64)>)>> {
        let body = self
            .api(&format!(
                "/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step={}",
                percent_encode(promql),
                step.as_secs_f64()
            ))
            .await?;
        let results = body["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        Ok(results
            .into_iter()
            .map(|series| {
                let samples = series["values"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|pair| {
                        let time = pair[0].as_f64()?;
                        let value = pair[1].as_str()?.parse().unwrap_or(f64::NAN);
                        Some((time, value))
                    })
                    .collect();
                (series["metric"].clone(), samples)
            })
            .collect())
    }

    async fn api(&self, path: &str) -> Result<serde_json::Value> {
        let text = get(self.port, path)
            .await
            .map_err(|message| Error::Prometheus {
                request: path.to_owned(),
                message,
            })?;
        let body: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| Error::Prometheus {
                request: path.to_owned(),
                message: format!("{e}: {text}"),
            })?;
        if body["status"] != "success" {
            return Err(Error::Prometheus {
                request: path.to_owned(),
                message: text,
            });
        }
        Ok(body)
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The scrape configuration: pod discovery in one namespace, the `prometheus.io/*`
/// annotations deciding what and where to scrape, certificates verified with the CA in
/// [`CA_FILE`] of `dir` for the name `server_name`.
fn scrape_config(kubeconfig: &Path, dir: &Path, namespace: &str, server_name: &str) -> String {
    format!(
        r#"global:
  scrape_interval: 2s
  scrape_timeout: 1s
  evaluation_interval: 2s
scrape_configs:
  - job_name: kubernetes-pods
    authorization:
      credentials_file: {token_file}
    tls_config:
      ca_file: {ca_file}
      server_name: {server_name}
    kubernetes_sd_configs:
      - role: pod
        kubeconfig_file: {kubeconfig}
        namespaces:
          names: [{namespace}]
    relabel_configs:
      - source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_scrape]
        action: keep
        regex: "true"
      - source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_scheme]
        action: replace
        target_label: __scheme__
        regex: (https?)
      - source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_path]
        action: replace
        target_label: __metrics_path__
        regex: (.+)
      - source_labels: [__address__, __meta_kubernetes_pod_annotation_prometheus_io_port]
        action: replace
        regex: ([^:]+)(?::\d+)?;(\d+)
        replacement: $1:$2
        target_label: __address__
      - source_labels: [__meta_kubernetes_namespace]
        target_label: namespace
      - source_labels: [__meta_kubernetes_pod_name]
        target_label: pod
"#,
        kubeconfig = kubeconfig.display(),
        token_file = dir.join(TOKEN_FILE).display(),
        ca_file = dir.join(CA_FILE).display(),
    )
}

/// Prometheus's ServiceAccount, allowed to discover pods and read the manager's metrics: a
/// kubeconfig for discovery and a token for scraping.
async fn identity(cluster: &TestCluster) -> Result<(crate::ServiceAccountKubeconfig, String)> {
    let namespace = "default";
    grant_pod_discovery(cluster, namespace).await?;
    let identity = service_account_kubeconfig(cluster, namespace, IDENTITY).await?;
    let token = service_account_token(cluster, namespace, IDENTITY).await?;
    Ok((identity, token))
}

/// Scrapes one HTTPS target as `job` with the token in `token_file`, and evaluates `rules`.
/// The target is a manager run as a local process, which serves no webhooks and so a
/// self-signed metrics certificate: nothing to verify it with.
fn static_config(job: &str, target: &str, token_file: &Path, rules: &Path) -> String {
    format!(
        r#"global:
  scrape_interval: 2s
  scrape_timeout: 1s
  evaluation_interval: 2s
rule_files:
  - {rules}
scrape_configs:
  - job_name: {job}
    scheme: https
    authorization:
      credentials_file: {token_file}
    tls_config:
      insecure_skip_verify: true
    static_configs:
      - targets: ["{target}"]
"#,
        rules = rules.display(),
        token_file = token_file.display(),
    )
}

/// A ClusterRole to list and watch pods, bound to Prometheus's ServiceAccount.
async fn grant_pod_discovery(cluster: &TestCluster, namespace: &str) -> Result<()> {
    let client = &cluster.client;
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(IDENTITY.into()),
            namespace: Some(namespace.into()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .patch(IDENTITY, &apply, &Patch::Apply(&sa))
        .await
        .map_err(Error::kube("creating Prometheus's ServiceAccount"))?;
    let role = ClusterRole {
        metadata: ObjectMeta {
            name: Some(IDENTITY.into()),
            ..ObjectMeta::default()
        },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["pods".into()]),
            verbs: vec!["get".into(), "list".into(), "watch".into()],
            ..PolicyRule::default()
        }]),
        ..ClusterRole::default()
    };
    Api::<ClusterRole>::all(client.clone())
        .patch(IDENTITY, &apply, &Patch::Apply(&role))
        .await
        .map_err(Error::kube("creating Prometheus's ClusterRole"))?;
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(IDENTITY.into()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: IDENTITY.into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: IDENTITY.into(),
            namespace: Some(namespace.into()),
            ..Subject::default()
        }]),
    };
    Api::<ClusterRoleBinding>::all(client.clone())
        .patch(IDENTITY, &apply, &Patch::Apply(&binding))
        .await
        .map_err(Error::kube("binding Prometheus's ClusterRole"))?;
    // And the generated ClusterRole for reading the manager's secure metrics, as a user binds
    // it to their Prometheus.
    let reader_file = crate::deploy_dir()
        .join("rbac")
        .join("metrics_reader_role.yaml");
    let reader = crate::read_yaml_file(&reader_file)?;
    let reader_name = reader
        .first()
        .and_then(|role| role.metadata.name.clone())
        .ok_or_else(|| Error::Manifest {
            path: reader_file.clone(),
            message: "no ClusterRole in it".into(),
        })?;
    crate::apply_objects(client, reader, None).await?;
    let reader_binding_name = format!("{IDENTITY}-metrics-reader");
    let reader_binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(reader_binding_name.clone()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            name: reader_name,
            ..binding.role_ref.clone()
        },
        subjects: binding.subjects.clone(),
    };
    Api::<ClusterRoleBinding>::all(client.clone())
        .patch(&reader_binding_name, &apply, &Patch::Apply(&reader_binding))
        .await
        .map_err(Error::kube(
            "binding the metrics-reader ClusterRole to Prometheus",
        ))?;
    Ok(())
}

/// `GET path` from Prometheus on loopback; the body of a 200 answer.
async fn get(port: u16, path: &str) -> std::result::Result<String, String> {
    localcluster::http::get_ok(std::net::Ipv4Addr::LOCALHOST.into(), port, path).await
}

/// Percent-encodes a query parameter value (everything but unreserved characters).
fn percent_encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_percent_encoded() {
        assert_eq!(
            percent_encode(r#"sum(x{a="b"})"#),
            "sum%28x%7Ba%3D%22b%22%7D%29"
        );
        assert_eq!(percent_encode("plain-text_1.0~"), "plain-text_1.0~");
    }

    #[test]
    fn the_configuration_keeps_annotated_pods_of_one_namespace() {
        let config = scrape_config(Path::new("/k"), Path::new("/d"), "ns", "metrics");
        assert!(config.contains("names: [ns]"));
        assert!(config.contains("__meta_kubernetes_pod_annotation_prometheus_io_scrape"));
        assert!(config.contains("kubeconfig_file: /k"));
        assert!(
            config.contains("credentials_file: /d/token"),
            "scrapes with its token"
        );
        assert!(
            config.contains("ca_file: /d/ca.crt\n      server_name: metrics\n"),
            "verifies the targets: {config}"
        );
        assert!(!config.contains("insecure_skip_verify"));
        assert!(
            config.contains("target_label: __scheme__"),
            "over HTTPS when annotated"
        );
    }
}
