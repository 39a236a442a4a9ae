//! `cargo xtask image [manager|memcached|redis]...`: container images as OCI archives, built
//! without a container daemon or registry.
//!
//! - `manager`: the release `manager` binary and exactly the shared libraries it loads, run as a
//!   numeric non-root user. No shell, no package manager.
//! - `memcached`: the distribution's memcached (install it with `apt-get install memcached`) and
//!   its libraries, for the `Memcached` resources on a local cluster that cannot pull images.
//! - `redis`: the distribution's redis server (`apt-get install redis-server`) and its
//!   libraries, for the `KeyValueStore` resources, likewise.
//!
//! Each archive loads with `ctr images import`, `docker load`, `podman load` or `skopeo copy
//! oci-archive:…`; `--containerd ADDRESS` imports it straight into a containerd's `k8s.io`
//! namespace, where the kubelet looks, and `--push` puts it in the local cluster's registry (or
//! the one `--registry` names). Rebuilding unchanged sources gives the same digest: every
//! timestamp comes from `SOURCE_DATE_EPOCH` or the last commit.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use ociimage::{BuiltImage, Image, ImageConfig, Metadata, Port, Reference, User};
use serde::Deserialize;

/// Where the distribution's package installs memcached; the image keeps it at the same path.
const MEMCACHED_BINARY: &str = "/usr/bin/memcached";
/// The memcached image's repository: a registry domain no one serves, so nothing tries to pull
/// it and it cannot be mistaken for an upstream image.
const MEMCACHED_REPOSITORY: &str = concat!(product::name!(), ".local/memcached");
/// The user name memcached runs as, as in the distribution's package.
const MEMCACHED_USER: &str = "memcache";
/// Where the distribution's package installs the redis server; the image keeps it there.
const REDIS_BINARY: &str = "/usr/bin/redis-server";
/// The redis image's repository, named like memcached's.
const REDIS_REPOSITORY: &str = concat!(product::name!(), ".local/redis");
/// The manager's user, as the generated Deployment's `runAsUser` names it.
const MANAGER_USER: u32 = codegen::MANAGER_USER;
/// `PATH` in both images: the memcached Deployment names its program without a directory.
const PATH: &str = "/usr/local/bin:/usr/bin:/bin";
/// The manager's path in its image, and its entrypoint.
const MANAGER_BINARY: &str = "/manager";

/// Arguments of `cargo xtask image`.
#[derive(Debug, clap::Args)]
pub struct ImageArgs {
    /// Images to build (default: manager).
    #[arg(value_enum, value_name = "IMAGE")]
    images: Vec<Which>,
    /// Directory for the archives (default: `images/` in the cargo target directory).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Also import each image into the containerd at this socket, in the `k8s.io` namespace the
    /// kubelet uses.
    #[arg(long, value_name = "ADDRESS", conflicts_with = "load")]
    containerd: Option<PathBuf>,
    /// Also load each image into the running local cluster's real node
    /// (`cargo xtask cluster up`), where its pods find it without a registry.
    #[arg(long)]
    load: bool,
    /// Name the image this way, e.g. `registry.example/team/operator-manager:v1.2.0` (a tag
    /// without a name keeps the name: `:v1.2.0`). Only when one image is built.
    #[arg(long, value_name = "REF")]
    tag: Option<String>,
    /// Also push each image to a registry, under its name without a registry
    /// (`<registry>/operator-manager:<version>`): the local cluster's (`cargo xtask cluster
    /// up`, whose real node pulls from it) unless `--registry` names another.
    #[arg(long)]
    push: bool,
    /// The registry `--push` pushes to, `HOST:PORT`. Plain HTTP without credentials, as a
    /// registry on this machine or a private network serves; for one with TLS or a login, copy
    /// the archive with `skopeo copy oci-archive:ARCHIVE docker://NAME`.
    #[arg(long, value_name = "HOST:PORT", requires = "push")]
    registry: Option<String>,
}

impl ImageArgs {
    /// Every image, loaded into the local cluster's real node: what the in-cluster tests run.
    pub fn all_loaded() -> Self {
        Self {
            images: vec![Which::Manager, Which::Memcached, Which::Redis],
            out: None,
            containerd: None,
            load: true,
            tag: None,
            push: false,
            registry: None,
        }
    }
}

