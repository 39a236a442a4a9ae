//! operator-registry's `opm`, built from OLM's Go module (`xtask/olm/go.mod`): the program that
//! renders, checks and serves file-based catalogs, and its images. OLM's catalog pods and
//! `operator-sdk run bundle` run `opm:latest`; a catalog image is the same with the catalog's
//! files in it.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use ociimage::{Image, ImageConfig, ImageFile, Metadata, Reference, User};
use serde_json::Value;

use crate::gomodule::{self, GoModule};

/// `opm` itself.
pub const OPM: GoModule = GoModule {
    what: "operator-registry's opm",
    binary: "opm",
    main_package: "github.com/operator-framework/operator-registry/cmd/opm",
    cold_build: "about 20 seconds once olm-operator is built",
    ..crate::olm::MODULE
};
/// What OLM's catalog pods are probed with (`grpc_health_probe -addr=:50051`), in every opm
/// image as in operator-registry's published one.
pub const GRPC_HEALTH_PROBE: GoModule = GoModule {
    what: "grpc_health_probe",
    binary: "grpc_health_probe",
    main_package: "github.com/grpc-ecosystem/grpc-health-probe",
    cold_build: "a few seconds once olm-operator is built",
    ..crate::olm::MODULE
};
/// operator-registry's Go module.
pub const REGISTRY_MODULE: &str = "github.com/operator-framework/operator-registry";
/// The image OLM's catalog operator and `operator-sdk run bundle` ask for by default.
pub const LATEST_IMAGE: &str = "quay.io/operator-framework/opm:latest";
/// The programs' paths in the images, as in the published ones.
pub const OPM_BINARY: &str = "/bin/opm";
const PROBE_BINARY: &str = "/bin/grpc_health_probe";
/// The label that makes an image a file-based catalog, naming where its content is.
const CATALOG_LABEL: &str = "operators.operatorframework.io.index.configs.v1";
const CATALOG_DIR: &str = "/configs";
/// A numeric non-root user, so the kubelet can check `runAsNonRoot`.
const USER: u32 = 65532;

/// The built programs of opm's images.
pub struct Opm {
    pub opm: PathBuf,
    probe: PathBuf,
}

impl Opm {
    /// Builds `opm` and `grpc_health_probe` unless they are cached.
    pub fn build(progress: &dyn Fn(&str)) -> anyhow::Result<Self> {
        Ok(Self {
            opm: OPM.build(progress)?,
            probe: GRPC_HEALTH_PROBE.build(progress)?,
        })
    }

