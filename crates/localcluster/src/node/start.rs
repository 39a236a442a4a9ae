//! Starting the real node, once the control plane runs: its image registry, containerd, the
//! sandbox image, the kubelet, kube-proxy and the API server forwarder, each waited for before
//! the next.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};

use super::containerd::Containerd;
use super::host::find_command;
use super::kubelet::{KubeProxy, Kubelet};
use super::registry;
use super::{NODE_IP, NODE_NAME, NodeState, TAINT_KEY};
use crate::certs::Pki;
use crate::cluster::wait;
use crate::state::ClusterState;
use crate::toolchain::{Binaries, PAUSE};
use crate::{Error, LocalCluster, Result, process, versions};

/// The kubeconfigs of the node's components.
#[derive(Debug)]
pub(crate) struct NodeKubeconfigs {
    /// The kubelet's (`system:node:<name>`).
    pub kubelet: PathBuf,
    /// kube-proxy's (`system:kube-proxy`).
    pub kube_proxy: PathBuf,
}

/// The node's share of a cluster's start.
pub(crate) struct NodeStart<'a> {
    pub bin: &'a Binaries,
    pub dir: &'a Path,
    pub pki: &'a Pki,
    pub kubeconfigs: NodeKubeconfigs,
    pub api_port: u16,
    pub client: &'a kube::Client,
}

impl LocalCluster {
    /// Starts the real node recorded in `state.node` (its network already made).
    pub(crate) async fn start_node(
        &self,
        start: NodeStart<'_>,
        state: &mut ClusterState,
    ) -> Result<()> {
        let node = state.node.clone().ok_or_else(|| Error::NodePrerequisite {
            problem: "no node directory was recorded".into(),
            fix: "run `cargo xtask cluster down` and start again".into(),
        })?;
        let system = |command: &str| {
            find_command(command).ok_or_else(|| Error::NodePrerequisite {
                problem: format!("`{command}` is not installed"),
                fix: "run `cargo xtask setup`".into(),
            })
        };

        let registry_address = registry::address(process::free_port()?);
        let registry = self.launch(
            state,
            start.dir,
            &system(registry::PROGRAM)?,
            "registry",
            // Not on loopback: `status` shows its address on a line of its own.
            &[],
            registry::prepare(&node, registry_address)?,
        )?;
        wait(
            &format!("the registry to answer on {registry_address}"),
            Duration::from_secs(60),
            &[&registry],
            || registry::ready(registry_address),
        )
        .await?;
        // The same storage over HTTPS, for clients that speak nothing else.
        let https_address = registry::address(process::free_port()?);
        let https = self.launch(
            state,
            start.dir,
            &system(registry::PROGRAM)?,
            "registry-https",
            &[],
            registry::prepare_https(
                &node,
                https_address,
                (&start.pki.registry_cert(), &start.pki.registry_key()),
            )?,
        )?;
        wait(
            &format!("the HTTPS registry to listen on {https_address}"),
            Duration::from_secs(60),
            &[&https],
            || async move {
                tokio::net::TcpStream::connect(https_address)
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            },
        )
        .await?;
        let mut node = node;
        node.registry = Some(registry_address);
        node.registry_https = Some(https_address);
        node.trusted_certificates = Some(start.pki.trusted_dir());
        state.node = Some(node.clone());
        state.save(start.dir)?;
        self.say(&format!(
            "registry (pid {}) serves images on {registry_address}, and over HTTPS (pid {}, the \
             cluster's CA) on {https_address}",
            registry.pid, https.pid
        ));

        let args = Containerd::prepare(&node)?;
        let containerd = self.launch(
            state,
            start.dir,
            &system("containerd")?,
            "containerd",
            &[],
            args,
        )?;
        let socket = node.containerd_socket.clone();
        wait(
            "containerd to answer on its socket",
            Duration::from_secs(60),
            &[&containerd],
            || {
                let socket = socket.clone();
                async move { Containerd::ready(&socket) }
            },
        )
        .await?;
        let pause = pause_image(start.bin, &node)?;
        ociimage::import_into_containerd(&pause.archive, &pause.reference, &socket)?;
        self.say(&format!(
            "containerd (pid {}) runs; loaded the pod sandbox image {}",
            containerd.pid,
            super::pause_image()
        ));

        let (kubelet_port, kubelet_healthz) = (process::free_port()?, process::free_port()?);
        let args = Kubelet::prepare(
            &node,
            &start.kubeconfigs.kubelet,
            &start.pki.ca_cert(),
            kubelet_port,
            kubelet_healthz,
        )?;
        let kubelet = self.launch(
            state,
            start.dir,
            &start.bin.path("kubelet"),
            "kubelet",
            &[("healthz", kubelet_healthz)],
            args,
        )?;
        wait(
            &format!("the kubelet to register node {NODE_NAME} and report it Ready"),
            Duration::from_secs(180),
            &[&containerd, &kubelet],
            || {
                let client = start.client.clone();
                async move { node_ready(&client).await }
            },
        )
        .await?;
        remove_not_ready_taint(start.client).await?;
        self.say(&format!(
            "kubelet (pid {}) registered node {NODE_NAME} ({NODE_IP}), tainted {TAINT_KEY}",
            kubelet.pid
        ));

        let (proxy_healthz, proxy_metrics) = (process::free_port()?, process::free_port()?);
        let kube_proxy = self.launch(
            state,
            start.dir,
            &start.bin.path("kube-proxy"),
            "kube-proxy",
            &[("healthz", proxy_healthz), ("metrics", proxy_metrics)],
            KubeProxy::args(&start.kubeconfigs.kube_proxy, proxy_healthz, proxy_metrics),
        )?;
        let forwarder = self.launch(
            state,
            start.dir,
            &system("socat")?,
            "apiserver-forwarder",
            &[],
            vec![
                format!(
                    "TCP-LISTEN:{},bind={NODE_IP},reuseaddr,fork",
                    start.api_port
                ),
                format!("TCP:127.0.0.1:{}", start.api_port),
            ],
        )?;
        wait(
            "kube-proxy to program the Services (its /healthz)",
            Duration::from_secs(60),
            &[&kube_proxy, &forwarder, &kubelet],
            || async move {
                crate::http::get_ok(
                    std::net::Ipv4Addr::LOCALHOST.into(),
                    proxy_healthz,
                    "/healthz",
                )
                .await
                .map(drop)
            },
        )
        .await?;
        let api = (NODE_IP, start.api_port);
        wait(
            "the API server forwarder to listen on the node's address",
            Duration::from_secs(30),
            &[&forwarder],
            || async move {
                tokio::net::TcpStream::connect(api)
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            },
        )
        .await?;
        self.say(&format!(
            "kube-proxy (pid {}) programs Services in iptables; pods reach the API server \
             through the `kubernetes` Service",
            kube_proxy.pid
        ));
        Ok(())
    }
}

