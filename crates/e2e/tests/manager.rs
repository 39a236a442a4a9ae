//! The manager binary end to end: configuration, leader election, probes, metrics, surviving an
//! API server outage, all with only the generated RBAC.
//!
//! Needs the manager built (`cargo build -p manager`). The configuration tests need no cluster;
//! the others start the local cluster if none runs, and run one at a time (a manager reconciles
//! every namespace, so two tests' managers would see each other's objects). Each test prints
//! where its managers' logs are.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use testkit::{ManagerProcess, ServiceAccountKubeconfig, TestCluster, TestNamespace};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::{Mutex, MutexGuard};

/// Cluster tests run one at a time.
static CLUSTER_TESTS: Mutex<()> = Mutex::const_new(());

const CONVERGE: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// Configuration, through the real binary; no cluster needed.

/// Runs the manager with a clean environment (only `env`), a kubeconfig that does not exist
/// (so it stops right after logging its configuration), JSON logs and nothing listening (set
/// through the environment, so `args` and `env` can override them).
fn run_binary(args: &[&str], env: &[(&str, &str)]) -> Result<Output> {
    let binary = testkit::manager_binary()?;
    let mut cmd = std::process::Command::new(binary);
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", std::env::temp_dir().join("manager-e2e-no-home"))
        .env(
            "KUBECONFIG",
            std::env::temp_dir().join("manager-e2e-no-such-kubeconfig"),
        )
        .env("RUST_LOG", "info")
        .env("MANAGER_METRICS_BIND_ADDRESS", "0")
        .env("MANAGER_HEALTH_PROBE_BIND_ADDRESS", "0")
        .env("MANAGER_WEBHOOK_BIND_ADDRESS", "0")
        .env("MANAGER_LOG_FORMAT", "json")
        .args(args)
        .envs(env.iter().copied());
    Ok(cmd.output()?)
}

