//! The cluster's certificates and service-account keys, generated fresh for every cluster.
//!
//! One CA signs the API server's serving certificate (for `127.0.0.1`, `localhost` and the
//! in-cluster names) and a client certificate per identity. Client identities follow what
//! kubeadm sets up, so the built-in RBAC bindings apply unchanged.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use crate::{Error, Result};

/// A client identity: its file stem, user name (CN) and groups (O).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Identity {
    pub file: &'static str,
    pub user: &'static str,
    pub groups: &'static [&'static str],
}

/// The cluster administrator (bound to `cluster-admin` through `system:masters`).
pub(crate) const ADMIN: Identity = Identity {
    file: "admin",
    user: "kubernetes-admin",
    groups: &["system:masters"],
};
/// kube-controller-manager, as kubeadm names it (RBAC role `system:kube-controller-manager`).
pub(crate) const CONTROLLER_MANAGER: Identity = Identity {
    file: "kube-controller-manager",
    user: "system:kube-controller-manager",
    groups: &[],
};
/// kube-scheduler, as kubeadm names it (RBAC role `system:kube-scheduler`).
pub(crate) const SCHEDULER: Identity = Identity {
    file: "kube-scheduler",
    user: "system:kube-scheduler",
    groups: &[],
};
/// kwok plays every kubelet and more (it writes node and pod status for all fake nodes), so it
/// runs as an administrator, like kwok's own cluster tooling does.
pub(crate) const KWOK: Identity = Identity {
    file: "kwok",
    user: "kwok-controller",
    groups: &["system:masters"],
};

/// The real node's kubelet: the Node authorizer lets `system:node:<name>` in `system:nodes`
/// manage its own node and pods.
pub(crate) const KUBELET: Identity = Identity {
    file: "kubelet",
    user: "system:node:real-node",
    groups: &["system:nodes"],
};
/// kube-proxy, as kubeadm names it (bound to `system:node-proxier` by default).
pub(crate) const KUBE_PROXY: Identity = Identity {
    file: "kube-proxy",
    user: "system:kube-proxy",
    groups: &[],
};
/// The API server's identity towards kubelets (logs, exec, port-forward).
pub(crate) const APISERVER_KUBELET_CLIENT: Identity = Identity {
    file: "apiserver-kubelet-client",
    user: "kube-apiserver-kubelet-client",
    groups: &["system:masters"],
};

/// Paths of the generated files.
#[derive(Debug, Clone)]
pub(crate) struct Pki {
    dir: PathBuf,
}

