//! The admission webhooks under `webhook/`: the Service in front of every replica's webhook
//! server, the Mutating- and ValidatingWebhookConfiguration with one entry per webhook the
//! controllers declare ([`kube_operator_runtime::webhooks`]), and the NetworkPolicy that lets the API
//! server in. The manager puts its CA into the configurations' `caBundle` at start, so none is
//! rendered here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
    ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube_operator_runtime::webhook::{
    AdmissionKind, AdmissionWebhook, PORT, PORT_NAME, TIMEOUT_SECONDS,
};
use product::{MUTATING_CONFIGURATION, VALIDATING_CONFIGURATION, WEBHOOK_SERVICE as SERVICE_NAME};

use crate::manager::{meta, selector_labels, service_to_pods};
use crate::{Error, GeneratedFile, MANAGER_NAME, NAMESPACE, yaml};

/// The port the webhook Service listens on (the API server calls HTTPS on 443 by default).
pub const SERVICE_PORT: i32 = 443;

/// Where the API server reaches the webhooks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WebhookTarget {
    /// The webhook Service in `namespace`: the manager in-cluster.
    Service {
        /// The manager's namespace.
        namespace: String,
    },
    /// `base` followed by each webhook's path, e.g. `https://127.0.0.1:9443`: a manager run as
    /// a local process, which the API server on the same machine reaches on loopback.
    Url {
        /// Scheme, host and port, without a trailing `/`.
        base: String,
    },
}

/// The two configurations, with one entry per declared webhook of their kind, calling
/// `target`. Their `caBundle` is left for the manager (or cert-manager) to fill in.
///
/// # Errors
/// [`Error::Webhooks`] when two controllers declare a webhook of the same name or path.
pub fn webhook_configurations(
    target: &WebhookTarget,
) -> Result<(MutatingWebhookConfiguration, ValidatingWebhookConfiguration), Error> {
    let declared = declared()?;
    let of_kind = |kind: AdmissionKind| declared.iter().filter(move |hook| hook.kind == kind);
    let mutating = MutatingWebhookConfiguration {
        metadata: meta(MUTATING_CONFIGURATION, None),
        webhooks: Some(
            of_kind(AdmissionKind::Defaulting)
                .map(|hook| MutatingWebhook {
                    name: hook.name.clone(),
                    client_config: client_config(target, hook),
                    rules: Some(rules(hook)),
                    failure_policy: Some(FAILURE_POLICY.to_owned()),
                    side_effects: SIDE_EFFECTS.to_owned(),
                    match_policy: Some(MATCH_POLICY.to_owned()),
                    timeout_seconds: Some(TIMEOUT_SECONDS),
                    admission_review_versions: vec![REVIEW_VERSION.to_owned()],
                    ..MutatingWebhook::default()
                })
                .collect(),
        ),
    };
    let validating = ValidatingWebhookConfiguration {
        metadata: meta(VALIDATING_CONFIGURATION, None),
        webhooks: Some(
            of_kind(AdmissionKind::Validating)
                .map(|hook| ValidatingWebhook {
                    name: hook.name.clone(),
                    client_config: client_config(target, hook),
                    rules: Some(rules(hook)),
                    failure_policy: Some(FAILURE_POLICY.to_owned()),
                    side_effects: SIDE_EFFECTS.to_owned(),
                    match_policy: Some(MATCH_POLICY.to_owned()),
                    timeout_seconds: Some(TIMEOUT_SECONDS),
                    admission_review_versions: vec![REVIEW_VERSION.to_owned()],
                    ..ValidatingWebhook::default()
                })
                .collect(),
        ),
    };
    Ok((mutating, validating))
}

/// Limits every webhook of the two configurations to the namespace `namespace` (by its
/// `kubernetes.io/metadata.name` label), trusting `ca_bundle` (PEM) when given: for a manager
/// run outside the cluster to serve one namespace's writes and no one else's.
pub fn limit_to_namespace(
    mutating: &mut MutatingWebhookConfiguration,
    validating: &mut ValidatingWebhookConfiguration,
    namespace: &str,
    ca_bundle: Option<&str>,
) {
    let only_there = LabelSelector {
        match_labels: Some(
            [(
                "kubernetes.io/metadata.name".to_owned(),
                namespace.to_owned(),
            )]
            .into(),
        ),
        ..LabelSelector::default()
    };
    let ca = ca_bundle.map(|pem| ByteString(pem.as_bytes().to_vec()));
    for hook in mutating.webhooks.iter_mut().flatten() {
        hook.namespace_selector = Some(only_there.clone());
        hook.client_config.ca_bundle.clone_from(&ca);
    }
    for hook in validating.webhooks.iter_mut().flatten() {
        hook.namespace_selector = Some(only_there.clone());
        hook.client_config.ca_bundle.clone_from(&ca);
    }
}

