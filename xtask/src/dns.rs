//! The local cluster's DNS: CoreDNS on the real node behind the Service `kube-system/kube-dns`
//! at [`localcluster::CLUSTER_DNS_IP`], the name server the node's kubelet gives its pods, as
//! kubeadm and kind set clusters up. A pod reaches a Service as `<service>.<namespace>.svc`,
//! which OLM's catalog operator does to query a CatalogSource's registry pod.
//!
//! CoreDNS is built from its Go module at the release `xtask/dns/go.mod` pins, with the plugins
//! its Corefile uses (`xtask/dns/main.go`). The Corefile is kubeadm's without `forward`: only
//! the cluster's names are answered, so nothing a pod asks leaves the machine.

use std::time::{Duration, Instant};

use anyhow::Context;
use kube::api::DynamicObject;
use localcluster::node::{NODE_LABEL, TAINT_KEY};
use localcluster::{CLUSTER_DNS_IP, ClusterState};
use ociimage::{Image, ImageConfig, Reference, User};
use serde_json::json;

use crate::component::{self, Component};
use crate::gomodule::{self, GoModule};

const MODULE: GoModule = GoModule {
    what: "CoreDNS",
    cache_dir: "coredns",
    repo_dir: "xtask/dns",
    binary: "coredns",
    main_package: ".",
    ldflags: "",
    tags: "",
    cold_build: "about 2 minutes",
    sources: &[
        ("go.mod", include_str!("../dns/go.mod")),
        ("go.sum", include_str!("../dns/go.sum")),
        ("main.go", include_str!("../dns/main.go")),
    ],
};
const COREDNS_MODULE: &str = "github.com/coredns/coredns";
/// Where cluster DNS runs, under the names kubeadm gives it (the Service's name is what tools
/// look for).
const NAMESPACE: &str = "kube-system";
const NAME: &str = "coredns";
const SERVICE: &str = "kube-dns";
const CONFIG_MAP: &str = "coredns";
/// The cluster's domain, as the kubelet's `clusterDomain` has it.
const CLUSTER_DOMAIN: &str = "cluster.local";
/// A registry domain no one serves, as for the other components built here.
const REPOSITORY: &str = concat!(product::name!(), ".local/coredns");
const BINARY: &str = "/coredns";
const USER: u32 = 65532;
/// CoreDNS listens above 1024, so it needs no capability; the Service maps DNS's port to it.
const DNS_PORT: u16 = 1053;
const HEALTH_PORT: u16 = 8080;
const READY_PORT: u16 = 8181;
/// How long CoreDNS may take to become Available: a real container on a busy two-core machine.
const READY_TIMEOUT: Duration = Duration::from_secs(180);

/// Builds CoreDNS (once), loads its image into the real node, installs it and waits until it
/// answers. Applying is idempotent: a cluster that has it already keeps it.
///
/// # Errors
/// When the cluster has no real node, the build or the image fails, or CoreDNS does not become
/// Available in time.
pub async fn install(client: &kube::Client, state: &ClusterState) -> anyhow::Result<()> {
    let node = state.node.as_ref().context(
        "cluster DNS runs on the local cluster's real node, and the cluster runs without one; \
         restart it with `cargo xtask cluster down && cargo xtask cluster up`",
    )?;
    let binary = tokio::task::spawn_blocking(|| MODULE.build(|line| println!("{line}")))
        .await
        .context("building CoreDNS")??;
    let version = MODULE.required_version(COREDNS_MODULE)?;
    let image = component::load(image(&binary, version)?, &binary, node)?;
    testkit::apply_objects(client, objects(&image)?, None).await?;

    let started = Instant::now();
    component::wait_available(client, NAMESPACE, NAME, "CoreDNS", READY_TIMEOUT).await?;
    println!(
        "DNS: CoreDNS {version} answers for {CLUSTER_DOMAIN} at {CLUSTER_DNS_IP} \
         ({NAMESPACE}/{SERVICE}, ready in {:.0?})",
        started.elapsed()
    );
    Ok(())
}

fn image(binary: &std::path::Path, version: &str) -> anyhow::Result<Image> {
    let config = ImageConfig {
        exposed_ports: vec![ociimage::Port::Udp(DNS_PORT), ociimage::Port::Tcp(DNS_PORT)],
        ..ImageConfig::new(
            User::new("nonroot", USER),
            vec![BINARY.into()],
            gomodule::release_metadata(
                NAME,
                "CoreDNS, built from its Go module with the plugins the local cluster's \
                 Corefile uses",
                COREDNS_MODULE,
                version,
                "https://coredns.io",
            ),
        )
    };
    let reference = Reference::parse(&format!("{REPOSITORY}:{version}"))?;
    let mut image = Image::new(reference, config);
    image
        .add_binary(binary, BINARY)
        .with_context(|| format!("adding {} to CoreDNS's image", binary.display()))?;
    Ok(image)
}

