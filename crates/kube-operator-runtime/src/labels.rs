//! Labels the controllers put on what they own, and label values that are always valid.

use std::collections::BTreeMap;

/// `app.kubernetes.io/managed-by` on every object the controllers own. The shared watches
/// select on it, so the manager caches only its own children.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// `app.kubernetes.io/name`: the application (`memcached`, `myapp`).
pub const NAME: &str = "app.kubernetes.io/name";
/// `app.kubernetes.io/instance`: which custom resource the object belongs to, as a
/// [`label_value`].
pub const INSTANCE: &str = "app.kubernetes.io/instance";
/// `app.kubernetes.io/part-of`: the platform.
pub const PART_OF: &str = "app.kubernetes.io/part-of";
/// `kube-operator-runtime/shard-slot`: on the children of a sharded manager, the slot of
/// their owner's uid ([`crate::slots::slot_of_uid`]), so that each replica watches and caches
/// only the children of the objects it owns ([`crate::slots::Slots::label_selector`]).
pub const SHARD_SLOT: &str = "kube-operator-runtime/shard-slot";
/// The manager's name and the platform's until [`set_product`] names them.
pub const DEFAULT_PRODUCT: &str = "kube-operator-runtime";

/// The names the process's controllers label and write with.
#[derive(Debug, PartialEq, Eq)]
struct Product {
    manager: String,
    part_of: String,
}

static PRODUCT: std::sync::OnceLock<Product> = std::sync::OnceLock::new();

fn product() -> &'static Product {
    PRODUCT.get_or_init(|| Product {
        manager: DEFAULT_PRODUCT.to_owned(),
        part_of: DEFAULT_PRODUCT.to_owned(),
    })
}

/// Names the manager and the platform for the whole process: the [`MANAGED_BY`] and
/// [`PART_OF`] values of everything the controllers own, which the shared watches select on,
/// and the prefix of their field managers and Event reporters. Call it once, before the
/// controllers are built; calling it again with the same names does nothing.
///
/// # Errors
/// [`crate::Error::ProductName`] when a name is no valid label value, or when the process
/// already uses other names (set earlier, or [`DEFAULT_PRODUCT`] once read).
pub fn set_product(manager: &str, part_of: &str) -> Result<(), crate::Error> {
    for (what, value) in [("manager", manager), ("part-of", part_of)] {
        if value.is_empty() || value.len() > MAX_LABEL_VALUE || !is_valid_label_value(value) {
            return Err(crate::Error::ProductName {
                reason: format!("the {what} name {value:?} is no valid label value"),
            });
        }
    }
    let wanted = Product {
        manager: manager.to_owned(),
        part_of: part_of.to_owned(),
    };
    let used = PRODUCT.get_or_init(|| Product {
        manager: manager.to_owned(),
        part_of: part_of.to_owned(),
    });
    if *used != wanted {
        return Err(crate::Error::ProductName {
            reason: format!(
                "the process already labels with manager {:?} and part-of {:?}",
                used.manager, used.part_of
            ),
        });
    }
    Ok(())
}

/// The value of [`MANAGED_BY`]: the manager's name ([`set_product`]).
pub fn manager() -> &'static str {
    &product().manager
}

/// The value of [`PART_OF`]: the platform's name ([`set_product`]).
pub fn part_of() -> &'static str {
    &product().part_of
}

/// `labels` plus the labels of everything the controllers own: [`MANAGED_BY`] (which the
/// shared watches select on) and [`PART_OF`].
pub fn managed(mut labels: BTreeMap<String, String>) -> BTreeMap<String, String> {
    labels.insert(MANAGED_BY.to_owned(), manager().to_owned());
    labels.insert(PART_OF.to_owned(), part_of().to_owned());
    labels
}

/// The labels that tell the objects of the application `app` that belong to the custom
/// resource `instance` (its name) from all others: [`NAME`] and [`INSTANCE`], the pod
/// selector of a workload.
pub fn instance(app: &str, instance: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (NAME.to_owned(), app.to_owned()),
        (INSTANCE.to_owned(), label_value(instance)),
    ])
}

