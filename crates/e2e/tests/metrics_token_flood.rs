//! The secure metrics endpoint under a flood of bearer tokens nobody issued: any pod can reach
//! the port, and each unknown token would cost a TokenReview on the API server. While workers
//! send [`REQUESTS`] scrapes, each with a token of its own, the manager must:
//! - send no more TokenReviews than its rate allows ([`REVIEWS_PER_SECOND`], bursts of
//!   [`REVIEW_BURST`]), counted in the API server's audit log;
//! - refuse the rest at once (429, or 401 for the tokens it did review);
//! - keep its Lease, renewed as usual.

mod lease_watch;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use lease_watch::{ensure_kept, wait_for_holder, watch_lease};
use manager::metrics_auth::{REVIEW_BURST, REVIEWS_PER_SECOND};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// Where the manager keeps its Lease (its leader election namespace).
const MANAGER_NAMESPACE: &str = product::namespace!();
/// Scrapes sent, each with a new token.
const REQUESTS: usize = 100_000;
/// Connections sending them, each keeping its connection open.
const WORKERS: usize = 32;
/// The renew deadline the manager runs with (its default).
const RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// TokenReviews the test allows beyond the rate, for the seconds its clock and the
/// manager's do not share.
const REVIEW_SLACK: f64 = 10.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_unknown_metrics_tokens_costs_few_reviews_and_no_renewal() -> Result<()> {
    let cluster = testkit::cluster().await?;
    let identity = testkit::manager_kubeconfig(&cluster, &testkit::deploy_dir()).await?;
    let pod = testkit::unique_name("token-flood");
    let lease = testkit::unique_name("token-flood-leader");
    let metrics = testkit::free_port()?;
    let probes = testkit::free_port_other_than(&[metrics])?;
    let args = [
        format!("--metrics-bind-address=127.0.0.1:{metrics}"),
        "--metrics-secure".to_owned(),
        format!("--health-probe-bind-address=127.0.0.1:{probes}"),
        "--webhook-bind-address=0".to_owned(),
        "--leader-elect=true".to_owned(),
        format!("--leader-election-id={lease}"),
        format!("--leader-election-namespace={MANAGER_NAMESPACE}"),
        "--controllers=memcached".to_owned(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let manager = testkit::spawn_manager(&identity.path, &args, &[("POD_NAME", &pod)]).await?;
    let result = flood(&cluster, metrics, &pod, &lease).await;
    let log = manager.log_text();
    manager.terminate();
    result.with_context(|| format!("manager log:\n{}", tail(&log, 40)))
}

async fn flood(
    cluster: &testkit::TestCluster,
    port: u16,
    pod: &str,
    lease_name: &str,
) -> Result<()> {
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), MANAGER_NAMESPACE);
    let holder = wait_for_holder(&leases, lease_name).await?;
    let address: SocketAddr = ([127, 0, 0, 1], port).into();
    // The manager's metrics certificate is its own: what is tested is who may read.
    let connector =
        testkit::https::connector(testkit::https::Trust::Any).map_err(anyhow::Error::msg)?;
    let began = Timestamp::now();
    let started = Instant::now();
    let done = Arc::new(AtomicBool::new(false));
    let watching = done.clone();
    let renewals = tokio::spawn(watch_lease(leases, lease_name.to_owned(), move || {
        watching.load(Ordering::SeqCst)
    }));
    let next = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| tokio::spawn(scrape_until_sent(address, connector.clone(), next.clone())))
        .collect();
    let mut answers: BTreeMap<String, usize> = BTreeMap::new();
    for worker in workers {
        for (answer, count) in worker.await? {
            *answers.entry(answer).or_default() += count;
        }
    }
    let took = started.elapsed();
    done.store(true, Ordering::SeqCst);
    let (holders, longest_gap) = renewals.await??;

    // The audit log is written as requests complete; give the last ones a moment.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let files = cluster.state.audit_log_files()?;
    let events = testkit::read_audit_files_where(&files, |line| line.contains("tokenreviews"))?;
    let reviews = events
        .iter()
        .filter(|e| e.resource == "tokenreviews" && e.received >= began)
        .filter(|e| {
            testkit::manager_identity(&e.user_agent)
                .is_some_and(|id| testkit::identity_pod(&id) == pod)
        })
        .count();
    let allowed = REVIEW_BURST + REVIEWS_PER_SECOND * took.as_secs_f64() + REVIEW_SLACK;
    println!(
        "{REQUESTS} scrapes with unknown tokens over {WORKERS} connections in {took:.1?} \
         ({:.0}/s), answered {answers:?}; {reviews} TokenReviews (at most {allowed:.0} allowed); \
         Lease held by {holders:?}, longest interval between renewals {longest_gap:.1?}",
        REQUESTS as f64 / took.as_secs_f64()
    );
    let answered: usize = answers
        .iter()
        .filter(|(answer, _)| ["401", "429"].contains(&answer.as_str()))
        .map(|(_, count)| count)
        .sum();
    ensure!(
        answered == REQUESTS,
        "every scrape with an unknown token is refused with 401 or 429: {answers:?}"
    );
    ensure!(
        reviews > 0,
        "no TokenReview of the manager in the audit log: is the user agent set?"
    );
    ensure!(
        (reviews as f64) <= allowed,
        "{reviews} TokenReviews in {took:.1?}, more than the rate allows ({allowed:.0})"
    );
    ensure_kept(&holder, &holders, longest_gap, RENEW_DEADLINE)?;
    Ok(())
}

