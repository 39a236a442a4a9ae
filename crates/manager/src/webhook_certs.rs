//! The webhook server's certificates, provisioned by the manager itself, with no cert-manager.
//!
//! Every replica reads one Secret in the manager's namespace: a CA, and a serving certificate
//! for the webhook Service's DNS names that it signed. Whichever replica first finds the Secret
//! missing or due for renewal writes it (creates race on the name, updates on the
//! resourceVersion, so concurrent replicas agree on one), and every replica re-reads it every
//! [`WebhookCerts::check_every`] and serves what it holds. The CA bundle goes into the
//! `caBundle` of the webhook configurations and of the CRDs that convert through a webhook,
//! and is put back there when something (a `kubectl replace`, a reinstall) drops it.
//! [`crate::cert_authority`] decides when each certificate is renewed so that no replica
//! serves a certificate the API server does not trust yet.
//!
//! In a sharded group, only the replica that holds the cluster-wide duties writes the Secret
//! and the bundles ([`crate::duties`]); the others wait until the Secret holds a certificate
//! that is still valid, serve it, and serve a certificate of a new CA a check after they first
//! see it.
//!
//! When the Secret is gone (deleted by hand, say), the replica that notices makes a new CA but
//! keeps trusting the CAs in the live bundles, since the other replicas still serve what those
//! signed until their next check; and a replica serves a certificate of a new CA only from the
//! check after the bundles first held it, so the API server's caches of the configurations
//! hold it too.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::cert_authority::{self, Change, Material, Policy};
use crate::duties::Duty;
use crate::tls::ServingCert;

/// How often the Secret and the `caBundle`s are checked, at most.
pub const CHECK_EVERY_AT_MOST: Duration = Duration::from_secs(60);

/// How many times a write that lost a race to another replica is tried again at once.
const RACE_RETRIES: usize = 3;

/// Where the certificates live and what they must cover.
#[derive(Clone, Debug)]
pub struct CertSettings {
    /// The Secret's name.
    pub secret_name: String,
    /// Its namespace: the manager's own.
    pub namespace: String,
    /// Names and addresses the serving certificate carries.
    pub names: Vec<String>,
    /// How long a serving certificate is valid.
    pub validity: Duration,
    /// Which objects get the CA bundle.
    pub targets: InjectionTargets,
}

/// The objects whose `caBundle` the manager keeps current.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InjectionTargets {
    /// MutatingWebhookConfigurations, by name.
    pub mutating: Vec<String>,
    /// ValidatingWebhookConfigurations, by name.
    pub validating: Vec<String>,
    /// CustomResourceDefinitions whose conversion goes through the webhook, by name.
    pub crds: Vec<String>,
}

/// The names a serving certificate for Service `service` in `namespace` carries: the
/// Service's DNS names, and loopback for a manager run as a local process.
pub fn service_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
        format!("{service}.{namespace}"),
        service.to_owned(),
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
    ]
}

/// How long a replica that may not write the Secret waits before reading it again, until the
/// replica that may has written it.
const AWAIT_WRITER_EVERY: Duration = Duration::from_secs(1);

/// The certificates this replica serves, kept current with the Secret.
pub struct WebhookCerts {
    client: Client,
    settings: CertSettings,
    /// Whether this replica writes the Secret and the bundles, or only reads and serves.
    duty: Duty,
    /// When it takes the duties: it checks at once then, since a fresh install's bundles are
    /// empty until the holder fills them.
    taken: Option<tokio::sync::watch::Receiver<u64>>,
    serving: Arc<ServingCert>,
    /// Served alike on other endpoints (the secure metrics), so their clients can verify them
    /// with the Secret's `ca.crt` too.
    also: Vec<Arc<ServingCert>>,
}

impl std::fmt::Debug for WebhookCerts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookCerts")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// What injecting the bundle into one object found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Injection {
    /// It already carried the bundle.
    Current,
    /// It carries the bundle now.
    Updated,
    /// It does not exist (not installed, or installed under other names).
    Missing,
}

impl WebhookCerts {
    /// Reads the Secret, writing it first if it is missing or due for renewal, puts its CA
    /// bundle into every target, and returns the certificate to serve.
    ///
    /// # Errors
    /// [`Error::WebhookCerts`] when the Secret cannot be read or written (a 403 names the
    /// permission); [`Error::Tls`] when a certificate cannot be made. A target that cannot be
    /// updated is only logged: the webhooks are served anyway and the next check tries again.
    pub async fn provision(client: Client, settings: CertSettings) -> Result<Self, Error> {
        Self::provision_as(client, settings, Duty::Anyone).await
    }

