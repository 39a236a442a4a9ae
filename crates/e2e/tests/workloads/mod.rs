//! What the Memcached and MyApp end-to-end tests share: a namespace, the real manager running
//! with only the generated RBAC, and waits on what the controllers report.

#![allow(dead_code)] // Each test binary uses a different part of this module.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, ListParams};
use testkit::{ManagerProcess, PodSecurity, TestCluster, TestNamespace};

/// How long any convergence may take on a loaded two-core machine.
pub const TIMEOUT: Duration = Duration::from_secs(120);

/// What a test's manager watches. The tests of one binary run side by side, each with a
/// manager of its own: managers that run the same controller across the cluster would each
/// reconcile the others' objects too, so a test watches its own namespace unless its
/// controller needs more.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Every namespace, as a manager installed cluster-wide does.
    Cluster,
    /// The test's namespace only (`--namespace`).
    Namespace,
}

/// One test's world: the cluster, a namespace of its own and a manager.
pub struct Env {
    pub cluster: TestCluster,
    pub ns: TestNamespace,
    pub manager: ManagerProcess,
    /// The manager's metrics port on 127.0.0.1.
    pub metrics_port: u16,
}

impl Env {
    /// A namespace named after `prefix` (enforcing `pod_security` if given) and the manager
    /// running `controllers` (`*` for all) as its ServiceAccount, watching `scope`.
    pub async fn start(
        prefix: &str,
        pod_security: Option<PodSecurity>,
        controllers: &str,
        scope: Scope,
    ) -> Result<Self> {
        let cluster = testkit::cluster().await?;
        let ns = match pod_security {
            Some(level) => TestNamespace::with_pod_security(&cluster, prefix, level).await?,
            None => TestNamespace::create(&cluster, prefix).await?,
        };
        Self::in_namespace(cluster, ns, controllers, scope).await
    }

    /// Like [`Env::start`], in a namespace whose pods run as real containers on the cluster's
    /// real node, under the `restricted` Pod Security Standard.
    pub async fn on_real_node(prefix: &str, controllers: &str, scope: Scope) -> Result<Self> {
        let cluster = testkit::cluster().await?;
        let ns = TestNamespace::on_real_node(&cluster, prefix, PodSecurity::Restricted).await?;
        Self::in_namespace(cluster, ns, controllers, scope).await
    }

    async fn in_namespace(
        cluster: TestCluster,
        ns: TestNamespace,
        controllers: &str,
        scope: Scope,
    ) -> Result<Self> {
        let identity = testkit::manager_kubeconfig(&cluster, &testkit::deploy_dir()).await?;
        let controllers = format!("--controllers={controllers}");
        let namespace = format!("--namespace={}", ns.name());
        let mut args = vec![controllers.as_str()];
        if scope == Scope::Namespace {
            args.push(&namespace);
        }
        Self::with_manager(cluster, ns, &identity.path, &args).await
    }

    /// The manager, with the identity of `kubeconfig` and `args` besides its test settings,
    /// for the objects of `ns`.
    pub async fn with_manager(
        cluster: TestCluster,
        ns: TestNamespace,
        kubeconfig: &std::path::Path,
        args: &[&str],
    ) -> Result<Self> {
        wait_for_crds(&cluster).await?;
        let metrics_port = testkit::free_port()?;
        let metrics = format!("--metrics-bind-address=127.0.0.1:{metrics_port}");
        let mut all = vec![
            metrics.as_str(),
            "--health-probe-bind-address=0",
            "--leader-elect=false",
        ];
        all.extend_from_slice(args);
        let manager =
            testkit::spawn_manager(kubeconfig, &all, &[("RUST_LOG", "info,controllers=debug")])
                .await?;
        Ok(Self {
            cluster,
            ns,
            manager,
            metrics_port,
        })
    }

    /// The namespace's name.
    pub fn namespace(&self) -> &str {
        self.ns.name()
    }

