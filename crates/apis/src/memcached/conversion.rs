//! Conversion between the two Memcached versions, losing nothing either way.
//!
//! Both versions share every field but `spec.memory` and `spec.resources`, which only v1beta1
//! has. Converting a v1beta1 object down keeps them, as JSON, in the annotation
//! [`PRESERVED_FIELDS`]; converting up puts them back and drops the annotation. So an object
//! written through either version and read through the other, then written back, keeps every
//! field: v1beta1 → v1alpha1 → v1beta1 and v1alpha1 → v1beta1 → v1alpha1 are both the
//! identity (property-tested below).
//!
//! The conversion works on the objects' JSON as the API server sends them, so fields this code
//! does not know (a newer status field, say) pass through untouched.

use serde_json::{Map, Value};

/// The group both versions belong to.
pub const GROUP: &str = product::group!(cache);
/// The annotation that carries v1beta1's own spec fields through v1alpha1. Reserved: set by
/// the conversion, never by hand.
pub const PRESERVED_FIELDS: &str = concat!(product::group!(cache), "/v1beta1-fields");

/// The spec fields only v1beta1 has, in the order they are preserved.
const V1BETA1_ONLY: [&str; 2] = ["memory", "resources"];

/// Why an object cannot be converted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConversionError {
    /// The object is not a JSON object with `apiVersion`.
    #[error("not a Memcached object: {0}")]
    NotAnObject(String),
    /// A version this type does not have.
    #[error("{GROUP} has no Memcached version {0:?}; it has v1alpha1 and v1beta1")]
    UnknownVersion(String),
}

/// `object` (either version) as `desired_api_version` (`cache.example.com/v1alpha1` or
/// `/v1beta1`); an object already at that version comes back unchanged.
///
/// # Errors
/// [`ConversionError`] naming what is not a Memcached of a known version.
pub fn convert(mut object: Value, desired_api_version: &str) -> Result<Value, ConversionError> {
    let desired = version_of(desired_api_version)?;
    let current = object
        .get("apiVersion")
        .and_then(Value::as_str)
        .ok_or_else(|| ConversionError::NotAnObject("it has no apiVersion".into()))
        .and_then(version_of)?;
    if current == desired {
        return Ok(object);
    }
    let Some(fields) = object.as_object_mut() else {
        return Err(ConversionError::NotAnObject(
            "it is not a JSON object".into(),
        ));
    };
    match desired {
        Version::V1alpha1 => down(fields),
        Version::V1beta1 => up(fields),
    }
    fields.insert(
        "apiVersion".to_owned(),
        Value::String(desired_api_version.to_owned()),
    );
    Ok(object)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Version {
    V1alpha1,
    V1beta1,
}

fn version_of(api_version: &str) -> Result<Version, ConversionError> {
    match api_version
        .strip_prefix(GROUP)
        .and_then(|v| v.strip_prefix('/'))
    {
        Some("v1alpha1") => Ok(Version::V1alpha1),
        Some("v1beta1") => Ok(Version::V1beta1),
        _ => Err(ConversionError::UnknownVersion(api_version.to_owned())),
    }
}

/// v1beta1 → v1alpha1: the fields v1alpha1 lacks move into the annotation.
fn down(object: &mut Map<String, Value>) {
    let mut kept = Map::new();
    if let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) {
        for field in V1BETA1_ONLY {
            if let Some(value) = spec.remove(field) {
                kept.insert(field.to_owned(), value);
            }
        }
    }
    if kept.is_empty() {
        return;
    }
    let text = Value::Object(kept).to_string();
    if let Some(annotations) = annotations(object) {
        annotations.insert(PRESERVED_FIELDS.to_owned(), Value::String(text));
    }
}

