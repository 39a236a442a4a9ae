//! The webhook certificate Secret deleted while two replicas serve, and writes go through the
//! webhooks every 250 ms: not one admission may fail.
//!
//! The API server calls replica A (the configurations point at its port); replica B checks the
//! Secret ten times as often, so it is the one that finds it gone and makes a new CA. A keeps
//! serving the certificate the old CA signed until its own next check, so the old CA must stay
//! in the bundles beside the new one, and no replica may serve a certificate of the new CA
//! before the bundles hold it.

mod webhook_configurations;

use anyhow::{Context as _, Result};
use testkit::TestNamespace;
use webhook_configurations::{
    delete_the_secret_under_writes, install_configurations, remove_configurations,
    start_serving_webhooks, tail,
};

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
    let result = delete_the_secret_under_writes(&cluster, &ns).await;
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
