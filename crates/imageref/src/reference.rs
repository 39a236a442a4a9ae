//! The reference itself: parsing, its parts, and its normalized and familiar forms.

use std::fmt;
use std::net::Ipv6Addr;

use crate::{
    DEFAULT_DOMAIN, DEFAULT_TAG, DigestProblem, LEGACY_DEFAULT_DOMAIN, NAME_MAX, OFFICIAL_PREFIX,
    ReferenceError, TAG_MAX,
};

/// A container image reference, `[domain[:port]/]path[:tag][@algorithm:hex]`, with its parts
/// as written.
///
/// [`ImageReference::normalized`] is the fully qualified form containerd, and so the kubelet,
/// stores and looks up (`docker.io/library/memcached:1.6` for `memcached:1.6`);
/// [`ImageReference::familiar`] is the short form people write. [`Display`](fmt::Display) gives
/// the reference as written, which parses back to the same value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ImageReference {
    domain: Option<String>,
    path: String,
    tag: Option<String>,
    digest: Option<String>,
}

impl ImageReference {
    /// Parses `reference`, checking every part against the grammar.
    ///
    /// The first component is the registry domain when it looks like a host (it has a `.` or a
    /// `:`, is `localhost`, or has a capital letter), as docker and containerd read it; a `:`
    /// after the last `/` starts the tag, one before it belongs to a registry port.
    ///
    /// # Errors
    ///
    /// A [`ReferenceError`] naming the first part that breaks the grammar, checked in this
    /// order: the whole (empty, whitespace), the digest, the tag, the name's length, the
    /// domain, the path components.
    pub fn parse(reference: &str) -> Result<Self, ReferenceError> {
        if reference.is_empty() {
            return Err(ReferenceError::Empty);
        }
        if let Some(c) = reference
            .chars()
            .find(|c| c.is_whitespace() || c.is_control())
        {
            return Err(ReferenceError::ForbiddenCharacter(c));
        }
        let (rest, digest) = match reference.split_once('@') {
            Some((rest, digest)) => (rest, Some(digest)),
            None => (reference, None),
        };
        if let Some(digest) = digest {
            check_digest(digest)?;
        }
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
            None => (rest, None),
        };
        if let Some(tag) = tag {
            check_tag(tag)?;
        }
        let (domain, path) = split_name(name)?;
        Ok(Self {
            domain: domain.map(str::to_owned),
            path: path.to_owned(),
            tag: tag.map(str::to_owned),
            digest: digest.map(str::to_owned),
        })
    }

    /// The registry domain with its port, e.g. `localhost:5000`, if the reference names one.
    pub fn domain(&self) -> Option<&str> {
        self.domain.as_deref()
    }

    /// The path within the registry, e.g. `team/app`.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The tag, e.g. `1.6`, if the reference names one.
    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    /// The digest, e.g. `sha256:0123…`, if the reference names one (it is then pinned).
    pub fn digest(&self) -> Option<&str> {
        self.digest.as_deref()
    }

    /// The last component of the path, e.g. `memcached` for `example.com/cache/memcached:1.6`.
    pub fn short_name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or(&self.path)
    }

    /// The same reference with `tag` as its tag; a digest stays.
    ///
    /// # Errors
    ///
    /// [`ReferenceError::Tag`] when `tag` breaks the tag grammar.
    pub fn with_tag(&self, tag: &str) -> Result<Self, ReferenceError> {
        check_tag(tag)?;
        Ok(Self {
            tag: Some(tag.to_owned()),
            ..self.clone()
        })
    }

    /// The fully qualified form docker and containerd store: the domain [`DEFAULT_DOMAIN`]
    /// when none is named (and in place of [`LEGACY_DEFAULT_DOMAIN`]), [`OFFICIAL_PREFIX`]
    /// before a single-component path on it, and the tag [`DEFAULT_TAG`] when the reference
    /// names neither tag nor digest.
    pub fn normalized(&self) -> Self {
        let domain = self.normalized_domain();
        let path = if domain == DEFAULT_DOMAIN && !self.path.contains('/') {
            format!("{OFFICIAL_PREFIX}{}", self.path)
        } else {
            self.path.clone()
        };
        let tag = match (&self.tag, &self.digest) {
            (None, None) => Some(DEFAULT_TAG.to_owned()),
            (tag, _) => tag.clone(),
        };
        Self {
            domain: Some(domain.to_owned()),
            path,
            tag,
            digest: self.digest.clone(),
        }
    }

    /// The familiar form people write: [`DEFAULT_DOMAIN`] left out, and [`OFFICIAL_PREFIX`]
    /// too before a single remaining component (`memcached:1.6`, `team/app:1`,
    /// `library/a/b:1`), so it parses back to the same normalized reference.
    pub fn familiar(&self) -> impl fmt::Display + '_ {
        Familiar(self)
    }

    /// The domain after normalization.
    fn normalized_domain(&self) -> &str {
        match self.domain.as_deref() {
            None | Some(LEGACY_DEFAULT_DOMAIN) => DEFAULT_DOMAIN,
            Some(domain) => domain,
        }
    }

    fn write_tag_and_digest(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

impl fmt::Display for ImageReference {
    /// The reference as written: `[domain/]path[:tag][@digest]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(domain) = &self.domain {
            write!(f, "{domain}/")?;
        }
        f.write_str(&self.path)?;
        self.write_tag_and_digest(f)
    }
}

