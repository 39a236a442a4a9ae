//! A real Kubernetes control plane on loopback, built from source, for development and tests.
//!
//! No container engine is needed: etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler, kubectl and kwok are compiled once from the Go module proxy at pinned
//! versions (see [`versions`]) into a cache outside the repository, then started as ordinary
//! processes listening on 127.0.0.1 only:
//!
//! - the API server with RBAC (`--authorization-mode=Node,RBAC`), the default admission plugins
//!   (Pod Security Admission included), service-account token signing, and certificates
//!   generated for each cluster, and an audit log (JSON lines in
//!   [`Paths::audit_log`], rotated at 200 MB, three backups kept): Lease writes with their
//!   request bodies, every other write with its metadata (user, user agent, object, time), no
//!   reads; [`ClusterState::audit_log_files`] lists its files for tests;
//! - the controller manager with every default controller (Deployments, ReplicaSets, garbage
//!   collection, service accounts and their tokens, namespaces, ...) except node lifecycle;
//! - the scheduler;
//! - a few fake nodes, each played by a kwok process of its own (which watches only that
//!   node's pods, as a kubelet does), which moves scheduled pods to Running and Ready.
//!
//! [`LocalCluster`] is the entry point; `cargo xtask cluster up|down|status|kubeconfig` is a
//! thin command line over it, and the `testkit` crate uses it to give end-to-end tests a
//! cluster.
//!
//! # Layout on disk
//! See [`Paths`]: binaries in `…/operator-manager/control-plane/<versions>/bin/`, the running
//! cluster (certificates, etcd data, logs, pids, kubeconfigs, the audit log in `audit/`) in
//! `…/operator-manager/cluster/`.

mod audit;
mod certs;
mod cluster;
mod error;
pub mod http;
mod kubeconfig;
mod kwok_stages;
mod lock;
pub mod node;
mod outage;
mod paths;
mod process;
mod state;
pub mod toolchain;
pub mod versions;

pub use cluster::{
    CLUSTER_DNS_IP, FAKE_NODE_ANNOTATION, FAKE_NODES, LocalCluster, Progress, Up,
    client_from_kubeconfig,
};
pub use error::{Error, Result};
pub use kubeconfig::{Credentials, KubeconfigSpec};
pub use outage::Outage;
pub use paths::Paths;
pub use state::{ClusterState, Component, Status};
pub use toolchain::Binaries;
