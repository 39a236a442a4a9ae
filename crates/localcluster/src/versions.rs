//! The pinned versions of the control plane.
//!
//! The Kubernetes minor must match the `k8s-openapi` feature the workspace compiles against
//! (`v1_37`). Each version is also pinned in the Go wrapper modules under `go/`; change both
//! together (and run `go mod tidy` there).

/// Kubernetes (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl).
///
/// v1.37.1 rather than v1.37.2: the module proxy does not serve the v1.37.2 source archive of
/// `k8s.io/kubernetes`.
pub const KUBERNETES: &str = "v1.37.1";

/// etcd: the v3.7 line that Kubernetes 1.37 requires, at its latest patch release.
pub const ETCD: &str = "v3.7.3";

/// kwok, which fakes nodes and moves pods through their lifecycle.
pub const KWOK: &str = "v0.8.0";

/// Prometheus, which the end-to-end tests run to scrape the in-cluster manager through
/// Kubernetes service discovery (the distribution's package is built without it). The Go
/// module's `v0.316.0` is Prometheus 3.16.0.
pub const PROMETHEUS: &str = "v0.316.0";

/// The pod sandbox (`pause`) of Kubernetes v1.37, compiled from the Kubernetes module's C
/// source and tagged as the image the container runtime expects
/// (`registry.k8s.io/pause:<this>`, kubeadm's `PauseVersion`).
pub const PAUSE: &str = "3.10.2";

/// The oldest Go release that builds these versions (Prometheus's dependencies ask for 1.26.7;
/// an older Go would try to download a newer toolchain, which may not be reachable).
pub const GO_REQUIRED: &str = "1.26.7";

/// The name of the directory that caches binaries built from exactly these versions.
pub fn cache_key() -> String {
    format!("{KUBERNETES}-{ETCD}-{KWOK}-prometheus-{PROMETHEUS}")
}
