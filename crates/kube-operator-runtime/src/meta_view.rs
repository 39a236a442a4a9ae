//! What a cache keeps of an object it watches as metadata only, with its labels in one compact
//! set.
//!
//! The manager caches the metadata of every managed Pod, Service and PodDisruptionBudget: one to
//! four objects per custom resource. kube's `PartialObjectMeta<K>` keeps an object's labels as a
//! `BTreeMap<String, String>`, which allocates a whole B-tree leaf (544 bytes, room for 11
//! entries) however few labels it holds, and one more allocation per key and per value; it also
//! keeps the `apiVersion` and `kind` every answer carries (`meta.k8s.io/v1`,
//! `PartialObjectMetadata`, the same for every object). At thousands of custom resources those
//! label maps were a large share of the manager's heap.
//!
//! [`Labels`] holds a label set in two allocations however many labels it has: every key and
//! value back to back in one string, and where each ends. [`MetaView`] is the same API resource
//! as `K` (kind, group, version, plural, and metadata-only lists and watches), read from the
//! API server's `PartialObjectMetadata` with the type strings, annotations and managed fields
//! skipped while it is parsed, and the labels written straight into a [`Labels`].

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::Resource;
use kube::api::ObjectMeta;
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};

/// An immutable label set, sorted by key: all its keys and values in one string, and where each
/// of them ends. Two allocations however many labels it holds, none when it is empty; a key or
/// value may contain any character.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Labels {
    /// Every key and value back to back, in key order: key 0, value 0, key 1, value 1, ...
    text: Box<str>,
    /// Where each key and each value ends in `text`, in the same order.
    ends: Box<[u32]>,
}

/// A label set longer than [`Labels`] can count (4 GiB); the API server caps a whole object far
/// below that.
#[derive(Debug)]
struct TooLong;

