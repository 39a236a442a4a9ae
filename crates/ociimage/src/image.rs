//! An image: its files, how to run it, and writing it out.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::layer::{self, Entry, Tree};
use crate::layout::{
    self, ANNOTATION_CONTAINERD_NAME, ANNOTATION_REF_NAME, ConfigFile, Descriptor, DockerManifest,
    History, Index, MEDIA_TYPE_CONFIG, MEDIA_TYPE_INDEX, MEDIA_TYPE_LAYER, MEDIA_TYPE_MANIFEST,
    Manifest, Parts, PlatformJson, RootFs, RunConfig,
};
use crate::{Error, Reference, rfc3339, shared_libraries};

/// Paths the image writes itself; a file given for one of them is a duplicate.
const PASSWD: &str = "/etc/passwd";
const GROUP: &str = "/etc/group";
const TMP: &str = "/tmp";

/// Operating system and CPU architecture, spelled as OCI image configs spell them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Platform {
    /// `linux`.
    pub os: String,
    /// `amd64`, `arm64`, …
    pub architecture: String,
}

impl Platform {
    /// The machine this runs on: binaries built here run on images for this platform.
    pub fn host() -> Self {
        let architecture = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            "x86" => "386",
            "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
            "loongarch64" => "loong64",
            other => other,
        };
        Self {
            os: std::env::consts::OS.to_owned(),
            architecture: architecture.to_owned(),
        }
    }
}

/// The user the image runs as, written numerically into the config (so the kubelet can check
/// `runAsNonRoot` without reading the image) and by name into `/etc/passwd` and `/etc/group`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    /// Login name, also used as the group's name.
    pub name: String,
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
}

impl User {
    /// A user whose primary group has the same name and id, as most images' users.
    pub fn new(name: impl Into<String>, uid: u32) -> Self {
        Self {
            name: name.into(),
            uid,
            gid: uid,
        }
    }
}

/// A port the image listens on; the config records it as documentation for runtimes and people.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Port {
    /// A TCP port.
    Tcp(u16),
    /// A UDP port.
    Udp(u16),
}

impl fmt::Display for Port {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Port::Tcp(port) => write!(f, "{port}/tcp"),
            Port::Udp(port) => write!(f, "{port}/udp"),
        }
    }
}

/// What the image says about itself: the `org.opencontainers.image.*` labels and manifest
/// annotations, labels of its own, and the time stamped on everything in it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Metadata {
    /// Human-readable title.
    pub title: String,
    /// What the image is for.
    pub description: String,
    /// Version of the packaged software.
    pub version: String,
    /// Source control revision it was built from.
    pub revision: Option<String>,
    /// Where its source code is.
    pub source: Option<String>,
    /// Where to find out more.
    pub url: Option<String>,
    /// SPDX license expression.
    pub licenses: Option<String>,
    /// Creation time, seconds since 1970: the `created` field, every file's modification time
    /// and the annotation. Take it from [`source_date_epoch`](crate::source_date_epoch) so
    /// rebuilding gives the same digest.
    pub created: u64,
    /// Labels of the image's own beyond the `org.opencontainers.image.*` ones, such as an OLM
    /// bundle's `operators.operatorframework.io.*`; they are also the manifest's annotations.
    pub labels: BTreeMap<String, String>,
}

impl Metadata {
    /// The `org.opencontainers.image.*` keys and values that are set.
    fn annotations(&self) -> BTreeMap<String, String> {
        let fields = [
            ("created", Some(rfc3339(self.created))),
            ("title", Some(self.title.clone())),
            ("description", Some(self.description.clone())),
            ("version", Some(self.version.clone())),
            ("revision", self.revision.clone()),
            ("source", self.source.clone()),
            ("url", self.url.clone()),
            ("licenses", self.licenses.clone()),
        ];
        let mut annotations: BTreeMap<String, String> = fields
            .into_iter()
            .filter_map(|(key, value)| {
                let value = value.filter(|v| !v.is_empty())?;
                Some((format!("org.opencontainers.image.{key}"), value))
            })
            .collect();
        annotations.extend(self.labels.clone());
        annotations
    }
}

