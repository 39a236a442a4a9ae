//! The platform's custom resource types.
//!
//! Types only: no I/O and no controller logic, so every other crate (controllers, manifest
//! generation, tests) can depend on them cheaply. Field documentation becomes the CRD's schema
//! descriptions, which is what `kubectl explain` shows users.

// `#[kube(printcolumn(...))]` repeats `type_ = ...` once per column by design.
#![allow(clippy::duplicated_attributes)]

pub mod keyvaluestore;
pub mod memcached;
pub mod myapp;
pub mod tenant;

pub use keyvaluestore::{KeyValueStore, KeyValueStoreSpec, KeyValueStoreStatus};
pub use memcached::{Memcached, MemcachedSpec, MemcachedStatus};
pub use myapp::{MyApp, MyAppSpec, MyAppStatus};
pub use tenant::{Tenant, TenantSpec, TenantStatus};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// Every CRD this workspace defines, every version of each, in a stable order (manifests are
/// written in this order).
///
/// # Errors
/// When a type's versions cannot be merged into one CRD.
pub fn crds() -> Result<Vec<CustomResourceDefinition>, kube::core::crd::MergeError> {
    Ok(vec![
        memcached::crd()?,
        MyApp::crd(),
        Tenant::crd(),
        KeyValueStore::crd(),
    ])
}