/// kubeadm's Corefile, listening on [`DNS_PORT`] and without `forward`.
fn corefile() -> String {
    format!(
        ".:{DNS_PORT} {{
    errors
    health {{
        lameduck 5s
    }}
    ready
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }}
    cache 30
    loadbalance
}}
"
    )
}

/// CoreDNS's objects as kubeadm installs them, on the real node, with the Service at the
/// address the kubelet hands out.
fn objects(image: &str) -> anyhow::Result<Vec<DynamicObject>> {
    let component = Component {
        name: NAME,
        namespace: NAMESPACE,
        service_account: NAME,
    };
    let container = json!({
        "image": image,
        "args": ["-conf", "/etc/coredns/Corefile"],
        "ports": [
            {"name": "dns", "containerPort": DNS_PORT, "protocol": "UDP"},
            {"name": "dns-tcp", "containerPort": DNS_PORT, "protocol": "TCP"},
        ],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": READY_PORT}, "periodSeconds": 2},
        "livenessProbe": {"httpGet": {"path": "/health", "port": HEALTH_PORT}, "initialDelaySeconds": 10},
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
        "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": true}],
    });
    let volumes = json!([{"name": "config", "configMap": {"name": CONFIG_MAP}}]);
    let mut deployment = component.deployment(container, volumes);
    // kube-system is not one of the namespaces steered to the real node, so the pod says so
    // itself; it asks the host's name servers (none) rather than itself.
    let (label, value) = NODE_LABEL;
    let pod = &mut deployment["spec"]["template"]["spec"];
    pod["nodeSelector"] = json!({ label: value });
    pod["tolerations"] = json!([{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]);
    pod["dnsPolicy"] = json!("Default");
    pod["priorityClassName"] = json!("system-cluster-critical");
    let rbac = "rbac.authorization.k8s.io/v1";
    let role = "system:coredns";
    let dns_port = |name: &str, protocol: &str| json!({"name": name, "port": 53, "targetPort": DNS_PORT, "protocol": protocol});
    component::objects(
        vec![
            component.service_account(),
            json!({
                "apiVersion": rbac, "kind": "ClusterRole",
                "metadata": {"name": role},
                "rules": [
                    {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
                     "verbs": ["list", "watch"]},
                    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                     "verbs": ["list", "watch"]},
                ],
            }),
            component.cluster_role_binding(role, role),
            json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": CONFIG_MAP, "namespace": NAMESPACE},
                "data": {"Corefile": corefile()},
            }),
            deployment,
            json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": SERVICE, "namespace": NAMESPACE,
                             "labels": {"k8s-app": SERVICE, "kubernetes.io/name": "CoreDNS"}},
                "spec": {
                    "clusterIP": CLUSTER_DNS_IP.to_string(),
                    "selector": {"app": NAME},
                    "ports": [dns_port("dns", "UDP"), dns_port("dns-tcp", "TCP")],
                },
            }),
        ],
        "CoreDNS's objects",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_of_the_module_is_embedded() {
        MODULE.assert_every_file_is_embedded();
    }

    #[test]
    fn the_corefile_uses_only_the_plugins_built_in() {
        let main = MODULE
            .sources
            .iter()
            .find(|(name, _)| *name == "main.go")
            .map(|(_, text)| *text)
            .unwrap();
        let directives = main
            .lines()
            .find_map(|l| l.trim().strip_prefix("dnsserver.Directives = []string{"))
            .unwrap();
        for line in corefile().lines().skip(1) {
            let word = line.split_whitespace().next().unwrap_or("}");
            let nested = ["lameduck", "pods", "fallthrough", "ttl", "}"];
            if !nested.contains(&word) {
                assert!(directives.contains(&format!("\"{word}\"")), "{word}");
                assert!(main.contains(&format!("/plugin/{word}\"")), "{word}");
            }
        }
        assert!(!corefile().contains("forward"));
    }

    #[test]
    fn the_service_claims_the_address_the_kubelet_hands_out() {
        let objects = objects("coredns:v1").unwrap();
        let service = objects
            .iter()
            .find(|o| o.metadata.name.as_deref() == Some(SERVICE))
            .unwrap();
        assert_eq!(service.data["spec"]["clusterIP"], "10.96.0.10");
        assert_eq!(service.data["spec"]["ports"][0]["port"], 53);
        assert_eq!(service.data["spec"]["ports"][0]["targetPort"], DNS_PORT);
        let deployment = objects
            .iter()
            .find(|o| o.types.as_ref().is_some_and(|t| t.kind == "Deployment"))
            .unwrap();
        let pod = &deployment.data["spec"]["template"]["spec"];
        assert_eq!(
            service.data["spec"]["selector"],
            deployment.data["spec"]["selector"]["matchLabels"]
        );
        assert_eq!(pod["dnsPolicy"], "Default");
        assert_eq!(pod["containers"][0]["image"], "coredns:v1");
        assert_eq!(pod["tolerations"][0]["key"], TAINT_KEY);
    }
}