/// v1alpha1 → v1beta1: the preserved fields come back into the spec. An annotation that does
/// not parse is left where it is, so nothing in it is lost.
fn up(object: &mut Map<String, Value>) {
    let preserved = object
        .get("metadata")
        .and_then(|m| m.get("annotations"))
        .and_then(|a| a.get(PRESERVED_FIELDS))
        .and_then(Value::as_str)
        .and_then(|text| serde_json::from_str::<Map<String, Value>>(text).ok());
    let Some(preserved) = preserved else {
        return;
    };
    let spec = object
        .entry("spec")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Some(spec) = spec.as_object_mut() {
        for (field, value) in preserved {
            // Only fields v1beta1 has: anything else in the annotation was never ours.
            if V1BETA1_ONLY.contains(&field.as_str()) {
                spec.insert(field, value);
            }
        }
    }
    let metadata = object.get_mut("metadata").and_then(Value::as_object_mut);
    if let Some(metadata) = metadata {
        let now_empty = metadata
            .get_mut("annotations")
            .and_then(Value::as_object_mut)
            .map(|annotations| {
                annotations.remove(PRESERVED_FIELDS);
                annotations.is_empty()
            })
            .unwrap_or(false);
        if now_empty {
            metadata.remove("annotations");
        }
    }
}

