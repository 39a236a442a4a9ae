//! TLS for the metrics and webhook endpoints: the serving certificate and the server
//! configuration ([`crate::serving`] does the handshakes).
//!
//! The certificate is self-signed at start, given as PEM (the webhook certificate the manager
//! keeps in a Secret, see [`crate::webhook_certs`]), or read from a certificate file and a key
//! file in a directory (`--metrics-cert-path` with `--metrics-cert-name` and
//! `--metrics-cert-key`, or the `--webhook-cert-*` flags: for example a cert-manager Secret
//! mounted there, `tls.crt` and `tls.key`) and read again when those files change, as controller-runtime's certificate watcher does: rotation needs no
//! restart, and a half-written or broken pair keeps the previous certificate in service.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use prometheus::{IntCounter, Registry};
use rustls::crypto::ring::sign::any_supported_type;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::Error;

/// The usual certificate file in a certificate directory (a `kubernetes.io/tls` Secret's).
pub const CERT_FILE: &str = "tls.crt";
/// The usual key file in a certificate directory.
pub const KEY_FILE: &str = "tls.key";

/// Where a certificate and its private key are read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertFiles {
    /// The PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// The PEM private key.
    pub key: PathBuf,
}

impl CertFiles {
    /// `cert_name` and `key_name` in `dir`.
    pub fn in_dir(dir: &Path, cert_name: &str, key_name: &str) -> Self {
        Self {
            cert: dir.join(cert_name),
            key: dir.join(key_name),
        }
    }
}

/// How often the certificate files are checked for changes.
pub const RELOAD_EVERY: Duration = Duration::from_secs(10);

/// The serving certificate, swapped in place when its files change.
#[derive(Debug)]
pub struct ServingCert {
    current: RwLock<Loaded>,
    files: Option<CertFiles>,
    reads: CertReads,
}

/// controller-runtime's certificate-watcher counters: `certwatcher_read_certificate_total`,
/// every read of a certificate's files, and `certwatcher_read_certificate_errors_total`, those
/// that failed (a file missing or unusable).
#[derive(Clone, Debug)]
pub struct CertReads {
    total: IntCounter,
    errors: IntCounter,
}

impl CertReads {
    /// The counters, registered with `registry`.
    ///
    /// # Errors
    /// [`Error::Metrics`] when registration fails.
    pub fn register(registry: &Registry) -> Result<Self, Error> {
        let reads = Self::unregistered()?;
        registry.register(Box::new(reads.total.clone()))?;
        registry.register(Box::new(reads.errors.clone()))?;
        Ok(reads)
    }

    /// The counters, counted nowhere: for a certificate whose reads nobody scrapes.
    ///
    /// # Errors
    /// [`Error::Metrics`] when they cannot be created (they always can).
    pub fn unregistered() -> Result<Self, Error> {
        Ok(Self {
            total: IntCounter::new(
                "certwatcher_read_certificate_total",
                "Total number of certificate reads",
            )?,
            errors: IntCounter::new(
                "certwatcher_read_certificate_errors_total",
                "Total number of certificate read errors",
            )?,
        })
    }

    /// Counts `read`, a read of the files.
    fn count<T>(&self, read: Result<T, Error>) -> Result<T, Error> {
        self.total.inc();
        if read.is_err() {
            self.errors.inc();
        }
        read
    }
}

#[derive(Debug)]
struct Loaded {
    key: Arc<CertifiedKey>,
    /// The files' bytes it was read from (none when self-signed).
    source: Vec<u8>,
}

