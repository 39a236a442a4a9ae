//! Reading watched objects without their managed fields.
//!
//! Every object the API server sends carries `metadata.managedFields`: who set which field, as a
//! tree of JSON objects. The caches never keep it ([`crate::watches`] drops it), but parsing it
//! into `serde_json::Value` trees first and freeing them after was the largest single cost of
//! reading watch events (a profile at 1000 Memcacheds put most of the time spent parsing
//! `ObjectMeta` there, much of it in the allocator). [`WithoutManagedFields`] parses an object
//! with that key skipped in place, so its bytes are scanned but nothing is built.
//!
//! Only the object's own `metadata.managedFields` is skipped: a label, annotation or spec field
//! that happens to be called `managedFields` is read as usual.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use kube::Resource;
use kube::api::ObjectMeta;
use kube::runtime::watcher::Event;
use serde::Deserialize;
use serde::de::{
    self, DeserializeSeed, Deserializer, IgnoredAny, IntoDeserializer, MapAccess, SeqAccess,
    Visitor,
};

/// An object of type `K`, read without its `metadata.managedFields` (which stays `None`).
///
/// It is the same resource as `K` for the API (kind, group, version, plural, and metadata-only
/// requests when `K` asks for them), so `Api<WithoutManagedFields<K>>` lists and watches what
/// `Api<K>` does.
#[derive(Clone, Debug)]
pub struct WithoutManagedFields<K>(pub K);

impl<K: Resource> Resource for WithoutManagedFields<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }

    fn api_version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::api_version(dt)
    }

    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }

    fn metadata_api() -> bool {
        K::metadata_api()
    }

    fn url_path(dt: &Self::DynamicType, namespace: Option<&str>) -> String {
        K::url_path(dt, namespace)
    }

    fn meta(&self) -> &ObjectMeta {
        self.0.meta()
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        self.0.meta_mut()
    }
}

impl<'de, K: Deserialize<'de>> Deserialize<'de> for WithoutManagedFields<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        K::deserialize(Object(deserializer)).map(Self)
    }
}

/// The watcher event of `K` that `event` is.
pub fn into_inner<K>(event: Event<WithoutManagedFields<K>>) -> Event<K> {
    match event {
        Event::Apply(obj) => Event::Apply(obj.0),
        Event::Delete(obj) => Event::Delete(obj.0),
        Event::Init => Event::Init,
        Event::InitApply(obj) => Event::InitApply(obj.0),
        Event::InitDone => Event::InitDone,
    }
}

/// The key of the object's metadata, and of the managed fields within it.
const METADATA: &str = "metadata";
const MANAGED_FIELDS: &str = "managedFields";

/// Deserializes a whole object: the value of its `metadata` key goes through [`Metadata`].
struct Object<D>(D);

/// Deserializes an object's metadata: its `managedFields` key is skipped.
struct Metadata<D>(D);

/// Forwards every `deserialize_*` method not written out to the wrapped deserializer, unchanged.
macro_rules! forward_unchanged {
    ($($method:ident($($arg:ident: $ty:ty),*))*) => {
        $(
            fn $method<V: Visitor<'de>>(self, $($arg: $ty,)* visitor: V) -> Result<V::Value, D::Error> {
                self.0.$method($($arg,)* visitor)
            }
        )*
    };
}

