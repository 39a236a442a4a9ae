//! Example objects under `samples/`, the ones the tutorial applies.

use std::path::{Path, PathBuf};

use apis::{Memcached, MemcachedSpec, MyApp, MyAppSpec};

use crate::{Error, GeneratedFile, yaml};

/// Name of the sample Memcached (the tutorial's `memcached-sample`).
pub const MEMCACHED_SAMPLE: &str = "memcached-sample";
/// Name of the sample MyApp.
pub const MYAPP_SAMPLE: &str = "myapp-sample";

pub(crate) fn render() -> Result<Vec<GeneratedFile>, Error> {
    let memcached = Memcached::new(
        MEMCACHED_SAMPLE,
        MemcachedSpec {
            size: 3,
            image: apis::memcached::DEFAULT_IMAGE.to_owned(),
        },
    );
    let myapp = MyApp::new(
        MYAPP_SAMPLE,
        MyAppSpec {
            replicas: 2,
            image: "nginx:1.29-alpine".to_owned(),
        },
    );
    let files = [
        (
            "samples/cache_v1alpha1_memcached.yaml",
            serde_json::to_value(memcached),
        ),
        (
            "samples/myscheme_v1_myapp.yaml",
            serde_json::to_value(myapp),
        ),
    ];
    files
        .into_iter()
        .map(|(path, value)| {
            let path_buf = PathBuf::from(path);
            let value = value.map_err(|e| Error::Render {
                path: path_buf.clone(),
                source: <yaml_serde::Error as serde::ser::Error>::custom(e),
            })?;
            let contents = yaml::render_documents(Path::new(path), &[value])?;
            Ok(GeneratedFile {
                path: path_buf,
                contents,
            })
        })
        .collect()
}
