//! The manager's own objects under `manager/`: Namespace, Deployment, PodDisruptionBudget,
//! metrics Service and NetworkPolicy; and the optional Prometheus Operator ServiceMonitor under `prometheus/`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Affinity, PodAffinityTerm, PodAntiAffinity, WeightedPodAffinityTerm,
};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction, Namespace,
    ObjectFieldSelector, PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ResourceRequirements,
    SeccompProfile, SecurityContext, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::ObjectMeta;
use serde_json::json;

use crate::{
    Error, GeneratedFile, HEALTH_PORT, LEADER_ELECTION_ID, MANAGER_IMAGE, MANAGER_NAME,
    METRICS_PORT, METRICS_PORT_NAME, NAMESPACE, yaml,
};

/// Seconds the kubelet waits after SIGTERM. The manager stops its controllers within its own
/// 30 s shutdown timeout and then releases the Lease, so this leaves a margin.
const TERMINATION_GRACE_PERIOD_SECONDS: i64 = 40;

/// Namespaces carrying this label may scrape the metrics port through the NetworkPolicy.
pub const METRICS_NAMESPACE_LABEL: (&str, &str) = ("metrics", "enabled");

/// Labels on every object the manifests create.
pub(crate) fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_owned(), MANAGER_NAME.to_owned()),
        (
            "app.kubernetes.io/part-of".to_owned(),
            MANAGER_NAME.to_owned(),
        ),
        (
            "app.kubernetes.io/managed-by".to_owned(),
            "kustomize".to_owned(),
        ),
    ])
}

/// The subset of labels that selects the manager's pods.
pub(crate) fn selector_labels() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_owned(), MANAGER_NAME.to_owned()),
        (
            "app.kubernetes.io/component".to_owned(),
            "manager".to_owned(),
        ),
    ])
}

fn pod_labels() -> BTreeMap<String, String> {
    let mut labels = labels();
    labels.extend(selector_labels());
    labels
}

/// Metadata with the common labels, for every object the manifests create.
pub(crate) fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: namespace.map(str::to_owned),
        labels: Some(labels()),
        ..ObjectMeta::default()
    }
}

fn file<T: serde::Serialize>(path: &str, value: &T) -> Result<GeneratedFile, Error> {
    Ok(GeneratedFile {
        path: PathBuf::from(path),
        contents: yaml::render_documents(Path::new(path), std::slice::from_ref(value))?,
    })
}

pub(crate) fn render() -> Result<Vec<GeneratedFile>, Error> {
    Ok(vec![
        file("manager/namespace.yaml", &namespace())?,
        file("manager/deployment.yaml", &deployment())?,
        file(
            "manager/pod_disruption_budget.yaml",
            &pod_disruption_budget(),
        )?,
        file("manager/metrics_service.yaml", &metrics_service())?,
        file("manager/network_policy.yaml", &network_policy())?,
        file("prometheus/service_monitor.yaml", &service_monitor())?,
    ])
}

/// The manager's namespace enforces the `restricted` Pod Security Standard: the manager runs
/// with the restricted profile, so nothing less should be admitted there.
fn namespace() -> Namespace {
    let mut labels = labels();
    for mode in ["enforce", "audit", "warn"] {
        labels.insert(
            format!("pod-security.kubernetes.io/{mode}"),
            "restricted".to_owned(),
        );
    }
    Namespace {
        metadata: ObjectMeta {
            name: Some(NAMESPACE.to_owned()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    }
}

fn env_from_field(name: &str, field_path: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: field_path.to_owned(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

fn http_probe(path: &str, initial_delay_seconds: i32, period_seconds: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_owned()),
            port: IntOrString::String("health".to_owned()),
            ..HTTPGetAction::default()
        }),
        initial_delay_seconds: Some(initial_delay_seconds),
        period_seconds: Some(period_seconds),
        ..Probe::default()
    }
}

