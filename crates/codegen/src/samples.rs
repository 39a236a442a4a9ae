//! Example objects under `samples/`, the ones the tutorial applies.

use std::path::{Path, PathBuf};

use crate::{Error, GeneratedFile, yaml};

/// The samples every registered controller declares, with their paths under `deploy/`:
/// `samples/<group's first label>_<version>_<kind>.yaml`, as Kubebuilder names them. They are
/// the tutorial's objects and the bundle's `alm-examples`.
pub(crate) fn objects() -> Result<Vec<(String, serde_json::Value)>, Error> {
    let mut all = Vec::new();
    for controller in controllers::all() {
        let samples = controller.samples().map_err(|e| Error::Render {
            path: PathBuf::from(format!("samples of the {} controller", controller.name())),
            source: <yaml_serde::Error as serde::ser::Error>::custom(e),
        })?;
        for sample in samples {
            all.push((path_of(&sample)?, sample));
        }
    }
    Ok(all)
}

/// Where `sample` is written, from its `apiVersion` and `kind`.
fn path_of(sample: &serde_json::Value) -> Result<String, Error> {
    let field = |name: &str| sample.get(name).and_then(serde_json::Value::as_str);
    let (Some(api_version), Some(kind)) = (field("apiVersion"), field("kind")) else {
        return Err(Error::Render {
            path: PathBuf::from("samples"),
            source: <yaml_serde::Error as serde::ser::Error>::custom(format!(
                "a sample without apiVersion and kind: {sample}"
            )),
        });
    };
    let (group, version) = api_version.split_once('/').unwrap_or(("core", api_version));
    let group = group.split('.').next().unwrap_or(group);
    Ok(format!(
        "samples/{group}_{version}_{}.yaml",
        kind.to_lowercase()
    ))
}

pub(crate) fn render() -> Result<Vec<GeneratedFile>, Error> {
    objects()?
        .into_iter()
        .map(|(path, value)| {
            let contents = yaml::render_documents(Path::new(&path), &[value])?;
            Ok(GeneratedFile {
                path: PathBuf::from(path),
                contents,
            })
        })
        .collect()
}
