//! The webhook certificate Secret deleted while two replicas serve, and writes go through the
//! webhooks every 250 ms: not one admission may fail.
//!
//! The API server calls replica A (the configurations point at its port); replica B checks the
//! Secret ten times as often, so it is the one that finds it gone and makes a new CA. A keeps
//! serving the certificate the old CA signed until its own next check, so the old CA must stay
//! in the bundles beside the new one, and no replica may serve a certificate of the new CA
//! before the bundles hold it.

mod webhook_configurations;

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use apis::{Memcached, MemcachedSpec};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, PostParams};
use testkit::TestNamespace;
use webhook_configurations::{
    MANAGER_NAMESPACE, install_configurations, provisioned_ca, remove_configurations,
    start_serving_webhooks,
};

/// How often a write goes through the webhooks.
const WRITE_EVERY: Duration = Duration::from_millis(250);
/// Writes before the Secret is deleted, and how long they go on after.
const BEFORE: Duration = Duration::from_secs(3);
const AFTER: Duration = Duration::from_secs(20);

#[tokio::test]
async fn deleting_the_certificate_secret_fails_no_admission() -> Result<()> {
    let cluster = testkit::cluster().await?;
    let identity = testkit::manager_kubeconfig(&cluster, &testkit::deploy_dir()).await?;
    let ns = TestNamespace::create(&cluster, "cert-recovery").await?;
    let served = testkit::free_port()?;
    let other = testkit::free_port_other_than(&[served])?;
    install_configurations(&cluster, &ns, served).await?;
    // A checks every minute, B every 3 s (a tenth of the validity).
    let a = start_serving_webhooks(&identity.path, served, &[]).await?;
    let b = start_serving_webhooks(&identity.path, other, &["--webhook-cert-validity=30s"]).await?;
    let result = scenario(&cluster, &ns).await;
    let logs = format!(
        "replica A:\n{}\nreplica B:\n{}",
        tail(&a.log_text(), 30),
        tail(&b.log_text(), 30)
    );
    a.terminate();
    b.terminate();
    let removed = remove_configurations(&cluster).await;
    result.with_context(|| logs)?;
    removed
}

async fn scenario(cluster: &testkit::TestCluster, ns: &TestNamespace) -> Result<()> {
    let memcacheds: Api<Memcached> = Api::namespaced(cluster.client.clone(), ns.name());
    let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), MANAGER_NAMESPACE);
    let old_ca = String::from_utf8(provisioned_ca(cluster, MANAGER_NAMESPACE).await?)?;
    let started = Instant::now();
    let mut deleted = None;
    let (mut writes, mut failures) = (0, Vec::new());
    while started.elapsed() < BEFORE + AFTER {
        if deleted.is_none() && started.elapsed() >= BEFORE {
            secrets
                .delete(product::WEBHOOK_CERT_SECRET, &DeleteParams::default())
                .await?;
            deleted = Some(Instant::now());
        }
        let sent = Instant::now();
        let memcached = Memcached::new(
            &format!("w-{writes}"),
            MemcachedSpec::new(0, apis::memcached::DEFAULT_IMAGE),
        );
        if let Err(error) = memcacheds.create(&PostParams::default(), &memcached).await {
            let at = deleted.map(|d| format!("{:.1?} after the deletion", d.elapsed()));
            failures.push(format!(
                "{}: {error}",
                at.unwrap_or_else(|| "before".into())
            ));
        }
        writes += 1;
        tokio::time::sleep(WRITE_EVERY.saturating_sub(sent.elapsed())).await;
    }
    let new_ca = String::from_utf8(provisioned_ca(cluster, MANAGER_NAMESPACE).await?)?;
    let configurations: Api<ValidatingWebhookConfiguration> = Api::all(cluster.client.clone());
    let live = configurations
        .get(product::VALIDATING_CONFIGURATION)
        .await?
        .webhooks
        .unwrap_or_default()
        .first()
        .and_then(|hook| hook.client_config.ca_bundle.clone())
        .map(|bundle| String::from_utf8_lossy(&bundle.0).into_owned())
        .unwrap_or_default();
    println!(
        "{writes} writes every {WRITE_EVERY:?}, the Secret deleted after {BEFORE:?}: {} failed \
         admissions; the Secret holds a new CA: {}; the live bundle holds the old CA: {} and the \
         new: {}",
        failures.len(),
        new_ca != old_ca,
        holds(&live, &old_ca),
        holds(&live, &new_ca)
    );
    ensure!(
        failures.is_empty(),
        "{} admissions failed after the Secret was deleted, the first:\n  {}",
        failures.len(),
        failures[..failures.len().min(3)].join("\n  ")
    );
    ensure!(
        new_ca != old_ca,
        "the Secret was not written again with a new CA"
    );
    ensure!(
        holds(&live, &old_ca),
        "the old CA, which replica A's certificate needs, left the bundle"
    );
    Ok(())
}

/// Whether `bundle` holds every certificate of `pems`.
fn holds(bundle: &str, pems: &str) -> bool {
    const END: &str = "-----END CERTIFICATE-----";
    pems.split_inclusive(END)
        .map(str::trim)
        .filter(|pem| pem.ends_with(END))
        .all(|pem| bundle.contains(pem))
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
