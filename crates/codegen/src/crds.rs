//! One file per CRD under `crds/`, named `<group>_<plural>.yaml` like controller-gen does.

use std::path::PathBuf;

use crate::{Error, GeneratedFile, yaml};

pub(crate) fn render() -> Result<Vec<GeneratedFile>, Error> {
    apis::crds()
        .into_iter()
        .map(|crd| {
            let path = PathBuf::from(format!(
                "crds/{}_{}.yaml",
                crd.spec.group, crd.spec.names.plural
            ));
            let contents = yaml::render_documents(&path, &[crd])?;
            Ok(GeneratedFile { path, contents })
        })
        .collect()
}