    /// The pinned operator-registry release, `v1.73.0`.
    pub fn version() -> anyhow::Result<&'static str> {
        crate::olm::MODULE.required_version(REGISTRY_MODULE)
    }

    /// opm's image, as [`LATEST_IMAGE`]: `opm` and `grpc_health_probe` on the `PATH`, busybox's
    /// shell (`operator-sdk run bundle`'s catalog pod starts `opm serve` with it), and an empty
    /// file-based catalog, to which `operator-sdk run bundle --index-image` adds the bundle.
    pub fn image(&self) -> anyhow::Result<Image> {
        let version = Self::version()?;
        let config = self.config(
            "opm",
            "operator-registry's opm, built from its Go module, with an empty file-based catalog",
            version,
            Vec::new(),
        );
        let mut image = Image::new(Reference::parse(LATEST_IMAGE)?, config);
        self.add_programs(&mut image)?;
        let ignore = self.opm.with_file_name("catalog.indexignore");
        std::fs::write(
            &ignore,
            "# No catalog content: operator-sdk adds the bundle.\n",
        )
        .with_context(|| format!("writing {}", ignore.display()))?;
        image
            .add(ImageFile::data(
                &ignore,
                format!("{CATALOG_DIR}/.indexignore"),
            ))
            .context("adding the empty catalog to the opm image")?;
        Ok(image)
    }

    /// A catalog image named `reference`: the file-based catalog in `catalog` (a directory),
    /// served by `opm serve` when a CatalogSource names the image. Operator SDK's
    /// `catalog.Dockerfile` also builds `opm serve`'s cache into the image (`--cache-dir`, which
    /// then must hold a valid cache at start); this one leaves `opm serve` to build it at start,
    /// in a moment for a catalog of one package.
    pub fn catalog_image(&self, reference: Reference, catalog: &Path) -> anyhow::Result<Image> {
        let config = self.config(
            reference.repository(),
            "a file-based catalog of OLM bundles, served by operator-registry's opm",
            reference.tag(),
            vec!["serve".into(), CATALOG_DIR.into()],
        );
        let mut image = Image::new(reference, config);
        self.add_programs(&mut image)?;
        for file in files_below(catalog)? {
            let relative = file
                .strip_prefix(catalog)
                .context("a catalog file outside its directory")?;
            image
                .add(ImageFile::data(
                    &file,
                    format!("{CATALOG_DIR}/{}", relative.display()),
                ))
                .with_context(|| format!("adding {} to the catalog image", file.display()))?;
        }
        Ok(image)
    }

    fn config(
        &self,
        title: &str,
        description: &str,
        version: &str,
        cmd: Vec<String>,
    ) -> ImageConfig {
        ImageConfig {
            cmd,
            env: vec![("PATH".into(), "/bin".into())],
            exposed_ports: vec![ociimage::Port::Tcp(50051)],
            ..ImageConfig::new(
                User::new("nonroot", USER),
                vec![OPM_BINARY.into()],
                Metadata {
                    labels: [(CATALOG_LABEL.to_owned(), CATALOG_DIR.to_owned())].into(),
                    ..gomodule::release_metadata(
                        title,
                        description,
                        REGISTRY_MODULE,
                        version,
                        "https://olm.operatorframework.io/",
                    )
                },
            )
        }
    }

    fn add_programs(&self, image: &mut Image) -> anyhow::Result<()> {
        for (binary, path) in [
            (self.opm.as_path(), OPM_BINARY),
            (self.probe.as_path(), PROBE_BINARY),
            (Path::new(crate::busybox::BINARY), "/bin/sh"),
        ] {
            image
                .add_binary(binary, path)
                .with_context(|| format!("adding {} to {}", binary.display(), image.reference()))?;
        }
        Ok(())
    }

    /// `opm render --use-http REFERENCE`: the file-based catalog objects of a bundle image,
    /// read from a plain-HTTP registry.
    pub fn render(&self, reference: &str) -> anyhow::Result<Vec<Value>> {
        let output = Command::new(&self.opm)
            .args(["render", "--use-http", "--output", "json", reference])
            .output()
            .with_context(|| format!("running {} render", self.opm.display()))?;
        if !output.status.success() {
            bail!(
                "`opm render {reference}` failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        serde_json::Deserializer::from_slice(&output.stdout)
            .into_iter::<Value>()
            .collect::<Result<_, _>>()
            .with_context(|| format!("reading what `opm render {reference}` printed"))
    }

    /// `opm validate DIR`: fails, saying why, unless `dir` is a valid file-based catalog.
    pub fn validate(&self, dir: &Path) -> anyhow::Result<()> {
        let output = Command::new(&self.opm)
            .arg("validate")
            .arg(dir)
            .output()
            .with_context(|| format!("running {} validate", self.opm.display()))?;
        if !output.status.success() {
            bail!(
                "`opm validate` refused the catalog in {}: {}",
                dir.display(),
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(())
    }
}

/// Every file below `dir`, sorted, so the image's layer does not depend on the directory's
/// order.
fn files_below(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(current) = pending.pop() {
        let entries = std::fs::read_dir(&current)
            .with_context(|| format!("reading {}", current.display()))?;
        for entry in entries {
            let path = entry
                .with_context(|| format!("reading {}", current.display()))?
                .path();
            if path.is_dir() {
                pending.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}
