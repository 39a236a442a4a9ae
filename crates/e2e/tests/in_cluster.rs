//! The manager as users run it: its image loaded on the real node, installed with the
//! single-file installer (`kubectl apply -f dist/install.yaml`) until the tutorial's sample
//! converges, then removed and installed with `kubectl apply -k deploy/`, probed by the kubelet, configured from its mounted
//! ServiceAccount token, two replicas electing one leader, every replica serving the admission
//! webhooks through their Service with the certificate the replicas provisioned.
//!
//! The installation is cluster-wide (`operator-system`, the ClusterRole), so this binary runs
//! one scenario from start to end. The in-cluster manager also reconciles the objects of tests
//! running at the same time; like their own managers, it applies the same desired state.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use apis::{Memcached, MemcachedSpec};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use testkit::{PodSecurity, TestCluster, TestNamespace};

/// Where the generated manifests install the manager.
const NAMESPACE: &str = product::namespace!();
/// The manager's Deployment (and its pods' `app.kubernetes.io/name`).
const MANAGER: &str = product::name!();
/// The Lease the replicas elect a leader with.
const LEASE: &str = concat!(product::name!(), "-leader");
/// The image `cargo xtask image manager --load` builds.
const MANAGER_IMAGE: &str = product::name!();
/// The memcached image built from the distribution's package.
const MEMCACHED_IMAGE: &str = concat!(product::name!(), ".local/memcached");
/// Pods of the manager.
const MANAGER_PODS: &str = concat!("app.kubernetes.io/name=", product::name!());
/// The generated Deployment's secure metrics port.
const METRICS_PORT: u16 = 8443;
/// Generous: real containers start on a loaded two-core machine.
const TIMEOUT: Duration = Duration::from_secs(180);

#[tokio::test]
async fn the_manager_runs_in_cluster_as_users_install_it() -> Result<()> {
    let cluster = testkit::cluster().await?;
    cluster.loaded_image(MANAGER_IMAGE, "manager")?;
    let memcached_image = cluster.loaded_image(MEMCACHED_IMAGE, "memcached")?;

    let result = scenario(&cluster, &memcached_image).await;
    let report = if result.is_err() {
        cluster.pods_report(NAMESPACE, MANAGER_PODS)
    } else {
        String::new()
    };
    // Stop the manager's pods whatever happened; the CRDs and RBAC stay, as other tests use them.
    let removed = uninstall(&cluster).await;
    result.with_context(|| report)?;
    removed
}

/// How a scraper verifies the replicas' metrics, as the generated ServiceMonitor's `tlsConfig`
/// says: the `ca.crt` of the Secret the manager provisions, and the metrics Service's name.
async fn metrics_tls(cluster: &TestCluster) -> Result<testkit::TargetTls> {
    use product::{
        METRICS_SERVICE as METRICS_SERVICE_NAME, WEBHOOK_CERT_SECRET as CERT_SECRET_NAME,
    };
    let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    let secret = secrets.get(CERT_SECRET_NAME).await?;
    let ca = secret
        .data
        .and_then(|mut data| data.remove("ca.crt"))
        .context("the webhook certificates' Secret holds no ca.crt")?;
    Ok(testkit::TargetTls {
        ca: String::from_utf8(ca.0)?,
        server_name: METRICS_SERVICE_NAME.to_owned(),
    })
}