/// A directory for configuration files, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<Self> {
        let dir = std::env::temp_dir().join(testkit::unique_name("manager-e2e-config"));
        std::fs::create_dir_all(&dir)?;
        Ok(Self(dir))
    }

    fn file(&self, name: &str, contents: &str) -> Result<String> {
        let path = self.0.join(name);
        std::fs::write(&path, contents)?;
        Ok(path.to_string_lossy().into_owned())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn configuration_precedence_is_defaults_file_env_flags() -> Result<()> {
    let dir = TempDir::new()?;
    let file = dir.file(
        "manager.yaml",
        "lease_duration: 20s\nrenew_deadline: 12s\nretry_period: 3s\nleader_election_id: from-file\nmax_concurrent_reconciles: 7\n",
    )?;
    let out = run_binary(
        &[
            "--config",
            &file,
            "--retry-period=500ms",
            "--leader-election-id=from-flag",
        ],
        &[
            ("MANAGER_RENEW_DEADLINE", "11s"),
            ("MANAGER_RETRY_PERIOD", "1s"),
            ("MANAGER_LEADER_ELECTION_ID", "from-env"),
            ("MANAGER_SHUTDOWN_TIMEOUT", "5s"),
        ],
    )?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l["message"] == "effective configuration")
        .with_context(|| {
            format!(
                "no effective configuration logged:\n{stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
    let want = [
        ("lease_duration", json!("20s")),           // file over default
        ("renew_deadline", json!("11s")),           // env over file
        ("retry_period", json!("500ms")),           // flag over env and file
        ("leader_election_id", json!("from-flag")), // flag over env and file
        ("max_concurrent_reconciles", json!(7)),    // file
        ("shutdown_timeout", json!("5s")),          // env
        ("health_probe_bind_address", json!("0")),  // env
        ("leader_elect", json!(false)),             // default
        ("warm_standby", json!(true)),              // default
    ];
    for (key, value) in want {
        ensure!(
            line[key] == value,
            "{key}: want {value}, got {} in {line}",
            line[key]
        );
    }
    // It then fails to find a cluster: a runtime failure (1), not a configuration error (2).
    ensure!(out.status.code() == Some(1), "exit status {:?}", out.status);
    Ok(())
}

#[test]
fn each_bad_value_exits_2_naming_key_and_source() -> Result<()> {
    let dir = TempDir::new()?;
    let short_deadline = dir.file("deadline.yaml", "renew_deadline: 20s\n")?;
    let unknown_key = dir.file("unknown.yaml", "lease_duraton: 20s\n")?;
    let bad_yaml = dir.file("bad.yaml", "lease_duration: [\n")?;
    // A certificate directory whose key is not a key.
    let certs = TempDir::new()?;
    let generated = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])?;
    certs.file("tls.crt", &generated.cert.pem())?;
    let broken_key = certs.file("tls.key", "not a key")?;
    let broken_certs = format!("--metrics-cert-path={}", certs.0.display());
    // (flags, environment, what stderr must contain)
    type Case<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, Vec<String>);
    let cases: Vec<Case> = vec![
        (
            vec!["--metrics-bind-address=not-an-address"],
            vec![],
            vec![
                "invalid value 'not-an-address' for '--metrics-bind-address <ADDR>'".into(),
                "invalid address".into(),
            ],
        ),
        (
            vec![],
            vec![("MANAGER_HEALTH_PROBE_BIND_ADDRESS", "8081")],
            vec![
                "health_probe_bind_address (from env var MANAGER_HEALTH_PROBE_BIND_ADDRESS)".into(),
            ],
        ),
        (
            vec!["--webhook-cert-validity=10s"],
            vec![],
            vec![
                "webhook_cert_validity (from flag --webhook-cert-validity)".into(),
                "shorter than the minimum of 30s".into(),
            ],
        ),
        (
            vec![],
            vec![("MANAGER_LEASE_DURATION", "15")],
            vec![
                "lease_duration (from env var MANAGER_LEASE_DURATION)".into(),
                "missing unit".into(),
            ],
        ),
        (
            vec!["--config", &short_deadline],
            vec![],
            vec![
                format!("renew_deadline (from file {short_deadline})"),
                "must be shorter than lease_duration".into(),
            ],
        ),
        (
            vec!["--renew-deadline=3s"],
            vec![("MANAGER_LEASE_DURATION", "2s")],
            vec![
                "renew_deadline (from flag --renew-deadline)".into(),
                "env var MANAGER_LEASE_DURATION".into(),
            ],
        ),
        (
            vec!["--retry-period=10s"],
            vec![],
            vec![
                "retry_period (from flag --retry-period)".into(),
                "must be shorter than renew_deadline".into(),
            ],
        ),
        (
            vec![],
            vec![("MANAGER_CONTROLLERS", "memcached,nope")],
            vec![
                "controllers (from env var MANAGER_CONTROLLERS)".into(),
                "unknown controller \"nope\"".into(),
                "memcached".into(),
            ],
        ),
        (
            vec!["--config", "/nonexistent/manager.yaml"],
            vec![],
            vec![
                "config (from flag --config)".into(),
                "cannot read /nonexistent/manager.yaml".into(),
            ],
        ),
        (
            vec![],
            vec![("MANAGER_CONFIG", bad_yaml.as_str())],
            vec![format!("(from file {bad_yaml})"), "invalid YAML".into()],
        ),
        (
            vec!["--config", &unknown_key],
            vec![],
            vec![
                format!("lease_duraton (from file {unknown_key})"),
                "unknown key".into(),
            ],
        ),
        (
            vec![],
            vec![("MANAGER_FOO", "1")],
            vec![
                "foo (from env var MANAGER_FOO)".into(),
                "unknown key".into(),
            ],
        ),
        (
            vec!["--log-format=xml"],
            vec![],
            vec![
                "invalid value 'xml' for '--log-format <FORMAT>'".into(),
                "expected one of: json, text, console, auto".into(),
            ],
        ),
        (
            vec![],
            vec![("MANAGER_LOG_FORMAT", "xml")],
            vec!["log_format (from env var MANAGER_LOG_FORMAT)".into()],
        ),
        (
            vec!["--no-such-flag"],
            vec![],
            vec!["--no-such-flag".into()],
        ),
        (
            vec![
                "--metrics-bind-address=127.0.0.1:0",
                "--metrics-secure",
                "--metrics-cert-path=/nonexistent/certs",
            ],
            vec![],
            vec!["TLS: cannot read /nonexistent/certs/tls.crt".into()],
        ),
        (
            vec![
                "--metrics-bind-address=127.0.0.1:0",
                "--metrics-secure",
                &broken_certs,
            ],
            vec![],
            vec![format!("{broken_key}: not a PEM private key")],
        ),
    ];
    let mut failures = Vec::new();
    for (args, env, expected) in &cases {
        let out = run_binary(args, env)?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        let missing: Vec<&String> = expected
            .iter()
            .filter(|e| !stderr.contains(e.as_str()))
            .collect();
        if out.status.code() != Some(2) || !missing.is_empty() {
            failures.push(format!(
                "args {args:?} env {env:?}: status {:?}, missing {missing:?} in:\n{stderr}",
                out.status
            ));
        } else {
            println!(
                "args {args:?} env {env:?} -> {}",
                stderr.trim().replace('\n', " ")
            );
        }
    }
    ensure!(failures.is_empty(), "{}", failures.join("\n\n"));
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Support for the cluster tests.

struct Fixture {
    _serial: MutexGuard<'static, ()>,
    cluster: TestCluster,
    ns: TestNamespace,
    identity: ServiceAccountKubeconfig,
}

async fn fixture(prefix: &str) -> Result<Fixture> {
    let serial = CLUSTER_TESTS.lock().await;
    let cluster = testkit::cluster().await?;
    let identity = testkit::manager_kubeconfig(&cluster, &testkit::deploy_dir()).await?;
    let ns = TestNamespace::create(&cluster, prefix).await?;
    Ok(Fixture {
        _serial: serial,
        cluster,
        ns,
        identity,
    })
}

/// A manager under test with its ports.
struct Manager {
    process: ManagerProcess,
    name: String,
    metrics: u16,
    probes: u16,
}

impl Manager {
    /// Starts a manager with leader election on `lease`, `POD_NAME=name` (its holder identity's
    /// pod name),
    /// loopback ports, JSON logs, and `extra` flags; waits until `/readyz` answers 200.
    async fn start(kubeconfig: &Path, name: &str, lease: &str, extra: &[&str]) -> Result<Self> {
        let metrics = testkit::free_port()?;
        let probes = testkit::free_port_other_than(&[metrics])?;
        let mut args = vec![
            "--leader-elect".to_owned(),
            format!("--leader-election-id={lease}"),
            format!("--metrics-bind-address=127.0.0.1:{metrics}"),
            format!("--health-probe-bind-address=127.0.0.1:{probes}"),
            "--log-format=json".to_owned(),
        ];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let process = testkit::spawn_manager(kubeconfig, &args, &[("POD_NAME", name)]).await?;
        println!("manager {name}: log {}", process.log().display());
        let mut manager = Self {
            process,
            name: name.to_owned(),
            metrics,
            probes,
        };
        manager.wait_ready().await?;
        Ok(manager)
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.process.try_exit_status()? {
                bail!(
                    "manager {} exited with {status} while starting:\n{}",
                    self.name,
                    self.process.log_text()
                );
            }
            if matches!(http_get(self.probes, "/readyz").await, Ok((200, _))) {
                return Ok(());
            }
            if start.elapsed() > CONVERGE {
                bail!(
                    "manager {} not ready after {CONVERGE:?}:\n{}",
                    self.name,
                    self.process.log_text()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn metrics_text(&self) -> Result<String> {
        let (code, body) = http_get(self.metrics, "/metrics").await?;
        ensure!(code == 200, "/metrics of {} answered {code}", self.name);
        Ok(body)
    }

    /// `leader_election_master_status{name=lease}`.
    async fn leading(&self, lease: &str) -> Result<f64> {
        let text = self.metrics_text().await?;
        metric(
            &text,
            &format!("leader_election_master_status{{name=\"{lease}\"}}"),
        )
        .with_context(|| {
            format!(
                "no leader_election_master_status for {lease} on {}",
                self.name
            )
        })
    }

    async fn wait_leading(&self, lease: &str, timeout: Duration) -> Result<Duration> {
        let start = Instant::now();
        loop {
            if self.leading(lease).await.ok() == Some(1.0) {
                return Ok(start.elapsed());
            }
            if start.elapsed() > timeout {
                bail!(
                    "{} did not lead within {timeout:?}:\n{}",
                    self.name,
                    self.process.log_text()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The total of `controller_runtime_reconcile_total` over all labels.
    async fn reconciles(&self) -> Result<f64> {
        Ok(metric_sum(
            &self.metrics_text().await?,
            "controller_runtime_reconcile_total{",
        ))
    }

    /// Waits until this manager has counted a reconcile. The other tests' managers watch every
    /// namespace too and may converge an object first, so a single read could come too early.
    async fn wait_reconciled(&self, who: &str) -> Result<()> {
        testkit::wait_for(&format!("{who} to reconcile"), CONVERGE, || async {
            match self.reconciles().await {
                Ok(count) if count > 0.0 => Ok(()),
                Ok(_) => Err("no reconcile counted yet".to_owned()),
                Err(e) => Err(format!("reading its metrics: {e:#}")),
            }
        })
        .await?;
        Ok(())
    }

    /// Fails if the log shows any request the generated RBAC did not allow.
    fn assert_never_forbidden(&self) -> Result<()> {
        self.assert_never_forbidden_except(|_| false)
    }

    /// As [`Self::assert_never_forbidden`], except for lines logged between `from` and `until`.
    ///
    /// A restarted API server answers before its RBAC cache has synced and refuses every
    /// request meanwhile ("clusterrole system:basic-user not found"). In a real control plane
    /// the load balancer sends requests only to ready API servers, which hides this; here the
    /// manager talks to the one server directly, so that window is left out.
    fn assert_never_forbidden_outside(
        &self,
        from: k8s_openapi::jiff::Timestamp,
        until: k8s_openapi::jiff::Timestamp,
    ) -> Result<()> {
        self.assert_never_forbidden_except(|line| {
            serde_json::from_str::<Value>(line)
                .ok()
                .and_then(|v| {
                    v["timestamp"]
                        .as_str()?
                        .parse::<k8s_openapi::jiff::Timestamp>()
                        .ok()
                })
                .is_some_and(|t| from <= t && t <= until)
        })
    }

    fn assert_never_forbidden_except(&self, excused: impl Fn(&str) -> bool) -> Result<()> {
        let log = self.process.log_text();
        let forbidden: Vec<&str> = log
            .lines()
            .filter(|l| {
                l.contains("Forbidden") || l.contains("forbidden") || l.contains("code: 403")
            })
            .filter(|l| !excused(l))
            .collect();
        ensure!(
            forbidden.is_empty(),
            "manager {} was refused by RBAC:\n{}",
            self.name,
            forbidden.join("\n")
        );
        Ok(())
    }
}

/// A plain HTTP/1.1 GET on loopback: (status, body).
async fn http_get(port: u16, path: &str) -> Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    tokio::time::timeout(
        Duration::from_secs(10),
        stream.read_to_string(&mut response),
    )
    .await??;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("no HTTP status")?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// The value of the sample `series` (name with labels, exactly as exposed).
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// The sum of every sample whose series starts with `prefix`.
fn metric_sum(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

fn memcached_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(product::group!(cache), "v1beta1", "Memcached"),
        "memcacheds",
    )
}

fn memcacheds(cluster: &TestCluster, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(cluster.client.clone(), ns, &memcached_resource())
}

async fn create_memcached(api: &Api<DynamicObject>, name: &str, size: i32) -> Result<()> {
    let object =
        DynamicObject::new(name, &memcached_resource()).data(json!({ "spec": { "size": size } }));
    api.create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("creating Memcached {name}"))?;
    Ok(())
}

async fn set_size(api: &Api<DynamicObject>, name: &str, size: i32) -> Result<()> {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "size": size } })),
    )
    .await
    .with_context(|| format!("scaling Memcached {name}"))?;
    Ok(())
}

/// Waits until the Deployment of Memcached `name` asks for `size` replicas and the Memcached's
/// status has observed its latest generation.
async fn wait_converged(
    cluster: &TestCluster,
    ns: &str,
    name: &str,
    size: i32,
    timeout: Duration,
) -> Result<()> {
    let deployments: Api<Deployment> = Api::namespaced(cluster.client.clone(), ns);
    let api = memcacheds(cluster, ns);
    testkit::wait_for(
        &format!("Memcached {ns}/{name} to converge on size {size}"),
        timeout,
        || async {
            let deployment = deployments
                .get(name)
                .await
                .map_err(|e| format!("deployment: {e}"))?;
            let replicas = deployment.spec.replicas;
            if replicas != Some(size) {
                return Err(format!("deployment replicas {replicas:?}"));
            }
            let object = api.get(name).await.map_err(|e| format!("memcached: {e}"))?;
            let generation = object.metadata.generation;
            let observed = object.data["status"]["observedGeneration"].as_i64();
            if observed != generation {
                return Err(format!(
                    "observedGeneration {observed:?} of generation {generation:?}"
                ));
            }
            Ok(())
        },
    )
    .await?;
    Ok(())
}

fn leases(fixture: &Fixture) -> Api<Lease> {
    Api::namespaced(fixture.cluster.client.clone(), &fixture.identity.namespace)
}

async fn lease_holder(fixture: &Fixture, lease: &str) -> Result<(String, i32)> {
    let spec = leases(fixture).get(lease).await?.spec.unwrap_or_default();
    let holder = spec.holder_identity.unwrap_or_default();
    Ok((
        testkit::identity_pod(&holder).to_owned(),
        spec.lease_transitions.unwrap_or_default(),
    ))
}

// ---------------------------------------------------------------------------------------------
// Leader election.

#[tokio::test]
async fn two_managers_one_leader_and_sigterm_hands_over_at_once() -> Result<()> {
    let fixture = fixture("mgr-two").await?;
    let lease = testkit::unique_name("lease-two");
    let a_name = testkit::unique_name("manager-a");
    let b_name = testkit::unique_name("manager-b");
    let mut a = Manager::start(&fixture.identity.path, &a_name, &lease, &[]).await?;
    a.wait_leading(&lease, CONVERGE).await?;
    let b = Manager::start(&fixture.identity.path, &b_name, &lease, &[]).await?;

    // Exactly one holds the Lease and reconciles.
    let api = memcacheds(&fixture.cluster, fixture.ns.name());
    create_memcached(&api, "cache", 2).await?;
    wait_converged(&fixture.cluster, fixture.ns.name(), "cache", 2, CONVERGE).await?;
    ensure!(a.leading(&lease).await? == 1.0, "a should lead");
    ensure!(b.leading(&lease).await? == 0.0, "b should stand by");
    ensure!(
        lease_holder(&fixture, &lease).await?.0 == a_name,
        "the Lease should name a"
    );
    a.wait_reconciled("the leader").await?;
    ensure!(b.reconciles().await? == 0.0, "the standby reconciled");
    // A warm standby (the default) follows every change, and attempts no write.
    let standby = b.metrics_text().await?;
    let queued = metric_sum(&standby, "workqueue_adds_total{");
    let fenced = metric_sum(&standby, "leader_election_fenced_writes_total{");
    println!("warm standby: {queued} triggers queued, {fenced} writes refused");
    ensure!(queued > 0.0, "the warm standby saw no change");
    ensure!(fenced == 0.0, "the standby attempted {fenced} writes");

    // SIGTERM: a releases the Lease and b takes over within 2 s.
    let (_, transitions) = lease_holder(&fixture, &lease).await?;
    let sent = Instant::now();
    a.process.terminate();
    let handover = b.wait_leading(&lease, Duration::from_secs(10)).await?;
    println!(
        "SIGTERM handover: the standby led {:.3}s after the signal",
        handover.as_secs_f64()
    );
    ensure!(
        handover < Duration::from_secs(2),
        "handover took {handover:?}"
    );
    let status = a
        .process
        .wait_timeout(Duration::from_secs(35))
        .await?
        .context("a did not exit after SIGTERM")?;
    ensure!(
        status.success(),
        "a exited with {status} after SIGTERM:\n{}",
        a.process.log_text()
    );
    println!(
        "a exited 0 {:.3}s after SIGTERM",
        sent.elapsed().as_secs_f64()
    );
    let (holder, after) = lease_holder(&fixture, &lease).await?;
    ensure!(
        holder == b_name && after == transitions + 1,
        "lease holder {holder}, transitions {transitions} -> {after}"
    );

    // Each change of leader is an Event on the Lease, as client-go records it.
    let expected = [
        format!("{a_name} became leader"),
        format!("{a_name} stopped leading"),
        format!("{b_name} became leader"),
    ];
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(
        fixture.cluster.client.clone(),
        &fixture.identity.namespace,
    );
    testkit::wait_for(
        "the leader-election Events on the Lease",
        CONVERGE,
        || async {
            let notes: Vec<String> = events
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?
                .items
                .into_iter()
                .filter(|e| {
                    e.reason.as_deref() == Some("LeaderElection")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                            == Some(lease.as_str())
                        && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("Lease")
                })
                .filter_map(|e| e.note)
                // `<identity> became leader`, the identity being the pod name and a suffix.
                .map(|note| match note.split_once(' ') {
                    Some((who, what)) => format!("{} {what}", testkit::identity_pod(who)),
                    None => note,
                })
                .collect();
            if expected.iter().all(|want| notes.contains(want)) {
                Ok(())
            } else {
                Err(format!("notes so far: {notes:?}"))
            }
        },
    )
    .await?;

    // The new leader reconciles.
    set_size(&api, "cache", 3).await?;
    wait_converged(&fixture.cluster, fixture.ns.name(), "cache", 3, CONVERGE).await?;
    b.wait_reconciled("the new leader").await?;
    for m in [&a, &b] {
        m.assert_never_forbidden()?;
    }
    b.process.terminate();
    Ok(())
}

#[tokio::test]
async fn sigkill_on_the_leader_hands_over_after_the_lease_expires() -> Result<()> {
    let fixture = fixture("mgr-kill").await?;
    let lease = testkit::unique_name("lease-kill");
    let (duration, retry) = (Duration::from_secs(4), Duration::from_secs(1));
    let timings = [
        "--lease-duration=4s",
        "--renew-deadline=3s",
        "--retry-period=1s",
    ];
    let mut a = Manager::start(
        &fixture.identity.path,
        &testkit::unique_name("manager-a"),
        &lease,
        &timings,
    )
    .await?;
    a.wait_leading(&lease, CONVERGE).await?;
    let b = Manager::start(
        &fixture.identity.path,
        &testkit::unique_name("manager-b"),
        &lease,
        &timings,
    )
    .await?;
    // Let b see a renew at least once.
    tokio::time::sleep(Duration::from_secs(2)).await;
    ensure!(b.leading(&lease).await? == 0.0, "b should stand by");

    a.process.kill().await?;
    let bound = duration + retry + Duration::from_secs(1);
    let takeover = b
        .wait_leading(&lease, bound + Duration::from_secs(10))
        .await?;
    println!(
        "SIGKILL handover: the standby led {:.3}s after the kill (bound: lease duration + retry period + 1s = {:.0}s)",
        takeover.as_secs_f64(),
        bound.as_secs_f64()
    );
    ensure!(
        takeover <= bound,
        "takeover took {takeover:?}, more than {bound:?}"
    );

    let api = memcacheds(&fixture.cluster, fixture.ns.name());
    create_memcached(&api, "after-kill", 1).await?;
    wait_converged(
        &fixture.cluster,
        fixture.ns.name(),
        "after-kill",
        1,
        CONVERGE,
    )
    .await?;
    for m in [&a, &b] {
        m.assert_never_forbidden()?;
    }
    b.process.terminate();
    Ok(())
}

#[tokio::test]
async fn a_leader_that_finds_its_lease_taken_stops_and_exits_non_zero() -> Result<()> {
    let fixture = fixture("mgr-taken").await?;
    let lease = testkit::unique_name("lease-taken");
    let mut a = Manager::start(
        &fixture.identity.path,
        &testkit::unique_name("manager-a"),
        &lease,
        &["--retry-period=1s"],
    )
    .await?;
    a.wait_leading(&lease, CONVERGE).await?;
    let api = memcacheds(&fixture.cluster, fixture.ns.name());
    create_memcached(&api, "cache", 1).await?;
    wait_converged(&fixture.cluster, fixture.ns.name(), "cache", 1, CONVERGE).await?;

    // Another holder overwrites the Lease.
    let intruder = testkit::unique_name("intruder");
    let mut taken = leases(&fixture).get(&lease).await?;
    let spec = taken.spec.get_or_insert_with(Default::default);
    spec.holder_identity = Some(intruder.clone());
    spec.lease_duration_seconds = Some(3600);
    spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
    leases(&fixture)
        .replace(&lease, &PostParams::default(), &taken)
        .await?;
    let taken_at = Instant::now();

    let status = a
        .process
        .wait_timeout(Duration::from_secs(20))
        .await?
        .context("the old leader kept running")?;
    println!(
        "the old leader exited with {status} {:.3}s after the takeover",
        taken_at.elapsed().as_secs_f64()
    );
    ensure!(
        status.code() == Some(1),
        "want exit status 1, got {status}:\n{}",
        a.process.log_text()
    );
    let log = a.process.log_text();
    ensure!(
        log.contains("leadership lost"),
        "no 'leadership lost' in the log:\n{log}"
    );
    let (holder, _) = lease_holder(&fixture, &lease).await?;
    ensure!(holder == intruder, "the Lease was taken back by {holder}");
    a.assert_never_forbidden()?;
    Ok(())
}

#[tokio::test]
async fn a_lease_deleted_or_emptied_by_hand_is_taken_only_once_its_holder_expires() -> Result<()> {
    let fixture = fixture("mgr-gone").await?;
    let lease = testkit::unique_name("lease-gone");
    let flags = [
        "--lease-duration=6s",
        "--renew-deadline=4s",
        "--retry-period=1s",
    ];
    let start = |name: &str| {
        let (path, name, lease) = (
            fixture.identity.path.clone(),
            name.to_owned(),
            lease.clone(),
        );
        async move { Manager::start(&path, &name, &lease, &flags).await }
    };
    let mut leader = start(&testkit::unique_name("manager-a")).await?;
    leader.wait_leading(&lease, CONVERGE).await?;
    for edit in ["deleted", "emptied"] {
        let standby = start(&testkit::unique_name("manager-b")).await?;
        // Let the standby see the leader renew.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let edited = Instant::now();
        if edit == "deleted" {
            leases(&fixture)
                .delete(&lease, &DeleteParams::default())
                .await?;
        } else {
            let patch = json!({"spec": {"holderIdentity": ""}});
            leases(&fixture)
                .patch(&lease, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        let status = leader
            .process
            .wait_timeout(Duration::from_secs(10))
            .await?
            .with_context(|| format!("{} kept running after its Lease was {edit}", leader.name))?;
        ensure!(
            status.code() == Some(1),
            "the old leader should exit 1 once its Lease is gone, got {status}"
        );
        standby.wait_leading(&lease, CONVERGE).await?;
        let waited = edited.elapsed();
        println!(
            "Lease {edit} by hand: the old leader exited with {status}, the standby led {:.2}s \
             later",
            waited.as_secs_f64()
        );
        // The standby saw a renewal at most a retry period before the edit; it may lead only
        // once that renewal's 6 s have run out (and no more than a retry period after).
        ensure!(
            waited >= Duration::from_secs(4) && waited <= Duration::from_secs(9),
            "after the Lease was {edit} the standby led {waited:?} later, not after the \
             holder's remaining lease"
        );
        leader = standby;
    }
    leader.process.terminate();
    Ok(())
}

#[tokio::test]
async fn a_second_process_under_the_same_pod_name_does_not_share_the_lease() -> Result<()> {
    let fixture = fixture("mgr-twin").await?;
    let lease = testkit::unique_name("lease-twin");
    let name = testkit::unique_name("manager-twin");
    let flags = ["--retry-period=1s"];
    let first = Manager::start(&fixture.identity.path, &name, &lease, &flags).await?;
    first.wait_leading(&lease, CONVERGE).await?;
    let held = leases(&fixture).get(&lease).await?.spec.unwrap_or_default();
    let identity = held.holder_identity.unwrap_or_default();
    let second = Manager::start(&fixture.identity.path, &name, &lease, &flags).await?;
    // Several retry periods: a twin taking the Lease for its own would lead by now.
    tokio::time::sleep(Duration::from_secs(4)).await;
    ensure!(
        second.leading(&lease).await? == 0.0,
        "the second process leads too"
    );
    ensure!(
        first.leading(&lease).await? == 1.0,
        "the first process lost the Lease"
    );
    let now = leases(&fixture).get(&lease).await?.spec.unwrap_or_default();
    ensure!(
        now.holder_identity.as_deref() == Some(identity.as_str()),
        "the Lease went from {identity:?} to {:?}",
        now.holder_identity
    );
    ensure!(
        testkit::identity_pod(&identity) == name && identity != name,
        "the identity {identity:?} is not the pod name {name:?} with a suffix"
    );
    drop((first, second));
    Ok(())
}

#[tokio::test]
async fn labels_and_annotations_others_set_on_the_lease_survive_renewals() -> Result<()> {
    let fixture = fixture("mgr-kept").await?;
    let lease = testkit::unique_name("lease-kept");
    let a = Manager::start(
        &fixture.identity.path,
        &testkit::unique_name("manager-a"),
        &lease,
        &["--retry-period=1s"],
    )
    .await?;
    a.wait_leading(&lease, CONVERGE).await?;
    let patch = json!({"metadata": {
        "labels": {"team": "platform"},
        "annotations": {"example.com/note": "kept"},
    }});
    leases(&fixture)
        .patch(&lease, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let renewed_after = leases(&fixture)
        .get(&lease)
        .await?
        .spec
        .and_then(|spec| spec.renew_time);
    // Three renewals later, both are still there.
    let mut renewals = 0;
    let mut last = renewed_after;
    let deadline = Instant::now() + CONVERGE;
    while renewals < 3 {
        ensure!(Instant::now() < deadline, "the Lease was not renewed");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let current = leases(&fixture).get(&lease).await?;
        let renewed = current
            .spec
            .as_ref()
            .and_then(|spec| spec.renew_time.clone());
        if renewed != last {
            renewals += 1;
            last = renewed;
            let labels = current.metadata.labels.unwrap_or_default();
            let annotations = current.metadata.annotations.unwrap_or_default();
            ensure!(
                labels.get("team").map(String::as_str) == Some("platform")
                    && annotations.get("example.com/note").map(String::as_str) == Some("kept"),
                "renewal {renewals} wiped what was set: labels {labels:?}, annotations \
                 {annotations:?}"
            );
        }
    }
    a.assert_never_forbidden()?;
    a.process.terminate();
    Ok(())
}

#[tokio::test]
async fn a_lease_the_api_server_refuses_makes_readyz_say_why() -> Result<()> {
    let fixture = fixture("mgr-refused").await?;
    // The generated Role grants Leases in the manager's namespace only.
    let namespace = fixture.ns.name().to_owned();
    let lease = testkit::unique_name("lease-refused");
    let probes = testkit::free_port()?;
    let metrics = testkit::free_port_other_than(&[probes])?;
    let args = [
        "--leader-elect".to_owned(),
        format!("--leader-election-id={lease}"),
        format!("--leader-election-namespace={namespace}"),
        "--retry-period=1s".to_owned(),
        format!("--metrics-bind-address=127.0.0.1:{metrics}"),
        format!("--health-probe-bind-address=127.0.0.1:{probes}"),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let process =
        testkit::spawn_manager(&fixture.identity.path, &args, &[("POD_NAME", "refused")]).await?;
    let expected = format!("refuses requests for the leader Lease {namespace}/{lease}");
    let said = testkit::wait_for("/readyz to say why", CONVERGE, || async {
        match http_get(probes, "/readyz").await {
            Ok((503, body)) if body.contains(&expected) => Ok(body),
            Ok((code, body)) => Err(format!("{code}: {body}")),
            Err(error) => Err(error.to_string()),
        }
    })
    .await;
    let said = said.with_context(|| process.log_text())?;
    ensure!(said.contains("forbidden"), "{said}");
    let (live, _) = http_get(probes, "/healthz").await?;
    ensure!(
        live == 200,
        "a standby that cannot lead is still alive, /healthz said {live}"
    );
    process.terminate();
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Probes and metrics.

#[tokio::test]
async fn metrics_move_with_real_reconciles_and_probes_answer() -> Result<()> {
    let fixture = fixture("mgr-metrics").await?;
    let lease = testkit::unique_name("lease-metrics");
    let m = Manager::start(
        &fixture.identity.path,
        &testkit::unique_name("manager"),
        &lease,
        &[],
    )
    .await?;
    m.wait_leading(&lease, CONVERGE).await?;
    for path in ["/healthz", "/readyz"] {
        let (code, body) = http_get(m.probes, path).await?;
        ensure!(code == 200, "{path} answered {code}: {body}");
    }

    let before = m.metrics_text().await?;
    let success = "controller_runtime_reconcile_total{controller=\"memcached\",result=\"success\"}";
    let count = "controller_runtime_reconcile_time_seconds_count{controller=\"memcached\"}";
    let sum = "controller_runtime_reconcile_time_seconds_sum{controller=\"memcached\"}";
    let api = memcacheds(&fixture.cluster, fixture.ns.name());
    create_memcached(&api, "observed", 1).await?;
    wait_converged(&fixture.cluster, fixture.ns.name(), "observed", 1, CONVERGE).await?;
    // The other tests' managers watch every namespace too and may converge the object before
    // this one's reconcile has returned, so wait for the series to move.
    let after = testkit::wait_for("the reconcile metrics to move", CONVERGE, || async {
        let after = m.metrics_text().await.map_err(|e| format!("{e:#}"))?;
        for series in [success, count, sum] {
            let (b, a) = (
                metric(&before, series).unwrap_or(0.0),
                metric(&after, series).unwrap_or(0.0),
            );
            if a <= b {
                return Err(format!("{series} did not move: {b} -> {a}"));
            }
        }
        Ok(after)
    })
    .await?;
    for series in [success, count, sum] {
        let (b, a) = (metric(&before, series), metric(&after, series));
        println!("{series}: {b:?} -> {a:?}");
    }
    ensure!(
        after.contains(
            "controller_runtime_reconcile_time_seconds_bucket{controller=\"memcached\",le=\""
        ),
        "no latency histogram buckets"
    );
    for family in [
        "controller_runtime_reconcile_errors_total",
        "controller_runtime_active_workers",
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
    ] {
        ensure!(
            after.contains(&format!("\n{family}")),
            "{family} missing from /metrics"
        );
    }
    ensure!(
        metric(
            &after,
            &format!("leader_election_master_status{{name=\"{lease}\"}}")
        ) == Some(1.0)
    );
    m.assert_never_forbidden()?;
    m.process.terminate();
    Ok(())
}

/// The loopback TCP ports process `pid` listens on (from `/proc`).
fn listening_ports(pid: u32) -> Result<Vec<u16>> {
    let mut inodes = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        let target = std::fs::read_link(entry?.path()).unwrap_or_default();
        if let Some(inode) = target
            .to_string_lossy()
            .strip_prefix("socket:[")
            .and_then(|s| s.strip_suffix(']'))
        {
            inodes.push(inode.to_owned());
        }
    }
    let mut ports = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // local_address is field 1 (ADDR:PORT in hex), st field 3 (0A = LISTEN), inode field 9.
            if fields.len() > 9
                && fields[3] == "0A"
                && inodes.iter().any(|i| i == fields[9])
                && let Some(port) = fields[1]
                    .rsplit_once(':')
                    .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
            {
                ports.push(port);
            }
        }
    }
    Ok(ports)
}

#[tokio::test]
async fn metrics_address_zero_serves_nothing() -> Result<()> {
    let fixture = fixture("mgr-nometrics").await?;
    let lease = testkit::unique_name("lease-nometrics");
    let probes = testkit::free_port()?;
    let args = [
        "--leader-elect".to_owned(),
        format!("--leader-election-id={lease}"),
        "--metrics-bind-address=0".to_owned(),
        format!("--health-probe-bind-address=127.0.0.1:{probes}"),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let process = testkit::spawn_manager(&fixture.identity.path, &args, &[]).await?;
    let mut m = Manager {
        process,
        name: "no-metrics".into(),
        metrics: 0,
        probes,
    };
    m.wait_ready().await?;
    let pid = m.process.id().context("the manager exited")?;
    let ports = listening_ports(pid)?;
    ensure!(
        ports == [probes],
        "want only the probe port {probes} listening, got {ports:?}"
    );
    m.assert_never_forbidden()?;
    m.process.terminate();
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// API server outage.

/// The API server is stopped for 20 s and started again. The test runs a cluster of its own,
/// so the outage does not hit other tests or tools using the shared one.
///
/// Nothing can be written while the API server is down, so the objects "changed during the
/// outage" are changed at its edges: just before it stops (their reconciles run into the
/// outage) and at once after it is back, while the manager's watches are still backing off.
/// The lease is long enough to ride out the outage: with the defaults (renew deadline 10 s) a
/// leader cut off for 20 s gives up and exits, and the kubelet restarts it, as client-go-based
/// managers do.
#[tokio::test]
async fn survives_a_20s_apiserver_outage_and_converges() -> Result<()> {
    let _serial = CLUSTER_TESTS.lock().await;
    let private = testkit::PrivateCluster::start("manager-outage").await?;
    let cluster = private.test();
    let identity = testkit::manager_kubeconfig(cluster, &testkit::deploy_dir()).await?;
    let namespace = TestNamespace::create(cluster, "mgr-outage").await?;
    let ns = namespace.name();
    let lease = testkit::unique_name("lease-outage");
    let timings = [
        "--lease-duration=60s",
        "--renew-deadline=45s",
        "--retry-period=2s",
    ];
    let mut m = Manager::start(
        &identity.path,
        &testkit::unique_name("manager"),
        &lease,
        &timings,
    )
    .await?;
    m.wait_leading(&lease, CONVERGE).await?;
    let api = memcacheds(cluster, ns);
    create_memcached(&api, "before", 1).await?;
    wait_converged(cluster, ns, "before", 1, CONVERGE).await?;

    set_size(&api, "before", 2).await?;
    create_memcached(&api, "edge", 1).await?;
    let stopped = Instant::now();
    let outage_began = k8s_openapi::jiff::Timestamp::now();
    private
        .local()
        .restart_apiserver(Duration::from_secs(20))
        .await?;
    // Ready by /readyz now; allow a moment for its authorization cache to serve every request.
    let outage_ended = k8s_openapi::jiff::Timestamp::now() + Duration::from_secs(5);
    println!(
        "the API server was away for {:.1}s (stopped 20s, then started)",
        stopped.elapsed().as_secs_f64()
    );

    // Right after: the test's own connections may need a retry.
    testkit::wait_for("creating Memcached after", CONVERGE, || async {
        if api.get_opt("after").await?.is_some() {
            return Ok(());
        }
        create_memcached(&api, "after", 2).await
    })
    .await?;
    testkit::wait_for("scaling Memcached before", CONVERGE, || {
        set_size(&api, "before", 3)
    })
    .await?;

    let back = Instant::now();
    let limit = Duration::from_secs(120);
    wait_converged(cluster, ns, "before", 3, limit).await?;
    wait_converged(cluster, ns, "edge", 1, limit).await?;
    wait_converged(cluster, ns, "after", 2, limit).await?;
    println!(
        "everything converged {:.1}s after the API server was back",
        back.elapsed().as_secs_f64()
    );

    ensure!(
        m.process.try_exit_status()?.is_none(),
        "the manager exited:\n{}",
        m.process.log_text()
    );
    ensure!(
        m.leading(&lease).await? == 1.0,
        "the manager no longer leads"
    );
    let (code, body) = http_get(m.probes, "/healthz").await?;
    ensure!(code == 200, "/healthz answered {code}: {body}");
    m.assert_never_forbidden_outside(outage_began, outage_ended)?;
    m.process.terminate();
    let status = m
        .process
        .wait_timeout(Duration::from_secs(35))
        .await?
        .context("no exit after SIGTERM")?;
    ensure!(status.success(), "exit status {status}");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Sharding.

/// `operator_manager_shard_slots` of `manager`, 0 when it does not answer (stopped).
async fn slots_of(manager: &Manager) -> f64 {
    match manager.metrics_text().await {
        Ok(text) => metric(&text, "operator_manager_shard_slots").unwrap_or(0.0),
        Err(_) => 0.0,
    }
}

/// Waits until `managers` own every slot between them, each at least one; how long it took.
async fn wait_all_slots_owned(managers: &[&Manager], timeout: Duration) -> Result<Duration> {
    let start = Instant::now();
    loop {
        let mut owned = Vec::new();
        for manager in managers {
            owned.push(slots_of(manager).await);
        }
        if owned.iter().sum::<f64>() == 64.0 && owned.iter().all(|n| *n > 0.0) {
            return Ok(start.elapsed());
        }
        if start.elapsed() > timeout {
            bail!("after {timeout:?} the replicas own {owned:?} slots of 64");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The replicas (by pod name) that wrote each Memcached's status in `ns` since `since`, as the
/// API server's audit log records them.
fn status_writers(
    fixture: &Fixture,
    since: k8s_openapi::jiff::Timestamp,
    pods: &[&str],
) -> Result<std::collections::BTreeMap<String, std::collections::BTreeSet<String>>> {
    let ns = fixture.ns.name();
    let files = fixture.cluster.state.audit_log_files()?;
    let events = testkit::read_audit_files_where(&files, |line| line.contains(ns))?;
    let mut writers: std::collections::BTreeMap<_, std::collections::BTreeSet<_>> =
        Default::default();
    for e in events.iter().filter(|e| {
        e.namespace == ns
            && e.resource == "memcacheds"
            && e.subresource == "status"
            && e.received >= since
            && e.succeeded()
    }) {
        let pod = pods
            .iter()
            .find(|pod| e.user_agent.contains(&format!("({pod}_")))
            .map_or_else(|| e.user_agent.clone(), |pod| (*pod).to_owned());
        writers.entry(e.name.clone()).or_default().insert(pod);
    }
    Ok(writers)
}

/// Fails unless every object of `names` was written by exactly one replica.
fn ensure_one_writer_each(
    writers: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
    names: &[String],
    what: &str,
) -> Result<()> {
    for name in names {
        let by = writers.get(name).cloned().unwrap_or_default();
        ensure!(by.len() == 1, "{what}: Memcached {name} written by {by:?}");
    }
    Ok(())
}

#[tokio::test]
async fn sharded_replicas_each_reconcile_a_share_and_hand_it_over() -> Result<()> {
    let fixture = fixture("mgr-shards").await?;
    // The shared cluster's API server runs with the ShardedListAndWatch gate.
    sharded_replicas(&fixture, true).await
}

#[tokio::test]
async fn sharded_replicas_filter_what_an_api_server_without_sharded_lists_sends() -> Result<()> {
    let serial = CLUSTER_TESTS.lock().await;
    let private = testkit::PrivateCluster::start_without_sharded_lists("mgr-shards-whole").await?;
    let cluster = private.test().clone();
    let identity = testkit::manager_kubeconfig(&cluster, &testkit::deploy_dir()).await?;
    let ns = TestNamespace::create(&cluster, "mgr-shards").await?;
    let fixture = Fixture {
        _serial: serial,
        cluster,
        ns,
        identity,
    };
    sharded_replicas(&fixture, false).await
}

/// Three replicas of a sharded manager on `fixture`'s cluster, whose API server selects by
/// shard or not (`server_side`): they split the objects, one joins, one leaves, one crashes.
async fn sharded_replicas(fixture: &Fixture, server_side: bool) -> Result<()> {
    let group = testkit::unique_name("shards");
    let names: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|n| testkit::unique_name(&format!("shard-{n}")))
        .collect();
    let pods: Vec<&str> = names.iter().map(String::as_str).collect();
    let lease = Duration::from_secs(4);
    let a = start_sharded(fixture, pods[0], &group).await?;
    let b = start_sharded(fixture, pods[1], &group).await?;
    wait_all_slots_owned(&[&a, &b], CONVERGE).await?;

    // Each object is reconciled by exactly one replica.
    let api = memcacheds(&fixture.cluster, fixture.ns.name());
    let objects: Vec<String> = (0..18).map(|i| format!("cache-{i}")).collect();
    let converge_all = |size: i32| {
        let (cluster, ns, objects) = (&fixture.cluster, fixture.ns.name(), &objects);
        async move {
            for object in objects {
                wait_converged(cluster, ns, object, size, CONVERGE).await?;
            }
            anyhow::Ok(())
        }
    };
    let created = k8s_openapi::jiff::Timestamp::now();
    for object in &objects {
        create_memcached(&api, object, 1).await?;
    }
    converge_all(1).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    ensure_one_writer_each(
        &status_writers(fixture, created, &pods)?,
        &objects,
        "two replicas",
    )?;

    // A third joins: the two give up what exceeds their new share, and it takes that.
    let asked = Instant::now();
    let c = start_sharded(fixture, pods[2], &group).await?;
    let ready = asked.elapsed();
    let joined = wait_all_slots_owned(&[&a, &b, &c], CONVERGE).await? + ready;
    println!(
        "scale-up: three replicas owned every slot {:.3}s after the third started, {:.3}s after it was ready",
        joined.as_secs_f64(),
        (joined - ready).as_secs_f64()
    );
    ensure!(
        joined - ready < Duration::from_secs(1),
        "the join took {joined:?}"
    );
    let scaled = k8s_openapi::jiff::Timestamp::now();
    for object in &objects {
        set_size(&api, object, 2).await?;
    }
    converge_all(2).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let writers = status_writers(fixture, scaled, &pods)?;
    ensure_one_writer_each(&writers, &objects, "three replicas")?;
    let shares: Vec<usize> = pods
        .iter()
        .map(|pod| writers.values().filter(|by| by.contains(*pod)).count())
        .collect();
    println!("objects per replica: {shares:?}");
    for manager in [&a, &b, &c] {
        let text = manager.metrics_text().await?;
        ensure!(
            metric(&text, "operator_manager_shard_member") == Some(1.0),
            "{} is not a member",
            manager.name
        );
        let expected = if server_side { 1.0 } else { 0.0 };
        ensure!(
            metric(&text, "operator_manager_shard_server_side") == Some(expected),
            "{} did not find whether the API server lists by shard",
            manager.name
        );
        ensure!(
            text.contains("operator_manager_shard_ranges{"),
            "{} shows no ranges",
            manager.name
        );
    }

    // SIGTERM on the third: the two others own its slots within a second.
    let mut c = c;
    let sent = Instant::now();
    c.process.terminate();
    let handover = wait_all_slots_owned(&[&a, &b], CONVERGE).await?;
    println!(
        "SIGTERM: the others owned every slot {:.3}s after the signal",
        handover.as_secs_f64()
    );
    ensure!(
        handover < Duration::from_secs(1),
        "graceful handover took {handover:?}"
    );
    let status = c
        .process
        .wait_timeout(Duration::from_secs(35))
        .await?
        .context("the replica did not exit after SIGTERM")?;
    ensure!(
        status.success(),
        "it exited with {status}:\n{}",
        c.process.log_text()
    );
    println!(
        "it exited 0 {:.3}s after SIGTERM",
        sent.elapsed().as_secs_f64()
    );
    // Its member Lease, released, is deleted by the others.
    let member = format!("{group}-member-{}", pods[2]);
    testkit::wait_for(
        "the member Lease it left to be deleted",
        CONVERGE,
        || async {
            let names: Vec<String> = leases(fixture)
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?
                .items
                .into_iter()
                .filter_map(|lease| lease.metadata.name)
                .filter(|name| name.starts_with(&member))
                .collect();
            if names.is_empty() {
                Ok(())
            } else {
                Err(format!("still there: {names:?}"))
            }
        },
    )
    .await?;
    let scaled = k8s_openapi::jiff::Timestamp::now();
    for object in &objects {
        set_size(&api, object, 3).await?;
    }
    converge_all(3).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let writers = status_writers(fixture, scaled, &pods)?;
    ensure_one_writer_each(&writers, &objects, "two replicas after a SIGTERM")?;
    ensure!(
        writers.values().all(|by| !by.contains(pods[2])),
        "the replica that left wrote: {writers:?}"
    );

    // SIGKILL on the second: the first's objects never pause, and the second's are taken once
    // its member Lease runs out.
    let kept = writers
        .iter()
        .find(|(_, by)| by.contains(pods[0]))
        .map(|(name, _)| name.clone())
        .context("the first replica writes no object")?;
    let lost: Vec<String> = writers
        .iter()
        .filter(|(_, by)| by.contains(pods[1]))
        .map(|(name, _)| name.clone())
        .collect();
    let mut b = b;
    let crashed = Instant::now();
    b.process.kill().await?;
    let scaled = k8s_openapi::jiff::Timestamp::now();
    set_size(&api, &kept, 4).await?;
    wait_converged(&fixture.cluster, fixture.ns.name(), &kept, 4, CONVERGE).await?;
    let unpaused = crashed.elapsed();
    println!(
        "SIGKILL: the survivor's own {kept} converged {:.3}s after the crash",
        unpaused.as_secs_f64()
    );
    ensure!(
        unpaused < lease / 2,
        "the survivor's object waited {unpaused:?}"
    );
    for object in &lost {
        set_size(&api, object, 4).await?;
    }
    let taken = wait_slots(&a, 64.0, CONVERGE).await? + unpaused;
    println!(
        "SIGKILL: the survivor owned every slot {:.3}s after the crash (lease duration {lease:?})",
        taken.as_secs_f64()
    );
    ensure!(
        taken < lease + Duration::from_secs(1),
        "the takeover took {taken:?}"
    );
    for object in &lost {
        wait_converged(&fixture.cluster, fixture.ns.name(), object, 4, CONVERGE).await?;
    }
    println!(
        "the crashed replica's {} objects converged {:.3}s after the crash",
        lost.len(),
        crashed.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let writers = status_writers(fixture, scaled, &pods)?;
    ensure_one_writer_each(&writers, &lost, "after a SIGKILL")?;
    for manager in [&a, &b, &c] {
        manager.assert_never_forbidden()?;
    }
    let mut a = a;
    a.process.terminate();
    a.process
        .wait_timeout(Duration::from_secs(35))
        .await?
        .context("the survivor did not exit after SIGTERM")?;

    // Each replica listed and watched its own Memcacheds by shard where the API server can (the
    // audit log records a watch once it has ended), and never asked one that cannot.
    let files = fixture.cluster.state.audit_log_files()?;
    let events = testkit::read_audit_files_where(&files, |line| line.contains("shardSelector"))?;
    for pod in &pods {
        let selected = events.iter().any(|e| {
            e.resource == "memcacheds"
                && matches!(e.verb.as_str(), "list" | "watch")
                && e.user_agent.contains(&format!("({pod}_"))
                && e.request_uri.contains("shardSelector=shardRange")
        });
        ensure!(
            selected == server_side,
            "{pod} listed or watched Memcacheds by shard: {selected}, where the API server can: {server_side}"
        );
    }

    // Each child carries its owner's slot, and each replica listed and watched the children of
    // its own slots only, by that label, whether the API server lists by shard or not.
    let deployments: Api<Deployment> =
        Api::namespaced(fixture.cluster.client.clone(), fixture.ns.name());
    for object in &objects {
        let uid = api.get(object).await?.metadata.uid.unwrap_or_default();
        let deployment = deployments.get(object).await?;
        let expected = kube_operator_runtime::slots::slot_of_uid(&uid).to_string();
        let slot_of = |labels: Option<std::collections::BTreeMap<String, String>>| {
            labels
                .unwrap_or_default()
                .remove(kube_operator_runtime::labels::SHARD_SLOT)
        };
        // Its pods' template too: each replica watches the pods of its own slots.
        let template_labels =
            (deployment.spec.template.metadata.clone()).and_then(|metadata| metadata.labels);
        for (what, slot) in [
            ("Deployment", slot_of(deployment.metadata.labels)),
            ("pod template", slot_of(template_labels)),
        ] {
            ensure!(
                slot.as_deref() == Some(expected.as_str()),
                "the {what} of {object} is labelled with slot {slot:?}, not {expected}"
            );
        }
    }
    let by_slot = testkit::read_audit_files_where(&files, |line| line.contains("shard-slot"))?;
    for pod in &pods {
        for resource in ["deployments", "pods"] {
            let selected = by_slot.iter().any(|e| {
                e.resource == resource
                    && matches!(e.verb.as_str(), "list" | "watch")
                    && e.user_agent.contains(&format!("({pod}_"))
                    && e.request_uri.contains("shard-slot")
            });
            ensure!(selected, "{pod} never listed or watched {resource} by slot");
        }
    }
    Ok(())
}

/// Starts a replica of the sharded manager `group`, with a 4 s lease.
async fn start_sharded(fixture: &Fixture, name: &str, group: &str) -> Result<Manager> {
    let flags = [
        "--sharding",
        "--lease-duration=4s",
        "--renew-deadline=3s",
        "--retry-period=1s",
    ];
    Manager::start(&fixture.identity.path, name, group, &flags).await
}

/// Waits until `manager` owns `slots` slots.
async fn wait_slots(manager: &Manager, slots: f64, timeout: Duration) -> Result<Duration> {
    let start = Instant::now();
    while slots_of(manager).await != slots {
        if start.elapsed() > timeout {
            bail!(
                "{} owns {} slots, not {slots}, after {timeout:?}",
                manager.name,
                slots_of(manager).await
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(start.elapsed())
}
