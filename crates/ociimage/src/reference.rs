//! The tagged reference an image is built and imported under, in the normalized form every
//! runtime stores; the grammar and the normalization are [`imageref`]'s.

use std::fmt;

use imageref::{DEFAULT_DOMAIN, DEFAULT_TAG, ImageReference, OFFICIAL_PREFIX};

use crate::Error;

/// A tagged image name, e.g. `operator-manager:0.1.0` or `registry.example/team/app:1.2`.
///
/// Kept in normalized form: [`Reference::normalized`] is what containerd, and so the kubelet,
/// stores and looks up (`docker.io/library/operator-manager:0.1.0` for `image:
/// operator-manager:0.1.0`); [`Display`](fmt::Display) gives the short form people write.
/// Digest references (`name@sha256:…`) are not accepted: an image being built has no digest yet.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Reference(
    /// Normalized, so it has a domain and a tag, and no digest.
    ImageReference,
);

impl Reference {
    /// Parses and normalizes `reference`; without a tag it stands for `latest`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidReference`] when the reference names a digest, or breaks the reference
    /// grammar (its reason then names the part, as [`imageref::ReferenceError`] does).
    pub fn parse(reference: &str) -> Result<Self, Error> {
        let invalid = |reason| Error::InvalidReference {
            reference: reference.to_owned(),
            reason,
        };
        if reference.contains('@') {
            return Err(invalid("digests are not accepted, only a tag".to_owned()));
        }
        let parsed = ImageReference::parse(reference).map_err(|e| invalid(format!("it {e}")))?;
        Ok(Self(parsed.normalized()))
    }

    /// The fully qualified name, `domain/path:tag`: what containerd lists and the kubelet asks for.
    pub fn normalized(&self) -> String {
        self.0.to_string()
    }

    /// The tag.
    pub fn tag(&self) -> &str {
        self.0.tag().unwrap_or(DEFAULT_TAG)
    }

    /// The same name with `tag`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidReference`] when `tag` breaks the tag grammar.
    pub fn with_tag(&self, tag: &str) -> Result<Self, Error> {
        self.0
            .with_tag(tag)
            .map(Self)
            .map_err(|e| Error::InvalidReference {
                reference: format!(
                    "{}/{}:{tag}",
                    self.0.domain().unwrap_or_default(),
                    self.0.path()
                ),
                reason: format!("it {e}"),
            })
    }

    /// The name without its registry, as people write it: `operator-manager` for
    /// `docker.io/library/operator-manager`, `team/app` for `registry.example/team/app`. What the
    /// image is called when pushed to another registry.
    pub fn repository(&self) -> &str {
        let path = self.0.path();
        match self.0.domain() {
            Some(DEFAULT_DOMAIN) => path.strip_prefix(OFFICIAL_PREFIX).unwrap_or(path),
            _ => path,
        }
    }

    /// The last component of the name, e.g. `memcached` for `example.com/cache/memcached:1.6`.
    pub fn short_name(&self) -> &str {
        self.0.short_name()
    }
}

impl fmt::Display for Reference {
    /// The familiar form: the default domain and `library/` left out.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.familiar().fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_kept_normalized_and_shown_short() {
        let r = Reference::parse("operator-manager:0.1.0").unwrap();
        assert_eq!(r.normalized(), "docker.io/library/operator-manager:0.1.0");
        assert_eq!(r.to_string(), "operator-manager:0.1.0");
        assert_eq!(r.tag(), "0.1.0");
        assert_eq!(r.short_name(), "operator-manager");
        assert_eq!(r.repository(), "operator-manager");
        let r = Reference::parse("docker.io/team/app:1").unwrap();
        assert_eq!(r.repository(), "team/app");

        let r = Reference::parse("localhost:5000/a/b").unwrap();
        assert_eq!(r.normalized(), "localhost:5000/a/b:latest");
        assert_eq!(r.repository(), "a/b");
        assert_eq!(r.tag(), "latest");

        let r = r.with_tag("2.0").unwrap();
        assert_eq!(r.normalized(), "localhost:5000/a/b:2.0");
        assert_eq!(r.to_string(), "localhost:5000/a/b:2.0");
    }

    #[test]
    fn malformed_references_are_refused_with_the_reference_named() {
        for (bad, reason) in [
            ("", "it must not be empty"),
            ("Upper:1.0", "it has a malformed name component \"Upper\""),
            ("name:-x", "it has a malformed tag \"-x\""),
            ("host.example:/x:1", "it has a registry port \"\""),
            ("name@sha256:abcd", "digests are not accepted, only a tag"),
        ] {
            let error = Reference::parse(bad).expect_err(bad);
            let message = error.to_string();
            assert!(
                message.starts_with(&format!("invalid image reference {bad:?}: {reason}")),
                "{message}"
            );
        }
        let error = Reference::parse("app:1")
            .unwrap()
            .with_tag(".x")
            .expect_err(".x");
        assert!(
            error.to_string().starts_with(
                "invalid image reference \"docker.io/library/app:.x\": it has a malformed tag"
            ),
            "{error}"
        );
    }
}