    /// [`Self::provision`], writing only while `duty` allows it: a replica that may not write
    /// waits until the Secret holds a serving certificate (written by the one that may), and
    /// from then on only reads it and serves what it holds.
    ///
    /// # Errors
    /// As [`Self::provision`].
    pub async fn provision_as(
        client: Client,
        settings: CertSettings,
        duty: Duty,
    ) -> Result<Self, Error> {
        // Before deciding whether to write: a replica that takes the duties while this
        // provisions (and so only read) checks again at once.
        let mut taken = duty.acquisitions();
        let mut waited = false;
        let material = loop {
            if duty.may_act() {
                // This write is the check the take asks for.
                if let Some(taken) = taken.as_mut() {
                    taken.mark_unchanged();
                }
                break sync_secret(&client, &settings, false).await?;
            }
            let written = read_secret(&client, &settings)
                .await?
                .map(|s| material_of(&s));
            if let Some(material) = written.filter(|m| servable(m, SystemTime::now())) {
                break material;
            }
            if !waited {
                tracing::info!(secret = %secret_label(&settings), "waiting for the replica that holds the cluster-wide duties to write a valid webhook certificate");
                waited = true;
            }
            tokio::time::sleep(AWAIT_WRITER_EVERY).await;
        };
        let serving = serving_pair(&material, &settings)?;
        let serving = ServingCert::from_pem(
            serving.cert.as_bytes(),
            serving.key.as_bytes(),
            &secret_label(&settings),
        )?;
        let certs = Self {
            client,
            settings,
            duty,
            taken,
            serving,
            also: Vec::new(),
        };
        if certs.duty.may_act() {
            certs.inject_logged(&material.trust_bundle()).await;
        }
        Ok(certs)
    }

    /// The certificate the webhook server serves; it changes in place on renewal.
    pub fn serving(&self) -> Arc<ServingCert> {
        self.serving.clone()
    }

    /// Serves the webhook certificate on another endpoint too, from now on and after every
    /// renewal: `cert` is that endpoint's certificate, changed in place. The settings' names
    /// must cover the names that endpoint is reached by.
    pub fn serve_also(&mut self, cert: Arc<ServingCert>) {
        cert.copy_from(&self.serving);
        self.also.push(cert);
    }

    /// How often [`Self::maintain`] looks: a tenth of the validity, at most a minute, so a
    /// short validity (for a rotation test) is still renewed well before it ends.
    pub fn check_every(&self) -> Duration {
        (self.settings.validity / 10).clamp(Duration::from_secs(1), CHECK_EVERY_AT_MOST)
    }