impl Pki {
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }
    pub fn ca_key(&self) -> PathBuf {
        self.dir.join("ca.key")
    }
    pub fn serving_cert(&self) -> PathBuf {
        self.dir.join("apiserver.crt")
    }
    pub fn serving_key(&self) -> PathBuf {
        self.dir.join("apiserver.key")
    }
    pub fn client_cert(&self, id: Identity) -> PathBuf {
        self.dir.join(format!("{}.crt", id.file))
    }
    pub fn client_key(&self, id: Identity) -> PathBuf {
        self.dir.join(format!("{}.key", id.file))
    }
    pub fn service_account_key(&self) -> PathBuf {
        self.dir.join("sa.key")
    }
    pub fn service_account_pub(&self) -> PathBuf {
        self.dir.join("sa.pub")
    }
    /// The real node's registry's serving certificate, for its address (issued only with a
    /// real node).
    pub fn registry_cert(&self) -> PathBuf {
        self.dir.join("registry.crt")
    }
    pub fn registry_key(&self) -> PathBuf {
        self.dir.join("registry.key")
    }
    /// A directory that holds the CA's certificate and nothing else: what `SSL_CERT_DIR` names
    /// for a program to trust the cluster's registry.
    pub fn trusted_dir(&self) -> PathBuf {
        self.dir.join("trusted")
    }

    /// Generates everything into `dir`.
    ///
    /// `service_ip` is the first address of the service range: the `kubernetes` Service's
    /// ClusterIP, which the serving certificate must name.
    /// `node_ip`, when the real node runs, is its address: pods may reach the API server there.
    pub fn generate(dir: &Path, service_ip: Ipv4Addr, node_ip: Option<Ipv4Addr>) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(Error::io("creating", dir))?;
        let pki = Self {
            dir: dir.to_owned(),
        };
        let cert_err = |what| move |source| Error::Certificate { what, source };

        let ca_key = KeyPair::generate().map_err(cert_err("the CA key"))?;
        let mut ca_params = CertificateParams::default();
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "operator-manager-local-ca");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params
            .self_signed(&ca_key)
            .map_err(cert_err("the CA certificate"))?;
        write(&pki.ca_cert(), &ca_cert.pem())?;
        write(&pki.ca_key(), &ca_key.serialize_pem())?;
        let issuer = Issuer::new(ca_params, ca_key);

        let serving_names = [
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ];
        let mut params = CertificateParams::new(serving_names.map(String::from).to_vec())
            .map_err(cert_err("the serving certificate"))?;
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(service_ip)));
        if let Some(ip) = node_ip {
            params
                .subject_alt_names
                .push(SanType::IpAddress(IpAddr::V4(ip)));
        }
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let key = KeyPair::generate().map_err(cert_err("the serving key"))?;
        let cert = params
            .signed_by(&key, &issuer)
            .map_err(cert_err("the serving certificate"))?;
        write(&pki.serving_cert(), &cert.pem())?;
        write(&pki.serving_key(), &key.serialize_pem())?;

        for id in [
            ADMIN,
            CONTROLLER_MANAGER,
            SCHEDULER,
            KWOK,
            KUBELET,
            KUBE_PROXY,
            APISERVER_KUBELET_CLIENT,
        ] {
            let mut params = CertificateParams::default();
            params.distinguished_name.push(DnType::CommonName, id.user);
            for group in id.groups {
                params
                    .distinguished_name
                    .push(DnType::OrganizationName, *group);
            }
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            params.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            let key = KeyPair::generate().map_err(cert_err("a client key"))?;
            let cert = params
                .signed_by(&key, &issuer)
                .map_err(cert_err("a client certificate"))?;
            write(&pki.client_cert(id), &cert.pem())?;
            write(&pki.client_key(id), &key.serialize_pem())?;
        }

        if let Some(ip) = node_ip {
            let mut params = CertificateParams::default();
            params.subject_alt_names = vec![SanType::IpAddress(IpAddr::V4(ip))];
            params
                .distinguished_name
                .push(DnType::CommonName, "operator-manager-local-registry");
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
            params.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            let key = KeyPair::generate().map_err(cert_err("the registry's key"))?;
            let cert = params
                .signed_by(&key, &issuer)
                .map_err(cert_err("the registry's certificate"))?;
            write(&pki.registry_cert(), &cert.pem())?;
            write(&pki.registry_key(), &key.serialize_pem())?;
            let trusted = pki.trusted_dir();
            std::fs::create_dir_all(&trusted).map_err(Error::io("creating", &trusted))?;
            write(&trusted.join("ca.crt"), &ca_cert.pem())?;
        }

        let sa = KeyPair::generate().map_err(cert_err("the service-account key"))?;
        write(&pki.service_account_key(), &sa.serialize_pem())?;
        write(&pki.service_account_pub(), &sa.public_key_pem())?;
        Ok(pki)
    }
}

/// Writes a file readable by its owner only (keys and kubeconfigs are secrets; certificates do
/// not mind).
pub(crate) fn write(path: &Path, contents: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .map_err(Error::io("writing", path))?;
    file.write_all(contents.as_bytes())
        .map_err(Error::io("writing", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubelet_is_the_real_node() {
        assert_eq!(
            KUBELET.user,
            format!("system:node:{}", crate::node::NODE_NAME)
        );
        assert_eq!(KUBELET.groups, ["system:nodes"]);
    }

    #[test]
    fn generates_every_file() {
        let dir = std::env::temp_dir().join(format!("localcluster-pki-{}", std::process::id()));
        let pki = Pki::generate(
            &dir,
            Ipv4Addr::new(10, 96, 0, 1),
            Some(Ipv4Addr::new(10, 85, 0, 1)),
        )
        .expect("generate");
        for path in [
            pki.ca_cert(),
            pki.ca_key(),
            pki.serving_cert(),
            pki.serving_key(),
            pki.client_cert(ADMIN),
            pki.client_key(KWOK),
            pki.client_cert(KUBELET),
            pki.client_key(APISERVER_KUBELET_CLIENT),
            pki.service_account_key(),
            pki.service_account_pub(),
            pki.registry_cert(),
            pki.registry_key(),
            pki.trusted_dir().join("ca.crt"),
        ] {
            let text = std::fs::read_to_string(&path).expect("read");
            assert!(
                text.starts_with("-----BEGIN "),
                "{} is not PEM",
                path.display()
            );
        }
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
