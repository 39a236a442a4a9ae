//! A mutating admission webhook that holds chosen writes in admission until the test lets them
//! go, as a slow webhook of a user's cluster would: the API server has received the write, and
//! commits it (or not) only after the webhook answers.
//!
//! It serves HTTPS on loopback with a certificate of its own, and holds the first write of each
//! Deployment named in [`HeldAdmission::start`]; every other write it allows at once.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::api::{Api, DeleteParams, PostParams};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// The longest a write is held when the test never lets it go.
const HOLD_AT_MOST: Duration = Duration::from_secs(25);

/// A write held in admission.
pub struct Held {
    /// The Deployment's name.
    pub name: String,
    /// The pod that sent it (`authentication.kubernetes.io/pod-name`), empty when none.
    pub pod: String,
    release: oneshot::Sender<()>,
}

impl Held {
    /// Lets the write go on through admission.
    pub fn release(self) {
        let _ = self.release.send(());
    }
}

/// The running webhook and its configuration in the cluster.
pub struct HeldAdmission {
    held: mpsc::UnboundedReceiver<Held>,
    configurations: Api<MutatingWebhookConfiguration>,
    name: String,
    server: JoinHandle<()>,
}

impl HeldAdmission {
    /// Serves the webhook and registers it for Deployments named `names` in `namespace`.
    pub async fn start(client: &kube::Client, namespace: &str, names: &[String]) -> Result<Self> {
        let certificate = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()])?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
            certificate.signing_key.serialize_der(),
        ));
        let chain = vec![CertificateDer::from(certificate.cert.der().to_vec())];
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let port = listener.local_addr()?.port();
        let (tell, held) = mpsc::unbounded_channel();
        let pending = Arc::new(Mutex::new(names.iter().cloned().collect::<BTreeSet<_>>()));
        let server = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (acceptor, tell, pending) = (acceptor.clone(), tell.clone(), pending.clone());
                tokio::spawn(async move {
                    if let Ok(stream) = acceptor.accept(stream).await {
                        let _ = serve(stream, &tell, &pending).await;
                    }
                });
            }
        });
        let name = testkit::unique_name("held-admission");
        let mut configuration: MutatingWebhookConfiguration = serde_json::from_value(json!({
            "metadata": {"name": name},
            "webhooks": [{
                "name": "hold.leader-faults.example.com",
                "clientConfig": {
                    "url": format!("https://127.0.0.1:{port}/hold"),
                },
                "rules": [{
                    "apiGroups": ["apps"], "apiVersions": ["v1"],
                    "operations": ["CREATE", "UPDATE"], "resources": ["deployments"],
                }],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "objectSelector": {"matchExpressions": [{
                    "key": "memcached_cr", "operator": "In", "values": names,
                }]},
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 30,
                "failurePolicy": "Fail",
            }],
        }))?;
        for webhook in configuration.webhooks.iter_mut().flatten() {
            webhook.client_config.ca_bundle = Some(ByteString(certificate.cert.pem().into_bytes()));
        }
        let configurations: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
        configurations
            .create(&PostParams::default(), &configuration)
            .await
            .context("registering the holding webhook")?;
        Ok(Self {
            held,
            configurations,
            name,
            server,
        })
    }

    /// Waits up to `timeout` for the next write to be held.
    pub async fn next(&mut self, timeout: Duration) -> Result<Held> {
        tokio::time::timeout(timeout, self.held.recv())
            .await
            .with_context(|| format!("no write reached the holding webhook within {timeout:?}"))?
            .context("the holding webhook stopped")
    }

    /// Unregisters the webhook (it stops serving when dropped).
    pub async fn unregister(&self) -> Result<()> {
        self.configurations
            .delete(&self.name, &DeleteParams::default())
            .await?;
        Ok(())
    }
}

impl Drop for HeldAdmission {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Answers the admission reviews of one connection, one request after another.
async fn serve(
    stream: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    tell: &mpsc::UnboundedSender<Held>,
    pending: &Mutex<BTreeSet<String>>,
) -> Result<()> {
    let mut stream = BufReader::new(stream);
    loop {
        let mut length = 0;
        let mut line = String::new();
        loop {
            line.clear();
            if stream.read_line(&mut line).await? == 0 {
                return Ok(());
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((key, value)) = header.split_once(':')
                && key.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse()?;
            }
        }
        let mut body = vec![0; length];
        stream.read_exact(&mut body).await?;
        let review: Value = serde_json::from_slice(&body)?;
        let request = &review["request"];
        let name = request["name"].as_str().unwrap_or_default().to_owned();
        let first = pending.lock().map(|mut p| p.remove(&name)).unwrap_or(false);
        if first {
            let pod = request["userInfo"]["extra"]["authentication.kubernetes.io/pod-name"][0]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let (release, released) = oneshot::channel();
            let _ = tell.send(Held { name, pod, release });
            let _ = tokio::time::timeout(HOLD_AT_MOST, released).await;
        }
        let answer = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {"uid": request["uid"], "allowed": true},
        })
        .to_string();
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{answer}",
            answer.len()
        );
        stream.get_mut().write_all(response.as_bytes()).await?;
        stream.get_mut().flush().await?;
    }
}