/// [`instance`] plus [`managed`]: every label of an object the controllers own.
pub fn managed_instance(app: &str, name: &str) -> BTreeMap<String, String> {
    managed(instance(app, name))
}

/// The label selector (`key=value,key=value`) of the objects carrying every label of
/// `labels`.
pub fn selector(labels: &BTreeMap<String, String>) -> String {
    let pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    pairs.join(",")
}

/// The label selector of the shared watches: only objects these controllers manage.
pub fn managed_selector() -> String {
    format!("{MANAGED_BY}={}", manager())
}

/// The complement of [`managed_selector`]: every object these controllers do not manage,
/// including those without the label.
pub fn unmanaged_selector() -> String {
    format!("{MANAGED_BY}!={}", manager())
}

/// The longest label value Kubernetes accepts.
pub const MAX_LABEL_VALUE: usize = 63;

/// Hex digits of the hash that [`label_value`] appends to a shortened name.
const HASH_DIGITS: usize = 10;

/// A label value that stands for `name`: `name` itself when it fits in 63 characters, otherwise a
/// prefix of it, a `-` and a hash of the whole name, 63 characters at most.
///
/// Object names (DNS subdomains: lower-case letters, digits, `-` and `.`) only ever use characters
/// label values allow; the prefix is trimmed so the value still starts and ends with an
/// alphanumeric character. The hash is FNV-1a, written out here rather than taken from
/// `std::hash` because a selector built from it is immutable once a Deployment exists: the value
/// must never change between releases.
pub fn label_value(name: &str) -> String {
    if name.len() <= MAX_LABEL_VALUE && is_valid_label_value(name) {
        return name.to_owned();
    }
    let hash = format!("{:016x}", fnv1a(name.as_bytes()));
    let hash = &hash[..HASH_DIGITS];
    let keep = MAX_LABEL_VALUE - HASH_DIGITS - 1;
    let prefix: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .take(keep)
        .collect();
    let prefix = prefix.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if prefix.is_empty() {
        hash.to_owned()
    } else {
        format!("{prefix}-{hash}")
    }
}

/// Whether `value` has the shape of a shortened name from [`label_value`]: [`HASH_DIGITS`]
/// lower-case hex digits, alone or after a prefix and a `-`. A value of any other shape stands
/// for exactly the name it spells, so nothing needs to be searched for the name it shortens.
pub fn may_be_shortened(value: &str) -> bool {
    let bytes = value.as_bytes();
    let Some(start) = bytes.len().checked_sub(HASH_DIGITS) else {
        return false;
    };
    let hex = bytes[start..]
        .iter()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b));
    hex && (start == 0 || bytes[start - 1] == b'-')
}

/// A DNS label (RFC 1035: at most 63 lower-case letters, digits and `-`, starting with a letter,
/// ending with a letter or digit) that stands for the object name `name`, as Service names must
/// be: `name` itself when it is one, otherwise a prefix of it, a `-` and a hash of the whole name
/// (the same FNV-1a as [`label_value`], stable between releases).
pub fn dns_label(name: &str) -> String {
    let is_label = name.len() <= MAX_LABEL_VALUE
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if is_label {
        return name.to_owned();
    }
    let hash = format!("{:016x}", fnv1a(name.as_bytes()));
    let hash = &hash[..HASH_DIGITS];
    let prefix: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .take(MAX_LABEL_VALUE - HASH_DIGITS - 1)
        .collect();
    let prefix = prefix
        .trim_start_matches(|c: char| !c.is_ascii_lowercase())
        .trim_end_matches('-');
    if prefix.is_empty() {
        format!("x-{hash}")
    } else {
        format!("{prefix}-{hash}")
    }
}

