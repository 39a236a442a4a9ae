//! Image references (`[domain/]path:tag`) and the normalization every runtime applies to them.

use std::fmt;

use crate::Error;

/// The registry domain a reference without one belongs to.
const DEFAULT_DOMAIN: &str = "docker.io";
/// The path prefix of single-component names on the default domain.
const OFFICIAL_PREFIX: &str = "library/";
/// The tag a reference without one stands for.
const DEFAULT_TAG: &str = "latest";

/// A tagged image name, e.g. `operator-manager:0.1.0` or `registry.example/team/app:1.2`.
///
/// Kept in normalized form: [`Reference::normalized`] is what containerd, and so the kubelet,
/// stores and looks up (`docker.io/library/operator-manager:0.1.0` for `image:
/// operator-manager:0.1.0`); [`Display`](fmt::Display) gives the short form people write.
/// Digest references (`name@sha256:…`) are not accepted: an image being built has no digest yet.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Reference {
    domain: String,
    path: String,
    tag: String,
}

impl Reference {
    /// Parses and normalizes `reference`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidReference`] when the name, domain or tag breaks the reference grammar.
    pub fn parse(reference: &str) -> Result<Self, Error> {
        let invalid = |reason| Error::InvalidReference {
            reference: reference.to_owned(),
            reason,
        };
        if reference.contains('@') {
            return Err(invalid("digests are not accepted, only a tag"));
        }
        // A `:` after the last `/` starts the tag; one before it is a registry port.
        let last_slash = reference.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match reference[last_slash..].rfind(':') {
            Some(i) => (
                &reference[..last_slash + i],
                &reference[last_slash + i + 1..],
            ),
            None => (reference, DEFAULT_TAG),
        };
        if name.is_empty() {
            return Err(invalid("the name is empty"));
        }
        if name.len() > 255 {
            return Err(invalid("the name is longer than 255 characters"));
        }
        if !valid_tag(tag) {
            return Err(invalid(
                "the tag must be 1 to 128 of `A-Za-z0-9_.-`, not starting with `.` or `-`",
            ));
        }
        let (domain, path) = match name.split_once('/') {
            Some((first, rest))
                if first.contains(['.', ':'])
                    || first == "localhost"
                    || first.chars().any(|c| c.is_ascii_uppercase()) =>
            {
                (first, rest.to_owned())
            }
            _ => (DEFAULT_DOMAIN, name.to_owned()),
        };
        if !valid_domain(domain) {
            return Err(invalid("the registry domain is malformed"));
        }
        let domain = if domain == "index.docker.io" {
            DEFAULT_DOMAIN
        } else {
            domain
        };
        if !path.split('/').all(valid_path_component) {
            return Err(invalid(
                "each name component must be lowercase letters and digits, separated by `.`, `_`, `__` or `-`",
            ));
        }
        let path = if domain == DEFAULT_DOMAIN && !path.contains('/') {
            format!("{OFFICIAL_PREFIX}{path}")
        } else {
            path
        };
        Ok(Self {
            domain: domain.to_owned(),
            path,
            tag: tag.to_owned(),
        })
    }

    /// The fully qualified name, `domain/path:tag`: what containerd lists and the kubelet asks for.
    pub fn normalized(&self) -> String {
        format!("{}/{}:{}", self.domain, self.path, self.tag)
    }

    /// The tag.
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// The same name with `tag`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidReference`] when `tag` breaks the tag grammar.
    pub fn with_tag(&self, tag: &str) -> Result<Self, Error> {
        Self::parse(&format!("{}/{}:{tag}", self.domain, self.path))
    }

    /// The last component of the name, e.g. `memcached` for `example.com/cache/memcached:1.6`.
    pub fn short_name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or(&self.path)
    }
}

impl fmt::Display for Reference {
    /// The familiar form: the default domain and `library/` left out.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.domain == DEFAULT_DOMAIN {
            let path = self
                .path
                .strip_prefix(OFFICIAL_PREFIX)
                .unwrap_or(&self.path);
            write!(f, "{path}:{}", self.tag)
        } else {
            write!(f, "{}/{}:{}", self.domain, self.path, self.tag)
        }
    }
}

fn valid_tag(tag: &str) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    (1..=128).contains(&tag.len())
        && tag.starts_with(word)
        && tag.chars().all(|c| word(c) || c == '.' || c == '-')
}

fn valid_domain(domain: &str) -> bool {
    let (host, port) = match domain.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (domain, None),
    };
    let label_ok = |label: &str| {
        !label.is_empty()
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    };
    host.split('.').all(label_ok)
        && port.is_none_or(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
}

/// `[a-z0-9]+` runs joined by `.`, `_`, `__` or any number of `-`.
fn valid_path_component(component: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    if !component.starts_with(alnum) || !component.ends_with(alnum) {
        return false;
    }
    let mut separator = String::new();
    for c in component.chars() {
        if alnum(c) {
            let ok = separator.is_empty()
                || separator == "."
                || separator == "_"
                || separator == "__"
                || separator.chars().all(|s| s == '-');
            if !ok {
                return false;
            }
            separator.clear();
        } else if matches!(c, '.' | '_' | '-') {
            separator.push(c);
        } else {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_normalize_to_the_default_registry() {
        let r = Reference::parse("operator-manager:0.1.0").unwrap();
        assert_eq!(r.normalized(), "docker.io/library/operator-manager:0.1.0");
        assert_eq!(r.to_string(), "operator-manager:0.1.0");
        assert_eq!(r.tag(), "0.1.0");
        assert_eq!(r.short_name(), "operator-manager");

        let r = Reference::parse("team/app").unwrap();
        assert_eq!(r.normalized(), "docker.io/team/app:latest");
        assert_eq!(r.to_string(), "team/app:latest");
    }

    #[test]
    fn a_dotted_first_component_is_the_registry() {
        let r = Reference::parse("operator-manager.local/memcached:1.6.18").unwrap();
        assert_eq!(r.normalized(), "operator-manager.local/memcached:1.6.18");
        assert_eq!(r.to_string(), "operator-manager.local/memcached:1.6.18");
        assert_eq!(r.short_name(), "memcached");

        let r = Reference::parse("localhost:5000/a/b").unwrap();
        assert_eq!(r.normalized(), "localhost:5000/a/b:latest");
        assert_eq!(r.short_name(), "b");
    }

    #[test]
    fn malformed_references_are_refused_with_the_reference_named() {
        for bad in [
            "",
            ":1.0",
            "Upper:1.0",
            "name:",
            "name:-x",
            "a//b:1",
            "name@sha256:abcd",
            "bad_-sep:1",
            "-lead:1",
            "host.example:/x:1",
        ] {
            let error = Reference::parse(bad).expect_err(bad);
            assert!(error.to_string().contains(&format!("{bad:?}")), "{error}");
        }
    }
}
