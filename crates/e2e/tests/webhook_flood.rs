//! The webhook port under attack, through the real API server: any pod can reach it, so a
//! flood of large reviews and of idle connections must not take the manager down. While
//! workers send reviews of 7.5 MiB (which the previous limit of 8 MiB let through, to be
//! parsed several times over) and of 3 MiB (the largest a review of two objects at etcd's limit
//! needs, read and decided), and hundreds of connections sit idle, the manager must:
//! - keep its resident memory within its container's limit, and what the flood adds to it
//!   within half of that: the rest is for the caches, which take about half the limit at
//!   10,000 objects (see BENCHMARKS.md);
//! - keep its Lease, renewed as usual;
//! - admit real writes that the API server sends it through the generated configurations,
//!   each within the configuration's timeout (a write is refused otherwise: failure policy
//!   `Fail`).

mod lease_watch;
mod webhook_configurations;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use apis::{Memcached, MemcachedSpec};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use lease_watch::{ensure_kept, wait_for_holder, watch_lease};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use testkit::{ManagerProcess, TestNamespace};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use webhook_configurations::{install_configurations, provisioned_ca, remove_configurations};

/// Where the manager keeps its certificate Secret and Lease (its leader election namespace).
const MANAGER_NAMESPACE: &str = product::namespace!();
/// How long the flood lasts.
const FLOOD: Duration = Duration::from_secs(20);
/// Workers sending large reviews at once: enough that the manager before these limits (a body
/// of up to 8 MiB read by any number of reviews at once) grew by some 220 MiB here.
const WORKERS: usize = 64;
/// The sizes of the flooding reviews' objects, taken in turn by the workers: one past the body
/// limit, and the largest within it.
const REVIEW_BYTES: [usize; 2] = [7 << 19, 3 << 20];
/// Connections opened and left idle.
const IDLE_CONNECTIONS: usize = 300;
/// How often a real write goes through the API server during the flood.
const REAL_WRITE_EVERY: Duration = Duration::from_secs(2);
/// The renew deadline the manager runs with (its default).
const RENEW_DEADLINE: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_large_reviews_and_idle_connections_leaves_the_manager_serving() -> Result<()> {
    let cluster = testkit::cluster().await?;
    let identity = testkit::manager_kubeconfig(&cluster, &testkit::deploy_dir()).await?;
    let ns = TestNamespace::create(&cluster, "webhook-flood").await?;
    let port = testkit::free_port()?;
    let lease_name = testkit::unique_name("flood-leader");
    install_configurations(&cluster, &ns, port).await?;
    let manager = start(&identity.path, port, &lease_name).await?;
    let result = flood(&cluster, &ns, &manager, port, &lease_name).await;
    let log = manager.log_text();
    manager.terminate();
    let removed = remove_configurations(&cluster).await;
    result.with_context(|| format!("manager log:\n{}", tail(&log, 60)))?;
    removed
}

