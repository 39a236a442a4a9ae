//! A GET over HTTPS with a bearer token, for reading the manager's secure `/metrics` from a
//! test. The manager in a cluster serves a self-signed certificate (as Kubebuilder's scaffold
//! does), so, like the ServiceMonitor's `insecureSkipVerify`, [`get_with_token`] does not
//! verify it: what is tested is who may read. [`get`] can trust one authority instead, to test
//! which certificate is served.

use std::net::IpAddr;
use std::sync::Arc;

use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// Which server certificates a request accepts.
#[derive(Debug, Clone)]
pub enum Trust {
    /// Any: the request checks who may read, not what is served.
    Any,
    /// Only those this certificate authority signed.
    Only(CertificateDer<'static>),
}

/// `GET path` on `ip:port` over HTTPS with `token`, accepting any certificate; the status code
/// and body.
///
/// # Errors
/// As [`get`].
pub async fn get_with_token(
    ip: IpAddr,
    port: u16,
    path: &str,
    token: &str,
) -> std::result::Result<(u16, String), String> {
    get(ip, port, path, Some(token), Trust::Any).await
}

/// `GET path` on `ip:port` over HTTPS, with `token` if given, accepting what `trust` says; the
/// status code and body.
///
/// # Errors
/// A message saying what failed: connecting, the handshake (an untrusted certificate among
/// them), or a response without a status.
pub async fn get(
    ip: IpAddr,
    port: u16,
    path: &str,
    token: Option<&str>,
    trust: Trust,
) -> std::result::Result<(u16, String), String> {
    let connector = connector(trust)?;
    let tcp = tokio::net::TcpStream::connect((ip, port))
        .await
        .map_err(|e| format!("connecting to {ip}:{port}: {e}"))?;
    let mut tls = connector
        .connect(ServerName::IpAddress(ip.into()), tcp)
        .await
        .map_err(|e| format!("TLS handshake with {ip}:{port}: {e}"))?;
    let authorization =
        token.map_or_else(String::new, |t| format!("Authorization: Bearer {t}\r\n"));
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {ip}\r\n{authorization}Connection: close\r\n\r\n");
    tls.write_all(request.as_bytes())
        .await
        .map_err(|e| format!("sending to {ip}:{port}: {e}"))?;
    let mut response = Vec::new();
    // A server may close without TLS close_notify; what arrived is the response.
    let _ = tls.read_to_end(&mut response).await;
    let text = String::from_utf8_lossy(&response).into_owned();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no HTTP status from {ip}:{port}: {text:?}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    Ok((code, body))
}

/// A TLS client that accepts what `trust` says.
///
/// # Errors
/// A message when the authority is no certificate.
pub fn connector(trust: Trust) -> std::result::Result<tokio_rustls::TlsConnector, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let config = match trust {
        Trust::Any => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider))),
        Trust::Only(authority) => {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(authority).map_err(|e| e.to_string())?;
            builder.with_root_certificates(roots)
        }
    }
    .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// Accepts any server certificate, checking only that the handshake is signed by its key.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
