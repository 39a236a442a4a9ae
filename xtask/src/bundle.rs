//! `cargo xtask bundle [--check] [--validate] [--push]`: the OLM bundle under `bundle/`,
//! rendered from the Rust sources and the project metadata in the workspace's `Cargo.toml`, and
//! its image, built without a container daemon and pushed to a registry.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use codegen::{Mode, Project};
use ociimage::{Image, ImageConfig, ImageFile, Metadata, Reference, User};

/// The Kubernetes version the bundle is validated against for removed APIs: the one the local
/// cluster runs and k8s-openapi is compiled for.
const K8S_VERSION: &str = "1.37";

#[derive(Debug, clap::Args)]
pub struct BundleArgs {
    /// Change nothing; exit non-zero and list the stale files if `bundle/` is out of date.
    #[arg(long)]
    pub check: bool,
    /// Then run operator-framework's bundle validators (the default ones, OperatorHub's and
    /// the good practices) on it; builds them from the Go module proxy once.
    #[arg(long)]
    pub validate: bool,
    /// Directory to write into (default: `bundle/` at the workspace root).
    #[arg(long, value_name = "DIR")]
    pub bundle_dir: Option<PathBuf>,
    /// Then build the bundle image (what `bundle.Dockerfile` builds, without a container daemon)
    /// for the manager image `cargo xtask image --push` pushed, and push it beside it as
    /// `<registry>/<package>-bundle:v<version>`: Operator SDK's `make bundle IMG=...
    /// bundle-build bundle-push`.
    #[arg(long)]
    pub push: bool,
    /// The registry `--push` pushes to, `HOST:PORT` (plain HTTP); the local cluster's by default.
    #[arg(long, value_name = "HOST:PORT", requires = "push")]
    pub registry: Option<String>,
    /// Push the bundle of this release instead of the workspace's (`make bundle VERSION=...`),
    /// for the manager image of the same tag: `cargo xtask image manager --push --tag
    /// :VERSION`. `bundle/` keeps the workspace's release.
    #[arg(long, value_name = "VERSION", requires = "push")]
    pub version: Option<String>,
    /// The release the pushed one replaces (the ClusterServiceVersion's `spec.replaces`), for
    /// catalogs whose channels follow it.
    #[arg(long, value_name = "VERSION", requires = "push")]
    pub replaces: Option<String>,
}

pub fn run(args: BundleArgs) -> anyhow::Result<()> {
    let root = crate::workspace_root();
    let project = project(&root)?;
    let bundle_dir = args.bundle_dir.unwrap_or_else(|| root.join("bundle"));
    let mode = if args.check { Mode::Check } else { Mode::Write };
    let outcome = codegen::generate_bundle(&project, &root, &bundle_dir, mode)
        .with_context(|| format!("generating the bundle into {}", bundle_dir.display()))?;
    let shown = bundle_dir.strip_prefix(&root).unwrap_or(&bundle_dir);
    if args.check && !outcome.stale.is_empty() {
        let list: Vec<String> = outcome
            .stale
            .iter()
            .map(|p| format!("  {}", shown.join(p).display()))
            .collect();
        bail!(
            "{} bundle file(s) not up to date: run `cargo xtask bundle` and commit.\n{}",
            outcome.stale.len(),
            list.join("\n")
        );
    }
    if args.check || outcome.stale.is_empty() {
        println!(
            "{} is up to date ({} files, {})",
            shown.display(),
            outcome.rendered.len(),
            project.csv_name()
        );
    } else {
        for path in &outcome.stale {
            println!("updated {}", shown.join(path).display());
        }
    }
    if args.validate {
        validate(&bundle_dir)?;
    }
    if args.push {
        let version = args.version.as_deref().unwrap_or(&project.version);
        let pushed = project
            .at_release(version, args.replaces.as_deref())
            .context("the release to push (--version, --replaces)")?;
        // How to push the manager there, should it be missing.
        let mut push_manager = "cargo xtask image manager --push".to_owned();
        if let Some(version) = &args.version {
            push_manager.push_str(&format!(" --tag :{version}"));
        }
        let registry = match args.registry {
            Some(registry) => {
                push_manager.push_str(&format!(" --registry {registry}"));
                registry
            }
            None => crate::image::local_registry()?,
        };
        push(&pushed, &root, &registry, &push_manager)?;
    }
    Ok(())
}