async fn scenario(cluster: &TestCluster, memcached_image: &str) -> Result<()> {
    let started = Instant::now();
    install(cluster, Installer::SingleFile).await?;
    {
        let ns = TestNamespace::on_real_node(cluster, "installer", PodSecurity::Restricted).await?;
        apply_sample(cluster, &ns, memcached_image)?;
        converged_all(cluster, ns.name(), &[("memcached-sample", 3)]).await?;
        // The namespace goes with its pods as it drops.
    }
    uninstall(cluster).await?;
    println!(
        "dist/install.yaml: installed, the sample converged, removed ({:.1}s)",
        started.elapsed().as_secs_f64()
    );

    let started = Instant::now();
    install(cluster, Installer::Kustomize).await?;
    let leader = wait_for_one_leader(cluster, None).await?;
    println!(
        "installed: 2 replicas Ready through the kubelet's probes, {leader} leads ({:.1}s)",
        started.elapsed().as_secs_f64()
    );
    check_pod_security(cluster).await?;

    // Prometheus verifies the replicas' metrics certificates as the generated ServiceMonitor
    // says: with the CA bundle of the webhook certificates' Secret, for the metrics Service.
    let prometheus =
        testkit::Prometheus::start(cluster, NAMESPACE, &metrics_tls(cluster).await?).await?;
    // Watch every replica's own view of leadership for the rest of the scenario, reading its
    // secure metrics with the token of Prometheus (which holds the metrics-reader role).
    let watch = LeaderWatch::start(cluster.clone(), prometheus.token().to_owned());
    wait_for_scrapes(&prometheus).await?;
    let reconciles = "sum(controller_runtime_reconcile_total{controller=\"memcached\"})";
    let before = total(&prometheus, reconciles).await?;
    println!("Prometheus discovered and scrapes both replicas; {reconciles} = {before}");
    refuses_strangers(cluster).await?;

    let ns = TestNamespace::on_real_node(cluster, "in-cluster", PodSecurity::Restricted).await?;
    tutorial(cluster, &ns, memcached_image).await?;
    println!(
        "the tutorial flow converged ({:.1}s)",
        started.elapsed().as_secs_f64()
    );
    admission_through_the_service(cluster, &ns).await?;
    println!(
        "admission: the API server called the webhooks through their Service, trusting the provisioned CA"
    );
    let after = testkit::wait_for(
        "Prometheus to see the Memcached reconciles",
        Duration::from_secs(60),
        || async {
            match total(&prometheus, reconciles).await {
                Ok(after) if after > before => Ok(after),
                Ok(after) => Err(format!("still {after}")),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await?;
    println!("through Prometheus: {reconciles} rose from {before} to {after}");

    // Handovers with work in flight: three Memcacheds created before, resized during.
    let mcs = Api::<Memcached>::namespaced(cluster.client.clone(), ns.name());
    for (i, name) in ["handover-a", "handover-b", "handover-c"]
        .iter()
        .enumerate()
    {
        let size = i32::try_from(i)? + 1;
        mcs.create(
            &PostParams::default(),
            &memcached(name, size, memcached_image),
        )
        .await?;
    }

    let before = leader.clone();
    cluster_kubectl(
        cluster,
        &[
            "rollout",
            "restart",
            &format!("deployment/{MANAGER}"),
            "-n",
            NAMESPACE,
        ],
    )?;
    resize(&mcs, &[("handover-a", 2), ("handover-b", 1)]).await?;
    cluster_kubectl(
        cluster,
        &[
            "rollout",
            "status",
            &format!("deployment/{MANAGER}"),
            "-n",
            NAMESPACE,
            "--timeout=180s",
        ],
    )?;
    let leader = wait_for_one_leader(cluster, Some(&before)).await?;
    converged_all(
        cluster,
        ns.name(),
        &[("handover-a", 2), ("handover-b", 1), ("handover-c", 3)],
    )
    .await?;
    println!(
        "rollout restart: leadership went from {before} to {leader}, every Memcached converged"
    );

    let before = leader;
    Api::<Pod>::namespaced(cluster.client.clone(), NAMESPACE)
        .delete(&before, &DeleteParams::default())
        .await?;
    resize(&mcs, &[("handover-c", 1)]).await?;
    let leader = wait_for_one_leader(cluster, Some(&before)).await?;
    converged_all(
        cluster,
        ns.name(),
        &[("handover-a", 2), ("handover-b", 1), ("handover-c", 1)],
    )
    .await?;
    println!(
        "deleting the leader pod: leadership went from {before} to {leader}, every Memcached converged"
    );

    let before = leader;
    let (restarted, leader) = partition_leader(cluster, &before).await?;
    println!(
        "a leader cut off from the API server: the kubelet restarted it after {restarted:.1}s, \
         {leader} leads"
    );
    wait_for_ready_replicas(cluster).await?;

    let before = leader;
    let (restarted, leader) = freeze_leader(cluster, &before).await?;
    println!(
        "a frozen leader: the kubelet's liveness probe failed and it restarted the container \
         after {restarted:.1}s, {leader} leads"
    );
    wait_for_ready_replicas(cluster).await?;

    let seen = watch.stop();
    ensure!(
        seen.most_leaders <= 1,
        "{} replicas reported leading at the same time",
        seen.most_leaders
    );
    ensure!(seen.samples > 0, "no replica's metrics could be read");
    println!(
        "never two leaders: {} samples of every replica's leader_election_master_status",
        seen.samples
    );
    Ok(())
}

/// Cuts the leader pod off from the API server until the kubelet has restarted its container
/// (it cannot renew its Lease) and the standby leads, then lets it reconnect. Returns how long
/// the restart took, and the new leader.
///
/// The partition stays until the standby leads: the restarted container keeps its pod name,
/// which is its identity, so reconnected before the Lease expired it would take its own Lease
/// back.
async fn partition_leader(cluster: &TestCluster, leader: &str) -> Result<(f64, String)> {
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    let pod = pods.get(leader).await?;
    let ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .context("the leader has no IP")?;
    let before = restart_count(&pod);
    let api_port = cluster
        .state
        .server
        .rsplit(':')
        .next()
        .and_then(|p| p.parse::<u16>().ok())
        .context("the API server URL has no port")?;
    let started = Instant::now();
    let cut = Partition::cut(&ip, api_port)?;
    testkit::wait_for(
        "the kubelet to restart the leader that cannot renew its Lease",
        TIMEOUT,
        || async {
            let pod = pods.get(leader).await.map_err(|e| e.to_string())?;
            let now = restart_count(&pod);
            if now > before {
                Ok(())
            } else {
                Err(format!("{now} restarts"))
            }
        },
    )
    .await?;
    let took = started.elapsed().as_secs_f64();
    let new_leader = wait_for_one_leader(cluster, Some(leader)).await?;
    drop(cut);
    Ok((took, new_leader))
}

/// Freezes the leader's process (SIGSTOP, as a wedged process or a paused VM would be): it
/// answers no probe and renews nothing, so the standby takes the Lease once it expires and the
/// kubelet's liveness probe fails until it restarts the container. Returns how long the restart
/// took, and the new leader.
async fn freeze_leader(cluster: &TestCluster, leader: &str) -> Result<(f64, String)> {
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    let pod = pods.get(leader).await?;
    let uid = pod
        .metadata
        .uid
        .clone()
        .context("the leader pod has no uid")?;
    let before = restart_count(&pod);
    let pid = manager_process(&uid)?;
    let started = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGSTOP,
    )?;
    let new_leader = wait_for_one_leader(cluster, Some(leader)).await?;
    testkit::wait_for(
        "the kubelet to restart the frozen leader",
        TIMEOUT,
        || async {
            let pod = pods.get(leader).await.map_err(|e| e.to_string())?;
            match restart_count(&pod) {
                now if now > before => Ok(()),
                now => Err(format!("{now} restarts")),
            }
        },
    )
    .await
    .inspect_err(|_| {
        // Never leave it frozen.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGCONT,
        );
    })?;
    let took = started.elapsed().as_secs_f64();
    let events = cluster_kubectl(
        cluster,
        &[
            "get",
            "events",
            "-n",
            NAMESPACE,
            "--field-selector",
            &format!("involvedObject.name={leader},reason=Unhealthy"),
            "-o",
            "jsonpath={.items[*].message}",
        ],
    )?;
    ensure!(
        events.contains("Liveness probe failed"),
        "the restart of {leader} was not the liveness probe's: events {events:?}"
    );
    Ok((took, new_leader))
}

/// The `/manager` process of the pod with `uid`, found through its cgroup.
fn manager_process(uid: &str) -> Result<i32> {
    // cgroupfs paths name the pod as `pod<uid>`; the systemd driver writes `_` for `-`.
    let names = [format!("pod{uid}"), format!("pod{}", uid.replace('-', "_"))];
    for entry in std::fs::read_dir("/proc")? {
        let Some(pid) = entry?
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let program = cmdline.split(|b| *b == 0).next().unwrap_or_default();
        if program == b"/manager" && names.iter().any(|n| cgroup.contains(n.as_str())) {
            return Ok(pid);
        }
    }
    bail!("no /manager process in the cgroup of pod {uid}")
}

fn restart_count(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.first())
        .map_or(0, |c| c.restart_count)
}