    /// Renews, reloads and re-injects every [`Self::check_every`], and as soon as this replica
    /// takes the duties, until `stop`; failures are logged and tried again at the next check.
    pub async fn maintain(mut self, stop: CancellationToken) {
        let mut tick = tokio::time::interval(self.check_every());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
                () = Duty::taken(&mut self.taken) => {
                    tracing::info!(secret = %secret_label(&self.settings), "took the cluster-wide duties: checking the webhook certificates and bundles now");
                    tick.reset();
                }
            }
            if let Err(error) = self.check().await {
                tracing::warn!(error = %error.report(), "webhook certificates: the check failed; trying again at the next one");
            }
        }
    }

    async fn check(&self) -> Result<(), Error> {
        let writes = self.duty.may_act();
        let material = if writes {
            // Not knowing only delays the next CA's takeover; the serving certificate's
            // renewal must not wait on it.
            let next_is_trusted = self.next_is_trusted().await.unwrap_or_else(|error| {
                tracing::warn!(error = %error.report(), "webhook certificates: cannot tell whether the next CA is trusted everywhere");
                false
            });
            sync_secret(&self.client, &self.settings, next_is_trusted).await?
        } else {
            let material = read_secret(&self.client, &self.settings)
                .await?
                .map(|secret| material_of(&secret))
                .unwrap_or_default();
            if !servable(&material, SystemTime::now()) {
                // Deleted by hand, say: the holder of the duties writes it again.
                tracing::info!(secret = %secret_label(&self.settings), "the Secret holds no valid serving certificate yet; serving the current one until the holder of the cluster-wide duties writes it");
                return Ok(());
            }
            material
        };
        let serving = serving_pair(&material, &self.settings)?;
        let label = secret_label(&self.settings);
        // A certificate is served only once the API server trusts its CA everywhere: after a
        // new CA (the Secret was deleted, say), the bundles get it at this check and the
        // certificate is served from the next, when the API server's caches hold it too. A
        // replica that only reads finds the bundles as the writer left them, perhaps just
        // now, so it waits until the CA is a check old.
        let before = bundles(&self.client, &self.settings.targets).await?;
        let signer = material.signer.as_ref().map(|ca| ca.cert.as_str());
        let trusted = signer.is_some_and(|ca| {
            trusted_everywhere(&before, ca) && (writes || made_at_least(ca, self.check_every()))
        });
        if writes {
            self.inject_logged(&material.trust_bundle()).await;
        }
        if !trusted {
            tracing::info!(secret = %label, "the webhook CA is not yet in every bundle; serving the current certificate until it is");
            return Ok(());
        }
        if self
            .serving
            .replace_pem(serving.cert.as_bytes(), serving.key.as_bytes(), &label)?
        {
            tracing::info!(secret = %label, "serving the renewed webhook certificate");
        }
        for also in &self.also {
            also.copy_from(&self.serving);
        }
        Ok(())
    }

    /// Whether the Secret's next CA is in every target's `caBundle`, and has been in the
    /// Secret for two checks, so the API server's own caches of the configurations hold it.
    async fn next_is_trusted(&self) -> Result<bool, Error> {
        let material = read_secret(&self.client, &self.settings)
            .await?
            .map(|secret| material_of(&secret))
            .unwrap_or_default();
        let Some(next) = material.next else {
            return Ok(false);
        };
        if !made_at_least(&next.cert, 2 * self.check_every()) {
            return Ok(false);
        }
        let bundles = bundles(&self.client, &self.settings.targets).await?;
        Ok(bundles
            .iter()
            .flatten()
            .flatten()
            .all(|bundle| bundle.contains(&next.cert)))
    }

    async fn inject_logged(&self, bundle: &str) {
        match inject(&self.client, &self.settings.targets, bundle).await {
            Ok(outcomes) => {
                for (target, outcome) in outcomes {
                    match outcome {
                        Injection::Updated => {
                            tracing::info!(object = %target, "put the webhook CA bundle in place");
                        }
                        Injection::Missing => {
                            tracing::debug!(object = %target, "not installed: no CA bundle to put in place");
                        }
                        Injection::Current => {}
                    }
                }
            }
            Err(error) => {
                tracing::error!(error = %error.report(), "cannot put the webhook CA bundle in place; the API server cannot call the webhooks until it is");
            }
        }
    }
}

/// Whether `material` holds a serving certificate that is still valid at `now`. A replica that
/// may not write serves nothing else: a Secret left by a group that stopped longer ago than the
/// validity holds an expired one, which the API server would refuse until the duties' holder
/// (perhaps this very replica, once its election is through) issues a new one.
fn servable(material: &Material, now: SystemTime) -> bool {
    material
        .serving
        .as_ref()
        .and_then(cert_authority::Summary::of_pair)
        .is_some_and(|serving| serving.remaining(now) > Duration::ZERO)
}

/// Whether the certificate `pem` was made at least `age` ago.
fn made_at_least(pem: &str, age: Duration) -> bool {
    cert_authority::Summary::of_pem(pem).is_some_and(|summary| {
        let made = summary.not_before + cert_authority::BACKDATE;
        SystemTime::now()
            .duration_since(made)
            .is_ok_and(|since| since >= age)
    })
}

fn secret_label(settings: &CertSettings) -> String {
    format!("Secret {}/{}", settings.namespace, settings.secret_name)
}

fn material_of(secret: &Secret) -> Material {
    let data = secret
        .data
        .as_ref()
        .map(|data| {
            data.iter()
                .map(|(key, value)| (key.clone(), value.0.clone()))
                .collect()
        })
        .unwrap_or_default();
    Material::from_data(&data)
}

fn serving_pair<'a>(
    material: &'a Material,
    settings: &CertSettings,
) -> Result<&'a cert_authority::KeyedCert, Error> {
    material.serving.as_ref().ok_or_else(|| {
        Error::Tls(format!(
            "{} holds no serving certificate",
            secret_label(settings)
        ))
    })
}