/// Builds the bundle image for the manager image in `registry` and pushes it there.
fn push(project: &Project, root: &Path, registry: &str, push_manager: &str) -> anyhow::Result<()> {
    let manager = Reference::parse(&codegen::bundle::manager_image(project))?;
    let (repository, tag) = (manager.repository(), manager.tag());
    let manager_name = format!("{registry}/{repository}:{tag}");
    if ociimage::manifest_digest(registry, repository, tag)?.is_none() {
        bail!(
            "the registry at {registry} holds no {repository}:{tag}, which the bundle installs: \
             push it first with `{push_manager}`"
        );
    }
    let files = codegen::bundle::render_for(project, root, &manager_name)?;
    let staging = tempfile::tempdir().context("creating a directory for the bundle's files")?;
    let reference = Reference::parse(&codegen::bundle::image(project))?;
    let mut image = Image::new(reference, bundle_image_config(project, root)?);
    for file in files.iter().filter(|f| {
        codegen::bundle::IMAGE_DIRS
            .iter()
            .any(|dir| f.path.starts_with(dir))
    }) {
        let source = staging.path().join(&file.path);
        if let Some(dir) = source.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(&source, &file.contents)
            .with_context(|| format!("writing {}", source.display()))?;
        image.add(ImageFile::data(source, format!("/{}", file.path.display())))?;
    }
    let (built, pushed) = crate::image::write_and_push(&image, registry)?;
    println!("bundle image {} ({})", pushed.name, pushed.manifest_digest);
    println!("  installs the manager image {manager_name}");
    println!("  archive: {}", built.archive.display());
    Ok(())
}

/// The bundle image's configuration: no program (OLM only copies its files out), a user that is
/// not root, and the bundle's annotations as labels, as `bundle.Dockerfile` sets them.
fn bundle_image_config(project: &Project, root: &Path) -> anyhow::Result<ImageConfig> {
    Ok(ImageConfig::new(
        User::new("nonroot", 65532),
        Vec::new(),
        Metadata {
            title: format!("{}-bundle", project.package),
            description: format!("The OLM bundle of {}", project.display_name),
            version: project.version.clone(),
            revision: ociimage::git_revision(root),
            source: None,
            url: None,
            licenses: None,
            created: ociimage::source_date_epoch(root)?,
            labels: codegen::bundle::labels(project)
                .into_iter()
                .map(|(key, value)| (key.to_owned(), value))
                .collect(),
        },
    ))
}

/// The project metadata, read from the workspace's `Cargo.toml`.
pub(crate) fn project(root: &Path) -> anyhow::Result<Project> {
    let path = root.join("Cargo.toml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(Project::from_cargo_toml(&path, &text)?)
}

/// Runs the validators on `bundle_dir`; any error or warning fails, listed.
fn validate(bundle_dir: &Path) -> anyhow::Result<()> {
    let findings = crate::bundle_validator::validate(bundle_dir, K8S_VERSION, |line| {
        println!("{line}");
    })?;
    for warning in &findings.warnings {
        println!("warning: {warning}");
    }
    for error in &findings.errors {
        println!("error: {error}");
    }
    if !findings.errors.is_empty() || !findings.warnings.is_empty() {
        bail!(
            "the bundle validators found {} error(s) and {} warning(s)",
            findings.errors.len(),
            findings.warnings.len()
        );
    }
    println!(
        "the bundle passes operator-framework's validators (default, OperatorHub, good practices)"
    );
    Ok(())
}
