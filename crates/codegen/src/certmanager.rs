//! `certmanager/`: a kustomize Component for clusters that issue certificates with
//! cert-manager, as Kubebuilder's `config/certmanager` does. It adds a self-signed Issuer and a
//! Certificate for the webhook Service's names, mounts the Secret cert-manager writes into the
//! manager at [`WEBHOOK_CERT_DIR`] (`--webhook-cert-path`, so the manager provisions nothing),
//! and has cert-manager's CA injector fill in the `caBundle` of the webhook configurations and
//! of the CRDs that convert through the webhook.
//!
//! Use it from an overlay of your own:
//!
//! ```yaml
//! resources: [<path to deploy>]
//! components: [<path to deploy>/certmanager]
//! ```

use std::path::{Path, PathBuf};

use product::{MUTATING_CONFIGURATION, VALIDATING_CONFIGURATION, WEBHOOK_SERVICE as SERVICE_NAME};
use serde_json::{Value, json};

use crate::manager::labels;
use crate::{Error, GeneratedFile, MANAGER_NAME, NAMESPACE, WEBHOOK_CERT_DIR, yaml};

/// The Certificate, and the Secret cert-manager keeps it in (not the one the manager
/// provisions, so switching between the two never mixes them).
pub const CERTIFICATE: &str = concat!(product::name!(), "-webhook-serving-cert");
/// The self-signed Issuer.
pub const ISSUER: &str = concat!(product::name!(), "-selfsigned");
/// The pod volume holding the certificate.
const VOLUME: &str = "webhook-certs";

pub(crate) fn render() -> Result<Vec<GeneratedFile>, Error> {
    [
        ("certmanager/issuer.yaml", issuer()),
        ("certmanager/certificate.yaml", certificate()),
        ("certmanager/kustomization.yaml", component()),
    ]
    .into_iter()
    .map(|(path, value)| {
        Ok(GeneratedFile {
            path: PathBuf::from(path),
            contents: yaml::render_documents(Path::new(path), &[value])?,
        })
    })
    .collect()
}

fn issuer() -> Value {
    json!({
        "apiVersion": "cert-manager.io/v1",
        "kind": "Issuer",
        "metadata": {"name": ISSUER, "namespace": NAMESPACE, "labels": labels()},
        "spec": {"selfSigned": {}},
    })
}

fn certificate() -> Value {
    json!({
        "apiVersion": "cert-manager.io/v1",
        "kind": "Certificate",
        "metadata": {"name": CERTIFICATE, "namespace": NAMESPACE, "labels": labels()},
        "spec": {
            "dnsNames": [
                format!("{SERVICE_NAME}.{NAMESPACE}.svc"),
                format!("{SERVICE_NAME}.{NAMESPACE}.svc.cluster.local"),
            ],
            "issuerRef": {"kind": "Issuer", "name": ISSUER},
            "secretName": CERTIFICATE,
        },
    })
}

fn component() -> Value {
    let inject = json!({
        "metadata": {"annotations": {
            "cert-manager.io/inject-ca-from": format!("{NAMESPACE}/{CERTIFICATE}"),
        }},
    });
    let annotate = |api_version: &str, kind: &str, name: &str| {
        let mut patch = inject.clone();
        patch["apiVersion"] = json!(api_version);
        patch["kind"] = json!(kind);
        patch["metadata"]["name"] = json!(name);
        json!({"patch": serde_json::to_string(&patch).unwrap_or_default()})
    };
    let mount = format!(
        "- op: add\n  path: /spec/template/spec/containers/0/args/-\n  value: --webhook-cert-path={WEBHOOK_CERT_DIR}\n\
         - op: add\n  path: /spec/template/spec/volumes\n  value:\n  - name: {VOLUME}\n    secret:\n      secretName: {CERTIFICATE}\n\
         - op: add\n  path: /spec/template/spec/containers/0/volumeMounts\n  value:\n  - name: {VOLUME}\n    mountPath: {WEBHOOK_CERT_DIR}\n    readOnly: true\n"
    );
    let admission = "admissionregistration.k8s.io/v1";
    let mut patches = vec![
        json!({
            "target": {"group": "apps", "version": "v1", "kind": "Deployment", "name": MANAGER_NAME},
            "patch": mount,
        }),
        annotate(
            admission,
            "MutatingWebhookConfiguration",
            MUTATING_CONFIGURATION,
        ),
        annotate(
            admission,
            "ValidatingWebhookConfiguration",
            VALIDATING_CONFIGURATION,
        ),
    ];
    // The CRDs that convert through the webhook get the CA the same way.
    for conversion in kube_operator_runtime::conversions(&controllers::all()) {
        patches.push(annotate(
            "apiextensions.k8s.io/v1",
            "CustomResourceDefinition",
            &conversion.crd_name,
        ));
    }
    json!({
        "apiVersion": "kustomize.config.k8s.io/v1alpha1",
        "kind": "Component",
        "resources": ["issuer.yaml", "certificate.yaml"],
        "patches": patches,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_certificate_names_the_webhook_service() {
        let names = certificate()["spec"]["dnsNames"].clone();
        assert_eq!(
            names,
            json!([
                concat!(
                    product::name!(),
                    concat!("-webhook.", product::namespace!(), ".svc")
                ),
                concat!(
                    product::name!(),
                    concat!("-webhook.", product::namespace!(), ".svc.cluster.local")
                )
            ])
        );
    }

    #[test]
    fn the_component_mounts_the_certificate_where_the_manager_reads_it() {
        let component = component();
        let patch = component["patches"][0]["patch"].as_str().expect("a patch");
        assert!(patch.contains(&format!("--webhook-cert-path={WEBHOOK_CERT_DIR}")));
        assert!(patch.contains(&format!("mountPath: {WEBHOOK_CERT_DIR}")));
        assert!(patch.contains(&format!("secretName: {CERTIFICATE}")));
        for index in [1, 2, 3] {
            let annotation = component["patches"][index]["patch"]
                .as_str()
                .expect("a patch");
            assert!(
                annotation.contains("cert-manager.io/inject-ca-from"),
                "{annotation}"
            );
        }
    }
}