impl std::str::FromStr for ImageReference {
    type Err = ReferenceError;

    fn from_str(reference: &str) -> Result<Self, Self::Err> {
        Self::parse(reference)
    }
}

/// [`ImageReference::familiar`].
#[derive(Debug)]
struct Familiar<'a>(&'a ImageReference);

impl fmt::Display for Familiar<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let reference = self.0;
        let domain = reference.normalized_domain();
        if domain == DEFAULT_DOMAIN {
            let path = reference
                .path
                .strip_prefix(OFFICIAL_PREFIX)
                .filter(|rest| !rest.contains('/'))
                .unwrap_or(&reference.path);
            f.write_str(path)?;
        } else {
            write!(f, "{domain}/{}", reference.path)?;
        }
        reference.write_tag_and_digest(f)
    }
}

/// Splits a repository name into its domain, if it names one, and its path, checking both.
fn split_name(name: &str) -> Result<(Option<&str>, &str), ReferenceError> {
    if name.is_empty() {
        return Err(ReferenceError::NoName);
    }
    if name.len() > NAME_MAX {
        return Err(ReferenceError::NameTooLong(name.len()));
    }
    let (domain, path) = match name.split_once('/') {
        Some((first, rest))
            if first.contains(['.', ':'])
                || first == "localhost"
                || first.chars().any(|c| c.is_ascii_uppercase()) =>
        {
            (Some(first), rest)
        }
        _ => (None, name),
    };
    if let Some(domain) = domain {
        check_domain(domain)?;
    }
    for component in path.split('/') {
        check_path_component(component)?;
    }
    Ok((domain, path))
}

/// `host[:port]`, the host a DNS name, an IPv4 address or a bracketed IPv6 address.
fn check_domain(domain: &str) -> Result<(), ReferenceError> {
    let bad = || ReferenceError::Domain(domain.to_owned());
    let (host, port) = if let Some(bracketed) = domain.strip_prefix('[') {
        let (v6, after) = bracketed.split_once(']').ok_or_else(bad)?;
        if v6.parse::<Ipv6Addr>().is_err() {
            return Err(bad());
        }
        let port = match after {
            "" => None,
            port => Some(port.strip_prefix(':').ok_or_else(bad)?),
        };
        (None, port)
    } else {
        match domain.split_once(':') {
            Some((host, port)) => (Some(host), Some(port)),
            None => (Some(domain), None),
        }
    };
    if let Some(host) = host {
        let label_ok = |label: &str| {
            !label.is_empty()
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        };
        if !host.split('.').all(label_ok) {
            return Err(bad());
        }
    }
    if let Some(port) = port
        && (port.is_empty() || !port.chars().all(|c| c.is_ascii_digit()))
    {
        return Err(ReferenceError::Port(port.to_owned()));
    }
    Ok(())
}