    /// An API for namespaced objects of this test, as administrator.
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = kube::core::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.cluster.client.clone(), self.namespace())
    }

    /// Ends the test: on failure, the manager's log is printed with the error, and the manager
    /// is asked to stop.
    pub fn finish(self, result: Result<()>) -> Result<()> {
        self.manager.terminate();
        result.with_context(|| {
            format!(
                "manager log ({}):\n{}",
                self.manager.log().display(),
                tail(&self.manager.log_text(), 150)
            )
        })
    }

    /// Runs kubectl against the cluster as administrator in this test's namespace; fails
    /// unless it succeeds.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        let out = self
            .cluster
            .kubectl()
            .arg("--namespace")
            .arg(self.namespace())
            .args(args)
            .output()?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            bail!(
                "kubectl {} failed: {}{}",
                args.join(" "),
                stdout,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(stdout)
    }

    /// The names (sorted) and phases of the pods labelled `selector`, leaving out pods being
    /// deleted.
    pub async fn pods(&self, selector: &str) -> Result<BTreeMap<String, String>> {
        let pods = self
            .api::<Pod>()
            .list(&ListParams::default().labels(selector))
            .await?;
        Ok(pods
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(|p| {
                let phase = p.status.and_then(|s| s.phase).unwrap_or_default();
                (p.metadata.name.unwrap_or_default(), phase)
            })
            .collect())
    }

    /// Waits until exactly `count` pods labelled `selector` run, and returns their names.
    pub async fn wait_for_running_pods(&self, selector: &str, count: usize) -> Result<Vec<String>> {
        let what = format!("{count} running pods labelled {selector}");
        Ok(testkit::wait_for(&what, TIMEOUT, || async {
            let pods = self.pods(selector).await.map_err(|e| e.to_string())?;
            let running = pods.values().filter(|phase| *phase == "Running").count();
            if pods.len() == count && running == count {
                Ok(pods.into_keys().collect::<Vec<_>>())
            } else {
                Err(format!("pods: {pods:?}"))
            }
        })
        .await?)
    }

    /// Waits until the Deployment `name` exists and `check` accepts it.
    pub async fn wait_for_deployment(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&Deployment) -> bool,
    ) -> Result<Deployment> {
        let deployments = self.api::<Deployment>();
        Ok(
            testkit::wait_for(&format!("Deployment {name}: {what}"), TIMEOUT, || async {
                match deployments.get_opt(name).await {
                    Ok(Some(d)) if check(&d) => Ok(d),
                    Ok(Some(d)) => {
                        Err(format!("spec {:?}, status {:?}", d.spec.replicas, d.status))
                    }
                    Ok(None) => Err("not found".to_owned()),
                    Err(e) => Err(e.to_string()),
                }
            })
            .await?,
        )
    }

    /// Waits for an Event about the object `name` with `reason`, and returns its note.
    pub async fn wait_for_event(&self, name: &str, reason: &str) -> Result<String> {
        Self::event_in(self.api::<Event>(), name, reason).await
    }

    /// Like [`Env::wait_for_event`], for a cluster-scoped object: its Events are recorded in
    /// the `default` namespace.
    pub async fn wait_for_cluster_event(&self, name: &str, reason: &str) -> Result<String> {
        let events = Api::namespaced(self.cluster.client.clone(), "default");
        Self::event_in(events, name, reason).await
    }

    async fn event_in(events: Api<Event>, name: &str, reason: &str) -> Result<String> {
        Ok(testkit::wait_for(
            &format!("an Event {reason} about {name}"),
            TIMEOUT,
            || async {
                let list = events
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?;
                list.items
                    .into_iter()
                    .find(|e| {
                        e.reason.as_deref() == Some(reason)
                            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                    })
                    .map(|e| e.note.unwrap_or_default())
                    .ok_or_else(|| "no such event yet".to_owned())
            },
        )
        .await?)
    }

    /// The manager's `/metrics` text.
    pub async fn metrics(&self) -> Result<String> {
        let port = self.metrics_port;
        tokio::task::spawn_blocking(move || http_get(port, "/metrics")).await?
    }
}

/// `condition` of `conditions` with its status, reason and message, for messages.
pub fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether `conditions` hold `type_` with `status`.
pub fn has_condition(conditions: &[Condition], type_: &str, status: &str) -> bool {
    condition(conditions, type_).is_some_and(|c| c.status == status)
}

/// The last `lines` lines of `text`.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Waits until the API server serves the CRDs (they may have just been installed).
pub async fn wait_for_crds(cluster: &TestCluster) -> Result<()> {
    let memcacheds: Api<apis::Memcached> = Api::all(cluster.client.clone());
    let myapps: Api<apis::MyApp> = Api::all(cluster.client.clone());
    testkit::wait_for("the CRDs to be served", TIMEOUT, || async {
        memcacheds.list(&ListParams::default().limit(1)).await?;
        myapps.list(&ListParams::default().limit(1)).await?;
        Ok::<_, kube::Error>(())
    })
    .await?;
    Ok(())
}

/// A plain HTTP/1.0 GET on 127.0.0.1 (enough for `/metrics`; no HTTP client dependency).
fn http_get(port: u16, path: &str) -> Result<String> {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or((response.as_str(), ""));
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        bail!("GET {path}: {head}");
    }
    Ok(body.to_owned())
}

/// The value of the sample `name{labels}` in Prometheus text, if present.
pub fn sample(metrics: &str, name_and_labels: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let rest = line.strip_prefix(name_and_labels)?;
        rest.trim().parse().ok()
    })
}