/// An image this command knows how to build.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Which {
    /// The operator manager.
    Manager,
    /// memcached from the distribution's package.
    Memcached,
    /// The redis server from the distribution's package.
    Redis,
}

pub fn run(args: ImageArgs) -> anyhow::Result<()> {
    let root = crate::workspace_root();
    let metadata = cargo_metadata(&root)?;
    let out = args
        .out
        .unwrap_or_else(|| metadata.target_directory.join("images"));
    let created = ociimage::source_date_epoch(&root)?;
    let revision = ociimage::git_revision(&root);
    let containerd = match (args.containerd, args.load) {
        (Some(address), _) => Some(address),
        (None, true) => Some(local_node_containerd()?),
        (None, false) => None,
    };
    let registry = match (args.push, args.registry) {
        (false, _) => None,
        (true, Some(registry)) => Some(registry),
        (true, None) => Some(local_registry()?),
    };

    let images = selected(&args.images);
    let tag = match (&args.tag, images.as_slice()) {
        (None, _) => None,
        (Some(tag), [_]) => Some(tag.as_str()),
        (Some(tag), _) => bail!(
            "--tag {tag} names one image, and {} are built: build them one at a time",
            images.len()
        ),
    };
    for which in images {
        let mut image = match which {
            Which::Manager => {
                let binary = build_manager(&root, &metadata.target_directory)?;
                let package = metadata.package("manager")?;
                manager_image(&binary, package, created, revision.clone())?
            }
            Which::Memcached => {
                let version = memcached_version(Path::new(MEMCACHED_BINARY))?;
                memcached_image(Path::new(MEMCACHED_BINARY), &version, created)?
            }
            Which::Redis => {
                let version = redis_version(Path::new(REDIS_BINARY))?;
                redis_image(Path::new(REDIS_BINARY), &version, created)?
            }
        };
        if let Some(tag) = tag {
            let asked = renamed(image.reference(), tag)?;
            image.rename(asked);
        }
        let archive = out.join(archive_name(image.reference()));
        let built = image
            .write(&archive)
            .with_context(|| format!("writing the image {}", image.reference()))?;
        report(&built);
        if let Some(address) = &containerd {
            ociimage::import_into_containerd(&built.archive, &built.reference, address)?;
            println!(
                "  imported into the containerd at {} (namespace {})",
                address.display(),
                ociimage::KUBERNETES_NAMESPACE
            );
        }
        if let Some(registry) = &registry {
            let reference = &built.reference;
            let pushed = ociimage::push(
                &built.archive,
                registry,
                reference.repository(),
                reference.tag(),
            )?;
            println!(
                "  pushed:  {} ({} blobs sent, {} already there)",
                pushed.name, pushed.uploaded, pushed.present
            );
        }
    }
    Ok(())
}

/// `reference` named as `--tag` asks: a whole reference, or `:TAG` for a new tag alone.
fn renamed(reference: &Reference, tag: &str) -> anyhow::Result<Reference> {
    let asked = match tag.strip_prefix(':') {
        Some(only_tag) => reference.with_tag(only_tag),
        None => Reference::parse(tag),
    };
    asked.with_context(|| format!("--tag {tag}"))
}

/// The containerd socket of the running local cluster's real node.
fn local_node_containerd() -> anyhow::Result<PathBuf> {
    let state = localcluster::LocalCluster::from_env()?
        .running()
        .context("`--load` loads into the local cluster's real node")?;
    let node = state.node.context(
        "the local cluster runs without a real node; restart it with `cargo xtask cluster down \
         && cargo xtask cluster up`",
    )?;
    Ok(node.containerd_socket)
}

/// The address of the running local cluster's registry, on its real node.
pub fn local_registry() -> anyhow::Result<String> {
    let state = localcluster::LocalCluster::from_env()?
        .running()
        .context("`--push` pushes to the local cluster's registry unless `--registry` names one")?;
    let registry = state.registry().context(
        "the local cluster runs no registry (it has one with its real node); restart it with \
         `cargo xtask cluster down && cargo xtask cluster up`, or name one with `--registry`",
    )?;
    Ok(registry.to_string())
}

