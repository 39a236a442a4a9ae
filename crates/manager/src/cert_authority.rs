//! The webhook certificates' lifecycle, as a pure function of what their Secret holds and the
//! time: a CA, the serving certificate it signs, and when each is renewed.
//!
//! The rule that keeps renewals free of failed admissions: a certificate is only ever served
//! once the CA that signed it is in the bundle the API server already trusts.
//!
//! - The serving certificate is renewed when a third of its validity is left, when it lacks a
//!   name it must carry, or when it was signed by a CA that no longer signs. The same CA signs
//!   the new one, so nothing the API server trusts changes.
//! - Either is replaced the same way when it outlasts a validity that was shortened since.
//! - The CA lives [`CA_LIFETIMES`] times as long. With half of its life left, a next CA is made
//!   and added to the trusted bundle, but signs nothing yet. It takes over
//!   ([`renew`]'s `next_is_trusted`) only after the caller has seen the bundle holding it in
//!   every webhook configuration. The old CA stays in the bundle until it expires, so
//!   certificates it signed stay trusted while replicas move to the new one.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PublicKeyData as _,
};
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::FromDer as _;

use crate::Error;

/// How many times longer than the serving certificate the CA is valid.
pub const CA_LIFETIMES: u32 = 4;

/// How far past the configured validity a certificate may reach before it counts as made
/// under a longer validity (and is replaced, so a shortened validity takes effect at once).
const VALIDITY_TOLERANCE: Duration = Duration::from_secs(60);

/// Certificates start this long before they are made, so a peer whose clock is behind ours
/// does not see them as not yet valid.
pub const BACKDATE: Duration = Duration::from_secs(5 * 60);

/// The Secret's keys. `tls.crt` and `tls.key` are what a `kubernetes.io/tls` Secret holds and
/// what `--webhook-cert-path` reads; `ca.crt` is the bundle the webhook configurations trust.
pub mod keys {
    /// The serving certificate.
    pub const SERVING_CERT: &str = "tls.crt";
    /// The serving certificate's private key.
    pub const SERVING_KEY: &str = "tls.key";
    /// Every CA to trust, concatenated PEM.
    pub const TRUSTED: &str = "ca.crt";
    /// The CA that signs serving certificates now.
    pub const SIGNER_CERT: &str = "ca-signer.crt";
    /// Its private key.
    pub const SIGNER_KEY: &str = "ca-signer.key";
    /// The CA that takes over once it is trusted everywhere (only during a CA rotation).
    pub const NEXT_CERT: &str = "ca-next.crt";
    /// Its private key.
    pub const NEXT_KEY: &str = "ca-next.key";
}

/// A PEM certificate and its PEM private key.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyedCert {
    /// The certificate, PEM.
    pub cert: String,
    /// Its private key, PEM (PKCS#8).
    pub key: String,
}

impl std::fmt::Debug for KeyedCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("KeyedCert")
            .field("cert", &self.cert)
            .finish_non_exhaustive()
    }
}

/// What the Secret holds: every field may be missing or broken, which [`renew`] repairs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Material {
    /// The CAs the webhook configurations trust, one PEM certificate each.
    pub trusted: Vec<String>,
    /// The CA that signs.
    pub signer: Option<KeyedCert>,
    /// The CA that will sign once trusted everywhere.
    pub next: Option<KeyedCert>,
    /// The certificate the webhook server serves.
    pub serving: Option<KeyedCert>,
}

impl Material {
    /// Reads a Secret's data; keys that are missing or not UTF-8 count as absent.
    pub fn from_data(data: &BTreeMap<String, Vec<u8>>) -> Self {
        let text = |key: &str| {
            data.get(key)
                .and_then(|bytes| String::from_utf8(bytes.clone()).ok())
                .filter(|text| !text.trim().is_empty())
        };
        let pair = |cert: &str, key: &str| {
            Some(KeyedCert {
                cert: text(cert)?,
                key: text(key)?,
            })
        };
        Self {
            trusted: text(keys::TRUSTED)
                .map(|bundle| pem_blocks(&bundle))
                .unwrap_or_default(),
            signer: pair(keys::SIGNER_CERT, keys::SIGNER_KEY),
            next: pair(keys::NEXT_CERT, keys::NEXT_KEY),
            serving: pair(keys::SERVING_CERT, keys::SERVING_KEY),
        }
    }

