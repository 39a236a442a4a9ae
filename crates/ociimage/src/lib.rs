//! Reproducible single-layer container images, written as one OCI archive without a container
//! daemon or a registry.
//!
//! An [`Image`] is a list of files placed at absolute paths, an [`ImageConfig`] (user,
//! entrypoint, environment, ports, labels) and a [`Reference`] naming it. [`Image::write`] writes
//! one uncompressed tar that is both an OCI image layout (`oci-layout`, `index.json`,
//! `blobs/sha256/…`) and a Docker archive (`manifest.json` pointing at the same blobs), so the same
//! file loads with `ctr images import`, `docker load`, `podman load` and `skopeo copy
//! oci-archive:…`.
//!
//! The same inputs always give the same bytes and so the same digest: entries are sorted, owners
//! and modes are fixed, every timestamp is [`Metadata::created`] (see [`source_date_epoch`]), gzip
//! carries no name or time, and JSON keys come in a fixed order.
//!
//! [`shared_libraries`] finds what a dynamically linked binary needs at run time, so an image can
//! hold exactly that and nothing else; [`import_into_containerd`] hands an archive to a containerd
//! in the namespace the kubelet reads, and [`push`] puts it in a registry that speaks plain HTTP.

mod containerd;
mod image;
mod layer;
mod layout;
mod libraries;
mod push;
mod reference;
mod source;

use std::path::PathBuf;

pub use containerd::{KUBERNETES_NAMESPACE, import_into_containerd};
pub use image::{BuiltImage, Image, ImageConfig, ImageFile, Metadata, Platform, Port, User};
pub use layout::digest as sha256_digest;
pub use libraries::{SharedLibrary, shared_libraries};
pub use push::{Pushed, manifest_digest, push};
pub use reference::Reference;
pub use source::{git_revision, rfc3339, source_date_epoch};

/// Errors while assembling, writing or importing an image.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file meant for the image does not exist or cannot be read.
    #[error("cannot read {path} for the image")]
    Source {
        /// The file on this machine.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A destination inside the image is not an absolute, normalized path.
    #[error(
        "destination {path:?} in the image must be an absolute path without `.`, `..` or empty components"
    )]
    InvalidDestination {
        /// The destination as given.
        path: String,
    },
    /// Two files were given the same destination, or a file was put where the image keeps one of
    /// its own (`/etc/passwd`, `/etc/group`, `/tmp`).
    #[error("destination {path} in the image is given twice")]
    DuplicateDestination {
        /// The destination both files claim.
        path: String,
    },
    /// A file's destination lies below another file, which would have to be a directory.
    #[error("destination {path} in the image lies below the file {file}")]
    NotADirectory {
        /// The destination that cannot be created.
        path: String,
        /// The file in the way.
        file: String,
    },
    /// An image reference (`name:tag`) is malformed.
    #[error("invalid image reference {reference:?}: {reason}")]
    InvalidReference {
        /// The reference as given.
        reference: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A user or group name for `/etc/passwd` is not a plain name.
    #[error("invalid user or group name {name:?}: use letters, digits, `_` and `-`")]
    InvalidUserName {
        /// The name as given.
        name: String,
    },
    /// A binary is not an ELF file this crate can read.
    #[error("{path} is not a readable ELF binary: {reason}")]
    Elf {
        /// The binary.
        path: PathBuf,
        /// What could not be read.
        reason: &'static str,
    },
    /// `ldd` could not be run on a binary, or failed.
    #[error("cannot list the shared libraries of {binary}: {message}")]
    Ldd {
        /// The binary.
        binary: PathBuf,
        /// What went wrong: the spawn error or what `ldd` printed.
        message: String,
    },
    /// A binary needs libraries this machine does not have.
    #[error("{binary} needs libraries that are not installed: {}", libraries.join(", "))]
    MissingLibraries {
        /// The binary.
        binary: PathBuf,
        /// The sonames `ldd` reported as not found.
        libraries: Vec<String>,
    },
    /// The archive could not be written.
    #[error("cannot {action} {path}")]
    Write {
        /// What was being done: "create directory", "write", "rename".
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A JSON document of the image could not be serialized.
    #[error("cannot serialize the image's {document}")]
    Json {
        /// Which document: "config", "manifest", "index", "manifest.json".
        document: &'static str,
        /// The serializer's error.
        #[source]
        source: serde_json::Error,
    },
    /// `SOURCE_DATE_EPOCH` is set but is not a number of seconds.
    #[error("SOURCE_DATE_EPOCH={value:?} is not a number of seconds since 1970")]
    SourceDateEpoch {
        /// The variable's value.
        value: String,
    },
    /// `ctr`, containerd's client, is not installed.
    #[error("cannot run `ctr`, containerd's command-line client: is containerd installed?")]
    CtrMissing {
        /// The spawn error.
        #[source]
        source: std::io::Error,
    },
    /// No containerd answers at the given socket.
    #[error("no containerd answers at {address}: {message}")]
    ContainerdUnreachable {
        /// The socket.
        address: PathBuf,
        /// What `ctr` reported, or why it was not asked.
        message: String,
    },
    /// containerd refused the archive.
    #[error("containerd at {address} did not import {archive}: {message}")]
    ImportFailed {
        /// The archive.
        archive: PathBuf,
        /// The socket.
        address: PathBuf,
        /// What `ctr` reported.
        message: String,
    },
    /// The import finished but containerd does not list the image under the expected name.
    #[error("containerd at {address} imported {archive} but does not list {name}")]
    NotImported {
        /// The archive.
        archive: PathBuf,
        /// The socket.
        address: PathBuf,
        /// The fully qualified name that is missing.
        name: String,
    },
    /// An archive to push is not an image layout this crate wrote.
    #[error("{archive} is not an OCI image archive with one manifest: {reason}")]
    BadArchive {
        /// The archive.
        archive: PathBuf,
        /// What is missing or malformed.
        reason: String,
    },
    /// A registry refused a step of a push, or could not be reached.
    #[error("pushing to the registry at {registry}, {step}: {message}")]
    Push {
        /// The registry, `host:port`.
        registry: String,
        /// The step: the request or what it was for.
        step: String,
        /// The registry's answer, or the connection's error.
        message: String,
    },
}
