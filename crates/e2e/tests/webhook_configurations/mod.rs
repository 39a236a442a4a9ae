//! The generated admission webhook configurations, pointed at a manager on loopback: what the
//! webhook tests share. The configurations are cluster-wide objects with fixed names, so the
//! tests that install them run one at a time (one scenario per test binary).

#![allow(dead_code)] // Each test binary uses a different part of this module.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use apis::{Memcached, MemcachedSpec};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use testkit::{TestCluster, TestNamespace};

/// The generated configurations, calling `https://127.0.0.1:port`, for this test's
/// namespace only.
pub async fn install_configurations(
    cluster: &TestCluster,
    ns: &TestNamespace,
    port: u16,
) -> Result<()> {
    let (mut mutating, mut validating) =
        codegen::webhook_configurations(&codegen::WebhookTarget::Url {
            base: format!("https://127.0.0.1:{port}"),
        })?;
    // The manager injects its CA.
    codegen::limit_to_namespace(&mut mutating, &mut validating, ns.name(), None);
    let apply = PatchParams::apply("e2e-webhooks").force();
    Api::<MutatingWebhookConfiguration>::all(cluster.client.clone())
        .patch(
            product::MUTATING_CONFIGURATION,
            &apply,
            &Patch::Apply(&mutating),
        )
        .await?;
    Api::<ValidatingWebhookConfiguration>::all(cluster.client.clone())
        .patch(
            product::VALIDATING_CONFIGURATION,
            &apply,
            &Patch::Apply(&validating),
        )
        .await?;
    Ok(())
}

pub async fn remove_configurations(cluster: &TestCluster) -> Result<()> {
    gone(
        Api::<MutatingWebhookConfiguration>::all(cluster.client.clone())
            .delete(product::MUTATING_CONFIGURATION, &DeleteParams::default())
            .await,
    )?;
    gone(
        Api::<ValidatingWebhookConfiguration>::all(cluster.client.clone())
            .delete(product::VALIDATING_CONFIGURATION, &DeleteParams::default())
            .await,
    )
}

/// The CA the manager provisioned for its webhooks (`ca.crt` of its certificate Secret in
/// `namespace`), as PEM.
pub async fn provisioned_ca(cluster: &TestCluster, namespace: &str) -> Result<Vec<u8>> {
    let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), namespace);
    let ca = secrets
        .get(product::WEBHOOK_CERT_SECRET)
        .await?
        .data
        .and_then(|data| data.get("ca.crt").cloned())
        .context("the certificate Secret has a ca.crt")?;
    Ok(ca.0)
}

/// Where the managers under test keep their certificate Secret (their leader election
/// namespace).
pub const MANAGER_NAMESPACE: &str = product::namespace!();

/// A manager serving its webhooks on `127.0.0.1:port`, without leader election, running the
/// Memcached controller, with `extra` flags; returns once `/readyz` answers.
pub async fn start_serving_webhooks(
    kubeconfig: &std::path::Path,
    port: u16,
    extra: &[&str],
) -> Result<testkit::ManagerProcess> {
    start_serving_webhooks_with(kubeconfig, port, extra, &[]).await
}

/// [`start_serving_webhooks`], with `env` set for the manager.
pub async fn start_serving_webhooks_with(
    kubeconfig: &std::path::Path,
    port: u16,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Result<testkit::ManagerProcess> {
    // The webhook port is free while a manager restarts; the probes must not take it.
    let probes = testkit::free_port_other_than(&[port])?;
    let mut args = vec![
        format!("--webhook-bind-address=127.0.0.1:{port}"),
        format!("--health-probe-bind-address=127.0.0.1:{probes}"),
        "--metrics-bind-address=0".to_owned(),
        "--leader-elect=false".to_owned(),
        format!("--leader-election-namespace={MANAGER_NAMESPACE}"),
        "--controllers=memcached".to_owned(),
    ];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let process = testkit::spawn_manager(kubeconfig, &args, env).await?;
    let ready = testkit::wait_for(
        "the manager to be ready",
        std::time::Duration::from_secs(60),
        || localcluster::http::get_ok([127, 0, 0, 1].into(), probes, "/readyz"),
    )
    .await;
    if let Err(e) = ready {
        let log = process.log_text();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(60)..].join("\n");
        return Err(e).with_context(|| format!("manager log:\n{tail}"));
    }
    Ok(process)
}

