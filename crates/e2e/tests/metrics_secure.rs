//! Secure metrics against the real API server: the manager, as its generated ServiceAccount,
//! serves `/metrics` over HTTPS (`--metrics-secure`) with a certificate from a directory, and
//! lets in only scrapers whose token the API server authenticates and authorizes.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::pki_types::CertificateDer;
use testkit::https::Trust;
use testkit::{TestCluster, TestNamespace};

/// A certificate authority of the test's own.
struct Authority {
    issuer: Issuer<'static, KeyPair>,
    cert: CertificateDer<'static>,
}

impl Authority {
    fn new() -> Result<Self> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?.der().clone();
        Ok(Self {
            issuer: Issuer::new(params, key),
            cert,
        })
    }

    /// Writes a serving certificate for 127.0.0.1 signed by this authority into `dir`.
    fn issue_into(&self, dir: &Path) -> Result<()> {
        let params = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])?;
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        // The key first: a reader that sees the new certificate sees its key.
        std::fs::write(dir.join("tls.key.new"), key.serialize_pem())?;
        std::fs::write(dir.join("tls.crt.new"), cert.pem())?;
        std::fs::rename(dir.join("tls.key.new"), dir.join("tls.key"))?;
        std::fs::rename(dir.join("tls.crt.new"), dir.join("tls.crt"))?;
        Ok(())
    }
}

/// A GET of `/metrics` over HTTPS, trusting only `authority`, with `token` if given; the status
/// code and the body.
async fn get_metrics(
    port: u16,
    authority: &Authority,
    token: Option<&str>,
) -> Result<(u16, String)> {
    let trust = Trust::Only(authority.cert.clone());
    testkit::https::get(Ipv4Addr::LOCALHOST.into(), port, "/metrics", token, trust)
        .await
        .map_err(anyhow::Error::msg)
}

/// A token of a new ServiceAccount `name` in `namespace`.
async fn token_of(cluster: &TestCluster, namespace: &str, name: &str) -> Result<String> {
    let accounts = Api::<ServiceAccount>::namespaced(cluster.client.clone(), namespace);
    let account = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    accounts.create(&PostParams::default(), &account).await?;
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let token = accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await?
        .status
        .and_then(|s| s.token)
        .unwrap_or_default();
    ensure!(!token.is_empty(), "a token for {namespace}/{name}");
    Ok(token)
}

/// The generated metrics-reader ClusterRole's name.
fn metrics_reader_role() -> Result<String> {
    let path = testkit::deploy_dir()
        .join("rbac")
        .join("metrics_reader_role.yaml");
    testkit::read_yaml_file(&path)?
        .first()
        .and_then(|role| role.metadata.name.clone())
        .with_context(|| format!("a ClusterRole in {}", path.display()))
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test]
async fn only_scrapers_granted_the_metrics_reader_role_read_secure_metrics() -> Result<()> {
    let cluster = testkit::cluster().await?;
    let identity = testkit::manager_kubeconfig(&cluster, &testkit::deploy_dir()).await?;
    let ns = TestNamespace::create(&cluster, "metrics-secure").await?;
    let certs = TempDir(std::env::temp_dir().join(testkit::unique_name("metrics-certs")));
    std::fs::create_dir_all(&certs.0)?;
    let first = Authority::new()?;
    first.issue_into(&certs.0)?;

    let port = testkit::free_port()?;
    let mut manager = testkit::spawn_manager(
        &identity.path,
        &[
            &format!("--metrics-bind-address=127.0.0.1:{port}"),
            "--metrics-secure",
            &format!("--metrics-cert-path={}", certs.0.display()),
            "--health-probe-bind-address=0",
            "--leader-elect=false",
        ],
        &[],
    )
    .await?;
    let binding_name = testkit::unique_name("metrics-reader");
    let bindings = Api::<ClusterRoleBinding>::all(cluster.client.clone());
    let result = async {
        let scraper = token_of(&cluster, ns.name(), "scraper").await?;
        let stranger = token_of(&cluster, ns.name(), "stranger").await?;
        let binding = ClusterRoleBinding {
            metadata: ObjectMeta {
                name: Some(binding_name.clone()),
                ..ObjectMeta::default()
            },
            role_ref: RoleRef {
                api_group: Some("rbac.authorization.k8s.io".to_owned()),
                kind: "ClusterRole".to_owned(),
                name: metrics_reader_role()?,
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".to_owned(),
                name: "scraper".to_owned(),
                namespace: Some(ns.name().to_owned()),
                ..Subject::default()
            }]),
        };
        bindings.create(&PostParams::default(), &binding).await?;

        let served = testkit::wait_for(
            "the secure metrics endpoint",
            Duration::from_secs(60),
            || async {
                get_metrics(port, &first, None)
                    .await
                    .map_err(|e| format!("{e:#}"))
            },
        )
        .await?;
        ensure!(served.0 == 401, "no token: {}", served.1);
        let (code, body) = get_metrics(port, &first, Some("not-a-token")).await?;
        ensure!(code == 401, "a forged token: {body}");
        let (code, body) = get_metrics(port, &first, Some(&stranger)).await?;
        ensure!(code == 403, "a token without the role: {body}");
        ensure!(
            body.contains(&format!("system:serviceaccount:{}:stranger", ns.name())),
            "{body}"
        );
        let (code, body) = get_metrics(port, &first, Some(&scraper)).await?;
        ensure!(code == 200, "a token with the role: {body}");
        // The controllers' series appear once their caches have filled, moments after start.
        testkit::wait_for(
            "the controllers' series",
            Duration::from_secs(60),
            || async {
                match get_metrics(port, &first, Some(&scraper)).await {
                    Ok((200, body))
                        if body.contains("controller_runtime_reconcile_total")
                            && body.contains("rest_client_requests_total") =>
                    {
                        Ok(())
                    }
                    Ok((code, body)) => Err(format!("{code}: {body}")),
                    Err(e) => Err(format!("{e:#}")),
                }
            },
        )
        .await?;

        // Plain HTTP gets nothing.
        let plain = localcluster::http::get_ok(Ipv4Addr::LOCALHOST.into(), port, "/metrics").await;
        ensure!(plain.is_err(), "plain HTTP is not served: {plain:?}");

        // A rotated certificate is served without a restart.
        let second = Authority::new()?;
        second.issue_into(&certs.0)?;
        testkit::wait_for(
            "the rotated certificate to be served",
            Duration::from_secs(40),
            || async {
                match get_metrics(port, &second, Some(&scraper)).await {
                    Ok((200, _)) => Ok(()),
                    Ok((code, body)) => Err(format!("{code}: {body}")),
                    Err(e) => Err(format!("{e:#}")),
                }
            },
        )
        .await?;
        if get_metrics(port, &first, Some(&scraper)).await.is_ok() {
            bail!("the old certificate is still served");
        }
        Ok(())
    }
    .await;
    let _ = bindings
        .delete(&binding_name, &DeleteParams::default())
        .await;
    manager.terminate();
    let exited = manager.wait_timeout(Duration::from_secs(30)).await?;
    if exited.is_none() {
        manager.kill().await?;
    }
    result.with_context(|| format!("manager log:\n{}", manager.log_text()))
}
