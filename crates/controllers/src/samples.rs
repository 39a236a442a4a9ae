//! The example objects each controller's registration declares: the objects the tutorial
//! applies, rendered under `deploy/samples/` and into the bundle's `alm-examples`.

use std::collections::BTreeMap;

use apis::{KeyValueStore, KeyValueStoreSpec, Memcached, MemcachedSpec, MyApp, MyAppSpec};
use apis::{Tenant, TenantSpec};
use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::Value;

/// Name of the sample Memcached (the tutorial's `memcached-sample`).
pub const MEMCACHED: &str = "memcached-sample";
/// Name of the sample MyApp.
pub const MYAPP: &str = "myapp-sample";
/// Name of the sample KeyValueStore.
pub const KEYVALUESTORE: &str = "keyvaluestore-sample";
/// Name of the sample Tenant, and of its namespace.
pub const TENANT: &str = "tenant-sample";

/// The sample Memcached in the version the tutorial wrote it for, and the same in the served
/// version with what only that can say: the item memory, and a limit it fits in.
pub fn memcached() -> Result<Vec<Value>, serde_json::Error> {
    let v1alpha1 = apis::memcached::v1alpha1::Memcached::new(
        MEMCACHED,
        apis::memcached::v1alpha1::MemcachedSpec {
            size: 3,
            image: apis::memcached::DEFAULT_IMAGE.to_owned(),
        },
    );
    let memory = apis::memcached::v1beta1::DEFAULT_MEMORY;
    let v1beta1 = Memcached::new(
        MEMCACHED,
        MemcachedSpec {
            size: 3,
            image: apis::memcached::DEFAULT_IMAGE.to_owned(),
            memory: Some(Quantity(memory.to_owned())),
            resources: Some(ResourceRequirements {
                limits: Some([("memory".to_owned(), Quantity("96Mi".to_owned()))].into()),
                ..ResourceRequirements::default()
            }),
        },
    );
    Ok(vec![
        serde_json::to_value(v1alpha1)?,
        serde_json::to_value(v1beta1)?,
    ])
}

/// The sample MyApp: two nginx pods.
pub fn myapp() -> Result<Vec<Value>, serde_json::Error> {
    let spec = MyAppSpec {
        replicas: 2,
        image: "nginx:1.29-alpine".to_owned(),
    };
    Ok(vec![serde_json::to_value(MyApp::new(MYAPP, spec))?])
}

/// The sample Tenant: a namespace of its own name for the group `tenant-sample-developers`,
/// allowed 10 pods and 2 CPUs of requests.
pub fn tenant() -> Result<Vec<Value>, serde_json::Error> {
    let quota = [
        ("pods", "10"),
        ("requests.cpu", "2"),
        ("requests.memory", "4Gi"),
    ];
    let spec = TenantSpec {
        namespace: None,
        group: format!("{TENANT}-developers"),
        quota: BTreeMap::from(quota.map(|(k, v)| (k.to_owned(), Quantity(v.to_owned())))),
    };
    Ok(vec![serde_json::to_value(Tenant::new(TENANT, spec))?])
}

/// The sample KeyValueStore: three servers of 64 MiB, evicting the least recently used keys
/// when full, each on a volume of 1 GiB.
pub fn keyvaluestore() -> Result<Vec<Value>, serde_json::Error> {
    let spec = KeyValueStoreSpec {
        replicas: 3,
        image: apis::keyvaluestore::DEFAULT_IMAGE.to_owned(),
        max_memory: Quantity(apis::keyvaluestore::DEFAULT_MAX_MEMORY.to_owned()),
        config: BTreeMap::from([("maxmemory-policy".to_owned(), "allkeys-lru".to_owned())]),
        storage: Quantity(apis::keyvaluestore::DEFAULT_STORAGE.to_owned()),
        storage_class_name: None,
    };
    Ok(vec![serde_json::to_value(KeyValueStore::new(
        KEYVALUESTORE,
        spec,
    ))?])
}