fn policy(settings: &CertSettings) -> Policy {
    Policy {
        names: settings.names.clone(),
        validity: settings.validity,
    }
}

async fn read_secret(client: &Client, settings: &CertSettings) -> Result<Option<Secret>, Error> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &settings.namespace);
    get_opt(&api, &settings.secret_name).await
}

/// The Secret's certificates, renewed and written back first when due. A write that loses a
/// race to another replica reads again and goes by what that replica wrote.
async fn sync_secret(
    client: &Client,
    settings: &CertSettings,
    next_is_trusted: bool,
) -> Result<Material, Error> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &settings.namespace);
    let label = secret_label(settings);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let existing = read_secret(client, settings).await?;
        let mut current = existing.as_ref().map(material_of).unwrap_or_default();
        if current.signer.is_none() && current.trusted.is_empty() {
            // The Secret is gone (or was never written): the replicas still serve what the CAs
            // in the live bundles signed, so those stay trusted beside the new one.
            current.trusted = cas_in(&bundles(client, &settings.targets).await?);
        }
        let (renewed, changes) = cert_authority::renew(
            &current,
            &policy(settings),
            SystemTime::now(),
            next_is_trusted,
        )?;
        if changes.is_empty() {
            return Ok(renewed);
        }
        let written = match existing {
            None => {
                let secret = Secret {
                    metadata: ObjectMeta {
                        name: Some(settings.secret_name.clone()),
                        namespace: Some(settings.namespace.clone()),
                        labels: Some(
                            [(
                                "app.kubernetes.io/managed-by".to_owned(),
                                product::name!().to_owned(),
                            )]
                            .into(),
                        ),
                        ..ObjectMeta::default()
                    },
                    type_: Some("kubernetes.io/tls".to_owned()),
                    data: Some(byte_strings(&renewed)),
                    ..Secret::default()
                };
                api.create(&PostParams::default(), &secret).await
            }
            Some(mut secret) => {
                // The resourceVersion read above makes this fail if another replica wrote
                // in between, instead of overwriting its certificates.
                secret.data = Some(byte_strings(&renewed));
                secret.string_data = None;
                api.replace(&settings.secret_name, &PostParams::default(), &secret)
                    .await
            }
        };
        match written {
            Ok(_) => {
                for change in &changes {
                    log_change(change, &label);
                }
                return Ok(renewed);
            }
            Err(kube::Error::Api(status)) if (status.code == 409) && attempt <= RACE_RETRIES => {
                tracing::debug!(secret = %label, "another replica wrote the webhook certificates first; reading them");
            }
            Err(source) => {
                return Err(Error::WebhookCerts {
                    action: format!("write {label}"),
                    source,
                });
            }
        }
    }
}

fn log_change(change: &Change, secret: &str) {
    match change {
        Change::NewSigner => tracing::info!(%secret, "made a new webhook CA"),
        Change::NextCaTrusted => {
            tracing::info!(%secret, "made the next webhook CA and added it to the trusted bundle")
        }
        Change::NextCaSigns => tracing::info!(%secret, "the next webhook CA signs from now on"),
        Change::ExpiredCaDropped => {
            tracing::info!(%secret, "dropped an expired CA from the trusted bundle")
        }
        Change::ServingIssued(reason) => {
            tracing::info!(%secret, reason, "issued a webhook serving certificate")
        }
    }
}

fn byte_strings(material: &Material) -> std::collections::BTreeMap<String, ByteString> {
    material
        .to_data()
        .into_iter()
        .map(|(key, value)| (key, ByteString(value)))
        .collect()
}

async fn get_opt<K>(api: &Api<K>, name: &str) -> Result<Option<K>, Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    api.get_opt(name)
        .await
        .map_err(|source| Error::WebhookCerts {
            action: format!("read {} {name}", K::kind(&K::DynamicType::default())),
            source,
        })
}

/// An object whose `caBundle` fields the manager keeps.
trait CarriesBundle:
    kube::Resource<DynamicType = ()>
    + Clone
    + serde::Serialize
    + serde::de::DeserializeOwned
    + std::fmt::Debug
{
    /// Every `caBundle` of the object that the API server uses to call the manager.
    fn ca_bundles(&mut self) -> Vec<&mut Option<ByteString>>;
}