fn quantities(pairs: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
        .collect()
}

fn scrape_annotations() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("prometheus.io/scrape".to_owned(), "true".to_owned()),
        ("prometheus.io/port".to_owned(), METRICS_PORT.to_string()),
        ("prometheus.io/path".to_owned(), "/metrics".to_owned()),
        ("prometheus.io/scheme".to_owned(), "https".to_owned()),
    ])
}

/// Two leader-elected replicas: one reconciles, the other stands by so a rolling update or a
/// lost node hands over in seconds. Restricted pod security, probes on the health port,
/// POD_NAME / POD_NAMESPACE from the downward API (the Lease holder identity and namespace).
pub(crate) fn deployment() -> Deployment {
    let container = Container {
        name: "manager".to_owned(),
        image: Some(format!("{MANAGER_IMAGE}:{}", env!("CARGO_PKG_VERSION"))),
        args: Some(vec![
            "--leader-elect".to_owned(),
            format!("--leader-election-id={LEADER_ELECTION_ID}"),
            format!("--metrics-bind-address=:{METRICS_PORT}"),
            "--metrics-secure".to_owned(),
            format!("--health-probe-bind-address=:{HEALTH_PORT}"),
        ]),
        env: Some(vec![
            env_from_field("POD_NAME", "metadata.name"),
            env_from_field("POD_NAMESPACE", "metadata.namespace"),
            EnvVar {
                name: "RUST_LOG".to_owned(),
                value: Some("info".to_owned()),
                ..EnvVar::default()
            },
        ]),
        ports: Some(vec![
            ContainerPort {
                name: Some(METRICS_PORT_NAME.to_owned()),
                container_port: METRICS_PORT,
                ..ContainerPort::default()
            },
            ContainerPort {
                name: Some("health".to_owned()),
                container_port: HEALTH_PORT,
                ..ContainerPort::default()
            },
            ContainerPort {
                name: Some(kube_operator_runtime::webhook::PORT_NAME.to_owned()),
                container_port: i32::from(kube_operator_runtime::webhook::PORT),
                ..ContainerPort::default()
            },
        ]),
        liveness_probe: Some(http_probe("/healthz", 15, 20)),
        readiness_probe: Some(http_probe("/readyz", 5, 10)),
        resources: Some(ResourceRequirements {
            requests: Some(quantities(&[("cpu", "10m"), ("memory", "64Mi")])),
            limits: Some(quantities(&[
                ("cpu", "500m"),
                ("memory", crate::MANAGER_MEMORY_LIMIT),
            ])),
            ..ResourceRequirements::default()
        }),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_owned()]),
                ..Capabilities::default()
            }),
            ..SecurityContext::default()
        }),
        ..Container::default()
    };
    Deployment {
        metadata: meta(MANAGER_NAME, Some(NAMESPACE)),
        spec: DeploymentSpec {
            replicas: Some(2),
            selector: LabelSelector {
                match_labels: Some(selector_labels()),
                ..LabelSelector::default()
            },
            // Start the new pod before stopping an old one: the standby takes the Lease at once.
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".to_owned()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::Int(1)),
                    max_unavailable: Some(IntOrString::Int(0)),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels()),
                    annotations: Some(scrape_annotations()),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(MANAGER_NAME.to_owned()),
                    termination_grace_period_seconds: Some(TERMINATION_GRACE_PERIOD_SECONDS),
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        run_as_user: Some(i64::from(crate::MANAGER_USER)),
                        run_as_group: Some(i64::from(crate::MANAGER_USER)),
                        seccomp_profile: Some(SeccompProfile {
                            type_: "RuntimeDefault".to_owned(),
                            ..SeccompProfile::default()
                        }),
                        ..PodSecurityContext::default()
                    }),
                    containers: vec![container],
                    affinity: Some(spread_by_node()),
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        },
        ..Deployment::default()
    }
}

