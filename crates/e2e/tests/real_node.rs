//! Real containers on the local cluster's real node: the Memcached controller's pods run a
//! real memcached (the image `cargo xtask image memcached --load` builds from the
//! distribution's package), which answers the memcached protocol on every pod and through the
//! controller's ClusterIP Service, which kube-proxy programs, and whose name the cluster DNS
//! resolves in a pod.

mod workloads;

use std::net::IpAddr;
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use apis::{Memcached, MemcachedSpec};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::PostParams;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use workloads::{Env, Scope, TIMEOUT};

/// The repository of the memcached image built from the distribution's package.
const MEMCACHED_IMAGE: &str = concat!(product::name!(), ".local/memcached");
/// The shell image `cargo xtask cluster up` loads (the distribution's static busybox).
const BUSYBOX_IMAGE: &str = concat!(product::name!(), ".local/busybox");

#[tokio::test]
async fn memcached_pods_on_the_real_node_store_and_return_keys() -> Result<()> {
    let env = Env::on_real_node("real-memcached", "memcached", Scope::Namespace).await?;
    let result = memcached_round_trips(&env).await;
    env.finish(result)
}

/// A test whose image was never loaded says which image and how to load it, instead of
/// leaving a pod in `ErrImagePull` (the node cannot pull).
#[tokio::test]
async fn an_image_that_is_not_loaded_is_named_with_the_command_that_loads_it() -> Result<()> {
    let cluster = testkit::cluster().await?;
    let error = cluster
        .loaded_image(
            concat!(product::name!(), ".local/never-built"),
            "never-built",
        )
        .expect_err("nothing loads this image");
    let message = error.to_string();
    for expected in [
        concat!(
            "no image ",
            product::name!(),
            ".local/never-built:* is loaded on the real node"
        ),
        // What the node does have, so a misspelt name is easy to see.
        &localcluster::node::pause_image(),
        "`cargo xtask image never-built --load`",
    ] {
        ensure!(message.contains(expected), "{expected:?} in: {message}");
    }
    Ok(())
}

