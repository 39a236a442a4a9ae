//! Writing kubeconfig files, for the control plane's own components and for tests.

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::{Error, Result};

/// How a kubeconfig's user authenticates.
#[derive(Clone)]
pub enum Credentials {
    /// A client certificate and its key (files).
    ClientCertificate {
        /// The PEM certificate.
        cert: PathBuf,
        /// The PEM private key.
        key: PathBuf,
    },
    /// A bearer token, e.g. a ServiceAccount token from the TokenRequest API.
    Token(String),
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::ClientCertificate { cert, key } => f
                .debug_struct("ClientCertificate")
                .field("cert", cert)
                .field("key", key)
                .finish(),
            Self::Token(_) => f.write_str("Token(<redacted>)"),
        }
    }
}

/// A kubeconfig with one cluster, one user and one context, all named `name`.
#[derive(Debug, Clone)]
pub struct KubeconfigSpec {
    /// The name of the cluster, user and context.
    pub name: String,
    /// The API server URL.
    pub server: String,
    /// The CA certificate file that signed the API server's certificate.
    pub certificate_authority: PathBuf,
    /// How the user authenticates.
    pub credentials: Credentials,
    /// The context's default namespace.
    pub namespace: Option<String>,
}

impl KubeconfigSpec {
    /// Renders the kubeconfig as YAML.
    ///
    /// # Errors
    /// [`Error::Render`] if serialisation fails.
    pub fn render(&self) -> Result<String> {
        let user = match &self.credentials {
            Credentials::ClientCertificate { cert, key } => json!({
                "client-certificate": cert,
                "client-key": key,
            }),
            Credentials::Token(token) => json!({ "token": token }),
        };
        let mut context = json!({ "cluster": self.name, "user": self.name });
        if let Some(ns) = &self.namespace {
            context["namespace"] = json!(ns);
        }
        let doc = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{
                "name": self.name,
                "cluster": {
                    "server": self.server,
                    "certificate-authority": self.certificate_authority,
                },
            }],
            "users": [{ "name": self.name, "user": user }],
            "contexts": [{ "name": self.name, "context": context }],
            "current-context": self.name,
        });
        yaml_serde::to_string(&doc).map_err(|e| Error::Render {
            what: "a kubeconfig",
            message: e.to_string(),
        })
    }

    /// Writes the kubeconfig to `path`, readable by its owner only (it holds credentials).
    ///
    /// # Errors
    /// [`Error::Render`] or [`Error::Io`].
    pub fn write(&self, path: &Path) -> Result<()> {
        let text = self.render()?;
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(Error::io("creating", parent))?;
        }
        crate::certs::write(path, &text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_a_kubeconfig_kube_can_read() {
        let spec = KubeconfigSpec {
            name: "local".into(),
            server: "https://127.0.0.1:6443".into(),
            certificate_authority: "/tmp/ca.crt".into(),
            credentials: Credentials::Token("abc".into()),
            namespace: Some("ns".into()),
        };
        let text = spec.render().expect("render");
        let parsed = kube::config::Kubeconfig::from_yaml(&text).expect("parse");
        assert_eq!(parsed.current_context.as_deref(), Some("local"));
        assert_eq!(
            parsed.clusters[0]
                .cluster
                .as_ref()
                .and_then(|c| c.server.as_deref()),
            Some("https://127.0.0.1:6443")
        );
        let ctx = parsed.contexts[0].context.as_ref().expect("context");
        assert_eq!(ctx.namespace.as_deref(), Some("ns"));
        assert!(!format!("{:?}", spec.credentials).contains("abc"));
    }
}
