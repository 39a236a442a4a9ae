//! Renders the platform's install manifests from the Rust types.
//!
//! CRDs come from `apis`, the ClusterRole from the controllers' own RBAC declarations
//! ([`controllers::all`]), and the manager's Deployment, Service and policies from the constants
//! here, and the webhook configurations from the webhooks the controllers declare
//! ([`kube_operator_runtime::webhooks`]), so what a user installs can never drift from what the code does. `cargo xtask manifests`
//! writes the result under `deploy/`; [`generate`] in [`Mode::Check`] is what CI (and a test in
//! this crate) runs to catch files that were not regenerated. [`generate_chart`] renders the same
//! objects as a Helm chart (`deploy/chart/`), with the project metadata in its `Chart.yaml`.

pub mod bundle;
mod certmanager;
pub mod chart;
pub mod crds;
mod files;
pub mod installer;
mod kustomize;
pub mod leader_fence;
mod manager;
pub mod monitoring;
pub mod project;
pub mod rbac;
mod samples;
mod user_roles;
mod webhooks;
mod yaml;

use std::path::{Path, PathBuf};

pub use files::{Mode, Outcome};
pub use project::Project;
pub use webhooks::{WebhookTarget, limit_to_namespace, webhook_configurations};

/// Namespace the manager is installed into.
pub const NAMESPACE: &str = product::namespace!();
/// Name shared by the manager's ServiceAccount, Deployment, ClusterRole and their bindings.
pub const MANAGER_NAME: &str = product::name!();
/// The Lease the manager replicas compete for.
pub const LEADER_ELECTION_ID: &str = concat!(product::name!(), "-leader");
/// Image reference in the generated Deployment; override it with `kustomize edit set image`.
pub const MANAGER_IMAGE: &str = product::name!();
/// The user (and group) the manager runs as: the `nonroot` user of distroless images, named by
/// number so the kubelet can verify `runAsNonRoot`; the image built by `cargo xtask image` has it.
pub const MANAGER_USER: u32 = 65532;
/// The manager container's memory limit: what it must stay within, whatever reaches it.
pub const MANAGER_MEMORY_LIMIT: &str = "256Mi";
/// Port of `/metrics`, served over HTTPS to authorized scrapers (Kubebuilder's 8443).
pub const METRICS_PORT: i32 = 8443;
/// Name of the metrics port on the container and the Service.
pub const METRICS_PORT_NAME: &str = "https";
/// Where a given webhook certificate is mounted (`--webhook-cert-path`): controller-runtime's
/// default directory, which OLM mounts its certificate into.
pub const WEBHOOK_CERT_DIR: &str = "/tmp/k8s-webhook-server/serving-certs";
/// Port of `/healthz` and `/readyz`.
pub const HEALTH_PORT: i32 = 8081;

/// Errors while rendering or writing manifests.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A manifest could not be serialized to YAML.
    #[error("cannot render {path} as YAML")]
    Render {
        /// The file being rendered.
        path: PathBuf,
        /// What the serializer reported.
        #[source]
        source: yaml_serde::Error,
    },
    /// A controller declared an RBAC rule with a wildcard, which the generated role never grants.
    #[error(
        "controller {controller} declares a wildcard `*` in its RBAC rules; list the exact {field} instead"
    )]
    WildcardRule {
        /// The controller's name.
        controller: String,
        /// `apiGroups`, `resources` or `verbs`.
        field: &'static str,
    },
    /// A controller declared an RBAC rule with an empty list, which grants nothing.
    #[error("controller {controller} declares an RBAC rule with no {field}")]
    EmptyRule {
        /// The controller's name.
        controller: String,
        /// `apiGroups`, `resources` or `verbs`.
        field: &'static str,
    },
    /// A type's CRD versions cannot be merged into one CRD.
    #[error("CRDs: {0}")]
    Crds(String),
    /// The controllers' webhook declarations cannot be rendered (two share a name or a path).
    #[error("admission webhooks: {0}")]
    Webhooks(String),
    /// A rendered object no longer has a field where the Helm chart templates one.
    #[error("Helm chart: {0}")]
    Chart(String),
    /// The project metadata the bundle needs is missing or malformed.
    #[error("project metadata: `{field}` {problem}")]
    Metadata {
        /// The field, as written in `Cargo.toml`.
        field: String,
        /// What is wrong, and where to set it.
        problem: String,
    },
    /// `Cargo.toml` is no valid TOML, or a metadata key has the wrong type or is unknown.
    #[error("cannot read the project metadata in {path}")]
    Toml {
        /// The file.
        path: PathBuf,
        /// What the parser reported.
        #[source]
        source: Box<toml::de::Error>,
    },
    /// The output directory or a file in it could not be read or written.
    #[error("cannot {action} {path}")]
    Io {
        /// What was being done: "create directory", "write", "read", "remove".
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
}

/// One rendered file, with its path relative to the `deploy/` directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GeneratedFile {
    /// Path under `deploy/`, with `/` separators.
    pub path: PathBuf,
    /// The file's full text, header included.
    pub contents: String,
}

