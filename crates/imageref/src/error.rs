//! What is wrong with a reference that breaks the grammar.

use std::fmt;

use crate::{NAME_MAX, TAG_MAX};

/// A reference that breaks the grammar, and the part that breaks it.
///
/// Each message is a predicate that follows "it", naming the offending part as written:
/// admission webhooks answer `not an image reference: it {error}`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    /// The reference is the empty string.
    #[error("must not be empty")]
    Empty,
    /// The reference holds whitespace or a control character (the first one found).
    #[error("must not contain {0:?}")]
    ForbiddenCharacter(char),
    /// Nothing comes before the tag or the digest.
    #[error("has no repository name")]
    NoName,
    /// The repository name (domain and path) has more than [`NAME_MAX`] characters; the
    /// length it has.
    #[error("has a repository name of {0} characters; at most {max} are allowed", max = NAME_MAX)]
    NameTooLong(usize),
    /// The registry is neither a DNS name or IPv4 address nor a bracketed IPv6 address,
    /// optionally with a port.
    #[error("has a malformed registry {0:?}")]
    Domain(String),
    /// The registry's port is empty or not all digits; the port as written.
    #[error("has a registry port {0:?} that is not a number")]
    Port(String),
    /// The path has an empty component: two `/` in a row, or one at an end.
    #[error("has an empty name component (two `/` in a row, or one at an end)")]
    EmptyComponent,
    /// A path component is not lower-case letters and digits joined by `.`, `_`, `__` or
    /// dashes; the component as written.
    #[error(
        "has a malformed name component {0:?}: use lower-case letters and digits, \
         separated by `.`, `_`, `__` or dashes"
    )]
    Component(String),
    /// The tag is not 1 to [`TAG_MAX`] of `A-Za-z0-9_.-` starting with a word character; the
    /// tag as written.
    #[error(
        "has a malformed tag {0:?}: 1 to {max} letters, digits, `_`, `.` or `-`, \
         not starting with `.` or `-`",
        max = TAG_MAX
    )]
    Tag(String),
    /// The digest is not `algorithm:hex`.
    #[error("has a malformed digest {digest:?}: {problem}")]
    Digest {
        /// The digest as written (after the `@`).
        digest: String,
        /// What is wrong with it.
        problem: DigestProblem,
    },
}

/// What is wrong with a digest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DigestProblem {
    /// There is no `:` between algorithm and hex digits.
    NotAlgorithmHex,
    /// The algorithm is not lower-case letters and digits joined by `+`, `.`, `_` or `-`.
    Algorithm,
    /// A sha256 digest is not exactly 64 lower-case hex digits.
    Sha256,
    /// The encoded part is shorter than 32 characters or not all hex digits.
    Encoded,
}

impl fmt::Display for DigestProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NotAlgorithmHex => "expected `algorithm:hex`",
            Self::Algorithm => "the algorithm is malformed",
            Self::Sha256 => "sha256 takes 64 lower-case hex digits",
            Self::Encoded => "at least 32 hex digits",
        })
    }
}