/// The manager, leader-elected, with its webhooks on `port`; returns once it leads.
async fn start(kubeconfig: &std::path::Path, port: u16, lease: &str) -> Result<ManagerProcess> {
    let probes = testkit::free_port_other_than(&[port])?;
    let args = [
        format!("--webhook-bind-address=127.0.0.1:{port}"),
        format!("--health-probe-bind-address=127.0.0.1:{probes}"),
        "--metrics-bind-address=0".to_owned(),
        "--leader-elect=true".to_owned(),
        format!("--leader-election-id={lease}"),
        format!("--leader-election-namespace={MANAGER_NAMESPACE}"),
        "--controllers=memcached".to_owned(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let process = testkit::spawn_manager(kubeconfig, &args, &[]).await?;
    let ready = testkit::wait_for("the manager to be ready", Duration::from_secs(60), || {
        localcluster::http::get_ok([127, 0, 0, 1].into(), probes, "/readyz")
    })
    .await;
    if let Err(e) = ready {
        return Err(e).with_context(|| format!("manager log:\n{}", tail(&process.log_text(), 60)));
    }
    Ok(process)
}

async fn flood(
    cluster: &testkit::TestCluster,
    ns: &TestNamespace,
    manager: &ManagerProcess,
    port: u16,
    lease_name: &str,
) -> Result<()> {
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), MANAGER_NAMESPACE);
    let holder = wait_for_holder(&leases, lease_name).await?;
    let pid = manager.id().context("the manager has exited")?;
    let before = rss(pid)?;
    let connector = connector(cluster).await?;
    let address: SocketAddr = ([127, 0, 0, 1], port).into();
    let until = Instant::now() + FLOOD;

    // Idle connections first, then the workers, then what is watched meanwhile.
    let mut idle = Vec::new();
    for _ in 0..IDLE_CONNECTIONS {
        idle.push(TcpStream::connect(address).await?);
    }
    let reviews = REVIEW_BYTES.map(|bytes| Arc::new(large_review(ns.name(), bytes)));
    let workers: Vec<_> = (0..WORKERS)
        .map(|worker| {
            let review = reviews[worker % reviews.len()].clone();
            tokio::spawn(send_reviews(address, connector.clone(), review, until))
        })
        .collect();
    let memory = tokio::spawn(peak_rss(pid, until));
    let renewals = tokio::spawn(watch_lease(
        leases.clone(),
        lease_name.to_owned(),
        move || Instant::now() >= until,
    ));
    let writes = real_writes(cluster, ns, until).await;

    let mut answers: BTreeMap<String, usize> = BTreeMap::new();
    for worker in workers {
        for (answer, count) in worker.await? {
            *answers.entry(answer).or_default() += count;
        }
    }
    let peak = memory.await??;
    let (holders, longest_gap) = renewals.await??;
    drop(idle);
    let writes = writes?;

    let limit = mebibytes(codegen::MANAGER_MEMORY_LIMIT)?;
    let slowest = writes.iter().max().copied().unwrap_or_default();
    println!(
        "flood of {FLOOD:?}: {WORKERS} workers sending reviews of {:?} bytes, answered \
         {answers:?}; {IDLE_CONNECTIONS} idle connections",
        REVIEW_BYTES
    );
    println!(
        "manager: RSS {} MiB before, peak {} MiB (limit {limit} MiB); Lease held by \
         {holders:?}, longest interval between renewals {longest_gap:.1?}; {} real writes \
         admitted, the slowest in {slowest:.2?}",
        before >> 20,
        peak >> 20,
        writes.len()
    );
    ensure!(
        peak >> 20 < limit,
        "the manager's resident memory peaked at {} MiB, over its limit of {limit} MiB",
        peak >> 20
    );
    let added = peak.saturating_sub(before) >> 20;
    ensure!(
        added < limit / 2,
        "the flood added {added} MiB to the manager's memory, more than half its limit of \
         {limit} MiB, which the caches need at 10,000 objects"
    );
    ensure_kept(&holder, &holders, longest_gap, RENEW_DEADLINE)?;
    let refused = answers.get("413").copied().unwrap_or_default()
        + answers.get("503").copied().unwrap_or_default()
        + answers.get("408").copied().unwrap_or_default();
    ensure!(
        refused > 0,
        "the flood reached the webhook port: {answers:?}"
    );
    let allowed = answers.get("200 allowed").copied().unwrap_or_default();
    ensure!(
        allowed > 0,
        "reviews within the limit were decided: {answers:?}"
    );
    // The writes start once the idle connections are open, up to one period into the flood.
    let expected = (FLOOD.as_secs() / REAL_WRITE_EVERY.as_secs()) as usize - 1;
    ensure!(
        writes.len() >= expected,
        "{} real writes were made during the flood, {expected} expected",
        writes.len()
    );
    Ok(())
}

/// A client that trusts the CA the manager provisioned for its webhooks.
async fn connector(cluster: &testkit::TestCluster) -> Result<TlsConnector> {
    let ca = provisioned_ca(cluster, MANAGER_NAMESPACE).await?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&ca) {
        roots.add(cert?)?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
}

/// A validating review of a Memcached of about `bytes`, its bulk in an annotation.
fn large_review(namespace: &str, bytes: usize) -> Vec<u8> {
    let padding = "x".repeat(bytes);
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "flood",
            "kind": {"group": product::group!(cache), "version": "v1beta1", "kind": "Memcached"},
            "resource": {"group": product::group!(cache), "version": "v1beta1", "resource": "memcacheds"},
            "name": "flood",
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "flood"},
            "object": {
                "apiVersion": concat!(product::group!(cache), "/v1beta1"),
                "kind": "Memcached",
                "metadata": {"name": "flood", "namespace": namespace, "annotations": {"padding": padding}},
                "spec": {"size": 1, "image": "memcached:1.6"},
            },
        },
    }))
    .unwrap_or_default()
}

