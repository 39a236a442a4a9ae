//! `Memcached` admission (v1beta1, the stored version; writes through v1alpha1 are converted
//! first): the image defaulted when left empty and refused when malformed, the item memory
//! checked against the container's memory limit, and the memory request defaulted from it.
//!
//! The schema defaults `spec.image` only when the field is absent; an empty or blank string
//! would otherwise reach the pods and leave them in `InvalidImageName`. A memory limit below
//! memcached's `-m` gets the pod killed once the cache fills, which no schema can see.

use apis::Memcached;
use apis::memcached::DEFAULT_IMAGE;
use apis::memcached::conversion::PRESERVED_FIELDS;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt as _;

use super::{check_image, trim_image};
use kube_operator_runtime::quantity;
use kube_operator_runtime::webhook::conversion::ConversionWebhook;
use kube_operator_runtime::webhook::{AdmissionWebhook, Defaulter, FieldError, Validator, Verdict};

/// The conversion between Memcached's versions, which the Memcached controller declares.
pub fn conversion() -> ConversionWebhook {
    ConversionWebhook::new::<Memcached>(apis::memcached::STORAGE_VERSION, |object, desired| {
        apis::memcached::conversion::convert(object, desired).map_err(|e| e.to_string())
    })
}

/// The webhooks the Memcached controller declares.
pub fn webhooks() -> Vec<AdmissionWebhook> {
    vec![
        AdmissionWebhook::defaulting::<MemcachedAdmission>(),
        AdmissionWebhook::validating::<MemcachedAdmission>(),
    ]
}

/// The admission of `Memcached` objects: their defaulting and validation.
#[derive(Debug)]
pub struct MemcachedAdmission;

impl Defaulter for MemcachedAdmission {
    type Object = Memcached;

    fn default_fields(mc: &mut Memcached) -> Vec<String> {
        let image = &mut mc.spec.image;
        let mut warnings = Vec::new();
        if trim_image(image) {
            warnings.push(format!(
                "spec.image: surrounding whitespace removed, {image:?} is used"
            ));
        }
        if image.is_empty() {
            *image = DEFAULT_IMAGE.to_owned();
            warnings.push(format!(
                "spec.image: empty, so the default {DEFAULT_IMAGE:?} is used"
            ));
        }
        // The scheduler places a pod by its requests: without a memory request, a node may
        // take pods whose caches cannot all fill.
        if let Some(memory) = mc.spec.memory.clone() {
            let resources = mc.spec.resources.get_or_insert_with(Default::default);
            let requests = resources.requests.get_or_insert_with(Default::default);
            if !requests.contains_key("memory") {
                requests.insert("memory".to_owned(), memory.clone());
                warnings.push(format!(
                    "spec.resources.requests.memory: not set, so spec.memory ({}) is requested",
                    memory.0
                ));
            }
        }
        warnings
    }
}

impl Validator for MemcachedAdmission {
    type Object = Memcached;

    fn validate_create(mc: &Memcached) -> Verdict {
        let mut verdict = check_spec(mc);
        check_reserved_annotation(&mut verdict, mc, None);
        verdict
    }

    fn validate_update(mc: &Memcached, old: &Memcached) -> Verdict {
        let mut verdict = check_spec(mc);
        check_reserved_annotation(&mut verdict, mc, Some(old));
        verdict
    }

    /// Through v1alpha1, which has no `spec.memory` or `spec.resources`, neither may change:
    /// they can only have come from a hand-written [`PRESERVED_FIELDS`] annotation, which the
    /// conversion read. A round trip (read through v1alpha1, written back) carries them
    /// unchanged.
    fn validate_through(version: &str, mc: &Memcached, old: Option<&Memcached>) -> Verdict {
        let mut verdict = Verdict::default();
        if version != "v1alpha1" {
            return verdict;
        }
        // What the stored object holds, defaulted as this write was.
        let mut before = old
            .cloned()
            .unwrap_or_else(|| Memcached::new("", Default::default()));
        Self::default_fields(&mut before);
        let (now, then) = (&mc.spec, &before.spec);
        if now.memory != then.memory || now.resources != then.resources {
            verdict.refuse(reserved(
                "set through v1alpha1: write spec.memory and spec.resources through \
                 cache.example.com/v1beta1",
            ));
        }
        verdict
    }
}

fn check_spec(mc: &Memcached) -> Verdict {
    let mut verdict = Verdict::default();
    check_image(&mut verdict, "spec.image", &mc.spec.image);
    check_memory(&mut verdict, &mc.spec);
    verdict
}