/// How the image runs, beyond its files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageConfig {
    /// Platform recorded in the config and the index.
    pub platform: Platform,
    /// The user processes run as.
    pub user: User,
    /// The program and its first arguments.
    pub entrypoint: Vec<String>,
    /// Default arguments after the entrypoint.
    pub cmd: Vec<String>,
    /// Environment, in order, as `(name, value)`.
    pub env: Vec<(String, String)>,
    /// Ports the image listens on.
    pub exposed_ports: Vec<Port>,
    /// The working directory.
    pub working_dir: String,
    /// Labels, annotations and the creation time.
    pub metadata: Metadata,
}

impl ImageConfig {
    /// An image for this machine's platform ([`Platform::host`]) that runs `entrypoint` as
    /// `user` in `/`, with no default arguments, environment or ports: set those after, where
    /// the image has them.
    pub fn new(user: User, entrypoint: Vec<String>, metadata: Metadata) -> Self {
        Self {
            platform: Platform::host(),
            user,
            entrypoint,
            cmd: Vec::new(),
            env: Vec::new(),
            exposed_ports: Vec::new(),
            working_dir: "/".to_owned(),
            metadata,
        }
    }
}

/// A file from this machine, placed at an absolute path in the image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageFile {
    source: PathBuf,
    destination: String,
    mode: u32,
    uid: u32,
    gid: u32,
}

impl ImageFile {
    /// A program or library: mode `0755`, owned by root.
    pub fn executable(source: impl Into<PathBuf>, destination: impl Into<String>) -> Self {
        Self {
            source: source.into(),
            destination: destination.into(),
            mode: 0o755,
            uid: 0,
            gid: 0,
        }
    }

    /// A data file: mode `0644`, owned by root.
    pub fn data(source: impl Into<PathBuf>, destination: impl Into<String>) -> Self {
        Self {
            mode: 0o644,
            ..Self::executable(source, destination)
        }
    }

    /// The same file with other permission bits.
    #[must_use]
    pub fn with_mode(self, mode: u32) -> Self {
        Self { mode, ..self }
    }

    /// The same file with another owner.
    #[must_use]
    pub fn with_owner(self, uid: u32, gid: u32) -> Self {
        Self { uid, gid, ..self }
    }
}

/// A single-layer image being assembled.
#[derive(Clone, Debug)]
pub struct Image {
    reference: Reference,
    config: ImageConfig,
    files: BTreeMap<String, ImageFile>,
}

/// What [`Image::write`] produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuiltImage {
    /// The image's name.
    pub reference: Reference,
    /// The archive written.
    pub archive: PathBuf,
    /// Digest of the manifest, `sha256:…`: the image's identity in every registry and runtime.
    pub manifest_digest: String,
    /// Digest of the config, which runtimes show as the image id.
    pub config_digest: String,
    /// Size of the archive in bytes.
    pub size: u64,
}

impl Image {
    /// An image named `reference` with no files yet.
    pub fn new(reference: Reference, config: ImageConfig) -> Self {
        Self {
            reference,
            config,
            files: BTreeMap::new(),
        }
    }

    /// The image's name.
    pub fn reference(&self) -> &Reference {
        &self.reference
    }

    /// Names the image `reference` instead.
    pub fn rename(&mut self, reference: Reference) {
        self.reference = reference;
    }

