//! The platform types' admission rules: what their schemas cannot default or express.
//!
//! Each type's module implements [`kube_operator_runtime::webhook::Defaulter`] and
//! [`kube_operator_runtime::webhook::Validator`]; its controller's [`kube_operator_runtime::Registration`] declares the
//! webhooks, so the manager serves them and the generated configurations call them.

pub mod memcached;
pub mod myapp;

use imageref::ImageReference;
use kube_operator_runtime::webhook::{FieldError, Verdict};

/// Trims the whitespace a copied image reference often carries; `true` when it changed.
fn trim_image(image: &mut String) -> bool {
    let trimmed = image.trim();
    if trimmed.len() == image.len() {
        return false;
    }
    *image = trimmed.to_owned();
    true
}

/// Refuses a malformed image reference in `field`, and warns about one that names neither a
/// tag nor a digest (each node then pulls whatever `latest` is when it starts a pod).
///
/// A reference the runtime cannot parse leaves the pod stuck in `InvalidImageName`, long after
/// the object that named it was accepted; checking it at admission says so at once, naming the
/// part that is wrong.
fn check_image(verdict: &mut Verdict, field: &'static str, reference: &str) {
    match ImageReference::parse(reference) {
        Err(reason) => verdict.refuse(FieldError::invalid(
            field,
            reference,
            format!("not an image reference: it {reason}"),
        )),
        Ok(parsed) if parsed.tag().is_none() && parsed.digest().is_none() => verdict.warn(format!(
            "{field}: {reference:?} names no tag or digest, so each node runs whatever `latest` is when it pulls"
        )),
        Ok(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(reference: &str) -> Verdict {
        let mut verdict = Verdict::default();
        check_image(&mut verdict, "spec.image", reference);
        verdict
    }

    #[test]
    fn a_malformed_image_is_refused_with_the_parsers_sentence() {
        let verdict = verdict("team//app:1");
        let [refusal] = verdict.refusals.as_slice() else {
            panic!("one refusal: {verdict:?}");
        };
        assert_eq!(
            refusal.to_string(),
            "spec.image: Invalid value: \"team//app:1\": not an image reference: it has an empty \
             name component (two `/` in a row, or one at an end)"
        );
    }

    #[test]
    fn only_a_reference_without_tag_or_digest_is_warned_about() {
        let digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        for quiet in ["memcached:1.6".to_owned(), format!("memcached@{digest}")] {
            assert_eq!(verdict(&quiet), Verdict::default(), "{quiet}");
        }
        let warned = verdict("registry.example:5000/memcached");
        assert!(warned.refusals.is_empty());
        assert_eq!(warned.warnings.len(), 1, "{warned:?}");
    }
}
