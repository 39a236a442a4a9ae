//! The platform types' admission rules: what their schemas cannot default or express.
//!
//! Each type's module implements [`kube_operator_runtime::webhook::Defaulter`] and
//! [`kube_operator_runtime::webhook::Validator`]; its controller's [`kube_operator_runtime::Registration`] declares the
//! webhooks, so the manager serves them and the generated configurations call them.

pub mod memcached;
pub mod myapp;

use kube_operator_runtime::webhook::{FieldError, Verdict, image};

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
fn check_image(verdict: &mut Verdict, field: &'static str, reference: &str) {
    match image::parse(reference) {
        Err(reason) => verdict.refuse(FieldError::invalid(
            field,
            reference,
            format!("not an image reference: it {reason}"),
        )),
        Ok(parsed) if !parsed.tagged && !parsed.pinned => verdict.warn(format!(
            "{field}: {reference:?} names no tag or digest, so each node runs whatever `latest` is when it pulls"
        )),
        Ok(_) => {}
    }
}