/// Scrapes with a new token each time, on one connection (a new one when it closes), until
/// [`REQUESTS`] have been sent by all workers; counts the answers by status code.
async fn scrape_until_sent(
    address: SocketAddr,
    connector: TlsConnector,
    next: Arc<AtomicUsize>,
) -> BTreeMap<String, usize> {
    let mut answers = BTreeMap::new();
    let mut connection = None;
    while next.fetch_add(1, Ordering::SeqCst) < REQUESTS {
        let token = format!("flood-{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
        let answer = match scrape(address, &connector, &mut connection, &token).await {
            Ok(status) => status,
            Err(error) => {
                connection = None;
                format!("error: {}", error.root_cause())
            }
        };
        *answers.entry(answer).or_default() += 1;
    }
    answers
}

type Connection = BufReader<tokio_rustls::client::TlsStream<TcpStream>>;

/// One `GET /metrics` with `token` on `connection` (opened first if there is none); the
/// answer's status code.
async fn scrape(
    address: SocketAddr,
    connector: &TlsConnector,
    connection: &mut Option<Connection>,
    token: &str,
) -> Result<String> {
    let within = Duration::from_secs(15);
    if connection.is_none() {
        let tcp = tokio::time::timeout(within, TcpStream::connect(address)).await??;
        let name = ServerName::try_from("127.0.0.1")?;
        let tls = tokio::time::timeout(within, connector.connect(name, tcp)).await??;
        *connection = Some(BufReader::new(tls));
    }
    let Some(stream) = connection.as_mut() else {
        bail!("no connection");
    };
    let request = format!(
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\r\n"
    );
    tokio::time::timeout(within, stream.get_mut().write_all(request.as_bytes())).await??;
    let mut status = String::new();
    tokio::time::timeout(within, stream.read_line(&mut status)).await??;
    let code = status
        .split_whitespace()
        .nth(1)
        .with_context(|| format!("no status in {status:?}"))?
        .to_owned();
    let mut length = 0;
    let mut close = false;
    loop {
        let mut line = String::new();
        tokio::time::timeout(within, stream.read_line(&mut line)).await??;
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((key, value)) = header.split_once(':') {
            let value = value.trim();
            if key.eq_ignore_ascii_case("content-length") {
                length = value.parse()?;
            } else if key.eq_ignore_ascii_case("connection") && value.eq_ignore_ascii_case("close")
            {
                close = true;
            }
        }
    }
    let mut body = vec![0; length];
    tokio::time::timeout(within, stream.read_exact(&mut body)).await??;
    if close {
        *connection = None;
    }
    Ok(code)
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
