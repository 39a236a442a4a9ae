//! Container image references as the kubelet and the container runtimes read them:
//! `[domain[:port]/]path[:tag][@algorithm:hex]`, the grammar of the distribution project's
//! reference package. A reference the runtime cannot parse leaves the pod stuck in
//! `InvalidImageName`, long after the object that named it was accepted; checking it at
//! admission says so at once, naming what is wrong.

/// The most characters a repository name (domain and path) may have.
const NAME_MAX: usize = 255;
/// The most characters a tag may have.
const TAG_MAX: usize = 128;

/// What a valid reference says beyond its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parsed {
    /// It names a tag (`:1.6`).
    pub tagged: bool,
    /// It names a digest (`@sha256:…`).
    pub pinned: bool,
}

/// Checks `reference`; the error says what is wrong with it.
///
/// # Errors
/// A sentence naming the part of the reference that breaks the grammar.
pub fn parse(reference: &str) -> Result<Parsed, String> {
    if reference.is_empty() {
        return Err("must not be empty".into());
    }
    if let Some(c) = reference
        .chars()
        .find(|c| c.is_whitespace() || c.is_control())
    {
        return Err(format!("must not contain {c:?}"));
    }
    let (rest, digest) = match reference.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (reference, None),
    };
    if let Some(digest) = digest {
        check_digest(digest)?;
    }
    // A `:` after the last `/` starts the tag; one before it belongs to a registry port.
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
        None => (rest, None),
    };
    if let Some(tag) = tag {
        check_tag(tag)?;
    }
    check_name(name)?;
    Ok(Parsed {
        tagged: tag.is_some(),
        pinned: digest.is_some(),
    })
}

fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("has no repository name".into());
    }
    if name.len() > NAME_MAX {
        return Err(format!(
            "has a repository name of {} characters; at most {NAME_MAX} are allowed",
            name.len()
        ));
    }
    // The first component is a registry when it looks like a host: a dot, a port or
    // `localhost` (and, as docker reads it, any capital letter).
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
    Ok(())
}

/// `host[:port]`, the host a DNS name, an IPv4 address or a bracketed IPv6 address.
fn check_domain(domain: &str) -> Result<(), String> {
    let bad = || format!("has a malformed registry {domain:?}");
    let (host, port) = if let Some(bracketed) = domain.strip_prefix('[') {
        let (v6, after) = bracketed.split_once(']').ok_or_else(bad)?;
        if v6.parse::<std::net::Ipv6Addr>().is_err() {
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
        return Err(format!("has a registry port {port:?} that is not a number"));
    }
    Ok(())
}

/// Lower-case letters and digits, separated by one `.`, one or two `_`, or any number of `-`.
fn check_path_component(component: &str) -> Result<(), String> {
    let bad = || {
        format!(
            "has a malformed name component {component:?}: use lower-case letters and digits, \
             separated by `.`, `_`, `__` or dashes"
        )
    };
    if component.is_empty() {
        return Err("has an empty name component (two `/` in a row, or one at an end)".into());
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

/// 1 to 128 word characters, dots and dashes, not starting with a dot or dash.
fn check_tag(tag: &str) -> Result<(), String> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let ok = !tag.is_empty()
        && tag.len() <= TAG_MAX
        && tag.starts_with(word)
        && tag.chars().all(|c| word(c) || c == '.' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "has a malformed tag {tag:?}: 1 to {TAG_MAX} letters, digits, `_`, `.` or `-`, \
             not starting with `.` or `-`"
        ))
    }
}

/// `algorithm:hex`; for sha256, exactly 64 lower-case hex digits.
fn check_digest(digest: &str) -> Result<(), String> {
    let bad = |why: &str| format!("has a malformed digest {digest:?}: {why}");
    let (algorithm, encoded) = digest
        .split_once(':')
        .ok_or_else(|| bad("expected `algorithm:hex`"))?;
    let algorithm_ok = !algorithm.is_empty()
        && algorithm.split(['+', '.', '_', '-']).all(|part| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        });
    if !algorithm_ok {
        return Err(bad("the algorithm is malformed"));
    }
    let hex = |c: char| c.is_ascii_digit() || ('a'..='f').contains(&c);
    if algorithm == "sha256" && (encoded.len() != 64 || !encoded.chars().all(hex)) {
        return Err(bad("sha256 takes 64 lower-case hex digits"));
    }
    if encoded.len() < 32 || !encoded.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(bad("at least 32 hex digits"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn references_the_runtimes_accept() {
        let tagged = Parsed {
            tagged: true,
            pinned: false,
        };
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
            assert_eq!(parse(reference), Ok(tagged), "{reference}");
        }
        assert_eq!(
            parse("memcached"),
            Ok(Parsed {
                tagged: false,
                pinned: false
            })
        );
        assert_eq!(
            parse(&format!("memcached:1.6@{SHA}")),
            Ok(Parsed {
                tagged: true,
                pinned: true
            })
        );
        assert_eq!(
            parse(&format!("registry.example:5000/memcached@{SHA}")),
            Ok(Parsed {
                tagged: false,
                pinned: true
            })
        );
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
        ] {
            let error = parse(reference).expect_err(reference);
            assert!(error.contains(says), "{reference:?}: {error}");
        }
        let long = format!("{}:1", "a".repeat(256));
        assert!(parse(&long).expect_err("long").contains("255"));
        let long_tag = format!("app:{}", "a".repeat(129));
        assert!(parse(&long_tag).expect_err("long tag").contains("128"));
    }
}