/// A failing webhook refuses the write: validation that is skipped when the manager is down
/// would admit exactly what it exists to refuse.
const FAILURE_POLICY: &str = "Fail";
/// The webhooks only answer; they change nothing else.
const SIDE_EFFECTS: &str = "None";
/// Called for every version of a resource the rules name, once versions are converted.
const MATCH_POLICY: &str = "Equivalent";
/// The AdmissionReview version the manager answers.
const REVIEW_VERSION: &str = "v1";

/// Every declared webhook.
pub(crate) fn declared() -> Result<Vec<AdmissionWebhook>, Error> {
    kube_operator_runtime::webhooks(&controllers::all()).map_err(|e| Error::Webhooks(e.to_string()))
}

fn client_config(target: &WebhookTarget, hook: &AdmissionWebhook) -> WebhookClientConfig {
    match target {
        WebhookTarget::Service { namespace } => WebhookClientConfig {
            service: Some(ServiceReference {
                name: SERVICE_NAME.to_owned(),
                namespace: namespace.clone(),
                path: Some(hook.path.clone()),
                port: Some(SERVICE_PORT),
            }),
            ..WebhookClientConfig::default()
        },
        WebhookTarget::Url { base } => WebhookClientConfig {
            url: Some(format!("{}{}", base.trim_end_matches('/'), hook.path)),
            ..WebhookClientConfig::default()
        },
    }
}

/// The operations on the one resource the webhook is for, in one API version (with
/// [`MATCH_POLICY`], requests through other versions are converted and sent too).
pub(crate) fn rules(hook: &AdmissionWebhook) -> Vec<RuleWithOperations> {
    vec![RuleWithOperations {
        api_groups: Some(vec![hook.group.clone()]),
        api_versions: Some(vec![hook.version.clone()]),
        resources: Some(vec![hook.resource.clone()]),
        operations: Some(hook.operations.iter().map(|op| (*op).to_owned()).collect()),
        scope: Some("Namespaced".to_owned()),
    }]
}

pub(crate) fn render() -> Result<Vec<GeneratedFile>, Error> {
    let (mutating, validating) = webhook_configurations(&WebhookTarget::Service {
        namespace: NAMESPACE.to_owned(),
    })?;
    Ok(vec![
        file("webhook/service.yaml", &service())?,
        file("webhook/mutating_webhook_configuration.yaml", &mutating)?,
        file("webhook/validating_webhook_configuration.yaml", &validating)?,
        file("webhook/network_policy.yaml", &network_policy())?,
    ])
}

fn file<T: serde::Serialize>(path: &str, value: &T) -> Result<GeneratedFile, Error> {
    Ok(GeneratedFile {
        path: PathBuf::from(path),
        contents: yaml::render_documents(Path::new(path), std::slice::from_ref(value))?,
    })
}

/// Port 443 in front of every replica's webhook server: the webhooks are not leader-gated,
/// any Ready replica answers.
pub(crate) fn service() -> Service {
    service_to_pods(SERVICE_NAME, SERVICE_PORT, PORT_NAME)
}

/// The webhook port is open to every source: the API server's address is the node's or the
/// control plane's, which no pod or namespace selector can name.
fn network_policy() -> NetworkPolicy {
    NetworkPolicy {
        metadata: meta(&format!("{MANAGER_NAME}-allow-webhooks"), Some(NAMESPACE)),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(selector_labels()),
                ..LabelSelector::default()
            }),
            policy_types: Some(vec!["Ingress".to_owned()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: None,
                ports: Some(vec![NetworkPolicyPort {
                    port: Some(IntOrString::Int(i32::from(PORT))),
                    protocol: Some("TCP".to_owned()),
                    ..NetworkPolicyPort::default()
                }]),
            }]),
            ..NetworkPolicySpec::default()
        }),
    }
}