/// The images asked for, each once, in the order given; the manager when none is named.
fn selected(images: &[Which]) -> Vec<Which> {
    let mut selected = Vec::new();
    for which in images {
        if !selected.contains(which) {
            selected.push(*which);
        }
    }
    if selected.is_empty() {
        selected.push(Which::Manager);
    }
    selected
}

/// `<name>-<tag>.oci.tar`, from the last component of the image's name.
fn archive_name(reference: &Reference) -> String {
    format!("{}-{}.oci.tar", reference.short_name(), reference.tag())
}

fn report(built: &BuiltImage) {
    let archive = built.archive.display();
    println!("{}", built.reference);
    println!(
        "  archive: {archive} ({:.1} MiB)",
        built.size as f64 / (1024.0 * 1024.0)
    );
    println!("  name:    {}", built.reference.normalized());
    println!("  digest:  {}", built.manifest_digest);
    println!(
        "  load:    ctr -n {} images import {archive}  (or docker load -i, podman load -i, skopeo copy oci-archive:{archive} DEST)",
        ociimage::KUBERNETES_NAMESPACE
    );
}

/// The manager's image name: the one the generated Deployment uses, at the workspace version.
fn manager_reference(version: &str) -> anyhow::Result<Reference> {
    Ok(Reference::parse(&format!(
        "{}:{version}",
        codegen::MANAGER_IMAGE
    ))?)
}

fn manager_image(
    binary: &Path,
    package: &Package,
    created: u64,
    revision: Option<String>,
) -> anyhow::Result<Image> {
    let ports = [codegen::METRICS_PORT, codegen::HEALTH_PORT]
        .into_iter()
        .map(|port| u16::try_from(port).map(Port::Tcp))
        .chain([Ok(Port::Tcp(kube_operator_runtime::webhook::PORT))])
        .collect::<Result<Vec<_>, _>>()
        .context("the manager's ports are out of range")?;
    let config = ImageConfig {
        env: vec![("PATH".into(), PATH.into())],
        exposed_ports: ports,
        ..ImageConfig::new(
            User::new("nonroot", MANAGER_USER),
            vec![MANAGER_BINARY.into()],
            Metadata {
                title: codegen::MANAGER_IMAGE.into(),
                description: package.description.clone().unwrap_or_default(),
                version: package.version.clone(),
                revision,
                source: package.repository.clone(),
                url: package.repository.clone(),
                licenses: package.license.clone(),
                labels: Default::default(),
                created,
            },
        )
    };
    let mut image = Image::new(manager_reference(&package.version)?, config);
    image
        .add_binary(binary, MANAGER_BINARY)
        .with_context(|| format!("adding {} to the manager image", binary.display()))?;
    Ok(image)
}

/// The memcached image's name, tagged with the packaged memcached's version.
fn memcached_reference(version: &str) -> anyhow::Result<Reference> {
    Ok(Reference::parse(&format!(
        "{MEMCACHED_REPOSITORY}:{version}"
    ))?)
}

fn memcached_image(binary: &Path, version: &str, created: u64) -> anyhow::Result<Image> {
    let uid = u32::try_from(controllers::memcached::RUN_AS_USER)
        .context("memcached's user id is out of range")?;
    let port =
        u16::try_from(controllers::memcached::PORT).context("memcached's port is out of range")?;
    let config = ImageConfig {
        env: vec![("PATH".into(), PATH.into())],
        exposed_ports: vec![Port::Tcp(port)],
        ..ImageConfig::new(
            User::new(MEMCACHED_USER, uid),
            // The program name the Deployment's command starts with, found on PATH.
            vec![controllers::memcached::PROGRAM.into()],
            Metadata {
                title: "memcached".into(),
                description: "memcached from the distribution's package, for Memcached \
                              resources on a local cluster"
                    .into(),
                version: version.into(),
                revision: None,
                source: None,
                url: Some("https://memcached.org/".into()),
                licenses: Some("BSD-3-Clause".into()),
                labels: Default::default(),
                created,
            },
        )
    };
    let mut image = Image::new(memcached_reference(version)?, config);
    image
        .add_binary(binary, MEMCACHED_BINARY)
        .with_context(|| format!("adding {} to the memcached image", binary.display()))?;
    Ok(image)
}

