//! `Memcached` admission: the image defaulted when left empty, and refused when malformed.
//!
//! The schema defaults `spec.image` only when the field is absent; an empty or blank string
//! would otherwise reach the pods and leave them in `InvalidImageName`.

use apis::Memcached;
use apis::memcached::DEFAULT_IMAGE;

use super::{check_image, trim_image};
use crate::webhook::{AdmissionWebhook, Defaulter, Validator, Verdict};

/// The webhooks the Memcached controller declares.
pub fn webhooks() -> Vec<AdmissionWebhook> {
    vec![
        AdmissionWebhook::defaulting::<Memcached>(),
        AdmissionWebhook::validating::<Memcached>(),
    ]
}

impl Defaulter for Memcached {
    fn default_fields(&mut self) -> Vec<String> {
        let image = &mut self.spec.image;
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
        warnings
    }
}

impl Validator for Memcached {
    fn validate_create(&self) -> Verdict {
        let mut verdict = Verdict::default();
        check_image(&mut verdict, "spec.image", &self.spec.image);
        verdict
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
            },
        )
    }

    #[test]
    fn an_empty_image_becomes_the_default_and_a_blank_one_is_trimmed_first() {
        for empty in ["", "   "] {
            let mut mc = memcached(empty);
            let warnings = mc.default_fields();
            assert_eq!(mc.spec.image, DEFAULT_IMAGE);
            assert!(
                warnings.iter().any(|w| w.contains("default")),
                "{warnings:?}"
            );
        }
        let mut mc = memcached(" memcached:1.6 \n");
        assert_eq!(mc.default_fields().len(), 1);
        assert_eq!(mc.spec.image, "memcached:1.6");
        let mut mc = memcached(DEFAULT_IMAGE);
        assert!(mc.default_fields().is_empty());
    }

    #[test]
    fn a_malformed_image_is_refused_naming_the_field() {
        let verdict = memcached("memcached:1.6 -alpine").validate_create();
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
        let verdict = memcached("memcached").validate_create();
        assert!(verdict.refusals.is_empty());
        assert!(
            verdict.warnings[0].contains("no tag or digest"),
            "{verdict:?}"
        );
        assert_eq!(
            memcached(DEFAULT_IMAGE).validate_create(),
            Verdict::default()
        );
    }

    #[test]
    fn both_webhooks_are_declared() {
        let names: Vec<String> = webhooks().into_iter().map(|w| w.name).collect();
        assert_eq!(
            names,
            [
                "mmemcached-v1alpha1.cache.example.com",
                "vmemcached-v1alpha1.cache.example.com"
            ]
        );
    }
}