/// Lower-case letters and digits, separated by one `.`, one or two `_`, or any number of `-`.
fn check_path_component(component: &str) -> Result<(), ReferenceError> {
    let bad = || ReferenceError::Component(component.to_owned());
    if component.is_empty() {
        return Err(ReferenceError::EmptyComponent);
    }
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let mut chars = component.chars().peekable();
    loop {
        // A run of letters and digits.
        let mut run = 0;
        while chars.next_if(|c| alnum(*c)).is_some() {
            run += 1;
        }
        if run == 0 {
            return Err(bad());
        }
        let Some(&separator) = chars.peek() else {
            return Ok(());
        };
        let mut count = 0;
        while chars.next_if_eq(&separator).is_some() {
            count += 1;
        }
        let allowed = match separator {
            '.' => count == 1,
            '_' => count <= 2,
            '-' => true,
            _ => false,
        };
        if !allowed || chars.peek().is_none() {
            return Err(bad());
        }
    }
}

/// 1 to [`TAG_MAX`] word characters, dots and dashes, not starting with a dot or dash.
fn check_tag(tag: &str) -> Result<(), ReferenceError> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let ok = !tag.is_empty()
        && tag.len() <= TAG_MAX
        && tag.starts_with(word)
        && tag.chars().all(|c| word(c) || c == '.' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(ReferenceError::Tag(tag.to_owned()))
    }
}

