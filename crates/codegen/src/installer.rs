//! `dist/install.yaml`: everything `kubectl apply -k deploy/` installs, in one file, as
//! Kubebuilder's `make build-installer` writes it, for `kubectl apply -f` from a release page
//! without kustomize or a checkout.
//!
//! It holds the very objects of the installed directories ([`crate::kustomize::INSTALLED`]),
//! the Namespace and the CRDs first so that everything after them has somewhere to go.

use std::path::PathBuf;

use crate::{Error, GeneratedFile, kustomize::INSTALLED, yaml};

/// The installer's path, under the directory it is written to (`dist/`).
pub const INSTALLER: &str = "install.yaml";

/// The installer, from `files` (what [`crate::render`] returns for `deploy/`).
///
/// # Errors
/// None today: the files are already rendered. The `Result` matches the other renderers.
pub(crate) fn render(files: &[GeneratedFile]) -> Result<GeneratedFile, Error> {
    let installed = |file: &&GeneratedFile| {
        let path = file.path.to_string_lossy();
        INSTALLED
            .iter()
            .any(|dir| path.starts_with(&format!("{dir}/")))
            && !path.ends_with("kustomization.yaml")
    };
    // The Namespace, then the CRDs, then the rest in the installed directories' order.
    let rank = |file: &GeneratedFile| {
        let path = file.path.to_string_lossy();
        match () {
            () if path == "manager/namespace.yaml" => 0,
            () if path.starts_with("crds/") => 1,
            () => 2,
        }
    };
    let mut chosen: Vec<&GeneratedFile> = files.iter().filter(installed).collect();
    chosen.sort_by_key(|file| {
        let dir = INSTALLED
            .iter()
            .position(|dir| file.path.starts_with(dir))
            .unwrap_or(INSTALLED.len());
        (rank(file), dir)
    });
    let documents: Vec<&str> = chosen
        .iter()
        .map(|file| file.contents.trim_start_matches(yaml::HEADER).trim_end())
        .collect();
    let mut contents = String::from(yaml::HEADER);
    contents.push_str(&documents.join("\n---\n"));
    contents.push('\n');
    Ok(GeneratedFile {
        path: PathBuf::from(INSTALLER),
        contents,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// Kind and name of every object in `text`'s YAML documents.
    fn objects(text: &str) -> Vec<(String, String)> {
        text.split("\n---\n")
            .filter_map(|doc| yaml_serde::from_str::<serde_json::Value>(doc).ok())
            .filter(|doc| !doc.is_null())
            .map(|doc| {
                let name = doc["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                (doc["kind"].as_str().unwrap_or_default().to_owned(), name)
            })
            .collect()
    }

    #[test]
    fn the_installer_holds_what_the_kustomization_installs_namespace_and_crds_first() {
        let files = crate::render().expect("rendered");
        let installer = render(&files).expect("the installer");
        let ours = objects(&installer.contents);
        let installed: BTreeSet<(String, String)> = files
            .iter()
            .filter(|f| {
                let path = f.path.to_string_lossy();
                INSTALLED.iter().any(|d| path.starts_with(&format!("{d}/")))
            })
            .flat_map(|f| objects(&f.contents))
            .filter(|(kind, _)| kind != "Kustomization")
            .collect();
        assert_eq!(ours.iter().cloned().collect::<BTreeSet<_>>(), installed);
        assert_eq!(ours.len(), installed.len(), "each object once");
        assert_eq!(ours[0].0, "Namespace");
        let crds = ours
            .iter()
            .take_while(|(kind, _)| kind != "ServiceAccount" && kind != "ClusterRole");
        assert!(
            crds.skip(1)
                .all(|(kind, _)| kind == "CustomResourceDefinition")
        );
        assert!(installer.contents.starts_with(yaml::HEADER));
    }
}