/// The version `memcached -V` reports, e.g. `1.6.18`.
fn memcached_version(binary: &Path) -> anyhow::Result<String> {
    if !binary.is_file() {
        bail!(
            "{} not found: the memcached image packages the distribution's memcached; \
             install it with `apt-get install memcached`",
            binary.display()
        );
    }
    let output = Command::new(binary)
        .arg("-V")
        .output()
        .with_context(|| format!("running {} -V", binary.display()))?;
    if !output.status.success() {
        bail!(
            "`{} -V` exited with {}: {}",
            binary.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    parse_memcached_version(&String::from_utf8_lossy(&output.stdout))
}

fn parse_memcached_version(output: &str) -> anyhow::Result<String> {
    match output.split_whitespace().collect::<Vec<_>>().as_slice() {
        ["memcached", version] => Ok((*version).to_owned()),
        _ => bail!("unexpected output from memcached -V: {:?}", output.trim()),
    }
}

/// The redis image: the server, run as the package's `redis` user, as the KeyValueStore
/// controller's StatefulSet expects.
fn redis_image(binary: &Path, version: &str, created: u64) -> anyhow::Result<Image> {
    use controllers::keyvaluestore::{PORT, PROGRAM, RUN_AS_USER};
    let uid = u32::try_from(RUN_AS_USER).context("redis's user id is out of range")?;
    let port = u16::try_from(PORT).context("redis's port is out of range")?;
    let config = ImageConfig {
        env: vec![("PATH".into(), PATH.into())],
        exposed_ports: vec![Port::Tcp(port)],
        ..ImageConfig::new(
            User::new("redis", uid),
            vec![PROGRAM.into()],
            Metadata {
                title: "redis".into(),
                description: "the redis server from the distribution's package, for \
                              KeyValueStore resources on a local cluster"
                    .into(),
                version: version.into(),
                revision: None,
                source: None,
                url: Some("https://redis.io/".into()),
                licenses: Some("BSD-3-Clause".into()),
                labels: Default::default(),
                created,
            },
        )
    };
    let reference = Reference::parse(&format!("{REDIS_REPOSITORY}:{version}"))?;
    let mut image = Image::new(reference, config);
    // The package's `redis-server` is a link to the one binary that is also its checkers; it
    // serves when started under this name.
    image
        .add_binary(binary, REDIS_BINARY)
        .with_context(|| format!("adding {} to the redis image", binary.display()))?;
    Ok(image)
}

/// The version `redis-server --version` reports, e.g. `7.0.15`.
fn redis_version(binary: &Path) -> anyhow::Result<String> {
    if !binary.exists() {
        bail!(
            "{} not found: the redis image packages the distribution's redis server; install \
             it with `apt-get install redis-server`",
            binary.display()
        );
    }
    let output = Command::new(binary)
        .arg("--version")
        .output()
        .with_context(|| format!("running {} --version", binary.display()))?;
    parse_redis_version(&String::from_utf8_lossy(&output.stdout))
}

/// `Redis server v=7.0.15 sha=… malloc=…` gives `7.0.15`.
fn parse_redis_version(output: &str) -> anyhow::Result<String> {
    output
        .split_whitespace()
        .find_map(|word| word.strip_prefix("v="))
        .filter(|version| !version.is_empty())
        .map(str::to_owned)
        .with_context(|| {
            format!(
                "unexpected output from redis-server --version: {:?}",
                output.trim()
            )
        })
}

/// Builds the release manager exactly as the Dockerfile does and returns the binary's path.
fn build_manager(root: &Path, target_dir: &Path) -> anyhow::Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let args = [
        "build",
        "--release",
        "--locked",
        "--package",
        "manager",
        "--bin",
        "manager",
    ];
    let status = Command::new(&cargo)
        .args(args)
        .current_dir(root)
        .status()
        .with_context(|| format!("running {cargo}"))?;
    if !status.success() {
        bail!("`cargo {}` exited with {status}", args.join(" "));
    }
    let binary = target_dir.join("release").join("manager");
    if !binary.is_file() {
        bail!("the release build left no manager at {}", binary.display());
    }
    Ok(binary)
}

#[derive(Debug, Deserialize)]
struct CargoMetadata {
    target_directory: PathBuf,
    packages: Vec<Package>,
}

#[derive(Debug, Deserialize)]
struct Package {
    name: String,
    version: String,
    description: Option<String>,
    license: Option<String>,
    repository: Option<String>,
}

impl CargoMetadata {
    fn package(&self, name: &str) -> anyhow::Result<&Package> {
        self.packages
            .iter()
            .find(|p| p.name == name)
            .with_context(|| format!("no package {name} in the workspace"))
    }
}

/// Where the archives go unless `--out` says otherwise: `images/` in the cargo target directory.
/// Writes `image` into [`images_dir`] and pushes it to `registry` under its name without a
/// registry; returns the archive and where it went.
pub fn write_and_push(
    image: &Image,
    registry: &str,
) -> anyhow::Result<(BuiltImage, ociimage::Pushed)> {
    let reference = image.reference();
    let archive = images_dir()?.join(format!(
        "{}-{}.oci.tar",
        reference.repository().replace('/', "-"),
        reference.tag()
    ));
    let built = image
        .write(&archive)
        .with_context(|| format!("writing the image {reference} to {}", archive.display()))?;
    let pushed = ociimage::push(
        &built.archive,
        registry,
        built.reference.repository(),
        built.reference.tag(),
    )?;
    Ok((built, pushed))
}

pub fn images_dir() -> anyhow::Result<PathBuf> {
    Ok(cargo_metadata(&crate::workspace_root())?
        .target_directory
        .join("images"))
}

/// The workspace's packages and target directory (which honours `CARGO_TARGET_DIR` and cargo's
/// configuration), as cargo itself reports them.
fn cargo_metadata(root: &Path) -> anyhow::Result<CargoMetadata> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(&cargo)
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(root)
        .output()
        .with_context(|| format!("running {cargo} metadata"))?;
    if !output.status.success() {
        bail!(
            "`cargo metadata` exited with {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    serde_json::from_slice(&output.stdout).context("reading `cargo metadata`")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_names_the_image_whole_or_retags_it() {
        let built = Reference::parse("operator-manager:0.1.0").expect("a reference");
        let whole = renamed(&built, "registry.example:5000/team/operator-manager:v1").expect("ok");
        assert_eq!(
            whole.to_string(),
            "registry.example:5000/team/operator-manager:v1"
        );
        let retagged = renamed(&built, ":dev").expect("ok");
        assert_eq!(
            retagged.normalized(),
            "docker.io/library/operator-manager:dev"
        );
        let refused = renamed(&built, "Bad/Name:1")
            .expect_err("refused")
            .to_string();
        assert!(refused.contains("--tag Bad/Name:1"), "{refused}");
        assert!(renamed(&built, ":not a tag").is_err());
    }

    /// The Dockerfile builds the same image by another road: it must expose the ports the
    /// Deployment uses and carry the labels this builder writes from the workspace's metadata.
    #[test]
    fn the_dockerfile_exposes_the_manager_ports_and_labels_it_from_the_workspace() {
        let root = crate::workspace_root();
        let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).expect("Dockerfile");
        let exposed: Vec<u16> = dockerfile
            .lines()
            .filter_map(|line| line.strip_prefix("EXPOSE "))
            .flat_map(|ports| ports.split_whitespace().map(|p| p.parse().expect("a port")))
            .collect();
        let expected: Vec<u16> = [codegen::METRICS_PORT, codegen::HEALTH_PORT]
            .into_iter()
            .map(|p| u16::try_from(p).expect("a port"))
            .chain([kube_operator_runtime::webhook::PORT])
            .collect();
        assert_eq!(exposed, expected, "EXPOSE in the Dockerfile");

        let metadata = cargo_metadata(&root).expect("cargo metadata");
        let package = metadata.package("manager").expect("the manager package");
        let label = |key: &str| {
            let prefix = format!("org.opencontainers.image.{key}=\"");
            dockerfile.lines().find_map(|line| {
                let line = line.trim();
                let value = line
                    .strip_prefix("LABEL ")
                    .unwrap_or(line)
                    .strip_prefix(&prefix)?;
                Some(value.split('"').next().unwrap_or_default().to_owned())
            })
        };
        let repository = package.repository.clone();
        for (key, value) in [
            ("title", Some(codegen::MANAGER_IMAGE.to_owned())),
            ("description", package.description.clone()),
            ("source", repository.clone()),
            ("url", repository),
            ("licenses", package.license.clone()),
        ] {
            assert_eq!(label(key), value, "the Dockerfile's {key} label");
        }
    }

    #[test]
    fn the_manager_is_built_when_nothing_is_named_and_each_image_once() {
        assert_eq!(selected(&[]), [Which::Manager]);
        assert_eq!(
            selected(&[Which::Memcached, Which::Manager, Which::Memcached]),
            [Which::Memcached, Which::Manager]
        );
    }

    #[test]
    fn archives_are_named_after_the_image() {
        let manager = manager_reference("0.1.0").unwrap();
        assert_eq!(
            archive_name(&manager),
            concat!(product::name!(), "-0.1.0.oci.tar")
        );
        let memcached = memcached_reference("1.6.18").unwrap();
        assert_eq!(archive_name(&memcached), "memcached-1.6.18.oci.tar");
        assert_eq!(
            memcached.normalized(),
            concat!(product::name!(), ".local/memcached:1.6.18")
        );
    }

    #[test]
    fn redis_versions_are_read_from_its_banner() {
        let banner = "Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0 bits=64 build=ae4d7c971a948f0\n";
        assert_eq!(parse_redis_version(banner).unwrap(), "7.0.15");
        assert!(parse_redis_version("Usage: redis-server\n").is_err());
        assert!(parse_redis_version("v=").is_err());
    }

    #[test]
    fn memcached_versions_are_read_from_its_banner() {
        assert_eq!(
            parse_memcached_version("memcached 1.6.18\n").unwrap(),
            "1.6.18"
        );
        assert!(parse_memcached_version("Usage: memcached\n").is_err());
        assert!(parse_memcached_version("").is_err());
    }

    #[test]
    fn the_manager_image_is_what_the_generated_deployment_runs() {
        let files = codegen::render().unwrap();
        let deployment = files
            .iter()
            .find(|f| f.path == Path::new("manager/deployment.yaml"))
            .expect("the manager's Deployment is generated");
        let reference = manager_reference(env!("CARGO_PKG_VERSION")).unwrap();
        assert!(
            deployment
                .contents
                .contains(&format!("image: {reference}\n")),
            "{}",
            deployment.contents
        );
        for user in [
            format!("runAsUser: {MANAGER_USER}\n"),
            format!("runAsGroup: {MANAGER_USER}\n"),
        ] {
            assert!(deployment.contents.contains(&user), "{user}");
        }
    }

    #[test]
    fn memcached_runs_as_the_deployment_expects() {
        // The Deployment's command names the program without a directory: it must be on PATH.
        let program = controllers::memcached::PROGRAM;
        let dir = Path::new(MEMCACHED_BINARY).parent().unwrap();
        assert_eq!(Path::new(MEMCACHED_BINARY).file_name().unwrap(), program);
        assert!(PATH.split(':').any(|p| Path::new(p) == dir), "{PATH}");
    }

    #[test]
    fn a_missing_memcached_says_how_to_install_it() {
        let error = memcached_version(Path::new("/nonexistent/memcached")).unwrap_err();
        let message = format!("{error:#}");
        assert!(message.contains("/nonexistent/memcached"), "{message}");
        assert!(message.contains("apt-get install memcached"), "{message}");
    }

    #[test]
    fn the_workspace_describes_the_manager() {
        let metadata = cargo_metadata(&crate::workspace_root()).unwrap();
        let manager = metadata.package("manager").unwrap();
        assert_eq!(manager.version, env!("CARGO_PKG_VERSION"));
        assert!(manager.description.is_some());
        assert!(metadata.package("no-such-package").is_err());
    }
}