fn annotations(object: &mut Map<String, Value>) -> Option<&mut Map<String, Value>> {
    let metadata = object
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    let annotations = metadata
        .as_object_mut()?
        .entry("annotations")
        .or_insert_with(|| Value::Object(Map::new()));
    if annotations.is_null() {
        *annotations = Value::Object(Map::new());
    }
    annotations.as_object_mut()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    const ALPHA: &str = concat!(product::group!(cache), "/v1alpha1");
    const BETA: &str = concat!(product::group!(cache), "/v1beta1");

    #[test]
    fn down_keeps_the_new_fields_in_the_annotation_and_up_restores_them() {
        let beta = json!({
            "apiVersion": BETA,
            "kind": "Memcached",
            "metadata": {"name": "m", "namespace": "n"},
            "spec": {"size": 2, "image": "memcached:1.6", "memory": "256Mi",
                     "resources": {"limits": {"memory": "512Mi"}}},
            "status": {"readyReplicas": 2}
        });
        let alpha = convert(beta.clone(), ALPHA).expect("down");
        assert_eq!(alpha["apiVersion"], ALPHA);
        assert_eq!(alpha["spec"], json!({"size": 2, "image": "memcached:1.6"}));
        assert_eq!(
            alpha["metadata"]["annotations"][PRESERVED_FIELDS],
            r#"{"memory":"256Mi","resources":{"limits":{"memory":"512Mi"}}}"#
        );
        assert_eq!(alpha["status"], beta["status"]);
        assert_eq!(convert(alpha, BETA).expect("up"), beta);
    }

    #[test]
    fn a_v1alpha1_change_wins_over_the_preserved_copy_of_shared_fields() {
        let alpha = json!({
            "apiVersion": ALPHA,
            "kind": "Memcached",
            "metadata": {"name": "m", "annotations": {
                PRESERVED_FIELDS: r#"{"memory":"128Mi","size":9}"#,
                "team": "cache"
            }},
            "spec": {"size": 5, "image": "memcached:1.6"}
        });
        let beta = convert(alpha, BETA).expect("up");
        assert_eq!(
            beta["spec"],
            json!({"size": 5, "image": "memcached:1.6", "memory": "128Mi"})
        );
        assert_eq!(beta["metadata"]["annotations"], json!({"team": "cache"}));
    }

    #[test]
    fn a_broken_annotation_is_kept_rather_than_lost() {
        let alpha = json!({
            "apiVersion": ALPHA,
            "kind": "Memcached",
            "metadata": {"name": "m", "annotations": {PRESERVED_FIELDS: "{not json"}},
            "spec": {"size": 1, "image": "memcached:1.6"}
        });
        let beta = convert(alpha, BETA).expect("up");
        assert_eq!(
            beta["metadata"]["annotations"][PRESERVED_FIELDS],
            "{not json"
        );
        assert_eq!(beta["spec"], json!({"size": 1, "image": "memcached:1.6"}));
    }

    #[test]
    fn unknown_versions_and_non_objects_are_named() {
        let object = json!({"apiVersion": ALPHA, "kind": "Memcached"});
        assert_eq!(
            convert(object.clone(), concat!(product::group!(cache), "/v2")),
            Err(ConversionError::UnknownVersion(
                concat!(product::group!(cache), "/v2").into()
            ))
        );
        assert_eq!(
            convert(json!({"kind": "Memcached"}), BETA),
            Err(ConversionError::NotAnObject("it has no apiVersion".into()))
        );
        assert_eq!(convert(object.clone(), ALPHA), Ok(object));
    }

    fn quantity() -> impl Strategy<Value = Value> {
        prop_oneof![
            (1u32..4096).prop_map(|n| json!(format!("{n}Mi"))),
            (1u32..8).prop_map(|n| json!(format!("{n}Gi"))),
            (1u32..4000).prop_map(|n| json!(format!("{n}m"))),
        ]
    }

    fn resources() -> impl Strategy<Value = Value> {
        let list = || {
            proptest::collection::btree_map(
                prop_oneof![Just("cpu".to_owned()), Just("memory".to_owned())],
                quantity(),
                0..3,
            )
        };
        (proptest::option::of(list()), proptest::option::of(list())).prop_map(
            |(requests, limits)| {
                let mut value = Map::new();
                if let Some(requests) = requests {
                    value.insert("requests".into(), json!(requests));
                }
                if let Some(limits) = limits {
                    value.insert("limits".into(), json!(limits));
                }
                Value::Object(value)
            },
        )
    }

    fn metadata() -> impl Strategy<Value = Value> {
        let names = "[a-z][a-z0-9-]{0,20}";
        let user_annotations =
            proptest::collection::btree_map("[a-z]{1,8}\\.io/[a-z]{1,8}", ".{0,12}", 0..3);
        (names, proptest::option::of(user_annotations)).prop_map(|(name, annotations)| {
            let mut metadata = json!({"name": name, "namespace": "default", "generation": 3});
            if let Some(annotations) = annotations.filter(|a| !a.is_empty()) {
                metadata["annotations"] = json!(annotations);
            }
            metadata
        })
    }

    fn status() -> impl Strategy<Value = Option<Value>> {
        proptest::option::of(
            (0i32..100, proptest::collection::vec("[a-z0-9-]{1,12}", 0..4)).prop_map(
                |(ready, nodes)| json!({"readyReplicas": ready, "nodes": nodes, "observedGeneration": 3}),
            ),
        )
    }

    fn object(api_version: &'static str, with_new_fields: bool) -> impl Strategy<Value = Value> {
        (
            metadata(),
            0i32..=100,
            "[a-z]{1,10}(:[0-9]\\.[0-9]{1,2})?",
            proptest::option::of(quantity()),
            proptest::option::of(resources()),
            status(),
        )
            .prop_map(move |(metadata, size, image, memory, resources, status)| {
                let mut spec = json!({"size": size, "image": image});
                if with_new_fields {
                    if let Some(memory) = memory {
                        spec["memory"] = memory;
                    }
                    if let Some(resources) = resources {
                        spec["resources"] = resources;
                    }
                }
                let mut object = json!({
                    "apiVersion": api_version,
                    "kind": "Memcached",
                    "metadata": metadata,
                    "spec": spec,
                });
                if let Some(status) = status {
                    object["status"] = status;
                }
                object
            })
    }

    proptest! {
        #[test]
        fn v1beta1_survives_a_trip_through_v1alpha1(beta in object(BETA, true)) {
            let alpha = convert(beta.clone(), ALPHA).expect("down");
            prop_assert_eq!(&alpha["apiVersion"], ALPHA);
            prop_assert!(alpha["spec"].get("memory").is_none());
            prop_assert!(alpha["spec"].get("resources").is_none());
            prop_assert_eq!(convert(alpha, BETA).expect("up"), beta);
        }

        #[test]
        fn v1alpha1_survives_a_trip_through_v1beta1(alpha in object(ALPHA, false)) {
            let beta = convert(alpha.clone(), BETA).expect("up");
            prop_assert_eq!(&beta["apiVersion"], BETA);
            prop_assert_eq!(convert(beta, ALPHA).expect("down"), alpha);
        }

        #[test]
        fn a_v1alpha1_object_written_from_v1beta1_keeps_the_new_fields_through_edits(
            beta in object(BETA, true),
            size in 0i32..=100,
        ) {
            // A user reads through v1alpha1, changes the size, and writes back.
            let mut alpha = convert(beta.clone(), ALPHA).expect("down");
            alpha["spec"]["size"] = json!(size);
            let back = convert(alpha, BETA).expect("up");
            let mut expected = beta;
            expected["spec"]["size"] = json!(size);
            prop_assert_eq!(back, expected);
        }
    }
}