/// `algorithm:hex`; for sha256, exactly 64 lower-case hex digits.
fn check_digest(digest: &str) -> Result<(), ReferenceError> {
    let bad = |problem| ReferenceError::Digest {
        digest: digest.to_owned(),
        problem,
    };
    let (algorithm, encoded) = digest
        .split_once(':')
        .ok_or_else(|| bad(DigestProblem::NotAlgorithmHex))?;
    let algorithm_ok = !algorithm.is_empty()
        && algorithm.split(['+', '.', '_', '-']).all(|part| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        });
    if !algorithm_ok {
        return Err(bad(DigestProblem::Algorithm));
    }
    let hex = |c: char| c.is_ascii_digit() || ('a'..='f').contains(&c);
    if algorithm == "sha256" && (encoded.len() != 64 || !encoded.chars().all(hex)) {
        return Err(bad(DigestProblem::Sha256));
    }
    if encoded.len() < 32 || !encoded.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(bad(DigestProblem::Encoded));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn parse(reference: &str) -> ImageReference {
        ImageReference::parse(reference).expect(reference)
    }

    /// Whether `reference` names a tag and a digest.
    fn tagged_and_pinned(reference: &str) -> (bool, bool) {
        let parsed = parse(reference);
        (parsed.tag().is_some(), parsed.digest().is_some())
    }

    #[test]
    fn references_the_runtimes_accept() {
        for reference in [
            "memcached:1.6.39-alpine",
            "docker.io/library/memcached:1.6",
            "operator-manager.local/memcached:1.6.18",
            "localhost:5000/team/app:v1",
            "registry.example:443/a/b/c:latest",
            "[::1]:5000/app:1",
            "my_app__x:1",
            "a-b---c.d:TAG_1.0-rc",
        ] {
            assert_eq!(tagged_and_pinned(reference), (true, false), "{reference}");
        }
        assert_eq!(tagged_and_pinned("memcached"), (false, false));
        assert_eq!(
            tagged_and_pinned(&format!("memcached:1.6@{SHA}")),
            (true, true)
        );
        assert_eq!(
            tagged_and_pinned(&format!("registry.example:5000/memcached@{SHA}")),
            (false, true)
        );
    }

    #[test]
    fn the_parts_are_kept_as_written_and_display_gives_them_back() {
        let reference = format!("[::1]:5000/team/app:v1@{SHA}");
        let parsed = parse(&reference);
        assert_eq!(parsed.domain(), Some("[::1]:5000"));
        assert_eq!(parsed.path(), "team/app");
        assert_eq!(parsed.tag(), Some("v1"));
        assert_eq!(parsed.digest(), Some(SHA));
        assert_eq!(parsed.short_name(), "app");
        assert_eq!(parsed.to_string(), reference);
        assert_eq!(reference.parse::<ImageReference>(), Ok(parsed));

        let parsed = parse("memcached");
        assert_eq!(parsed.domain(), None);
        assert_eq!(parsed.to_string(), "memcached");
        // A capital letter makes the first component a registry, as docker reads it.
        assert_eq!(parse("Registry/app").domain(), Some("Registry"));
    }

    #[test]
    fn malformed_references_say_which_part_is_wrong() {
        for (reference, says) in [
            ("", "must not be empty"),
            ("memcached 1.6", "' '"),
            ("Memcached:1.6", "name component \"Memcached\""),
            ("memcached:", "malformed tag \"\""),
            ("memcached:-1", "malformed tag"),
            ("memcached::1", "name component \"memcached:\""),
            ("team//app:1", "empty name component"),
            ("team/app/:1", "empty name component"),
            ("app.:1", "name component \"app.\""),
            ("a..b:1", "name component \"a..b\""),
            ("a___b:1", "name component"),
            (
                "registry.example:port/app",
                "port \"port\" that is not a number",
            ),
            ("-registry.example/app", "malformed registry"),
            ("memcached@sha256:abc", "64 lower-case hex digits"),
            ("memcached@md5", "expected `algorithm:hex`"),
            (":1.6", "has no repository name"),
            // The cases ociimage's own parser refused.
            (":1.0", "has no repository name"),
            ("Upper:1.0", "name component \"Upper\""),
            ("name:", "malformed tag \"\""),
            ("name:-x", "malformed tag \"-x\""),
            ("a//b:1", "empty name component"),
            ("name@sha256:abcd", "malformed digest \"sha256:abcd\""),
            ("bad_-sep:1", "name component \"bad_-sep\""),
            ("-lead:1", "name component \"-lead\""),
            ("host.example:/x:1", "registry port \"\""),
            // Registries.
            ("[::1/app", "malformed registry \"[::1\""),
            ("[zz]:5000/app", "malformed registry \"[zz]:5000\""),
            ("[::1]5000/app", "malformed registry \"[::1]5000\""),
            ("[::1]:/app", "registry port \"\""),
            ("a..example/app", "malformed registry"),
            ("registry-.example/app", "malformed registry"),
            // Digests.
            ("memcached@:0123", "the algorithm is malformed"),
            ("memcached@Sha256:0123", "the algorithm is malformed"),
            ("memcached@sha512:0123", "at least 32 hex digits"),
            (
                "memcached@sha256:0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef",
                "64 lower-case hex digits",
            ),
            ("memcached\t", "'\\t'"),
        ] {
            let error = ImageReference::parse(reference).expect_err(reference);
            assert!(error.to_string().contains(says), "{reference:?}: {error}");
        }
        let long = format!("{}:1", "a".repeat(256));
        let error = ImageReference::parse(&long).expect_err("long");
        assert_eq!(error, ReferenceError::NameTooLong(256));
        assert!(error.to_string().contains("255"));
        assert!(ImageReference::parse(&format!("{}:1", "a".repeat(255))).is_ok());
        let long_tag = format!("app:{}", "a".repeat(129));
        assert!(
            ImageReference::parse(&long_tag)
                .expect_err("long tag")
                .to_string()
                .contains("128")
        );
        assert!(ImageReference::parse(&format!("app:{}", "a".repeat(128))).is_ok());
    }

    #[test]
    fn the_messages_are_the_sentences_admission_reports() {
        let message = |reference: &str| {
            ImageReference::parse(reference)
                .expect_err(reference)
                .to_string()
        };
        assert_eq!(message(""), "must not be empty");
        assert_eq!(message("a b"), "must not contain ' '");
        assert_eq!(message(":1"), "has no repository name");
        assert_eq!(
            message(&"a".repeat(256)),
            "has a repository name of 256 characters; at most 255 are allowed"
        );
        assert_eq!(
            message("-r.example/a"),
            "has a malformed registry \"-r.example\""
        );
        assert_eq!(
            message("r.example:x/a"),
            "has a registry port \"x\" that is not a number"
        );
        assert_eq!(
            message("a//b"),
            "has an empty name component (two `/` in a row, or one at an end)"
        );
        assert_eq!(
            message("A"),
            "has a malformed name component \"A\": use lower-case letters and digits, \
             separated by `.`, `_`, `__` or dashes"
        );
        assert_eq!(
            message("a:.1"),
            "has a malformed tag \".1\": 1 to 128 letters, digits, `_`, `.` or `-`, \
             not starting with `.` or `-`"
        );
        assert_eq!(
            message("a@x"),
            "has a malformed digest \"x\": expected `algorithm:hex`"
        );
        assert_eq!(
            message("a@x!:0"),
            "has a malformed digest \"x!:0\": the algorithm is malformed"
        );
        assert_eq!(
            message("a@sha256:0"),
            "has a malformed digest \"sha256:0\": sha256 takes 64 lower-case hex digits"
        );
        assert_eq!(
            message("a@sha512:0"),
            "has a malformed digest \"sha512:0\": at least 32 hex digits"
        );
    }

    #[test]
    fn short_names_normalize_to_the_default_registry() {
        let r = parse("operator-manager:0.1.0").normalized();
        assert_eq!(r.to_string(), "docker.io/library/operator-manager:0.1.0");
        assert_eq!(r.familiar().to_string(), "operator-manager:0.1.0");
        assert_eq!(r.tag(), Some("0.1.0"));
        assert_eq!(r.short_name(), "operator-manager");

        let r = parse("team/app").normalized();
        assert_eq!(r.to_string(), "docker.io/team/app:latest");
        assert_eq!(r.familiar().to_string(), "team/app:latest");

        let r = parse("index.docker.io/memcached:1.6").normalized();
        assert_eq!(r.to_string(), "docker.io/library/memcached:1.6");
        assert_eq!(r.familiar().to_string(), "memcached:1.6");
        assert_eq!(
            parse("docker.io/memcached").normalized().to_string(),
            "docker.io/library/memcached:latest"
        );
        assert_eq!(parse("memcached").familiar().to_string(), "memcached");
    }

    #[test]
    fn a_dotted_first_component_is_the_registry() {
        let r = parse("operator-manager.local/memcached:1.6.18").normalized();
        assert_eq!(r.to_string(), "operator-manager.local/memcached:1.6.18");
        assert_eq!(
            r.familiar().to_string(),
            "operator-manager.local/memcached:1.6.18"
        );
        assert_eq!(r.short_name(), "memcached");

        let r = parse("localhost:5000/a/b").normalized();
        assert_eq!(r.to_string(), "localhost:5000/a/b:latest");
        assert_eq!(r.short_name(), "b");
    }

    #[test]
    fn normalization_is_idempotent_and_the_familiar_form_parses_back() {
        for reference in [
            "memcached",
            "team/app:1",
            "docker.io/library/a/b:1",
            "index.docker.io/library/memcached:1.6",
            "localhost/app",
            "[::1]:5000/app:1",
        ] {
            let normalized = parse(reference).normalized();
            assert_eq!(normalized.normalized(), normalized, "{reference}");
            let familiar = normalized.familiar().to_string();
            assert_eq!(parse(&familiar).normalized(), normalized, "{familiar}");
        }
        // `library/` stays where leaving it out would name another repository.
        assert_eq!(
            parse("docker.io/library/a/b:1").familiar().to_string(),
            "library/a/b:1"
        );
    }

    #[test]
    fn a_pinned_reference_gets_no_default_tag() {
        let r = parse(&format!("memcached@{SHA}")).normalized();
        assert_eq!(r.to_string(), format!("docker.io/library/memcached@{SHA}"));
        assert_eq!(r.tag(), None);
        let r = parse(&format!("memcached:1.6@{SHA}")).normalized();
        assert_eq!(r.familiar().to_string(), format!("memcached:1.6@{SHA}"));
    }

    #[test]
    fn with_tag_checks_the_tag_and_keeps_the_rest() {
        let r = parse("registry.example/app:1");
        assert_eq!(
            r.with_tag("2").map(|r| r.to_string()),
            Ok("registry.example/app:2".to_owned())
        );
        assert_eq!(r.with_tag("-x"), Err(ReferenceError::Tag("-x".to_owned())));
    }
}