/// Success, or an API error that says the object was not there.
pub fn gone<T>(result: Result<T, kube::Error>) -> Result<()> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// How often a write goes through the webhooks.
pub const WRITE_EVERY: Duration = Duration::from_millis(250);
/// Writes before the Secret is deleted, and how long they go on after.
pub const BEFORE: Duration = Duration::from_secs(3);
pub const AFTER: Duration = Duration::from_secs(20);

/// Writes through the webhooks every [`WRITE_EVERY`] for [`BEFORE`], deletes the certificate
/// Secret, and goes on for [`AFTER`]: fails if one admission failed, if the Secret holds no new
/// CA at the end, or if the live bundle lost the CA that signed when the Secret was deleted
/// (which a replica that has not checked yet still serves a certificate of) before it expired.
pub async fn delete_the_secret_under_writes(
    cluster: &testkit::TestCluster,
    ns: &TestNamespace,
) -> Result<()> {
    let memcacheds: Api<Memcached> = Api::namespaced(cluster.client.clone(), ns.name());
    let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), MANAGER_NAMESPACE);
    let started = Instant::now();
    let mut deleted = None;
    let mut old_signer = String::new();
    let (mut writes, mut failures) = (0, Vec::new());
    while started.elapsed() < BEFORE + AFTER {
        if deleted.is_none() && started.elapsed() >= BEFORE {
            old_signer = signing_ca(cluster, MANAGER_NAMESPACE).await?;
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
    let new_signer = signing_ca(cluster, MANAGER_NAMESPACE).await?;
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
    let old_expired = manager::cert_authority::Summary::of_pem(&old_signer)
        .is_some_and(|ca| ca.not_after <= std::time::SystemTime::now());
    println!(
        "{writes} writes every {WRITE_EVERY:?}, the Secret deleted after {BEFORE:?}: {} failed \
         admissions; a new CA signs: {}; the live bundle holds the old CA: {} (expired: {}) and \
         the new: {}",
        failures.len(),
        new_signer != old_signer,
        holds(&live, &old_signer),
        old_expired,
        holds(&live, &new_signer)
    );
    ensure!(
        failures.is_empty(),
        "{} admissions failed after the Secret was deleted, the first:\n  {}",
        failures.len(),
        failures[..failures.len().min(3)].join("\n  ")
    );
    ensure!(
        new_signer != old_signer,
        "the Secret was not written again with a new CA"
    );
    ensure!(
        holds(&live, &new_signer),
        "the new CA is not in the live bundle"
    );
    ensure!(
        old_expired || holds(&live, &old_signer),
        "the old CA, which replica A's certificate needs, left the bundle before it expired"
    );
    Ok(())
}

/// The CA that signs the serving certificates now (`ca-signer.crt` of the certificate Secret
/// in `namespace`), as PEM.
async fn signing_ca(cluster: &TestCluster, namespace: &str) -> Result<String> {
    let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), namespace);
    let signer = secrets
        .get(product::WEBHOOK_CERT_SECRET)
        .await?
        .data
        .and_then(|data| {
            data.get(manager::cert_authority::keys::SIGNER_CERT)
                .cloned()
        })
        .context("the certificate Secret names the CA that signs")?;
    Ok(String::from_utf8(signer.0)?)
}

/// Whether `bundle` holds every certificate of `pems`.
fn holds(bundle: &str, pems: &str) -> bool {
    const END: &str = "-----END CERTIFICATE-----";
    pems.split_inclusive(END)
        .map(str::trim)
        .filter(|pem| pem.ends_with(END))
        .all(|pem| bundle.contains(pem))
}

pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