/// Replicas on different nodes where the scheduler can: one node's loss or drain then leaves a
/// standby running. Preferred, not required, so a one-node cluster still runs both.
fn spread_by_node() -> Affinity {
    Affinity {
        pod_anti_affinity: Some(PodAntiAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(vec![
                WeightedPodAffinityTerm {
                    weight: 100,
                    pod_affinity_term: PodAffinityTerm {
                        label_selector: Some(LabelSelector {
                            match_labels: Some(selector_labels()),
                            ..LabelSelector::default()
                        }),
                        topology_key: "kubernetes.io/hostname".to_owned(),
                        ..PodAffinityTerm::default()
                    },
                },
            ]),
            ..PodAntiAffinity::default()
        }),
        ..Affinity::default()
    }
}

/// A drain evicts one replica at a time: one stays to lead (or to take over at once).
pub(crate) fn pod_disruption_budget() -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: meta(MANAGER_NAME, Some(NAMESPACE)),
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels()),
                ..LabelSelector::default()
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    }
}

pub(crate) fn metrics_service() -> Service {
    let mut service = service_to_pods(product::METRICS_SERVICE, METRICS_PORT, METRICS_PORT_NAME);
    service.metadata.annotations = Some(scrape_annotations());
    service
}

/// A Service `name` in the manager's namespace, `port` to the manager pods' port named
/// `port_name`.
pub(crate) fn service_to_pods(name: &str, port: i32, port_name: &str) -> Service {
    Service {
        metadata: meta(name, Some(NAMESPACE)),
        spec: Some(ServiceSpec {
            selector: Some(selector_labels()),
            ports: Some(vec![ServicePort {
                name: Some(port_name.to_owned()),
                port,
                target_port: Some(IntOrString::String(port_name.to_owned())),
                protocol: Some("TCP".to_owned()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// Only namespaces labelled `metrics: enabled` (where Prometheus runs) reach the metrics port.
/// Probes come from the kubelet on the node, which NetworkPolicies do not filter.
fn network_policy() -> NetworkPolicy {
    let (key, value) = METRICS_NAMESPACE_LABEL;
    NetworkPolicy {
        metadata: meta(&format!("{MANAGER_NAME}-allow-metrics"), Some(NAMESPACE)),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(selector_labels()),
                ..LabelSelector::default()
            }),
            policy_types: Some(vec!["Ingress".to_owned()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(vec![NetworkPolicyPeer {
                    namespace_selector: Some(LabelSelector {
                        match_labels: Some(BTreeMap::from([(key.to_owned(), value.to_owned())])),
                        ..LabelSelector::default()
                    }),
                    ..NetworkPolicyPeer::default()
                }]),
                ports: Some(vec![NetworkPolicyPort {
                    port: Some(IntOrString::Int(METRICS_PORT)),
                    protocol: Some("TCP".to_owned()),
                    ..NetworkPolicyPort::default()
                }]),
            }]),
            ..NetworkPolicySpec::default()
        }),
    }
}

/// For clusters running the Prometheus Operator; kept out of the default kustomization because
/// its CRD is not installed everywhere (`kubectl apply -k deploy/prometheus` adds it).
fn service_monitor() -> serde_json::Value {
    json!({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": MANAGER_NAME, "namespace": NAMESPACE, "labels": labels()},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": MANAGER_NAME}},
            // The manager checks Prometheus's own token, and serves the certificate it
            // provisions for its webhooks, which carries the metrics Service's names: verified
            // with the CA bundle of that Secret (where Kubebuilder's scaffold skips verifying).
            "endpoints": [{
                "port": METRICS_PORT_NAME,
                "path": "/metrics",
                "scheme": "https",
                "interval": "30s",
                "bearerTokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token",
                "tlsConfig": {
                    "ca": {"secret": {"name": product::WEBHOOK_CERT_SECRET, "key": "ca.crt"}},
                    "serverName": product::METRICS_SERVICE,
                },
            }],
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deployment_runs_restricted_with_probes_and_downward_api() {
        let spec = deployment().spec;
        let pod = spec.template.spec.expect("pod spec");
        let pod_security = pod.security_context.expect("pod security context");
        assert_eq!(pod_security.run_as_non_root, Some(true));
        assert!(pod_security.run_as_user.is_some_and(|uid| uid > 0));
        assert_eq!(
            pod_security.seccomp_profile.map(|p| p.type_).as_deref(),
            Some("RuntimeDefault")
        );
        let container = &pod.containers[0];
        let security = container
            .security_context
            .clone()
            .expect("container security context");
        assert_eq!(security.allow_privilege_escalation, Some(false));
        assert_eq!(
            security.capabilities.and_then(|c| c.drop),
            Some(vec!["ALL".to_owned()])
        );
        let probe_path = |p: &Option<Probe>| {
            p.as_ref()
                .and_then(|p| p.http_get.as_ref())
                .and_then(|h| h.path.clone())
        };
        assert_eq!(
            probe_path(&container.liveness_probe).as_deref(),
            Some("/healthz")
        );
        assert_eq!(
            probe_path(&container.readiness_probe).as_deref(),
            Some("/readyz")
        );
        let env: Vec<&str> = container
            .env
            .iter()
            .flatten()
            .map(|e| e.name.as_str())
            .collect();
        assert!(
            env.contains(&"POD_NAME") && env.contains(&"POD_NAMESPACE"),
            "{env:?}"
        );
        assert!(
            container
                .args
                .iter()
                .flatten()
                .any(|a| a == "--leader-elect")
        );
        assert!(
            container
                .resources
                .as_ref()
                .and_then(|r| r.limits.as_ref())
                .is_some()
        );
        assert_eq!(pod.service_account_name.as_deref(), Some(MANAGER_NAME));
    }

    #[test]
    fn selector_matches_pod_labels_and_service() {
        let spec = deployment().spec;
        let pod_labels = spec
            .template
            .metadata
            .and_then(|m| m.labels)
            .expect("labels");
        for (k, v) in spec.selector.match_labels.expect("match labels") {
            assert_eq!(pod_labels.get(&k), Some(&v));
        }
        let service = metrics_service().spec.expect("spec");
        for (k, v) in service.selector.expect("selector") {
            assert_eq!(pod_labels.get(&k), Some(&v));
        }
    }

    #[test]
    fn a_drain_keeps_one_replica_and_replicas_prefer_separate_nodes() {
        let spec = deployment().spec;
        let budget = pod_disruption_budget().spec.expect("spec");
        assert_eq!(budget.min_available, Some(IntOrString::Int(1)));
        assert!(
            spec.replicas.unwrap_or(1) > 1,
            "a budget of 1 needs 2 replicas"
        );
        let selected = budget.selector.and_then(|s| s.match_labels);
        assert_eq!(selected, spec.selector.match_labels);
        let pod = spec.template.spec.expect("pod spec");
        let anti = pod
            .affinity
            .and_then(|a| a.pod_anti_affinity)
            .expect("anti-affinity");
        assert!(
            anti.required_during_scheduling_ignored_during_execution
                .is_none()
        );
        let preferred = anti
            .preferred_during_scheduling_ignored_during_execution
            .expect("preferred");
        let term = &preferred[0].pod_affinity_term;
        assert_eq!(term.topology_key, "kubernetes.io/hostname");
        let matched = term.label_selector.clone().and_then(|s| s.match_labels);
        assert_eq!(matched, Some(selector_labels()));
    }

    #[test]
    fn namespace_enforces_restricted_pod_security() {
        let labels = namespace().metadata.labels.expect("labels");
        assert_eq!(
            labels
                .get("pod-security.kubernetes.io/enforce")
                .map(String::as_str),
            Some("restricted")
        );
    }
}