/// The refusal of the reserved annotation, for `why`.
fn reserved(why: &str) -> FieldError {
    FieldError::invalid(
        format!("metadata.annotations[{PRESERVED_FIELDS}]"),
        "",
        format!("is reserved for the conversion between Memcached's versions, and was {why}"),
    )
}

/// The annotation the conversion reads is never written by hand. In a stored (v1beta1)
/// object it is only left when it did not parse; an object that already carries it may keep
/// it unchanged, so it is not stuck, but none may add or change it.
fn check_reserved_annotation(verdict: &mut Verdict, mc: &Memcached, old: Option<&Memcached>) {
    let of = |m: &Memcached| m.annotations().get(PRESERVED_FIELDS).cloned();
    let now = of(mc);
    if now.is_some() && now != old.and_then(of) {
        verdict.refuse(reserved(
            "written by hand (it does not parse as the fields it keeps)",
        ));
    }
}

/// `spec.memory` must be a quantity of at least 1Mi, and fit in the container's memory limit.
fn check_memory(verdict: &mut Verdict, spec: &apis::MemcachedSpec) {
    let Some(Quantity(memory)) = &spec.memory else {
        return;
    };
    let items = match quantity::value(memory) {
        Ok(bytes) if bytes < quantity::MIB => {
            verdict.refuse(FieldError::invalid(
                "spec.memory",
                memory,
                "must be at least 1Mi: memcached takes its memory in whole MiB",
            ));
            return;
        }
        Ok(bytes) => bytes,
        Err(reason) => {
            verdict.refuse(FieldError::invalid("spec.memory", memory, reason));
            return;
        }
    };
    let limit = spec
        .resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .and_then(|limits| limits.get("memory"));
    if let Some(Quantity(limit)) = limit {
        match quantity::value(limit) {
            Ok(limit_bytes) if limit_bytes < items => verdict.refuse(FieldError::invalid(
                "spec.memory",
                memory,
                format!(
                    "must fit in spec.resources.limits.memory ({limit}): memcached would be \
                     killed for running out of memory once its cache filled"
                ),
            )),
            Ok(_) => {}
            Err(reason) => verdict.refuse(FieldError::invalid(
                "spec.resources.limits.memory",
                limit,
                reason,
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use apis::MemcachedSpec;

    use super::*;

    fn memcached(image: &str) -> Memcached {
        Memcached::new(
            "m",
            MemcachedSpec {
                size: 1,
                image: image.to_owned(),
                ..Default::default()
            },
        )
    }

    #[test]
    fn an_empty_image_becomes_the_default_and_a_blank_one_is_trimmed_first() {
        for empty in ["", "   "] {
            let mut mc = memcached(empty);
            let warnings = MemcachedAdmission::default_fields(&mut mc);
            assert_eq!(mc.spec.image, DEFAULT_IMAGE);
            assert!(
                warnings.iter().any(|w| w.contains("default")),
                "{warnings:?}"
            );
        }
        let mut mc = memcached(" memcached:1.6 \n");
        assert_eq!(MemcachedAdmission::default_fields(&mut mc).len(), 1);
        assert_eq!(mc.spec.image, "memcached:1.6");
        let mut mc = memcached(DEFAULT_IMAGE);
        assert!(MemcachedAdmission::default_fields(&mut mc).is_empty());
    }

    #[test]
    fn a_malformed_image_is_refused_naming_the_field() {
        let verdict = MemcachedAdmission::validate_create(&memcached("memcached:1.6 -alpine"));
        let [refusal] = verdict.refusals.as_slice() else {
            panic!("one refusal: {verdict:?}");
        };
        assert_eq!(refusal.field, "spec.image");
        assert_eq!(
            refusal.to_string(),
            "spec.image: Invalid value: \"memcached:1.6 -alpine\": not an image reference: it must not contain ' '"
        );
    }

    #[test]
    fn an_untagged_image_is_admitted_with_a_warning() {
        let verdict = MemcachedAdmission::validate_create(&memcached("memcached"));
        assert!(verdict.refusals.is_empty());
        assert!(
            verdict.warnings[0].contains("no tag or digest"),
            "{verdict:?}"
        );
        assert_eq!(
            MemcachedAdmission::validate_create(&memcached(DEFAULT_IMAGE)),
            Verdict::default()
        );
    }

    #[test]
    fn both_webhooks_are_declared_for_the_stored_version() {
        let names: Vec<String> = webhooks().into_iter().map(|w| w.name).collect();
        assert_eq!(
            names,
            [
                concat!("mmemcached-v1beta1.", product::group!(cache)),
                concat!("vmemcached-v1beta1.", product::group!(cache))
            ]
        );
    }

    fn with_memory(memory: &str, limit: Option<&str>) -> Memcached {
        let mut mc = memcached(DEFAULT_IMAGE);
        mc.spec.memory = Some(Quantity(memory.to_owned()));
        if let Some(limit) = limit {
            mc.spec.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
                limits: Some([("memory".to_owned(), Quantity(limit.to_owned()))].into()),
                ..Default::default()
            });
        }
        mc
    }

    #[test]
    fn memory_must_be_a_quantity_of_a_mebibyte_that_fits_the_limit() {
        assert_eq!(
            MemcachedAdmission::validate_create(&with_memory("256Mi", Some("512Mi"))),
            Verdict::default()
        );
        for (memory, limit, says) in [
            (
                "lots",
                None,
                "spec.memory: Invalid value: \"lots\": \"lots\" is no quantity",
            ),
            ("512Ki", None, "must be at least 1Mi"),
            (
                "1Gi",
                Some("512Mi"),
                "must fit in spec.resources.limits.memory (512Mi)",
            ),
            (
                "64Mi",
                Some("big"),
                "spec.resources.limits.memory: Invalid value: \"big\"",
            ),
        ] {
            let verdict = MemcachedAdmission::validate_create(&with_memory(memory, limit));
            let [refusal] = verdict.refusals.as_slice() else {
                panic!("one refusal for {memory}/{limit:?}: {verdict:?}");
            };
            assert!(refusal.to_string().contains(says), "{refusal}");
        }
    }

    #[test]
    fn the_reserved_annotation_is_never_written_by_hand() {
        let mut mc = memcached("memcached:1.6");
        mc.annotations_mut()
            .insert(PRESERVED_FIELDS.to_owned(), "{not json".to_owned());
        let refused = MemcachedAdmission::validate_create(&mc);
        assert_eq!(refused.refusals.len(), 1, "{refused:?}");
        assert!(refused.refusals[0].field.contains(PRESERVED_FIELDS));
        // An object that already holds it may keep it, not change it.
        assert!(
            MemcachedAdmission::validate_update(&mc, &mc)
                .refusals
                .is_empty()
        );
        let mut changed = mc.clone();
        changed
            .annotations_mut()
            .insert(PRESERVED_FIELDS.to_owned(), "{}".to_owned());
        assert_eq!(
            MemcachedAdmission::validate_update(&changed, &mc)
                .refusals
                .len(),
            1
        );
    }

    #[test]
    fn v1alpha1_writes_may_not_change_what_only_v1beta1_has() {
        let mut stored = with_memory("256Mi", Some("512Mi"));
        MemcachedAdmission::default_fields(&mut stored);
        // A round trip through v1alpha1 brings back what was stored.
        let mut round_trip = stored.clone();
        round_trip.spec.size = 3;
        let through =
            |new: &Memcached, old| MemcachedAdmission::validate_through("v1alpha1", new, old);
        assert!(through(&round_trip, Some(&stored)).refusals.is_empty());
        // A hand-written annotation that changed the memory, or set it on a create.
        let mut edited = stored.clone();
        edited.spec.memory = Some(Quantity("384Mi".to_owned()));
        assert_eq!(through(&edited, Some(&stored)).refusals.len(), 1);
        assert_eq!(through(&stored, None).refusals.len(), 1);
        assert!(
            through(&memcached("memcached:1.6"), None)
                .refusals
                .is_empty()
        );
        // Through v1beta1 itself, anything goes.
        assert!(
            MemcachedAdmission::validate_through("v1beta1", &edited, Some(&stored))
                .refusals
                .is_empty()
        );
    }

    #[test]
    fn the_memory_request_defaults_to_the_item_memory() {
        let mut mc = with_memory("256Mi", Some("512Mi"));
        let warnings = MemcachedAdmission::default_fields(&mut mc);
        let requests = mc
            .spec
            .resources
            .and_then(|r| r.requests)
            .expect("requests");
        assert_eq!(requests["memory"], Quantity("256Mi".into()));
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        // A request set by hand stays.
        let mut mc = with_memory("256Mi", None);
        mc.spec.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
            requests: Some([("memory".to_owned(), Quantity("300Mi".into()))].into()),
            ..Default::default()
        });
        assert!(MemcachedAdmission::default_fields(&mut mc).is_empty());
        // Without spec.memory nothing is requested.
        let mut mc = memcached(DEFAULT_IMAGE);
        MemcachedAdmission::default_fields(&mut mc);
        assert!(mc.spec.resources.is_none());
    }
}