impl CarriesBundle for MutatingWebhookConfiguration {
    fn ca_bundles(&mut self) -> Vec<&mut Option<ByteString>> {
        let hooks = self.webhooks.iter_mut().flatten();
        hooks
            .map(|hook| &mut hook.client_config.ca_bundle)
            .collect()
    }
}

impl CarriesBundle for ValidatingWebhookConfiguration {
    fn ca_bundles(&mut self) -> Vec<&mut Option<ByteString>> {
        let hooks = self.webhooks.iter_mut().flatten();
        hooks
            .map(|hook| &mut hook.client_config.ca_bundle)
            .collect()
    }
}

impl CarriesBundle for CustomResourceDefinition {
    /// Only a CRD installed with webhook conversion calls the webhook.
    fn ca_bundles(&mut self) -> Vec<&mut Option<ByteString>> {
        let conversion = self.spec.conversion.as_mut();
        let client_config = conversion
            .and_then(|c| c.webhook.as_mut())
            .and_then(|w| w.client_config.as_mut());
        client_config
            .map(|c| &mut c.ca_bundle)
            .into_iter()
            .collect()
    }
}

/// The bundles of each target (one per webhook), `None` for targets that do not exist.
async fn bundles(
    client: &Client,
    targets: &InjectionTargets,
) -> Result<Vec<Option<Vec<String>>>, Error> {
    let mut found = Vec::new();
    found.extend(bundles_of::<MutatingWebhookConfiguration>(client, &targets.mutating).await?);
    found.extend(bundles_of::<ValidatingWebhookConfiguration>(client, &targets.validating).await?);
    found.extend(bundles_of::<CustomResourceDefinition>(client, &targets.crds).await?);
    Ok(found)
}

/// Every CA certificate in `bundles`, once each, in the order found.
fn cas_in(bundles: &[Option<Vec<String>>]) -> Vec<String> {
    let mut cas: Vec<String> = Vec::new();
    for bundle in bundles.iter().flatten().flatten() {
        for pem in cert_authority::pem_blocks(bundle) {
            let is_ca = cert_authority::Summary::of_pem(&pem).is_some_and(|c| c.is_ca);
            if is_ca && !cas.contains(&pem) {
                cas.push(pem);
            }
        }
    }
    cas
}

/// Whether every bundle of every existing target holds `ca`.
fn trusted_everywhere(bundles: &[Option<Vec<String>>], ca: &str) -> bool {
    bundles.iter().flatten().flatten().all(|bundle| {
        cert_authority::pem_blocks(bundle)
            .iter()
            .any(|pem| pem == ca)
    })
}

/// The bundles of each of `names`, `None` for those that do not exist.
async fn bundles_of<K: CarriesBundle>(
    client: &Client,
    names: &[String],
) -> Result<Vec<Option<Vec<String>>>, Error> {
    let api: Api<K> = Api::all(client.clone());
    let mut found = Vec::new();
    for name in names {
        found.push(get_opt(&api, name).await?.map(|mut object| {
            object
                .ca_bundles()
                .into_iter()
                .map(|bundle| {
                    bundle
                        .as_ref()
                        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
                        .unwrap_or_default()
                })
                .collect()
        }));
    }
    Ok(found)
}

/// Puts `bundle` into every target that lacks it; each write carries the resourceVersion it
/// read, so a concurrent change makes it fail and the next check try again.
async fn inject(
    client: &Client,
    targets: &InjectionTargets,
    bundle: &str,
) -> Result<Vec<(String, Injection)>, Error> {
    let wanted = ByteString(bundle.as_bytes().to_vec());
    let mut outcomes = Vec::new();
    outcomes.extend(
        inject_into::<MutatingWebhookConfiguration>(client, &targets.mutating, &wanted).await?,
    );
    outcomes.extend(
        inject_into::<ValidatingWebhookConfiguration>(client, &targets.validating, &wanted).await?,
    );
    outcomes.extend(inject_into::<CustomResourceDefinition>(client, &targets.crds, &wanted).await?);
    Ok(outcomes)
}

async fn inject_into<K: CarriesBundle>(
    client: &Client,
    names: &[String],
    wanted: &ByteString,
) -> Result<Vec<(String, Injection)>, Error> {
    let api: Api<K> = Api::all(client.clone());
    let mut outcomes = Vec::new();
    for name in names {
        let outcome = update_if(&api, name, |object: &mut K| {
            let mut changed = false;
            for field in object.ca_bundles() {
                changed |= set_bundle(field, wanted);
            }
            changed
        })
        .await?;
        outcomes.push((format!("{} {name}", K::kind(&())), outcome));
    }
    Ok(outcomes)
}