/// Renders every manifest, in a stable order.
///
/// # Errors
/// [`Error::WildcardRule`] or [`Error::EmptyRule`] for a bad controller RBAC declaration, or
/// [`Error::Render`] if serialization fails.
pub fn render() -> Result<Vec<GeneratedFile>, Error> {
    let controllers = controllers::all();
    let mut files = Vec::new();
    files.extend(crds::render()?);
    files.extend(rbac::render(&controllers)?);
    files.extend(user_roles::render(
        &apis::crds().map_err(|e| Error::Crds(e.to_string()))?,
    )?);
    files.extend(manager::render()?);
    files.extend(webhooks::render()?);
    files.extend(certmanager::render()?);
    files.extend(samples::render()?);
    files.extend(monitoring::render()?);
    files.extend(kustomize::render(&files)?);
    Ok(files)
}

/// Renders every manifest and writes it under `deploy_dir` ([`Mode::Write`]), or compares it with
/// what is there ([`Mode::Check`]).
///
/// # Errors
/// Rendering errors from [`render`], or [`Error::Io`] when the directory cannot be read or written.
pub fn generate(deploy_dir: &Path, mode: Mode) -> Result<Outcome, Error> {
    let files = render()?;
    files::sync(deploy_dir, &files, &[yaml::HEADER], mode)
}

/// Renders the single-file installer ([`installer`]) and writes it under `dist_dir`
/// ([`Mode::Write`]), or compares it with what is there ([`Mode::Check`]).
///
/// # Errors
/// Rendering errors from [`render`], or [`Error::Io`] when the directory cannot be read or written.
pub fn generate_installer(dist_dir: &Path, mode: Mode) -> Result<Outcome, Error> {
    let installer = installer::render(&render()?)?;
    files::sync(dist_dir, &[installer], &[yaml::HEADER], mode)
}

/// Renders the OLM bundle of `project` (whose files are relative to `root`) and writes it under
/// `bundle_dir` ([`Mode::Write`]), or compares it with what is there ([`Mode::Check`]).
///
/// # Errors
/// Rendering errors from [`bundle::render`], or [`Error::Io`] when the directory cannot be read
/// or written.
pub fn generate_bundle(
    project: &Project,
    root: &Path,
    bundle_dir: &Path,
    mode: Mode,
) -> Result<Outcome, Error> {
    let files = bundle::render(project, root)?;
    files::sync(bundle_dir, &files, &[bundle::HEADER], mode)
}

/// Renders the Helm chart of `project` (whose files are relative to `root`) and writes it under
/// `chart_dir` ([`Mode::Write`]), or compares it with what is there ([`Mode::Check`]).
///
/// # Errors
/// Rendering errors from [`chart::render`], or [`Error::Io`] when the directory cannot be read
/// or written.
pub fn generate_chart(
    project: &Project,
    root: &Path,
    chart_dir: &Path,
    mode: Mode,
) -> Result<Outcome, Error> {
    let files = chart::render(project, root)?;
    files::sync(
        chart_dir,
        &files,
        &[yaml::HEADER, chart::TEMPLATE_HEADER],
        mode,
    )
}

/// This package's directory in the clone its tests run from: cargo tells a test binary at run
/// time, and a binary reused from a shared target directory may have been built in another.
#[cfg(test)]
pub(crate) fn package_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed `deploy/` matches what the code renders, so CI fails on drift.
    #[test]
    fn deploy_directory_is_up_to_date() {
        let deploy = crate::package_dir().join("../../deploy");
        let outcome = generate(&deploy, Mode::Check).expect("manifests render");
        assert!(
            outcome.stale.is_empty(),
            "not up to date: run `cargo xtask manifests` and commit. Stale files: {:?}",
            outcome.stale
        );
    }

    /// The committed `dist/install.yaml` matches what the code renders.
    #[test]
    fn installer_is_up_to_date() {
        let dist = crate::package_dir().join("../../dist");
        let outcome = generate_installer(&dist, Mode::Check).expect("installer renders");
        assert!(
            outcome.stale.is_empty(),
            "not up to date: run `cargo xtask manifests` and commit. Stale files: {:?}",
            outcome.stale
        );
    }

    /// The committed `bundle/` matches what the code and the project metadata render.
    #[test]
    fn bundle_directory_is_up_to_date() {
        let (project, root) = project::workspace_project();
        let outcome = generate_bundle(&project, &root, &root.join("bundle"), Mode::Check)
            .expect("bundle renders");
        assert!(
            outcome.stale.is_empty(),
            "not up to date: run `cargo xtask bundle` and commit. Stale files: {:?}",
            outcome.stale
        );
    }

    /// The committed Helm chart matches what the code and the project metadata render.
    #[test]
    fn chart_directory_is_up_to_date() {
        let (project, root) = project::workspace_project();
        let outcome = generate_chart(&project, &root, &root.join("deploy/chart"), Mode::Check)
            .expect("chart renders");
        assert!(
            outcome.stale.is_empty(),
            "not up to date: run `cargo xtask manifests` and commit. Stale files: {:?}",
            outcome.stale
        );
    }

    #[test]
    fn rendering_is_deterministic() {
        assert_eq!(render().expect("renders"), render().expect("renders"));
    }

    #[test]
    fn every_file_starts_with_the_generated_header() {
        for file in render().expect("renders") {
            assert!(
                file.contents.starts_with(yaml::HEADER),
                "{} lacks the header",
                file.path.display()
            );
        }
    }
}
