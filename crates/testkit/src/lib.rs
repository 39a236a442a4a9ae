//! Support for end-to-end tests against the local control plane.
//!
//! Every test follows the same pattern:
//!
//! ```no_run
//! use std::time::Duration;
//!
//! # async fn demo() -> testkit::Result<()> {
//! // The running local cluster (started, and built once, if none runs).
//! let cluster = testkit::cluster().await?;
//! // A namespace of the test's own, deleted when `ns` is dropped.
//! let ns = testkit::TestNamespace::create(&cluster, "my-test").await?;
//! // The manager's CRDs and RBAC installed, and a kubeconfig with only its permissions.
//! let identity = testkit::manager_kubeconfig(&cluster, &testkit::deploy_dir()).await?;
//! // The manager binary (`cargo build -p manager`), killed when dropped.
//! let manager = testkit::spawn_manager(&identity.path, &[], &[]).await?;
//! testkit::wait_until("something to happen", Duration::from_secs(60), || async { true }).await?;
//! # drop((ns, manager)); Ok(()) }
//! ```
//!
//! Tests that would disturb others start a [`PrivateCluster`] of their own; a [`TcpProxy`] in
//! front of the API server lets a test cut the network between a client and the cluster.
//!
//! `kubectl` of the cluster's Kubernetes version is at [`TestCluster::kubectl_path`]; nothing
//! depends on a system kubectl.

mod audit;
mod cluster;
mod error;
pub mod https;
mod manager;
mod manifests;
mod memcached_load;
mod namespace;
mod private;
mod prometheus;
mod proxy;
mod registry;
mod serviceaccount;
mod wait;

pub use audit::{
    AuditEvent, Breach, FencingReport, LateWrite, RepeatedWrite, ReplicaHistory, StatusWrites,
    Tenure, check_fencing, identity_pod, lease_tenures, manager_identity, parse_audit_log,
    read_audit_files, read_audit_files_where, repeated_status_writes,
};
pub use cluster::{TestCluster, cluster, pod_ready};
pub use error::{Error, Result};
pub use manager::{
    ManagerProcess, free_port, free_port_other_than, log_dir, manager_binary, profile_dir,
    spawn_manager, spawn_manager_binary,
};
pub use manifests::{
    FIELD_MANAGER, apply_dir, apply_objects, apply_yaml_file, deploy_dir, parse_yaml,
    read_yaml_file, workspace_root, yaml_files,
};
pub use memcached_load::{churn, create_memcached, memcached_resource, wait_all_converged};
pub use namespace::{PodSecurity, TestNamespace, pod_security_labels, unique_name};
pub use private::PrivateCluster;
pub use prometheus::{Prometheus, Target, TargetTls};
pub use proxy::{TcpProxy, kubeconfig_via, server_addr};
pub use registry::PrivateRegistry;
pub use serviceaccount::{
    ServiceAccountKubeconfig, manager_kubeconfig, pod_kubeconfig, service_account_kubeconfig,
    service_account_token,
};
pub use wait::{POLL_INTERVAL, wait_for, wait_until};
