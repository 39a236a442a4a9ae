//! CRD conversion webhooks: the API server stores a custom resource in one version and asks
//! the manager for every other version a client reads or writes.
//!
//! A controller's registration declares the conversion of its type
//! ([`crate::Registration::with_conversion`]); the manager serves every declared conversion on
//! one path, [`CONVERSION_PATH`] (Kubebuilder's), picking each object's converter by its group
//! and kind, and `cargo xtask manifests` points the CRD's `spec.conversion` there.

use kube::core::Status;
use kube::core::conversion::{ConversionRequest, ConversionResponse, ConversionReview};
use serde_json::Value;

use super::MalformedReview;

/// Where the manager serves every conversion.
pub const CONVERSION_PATH: &str = "/convert";

/// The `ConversionReview` version the manager answers.
pub const CONVERSION_REVIEW_VERSION: &str = "apiextensions.k8s.io/v1";

/// Converts one object (any version of the type) to the `apiVersion` given; an error says why
/// it cannot.
pub type Convert = fn(Value, &str) -> Result<Value, String>;

/// The conversion of one custom resource type between its versions.
#[derive(Clone, Debug)]
pub struct ConversionWebhook {
    /// The CRD's name, `<plural>.<group>`: the object whose `spec.conversion` calls it.
    pub crd_name: String,
    /// The API group.
    pub group: String,
    /// The kind.
    pub kind: String,
    /// The version the API server stores, which the CRD marks `storage: true`.
    pub storage_version: String,
    convert: Convert,
}

impl ConversionWebhook {
    /// The conversion of `K` (any of its versions: they share the CRD), stored as
    /// `storage_version`, done by `convert`.
    pub fn new<K: kube::Resource<DynamicType = ()>>(
        storage_version: &str,
        convert: Convert,
    ) -> Self {
        let (group, plural) = (K::group(&()), K::plural(&()));
        Self {
            crd_name: format!("{plural}.{group}"),
            group: group.into_owned(),
            kind: K::kind(&()).into_owned(),
            storage_version: storage_version.to_owned(),
            convert,
        }
    }

    fn owns(&self, object: &Value) -> bool {
        let group = object
            .get("apiVersion")
            .and_then(Value::as_str)
            .and_then(|v| v.split_once('/'))
            .map(|(group, _)| group);
        group == Some(self.group.as_str())
            && object.get("kind").and_then(Value::as_str) == Some(self.kind.as_str())
    }
}

/// Answers one `ConversionReview` body with the review to send back: every object converted
/// by the conversion of its type, or, if any cannot be, a failure naming it (the API server
/// then fails the client's request with that message).
///
/// # Errors
/// [`MalformedReview`] when the body is no `apiextensions.k8s.io/v1` ConversionReview with a
/// request: the server answers it with 400 and the reason.
pub fn review(
    conversions: &[ConversionWebhook],
    body: &[u8],
) -> Result<ConversionReview, MalformedReview> {
    let review: ConversionReview = serde_json::from_slice(body)
        .map_err(|e| MalformedReview(format!("the body is not a ConversionReview: {e}")))?;
    if review.types.api_version != CONVERSION_REVIEW_VERSION
        || review.types.kind != "ConversionReview"
    {
        return Err(MalformedReview(format!(
            "expected a ConversionReview of {CONVERSION_REVIEW_VERSION}, got kind {:?} of {:?}",
            review.types.kind, review.types.api_version
        )));
    }
    let mut request = ConversionRequest::from_review(review)
        .map_err(|_| MalformedReview("the ConversionReview has no request".into()))?;
    let desired = request.desired_api_version.clone();
    // Taken, not copied: a list's conversion carries every object of the list.
    let objects = std::mem::take(&mut request.objects);
    let response = ConversionResponse::for_request(request);
    let mut converted = Vec::with_capacity(objects.len());
    for object in objects {
        let name = describe(&object);
        let Some(conversion) = conversions.iter().find(|c| c.owns(&object)) else {
            let message = format!("the manager converts no {name}");
            return Ok(response
                .failure(Status::failure(&message, "Invalid"))
                .into_review());
        };
        match (conversion.convert)(object, &desired) {
            Ok(object) => converted.push(object),
            Err(reason) => {
                let message = format!("cannot convert {name} to {desired}: {reason}");
                return Ok(response
                    .failure(Status::failure(&message, "Invalid"))
                    .into_review());
            }
        }
    }
    Ok(response.success(converted).into_review())
}

