//! The controller-runtime reference: the same Memcached controller written the idiomatic Go way
//! (controller-runtime v0.24.1, Kubebuilder layout), in `xtask/reference/memcached/`, so the bench
//! can measure our manager against what a Go operator author would run. It is never shipped.
//!
//! [`build`] compiles it once per version of its sources into the local cluster's cache
//! (`<cache>/reference/<hash of the sources>/memcached-reference`); later runs find the binary
//! there and start at once. The sources are embedded in xtask and built as a [`GoModule`],
//! which says why; a test checks that every file of the module is in [`SOURCES`].
//!
//! The binary takes the manager's flags that the bench passes (`--leader-elect`,
//! `--leader-election-id`, `--leader-election-namespace`, `--metrics-bind-address`,
//! `--health-probe-bind-address`, `--max-concurrent-reconciles`, `--log-format`,
//! `--lease-duration`, `--renew-deadline`, `--retry-period`), uses `POD_NAME` as its Lease
//! identity, and reads `KUBECONFIG` like any controller-runtime manager. It ignores `RUST_LOG`;
//! its log level is controller-runtime's `--zap-log-level` (`info` by default; `error` is the
//! closest to the manager's `RUST_LOG=warn`).

use std::path::PathBuf;

use crate::gomodule::GoModule;

/// The reference's Go module.
const MODULE: GoModule = GoModule {
    what: "the controller-runtime reference",
    cache_dir: "reference",
    repo_dir: "xtask/reference/memcached",
    binary: "memcached-reference",
    main_package: ".",
    ldflags: "",
    tags: "",
    cold_build: "about 2 minutes",
    sources: &SOURCES,
};

/// Every file of the Go module that the build needs, by its path in the module.
const SOURCES: [(&str, &str); 9] = [
    ("go.mod", include_str!("../../reference/memcached/go.mod")),
    ("go.sum", include_str!("../../reference/memcached/go.sum")),
    ("main.go", include_str!("../../reference/memcached/main.go")),
    (
        "api/v1beta1/groupversion_info.go",
        include_str!("../../reference/memcached/api/v1beta1/groupversion_info.go"),
    ),
    (
        "api/v1beta1/memcached_types.go",
        include_str!("../../reference/memcached/api/v1beta1/memcached_types.go"),
    ),
    (
        "api/v1beta1/zz_generated.deepcopy.go",
        include_str!("../../reference/memcached/api/v1beta1/zz_generated.deepcopy.go"),
    ),
    (
        "internal/controller/memcached_controller.go",
        include_str!("../../reference/memcached/internal/controller/memcached_controller.go"),
    ),
    (
        "internal/controller/labels.go",
        include_str!("../../reference/memcached/internal/controller/labels.go"),
    ),
    (
        "internal/controller/status.go",
        include_str!("../../reference/memcached/internal/controller/status.go"),
    ),
];

/// Builds the reference controller unless the binary for these sources is already cached, and
/// returns its path. Synchronous: call it before starting the async runtime, like the manager's
/// release build. `progress` receives a line per step (nothing when the binary is cached).
///
/// # Errors
/// Without a cache directory, without Go (or with one older than the module's `go` line), when
/// the Go modules cannot be downloaded, or when compiling fails (the message names the log).
pub fn build(progress: impl Fn(&str)) -> anyhow::Result<PathBuf> {
    MODULE.build(progress)
}

/// What the reference may do besides what the generated RBAC grants our manager, bound to the
/// same ServiceAccount so both are counted as one client: the grants of its `+kubebuilder:rbac`
/// markers (`get` and `update` for its Get-then-Update writes, `Status().Update`) and of
/// Kubebuilder's leader-election Role (every verb on Leases, core Events). Our manager has
/// no use for them.
pub fn extra_rbac(account: &str, namespace: &str) -> anyhow::Result<Vec<kube::api::DynamicObject>> {
    let name = concat!(product::name!(), "-bench-reference");
    let every = [
        "get", "list", "watch", "create", "update", "patch", "delete",
    ];
    let rule = |group: &str, resources: &[&str], verbs: &[&str]| serde_json::json!({"apiGroups": [group], "resources": resources, "verbs": verbs});
    let subjects =
        serde_json::json!([{"kind": "ServiceAccount", "name": account, "namespace": namespace}]);
    let objects = serde_json::json!([
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": name},
         "rules": [
            rule(product::group!(cache), &["memcacheds"], &every),
            rule(product::group!(cache), &["memcacheds/status"], &["get", "update", "patch"]),
            rule("apps", &["deployments"], &every),
            rule("", &["pods"], &["get", "list", "watch"]),
            rule("", &["services"], &every),
            rule("policy", &["poddisruptionbudgets"], &every),
            rule("events.k8s.io", &["events"], &["create", "patch"]),
            rule("", &["events"], &["create", "patch"]),
            rule("coordination.k8s.io", &["leases"], &every),
         ]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
         "subjects": subjects},
    ]);
    Ok(serde_json::from_value(objects)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use localcluster::toolchain::at_least;

    #[test]
    fn the_go_line_is_satisfied_by_the_pinned_go() {
        let required = MODULE
            .go_line()
            .expect("the reference's go.mod has a go line");
        assert!(at_least("go1.26.8", required), "{required}");
    }

    #[test]
    fn the_reference_uses_controller_runtime_v0_24_1() {
        let go_mod = MODULE.go_mod();
        assert!(go_mod.starts_with(concat!(
            "module ",
            product::name!(),
            ".dev/reference/memcached\n"
        )));
        assert!(
            go_mod
                .lines()
                .any(|l| l.trim() == "sigs.k8s.io/controller-runtime v0.24.1"),
            "{go_mod}"
        );
    }

    #[test]
    fn every_file_of_the_module_is_embedded() {
        MODULE.assert_every_file_is_embedded();
    }
}