    /// Adds `file`. Its contents are read when the image is written.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidDestination`] for a destination that is not absolute and normalized,
    /// [`Error::DuplicateDestination`] when the destination is taken, [`Error::NotADirectory`]
    /// when it lies below another file (or another file lies below it), and [`Error::Source`]
    /// when the source is not a readable regular file.
    pub fn add(&mut self, file: ImageFile) -> Result<(), Error> {
        let destination = file.destination.as_str();
        let valid = destination.len() > 1
            && destination.starts_with('/')
            && !destination.contains('\0')
            && destination[1..]
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != "..");
        if !valid {
            return Err(Error::InvalidDestination {
                path: destination.to_owned(),
            });
        }
        if [PASSWD, GROUP, TMP].contains(&destination) || self.files.contains_key(destination) {
            return Err(Error::DuplicateDestination {
                path: destination.to_owned(),
            });
        }
        let taken = self.files.keys().map(String::as_str).chain([PASSWD, GROUP]);
        for other in taken {
            if is_below(destination, other) {
                return Err(Error::NotADirectory {
                    path: destination.to_owned(),
                    file: other.to_owned(),
                });
            }
            if is_below(other, destination) {
                return Err(Error::NotADirectory {
                    path: other.to_owned(),
                    file: destination.to_owned(),
                });
            }
        }
        let metadata = std::fs::metadata(&file.source).map_err(|source| Error::Source {
            path: file.source.clone(),
            source,
        })?;
        if !metadata.is_file() {
            return Err(Error::Source {
                path: file.source.clone(),
                source: std::io::Error::other("not a regular file"),
            });
        }
        self.files.insert(file.destination.clone(), file);
        Ok(())
    }

    /// Adds the program at `source` as `destination`, mode `0755`, with the loader and shared
    /// libraries it needs (see [`shared_libraries`]). A library another binary already brought
    /// in is shared.
    ///
    /// # Errors
    ///
    /// Those of [`Image::add`] and of [`shared_libraries`].
    pub fn add_binary(&mut self, source: &Path, destination: &str) -> Result<(), Error> {
        let libraries = shared_libraries(source)?;
        self.add(ImageFile::executable(source, destination))?;
        for library in libraries {
            let same = self
                .files
                .get(&library.destination)
                .is_some_and(|f| f.source == library.source);
            if !same {
                self.add(ImageFile::executable(library.source, library.destination))?;
            }
        }
        Ok(())
    }

    /// The destinations of the files added so far, sorted.
    pub fn destinations(&self) -> impl Iterator<Item = &str> {
        self.files.keys().map(String::as_str)
    }

    /// Writes the image to `archive` (replacing it), creating its directory if needed.
    ///
    /// The file is written next to its final name and renamed into place, so an interrupted build
    /// never leaves a half archive under that name.
    ///
    /// # Errors
    ///
    /// [`Error::Source`] when an added file cannot be read any more, [`Error::InvalidUserName`]
    /// for a user name unfit for `/etc/passwd`, [`Error::Write`] when the archive cannot be
    /// written.
    pub fn write(&self, archive: &Path) -> Result<BuiltImage, Error> {
        let (bytes, manifest_digest, config_digest) = self.to_archive(archive)?;
        if let Some(dir) = archive.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| Error::Write {
                action: "create directory",
                path: dir.to_owned(),
                source,
            })?;
        }
        let mut partial = archive.as_os_str().to_owned();
        partial.push(".partial");
        let partial = PathBuf::from(partial);
        std::fs::write(&partial, &bytes).map_err(|source| Error::Write {
            action: "write",
            path: partial.clone(),
            source,
        })?;
        std::fs::rename(&partial, archive).map_err(|source| Error::Write {
            action: "rename into place",
            path: archive.to_owned(),
            source,
        })?;
        Ok(BuiltImage {
            reference: self.reference.clone(),
            archive: archive.to_owned(),
            manifest_digest,
            config_digest,
            size: bytes.len() as u64,
        })
    }

    /// The archive's bytes, the manifest digest and the config digest.
    fn to_archive(&self, archive: &Path) -> Result<(Vec<u8>, String, String), Error> {
        let metadata = &self.config.metadata;
        let layer_tar =
            layer::write(&self.layer_tree()?, metadata.created).map_err(|source| Error::Write {
                action: "assemble the layer of",
                path: archive.to_owned(),
                source,
            })?;
        let diff_id = layout::digest(&layer_tar);
        let layer_gz = gzip(&layer_tar).map_err(|source| Error::Write {
            action: "compress the layer of",
            path: archive.to_owned(),
            source,
        })?;
        drop(layer_tar);

        let created = rfc3339(metadata.created);
        let annotations = metadata.annotations();
        let config = self.config_file(created, diff_id, &annotations);
        let config = layout::to_json("config", &config)?;
        let config_descriptor = Descriptor::of(MEDIA_TYPE_CONFIG, &config);
        let layer_descriptor = Descriptor::of(MEDIA_TYPE_LAYER, &layer_gz);

        let docker_manifest = layout::to_json(
            "manifest.json",
            &[DockerManifest {
                config: layout::blob_path(&config_descriptor.digest),
                repo_tags: vec![self.reference.to_string()],
                layers: vec![layout::blob_path(&layer_descriptor.digest)],
            }],
        )?;
        let manifest = layout::to_json(
            "manifest",
            &Manifest {
                schema_version: 2,
                media_type: MEDIA_TYPE_MANIFEST,
                config: config_descriptor,
                layers: vec![layer_descriptor],
                annotations,
            },
        )?;
        let mut manifest_descriptor = Descriptor::of(MEDIA_TYPE_MANIFEST, &manifest);
        manifest_descriptor.platform = Some(PlatformJson {
            architecture: self.config.platform.architecture.clone(),
            os: self.config.platform.os.clone(),
        });
        manifest_descriptor.annotations = BTreeMap::from([
            (
                ANNOTATION_CONTAINERD_NAME.to_owned(),
                self.reference.normalized(),
            ),
            (
                ANNOTATION_REF_NAME.to_owned(),
                self.reference.tag().to_owned(),
            ),
        ]);
        let manifest_digest = manifest_descriptor.digest.clone();
        let index = layout::to_json(
            "index",
            &Index {
                schema_version: 2,
                media_type: MEDIA_TYPE_INDEX,
                manifests: vec![manifest_descriptor],
            },
        )?;
        let config_digest = layout::digest(&config);
        let bytes = layout::archive(
            Parts {
                blobs: vec![config, layer_gz, manifest],
                index,
                docker_manifest,
            },
            metadata.created,
        )
        .map_err(|source| Error::Write {
            action: "assemble",
            path: archive.to_owned(),
            source,
        })?;
        Ok((bytes, manifest_digest, config_digest))
    }

    fn config_file(
        &self,
        created: String,
        diff_id: String,
        annotations: &BTreeMap<String, String>,
    ) -> ConfigFile {
        let c = &self.config;
        ConfigFile {
            created: created.clone(),
            architecture: c.platform.architecture.clone(),
            os: c.platform.os.clone(),
            config: RunConfig {
                user: format!("{}:{}", c.user.uid, c.user.gid),
                exposed_ports: c
                    .exposed_ports
                    .iter()
                    .map(|p| (p.to_string(), BTreeMap::new()))
                    .collect(),
                env: c.env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
                entrypoint: c.entrypoint.clone(),
                cmd: c.cmd.clone(),
                working_dir: c.working_dir.clone(),
                labels: annotations.clone(),
            },
            rootfs: RootFs {
                kind: "layers",
                diff_ids: vec![diff_id],
            },
            history: vec![History {
                created,
                created_by: format!(
                    "{} {}: {} files",
                    env!("CARGO_PKG_NAME"),
                    env!("CARGO_PKG_VERSION"),
                    self.files.len()
                ),
            }],
        }
    }

    /// Every entry of the layer: the files, the directories leading to them, the user's
    /// `/etc/passwd` and `/etc/group`, and a world-writable `/tmp`.
    fn layer_tree(&self) -> Result<Tree, Error> {
        let user = &self.config.user;
        let name_ok = !user.name.is_empty()
            && user.name.len() <= 32
            && user
                .name
                .starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
            && user
                .name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
        if !name_ok {
            return Err(Error::InvalidUserName {
                name: user.name.clone(),
            });
        }
        // Programs that look up their own user (and people running `id` in a debug container)
        // find a name; the shell is one no image of ours has, so nobody logs in.
        let mut passwd = String::from("root:x:0:0:root:/root:/sbin/nologin\n");
        let mut group = String::from("root:x:0:\n");
        if user.uid != 0 {
            passwd.push_str(&format!(
                "{0}:x:{1}:{2}:{0}:/nonexistent:/sbin/nologin\n",
                user.name, user.uid, user.gid
            ));
        }
        if user.gid != 0 {
            group.push_str(&format!("{}:x:{}:\n", user.name, user.gid));
        }

        let mut tree = Tree::new();
        let insert = |tree: &mut Tree, path: &str, entry: Entry| {
            let relative = path.trim_start_matches('/').to_owned();
            layer::add_parents(tree, &relative);
            tree.insert(relative, entry);
        };
        insert(&mut tree, PASSWD, Entry::file(passwd.into_bytes(), 0o644));
        insert(&mut tree, GROUP, Entry::file(group.into_bytes(), 0o644));
        insert(&mut tree, TMP, Entry::directory(0o1777));
        for file in self.files.values() {
            let data = std::fs::read(&file.source).map_err(|source| Error::Source {
                path: file.source.clone(),
                source,
            })?;
            let mut entry = Entry::file(data, file.mode);
            entry.uid = file.uid;
            entry.gid = file.gid;
            insert(&mut tree, &file.destination, entry);
        }
        Ok(tree)
    }
}