async fn memcached_round_trips(env: &Env) -> Result<()> {
    let image = env.cluster.loaded_image(MEMCACHED_IMAGE, "memcached")?;
    let name = "cache";
    let mc = Memcached::new(
        name,
        MemcachedSpec {
            size: 2,
            image: image.clone(),
            ..Default::default()
        },
    );
    env.api::<Memcached>()
        .create(&PostParams::default(), &mc)
        .await?;

    // The status lists two pods, both Ready: real containers whose readiness the kubelet saw.
    let nodes = testkit::wait_for("2 ready memcached pods in the status", TIMEOUT, || async {
        let mc = env
            .api::<Memcached>()
            .get(name)
            .await
            .map_err(|e| e.to_string())?;
        let status = mc.status.unwrap_or_default();
        if status.nodes.len() == 2 && status.ready_replicas == 2 {
            Ok(status.nodes)
        } else {
            Err(format!(
                "status: nodes {:?}, ready {:?}",
                status.nodes, status.ready_replicas
            ))
        }
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", pod_report(env)))?;

    for pod_name in &nodes {
        let pod = env.api::<Pod>().get(pod_name).await?;
        let spec = pod.spec.clone().unwrap_or_default();
        ensure!(
            spec.node_name.as_deref() == Some(localcluster::node::NODE_NAME),
            "pod {pod_name} runs on {:?}, not on the real node",
            spec.node_name
        );
        let container = spec.containers.first().context("no container")?;
        ensure!(container.image.as_deref() == Some(image.as_str()));
        let ip: IpAddr = pod
            .status
            .and_then(|s| s.pod_ip)
            .with_context(|| format!("pod {pod_name} has no IP"))?
            .parse()?;
        let key = format!("pod-{pod_name}");
        round_trip(ip, &key, pod_name)
            .await
            .with_context(|| format!("memcached protocol on pod {pod_name} ({ip}:11211)"))?;
    }

    // The controller's ClusterIP Service over the pods, named in the status: kube-proxy's rules
    // carry the connection to one of them.
    let service_name = env
        .api::<Memcached>()
        .get(name)
        .await?
        .status
        .and_then(|s| s.service)
        .context("the status names no Service")?;
    let service = env.api::<Service>().get(&service_name).await?;
    let cluster_ip: IpAddr = service
        .spec
        .and_then(|s| s.cluster_ip)
        .context("the Service got no ClusterIP")?
        .parse()?;
    // kube-proxy programs a new Service within a second or so; retry until it has.
    testkit::wait_for(
        "a memcached round trip through the ClusterIP Service",
        Duration::from_secs(60),
        || async {
            round_trip(cluster_ip, "through-the-service", "value")
                .await
                .map_err(|e| format!("{e:#}"))
        },
    )
    .await?;
    resolves_in_a_pod(env, &service_name, cluster_ip).await
}

/// A pod on the real node looks the Service up by its DNS name, through the name server the
/// kubelet gave it (the cluster's CoreDNS), and gets the ClusterIP.
async fn resolves_in_a_pod(env: &Env, service: &str, cluster_ip: IpAddr) -> Result<()> {
    let image = env.cluster.loaded_image(BUSYBOX_IMAGE, "busybox")?;
    let fqdn = format!("{service}.{}.svc.cluster.local", env.namespace());
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "resolve"},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "nslookup", "image": image, "imagePullPolicy": "Never",
                "args": ["-c", format!("nslookup {fqdn}")],
                "securityContext": {"allowPrivilegeEscalation": false,
                                    "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }))?;
    env.api::<Pod>()
        .create(&PostParams::default(), &pod)
        .await?;
    let phase = testkit::wait_for("the nslookup pod to finish", TIMEOUT, || async {
        let pod = env.api::<Pod>().get("resolve").await?;
        match pod.status.and_then(|s| s.phase).as_deref() {
            Some(phase @ ("Succeeded" | "Failed")) => Ok(phase.to_owned()),
            phase => Err(anyhow::anyhow!("phase {phase:?}")),
        }
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", pod_report(env)))?;
    let log = env.kubectl(&["logs", "resolve"])?;
    ensure!(
        phase == "Succeeded" && log.contains(&format!("Address: {cluster_ip}")),
        "nslookup {fqdn} in a pod ended {phase}, wanting {cluster_ip}:\n{log}"
    );
    Ok(())
}

/// Stores `key` = `value` with the memcached text protocol, reads it back, and deletes it.
async fn round_trip(ip: IpAddr, key: &str, value: &str) -> Result<()> {
    let connect = tokio::net::TcpStream::connect((ip, 11211));
    let stream = tokio::time::timeout(Duration::from_secs(5), connect)
        .await
        .context("connecting timed out")??;
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    let mut next = async || -> Result<String> {
        let line = tokio::time::timeout(Duration::from_secs(5), lines.next_line())
            .await
            .context("no answer within 5s")??;
        line.context("the server closed the connection")
    };

    write
        .write_all(format!("set {key} 0 60 {}\r\n{value}\r\n", value.len()).as_bytes())
        .await?;
    let stored = next().await?;
    ensure!(stored == "STORED", "set answered {stored:?}");

    write.write_all(format!("get {key}\r\n").as_bytes()).await?;
    let header = next().await?;
    ensure!(
        header == format!("VALUE {key} 0 {}", value.len()),
        "get answered {header:?}"
    );
    let data = next().await?;
    ensure!(data == value, "get returned {data:?}, not {value:?}");
    let end = next().await?;
    ensure!(end == "END", "get ended with {end:?}");

    write
        .write_all(format!("delete {key}\r\n").as_bytes())
        .await?;
    let deleted = next().await?;
    if deleted != "DELETED" {
        bail!("delete answered {deleted:?}");
    }
    Ok(())
}

/// The test namespace's pods with their node, phase and container states, for a failure message.
fn pod_report(env: &Env) -> String {
    env.kubectl(&["get", "pods", "-o", "wide"])
        .and_then(|pods| {
            let events = env.kubectl(&["get", "events", "--sort-by=.lastTimestamp"])?;
            Ok(format!("pods:\n{pods}\nevents:\n{events}"))
        })
        .unwrap_or_else(|e| format!("(could not list pods: {e})"))
}
