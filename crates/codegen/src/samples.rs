//! Example objects under `samples/`, the ones the tutorial applies.

use std::path::{Path, PathBuf};

use apis::{Memcached, MemcachedSpec, MyApp, MyAppSpec};
use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::{Error, GeneratedFile, yaml};

/// Name of the sample Memcached (the tutorial's `memcached-sample`).
pub const MEMCACHED_SAMPLE: &str = "memcached-sample";
/// Name of the sample MyApp.
pub const MYAPP_SAMPLE: &str = "myapp-sample";

/// The samples with their paths under `deploy/`: the tutorial's objects, and the bundle's
/// `alm-examples`.
pub(crate) fn objects() -> Result<Vec<(&'static str, serde_json::Value)>, Error> {
    // The seed's object, through the version it was written for.
    let memcached_v1alpha1 = apis::memcached::v1alpha1::Memcached::new(
        MEMCACHED_SAMPLE,
        apis::memcached::v1alpha1::MemcachedSpec {
            size: 3,
            image: apis::memcached::DEFAULT_IMAGE.to_owned(),
        },
    );
    // The same, with what only v1beta1 can say: the item memory, and a limit it fits in.
    let memcached = Memcached::new(
        MEMCACHED_SAMPLE,
        MemcachedSpec {
            size: 3,
            image: apis::memcached::DEFAULT_IMAGE.to_owned(),
            memory: Some(Quantity(
                apis::memcached::v1beta1::DEFAULT_MEMORY.to_owned(),
            )),
            resources: Some(ResourceRequirements {
                limits: Some([("memory".to_owned(), Quantity("96Mi".to_owned()))].into()),
                ..ResourceRequirements::default()
            }),
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
            serde_json::to_value(memcached_v1alpha1),
        ),
        (
            "samples/cache_v1beta1_memcached.yaml",
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
            let value = value.map_err(|e| Error::Render {
                path: PathBuf::from(path),
                source: <yaml_serde::Error as serde::ser::Error>::custom(e),
            })?;
            Ok((path, value))
        })
        .collect()
}

pub(crate) fn render() -> Result<Vec<GeneratedFile>, Error> {
    objects()?
        .into_iter()
        .map(|(path, value)| {
            let contents = yaml::render_documents(Path::new(path), &[value])?;
            Ok(GeneratedFile {
                path: PathBuf::from(path),
                contents,
            })
        })
        .collect()
}