/// `Kind namespace/name (apiVersion)`, for messages.
fn describe(object: &Value) -> String {
    let text = |value: Option<&Value>| value.and_then(Value::as_str).unwrap_or("?").to_owned();
    let metadata = object.get("metadata");
    let name = text(metadata.and_then(|m| m.get("name")));
    let namespaced = match metadata
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str)
    {
        Some(namespace) => format!("{namespace}/{name}"),
        None => name,
    };
    format!(
        "{} {namespaced} ({})",
        text(object.get("kind")),
        text(object.get("apiVersion"))
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn conversions() -> Vec<ConversionWebhook> {
        vec![ConversionWebhook::new::<crate::test_resource::Memcached>(
            "v1beta1",
            crate::test_resource::convert,
        )]
    }

    fn review_of(desired: &str, objects: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "ConversionReview",
            "request": {"uid": "u-1", "desiredAPIVersion": desired, "objects": objects},
        }))
        .expect("serializes")
    }

    #[test]
    fn every_object_is_converted_in_order() {
        let body = review_of(
            "cache.example.com/v1alpha1",
            json!([
                {"apiVersion": "cache.example.com/v1beta1", "kind": "Memcached",
                 "metadata": {"name": "a", "namespace": "n"},
                 "spec": {"size": 1, "image": "memcached:1.6", "memory": "128Mi"}},
                {"apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
                 "metadata": {"name": "b", "namespace": "n"},
                 "spec": {"size": 2, "image": "memcached:1.6"}},
            ]),
        );
        let review = review(&conversions(), &body).expect("a review");
        let response = review.response.expect("a response");
        assert_eq!(response.uid, "u-1");
        assert_eq!(
            response.result.status,
            Some(kube::core::response::StatusSummary::Success)
        );
        let names: Vec<&Value> = response
            .converted_objects
            .iter()
            .map(|o| &o["metadata"]["name"])
            .collect();
        assert_eq!(names, [&json!("a"), &json!("b")]);
        for object in &response.converted_objects {
            assert_eq!(object["apiVersion"], "cache.example.com/v1alpha1");
        }
        assert_eq!(
            response.converted_objects[0]["metadata"]["annotations"]
                [crate::test_resource::PRESERVED_FIELDS],
            r#"{"memory":"128Mi"}"#
        );
    }

    #[test]
    fn an_object_that_cannot_be_converted_fails_the_review_naming_it() {
        let body = review_of(
            "cache.example.com/v2",
            json!([{"apiVersion": "cache.example.com/v1beta1", "kind": "Memcached",
                    "metadata": {"name": "a", "namespace": "n"}, "spec": {"size": 1}}]),
        );
        let response = review(&conversions(), &body)
            .expect("a review")
            .response
            .expect("a response");
        assert_eq!(
            response.result.status,
            Some(kube::core::response::StatusSummary::Failure)
        );
        assert!(
            response.result.message.contains(
                "cannot convert Memcached n/a (cache.example.com/v1beta1) to cache.example.com/v2"
            ),
            "{}",
            response.result.message
        );
        assert!(response.converted_objects.is_empty());

        let body = review_of(
            "myscheme.example.com/v2",
            json!([{"apiVersion": "myscheme.example.com/v1", "kind": "MyApp",
                    "metadata": {"name": "x"}}]),
        );
        let response = review(&conversions(), &body)
            .expect("a review")
            .response
            .expect("a response");
        assert!(
            response.result.message.contains("converts no MyApp x"),
            "{}",
            response.result.message
        );
    }

    #[test]
    fn a_body_that_is_no_conversion_review_is_malformed() {
        for body in [
            b"not json".to_vec(),
            serde_json::to_vec(
                &json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview"}),
            )
            .expect("serializes"),
            serde_json::to_vec(
                &json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {"uid": "u", "desiredAPIVersion": "v", "objects": []}}),
            )
            .expect("serializes"),
        ] {
            assert!(review(&conversions(), &body).is_err());
        }
    }

    #[test]
    fn the_crd_is_named_after_the_type() {
        let conversion = &conversions()[0];
        assert_eq!(conversion.crd_name, "memcacheds.cache.example.com");
        assert_eq!(conversion.storage_version, "v1beta1");
    }
}
