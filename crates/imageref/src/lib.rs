//! Container image references as the kubelet and the container runtimes read them:
//! `[domain[:port]/]path[:tag][@algorithm:hex]`, the grammar of the distribution project's
//! reference package, and the normalization docker and containerd apply to them
//! (`memcached:1.6` is stored as `docker.io/library/memcached:1.6`).
//!
//! [`ImageReference::parse`] checks a reference as the runtimes will, so a malformed one is
//! caught where it is written (an admission webhook, an image build) rather than as a pod stuck
//! in `InvalidImageName`. Its [`ReferenceError`] names the part that breaks the grammar, in a
//! sentence that follows "it": `not an image reference: it has a malformed tag ""`.

mod error;
mod reference;

pub use error::{DigestProblem, ReferenceError};
pub use reference::ImageReference;

/// The registry domain a reference without one belongs to.
pub const DEFAULT_DOMAIN: &str = "docker.io";
/// The old name of [`DEFAULT_DOMAIN`], which normalization replaces with it.
pub const LEGACY_DEFAULT_DOMAIN: &str = "index.docker.io";
/// The path prefix of single-component names on [`DEFAULT_DOMAIN`] (the "official" images).
pub const OFFICIAL_PREFIX: &str = "library/";
/// The tag a reference with neither tag nor digest stands for.
pub const DEFAULT_TAG: &str = "latest";
/// The most characters a repository name (domain and path) may have.
pub const NAME_MAX: usize = 255;
/// The most characters a tag may have.
pub const TAG_MAX: usize = 128;