impl ServingCert {
    /// A certificate signed by its own key for `names` (DNS names or IP addresses).
    ///
    /// # Errors
    /// [`Error::Tls`] when it cannot be generated.
    pub fn self_signed(names: &[String]) -> Result<Arc<Self>, Error> {
        let generated = rcgen::generate_simple_self_signed(names.to_vec())
            .map_err(|e| Error::Tls(format!("cannot generate a self-signed certificate: {e}")))?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
            generated.signing_key.serialize_der(),
        ));
        let key = certified(vec![generated.cert.der().clone()], &key)?;
        Ok(Arc::new(Self {
            current: RwLock::new(Loaded {
                key,
                source: Vec::new(),
            }),
            files: None,
            reads: CertReads::unregistered()?,
        }))
    }

    /// The certificate in `files`, each read of them counted in `reads`.
    ///
    /// # Errors
    /// [`Error::Tls`] naming the file when either is missing or unusable.
    pub fn from_files(files: &CertFiles, reads: &CertReads) -> Result<Arc<Self>, Error> {
        let (key, source) = reads.count(read_pair(files))?;
        Ok(Arc::new(Self {
            current: RwLock::new(Loaded { key, source }),
            files: Some(files.clone()),
            reads: reads.clone(),
        }))
    }

    /// The certificate in PEM `cert` (a chain, leaf first) and `key`, for example from a Secret
    /// the manager keeps; errors call them by `source`. Change it with [`Self::replace_pem`].
    ///
    /// # Errors
    /// [`Error::Tls`] when either is unusable or they do not belong together.
    pub fn from_pem(cert: &[u8], key: &[u8], source: &str) -> Result<Arc<Self>, Error> {
        let key_pair = parse_named_pair(cert, key, source)?;
        Ok(Arc::new(Self {
            current: RwLock::new(Loaded {
                key: key_pair,
                source: [cert, key].concat(),
            }),
            files: None,
            reads: CertReads::unregistered()?,
        }))
    }

    /// Serves PEM `cert` and `key` from now on; `Ok(true)` when they differ from what was
    /// served. Connections already open keep the certificate they were made with.
    ///
    /// # Errors
    /// [`Error::Tls`] when they are unusable; the previous certificate stays.
    pub fn replace_pem(&self, cert: &[u8], key: &[u8], source: &str) -> Result<bool, Error> {
        let bytes = [cert, key].concat();
        if self.read_lock().source == bytes {
            return Ok(false);
        }
        let key_pair = parse_named_pair(cert, key, source)?;
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Loaded {
            key: key_pair,
            source: bytes,
        };
        Ok(true)
    }

    /// Serves what `other` serves now; `true` when that differs from what was served.
    /// Connections already open keep the certificate they were made with.
    pub fn copy_from(&self, other: &ServingCert) -> bool {
        let (key, source) = {
            let theirs = other.read_lock();
            if self.read_lock().key.cert == theirs.key.cert {
                return false;
            }
            (theirs.key.clone(), theirs.source.clone())
        };
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Loaded { key, source };
        true
    }

    /// Reads the files again; `Ok(true)` when a new certificate is now served. A certificate
    /// that is not from files never changes.
    ///
    /// # Errors
    /// [`Error::Tls`] when the files changed but are unusable; the previous certificate stays.
    pub fn reload(&self) -> Result<bool, Error> {
        let Some(files) = &self.files else {
            return Ok(false);
        };
        let bytes = self.reads.count(pair_bytes(files))?;
        if self.read_lock().source == bytes {
            return Ok(false);
        }
        let (key, source) = self.reads.count(read_pair(files))?;
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Loaded { key, source };
        Ok(true)
    }

    /// Reloads every [`RELOAD_EVERY`] until `stop`, logging what changed or failed.
    pub fn watch(self: &Arc<Self>, stop: CancellationToken) -> Option<JoinHandle<()>> {
        let files = self.files.clone()?;
        let cert = self.clone();
        Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(RELOAD_EVERY);
            tick.tick().await;
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                match cert.reload() {
                    Ok(true) => {
                        tracing::info!(cert = %files.cert.display(), "serving a new certificate")
                    }
                    Ok(false) => {}
                    Err(error) => {
                        tracing::warn!(%error, "keeping the previous certificate")
                    }
                }
            }
        }))
    }

    /// The certificate chain served now (for tests and logs).
    pub fn chain(&self) -> Vec<CertificateDer<'static>> {
        self.read_lock().key.cert.clone()
    }

    fn read_lock(&self) -> std::sync::RwLockReadGuard<'_, Loaded> {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.read_lock().key.clone())
    }
}

/// Both files' bytes, to tell whether they changed.
fn pair_bytes(files: &CertFiles) -> Result<Vec<u8>, Error> {
    let mut bytes = Vec::new();
    for path in [&files.cert, &files.key] {
        bytes.extend(
            std::fs::read(path)
                .map_err(|e| Error::Tls(format!("cannot read {}: {e}", path.display())))?,
        );
    }
    Ok(bytes)
}