    /// The Secret's data.
    pub fn to_data(&self) -> BTreeMap<String, Vec<u8>> {
        let mut data = BTreeMap::new();
        data.insert(keys::TRUSTED.to_owned(), self.trust_bundle().into_bytes());
        let pairs = [
            (&self.signer, keys::SIGNER_CERT, keys::SIGNER_KEY),
            (&self.next, keys::NEXT_CERT, keys::NEXT_KEY),
            (&self.serving, keys::SERVING_CERT, keys::SERVING_KEY),
        ];
        for (pair, cert_key, key_key) in pairs {
            if let Some(pair) = pair {
                data.insert(cert_key.to_owned(), pair.cert.clone().into_bytes());
                data.insert(key_key.to_owned(), pair.key.clone().into_bytes());
            }
        }
        data
    }

    /// The PEM bundle the webhook configurations' `caBundle` carries.
    pub fn trust_bundle(&self) -> String {
        self.trusted.concat()
    }
}

/// What the certificates must be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// The DNS names and IP addresses the serving certificate carries.
    pub names: Vec<String>,
    /// How long a serving certificate is valid; the CA, [`CA_LIFETIMES`] times as long.
    pub validity: Duration,
}

impl Policy {
    fn ca_validity(&self) -> Duration {
        self.validity.saturating_mul(CA_LIFETIMES)
    }
}

/// One step [`renew`] took, for the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// A CA was made to sign at once: there was none that could.
    NewSigner,
    /// A next CA was made and added to the trusted bundle.
    NextCaTrusted,
    /// The next CA took over signing.
    NextCaSigns,
    /// A CA past its expiry left the bundle.
    ExpiredCaDropped,
    /// A new serving certificate was issued, for the reason given.
    ServingIssued(&'static str),
}

/// `current` brought up to `policy` at `now`; the material is unchanged when the changes are
/// empty. `next_is_trusted` says every webhook configuration trusts `current.next` and has
/// done so long enough for the API server to use it.
///
/// # Errors
/// [`Error::Tls`] when a key or certificate cannot be generated.
pub fn renew(
    current: &Material,
    policy: &Policy,
    now: SystemTime,
    next_is_trusted: bool,
) -> Result<(Material, Vec<Change>), Error> {
    let mut material = current.clone();
    let mut changes = Vec::new();

    let before = material.trusted.len();
    material
        .trusted
        .retain(|pem| Summary::of_pem(pem).is_some_and(|ca| ca.not_after > now));
    if material.trusted.len() != before {
        changes.push(Change::ExpiredCaDropped);
    }

    let usable_ca = |pair: &Option<KeyedCert>| {
        pair.as_ref()
            .and_then(Summary::of_pair)
            .filter(|ca| ca.is_ca && ca.not_after > now)
    };
    if usable_ca(&material.next).is_none() {
        material.next = None;
    }
    match usable_ca(&material.signer) {
        None => {
            // Nothing can sign (first start, or expired while no replica ran): a next CA takes
            // over even if not yet trusted, since nothing better exists.
            if material.next.is_some() {
                material.signer = material.next.take();
                changes.push(Change::NextCaSigns);
            } else {
                material.signer = Some(new_ca(policy, now)?);
                changes.push(Change::NewSigner);
            }
        }
        Some(signer) => {
            if material.next.is_some() && next_is_trusted {
                material.signer = material.next.take();
                changes.push(Change::NextCaSigns);
            } else if material.next.is_none()
                && (signer.remaining(now) <= policy.ca_validity() / 2
                    || signer.remaining(now) > policy.ca_validity() + VALIDITY_TOLERANCE)
            {
                material.next = Some(new_ca(policy, now)?);
                changes.push(Change::NextCaTrusted);
            }
        }
    }
    for ca in [&material.signer, &material.next].into_iter().flatten() {
        if !material.trusted.contains(&ca.cert) {
            material.trusted.push(ca.cert.clone());
        }
    }

    let Some(signer) = material.signer.clone() else {
        return Err(Error::Tls("no CA to sign the webhook certificate".into()));
    };
    if let Some(reason) = serving_renewal_reason(material.serving.as_ref(), &signer, policy, now) {
        material.serving = Some(new_serving(&signer, policy, now)?);
        changes.push(Change::ServingIssued(reason));
    }
    Ok((material, changes))
}