/// Whether `value` is a valid label value: empty, or at most 63 characters of `[A-Za-z0-9-_.]`
/// beginning and ending with an alphanumeric character.
pub fn is_valid_label_value(value: &str) -> bool {
    if value.is_empty() {
        return true;
    }
    let bytes = value.as_bytes();
    value.len() <= MAX_LABEL_VALUE
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// 64-bit FNV-1a.
/// A hash of `text` that never changes between releases (FNV-1a, 16 hex digits): for a pod
/// template annotation that rolls the pods when the configuration they read changes.
pub fn content_hash(text: &str) -> String {
    format!("{:016x}", fnv1a(text.as_bytes()))
}

fn fnv1a(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes
        .iter()
        .fold(OFFSET, |hash, b| (hash ^ u64::from(*b)).wrapping_mul(PRIME))
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_product_is_named_once_with_valid_label_values() {
        // Whatever this test process uses already, naming it again changes nothing.
        let (manager, part_of) = (super::manager(), super::part_of());
        assert!(super::set_product(manager, part_of).is_ok());
        let error = super::set_product("another-name", part_of).unwrap_err();
        assert!(
            error.to_string().contains("already labels with manager"),
            "{error}"
        );
        let error = super::set_product("not a label!", part_of).unwrap_err();
        assert_eq!(
            error.to_string(),
            "cannot name the product: the manager name \"not a label!\" is no valid label value"
        );
        assert_eq!(super::manager(), manager);
    }

    use super::*;

    #[test]
    fn a_content_hash_is_fixed_and_tells_contents_apart() {
        assert_eq!(content_hash(""), "cbf29ce484222325");
        assert_ne!(
            content_hash("maxmemory 64mb"),
            content_hash("maxmemory 65mb")
        );
    }

    #[test]
    fn dns_labels_stand_for_any_object_name() {
        assert_eq!(dns_label("memcached-sample"), "memcached-sample");
        let long = format!("m{}", "x".repeat(99));
        for name in [long.as_str(), "cache.example", "1st-cache", "9.9"] {
            let label = dns_label(name);
            assert!(label.len() <= MAX_LABEL_VALUE, "{label}");
            assert!(
                label.starts_with(|c: char| c.is_ascii_lowercase()),
                "{label}"
            );
            assert!(
                label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{label}"
            );
            assert_eq!(label, dns_label(name), "stable");
        }
        assert_ne!(dns_label("a.b"), dns_label("a-b.c"));
        assert_ne!(dns_label("cache.one"), dns_label("cache-one"));
    }

    #[test]
    fn short_names_are_kept() {
        assert_eq!(label_value("memcached-sample"), "memcached-sample");
        let exact = "a".repeat(63);
        assert_eq!(label_value(&exact), exact);
    }

    #[test]
    fn long_names_are_shortened_validly_and_stably() {
        let long = format!("m{}", "x".repeat(99));
        let value = label_value(&long);
        assert_eq!(value.len(), 63, "{value}");
        assert!(is_valid_label_value(&value), "{value}");
        assert!(value.starts_with("mxxx"));
        // Stable across calls and releases: this exact value is part of Deployment selectors.
        assert_eq!(value, label_value(&long));
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn only_values_of_the_shortened_shape_may_be_shortened() {
        for long in [
            format!("m{}", "x".repeat(99)),
            format!("{}.{}", "a".repeat(51), "b".repeat(40)),
        ] {
            assert!(may_be_shortened(&label_value(&long)), "{long}");
        }
        assert!(may_be_shortened("0123456789"));
        for short in [
            "memcached-sample",
            "mc-1",
            "m-012345678",
            "m_0123456789",
            "",
        ] {
            assert!(!may_be_shortened(short), "{short}");
        }
    }

    #[test]
    fn names_sharing_a_long_prefix_get_different_values() {
        let base = "y".repeat(80);
        assert_ne!(
            label_value(&format!("{base}-one")),
            label_value(&format!("{base}-two"))
        );
    }

    #[test]
    fn the_prefix_never_ends_in_punctuation() {
        // 52 characters are kept before the hash; make the 52nd a dot.
        let name = format!("{}.{}", "a".repeat(51), "b".repeat(40));
        let value = label_value(&name);
        assert!(is_valid_label_value(&value), "{value}");
        assert!(!value.contains(".-"), "{value}");
    }

    #[test]
    fn validity() {
        assert!(is_valid_label_value(""));
        assert!(is_valid_label_value("a.b_c-d"));
        assert!(!is_valid_label_value("-a"));
        assert!(!is_valid_label_value("a."));
        assert!(!is_valid_label_value("a/b"));
        assert!(!is_valid_label_value(&"a".repeat(64)));
    }
}