/// The methods neither wrapper changes: nothing there can hold an object's metadata.
macro_rules! forward_scalars {
    () => {
        forward_unchanged! {
            deserialize_bool() deserialize_i8() deserialize_i16() deserialize_i32()
            deserialize_i64() deserialize_i128() deserialize_u8() deserialize_u16()
            deserialize_u32() deserialize_u64() deserialize_u128() deserialize_f32()
            deserialize_f64() deserialize_char() deserialize_str() deserialize_string()
            deserialize_bytes() deserialize_byte_buf() deserialize_unit()
            deserialize_unit_struct(name: &'static str)
            deserialize_newtype_struct(name: &'static str)
            deserialize_seq() deserialize_tuple(len: usize)
            deserialize_tuple_struct(name: &'static str, len: usize)
            deserialize_enum(name: &'static str, variants: &'static [&'static str])
            deserialize_identifier() deserialize_ignored_any()
        }

        fn is_human_readable(&self) -> bool {
            self.0.is_human_readable()
        }
    };
}

/// The methods that may read a map: its entries go through [`Entries`] with `$keys`.
macro_rules! through_entries {
    ($keys:ty) => {
        fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
            self.0.deserialize_any(Maps::<V, $keys>::new(visitor))
        }

        fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
            self.0.deserialize_map(Maps::<V, $keys>::new(visitor))
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            name: &'static str,
            fields: &'static [&'static str],
            visitor: V,
        ) -> Result<V::Value, D::Error> {
            self.0
                .deserialize_struct(name, fields, Maps::<V, $keys>::new(visitor))
        }
    };
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Object<D> {
    type Error = D::Error;

    forward_scalars!();
    forward_unchanged! { deserialize_option() }

    through_entries!(ObjectKeys);
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Metadata<D> {
    type Error = D::Error;

    forward_scalars!();

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_option(SomeMetadata(visitor))
    }

    through_entries!(MetadataKeys);
}

/// What a map of one level does with its keys.
trait Keys: Default {
    /// Whether the entry of `key` is skipped.
    fn skips(&mut self, key: &str) -> bool;
    /// Whether the value of the key just read is metadata (read through [`Metadata`]).
    fn value_is_metadata(&mut self) -> bool;
}

/// An object's keys: the value of `metadata` is metadata.
#[derive(Default)]
struct ObjectKeys {
    at_metadata: bool,
}

impl Keys for ObjectKeys {
    fn skips(&mut self, key: &str) -> bool {
        self.at_metadata = key == METADATA;
        false
    }

    fn value_is_metadata(&mut self) -> bool {
        std::mem::take(&mut self.at_metadata)
    }
}

/// The metadata's keys: `managedFields` is skipped.
#[derive(Default)]
struct MetadataKeys;

impl Keys for MetadataKeys {
    fn skips(&mut self, key: &str) -> bool {
        key == MANAGED_FIELDS
    }

    fn value_is_metadata(&mut self) -> bool {
        false
    }
}

/// A visitor that hands the wrapped one its maps through [`Entries`]; anything else unchanged.
struct Maps<V, S> {
    visitor: V,
    keys: PhantomData<S>,
}

impl<V, S> Maps<V, S> {
    fn new(visitor: V) -> Self {
        Self {
            visitor,
            keys: PhantomData,
        }
    }
}

impl<'de, V: Visitor<'de>, S: Keys> Visitor<'de> for Maps<V, S> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.visitor.expecting(f)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.visitor.visit_map(Entries {
            map,
            keys: S::default(),
        })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.visitor.visit_seq(seq)
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.visitor.visit_unit()
    }

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.visitor.visit_none()
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<V::Value, D::Error> {
        self.visitor.visit_some(deserializer)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<V::Value, E> {
        self.visitor.visit_str(v)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<V::Value, E> {
        self.visitor.visit_bool(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<V::Value, E> {
        self.visitor.visit_i64(v)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<V::Value, E> {
        self.visitor.visit_u64(v)
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<V::Value, E> {
        self.visitor.visit_f64(v)
    }
}

/// An optional metadata's visitor: what is there is read through [`Metadata`].
struct SomeMetadata<V>(V);

impl<'de, V: Visitor<'de>> Visitor<'de> for SomeMetadata<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.expecting(f)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<V::Value, D::Error> {
        self.0.visit_some(Metadata(deserializer))
    }

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.0.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.0.visit_unit()
    }
}

/// The entries of one map, with the keys `S` skips left out and metadata read as such.
struct Entries<A, S> {
    map: A,
    keys: S,
}

impl<'de, A: MapAccess<'de>, S: Keys> MapAccess<'de> for Entries<A, S> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        loop {
            let Some(key) = self.map.next_key_seed(KeyText)? else {
                return Ok(None);
            };
            if self.keys.skips(&key) {
                self.map.next_value::<IgnoredAny>()?;
                continue;
            }
            return match key {
                Cow::Borrowed(key) => seed
                    .deserialize(de::value::BorrowedStrDeserializer::new(key))
                    .map(Some),
                Cow::Owned(key) => seed.deserialize(key.into_deserializer()).map(Some),
            };
        }
    }

    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value, A::Error> {
        if self.keys.value_is_metadata() {
            self.map.next_value_seed(MetadataSeed(seed))
        } else {
            self.map.next_value_seed(seed)
        }
    }

    fn size_hint(&self) -> Option<usize> {
        self.map.size_hint()
    }
}

/// Reads a map key as text, borrowed from the input when it can be.
struct KeyText;

impl<'de> DeserializeSeed<'de> for KeyText {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyText {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v))
    }
}

/// The value of an object's `metadata` key, read through [`Metadata`].
struct MetadataSeed<T>(T);