/// Sends `review` over new TLS connections until `until`; counts the answers by status code
/// (or by what went wrong first).
async fn send_reviews(
    address: SocketAddr,
    connector: TlsConnector,
    review: Arc<Vec<u8>>,
    until: Instant,
) -> BTreeMap<String, usize> {
    let mut answers = BTreeMap::new();
    while Instant::now() < until {
        let answer = match send_review(address, &connector, &review).await {
            Ok(status) => status,
            Err(error) => format!("error: {}", error.root_cause()),
        };
        *answers.entry(answer).or_default() += 1;
    }
    answers
}

/// Sends `review` on a new connection; its answer's status code, and for a 200 whether the
/// review was `allowed`, `denied` or refused as `out of time`.
async fn send_review(
    address: SocketAddr,
    connector: &TlsConnector,
    review: &[u8],
) -> Result<String> {
    let within = Duration::from_secs(15);
    let tcp = tokio::time::timeout(within, TcpStream::connect(address)).await??;
    let name = ServerName::try_from("127.0.0.1")?;
    let mut tls = tokio::time::timeout(within, connector.connect(name, tcp)).await??;
    let path = format!(
        "/validate-{}-v1beta1-memcached",
        product::group!(cache).replace('.', "-")
    );
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        review.len()
    );
    // The server may answer and close before the whole body is sent: read what it said.
    let sent = async {
        tls.write_all(head.as_bytes()).await?;
        tls.write_all(review).await
    };
    let _ = tokio::time::timeout(within, sent).await;
    let mut answer = Vec::new();
    // The server closes without a TLS close_notify: what arrived before is the answer.
    let _ = tokio::time::timeout(within, tls.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    let Some(status) = answer.split_whitespace().nth(1) else {
        bail!("no answer ({} bytes)", answer.len());
    };
    let verdict = if status != "200" {
        ""
    } else if answer.contains("did not decide within") {
        " out of time"
    } else if answer.contains("\"allowed\":true") {
        " allowed"
    } else {
        " denied"
    };
    Ok(format!("{status}{verdict}"))
}

/// The highest resident memory of process `pid` until `until`, in bytes.
async fn peak_rss(pid: u32, until: Instant) -> Result<u64> {
    let mut peak = 0;
    while Instant::now() < until {
        peak = peak.max(rss(pid)?);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(peak)
}

/// The resident memory of process `pid`, in bytes.
fn rss(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("the manager (pid {pid}) is gone"))?;
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.split_whitespace().next())
        .context("no VmRSS")?
        .parse()?;
    Ok(kib << 10)
}

/// Starts a Memcached's creation every [`REAL_WRITE_EVERY`] until `until`, through the API
/// server and so through the manager's webhooks, each on its own so that a slow one does not
/// delay the next; returns how long each took. Any refusal is an error.
async fn real_writes(
    cluster: &testkit::TestCluster,
    ns: &TestNamespace,
    until: Instant,
) -> Result<Vec<Duration>> {
    let memcacheds: Api<Memcached> = Api::namespaced(cluster.client.clone(), ns.name());
    let mut writes = tokio::task::JoinSet::new();
    let mut every = tokio::time::interval(REAL_WRITE_EVERY);
    for index in 0.. {
        every.tick().await;
        if Instant::now() >= until {
            break;
        }
        let memcacheds = memcacheds.clone();
        writes.spawn(async move {
            let memcached = Memcached::new(
                &format!("real-{index}"),
                MemcachedSpec::new(1, apis::memcached::DEFAULT_IMAGE),
            );
            let started = Instant::now();
            memcacheds
                .create(&PostParams::default(), &memcached)
                .await
                .with_context(|| {
                    format!(
                        "real write {index}, {:.1?} into the flood",
                        FLOOD - until.saturating_duration_since(started)
                    )
                })?;
            anyhow::Ok(started.elapsed())
        });
    }
    let mut took = Vec::new();
    while let Some(write) = writes.join_next().await {
        took.push(write??);
    }
    Ok(took)
}

/// `256Mi` in MiB.
fn mebibytes(quantity: &str) -> Result<u64> {
    quantity
        .strip_suffix("Mi")
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("{quantity:?} is not a quantity in Mi"))
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