/// `path` lies strictly below `dir`.
fn is_below(path: &str, dir: &str) -> bool {
    path.strip_prefix(dir)
        .is_some_and(|rest| rest.starts_with('/'))
}

/// gzip with no file name, no time and the operating system recorded as unknown, so the bytes
/// depend on the input alone.
fn gzip(data: &[u8]) -> std::io::Result<Vec<u8>> {
    use std::io::Write;
    let mut encoder = flate2::GzBuilder::new()
        .mtime(0)
        .operating_system(255)
        .write(Vec::new(), flate2::Compression::default());
    encoder.write_all(data)?;
    encoder.finish()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::io::Read;

    use serde_json::Value;

    use super::*;

    const CREATED: u64 = 1_700_000_000;

    fn config() -> ImageConfig {
        ImageConfig {
            platform: Platform {
                os: "linux".into(),
                architecture: "amd64".into(),
            },
            user: User {
                name: "nonroot".into(),
                uid: 65532,
                gid: 65532,
            },
            entrypoint: vec!["/app".into()],
            cmd: vec!["--serve".into()],
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            exposed_ports: vec![Port::Tcp(8080), Port::Udp(53)],
            working_dir: "/".into(),
            metadata: Metadata {
                title: "app".into(),
                description: "a test image".into(),
                version: "1.2.3".into(),
                revision: Some("abc123".into()),
                source: None,
                url: Some("https://example.com/app".into()),
                licenses: Some("Apache-2.0".into()),
                labels: Default::default(),
                created: CREATED,
            },
        }
    }

    /// Source files in a temp dir: `app` (a fake program) and `data.txt`.
    fn sources() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("app"), b"\x7fELF pretend program").unwrap();
        std::fs::write(dir.path().join("data.txt"), b"hello\n").unwrap();
        dir
    }

    fn image(dir: &Path, reversed: bool) -> Image {
        let mut image = Image::new(Reference::parse("app:1.2.3").unwrap(), config());
        let mut files = vec![
            ImageFile::executable(dir.join("app"), "/app"),
            ImageFile::data(dir.join("data.txt"), "/usr/share/app/data.txt")
                .with_owner(65532, 65532)
                .with_mode(0o600),
        ];
        if reversed {
            files.reverse();
        }
        for file in files {
            image.add(file).unwrap();
        }
        image
    }

    /// Every file of a tar, by path.
    fn untar(bytes: &[u8]) -> BTreeMap<String, (tar::Header, Vec<u8>)> {
        let mut archive = tar::Archive::new(bytes);
        let mut entries = BTreeMap::new();
        let mut order = Vec::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().to_string_lossy().into_owned();
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            order.push(path.clone());
            entries.insert(path, (entry.header().clone(), data));
        }
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(order, sorted, "entries are written in sorted order");
        entries
    }

    fn json(bytes: &[u8]) -> Value {
        serde_json::from_slice(bytes).unwrap()
    }

    fn blob<'a>(
        archive: &'a BTreeMap<String, (tar::Header, Vec<u8>)>,
        descriptor: &Value,
    ) -> &'a [u8] {
        let digest = descriptor["digest"].as_str().unwrap();
        let (_, data) = &archive[&layout::blob_path(digest)];
        assert_eq!(
            layout::digest(data),
            digest,
            "blob content matches its digest"
        );
        assert_eq!(
            descriptor["size"],
            data.len(),
            "descriptor size of {digest}"
        );
        data
    }

    #[test]
    fn the_same_inputs_give_the_same_bytes() {
        let dir = sources();
        let out = tempfile::tempdir().unwrap();
        let first = image(dir.path(), false)
            .write(&out.path().join("a.tar"))
            .unwrap();
        let second = image(dir.path(), true)
            .write(&out.path().join("b.tar"))
            .unwrap();
        assert_eq!(first.manifest_digest, second.manifest_digest);
        assert_eq!(first.config_digest, second.config_digest);
        assert_eq!(
            std::fs::read(&first.archive).unwrap(),
            std::fs::read(&second.archive).unwrap()
        );
        assert!(!out.path().join("a.tar.partial").exists());

        let mut later = config();
        later.metadata.created += 1;
        let mut changed = Image::new(Reference::parse("app:1.2.3").unwrap(), later);
        changed
            .add(ImageFile::executable(dir.path().join("app"), "/app"))
            .unwrap();
        let changed = changed.write(&out.path().join("c.tar")).unwrap();
        assert_ne!(changed.manifest_digest, first.manifest_digest);
    }

    #[test]
    fn documents_parse_and_point_at_matching_blobs() {
        let dir = sources();
        let out = tempfile::tempdir().unwrap();
        let built = image(dir.path(), false)
            .write(&out.path().join("nested/app.tar"))
            .unwrap();
        let bytes = std::fs::read(&built.archive).unwrap();
        assert_eq!(built.size, bytes.len() as u64);
        let archive = untar(&bytes);

        assert_eq!(
            json(&archive["oci-layout"].1),
            serde_json::json!({"imageLayoutVersion": "1.0.0"})
        );
        let index = json(&archive["index.json"].1);
        assert_eq!(index["schemaVersion"], 2);
        assert_eq!(index["mediaType"], MEDIA_TYPE_INDEX);
        let manifests = index["manifests"].as_array().unwrap();
        assert_eq!(manifests.len(), 1);
        let descriptor = &manifests[0];
        assert_eq!(descriptor["mediaType"], MEDIA_TYPE_MANIFEST);
        assert_eq!(descriptor["digest"], built.manifest_digest.as_str());
        assert_eq!(
            descriptor["annotations"][ANNOTATION_CONTAINERD_NAME],
            "docker.io/library/app:1.2.3"
        );
        assert_eq!(descriptor["annotations"][ANNOTATION_REF_NAME], "1.2.3");
        assert_eq!(descriptor["platform"]["architecture"], "amd64");

        let manifest = json(blob(&archive, descriptor));
        assert_eq!(manifest["schemaVersion"], 2);
        assert_eq!(manifest["config"]["mediaType"], MEDIA_TYPE_CONFIG);
        assert_eq!(manifest["config"]["digest"], built.config_digest.as_str());
        assert_eq!(
            manifest["annotations"]["org.opencontainers.image.created"],
            "2023-11-14T22:13:20Z"
        );
        assert_eq!(
            manifest["annotations"]["org.opencontainers.image.revision"],
            "abc123"
        );
        assert!(
            manifest["annotations"]
                .get("org.opencontainers.image.source")
                .is_none(),
            "unset metadata is left out"
        );

        let config = json(blob(&archive, &manifest["config"]));
        assert_eq!(config["architecture"], "amd64");
        assert_eq!(config["os"], "linux");
        assert_eq!(config["created"], "2023-11-14T22:13:20Z");
        let run = &config["config"];
        assert_eq!(run["User"], "65532:65532");
        assert_eq!(run["Entrypoint"], serde_json::json!(["/app"]));
        assert_eq!(run["Cmd"], serde_json::json!(["--serve"]));
        assert_eq!(run["Env"], serde_json::json!(["PATH=/usr/bin:/bin"]));
        assert_eq!(
            run["ExposedPorts"],
            serde_json::json!({"53/udp": {}, "8080/tcp": {}})
        );
        assert_eq!(run["WorkingDir"], "/");
        assert_eq!(run["Labels"], manifest["annotations"]);

        let layers = manifest["layers"].as_array().unwrap();
        assert_eq!(layers.len(), 1);
        assert_eq!(layers[0]["mediaType"], MEDIA_TYPE_LAYER);
        let compressed = blob(&archive, &layers[0]);
        assert_eq!(compressed[3], 0, "no gzip name or comment");
        assert_eq!(compressed[4..8], [0, 0, 0, 0], "no gzip time stamp");
        let mut layer = Vec::new();
        flate2::read::GzDecoder::new(compressed)
            .read_to_end(&mut layer)
            .unwrap();
        assert_eq!(
            config["rootfs"],
            serde_json::json!({"type": "layers", "diff_ids": [layout::digest(&layer)]})
        );

        let docker = json(&archive["manifest.json"].1);
        assert_eq!(
            docker,
            serde_json::json!([{
                "Config": layout::blob_path(&built.config_digest),
                "RepoTags": ["app:1.2.3"],
                "Layers": [layout::blob_path(layers[0]["digest"].as_str().unwrap())],
            }])
        );
    }

    #[test]
    fn the_layer_holds_the_files_their_directories_and_the_user() {
        let dir = sources();
        let out = tempfile::tempdir().unwrap();
        let built = image(dir.path(), false)
            .write(&out.path().join("app.tar"))
            .unwrap();
        let archive = untar(&std::fs::read(&built.archive).unwrap());
        let (_, index) = &archive["index.json"];
        let manifest = json(blob(&archive, &json(index)["manifests"][0]));
        let mut layer = Vec::new();
        flate2::read::GzDecoder::new(blob(&archive, &manifest["layers"][0]))
            .read_to_end(&mut layer)
            .unwrap();
        let layer = untar(&layer);

        let listing: Vec<(&str, u32, u64, u64)> = layer
            .iter()
            .map(|(path, (header, _))| {
                (
                    path.as_str(),
                    header.mode().unwrap(),
                    header.uid().unwrap(),
                    header.gid().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            listing,
            [
                ("app", 0o755, 0, 0),
                ("etc/", 0o755, 0, 0),
                ("etc/group", 0o644, 0, 0),
                ("etc/passwd", 0o644, 0, 0),
                ("tmp/", 0o1777, 0, 0),
                ("usr/", 0o755, 0, 0),
                ("usr/share/", 0o755, 0, 0),
                ("usr/share/app/", 0o755, 0, 0),
                ("usr/share/app/data.txt", 0o600, 65532, 65532),
            ]
        );
        for (path, (header, _)) in &layer {
            assert_eq!(header.mtime().unwrap(), CREATED, "{path}");
            assert_eq!(header.username_bytes(), Some(&b""[..]), "{path}");
        }
        assert_eq!(layer["tmp/"].0.entry_type(), tar::EntryType::Directory);
        assert_eq!(layer["app"].1, b"\x7fELF pretend program");
        let passwd = String::from_utf8(layer["etc/passwd"].1.clone()).unwrap();
        assert!(
            passwd
                .lines()
                .any(|l| l == "nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin"),
            "{passwd}"
        );
        let group = String::from_utf8(layer["etc/group"].1.clone()).unwrap();
        assert!(group.lines().any(|l| l == "nonroot:x:65532:"), "{group}");
    }

    #[test]
    fn bad_files_are_refused_naming_the_path() {
        let dir = sources();
        let mut image = image(dir.path(), false);
        let app = dir.path().join("app");

        let missing = dir.path().join("no-such-file");
        let error = image
            .add(ImageFile::data(&missing, "/missing"))
            .unwrap_err();
        assert!(matches!(error, Error::Source { .. }), "{error}");
        assert!(error.to_string().contains("no-such-file"), "{error}");

        let error = image
            .add(ImageFile::data(dir.path(), "/a-directory"))
            .unwrap_err();
        assert!(matches!(error, Error::Source { .. }), "{error}");

        for bad in [
            "bin/app",
            "",
            "/",
            "/bin/../app",
            "/bin//app",
            "/bin/app/",
            "/./app",
        ] {
            let error = image.add(ImageFile::executable(&app, bad)).expect_err(bad);
            assert!(matches!(error, Error::InvalidDestination { .. }), "{error}");
            assert!(error.to_string().contains(&format!("{bad:?}")), "{error}");
        }

        for taken in ["/app", "/etc/passwd", "/etc/group", "/tmp"] {
            let error = image
                .add(ImageFile::executable(&app, taken))
                .expect_err(taken);
            assert!(
                matches!(error, Error::DuplicateDestination { .. }),
                "{error}"
            );
            assert!(error.to_string().contains(taken), "{error}");
        }

        let error = image
            .add(ImageFile::executable(&app, "/app/inside"))
            .unwrap_err();
        assert!(matches!(error, Error::NotADirectory { .. }), "{error}");
        assert!(error.to_string().contains("/app/inside"), "{error}");
        let error = image
            .add(ImageFile::executable(&app, "/usr/share"))
            .unwrap_err();
        assert!(
            error.to_string().contains("/usr/share/app/data.txt"),
            "{error}"
        );

        // Files may go into /tmp: it is a directory.
        image
            .add(ImageFile::data(dir.path().join("data.txt"), "/tmp/seed"))
            .unwrap();
        assert_eq!(
            image.destinations().collect::<Vec<_>>(),
            ["/app", "/tmp/seed", "/usr/share/app/data.txt"]
        );
    }

    #[test]
    fn an_unfit_user_name_is_refused() {
        let dir = sources();
        let out = tempfile::tempdir().unwrap();
        let mut config = config();
        config.user.name = "bad:name".into();
        let mut image = Image::new(Reference::parse("app:1").unwrap(), config);
        image
            .add(ImageFile::executable(dir.path().join("app"), "/app"))
            .unwrap();
        let error = image.write(&out.path().join("app.tar")).unwrap_err();
        assert!(error.to_string().contains("\"bad:name\""), "{error}");
    }

    #[test]
    fn a_binary_brings_its_libraries() {
        let binary = std::env::current_exe().unwrap();
        let mut image = Image::new(Reference::parse("self:1").unwrap(), config());
        image.add_binary(&binary, "/self").unwrap();
        // A second binary with the same libraries shares them.
        image.add_binary(&binary, "/again").unwrap();
        let destinations: Vec<&str> = image.destinations().collect();
        assert!(destinations.contains(&"/self"), "{destinations:?}");
        let libraries = shared_libraries(&binary).unwrap();
        for library in &libraries {
            assert!(
                destinations.contains(&library.destination.as_str()),
                "{destinations:?}"
            );
        }
        assert_eq!(destinations.len(), libraries.len() + 2);
    }
}