impl Labels {
    /// How many labels there are.
    pub fn len(&self) -> usize {
        self.ends.len() / 2
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The value of the label `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        let (mut low, mut high) = (0, self.len());
        while low < high {
            let middle = low + (high - low) / 2;
            match self.key(middle).cmp(key) {
                std::cmp::Ordering::Less => low = middle + 1,
                std::cmp::Ordering::Greater => high = middle,
                std::cmp::Ordering::Equal => return Some(self.value(middle)),
            }
        }
        None
    }

    /// Every label as (key, value), in key order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &str)> + '_ {
        (0..self.len()).map(|i| (self.key(i), self.value(i)))
    }

    /// Whether every label of `selector` is here with the same value (others may be here too).
    pub fn contains_all(&self, selector: &BTreeMap<String, String>) -> bool {
        selector
            .iter()
            .all(|(key, value)| self.get(key) == Some(value.as_str()))
    }

    fn key(&self, i: usize) -> &str {
        self.part(2 * i)
    }

    fn value(&self, i: usize) -> &str {
        self.part(2 * i + 1)
    }

    /// The `n`th key or value of `text`.
    fn part(&self, n: usize) -> &str {
        let start = n
            .checked_sub(1)
            .map_or(0, |before| self.ends[before] as usize);
        &self.text[start..self.ends[n] as usize]
    }

    /// The set of `pairs`, which are sorted by key, each key once.
    fn from_sorted<'a>(
        pairs: impl Iterator<Item = (&'a str, &'a str)> + Clone,
    ) -> Result<Self, TooLong> {
        let length = pairs
            .clone()
            .map(|(key, value)| key.len() + value.len())
            .sum();
        let mut text = String::with_capacity(length);
        let mut ends = Vec::with_capacity(2 * pairs.clone().count());
        for (key, value) in pairs {
            for part in [key, value] {
                text.push_str(part);
                ends.push(u32::try_from(text.len()).map_err(|_| TooLong)?);
            }
        }
        Ok(Self {
            text: text.into_boxed_str(),
            ends: ends.into_boxed_slice(),
        })
    }

    /// The set of `pairs` in any order; of two pairs with one key, the later one counts (as when
    /// they are inserted into a map one after the other).
    fn from_pairs<K: AsRef<str>, V: AsRef<str>>(mut pairs: Vec<(K, V)>) -> Result<Self, TooLong> {
        // Reversed, the stable sort puts the later of two pairs with one key first, and
        // `dedup_by` keeps the first.
        pairs.reverse();
        pairs.sort_by(|(a, _), (b, _)| a.as_ref().cmp(b.as_ref()));
        pairs.dedup_by(|(a, _), (b, _)| a.as_ref() == b.as_ref());
        Self::from_sorted(pairs.iter().map(|(k, v)| (k.as_ref(), v.as_ref())))
    }
}

impl From<&BTreeMap<String, String>> for Labels {
    /// # Panics
    /// When the keys and values add up to more than 4 GiB.
    fn from(map: &BTreeMap<String, String>) -> Self {
        Self::from_sorted(map.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .expect("a label set under 4 GiB")
    }
}

impl<K: AsRef<str>, V: AsRef<str>> FromIterator<(K, V)> for Labels {
    /// # Panics
    /// When the keys and values add up to more than 4 GiB.
    fn from_iter<I: IntoIterator<Item = (K, V)>>(pairs: I) -> Self {
        Self::from_pairs(pairs.into_iter().collect()).expect("a label set under 4 GiB")
    }
}

impl PartialEq<BTreeMap<String, String>> for Labels {
    fn eq(&self, map: &BTreeMap<String, String>) -> bool {
        self.len() == map.len()
            && self
                .iter()
                .zip(map)
                .all(|((key, value), (k, v))| key == k && value == v)
    }
}

impl PartialEq<Labels> for BTreeMap<String, String> {
    fn eq(&self, labels: &Labels) -> bool {
        labels == self
    }
}

impl fmt::Debug for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<'de> Deserialize<'de> for Labels {
    /// Reads a JSON object of strings (or `null`, for none), keys and values borrowed from the
    /// input where they can be: nothing is allocated but the set itself.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_option(LabelsVisitor)
    }
}

struct LabelsVisitor;

impl<'de> Visitor<'de> for LabelsVisitor {
    type Value = Labels;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map of label keys to values")
    }

    fn visit_none<E: de::Error>(self) -> Result<Labels, E> {
        Ok(Labels::default())
    }

    fn visit_unit<E: de::Error>(self) -> Result<Labels, E> {
        Ok(Labels::default())
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Labels, D::Error> {
        deserializer.deserialize_map(self)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Labels, A::Error> {
        let mut pairs = Vec::with_capacity(map.size_hint().unwrap_or(0));
        while let Some((Text(key), Text(value))) = map.next_entry()? {
            pairs.push((key, value));
        }
        Labels::from_pairs(pairs)
            .map_err(|TooLong| de::Error::custom("a label set longer than 4 GiB"))
    }
}

/// A string read from the input, borrowed from it when it can be.
struct Text<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(TextVisitor).map(Text)
    }
}

struct TextVisitor;

impl<'de> Visitor<'de> for TextVisitor {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
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

/// The metadata of an object of type `K`, as a cache keeps it: everything but its annotations
/// and managed fields, its labels as [`Labels`].
///
/// It is the same API resource as `K`, asking for metadata only, so `Api<MetaView<K>>` lists
/// and watches what `Api<PartialObjectMeta<K>>` does.
pub struct MetaView<K> {
    /// The object's metadata. Its `labels` (see [`MetaView::labels`]), `annotations` and
    /// `managed_fields` are always `None`.
    pub metadata: ObjectMeta,
    /// The object's labels.
    pub labels: Labels,
    kind: PhantomData<fn() -> K>,
}

impl<K> MetaView<K> {
    /// What a cache keeps of `metadata`: its labels moved into a [`Labels`], its annotations and
    /// managed fields dropped.
    pub fn new(mut metadata: ObjectMeta) -> Self {
        let labels = metadata
            .labels
            .take()
            .map(|labels| Labels::from(&labels))
            .unwrap_or_default();
        (metadata.annotations, metadata.managed_fields) = (None, None);
        Self {
            metadata,
            labels,
            kind: PhantomData,
        }
    }
}

// Written out rather than derived: a derive would ask `K` for the same trait, and `K` is only
// the kind of object this is the metadata of.
impl<K> Clone for MetaView<K> {
    fn clone(&self) -> Self {
        Self {
            metadata: self.metadata.clone(),
            labels: self.labels.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> PartialEq for MetaView<K> {
    fn eq(&self, other: &Self) -> bool {
        self.metadata == other.metadata && self.labels == other.labels
    }
}

impl<K> fmt::Debug for MetaView<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetaView")
            .field("metadata", &self.metadata)
            .field("labels", &self.labels)
            .finish()
    }
}

impl<K: Resource<DynamicType = ()>> Resource for MetaView<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }

    fn api_version(dt: &()) -> Cow<'_, str> {
        K::api_version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }

    fn metadata_api() -> bool {
        true
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl<'de, K> Deserialize<'de> for MetaView<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Wire::deserialize(deserializer).map(|wire| wire.metadata.into())
    }
}

/// A `PartialObjectMetadata` as sent, down to what the view keeps; serde skips `apiVersion`,
/// `kind`, the annotations and the managed fields without building anything of them.
#[derive(Deserialize)]
struct Wire {
    #[serde(default)]
    metadata: WireMetadata,
}

/// Every field of `ObjectMeta` but the annotations and managed fields; the labels as
/// [`Labels`].
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireMetadata {
    creation_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    deletion_timestamp: Option<Time>,
    finalizers: Option<Vec<String>>,
    generate_name: Option<String>,
    generation: Option<i64>,
    #[serde(default)]
    labels: Labels,
    name: Option<String>,
    namespace: Option<String>,
    owner_references: Option<Vec<OwnerReference>>,
    resource_version: Option<String>,
    self_link: Option<String>,
    uid: Option<String>,
}

impl<K> From<WireMetadata> for MetaView<K> {
    fn from(wire: WireMetadata) -> Self {
        // Every field named, none defaulted: a field a later `ObjectMeta` adds fails to compile
        // here instead of being dropped unnoticed.
        let metadata = ObjectMeta {
            annotations: None,
            creation_timestamp: wire.creation_timestamp,
            deletion_grace_period_seconds: wire.deletion_grace_period_seconds,
            deletion_timestamp: wire.deletion_timestamp,
            finalizers: wire.finalizers,
            generate_name: wire.generate_name,
            generation: wire.generation,
            labels: None,
            managed_fields: None,
            name: wire.name,
            namespace: wire.namespace,
            owner_references: wire.owner_references,
            resource_version: wire.resource_version,
            self_link: wire.self_link,
            uid: wire.uid,
        };
        Self {
            metadata,
            labels: wire.labels,
            kind: PhantomData,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::managed_fields::WithoutManagedFields;
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use kube::api::PartialObjectMeta;
    use serde_json::json;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn labels_are_looked_up_and_listed_in_key_order() {
        let labels: Labels = [("b", "2"), ("c", "3"), ("a", "1")].into_iter().collect();
        assert_eq!(labels.len(), 3);
        assert_eq!(
            labels.iter().collect::<Vec<_>>(),
            [("a", "1"), ("b", "2"), ("c", "3")]
        );
        for (key, value) in [("a", "1"), ("b", "2"), ("c", "3")] {
            assert_eq!(labels.get(key), Some(value), "{key}");
        }
        for missing in ["", "0", "aa", "bb", "d"] {
            assert_eq!(labels.get(missing), None, "{missing:?}");
        }
    }

    #[test]
    fn of_two_pairs_with_one_key_the_later_counts_as_in_a_map() {
        let pairs = [("a", "1"), ("b", "x"), ("a", "2"), ("a", "3")];
        let labels: Labels = pairs.into_iter().collect();
        let map: BTreeMap<&str, &str> = pairs.into_iter().collect();
        assert_eq!(labels.iter().collect::<BTreeMap<_, _>>(), map);
        assert_eq!(labels.get("a"), Some("3"));
    }

    #[test]
    fn labels_equal_the_map_they_were_built_from_and_no_other() {
        let written = map(&[("app", "memcached"), ("memcached_cr", "m")]);
        let labels = Labels::from(&written);
        assert_eq!(labels, written);
        assert_eq!(written, labels);

        let differing_value = map(&[("app", "memcached"), ("memcached_cr", "n")]);
        let extra_key = map(&[("app", "memcached"), ("memcached_cr", "m"), ("x", "y")]);
        let missing_key = map(&[("app", "memcached")]);
        let other_key = map(&[("app", "memcached"), ("memcached_cs", "m")]);
        for other in [differing_value, extra_key, missing_key, other_key] {
            assert_ne!(labels, other);
            assert_ne!(other, labels);
            assert_ne!(labels, Labels::from(&other));
        }
    }

    #[test]
    fn labels_contain_a_selector_when_every_pair_of_it_is_there() {
        let labels = Labels::from(&map(&[("app", "m"), ("memcached_cr", "m"), ("team", "x")]));
        assert!(labels.contains_all(&map(&[("app", "m"), ("memcached_cr", "m")])));
        assert!(labels.contains_all(&BTreeMap::new()));
        assert!(!labels.contains_all(&map(&[("app", "m"), ("memcached_cr", "n")])));
        assert!(!labels.contains_all(&map(&[("app", "m"), ("zone", "a")])));
    }

    #[test]
    fn an_empty_label_set() {
        let empty = Labels::default();
        assert!(empty.is_empty());
        assert_eq!(empty.len(), 0);
        assert_eq!(empty.get(""), None);
        assert_eq!(empty.iter().count(), 0);
        assert_eq!(empty, BTreeMap::new());
        assert_eq!(BTreeMap::new(), empty);
        assert_eq!(Labels::from(&BTreeMap::new()), empty);
        assert_ne!(Labels::from(&map(&[("", "")])), empty);
        assert_eq!(format!("{empty:?}"), "{}");
    }

    #[test]
    fn keys_and_values_may_hold_any_character() {
        let odd = map(&[
            ("", "empty key"),
            ("a", ""),
            ("a=b", "c,d"),
            ("ab", "a"),
            ("nul\0", "\0"),
            ("tab\tnew\nline", "é ü 漢字 🦀"),
            ("🦀", "\u{10FFFF}"),
        ]);
        let labels = Labels::from(&odd);
        assert_eq!(labels, odd);
        assert_eq!(labels.len(), odd.len());
        for (key, value) in &odd {
            assert_eq!(labels.get(key), Some(value.as_str()), "{key:?}");
        }
        assert_eq!(labels.get("a="), None, "a key's prefix is no key");
    }

    #[test]
    fn labels_read_from_json_with_and_without_escapes() {
        let labels: Labels =
            serde_json::from_str(r#"{"b": "plain", "a\"q": "x\ny\u00e9"}"#).expect("parses");
        assert_eq!(labels, map(&[("a\"q", "x\nyé"), ("b", "plain")]));
        let none: Labels = serde_json::from_str("null").expect("parses");
        assert!(none.is_empty());
        let error = serde_json::from_str::<Labels>(r#"{"a": 1}"#).expect_err("not a string");
        assert!(error.to_string().contains("invalid type"), "{error}");
    }

    /// A Pod's metadata as a metadata-only list or watch sends it.
    fn sent() -> serde_json::Value {
        json!({
            "apiVersion": "meta.k8s.io/v1",
            "kind": "PartialObjectMetadata",
            "metadata": {
                "name": "bench-1234-6d9f8b7c5d-x7k2p",
                "generateName": "bench-1234-6d9f8b7c5d-",
                "namespace": "bench-ab12cd",
                "uid": "0b9a1f2e-7c1d-4d5e-9f3a-2b1c0d9e8f7a",
                "resourceVersion": "48213",
                "creationTimestamp": "2026-11-23T10:00:00Z",
                "labels": {
                    "app": "memcached",
                    "app.kubernetes.io/instance": "bench-1234",
                    "app.kubernetes.io/managed-by": crate::labels::manager(),
                    "app.kubernetes.io/name": "memcached",
                    "memcached_cr": "bench-1234",
                    "pod-template-hash": "6d9f8b7c5d",
                },
                "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-11-23T09:59:00Z"},
                "ownerReferences": [{
                    "apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": "bench-1234-6d9f8b7c5d", "uid": "u-rs",
                    "controller": true, "blockOwnerDeletion": true,
                }],
                "managedFields": [{
                    "manager": "kube-controller-manager", "operation": "Update",
                    "apiVersion": "v1", "time": "2026-11-23T10:00:00Z", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}}},
                }],
            },
        })
    }

    fn check_view(view: &MetaView<Pod>) {
        let meta = &view.metadata;
        assert_eq!(meta.name.as_deref(), Some("bench-1234-6d9f8b7c5d-x7k2p"));
        assert_eq!(meta.namespace.as_deref(), Some("bench-ab12cd"));
        assert_eq!(meta.resource_version.as_deref(), Some("48213"));
        assert!(meta.creation_timestamp.is_some());
        let owner = &meta.owner_references.as_ref().expect("owners")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("ReplicaSet", Some(true))
        );
        assert_eq!(
            (&meta.labels, &meta.annotations, &meta.managed_fields),
            (&None, &None, &None)
        );
        assert_eq!(view.labels.len(), 6);
        assert_eq!(view.labels.get("memcached_cr"), Some("bench-1234"));
        assert_eq!(view.labels.get("pod-template-hash"), Some("6d9f8b7c5d"));
    }

    #[test]
    fn reads_a_partial_object_metadata_keeping_all_but_annotations_and_managed_fields() {
        let view: MetaView<Pod> = serde_json::from_value(sent()).expect("parses");
        check_view(&view);
        let whole: PartialObjectMeta<Pod> = serde_json::from_value(sent()).expect("parses");
        assert_eq!(MetaView::new(whole.metadata), view);
    }

    #[test]
    fn reads_the_same_without_managed_fields_like_every_watched_object() {
        let text = sent().to_string();
        let WithoutManagedFields(view) =
            serde_json::from_str::<WithoutManagedFields<MetaView<Pod>>>(&text).expect("parses");
        check_view(&view);
        let direct: MetaView<Pod> = serde_json::from_str(&text).expect("parses");
        assert_eq!(view, direct);
    }

    #[test]
    fn a_bare_object_and_malformed_labels() {
        let bare: MetaView<Pod> = serde_json::from_value(json!({})).expect("parses");
        assert_eq!(bare, MetaView::new(ObjectMeta::default()));
        let unlabelled: MetaView<Pod> =
            serde_json::from_value(json!({"metadata": {"name": "p", "labels": null}}))
                .expect("parses");
        assert!(unlabelled.labels.is_empty());
        let error = serde_json::from_str::<WithoutManagedFields<MetaView<Pod>>>(
            r#"{"metadata": {"labels": ["a"]}}"#,
        )
        .expect_err("a list is no label set");
        assert!(error.to_string().contains("invalid type"), "{error}");
    }

    #[test]
    fn is_the_resource_of_its_kind_asking_for_metadata_only() {
        assert!(MetaView::<Pod>::metadata_api());
        assert!(WithoutManagedFields::<MetaView<Pod>>::metadata_api());
        assert_eq!(MetaView::<Pod>::kind(&()), "Pod");
        assert_eq!(MetaView::<Pod>::plural(&()), "pods");
        assert_eq!(MetaView::<Pod>::api_version(&()), "v1");
        assert_eq!(
            MetaView::<PodDisruptionBudget>::url_path(&(), Some("ns")),
            PodDisruptionBudget::url_path(&(), Some("ns"))
        );
        assert_eq!(MetaView::<PodDisruptionBudget>::group(&()), "policy");
    }
}
