//! One file per CRD under `crds/`, named `<group>_<plural>.yaml` like controller-gen does; a
//! CRD whose type declares a conversion ([`kube_operator_runtime::conversions`]) converts through the
//! manager's webhook.

use std::path::PathBuf;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceConversion, CustomResourceDefinition, ServiceReference, WebhookClientConfig,
    WebhookConversion,
};
use kube_operator_runtime::webhook::conversion::CONVERSION_PATH;

use crate::webhooks::{SERVICE_PORT, WebhookTarget};
use crate::{Error, GeneratedFile, NAMESPACE, yaml};

pub(crate) fn render() -> Result<Vec<GeneratedFile>, Error> {
    crds(&WebhookTarget::Service {
        namespace: NAMESPACE.to_owned(),
    })?
    .into_iter()
    .map(|crd| {
        let path = PathBuf::from(format!(
            "crds/{}_{}.yaml",
            crd.spec.group, crd.spec.names.plural
        ));
        let contents = yaml::render_documents(&path, &[crd])?;
        Ok(GeneratedFile { path, contents })
    })
    .collect()
}

/// Every CRD, those with a declared conversion calling it at `target` (the caBundle is the
/// manager's to fill in, as for the admission webhooks).
///
/// # Errors
/// [`Error::Crds`] when a type's versions cannot be merged into one CRD.
pub fn crds(target: &WebhookTarget) -> Result<Vec<CustomResourceDefinition>, Error> {
    let mut crds = apis::crds().map_err(|e| Error::Crds(e.to_string()))?;
    let conversions = kube_operator_runtime::conversions(&controllers::all());
    for crd in &mut crds {
        let name = crd.metadata.name.as_deref().unwrap_or_default();
        if conversions.iter().any(|c| c.crd_name == name) {
            crd.spec.conversion = Some(conversion(target));
        }
    }
    Ok(crds)
}

fn conversion(target: &WebhookTarget) -> CustomResourceConversion {
    let client_config = match target {
        WebhookTarget::Service { namespace } => WebhookClientConfig {
            service: Some(ServiceReference {
                name: product::WEBHOOK_SERVICE.to_owned(),
                namespace: namespace.clone(),
                path: Some(CONVERSION_PATH.to_owned()),
                port: Some(SERVICE_PORT),
            }),
            ..WebhookClientConfig::default()
        },
        WebhookTarget::Url { base } => WebhookClientConfig {
            url: Some(format!("{}{CONVERSION_PATH}", base.trim_end_matches('/'))),
            ..WebhookClientConfig::default()
        },
    };
    CustomResourceConversion {
        strategy: "Webhook".to_owned(),
        webhook: Some(WebhookConversion {
            client_config: Some(client_config),
            conversion_review_versions: vec!["v1".to_owned()],
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memcached_converts_through_the_webhook_service_and_myapp_needs_none() {
        let crds = crds(&WebhookTarget::Service {
            namespace: NAMESPACE.to_owned(),
        })
        .expect("CRDs");
        let memcached = crds
            .iter()
            .find(|c| c.spec.names.kind == "Memcached")
            .expect("Memcached");
        let conversion = memcached.spec.conversion.as_ref().expect("a conversion");
        assert_eq!(conversion.strategy, "Webhook");
        let webhook = conversion.webhook.as_ref().expect("a webhook");
        let service = webhook
            .client_config
            .as_ref()
            .and_then(|c| c.service.as_ref())
            .expect("a service");
        assert_eq!(service.path.as_deref(), Some(CONVERSION_PATH));
        assert_eq!(service.port, Some(SERVICE_PORT));
        let myapp = crds
            .iter()
            .find(|c| c.spec.names.kind == "MyApp")
            .expect("MyApp");
        assert!(myapp.spec.conversion.is_none());
    }

    #[test]
    fn a_url_target_converts_at_the_base() {
        let crds = crds(&WebhookTarget::Url {
            base: "https://127.0.0.1:19443".to_owned(),
        })
        .expect("CRDs");
        let url = crds[0]
            .spec
            .conversion
            .as_ref()
            .and_then(|c| c.webhook.as_ref())
            .and_then(|w| w.client_config.as_ref())
            .and_then(|c| c.url.clone());
        assert_eq!(url.as_deref(), Some("https://127.0.0.1:19443/convert"));
    }
}