/// Why the serving certificate must be issued anew, if it must.
fn serving_renewal_reason(
    serving: Option<&KeyedCert>,
    signer: &KeyedCert,
    policy: &Policy,
    now: SystemTime,
) -> Option<&'static str> {
    let Some(serving) = serving else {
        return Some("there was none");
    };
    let Some(summary) = Summary::of_pair(serving) else {
        return Some("the stored one was unusable");
    };
    if !signed_by(&serving.cert, &signer.cert) {
        return Some("the CA that signs changed");
    }
    // A certificate carrying more names than wanted is kept: replicas of two releases, one
    // wanting a name more (the metrics Service's), agree on the larger set instead of taking
    // turns at issuing.
    let wanted: BTreeSet<String> = policy.names.iter().map(|n| normalized(n)).collect();
    if !wanted.is_subset(&summary.names) {
        return Some("the names it must carry changed");
    }
    if summary.remaining(now) <= policy.validity / 3 {
        return Some("a third of its validity was left");
    }
    if summary.remaining(now) > policy.validity + VALIDITY_TOLERANCE {
        return Some("it outlasts the configured validity");
    }
    None
}

fn new_ca(policy: &Policy, now: SystemTime) -> Result<KeyedCert, Error> {
    let key = KeyPair::generate().map_err(|e| tls_error("a CA key", &e))?;
    let mut params = CertificateParams::default();
    // A name of its own per CA, so the old and the next one are told apart in a bundle.
    let made = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    params.distinguished_name.push(
        DnType::CommonName,
        format!("{}-webhook-ca@{made}", product::NAME),
    );
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    set_validity(&mut params, now, policy.ca_validity())?;
    let cert = params
        .self_signed(&key)
        .map_err(|e| tls_error("a CA certificate", &e))?;
    Ok(KeyedCert {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

fn new_serving(signer: &KeyedCert, policy: &Policy, now: SystemTime) -> Result<KeyedCert, Error> {
    let ca_key = KeyPair::from_pem(&signer.key).map_err(|e| tls_error("the CA key", &e))?;
    let issuer = Issuer::from_ca_cert_pem(&signer.cert, ca_key)
        .map_err(|e| tls_error("the CA certificate", &e))?;
    let key = KeyPair::generate().map_err(|e| tls_error("a serving key", &e))?;
    let mut params = CertificateParams::new(policy.names.clone())
        .map_err(|e| tls_error("the serving certificate's names", &e))?;
    if let Some(first) = policy.names.first() {
        params
            .distinguished_name
            .push(DnType::CommonName, first.clone());
    }
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.use_authority_key_identifier_extension = true;
    // Never past the CA's own expiry: a chain is only as valid as its shortest link.
    let ca_left = Summary::of_pem(&signer.cert)
        .map(|ca| ca.remaining(now))
        .unwrap_or_default();
    set_validity(&mut params, now, policy.validity.min(ca_left))?;
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(|e| tls_error("the serving certificate", &e))?;
    Ok(KeyedCert {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

fn set_validity(
    params: &mut CertificateParams,
    now: SystemTime,
    validity: Duration,
) -> Result<(), Error> {
    let at = |time: SystemTime| {
        let seconds = time
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_err(|_| Error::Tls("the clock is before 1970".into()))?
            .as_secs();
        let seconds = i64::try_from(seconds)
            .map_err(|_| Error::Tls("the clock is past the year 2262".into()))?;
        time::OffsetDateTime::from_unix_timestamp(seconds)
            .map_err(|e| Error::Tls(format!("cannot represent {seconds} as a date: {e}")))
    };
    params.not_before = at(now.checked_sub(BACKDATE).unwrap_or(now))?;
    params.not_after = at(now.checked_add(validity).unwrap_or(now))?;
    Ok(())
}

fn tls_error(what: &str, error: &rcgen::Error) -> Error {
    Error::Tls(format!("cannot make {what} for the webhooks: {error}"))
}

/// What [`renew`] needs to know of a certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    /// When it stops being valid.
    pub not_after: SystemTime,
    /// When it started being valid.
    pub not_before: SystemTime,
    /// Whether it is a CA.
    pub is_ca: bool,
    /// Its DNS names and IP addresses.
    pub names: BTreeSet<String>,
}

impl Summary {
    /// The first certificate in `pem`, if it parses.
    pub fn of_pem(pem: &str) -> Option<Self> {
        let der = first_der(pem)?;
        let (_, cert) = X509Certificate::from_der(&der).ok()?;
        let at = |seconds: i64| {
            u64::try_from(seconds)
                .ok()
                .map(|s| SystemTime::UNIX_EPOCH + Duration::from_secs(s))
        };
        let mut names = BTreeSet::new();
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for name in &san.value.general_names {
                match name {
                    GeneralName::DNSName(dns) => {
                        names.insert(normalized(dns));
                    }
                    GeneralName::IPAddress(bytes) => {
                        if let Some(ip) = ip_from_bytes(bytes) {
                            names.insert(ip.to_string());
                        }
                    }
                    _ => {}
                }
            }
        }
        Some(Self {
            not_after: at(cert.validity().not_after.timestamp())?,
            not_before: at(cert.validity().not_before.timestamp())?,
            is_ca: cert.is_ca(),
            names,
        })
    }

    /// The certificate of `pair`, if it parses and `pair.key` is its key.
    pub fn of_pair(pair: &KeyedCert) -> Option<Self> {
        let der = first_der(&pair.cert)?;
        let (_, cert) = X509Certificate::from_der(&der).ok()?;
        let key = KeyPair::from_pem(&pair.key).ok()?;
        if key.subject_public_key_info() != cert.public_key().raw {
            return None;
        }
        Self::of_pem(&pair.cert)
    }

    /// How long it stays valid after `now`.
    pub fn remaining(&self, now: SystemTime) -> Duration {
        self.not_after.duration_since(now).unwrap_or_default()
    }
}

/// Whether the first certificate in `cert` carries a signature by `ca`'s key.
pub fn signed_by(cert: &str, ca: &str) -> bool {
    let (Some(cert), Some(ca)) = (first_der(cert), first_der(ca)) else {
        return false;
    };
    let (Ok((_, cert)), Ok((_, ca))) = (
        X509Certificate::from_der(&cert),
        X509Certificate::from_der(&ca),
    ) else {
        return false;
    };
    cert.verify_signature(Some(ca.public_key())).is_ok()
}

fn first_der(pem: &str) -> Option<Vec<u8>> {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
    Some(block.contents)
}

/// Each `CERTIFICATE` block of a PEM bundle, as its own PEM text ending in a newline.
pub fn pem_blocks(bundle: &str) -> Vec<String> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut blocks = Vec::new();
    let mut rest = bundle;
    while let Some(start) = rest.find(BEGIN) {
        let Some(length) = rest[start..].find(END) else {
            break;
        };
        let end = start + length + END.len();
        blocks.push(format!("{}\n", &rest[start..end]));
        rest = &rest[end..];
    }
    blocks
}

fn normalized(name: &str) -> String {
    name.parse::<IpAddr>()
        .map_or_else(|_| name.to_ascii_lowercase(), |ip| ip.to_string())
}

fn ip_from_bytes(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes).ok().map(IpAddr::from),
        16 => <[u8; 16]>::try_from(bytes).ok().map(IpAddr::from),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(24 * 60 * 60);

    fn policy() -> Policy {
        Policy {
            names: vec![
                concat!(
                    product::name!(),
                    concat!("-webhook.", product::namespace!(), ".svc")
                )
                .to_owned(),
                "127.0.0.1".to_owned(),
            ],
            validity: 90 * DAY,
        }
    }

    fn start() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
    }

    fn serving(material: &Material) -> &KeyedCert {
        material.serving.as_ref().expect("a serving certificate")
    }

    #[test]
    fn an_empty_secret_gets_a_ca_and_a_serving_certificate_it_signed() {
        let (material, changes) =
            renew(&Material::default(), &policy(), start(), false).expect("issued");
        assert_eq!(
            changes,
            vec![Change::NewSigner, Change::ServingIssued("there was none")]
        );
        let signer = material.signer.as_ref().expect("a signer");
        assert_eq!(material.trusted, vec![signer.cert.clone()]);
        assert!(signed_by(&serving(&material).cert, &signer.cert));
        let summary = Summary::of_pair(serving(&material)).expect("a usable pair");
        assert_eq!(
            summary.names,
            BTreeSet::from([
                concat!(
                    product::name!(),
                    concat!("-webhook.", product::namespace!(), ".svc")
                )
                .to_owned(),
                "127.0.0.1".to_owned()
            ])
        );
        assert_eq!(summary.not_after, start() + 90 * DAY);
        assert_eq!(summary.not_before, start() - BACKDATE);
        let ca = Summary::of_pem(&signer.cert).expect("the CA parses");
        assert!(ca.is_ca);
        assert_eq!(ca.not_after, start() + 360 * DAY);
    }

    #[test]
    fn what_the_secret_holds_round_trips_and_is_kept_while_current() {
        let (material, _) = renew(&Material::default(), &policy(), start(), false).expect("issued");
        let read = Material::from_data(&material.to_data());
        assert_eq!(read, material);
        let (again, changes) = renew(&read, &policy(), start() + DAY, false).expect("renewed");
        assert!(changes.is_empty(), "{changes:?}");
        assert_eq!(again, material);
    }

    #[test]
    fn the_serving_certificate_is_renewed_with_a_third_left_by_the_same_ca() {
        let (first, _) = renew(&Material::default(), &policy(), start(), false).expect("issued");
        let (kept, changes) = renew(&first, &policy(), start() + 59 * DAY, false).expect("ok");
        assert!(changes.is_empty(), "{changes:?}");
        let (renewed, changes) = renew(&kept, &policy(), start() + 60 * DAY, false).expect("ok");
        assert_eq!(
            changes,
            vec![Change::ServingIssued("a third of its validity was left")]
        );
        assert_eq!(renewed.signer, first.signer);
        assert_eq!(renewed.trusted, first.trusted);
        assert_ne!(serving(&renewed), serving(&first));
    }

    #[test]
    fn new_names_or_a_broken_pair_issue_a_new_serving_certificate() {
        let (first, _) = renew(&Material::default(), &policy(), start(), false).expect("issued");
        let mut more = policy();
        more.names.push("localhost".to_owned());
        let (wider, changes) = renew(&first, &more, start(), false).expect("ok");
        assert_eq!(
            changes,
            vec![Change::ServingIssued("the names it must carry changed")]
        );
        let (_, changes) = renew(&wider, &policy(), start(), false).expect("ok");
        assert!(
            changes.is_empty(),
            "a replica wanting fewer names keeps the wider certificate: {changes:?}"
        );

        let mut broken = first.clone();
        if let Some(pair) = broken.serving.as_mut() {
            pair.key = first.signer.as_ref().expect("a signer").key.clone();
        }
        let (repaired, changes) = renew(&broken, &policy(), start(), false).expect("ok");
        assert_eq!(
            changes,
            vec![Change::ServingIssued("the stored one was unusable")]
        );
        assert!(Summary::of_pair(serving(&repaired)).is_some());
    }

    #[test]
    fn the_next_ca_is_trusted_first_and_signs_only_once_trusted_everywhere() {
        let (first, _) = renew(&Material::default(), &policy(), start(), false).expect("issued");
        let half = start() + 180 * DAY;
        let (rotating, changes) = renew(&first, &policy(), half, false).expect("ok");
        assert!(changes.contains(&Change::NextCaTrusted), "{changes:?}");
        let next = rotating.next.clone().expect("a next CA");
        assert_eq!(rotating.signer, first.signer, "the old CA still signs");
        assert_eq!(rotating.trusted.len(), 2);
        assert!(rotating.trusted.contains(&next.cert));

        // Not yet seen everywhere: nothing moves.
        let (waiting, changes) = renew(&rotating, &policy(), half + DAY, false).expect("ok");
        assert!(!changes.contains(&Change::NextCaSigns), "{changes:?}");
        assert_eq!(waiting.next.as_ref(), Some(&next));

        let (promoted, changes) = renew(&waiting, &policy(), half + DAY, true).expect("ok");
        assert_eq!(
            changes,
            vec![
                Change::NextCaSigns,
                Change::ServingIssued("the CA that signs changed")
            ]
        );
        assert_eq!(promoted.signer.as_ref(), Some(&next));
        assert_eq!(promoted.next, None);
        assert!(signed_by(&serving(&promoted).cert, &next.cert));
        assert_eq!(
            promoted.trusted.len(),
            2,
            "the old CA stays until it expires"
        );

        let old_expiry = start() + 360 * DAY;
        let (pruned, changes) = renew(&promoted, &policy(), old_expiry, false).expect("ok");
        assert!(changes.contains(&Change::ExpiredCaDropped), "{changes:?}");
        let old = &first.signer.as_ref().expect("the first CA").cert;
        assert!(!pruned.trusted.contains(old));
        assert_eq!(pruned.trusted[0], next.cert);
    }

    #[test]
    fn a_shortened_validity_replaces_both_certificates_the_safe_way() {
        let (first, _) = renew(&Material::default(), &policy(), start(), false).expect("issued");
        let short = Policy {
            validity: Duration::from_secs(30),
            ..policy()
        };
        let (shortened, changes) = renew(&first, &short, start(), false).expect("ok");
        assert_eq!(
            changes,
            vec![
                Change::NextCaTrusted,
                Change::ServingIssued("it outlasts the configured validity")
            ]
        );
        assert_eq!(
            shortened.signer, first.signer,
            "the long CA signs until the next is trusted"
        );
        let summary = Summary::of_pem(&serving(&shortened).cert).expect("parses");
        assert_eq!(summary.not_after, start() + Duration::from_secs(30));
        let (promoted, changes) = renew(&shortened, &short, start(), true).expect("ok");
        assert_eq!(
            changes,
            vec![
                Change::NextCaSigns,
                Change::ServingIssued("the CA that signs changed")
            ]
        );
        let ca = Summary::of_pem(&promoted.signer.expect("a signer").cert).expect("parses");
        assert_eq!(ca.not_after, start() + Duration::from_secs(120));
    }

    #[test]
    fn an_expired_ca_is_replaced_at_once() {
        let (first, _) = renew(&Material::default(), &policy(), start(), false).expect("issued");
        let (replaced, changes) = renew(&first, &policy(), start() + 400 * DAY, false).expect("ok");
        assert_eq!(
            changes,
            vec![
                Change::ExpiredCaDropped,
                Change::NewSigner,
                Change::ServingIssued("the CA that signs changed")
            ]
        );
        assert_eq!(replaced.trusted.len(), 1);
    }

    /// Whatever the times at which replicas look, the certificate served after each look is
    /// signed by a CA that was already in the bundle published before it, so the API server
    /// never meets a certificate it does not trust.
    #[test]
    fn every_served_certificate_was_trusted_before_it_was_served() {
        let policy = Policy {
            names: vec!["localhost".to_owned()],
            validity: 30 * DAY,
        };
        let mut rng = fastrand::Rng::with_seed(7);
        let mut now = start();
        let (mut material, _) = renew(&Material::default(), &policy, now, false).expect("issued");
        // What the API server trusts: the bundle as injected after the previous look.
        let mut published = material.trusted.clone();
        let mut rotations = 0;
        for _ in 0..400 {
            now += Duration::from_secs(rng.u64(60 * 60..3 * 24 * 60 * 60));
            let next_is_trusted = material
                .next
                .as_ref()
                .is_some_and(|next| published.contains(&next.cert));
            let (renewed, changes) =
                renew(&material, &policy, now, next_is_trusted).expect("renewed");
            rotations += changes
                .iter()
                .filter(|c| **c == Change::NextCaSigns)
                .count();
            let served = serving(&renewed);
            assert!(
                published.iter().any(|ca| signed_by(&served.cert, ca)),
                "at {now:?} the served certificate's CA was not yet published; changes: {changes:?}"
            );
            let summary = Summary::of_pem(&served.cert).expect("parses");
            assert!(summary.not_after > now, "served an expired certificate");
            published = renewed.trusted.clone();
            material = renewed;
        }
        assert!(
            rotations >= 4,
            "only {rotations} CA rotations were exercised"
        );
    }

    #[test]
    fn a_bundle_splits_into_its_certificates() {
        let (material, _) = renew(&Material::default(), &policy(), start(), false).expect("issued");
        let one = material.trusted[0].clone();
        let two = serving(&material).cert.clone();
        let bundle = format!("{one}{two}");
        assert_eq!(pem_blocks(&bundle), vec![one, two]);
        assert!(pem_blocks("no certificates here").is_empty());
    }
}