/// For the namespaced overlay: each webhook called only for objects in `namespace`, the one
/// the manager watches there; a JSON patch per configuration, one operation per webhook.
pub(crate) fn namespace_selector_patches(namespace: &str) -> Result<Vec<serde_json::Value>, Error> {
    let declared = declared()?;
    let selector = BTreeMap::from([(
        "kubernetes.io/metadata.name".to_owned(),
        namespace.to_owned(),
    )]);
    let patch = |kind: &str, name: &str, count: usize| {
        let operations: Vec<serde_json::Value> = (0..count)
            .map(|index| {
                serde_json::json!({
                    "op": "add",
                    "path": format!("/webhooks/{index}/namespaceSelector"),
                    "value": {"matchLabels": selector},
                })
            })
            .collect();
        let text = yaml_serde::to_string(&operations).map_err(|source| Error::Render {
            path: PathBuf::from("namespaced/kustomization.yaml"),
            source,
        })?;
        Ok::<_, Error>(serde_json::json!({
            "target": {
                "group": "admissionregistration.k8s.io",
                "version": "v1",
                "kind": kind,
                "name": name,
            },
            "patch": text,
        }))
    };
    let count = |kind: AdmissionKind| declared.iter().filter(|hook| hook.kind == kind).count();
    Ok(vec![
        patch(
            "MutatingWebhookConfiguration",
            MUTATING_CONFIGURATION,
            count(AdmissionKind::Defaulting),
        )?,
        patch(
            "ValidatingWebhookConfiguration",
            VALIDATING_CONFIGURATION,
            count(AdmissionKind::Validating),
        )?,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service_target() -> WebhookTarget {
        WebhookTarget::Service {
            namespace: NAMESPACE.to_owned(),
        }
    }

    #[test]
    fn one_entry_per_declared_webhook_calling_its_path_through_the_service() {
        let declared = declared().expect("declared");
        let (mutating, validating) = webhook_configurations(&service_target()).expect("rendered");
        let mutating = mutating.webhooks.expect("webhooks");
        let validating = validating.webhooks.expect("webhooks");
        assert_eq!(mutating.len() + validating.len(), declared.len());
        for hook in &declared {
            let (client, rules, failure, side_effects, timeout) = match hook.kind {
                AdmissionKind::Defaulting => {
                    let entry = mutating
                        .iter()
                        .find(|w| w.name == hook.name)
                        .expect("entry");
                    (
                        &entry.client_config,
                        &entry.rules,
                        &entry.failure_policy,
                        &entry.side_effects,
                        entry.timeout_seconds,
                    )
                }
                AdmissionKind::Validating => {
                    let entry = validating
                        .iter()
                        .find(|w| w.name == hook.name)
                        .expect("entry");
                    (
                        &entry.client_config,
                        &entry.rules,
                        &entry.failure_policy,
                        &entry.side_effects,
                        entry.timeout_seconds,
                    )
                }
            };
            let service = client.service.as_ref().expect("a service");
            assert_eq!(
                (service.name.as_str(), service.namespace.as_str()),
                (SERVICE_NAME, NAMESPACE)
            );
            assert_eq!(service.path.as_deref(), Some(hook.path.as_str()));
            assert_eq!(client.url, None);
            assert_eq!(client.ca_bundle, None, "the manager injects it");
            let rule = &rules.as_ref().expect("rules")[0];
            assert_eq!(rule.resources, Some(vec![hook.resource.clone()]));
            assert_eq!(rule.api_groups, Some(vec![hook.group.clone()]));
            assert_eq!(failure.as_deref(), Some("Fail"));
            assert_eq!(side_effects, "None");
            assert!(timeout.is_some_and(|t| t <= 10));
        }
    }

    #[test]
    fn a_url_target_calls_the_base_and_the_path() {
        let (mutating, _) = webhook_configurations(&WebhookTarget::Url {
            base: "https://127.0.0.1:19443/".to_owned(),
        })
        .expect("rendered");
        let entry = &mutating.webhooks.expect("webhooks")[0];
        assert_eq!(entry.client_config.service, None);
        let group = product::group!(cache).replace('.', "-");
        assert_eq!(
            entry.client_config.url,
            Some(format!(
                "https://127.0.0.1:19443/mutate-{group}-v1beta1-memcached"
            ))
        );
    }

    #[test]
    fn limited_to_a_namespace_every_webhook_selects_it_and_trusts_the_ca() {
        let target = WebhookTarget::Url {
            base: "https://127.0.0.1:19443".to_owned(),
        };
        let (mut mutating, mut validating) = webhook_configurations(&target).expect("rendered");
        limit_to_namespace(&mut mutating, &mut validating, "team-a", Some("PEM"));
        let selectors = (mutating.webhooks.iter().flatten())
            .map(|h| (&h.namespace_selector, &h.client_config.ca_bundle))
            .chain(
                (validating.webhooks.iter().flatten())
                    .map(|h| (&h.namespace_selector, &h.client_config.ca_bundle)),
            )
            .collect::<Vec<_>>();
        assert!(selectors.len() >= 2);
        for (selector, ca) in selectors {
            let labels = selector.as_ref().and_then(|s| s.match_labels.as_ref());
            assert_eq!(
                labels.and_then(|l| l.get("kubernetes.io/metadata.name")),
                Some(&"team-a".to_owned())
            );
            assert_eq!(ca.as_ref().map(|b| b.0.as_slice()), Some(&b"PEM"[..]));
        }
    }

    #[test]
    fn the_service_reaches_the_named_port_of_the_manager_pods() {
        let spec = service().spec.expect("spec");
        assert_eq!(spec.selector, Some(selector_labels()));
        let port = &spec.ports.expect("ports")[0];
        assert_eq!(port.port, SERVICE_PORT);
        assert_eq!(
            port.target_port,
            Some(IntOrString::String(PORT_NAME.to_owned()))
        );
    }
}