/// An iptables rule that drops a pod's packets to the API server (they arrive at the node's
/// forwarder, on this host), removed when dropped.
struct Partition {
    rule: Vec<String>,
}

impl Partition {
    fn cut(pod_ip: &str, api_port: u16) -> Result<Self> {
        let rule: Vec<String> = [
            "INPUT",
            "-s",
            pod_ip,
            "-p",
            "tcp",
            "--dport",
            &api_port.to_string(),
            "-m",
            "comment",
            "--comment",
            "e2e: a leader cut off from the API server",
            "-j",
            "DROP",
        ]
        .map(String::from)
        .to_vec();
        let out = std::process::Command::new("iptables")
            .arg("-I")
            .args(&rule)
            .output()?;
        ensure!(
            out.status.success(),
            "iptables -I {}: {}",
            rule.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(Self { rule })
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        let removed = std::process::Command::new("iptables")
            .arg("-D")
            .args(&self.rule)
            .status();
        if !removed.is_ok_and(|s| s.success()) {
            eprintln!(
                "warning: could not remove iptables rule {}",
                self.rule.join(" ")
            );
        }
    }
}

/// Waits until both manager replicas are Ready again.
async fn wait_for_ready_replicas(cluster: &TestCluster) -> Result<()> {
    testkit::wait_for("both manager replicas Ready again", TIMEOUT, || async {
        let pods = manager_pods(cluster).await.map_err(|e| e.to_string())?;
        let ready = pods.iter().filter(|p| testkit::pod_ready(p)).count();
        if ready == 2 && pods.len() == 2 {
            Ok(())
        } else {
            Err(format!("{ready} of {} Ready", pods.len()))
        }
    })
    .await?;
    Ok(())
}

/// Waits until Prometheus scrapes every manager replica successfully.
async fn wait_for_scrapes(prometheus: &testkit::Prometheus) -> Result<()> {
    testkit::wait_for(
        "Prometheus to scrape both manager replicas",
        TIMEOUT,
        || async {
            let targets = prometheus.targets().await.map_err(|e| e.to_string())?;
            let managers: Vec<_> = targets
                .iter()
                .filter(|t| {
                    t.labels["pod"]
                        .as_str()
                        .is_some_and(|p| p.starts_with(MANAGER))
                })
                .collect();
            let up = managers.iter().filter(|t| t.health == "up").count();
            if up == 2 && managers.len() == 2 {
                Ok(())
            } else {
                Err(format!("targets: {managers:?}"))
            }
        },
    )
    .await
    .map_err(|e| prometheus.with_log(e))?;
    Ok(())
}

/// The value of a query that sums to one number (0 when it has no series yet).
async fn total(prometheus: &testkit::Prometheus, promql: &str) -> Result<f64> {
    Ok(prometheus
        .query(promql)
        .await?
        .first()
        .map_or(0.0, |(_, value)| *value))
}

/// The ways users install the manager.
#[derive(Clone, Copy, Debug)]
enum Installer {
    /// `kubectl apply -f dist/install.yaml`, what `make build-installer` gives Kubebuilder users.
    SingleFile,
    /// `kubectl apply -k deploy/`.
    Kustomize,
}

/// Installs the manager with `installer`, after marking the manager's namespace for the real
/// node (what a user's cluster needs no help with: it has only real nodes), and waits for both
/// replicas.
async fn install(cluster: &TestCluster, installer: Installer) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(cluster.client.clone());
    let marked = Namespace {
        metadata: ObjectMeta {
            name: Some(NAMESPACE.into()),
            annotations: Some(localcluster::node::namespace_annotations()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    namespaces
        .patch(
            NAMESPACE,
            &PatchParams::apply("e2e-real-node").force(),
            &Patch::Apply(&marked),
        )
        .await
        .context(concat!(
            "marking ",
            product::namespace!(),
            " for the real node"
        ))?;
    let deploy = testkit::deploy_dir();
    match installer {
        Installer::SingleFile => {
            let file = testkit::workspace_root().join("dist").join("install.yaml");
            cluster_kubectl(cluster, &["apply", "-f", &file.to_string_lossy()])?
        }
        Installer::Kustomize => {
            cluster_kubectl(cluster, &["apply", "-k", &deploy.to_string_lossy()])?
        }
    };

    let deployments: Api<Deployment> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    testkit::wait_for("both manager replicas Ready", TIMEOUT, || async {
        let d = deployments.get(MANAGER).await.map_err(|e| e.to_string())?;
        let status = d.status.unwrap_or_default();
        let want = d.spec.replicas.unwrap_or(1);
        if want == 2
            && status.ready_replicas == Some(2)
            && status.updated_replicas == Some(2)
            && status.replicas == Some(2)
        {
            Ok(())
        } else {
            Err(format!("status {status:?}"))
        }
    })
    .await?;
    for pod in manager_pods(cluster).await? {
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        ensure!(
            node.as_deref() == Some(localcluster::node::NODE_NAME),
            "manager pod {:?} runs on {node:?}, not the real node",
            pod.metadata.name
        );
    }
    Ok(())
}

/// Deletes the webhook configurations (with no manager to answer them, every later write of a
/// Memcached would be refused) and the manager's Deployment, and waits for its pods to go.
async fn uninstall(cluster: &TestCluster) -> Result<()> {
    for kind in [
        "mutatingwebhookconfiguration",
        "validatingwebhookconfiguration",
    ] {
        let name = if kind.starts_with("mutating") {
            product::MUTATING_CONFIGURATION
        } else {
            product::VALIDATING_CONFIGURATION
        };
        cluster_kubectl(cluster, &["delete", kind, name, "--ignore-not-found"])?;
    }
    let deployments: Api<Deployment> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    match deployments
        .delete(MANAGER, &DeleteParams::foreground())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    // The Deployment too: deleted in the foreground, it stays until its pods are gone, and an
    // install meanwhile would apply to the object on its way out.
    testkit::wait_for(
        "the manager's pods and Deployment to be gone",
        TIMEOUT,
        || async {
            let pods = manager_pods(cluster).await.map_err(|e| e.to_string())?;
            let deployment = deployments
                .get_opt(MANAGER)
                .await
                .map_err(|e| e.to_string())?;
            if pods.is_empty() && deployment.is_none() {
                Ok(())
            } else {
                Err(format!(
                    "{} pods left, the Deployment {}",
                    pods.len(),
                    if deployment.is_some() {
                        "still there"
                    } else {
                        "gone"
                    }
                ))
            }
        },
    )
    .await?;
    Ok(())
}

/// Both namespaces enforce the restricted Pod Security Standard, and both kinds of pods were
/// admitted under it (they run).
async fn check_pod_security(cluster: &TestCluster) -> Result<()> {
    let ns = Api::<Namespace>::all(cluster.client.clone())
        .get(NAMESPACE)
        .await?;
    let labels = ns.metadata.labels.unwrap_or_default();
    ensure!(
        labels
            .get("pod-security.kubernetes.io/enforce")
            .map(String::as_str)
            == Some("restricted"),
        "{NAMESPACE} does not enforce the restricted standard: {labels:?}"
    );
    Ok(())
}

/// The Operator SDK tutorial, against the in-cluster manager: the sample, a merge patch of
/// `spec.size`, a deleted pod replaced, hand scaling undone, deletion garbage-collecting.
/// `kubectl apply` of the tutorial's sample in `ns`, with `image`: the sample names the public
/// image, which cannot be pulled here.
/// Whether `error` is the API server failing to reach a webhook through its Service.
fn webhook_unreachable(error: &anyhow::Error) -> bool {
    let text = format!("{error:#}");
    text.contains("webhook")
        && (text.contains("connection refused") || text.contains("no endpoints available"))
}

fn apply_sample(cluster: &TestCluster, ns: &TestNamespace, image: &str) -> Result<()> {
    let sample = testkit::deploy_dir()
        .join("samples")
        .join("cache_v1alpha1_memcached.yaml");
    let namespace = ns.name();
    let sample = sample.to_string_lossy();
    let apply = ["--namespace", namespace, "apply", "-f", &sample];
    // Pods Ready are not yet a Service the API server reaches: its endpoints take a moment to
    // reach the node's proxy, and until then the conversion webhook's connection is refused,
    // as it would be for a user applying the sample right after the install.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match cluster_kubectl(cluster, &apply) {
            Ok(_) => break,
            Err(error) if Instant::now() < deadline && webhook_unreachable(&error) => {
                println!("the webhook Service does not answer yet; applying the sample again");
                std::thread::sleep(Duration::from_secs(1));
            }
            Err(error) => return Err(error),
        }
    }
    let patch = format!(r#"{{"spec":{{"image":"{image}"}}}}"#);
    cluster_kubectl(
        cluster,
        &[
            "--namespace",
            namespace,
            "patch",
            "memcached",
            "memcached-sample",
            "--type=merge",
            "-p",
            &patch,
        ],
    )?;
    Ok(())
}

async fn tutorial(cluster: &TestCluster, ns: &TestNamespace, image: &str) -> Result<()> {
    let kubectl = |args: &[&str]| -> Result<String> {
        let mut all = vec!["--namespace", ns.name()];
        all.extend_from_slice(args);
        cluster_kubectl(cluster, &all)
    };
    apply_sample(cluster, ns, image)?;
    converged_all(cluster, ns.name(), &[("memcached-sample", 3)]).await?;

    kubectl(&[
        "patch",
        "memcached",
        "memcached-sample",
        "--type=merge",
        "-p",
        r#"{"spec":{"size":2}}"#,
    ])?;
    let pods = converged_all(cluster, ns.name(), &[("memcached-sample", 2)]).await?;

    let victim = pods.first().context("no memcached pod")?.clone();
    kubectl(&["delete", "pod", &victim, "--wait=false"])?;
    // Converged again, with the victim gone from the status (right after the delete, the
    // status may still show it, converged, until the manager has seen the delete).
    let replaced_by = Instant::now() + TIMEOUT;
    loop {
        let after = converged_all(cluster, ns.name(), &[("memcached-sample", 2)]).await?;
        if !after.contains(&victim) {
            break;
        }
        ensure!(
            Instant::now() < replaced_by,
            "pod {victim} was not replaced: {after:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    kubectl(&["scale", "deployment", "memcached-sample", "--replicas=4"])?;
    let deployments: Api<Deployment> = Api::namespaced(cluster.client.clone(), ns.name());
    testkit::wait_for("the hand scaling to be undone", TIMEOUT, || async {
        let d = deployments
            .get("memcached-sample")
            .await
            .map_err(|e| e.to_string())?;
        match d.spec.replicas {
            Some(2) => Ok(()),
            other => Err(format!("replicas {other:?}")),
        }
    })
    .await?;
    converged_all(cluster, ns.name(), &[("memcached-sample", 2)]).await?;

    kubectl(&["delete", "memcached", "memcached-sample"])?;
    testkit::wait_for(
        "the Deployment to be garbage-collected",
        TIMEOUT,
        || async {
            match deployments.get_opt("memcached-sample").await {
                Ok(None) => Ok(()),
                Ok(Some(_)) => Err("still there".to_owned()),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await?;
    Ok(())
}

/// Through the webhook Service: a malformed image is refused with the field named, a blank one
/// is defaulted, and the object written through v1alpha1 is listed through both versions.
async fn admission_through_the_service(cluster: &TestCluster, ns: &TestNamespace) -> Result<()> {
    let apply = |name: &str, image: &str| -> Result<std::process::Output> {
        use std::io::Write as _;
        let group = product::group!(cache);
        let yaml = format!(
            "apiVersion: {group}/v1alpha1\nkind: Memcached\nmetadata:\n  name: {name}\nspec:\n  size: 0\n  image: {image:?}\n"
        );
        let mut child = cluster
            .kubectl()
            .args(["apply", "-n", ns.name(), "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(yaml.as_bytes())?;
        }
        Ok(child.wait_with_output()?)
    };
    let refused = apply("malformed", "memcached:1.6 -alpine")?;
    let said = String::from_utf8_lossy(&refused.stderr).into_owned();
    ensure!(
        !refused.status.success()
            && said.contains("Memcached \"malformed\" is invalid")
            && said.contains(
                "spec.image: Invalid value: \"memcached:1.6 -alpine\": not an image reference"
            ),
        "a malformed image was not refused by the validating webhook: {said}"
    );
    let defaulted = apply("blank-image", " ")?;
    ensure!(
        defaulted.status.success(),
        "a blank image was refused: {}",
        String::from_utf8_lossy(&defaulted.stderr)
    );
    let mcs: Api<Memcached> = Api::namespaced(cluster.client.clone(), ns.name());
    let image = mcs.get("blank-image").await?.spec.image;
    ensure!(
        image == apis::memcached::DEFAULT_IMAGE,
        "the blank image was not defaulted: {image:?}"
    );
    // The object was written through v1alpha1 and is stored as v1beta1: both versions list
    // it, converted by the manager's webhook through the Service.
    for version in ["v1alpha1", "v1beta1"] {
        let listed = cluster_kubectl(
            cluster,
            &[
                "get",
                &format!("memcacheds.{version}.{}", product::group!(cache)),
                "-n",
                ns.name(),
                "-o",
                "jsonpath={range .items[*]}{.apiVersion} {.metadata.name}{\"\\n\"}{end}",
            ],
        )?;
        ensure!(
            listed.contains(&format!("{}/{version} blank-image", product::group!(cache))),
            "kubectl get memcacheds.{version}: {listed}"
        );
    }
    mcs.delete("blank-image", &DeleteParams::default()).await?;
    Ok(())
}

fn memcached(name: &str, size: i32, image: &str) -> Memcached {
    Memcached::new(
        name,
        MemcachedSpec {
            size,
            image: image.to_owned(),
            ..Default::default()
        },
    )
}

async fn resize(mcs: &Api<Memcached>, sizes: &[(&str, i32)]) -> Result<()> {
    for (name, size) in sizes {
        let patch = serde_json::json!({ "spec": { "size": size } });
        mcs.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    Ok(())
}

/// Waits until every named Memcached has its size in Ready pods, in its status, for its
/// current generation; returns the pods of the first.
async fn converged_all(
    cluster: &TestCluster,
    namespace: &str,
    sizes: &[(&str, i32)],
) -> Result<Vec<String>> {
    let mcs: Api<Memcached> = Api::namespaced(cluster.client.clone(), namespace);
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), namespace);
    let what = format!("Memcacheds {sizes:?} to converge");
    Ok(testkit::wait_for(&what, TIMEOUT, || async {
        let mut first = None;
        for (name, size) in sizes {
            let mc = mcs.get(name).await.map_err(|e| e.to_string())?;
            let status = mc.status.clone().unwrap_or_default();
            let wanted = usize::try_from(*size).unwrap_or_default();
            let current = status.observed_generation == mc.metadata.generation;
            let listed = pods
                .list(&ListParams::default().labels(&format!("memcached_cr={name}")))
                .await
                .map_err(|e| e.to_string())?;
            let ready = listed
                .items
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none() && testkit::pod_ready(p))
                .count();
            if !(current
                && status.nodes.len() == wanted
                && status.ready_replicas == *size
                && ready == wanted)
            {
                return Err(format!(
                    "{name}: want {size}, status nodes {:?} ready {} observed {:?}/{:?}, {ready} ready pods",
                    status.nodes, status.ready_replicas, status.observed_generation, mc.metadata.generation
                ));
            }
            first.get_or_insert(status.nodes);
        }
        Ok(first.unwrap_or_default())
    })
    .await?)
}

async fn manager_pods(cluster: &TestCluster) -> Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    Ok(pods
        .list(&ListParams::default().labels(MANAGER_PODS))
        .await?
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect())
}

/// Waits until the Lease names a running, Ready manager pod (other than `not`, after a
/// handover), and returns it.
async fn wait_for_one_leader(cluster: &TestCluster, not: Option<&str>) -> Result<String> {
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    Ok(
        testkit::wait_for("one manager pod to hold the Lease", TIMEOUT, || async {
            let lease = leases.get(LEASE).await.map_err(|e| e.to_string())?;
            let identity = lease
                .spec
                .and_then(|s| s.holder_identity)
                .unwrap_or_default();
            let holder = testkit::identity_pod(&identity).to_owned();
            if holder.is_empty() || Some(holder.as_str()) == not {
                return Err(format!("holder {holder:?}"));
            }
            let pods = manager_pods(cluster).await.map_err(|e| e.to_string())?;
            let running = pods.iter().any(|p| {
                p.metadata.name.as_deref() == Some(holder.as_str()) && testkit::pod_ready(p)
            });
            if running {
                Ok(holder)
            } else {
                Err(format!("holder {holder} is not a Ready manager pod"))
            }
        })
        .await?,
    )
}

/// Every replica's metrics are served only to authorized scrapers: a token the API server does
/// not know gets 401.
async fn refuses_strangers(cluster: &TestCluster) -> Result<()> {
    for pod in manager_pods(cluster).await? {
        let ip: IpAddr = pod
            .status
            .and_then(|s| s.pod_ip)
            .context("a manager pod's IP")?
            .parse()?;
        let answer = testkit::https::get_with_token(ip, METRICS_PORT, "/metrics", "not-a-token")
            .await
            .map_err(anyhow::Error::msg)?;
        ensure!(answer.0 == 401, "{ip}: a forged token got {answer:?}");
    }
    println!("secure metrics: a forged token gets 401 from every replica");
    Ok(())
}

/// What [`LeaderWatch`] saw.
struct LeadersSeen {
    most_leaders: usize,
    samples: usize,
}

/// Polls every manager replica's `leader_election_master_status` in the background, counting
/// how many report leading at once.
struct LeaderWatch {
    stop: Arc<AtomicBool>,
    most: Arc<AtomicUsize>,
    samples: Arc<AtomicUsize>,
}

impl LeaderWatch {
    fn start(cluster: TestCluster, token: String) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let most = Arc::new(AtomicUsize::new(0));
        let samples = Arc::new(AtomicUsize::new(0));
        let (s, m, n) = (stop.clone(), most.clone(), samples.clone());
        tokio::spawn(async move {
            while !s.load(Ordering::Relaxed) {
                if let Ok(pods) = manager_pods(&cluster).await {
                    let mut leading = 0;
                    let mut read = 0;
                    for ip in pods
                        .iter()
                        .filter_map(|p| p.status.as_ref()?.pod_ip.as_ref()?.parse::<IpAddr>().ok())
                    {
                        if let Ok(Ok((200, text))) = tokio::time::timeout(
                            Duration::from_secs(2),
                            testkit::https::get_with_token(ip, METRICS_PORT, "/metrics", &token),
                        )
                        .await
                        {
                            read += 1;
                            if master_status(&text) == Some(1.0) {
                                leading += 1;
                            }
                        }
                    }
                    if read > 0 {
                        n.fetch_add(1, Ordering::Relaxed);
                        m.fetch_max(leading, Ordering::Relaxed);
                    }
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
        Self {
            stop,
            most,
            samples,
        }
    }

    fn stop(self) -> LeadersSeen {
        self.stop.store(true, Ordering::Relaxed);
        LeadersSeen {
            most_leaders: self.most.load(Ordering::Relaxed),
            samples: self.samples.load(Ordering::Relaxed),
        }
    }
}

fn master_status(metrics: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let rest = line.strip_prefix("leader_election_master_status{")?;
        let (labels, value) = rest.split_once('}')?;
        labels
            .contains(&format!("name=\"{LEASE}\""))
            .then(|| value.trim().parse().ok())?
    })
}

/// kubectl as administrator; fails unless it succeeds.
fn cluster_kubectl(cluster: &TestCluster, args: &[&str]) -> Result<String> {
    Ok(cluster.kubectl_output(args)?)
}

#[test]
fn reads_the_leader_gauge() {
    let text =
        "# TYPE x gauge\nleader_election_master_status{name=\"operator-manager-leader\"} 1\n";
    assert_eq!(master_status(text), Some(1.0));
    assert_eq!(
        master_status("leader_election_master_status{name=\"other\"} 1"),
        None
    );
}