fn set_bundle(field: &mut Option<ByteString>, wanted: &ByteString) -> bool {
    if field.as_ref() == Some(wanted) {
        return false;
    }
    *field = Some(wanted.clone());
    true
}

/// Reads `name`, lets `change` edit it, and writes it back if it changed. A write that loses
/// a race (another replica injecting the same bundle at once) reads again and retries.
async fn update_if<K>(
    api: &Api<K>,
    name: &str,
    change: impl Fn(&mut K) -> bool,
) -> Result<Injection, Error>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    let mut attempt = 0;
    loop {
        attempt += 1;
        let Some(mut object) = get_opt(api, name).await? else {
            return Ok(Injection::Missing);
        };
        if !change(&mut object) {
            return Ok(Injection::Current);
        }
        match api.replace(name, &PostParams::default(), &object).await {
            Ok(_) => return Ok(Injection::Updated),
            Err(kube::Error::Api(status)) if status.code == 409 && attempt <= RACE_RETRIES => {}
            Err(source) => {
                return Err(Error::WebhookCerts {
                    action: format!("update {} {name}", K::kind(&K::DynamicType::default())),
                    source,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_that_only_reads_serves_no_expired_certificate() {
        let policy = Policy {
            names: vec!["hooks.system.svc".to_owned()],
            validity: Duration::from_secs(30),
        };
        let issued = SystemTime::now();
        let (material, _) = cert_authority::renew(&Material::default(), &policy, issued, false)
            .expect("certificates");
        assert!(servable(&material, issued));
        assert!(!servable(&material, issued + Duration::from_secs(31)));
        assert!(!servable(&Material::default(), issued));
    }

    #[test]
    fn the_certificate_names_the_service_and_loopback() {
        let names = service_names("hooks", "system");
        assert_eq!(
            names,
            vec![
                "hooks.system.svc",
                "hooks.system.svc.cluster.local",
                "hooks.system",
                "hooks",
                "localhost",
                "127.0.0.1"
            ]
        );
    }

    fn ca(name: &str) -> String {
        let policy = Policy {
            names: vec![name.to_owned()],
            validity: Duration::from_secs(3600),
        };
        let (material, _) =
            cert_authority::renew(&Material::default(), &policy, SystemTime::now(), false)
                .expect("a CA");
        material.signer.expect("signer").cert
    }

    #[test]
    fn the_cas_of_the_live_bundles_are_found_once_each() {
        let (old, new) = (ca("a"), ca("b"));
        let bundles = vec![
            Some(vec![old.clone(), format!("{old}{new}")]),
            None,
            Some(vec![String::new(), "not a certificate".to_owned()]),
        ];
        assert_eq!(cas_in(&bundles), vec![old.clone(), new.clone()]);
        assert!(trusted_everywhere(&bundles[..1], &old));
        assert!(
            !trusted_everywhere(&bundles[..1], &new),
            "the first bundle lacks it"
        );
        assert!(
            !trusted_everywhere(&bundles, &old),
            "an empty bundle trusts nothing"
        );
        assert!(
            trusted_everywhere(&[None], &new),
            "a target that does not exist"
        );
    }

    #[test]
    fn a_new_ca_keeps_the_ones_the_live_bundles_trust() {
        let old = ca("a");
        let seeded = Material {
            trusted: vec![old.clone()],
            ..Material::default()
        };
        let policy = Policy {
            names: vec!["hooks.system.svc".to_owned()],
            validity: Duration::from_secs(3600),
        };
        let (renewed, _) =
            cert_authority::renew(&seeded, &policy, SystemTime::now(), false).expect("renewed");
        let signer = renewed.signer.expect("a new signer").cert;
        assert_ne!(signer, old);
        assert_eq!(renewed.trusted, vec![old, signer]);
    }

    #[test]
    fn a_bundle_is_only_written_where_it_differs() {
        let wanted = ByteString(b"bundle".to_vec());
        let mut field = None;
        assert!(set_bundle(&mut field, &wanted));
        assert!(!set_bundle(&mut field, &wanted));
        let mut stale = Some(ByteString(b"old".to_vec()));
        assert!(set_bundle(&mut stale, &wanted));
        assert_eq!(stale, Some(wanted));
    }
}