/// Builds the pod sandbox image from the compiled `pause` (skipped when the archive exists).
fn pause_image(bin: &Binaries, node: &NodeState) -> Result<ociimage::BuiltImage> {
    let reference = ociimage::Reference::parse(&super::pause_image())?;
    let config = ociimage::ImageConfig::new(
        // The user upstream's pause image runs as.
        ociimage::User::new("pause", 65535),
        vec!["/pause".into()],
        ociimage::Metadata {
            title: "pause".into(),
            description: "The pod sandbox, compiled from the Kubernetes source".into(),
            version: format!("{}-kubernetes-{}", versions::PAUSE, versions::KUBERNETES),
            ..ociimage::Metadata::default()
        },
    );
    let mut image = ociimage::Image::new(reference, config);
    image.add(ociimage::ImageFile::executable(bin.path(PAUSE), "/pause"))?;
    let archive = node.images_dir().join("pause.oci.tar");
    Ok(image.write(&archive)?)
}

/// Whether the real node is registered and Ready.
async fn node_ready(client: &kube::Client) -> std::result::Result<(), String> {
    let node = Api::<Node>::all(client.clone())
        .get_opt(NODE_NAME)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("node {NODE_NAME} is not registered yet"))?;
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    match ready {
        Some(c) if c.status == "True" => Ok(()),
        Some(c) => Err(format!(
            "node {NODE_NAME} is not Ready: {}",
            c.message.as_deref().unwrap_or(&c.status)
        )),
        None => Err(format!("node {NODE_NAME} reports no Ready condition yet")),
    }
}

/// Removes the `node.kubernetes.io/not-ready` taint that admission puts on every new node (the
/// node lifecycle controller, which would lift it, does not run here); keeps ours.
async fn remove_not_ready_taint(client: &kube::Client) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let action = || format!("removing the not-ready taint of {NODE_NAME}");
    let node = nodes.get(NODE_NAME).await.map_err(|source| Error::Api {
        action: action(),
        source,
    })?;
    let taints: Vec<_> = node
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key != "node.kubernetes.io/not-ready")
        .collect();
    let patch = serde_json::json!({ "spec": { "taints": taints } });
    nodes
        .patch(NODE_NAME, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|source| Error::Api {
            action: action(),
            source,
        })?;
    Ok(())
}