fn read_pair(files: &CertFiles) -> Result<(Arc<CertifiedKey>, Vec<u8>), Error> {
    let (cert_path, key_path) = (&files.cert, &files.key);
    let read = |path: &Path| {
        std::fs::read(path).map_err(|e| Error::Tls(format!("cannot read {}: {e}", path.display())))
    };
    let (cert, key) = (read(cert_path)?, read(key_path)?);
    let certified = parse_pair(
        &cert,
        &key,
        &cert_path.display().to_string(),
        &key_path.display().to_string(),
    )?;
    let mut source = cert;
    source.extend(key);
    Ok((certified, source))
}

/// [`parse_pair`] of a pair kept together, named `<source> certificate` and `<source> key`.
fn parse_named_pair(cert: &[u8], key: &[u8], source: &str) -> Result<Arc<CertifiedKey>, Error> {
    parse_pair(
        cert,
        key,
        &format!("{source} certificate"),
        &format!("{source} key"),
    )
}

/// A PEM certificate chain and its PEM private key, checked to belong together; errors name
/// them as `cert_name` and `key_name`.
fn parse_pair(
    cert: &[u8],
    key: &[u8],
    cert_name: &str,
    key_name: &str,
) -> Result<Arc<CertifiedKey>, Error> {
    let chain = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::Tls(format!("{cert_name}: not a PEM certificate: {e}")))?;
    if chain.is_empty() {
        return Err(Error::Tls(format!("{cert_name}: holds no certificate")));
    }
    let key = PrivateKeyDer::from_pem_slice(key)
        .map_err(|e| Error::Tls(format!("{key_name}: not a PEM private key: {e}")))?;
    let certified = certified(chain, &key)?;
    certified.keys_match().map_err(|e| {
        Error::Tls(format!(
            "{cert_name} and {key_name} do not belong together: {e}"
        ))
    })?;
    Ok(certified)
}

fn certified(
    chain: Vec<CertificateDer<'static>>,
    key: &PrivateKeyDer<'_>,
) -> Result<Arc<CertifiedKey>, Error> {
    let signing =
        any_supported_type(key).map_err(|e| Error::Tls(format!("unsupported private key: {e}")))?;
    Ok(Arc::new(CertifiedKey::new(chain, signing)))
}