impl<'de, T: DeserializeSeed<'de>> DeserializeSeed<'de> for MetadataSeed<T> {
    type Value = T::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<T::Value, D::Error> {
        self.0.deserialize(Metadata(deserializer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_resource::Memcached;
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::PartialObjectMeta;
    use serde_json::json;

    fn managed_fields() -> serde_json::Value {
        json!([{
            "manager": "kube-controller-manager",
            "operation": "Update",
            "apiVersion": "apps/v1",
            "time": "2026-11-23T10:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:status": {"f:replicas": {}, "f:conditions": {".": {}}}},
            "subresource": "status"
        }])
    }

    /// Parses `value` both ways: the plain parse with the managed fields dropped afterwards must
    /// equal the parse that skips them.
    fn both_ways<K>(value: &serde_json::Value) -> (K, K)
    where
        K: Resource + for<'de> Deserialize<'de>,
    {
        let text = value.to_string();
        let mut plain: K = serde_json::from_str(&text).expect("plain parse");
        plain.meta_mut().managed_fields = None;
        let skipped: WithoutManagedFields<K> = serde_json::from_str(&text).expect("skipping parse");
        (plain, skipped.0)
    }

    #[test]
    fn a_deployment_is_read_whole_but_for_its_managed_fields() {
        let value = json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": "web", "namespace": "shop", "resourceVersion": "7",
                "labels": {"managedFields": "kept", "app": "web"},
                "managedFields": managed_fields(),
                "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "x", "uid": "u", "controller": true}]
            },
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}},
                                  "spec": {"containers": [{"name": "web", "image": "nginx"}]}}},
            "status": {"readyReplicas": 1}
        });
        let (plain, skipped) = both_ways::<Deployment>(&value);
        assert_eq!(plain, skipped);
        assert_eq!(skipped.metadata.managed_fields, None);
        assert_eq!(
            skipped
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("managedFields")),
            Some(&"kept".to_owned()),
            "a label of that name is not the managed fields"
        );
        assert_eq!(skipped.spec.replicas, Some(2));
    }

    #[test]
    fn metadata_only_objects_and_custom_resources_skip_them_too() {
        let meta = json!({
            "apiVersion": "meta.k8s.io/v1",
            "kind": "PartialObjectMetadata",
            "metadata": {"name": "p", "namespace": "n", "labels": {"a": "b"},
                         "managedFields": managed_fields()}
        });
        let (plain, skipped) = both_ways::<PartialObjectMeta<Pod>>(&meta);
        assert_eq!(plain.metadata, skipped.metadata);
        assert_eq!(skipped.metadata.name.as_deref(), Some("p"));
        assert_eq!(skipped.metadata.managed_fields, None);

        let memcached = json!({
            "apiVersion": "cache.example.com/v1alpha1",
            "kind": "Memcached",
            "metadata": {"name": "m", "namespace": "n", "generation": 3,
                         "managedFields": managed_fields()},
            "spec": {"size": 3},
            "status": {"nodes": ["m-1"], "observedGeneration": 2}
        });
        let (plain, skipped) = both_ways::<Memcached>(&memcached);
        assert_eq!(
            serde_json::to_value(&plain).expect("serializes"),
            serde_json::to_value(&skipped).expect("serializes")
        );
        assert_eq!(skipped.spec.size, 3);
        assert_eq!(skipped.metadata.managed_fields, None);
    }

    #[test]
    fn watch_events_and_lists_carry_the_skipping_parse() {
        let event = json!({
            "type": "MODIFIED",
            "object": {"apiVersion": "apps/v1", "kind": "Deployment",
                       "metadata": {"name": "a", "managedFields": managed_fields()}}
        });
        let parsed: kube::api::WatchEvent<WithoutManagedFields<Deployment>> =
            serde_json::from_value(event).expect("parses");
        let kube::api::WatchEvent::Modified(obj) = parsed else {
            panic!("not a modification: {parsed:?}");
        };
        assert_eq!(obj.0.metadata.name.as_deref(), Some("a"));
        assert_eq!(obj.0.metadata.managed_fields, None);
    }

    #[test]
    fn malformed_input_is_still_an_error_that_says_what_is_wrong() {
        let error = serde_json::from_str::<WithoutManagedFields<Deployment>>(
            r#"{"metadata": {"name": 5}}"#,
        )
        .expect_err("a number is not a name");
        assert!(error.to_string().contains("invalid type"), "{error}");
        let error = serde_json::from_str::<WithoutManagedFields<Deployment>>(
            r#"{"metadata": {"managedFields": [1, 2}}"#,
        )
        .expect_err("broken JSON inside the skipped value");
        assert!(error.to_string().contains("expected"), "{error}");
    }
}
