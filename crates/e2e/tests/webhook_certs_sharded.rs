//! Two replicas of a sharded manager serve the webhooks; the certificate Secret is deleted while
//! writes go through the webhooks every 250 ms.
//!
//! Only the replica that holds the cluster-wide duties Lease writes the Secret and the CA
//! bundles; the other only reads them. The API server calls the reader, which keeps serving the
//! certificate the old CA signed until the holder has made a new one and the bundles trust it:
//! not one admission may fail, and the audit log shows no write of the Secret or the
//! configurations by the reader.

mod webhook_configurations;

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use testkit::TestNamespace;
use webhook_configurations::{
    MANAGER_NAMESPACE, delete_the_secret_under_writes, install_configurations,
    remove_configurations, start_serving_webhooks_with, tail,
};

#[tokio::test]
async fn only_the_duties_holder_writes_the_webhook_certificates() -> Result<()> {
    let cluster = testkit::cluster().await?;
    let identity = testkit::manager_kubeconfig(&cluster, &testkit::deploy_dir()).await?;
    let ns = TestNamespace::create(&cluster, "cert-duties").await?;
    let group = testkit::unique_name("duties");
    let (holder, reader) = (
        testkit::unique_name("holder"),
        testkit::unique_name("reader"),
    );
    let served = testkit::free_port()?;
    let other = testkit::free_port_other_than(&[served])?;
    install_configurations(&cluster, &ns, served).await?;
    // Both check every 3 s (a tenth of the validity). The first to start takes the duties;
    // the API server calls the second.
    let flags = [
        "--sharding".to_owned(),
        format!("--leader-election-id={group}"),
        "--webhook-cert-validity=30s".to_owned(),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let a = start_serving_webhooks_with(&identity.path, other, &flags, &[("POD_NAME", &holder)])
        .await?;
    let lease = format!("{group}-duties");
    let held = testkit::wait_for(
        "the duties Lease to be held",
        Duration::from_secs(30),
        || holder_of(&cluster, &lease),
    )
    .await;
    let b =
        start_serving_webhooks_with(&identity.path, served, &flags, &[("POD_NAME", &reader)]).await;
    let result = match (held, b) {
        (Ok(()), Ok(b)) => {
            let since = k8s_openapi::jiff::Timestamp::now();
            let result = scenario(&cluster, &ns, &lease, since, &holder, &reader).await;
            let logs = format!(
                "holder:\n{}\nreader:\n{}",
                tail(&a.log_text(), 80),
                tail(&b.log_text(), 80)
            );
            b.terminate();
            result.with_context(|| logs)
        }
        (Err(e), b) => {
            if let Ok(b) = b {
                b.terminate();
            }
            Err(e).with_context(|| tail(&a.log_text(), 30))
        }
        (Ok(()), Err(e)) => Err(e),
    };
    a.terminate();
    let removed = remove_configurations(&cluster).await;
    result?;
    removed
}

async fn scenario(
    cluster: &testkit::TestCluster,
    ns: &TestNamespace,
    lease: &str,
    since: k8s_openapi::jiff::Timestamp,
    holder: &str,
    reader: &str,
) -> Result<()> {
    let holding = current_holder(cluster, lease).await?;
    ensure!(
        holding.starts_with(&format!("{holder}_")),
        "the duties Lease is held by {holding:?}, not by the first replica"
    );
    delete_the_secret_under_writes(cluster, ns).await?;
    // Give the audit log a moment to be flushed.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let files = cluster.state.audit_log_files()?;
    let writes = testkit::read_audit_files_where(&files, |line| {
        line.contains(product::WEBHOOK_CERT_SECRET) || line.contains("webhookconfigurations")
    })?;
    let by = |pod: &str| {
        let agent = format!("({pod}_");
        writes
            .iter()
            .filter(|e| {
                e.received >= since
                    && ["create", "update", "patch"].contains(&e.verb.as_str())
                    && e.user_agent.contains(&agent)
                    && (e.resource.ends_with("webhookconfigurations")
                        || (e.resource == "secrets"
                            && e.namespace == MANAGER_NAMESPACE
                            && e.name == product::WEBHOOK_CERT_SECRET))
            })
            .map(|e| format!("{} {} {}", e.verb, e.resource, e.name))
            .collect::<Vec<_>>()
    };
    let (by_holder, by_reader) = (by(holder), by(reader));
    println!(
        "after the Secret's deletion, the duties holder wrote {by_holder:?}; the reader wrote {by_reader:?}"
    );
    ensure!(
        by_holder.iter().any(|w| w.starts_with("create secrets")),
        "the duties holder did not write the Secret again: {by_holder:?}"
    );
    ensure!(
        by_reader.is_empty(),
        "the replica without the duties wrote {by_reader:?}"
    );
    Ok(())
}

/// The holder of Lease `name` in the managers' namespace; empty when nobody holds it.
async fn current_holder(cluster: &testkit::TestCluster, name: &str) -> Result<String> {
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), MANAGER_NAMESPACE);
    Ok(leases
        .get_opt(name)
        .await?
        .and_then(|lease| lease.spec)
        .and_then(|spec| spec.holder_identity)
        .unwrap_or_default())
}

/// Succeeds once somebody holds Lease `name`.
async fn holder_of(cluster: &testkit::TestCluster, name: &str) -> Result<()> {
    let holding = current_holder(cluster, name).await?;
    ensure!(!holding.is_empty(), "nobody holds {name}");
    Ok(())
}
