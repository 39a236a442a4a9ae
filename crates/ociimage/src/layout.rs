//! The documents of an OCI image layout and of a Docker archive, and the tar that holds both.
//!
//! Field order is the structs' order and every map is a `BTreeMap`, so the JSON, and with it
//! every digest, is the same for the same image.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::Error;
use crate::layer::{self, Entry, Tree};

pub(crate) const MEDIA_TYPE_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub(crate) const MEDIA_TYPE_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub(crate) const MEDIA_TYPE_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub(crate) const MEDIA_TYPE_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// containerd names an imported image after this index annotation, fully qualified.
pub(crate) const ANNOTATION_CONTAINERD_NAME: &str = "io.containerd.image.name";
/// The OCI layout's own name for a manifest: the tag.
pub(crate) const ANNOTATION_REF_NAME: &str = "org.opencontainers.image.ref.name";

/// `sha256:<hex>` of `data`: how OCI names a blob, and how the bench names a build.
pub fn digest(data: &[u8]) -> String {
    let hash = ring::digest::digest(&ring::digest::SHA256, data);
    let hex: String = hash
        .as_ref()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    format!("sha256:{hex}")
}

/// Where a blob lives inside the archive.
pub(crate) fn blob_path(digest: &str) -> String {
    format!("blobs/{}", digest.replacen(':', "/", 1))
}

/// A content descriptor.
#[derive(Debug, Serialize)]
pub(crate) struct Descriptor {
    #[serde(rename = "mediaType")]
    pub media_type: &'static str,
    pub digest: String,
    pub size: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub platform: Option<PlatformJson>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl Descriptor {
    pub fn of(media_type: &'static str, data: &[u8]) -> Self {
        Self {
            media_type,
            digest: digest(data),
            size: data.len() as u64,
            platform: None,
            annotations: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct PlatformJson {
    pub architecture: String,
    pub os: String,
}

/// The image configuration (OCI image-spec `config.md`).
#[derive(Debug, Serialize)]
pub(crate) struct ConfigFile {
    pub created: String,
    pub architecture: String,
    pub os: String,
    pub config: RunConfig,
    pub rootfs: RootFs,
    pub history: Vec<History>,
}

/// How to run the image; keys in the capitalised form the spec inherited from Docker.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct RunConfig {
    pub user: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub exposed_ports: BTreeMap<String, BTreeMap<String, String>>,
    pub env: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub entrypoint: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cmd: Vec<String>,
    pub working_dir: String,
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Serialize)]
pub(crate) struct RootFs {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub diff_ids: Vec<String>,
}

#[derive(Debug, Serialize)]
pub(crate) struct History {
    pub created: String,
    pub created_by: String,
}

#[derive(Debug, Serialize)]
pub(crate) struct Manifest {
    #[serde(rename = "schemaVersion")]
    pub schema_version: u32,
    #[serde(rename = "mediaType")]
    pub media_type: &'static str,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Serialize)]
pub(crate) struct Index {
    #[serde(rename = "schemaVersion")]
    pub schema_version: u32,
    #[serde(rename = "mediaType")]
    pub media_type: &'static str,
    pub manifests: Vec<Descriptor>,
}

/// One entry of a Docker archive's `manifest.json`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct DockerManifest {
    pub config: String,
    pub repo_tags: Vec<String>,
    pub layers: Vec<String>,
}

/// The file that marks a directory (here, a tar) as an OCI image layout.
const OCI_LAYOUT: &[u8] = br#"{"imageLayoutVersion":"1.0.0"}"#;

pub(crate) fn to_json<T: Serialize>(document: &'static str, value: &T) -> Result<Vec<u8>, Error> {
    serde_json::to_vec(value).map_err(|source| Error::Json { document, source })
}

/// The blobs and documents that make up the archive.
#[derive(Debug)]
pub(crate) struct Parts {
    pub blobs: Vec<Vec<u8>>,
    pub index: Vec<u8>,
    pub docker_manifest: Vec<u8>,
}

/// The archive: an OCI image layout with a Docker `manifest.json` beside it.
pub(crate) fn archive(parts: Parts, mtime: u64) -> std::io::Result<Vec<u8>> {
    let mut tree = Tree::new();
    tree.insert("oci-layout".into(), Entry::file(OCI_LAYOUT.to_vec(), 0o644));
    tree.insert("index.json".into(), Entry::file(parts.index, 0o644));
    tree.insert(
        "manifest.json".into(),
        Entry::file(parts.docker_manifest, 0o644),
    );
    for blob in parts.blobs {
        let path = blob_path(&digest(&blob));
        layer::add_parents(&mut tree, &path);
        tree.insert(path, Entry::file(blob, 0o644));
    }
    layer::write(&tree, mtime)
}