/// A server configuration that serves `cert` over HTTP/1.1 (HTTP/2 stays off, as in
/// Kubebuilder's scaffold, against its rapid-reset attacks).
///
/// # Errors
/// [`Error::Tls`] when the TLS library refuses the configuration.
pub fn server_config(cert: Arc<ServingCert>) -> Result<Arc<rustls::ServerConfig>, Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(cert);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> Self {
            let dir = std::env::temp_dir().join(format!("tls-test-{}", fastrand::u64(..)));
            std::fs::create_dir_all(&dir).expect("temp dir");
            Self(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn usual(dir: &Path) -> CertFiles {
        CertFiles::in_dir(dir, CERT_FILE, KEY_FILE)
    }

    fn write_pair(dir: &Path, name: &str) -> Vec<u8> {
        write_pair_to(&usual(dir), name)
    }

    fn write_pair_to(files: &CertFiles, name: &str) -> Vec<u8> {
        let generated =
            rcgen::generate_simple_self_signed(vec![name.to_owned()]).expect("generated");
        std::fs::write(&files.cert, generated.cert.pem()).expect("cert written");
        std::fs::write(&files.key, generated.signing_key.serialize_pem()).expect("key written");
        generated.cert.der().to_vec()
    }

    #[test]
    fn files_of_other_names_are_read_and_named_in_errors() {
        let dir = TempDir::new();
        let files = CertFiles::in_dir(&dir.0, "serving.pem", "serving-key.pem");
        let reads = CertReads::unregistered().expect("counters");
        let error = ServingCert::from_files(&files, &reads)
            .expect_err("no files yet")
            .to_string();
        assert!(error.contains("serving.pem"), "{error}");
        let written = write_pair_to(&files, "other.example");
        let cert = ServingCert::from_files(&files, &reads).expect("loaded");
        assert_eq!(cert.chain()[0].as_ref(), written.as_slice());
    }

    #[test]
    fn files_are_served_and_served_anew_when_they_change() {
        let dir = TempDir::new();
        let first = write_pair(&dir.0, "first.example");
        let reads = CertReads::unregistered().expect("counters");
        let cert = ServingCert::from_files(&usual(&dir.0), &reads).expect("loaded");
        assert_eq!(cert.chain()[0].as_ref(), first.as_slice());
        assert!(!cert.reload().expect("unchanged"), "nothing changed");

        let second = write_pair(&dir.0, "second.example");
        assert!(cert.reload().expect("reloaded"));
        assert_eq!(cert.chain()[0].as_ref(), second.as_slice());

        // A key that is not the certificate's: refused, the second pair stays in service.
        let other = rcgen::KeyPair::generate().expect("key");
        std::fs::write(dir.0.join(KEY_FILE), other.serialize_pem()).expect("key written");
        let error = cert.reload().expect_err("a mismatched pair").to_string();
        assert!(error.contains("do not belong together"), "{error}");
        assert_eq!(cert.chain()[0].as_ref(), second.as_slice());
        // Loaded, then three looks at the files, the last two of them read in full.
        assert_eq!((reads.total.get(), reads.errors.get()), (6, 1));
    }

    #[test]
    fn missing_or_broken_files_are_named() {
        let dir = TempDir::new();
        let error = ServingCert::from_files(
            &usual(&dir.0),
            &CertReads::unregistered().expect("counters"),
        )
        .expect_err("no files")
        .to_string();
        assert!(error.contains(CERT_FILE), "{error}");
        std::fs::write(dir.0.join(CERT_FILE), "not a certificate").expect("written");
        std::fs::write(dir.0.join(KEY_FILE), "not a key").expect("written");
        let error = ServingCert::from_files(
            &usual(&dir.0),
            &CertReads::unregistered().expect("counters"),
        )
        .expect_err("broken")
        .to_string();
        assert!(error.contains(CERT_FILE), "{error}");
    }

    #[test]
    fn a_pem_pair_is_served_and_replaced_only_by_a_usable_one() {
        let first = rcgen::generate_simple_self_signed(vec!["first.example".to_owned()])
            .expect("generated");
        let (cert, key) = (first.cert.pem(), first.signing_key.serialize_pem());
        let served = ServingCert::from_pem(cert.as_bytes(), key.as_bytes(), "Secret s")
            .expect("a usable pair");
        assert_eq!(served.chain()[0].as_ref(), first.cert.der().as_ref());
        assert!(
            !served
                .replace_pem(cert.as_bytes(), key.as_bytes(), "Secret s")
                .expect("the same pair")
        );

        let second = rcgen::generate_simple_self_signed(vec!["second.example".to_owned()])
            .expect("generated");
        let error = served
            .replace_pem(second.cert.pem().as_bytes(), key.as_bytes(), "Secret s")
            .expect_err("the first key does not sign the second certificate")
            .to_string();
        assert!(
            error.contains("Secret s certificate and Secret s key do not belong together"),
            "{error}"
        );
        assert_eq!(served.chain()[0].as_ref(), first.cert.der().as_ref());
        assert!(
            served
                .replace_pem(
                    second.cert.pem().as_bytes(),
                    second.signing_key.serialize_pem().as_bytes(),
                    "Secret s"
                )
                .expect("a usable pair")
        );
        assert_eq!(served.chain()[0].as_ref(), second.cert.der().as_ref());
    }

    #[test]
    fn a_certificate_copied_from_another_serves_its_chain() {
        let first = ServingCert::self_signed(&["first.example".to_owned()]).expect("generated");
        let second = ServingCert::self_signed(&["second.example".to_owned()]).expect("generated");
        assert!(first.copy_from(&second));
        assert_eq!(first.chain(), second.chain());
        assert!(!first.copy_from(&second), "the same again");
    }

    #[test]
    fn a_self_signed_certificate_names_what_it_serves() {
        let cert = ServingCert::self_signed(&["localhost".to_owned()]).expect("generated");
        assert_eq!(cert.chain().len(), 1);
        assert!(!cert.reload().expect("nothing to reload"));
    }
}
