//! The local control plane itself, and what it enforces for the manager's manifests: schema
//! validation of the CRDs, Pod Security Admission, RBAC.
//!
//! Run with `cargo xtask cluster up` first, or let `testkit::cluster()` start the cluster.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use localcluster::{LocalCluster, Paths, Up, toolchain::human};
use serde_json::{Value, json};
use testkit::{PodSecurity, TestCluster, TestNamespace};

const TIMEOUT: Duration = Duration::from_secs(90);

fn output_text(out: &Output) -> String {
    format!(
        "exit status {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn memcached_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(product::group!(cache), "v1beta1", "Memcached"),
        "memcacheds",
    )
}

/// Installs the generated CRDs (idempotent; other tests install them too) and waits until the
/// API server serves them.
async fn install_crds(cluster: &TestCluster) -> Result<()> {
    let dir = testkit::deploy_dir().join("crds");
    ensure!(
        dir.is_dir(),
        "{} does not exist; run `cargo xtask manifests`",
        dir.display()
    );
    let applied = testkit::apply_dir(&cluster.client, &dir).await?;
    let crds: Api<CustomResourceDefinition> = Api::all(cluster.client.clone());
    for crd in applied {
        let name = crd.metadata.name.unwrap_or_default();
        testkit::wait_for(
            &format!("CRD {name} to be established"),
            TIMEOUT,
            || async {
                let crd = crds.get(&name).await.map_err(|e| e.to_string())?;
                let established = crd
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                if established {
                    Ok(())
                } else {
                    Err("not established yet".to_owned())
                }
            },
        )
        .await?;
    }
    Ok(())
}

#[tokio::test]
async fn api_server_runs_the_kubernetes_minor_the_workspace_compiles_against() -> Result<()> {
    let cluster = testkit::cluster().await?;
    let info = cluster.client.apiserver_version().await?;
    // k8s-openapi is compiled with the `v1_37` feature.
    assert_eq!(
        (info.major.as_str(), info.minor.as_str()),
        ("1", "37"),
        "{info:?}"
    );
    assert_eq!(info.git_version, localcluster::versions::KUBERNETES);

    let fake = fake_nodes(&cluster).await?.len();
    assert!(fake >= localcluster::FAKE_NODES, "only {fake} fake nodes");
    Ok(())
}

/// The cluster's fake nodes, those marked with [`localcluster::FAKE_NODE_ANNOTATION`].
async fn fake_nodes(cluster: &TestCluster) -> Result<Vec<Node>> {
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    Ok(nodes
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|n| {
            n.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(localcluster::FAKE_NODE_ANNOTATION))
        })
        .collect())
}

/// Whether `ip` is inside `cidr` (`a.b.c.d/n`).
fn contains(cidr: &str, ip: &str) -> Result<bool> {
    let (network, prefix) = cidr
        .split_once('/')
        .with_context(|| format!("{cidr:?} is not a CIDR"))?;
    let network: std::net::Ipv4Addr = network.parse()?;
    let prefix: u32 = prefix.parse()?;
    let ip: std::net::Ipv4Addr = ip.parse()?;
    let mask = u32::MAX.checked_shl(32 - prefix).unwrap_or(0);
    Ok(u32::from(ip) & mask == u32::from(network) & mask)
}

/// Each fake node has its own kwok process: a pod bound to any of them goes Ready, with an
/// address from that node's own pod range, so no two processes hand out the same one.
#[tokio::test]
async fn every_fake_node_runs_its_pods_with_addresses_of_its_own_range() -> Result<()> {
    let cluster = testkit::cluster().await?;
    let ns = TestNamespace::create(&cluster, "fake-nodes").await?;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), ns.name());
    let nodes = fake_nodes(&cluster).await?;
    ensure!(
        nodes.len() == localcluster::FAKE_NODES,
        "{} fake nodes",
        nodes.len()
    );
    let per_node = 2;
    for node in &nodes {
        let node_name = node.metadata.name.clone().unwrap_or_default();
        for i in 0..per_node {
            let pod: Pod = serde_json::from_value(json!({
                "metadata": { "name": format!("{node_name}-{i}"), "labels": { "app": "fake" } },
                "spec": {
                    "nodeName": node_name,
                    "containers": [{ "name": "app", "image": "memcached:1.6-alpine" }],
                },
            }))?;
            pods.create(&PostParams::default(), &pod).await?;
        }
    }
    let expected = nodes.len() * per_node;
    let ready = testkit::wait_for("every pod to be Ready", TIMEOUT, || async {
        let list = pods
            .list(&ListParams::default().labels("app=fake"))
            .await
            .map_err(|e| e.to_string())?;
        let ready: Vec<Pod> = list.items.into_iter().filter(testkit::pod_ready).collect();
        if ready.len() == expected {
            Ok(ready)
        } else {
            Err(format!("{} of {expected} pods Ready", ready.len()))
        }
    })
    .await?;

    let mut addresses = std::collections::BTreeSet::new();
    for pod in &ready {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let node_name = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        let node = nodes
            .iter()
            .find(|n| n.metadata.name == node_name)
            .with_context(|| format!("pod {name} is on {node_name:?}"))?;
        let range = node
            .spec
            .as_ref()
            .and_then(|s| s.pod_cidr.clone())
            .with_context(|| format!("node {node_name:?} has no pod range"))?;
        let ip = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .with_context(|| format!("Ready pod {name} has no address"))?;
        ensure!(
            contains(&range, &ip)?,
            "pod {name} on {node_name:?} has {ip}, outside the node's {range}"
        );
        ensure!(addresses.insert(ip.clone()), "{ip} is given to two pods");
    }
    ns.delete().await?;
    Ok(())
}

#[tokio::test]
async fn deploy_manifests_are_accepted_by_a_server_side_dry_run() -> Result<()> {
    let cluster = testkit::cluster().await?;
    let deploy = testkit::deploy_dir();
    ensure!(
        deploy.join("kustomization.yaml").is_file(),
        "{} has no kustomization.yaml; run `cargo xtask manifests`",
        deploy.display()
    );

    // The CRDs on their own, before anything is installed.
    let crds = cluster
        .kubectl()
        .args(["apply", "--dry-run=server", "-k"])
        .arg(deploy.join("crds"))
        .output()
        .context("running kubectl")?;
    ensure!(
        crds.status.success(),
        "CRDs rejected: {}",
        output_text(&crds)
    );

    // A dry run persists nothing, so objects that need the CRDs (samples) or the manager's
    // namespace would fail for reasons that have nothing to do with them: install those first,
    // exactly as `kubectl apply -k` would have a moment earlier.
    install_crds(&cluster).await?;
    let namespaced = deploy.join("namespaced");
    for dir in [&deploy, &namespaced] {
        let kinds = dry_run_kustomization(&cluster, dir).await?;
        println!("{}: {kinds:?}", dir.display());
    }
    Ok(())
}

/// Renders the kustomization in `dir`, installs its Namespaces, and checks that the API server
/// accepts every object of it in a server-side dry run; returns the kinds rendered.
async fn dry_run_kustomization(cluster: &testkit::TestCluster, dir: &Path) -> Result<Vec<String>> {
    let rendered = cluster.kubectl().arg("kustomize").arg(dir).output()?;
    ensure!(
        rendered.status.success(),
        "kustomize {} failed: {}",
        dir.display(),
        output_text(&rendered)
    );
    let objects = testkit::parse_yaml(&String::from_utf8_lossy(&rendered.stdout), dir)?;
    ensure!(!objects.is_empty(), "kustomize rendered nothing");
    let namespaces: Vec<DynamicObject> = objects
        .iter()
        .filter(|o| o.types.as_ref().is_some_and(|t| t.kind == "Namespace"))
        .cloned()
        .collect();
    testkit::apply_objects(&cluster.client, namespaces, None).await?;

    let out = cluster
        .kubectl()
        .args(["apply", "--dry-run=server", "-k"])
        .arg(dir)
        .output()
        .context("running kubectl")?;
    ensure!(
        out.status.success(),
        "`kubectl apply --dry-run=server -k {}` failed: {}",
        dir.display(),
        output_text(&out)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let accepted = stdout
        .lines()
        .filter(|l| l.ends_with("(server dry run)"))
        .count();
    assert_eq!(
        accepted,
        objects.len(),
        "every rendered object is accepted:\n{stdout}"
    );
    Ok(objects
        .iter()
        .filter_map(|o| o.types.as_ref().map(|t| t.kind.clone()))
        .collect())
}

#[tokio::test]
async fn the_namespaced_overlay_grants_a_role_and_watches_its_own_namespace() -> Result<()> {
    let cluster = testkit::cluster().await?;
    let dir = testkit::deploy_dir().join("namespaced");
    let rendered = cluster.kubectl().arg("kustomize").arg(&dir).output()?;
    ensure!(rendered.status.success(), "{}", output_text(&rendered));
    let objects = testkit::parse_yaml(&String::from_utf8_lossy(&rendered.stdout), &dir)?;
    let kind = |o: &DynamicObject| o.types.as_ref().map(|t| t.kind.clone()).unwrap_or_default();
    let kinds: Vec<String> = objects.iter().map(kind).collect();
    // Only what secure metrics and the webhooks' certificates need is cluster-wide:
    // TokenReviews and SubjectAccessReviews have no namespace, scrapers are granted a
    // non-resource URL, and the webhook configurations and CRDs are cluster-scoped objects
    // (granted by name). The per-CRD admin, editor and viewer roles are cluster-wide too,
    // but bound to nobody: they are for a platform team to bind its users to.
    let user_role = |name: &str| {
        ["-admin-role", "-editor-role", "-viewer-role"]
            .iter()
            .any(|suffix| name.ends_with(suffix))
    };
    let cluster_wide: Vec<&str> = objects
        .iter()
        .filter(|o| kind(o).starts_with("Cluster"))
        .filter_map(|o| o.metadata.name.as_deref())
        .filter(|name| !user_role(name))
        .collect();
    ensure!(
        cluster_wide
            .iter()
            .all(|name| name.contains("-metrics-") || name.ends_with("-webhook")),
        "no cluster-wide RBAC but the metrics and webhook roles: {cluster_wide:?}"
    );
    let bound: Vec<&str> = objects
        .iter()
        .filter(|o| kind(o) == "ClusterRoleBinding")
        .filter_map(|o| o.data["roleRef"]["name"].as_str())
        .collect();
    ensure!(
        !bound.is_empty() && bound.iter().all(|name| !user_role(name)),
        "the user roles are bound to nobody: {bound:?}"
    );
    for configuration in objects
        .iter()
        .filter(|o| kind(o).ends_with("WebhookConfiguration"))
    {
        let hooks = configuration.data["webhooks"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        ensure!(
            !hooks.is_empty()
                && hooks.iter().all(|hook| {
                    hook["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
                        == product::namespace!()
                }),
            "the webhooks are called for the manager's namespace only: {hooks:?}"
        );
    }
    let manager_role = objects
        .iter()
        .find(|o| kind(o) == "Role" && o.metadata.name.as_deref() == Some(product::name!()));
    ensure!(manager_role.is_some(), "the manager's Role: {kinds:?}");
    let deployment = objects
        .iter()
        .find(|o| kind(o) == "Deployment")
        .context("the manager's Deployment")?;
    let args = &deployment.data["spec"]["template"]["spec"]["containers"][0]["args"];
    ensure!(
        args.as_array()
            .is_some_and(|a| a.iter().any(|a| a == "--namespace=$(POD_NAMESPACE)")),
        "the manager watches its own namespace: {args}"
    );
    Ok(())
}

/// The cert-manager component, added to `deploy/` by an overlay as a user would: the manager
/// serves the mounted certificate instead of provisioning one, and cert-manager's CA injector
/// is asked to fill in both configurations.
#[tokio::test]
async fn the_cert_manager_component_mounts_its_certificate_and_asks_for_injection() -> Result<()> {
    let cluster = testkit::cluster().await?;
    // kustomize only reads below the overlay's root: a copy of deploy/ next to the overlay.
    let dir = std::env::temp_dir().join(testkit::unique_name("certmanager-overlay"));
    let result = async {
        std::fs::create_dir_all(dir.join("overlay"))?;
        let copied = std::process::Command::new("cp")
            .arg("-r")
            .arg(testkit::deploy_dir())
            .arg(dir.join("deploy"))
            .status()?;
        ensure!(copied.success(), "copying deploy/ failed: {copied}");
        std::fs::write(
            dir.join("overlay/kustomization.yaml"),
            "resources: [../deploy]\ncomponents: [../deploy/certmanager]\n",
        )?;
        let overlay = dir.join("overlay");
        let rendered = cluster.kubectl().arg("kustomize").arg(&overlay).output()?;
        ensure!(rendered.status.success(), "{}", output_text(&rendered));
        let objects = testkit::parse_yaml(&String::from_utf8_lossy(&rendered.stdout), &overlay)?;
        let kind = |o: &DynamicObject| o.types.as_ref().map(|t| t.kind.clone()).unwrap_or_default();
        ensure!(
            objects.iter().any(|o| kind(o) == "Certificate")
                && objects.iter().any(|o| kind(o) == "Issuer"),
            "an Issuer and a Certificate"
        );
        let deployment = objects
            .iter()
            .find(|o| kind(o) == "Deployment")
            .context("the manager's Deployment")?;
        let container = &deployment.data["spec"]["template"]["spec"]["containers"][0];
        ensure!(
            container["args"].as_array().is_some_and(|args| args
                .iter()
                .any(|a| a == "--webhook-cert-path=/tmp/k8s-webhook-server/serving-certs")),
            "the manager serves the mounted certificate: {container}"
        );
        ensure!(
            container["volumeMounts"][0]["mountPath"] == "/tmp/k8s-webhook-server/serving-certs",
            "mounted where it is read: {container}"
        );
        for configuration in objects.iter().filter(|o| {
            kind(o).ends_with("WebhookConfiguration")
                || o.metadata.name.as_deref()
                    == Some(concat!("memcacheds.", product::group!(cache)))
        }) {
            let annotations = configuration
                .metadata
                .annotations
                .clone()
                .unwrap_or_default();
            ensure!(
                annotations
                    .get("cert-manager.io/inject-ca-from")
                    .map(String::as_str)
                    == Some(concat!(
                        product::namespace!(),
                        "/",
                        product::name!(),
                        "-webhook-serving-cert"
                    )),
                "{:?} asks for the CA: {annotations:?}",
                configuration.metadata.name
            );
        }
        Ok(())
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// Creates a Memcached with the given spec (no spec when `None`), returning the API server's
/// answer.
async fn create_memcached(
    api: &Api<DynamicObject>,
    name: &str,
    spec: Option<Value>,
) -> kube::Result<DynamicObject> {
    let mut body = json!({
        "apiVersion": concat!(product::group!(cache), "/v1beta1"),
        "kind": "Memcached",
        "metadata": { "name": name },
    });
    if let Some(spec) = spec {
        body["spec"] = spec;
    }
    let obj: DynamicObject = serde_json::from_value(body).map_err(kube::Error::SerdeError)?;
    api.create(&PostParams::default(), &obj).await
}

#[tokio::test]
async fn invalid_memcached_objects_are_rejected_with_the_validation_message() -> Result<()> {
    let cluster = testkit::cluster().await?;
    install_crds(&cluster).await?;
    let ns = TestNamespace::create(&cluster, "mc-validation").await?;
    let api: Api<DynamicObject> =
        Api::namespaced_with(cluster.client.clone(), ns.name(), &memcached_resource());

    let cases = [
        (
            "negative",
            Some(json!({ "size": -1 })),
            "should be greater than or equal to 0",
        ),
        (
            "too-large",
            Some(json!({ "size": 101 })),
            "should be less than or equal to 100",
        ),
        (
            "not-a-number",
            Some(json!({ "size": "three" })),
            "must be of type integer",
        ),
        ("no-size", Some(json!({})), "spec.size: Required value"),
    ];
    for (name, spec, expected) in cases {
        match create_memcached(&api, name, spec.clone()).await {
            Ok(_) => bail!("Memcached {name} with spec {spec:?} was accepted"),
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 422, "{name}: {status:?}");
                assert_eq!(status.reason, "Invalid", "{name}: {status:?}");
                assert!(
                    status.message.contains("spec.size") && status.message.contains(expected),
                    "{name}: expected a message about spec.size containing {expected:?}, got: {}",
                    status.message
                );
                println!("{name}: rejected: {}", status.message);
            }
            Err(other) => bail!("{name}: unexpected error {other}"),
        }
    }

    create_memcached(&api, "valid", Some(json!({ "size": 3 })))
        .await
        .context("a valid Memcached must be accepted")?;
    let out = cluster
        .kubectl()
        .args(["get", "mc", "-n", ns.name()])
        .output()?;
    ensure!(
        out.status.success(),
        "kubectl get mc failed: {}",
        output_text(&out)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    println!("{table}");
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        ["NAME", "SIZE", "MEMORY", "READY", "AVAILABLE", "AGE"],
        "printer columns:\n{table}"
    );
    let row: Vec<&str> = table
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(row.first().copied(), Some("valid"), "{table}");
    assert_eq!(
        row.get(1).copied(),
        Some("3"),
        "the Size column shows spec.size:\n{table}"
    );
    Ok(())
}

/// A Deployment of `replicas` pods whose containers satisfy (or not) the `restricted` Pod
/// Security Standard.
fn deployment(name: &str, replicas: i32, compliant: bool) -> Result<Deployment> {
    let container_security = if compliant {
        json!({
            "allowPrivilegeEscalation": false,
            "capabilities": { "drop": ["ALL"] },
            "runAsNonRoot": true,
            "runAsUser": 11211,
            "seccompProfile": { "type": "RuntimeDefault" },
        })
    } else {
        json!({ "privileged": true })
    };
    Ok(serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": { "name": name },
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": { "app": name } },
            "template": {
                "metadata": { "labels": { "app": name } },
                "spec": {
                    "containers": [{
                        "name": "app",
                        "image": "memcached:1.6-alpine",
                        "securityContext": container_security,
                    }],
                },
            },
        },
    }))?)
}

#[tokio::test]
async fn restricted_namespace_runs_compliant_pods_and_refuses_others() -> Result<()> {
    let cluster = testkit::cluster().await?;
    let ns = TestNamespace::with_pod_security(&cluster, "pss", PodSecurity::Restricted).await?;
    let deployments: Api<Deployment> = Api::namespaced(cluster.client.clone(), ns.name());
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), ns.name());
    let replica_sets: Api<ReplicaSet> = Api::namespaced(cluster.client.clone(), ns.name());

    deployments
        .create(&PostParams::default(), &deployment("compliant", 2, true)?)
        .await?;
    testkit::wait_for(
        "the compliant Deployment to be available",
        TIMEOUT,
        || async {
            let d = deployments
                .get("compliant")
                .await
                .map_err(|e| e.to_string())?;
            let available = d.status.and_then(|s| s.available_replicas).unwrap_or(0);
            if available == 2 {
                Ok(())
            } else {
                Err(format!("{available} of 2 replicas available"))
            }
        },
    )
    .await?;
    let running = pods
        .list(&ListParams::default().labels("app=compliant"))
        .await?;
    assert_eq!(running.items.len(), 2);
    for pod in &running.items {
        let status = pod.status.as_ref();
        assert_eq!(status.and_then(|s| s.phase.as_deref()), Some("Running"));
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        assert!(
            node.starts_with("kwok-node-"),
            "scheduled to a fake node, not {node:?}"
        );
    }

    // The API server accepts the Deployment (it only warns), but refuses its pods.
    deployments
        .create(&PostParams::default(), &deployment("privileged", 1, false)?)
        .await?;
    let message = testkit::wait_for("the ReplicaSet to report FailedCreate", TIMEOUT, || async {
        let list = replica_sets
            .list(&ListParams::default().labels("app=privileged"))
            .await
            .map_err(|e| e.to_string())?;
        list.items
            .iter()
            .flat_map(|rs| rs.status.iter().flat_map(|s| s.conditions.iter().flatten()))
            .find(|c| {
                c.type_.as_deref() == Some("ReplicaFailure")
                    && c.reason.as_deref() == Some("FailedCreate")
            })
            .and_then(|c| c.message.clone())
            .ok_or_else(|| {
                format!(
                    "{} ReplicaSets, none with ReplicaFailure yet",
                    list.items.len()
                )
            })
    })
    .await?;
    println!("refused: {message}");
    assert!(
        message.contains("violates PodSecurity \"restricted:latest\""),
        "{message}"
    );
    let refused = pods
        .list(&ListParams::default().labels("app=privileged"))
        .await?;
    assert!(
        refused.items.is_empty(),
        "no pod of the privileged Deployment exists"
    );
    Ok(())
}

#[tokio::test]
async fn service_account_tokens_carry_only_their_rbac_permissions() -> Result<()> {
    let cluster = testkit::cluster().await?;
    let ns = TestNamespace::create(&cluster, "rbac").await?;
    let sa = testkit::wait_for("the namespace's default ServiceAccount", TIMEOUT, || {
        testkit::service_account_kubeconfig(&cluster, ns.name(), "default")
    })
    .await?;
    let client = localcluster::client_from_kubeconfig(&sa.path).await?;
    match Api::<Node>::all(client).list(&ListParams::default()).await {
        Ok(_) => bail!("the default ServiceAccount must not list nodes"),
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 403, "{status:?}");
            assert!(
                status
                    .message
                    .contains(&format!("system:serviceaccount:{}:default", ns.name())),
                "the request was authenticated as the ServiceAccount: {}",
                status.message
            );
        }
        Err(other) => bail!("unexpected error {other}"),
    }
    Ok(())
}

#[tokio::test]
async fn the_manager_service_account_gets_exactly_the_generated_rbac() -> Result<()> {
    let cluster = testkit::cluster().await?;
    let identity = testkit::manager_kubeconfig(&cluster, &testkit::deploy_dir()).await?;
    println!(
        "kubeconfig for {}/{}: {}",
        identity.namespace,
        identity.service_account,
        identity.path.display()
    );
    let client = localcluster::client_from_kubeconfig(&identity.path).await?;

    // The leader-election Role: leases in the manager's namespace.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), &identity.namespace);
    leases
        .list(&ListParams::default())
        .await
        .context("listing leases as the manager")?;

    // Nothing grants Secrets.
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client, "kube-system");
    match secrets.list(&ListParams::default()).await {
        Ok(_) => bail!("the manager's ServiceAccount must not read Secrets"),
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 403, "{status:?}");
            let user = format!(
                "system:serviceaccount:{}:{}",
                identity.namespace, identity.service_account
            );
            assert!(status.message.contains(&user), "{}", status.message);
        }
        Err(other) => bail!("unexpected error {other}"),
    }
    Ok(())
}

/// The generated user roles, through the API server's own authorizer: a namespace's editors
/// (bound to the built-in `edit`) may change its custom resources but not their status, and
/// may not create Tenants; its viewers only read.
#[tokio::test]
async fn the_built_in_roles_grant_the_generated_user_roles() -> Result<()> {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
    };
    use k8s_openapi::api::rbac::v1::{RoleBinding, RoleRef, Subject};

    let cluster = testkit::cluster().await?;
    // The user roles alone: the rest of the RBAC is the manager's, in a namespace this test
    // need not make.
    for file in testkit::yaml_files(&testkit::deploy_dir().join("rbac"))? {
        let name = file
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if ["_admin_role.yaml", "_editor_role.yaml", "_viewer_role.yaml"]
            .iter()
            .any(|suffix| name.ends_with(suffix))
        {
            testkit::apply_yaml_file(&cluster.client, &file).await?;
        }
    }
    let ns = TestNamespace::create(&cluster, "user-roles").await?;
    let bindings: Api<RoleBinding> = Api::namespaced(cluster.client.clone(), ns.name());
    for (user, role) in [("alice", "edit"), ("bob", "view")] {
        let binding = RoleBinding {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("{user}-{role}")),
                ..Default::default()
            },
            role_ref: RoleRef {
                api_group: Some("rbac.authorization.k8s.io".to_owned()),
                kind: "ClusterRole".to_owned(),
                name: role.to_owned(),
            },
            subjects: Some(vec![Subject {
                kind: "User".to_owned(),
                name: user.to_owned(),
                api_group: Some("rbac.authorization.k8s.io".to_owned()),
                ..Default::default()
            }]),
        };
        bindings.create(&PostParams::default(), &binding).await?;
    }
    let reviews: Api<SubjectAccessReview> = Api::all(cluster.client.clone());
    let may = |user: &'static str,
               verb: &'static str,
               group: &'static str,
               resource: &'static str,
               subresource: Option<&'static str>,
               namespaced: bool| {
        let reviews = reviews.clone();
        let namespace = namespaced.then(|| ns.name().to_owned());
        async move {
            let review = SubjectAccessReview {
                spec: SubjectAccessReviewSpec {
                    user: Some(user.to_owned()),
                    resource_attributes: Some(ResourceAttributes {
                        group: Some(group.to_owned()),
                        resource: Some(resource.to_owned()),
                        subresource: subresource.map(str::to_owned),
                        verb: Some(verb.to_owned()),
                        namespace,
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ..Default::default()
            };
            let answer = reviews.create(&PostParams::default(), &review).await?;
            anyhow::Ok(answer.status.is_some_and(|s| s.allowed))
        }
    };
    let cache = product::group!(cache);
    let platform = product::group!(platform);
    // The cluster's aggregation controller fills `edit` and `view` in a moment.
    testkit::wait_for(
        "edit and view to aggregate the user roles",
        TIMEOUT,
        || async {
            let editor = may("alice", "create", cache, "memcacheds", None, true).await;
            let viewer = may("bob", "list", cache, "keyvaluestores", None, true).await;
            match (editor, viewer) {
                (Ok(true), Ok(true)) => Ok(()),
                other => Err(format!("not yet: {other:?}")),
            }
        },
    )
    .await?;
    for (user, verb, group, resource, subresource, namespaced, allowed) in [
        ("alice", "delete", cache, "memcacheds", None, true, true),
        (
            "alice",
            "patch",
            cache,
            "memcacheds",
            Some("status"),
            true,
            false,
        ),
        (
            "alice",
            "get",
            cache,
            "memcacheds",
            Some("status"),
            true,
            true,
        ),
        ("alice", "create", platform, "tenants", None, false, false),
        ("bob", "get", cache, "memcacheds", None, true, true),
        ("bob", "create", cache, "memcacheds", None, true, false),
        ("bob", "list", platform, "tenants", None, false, false),
    ] {
        let answer = may(user, verb, group, resource, subresource, namespaced).await?;
        ensure!(
            answer == allowed,
            "{user} {verb} {group}/{resource}{}: allowed {answer}, expected {allowed}",
            subresource.map(|s| format!("/{s}")).unwrap_or_default()
        );
    }
    Ok(())
}

/// Starts a second, independent cluster from the cached binaries to exercise the whole
/// lifecycle and measure a warm start, without disturbing the shared cluster other tests use.
#[tokio::test]
async fn a_second_cluster_starts_reports_and_stops() -> Result<()> {
    // Make sure the binaries are built (by this or an earlier run).
    let shared = testkit::cluster().await?;
    let binaries = localcluster::Binaries::in_dir(&shared.state.bin_dir);
    match binaries.recorded_build_time() {
        Some(t) => println!(
            "build time of the cached control plane, recorded when it was built: {}",
            human(t)
        ),
        None => println!("build time of the cached control plane: not recorded"),
    }

    let scratch = std::env::temp_dir().join(testkit::unique_name("second-cluster"));
    let state_dir = scratch.join("cluster");
    // The real node belongs to the shared cluster (one bridge and one kubelet per machine).
    let cluster = LocalCluster::new(Paths::from_env()?.with_state_dir(&state_dir))
        .without_real_node()
        .with_progress(|line| println!("[second cluster] {line}"));
    let result = lifecycle(&cluster, &state_dir).await;
    if result.is_err() {
        print_logs(&state_dir.join("logs"));
    }
    // Whatever happened, leave nothing running.
    let stopped = cluster.down().await;
    std::fs::remove_dir_all(&scratch)?;
    result?;
    ensure!(!stopped?, "the cluster was already down");
    Ok(())
}

/// Prints the end of every log in `dir`, before `down` removes them.
fn print_logs(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        println!("--- {} (last 20 lines)", entry.path().display());
        for line in &lines[lines.len().saturating_sub(20)..] {
            println!("{line}");
        }
    }
}

async fn lifecycle(cluster: &LocalCluster, state_dir: &Path) -> Result<()> {
    let up = cluster.up().await?;
    let Up::Started {
        state,
        build_time,
        start_time,
    } = up
    else {
        bail!("a fresh state directory cannot hold a running cluster");
    };
    ensure!(build_time.is_none(), "the binaries were cached");
    println!("warm start time: {}", human(start_time));
    // etcd, the API server, the controller manager, the scheduler, and a kwok for each fake
    // node.
    assert_eq!(state.components.len(), 4 + localcluster::FAKE_NODES);

    let again = cluster.up().await?;
    ensure!(
        matches!(again, Up::AlreadyRunning(_)),
        "a second `up` is a no-op"
    );
    let status = cluster.status()?.context("status of a running cluster")?;
    ensure!(status.healthy(), "{status}");
    let text = status.to_string();
    for name in [
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
    ] {
        ensure!(text.contains(name), "status names {name}:\n{text}");
    }
    assert_eq!(cluster.kubeconfig()?, state.kubeconfig);
    let client = cluster.client().await?;
    let nodes = Api::<Node>::all(client)
        .list(&ListParams::default())
        .await?;
    assert_eq!(nodes.items.len(), localcluster::FAKE_NODES);

    ensure!(cluster.down().await?, "down stops a running cluster");
    for c in &state.components {
        ensure!(
            !c.alive(),
            "{} (pid {}) still runs after down",
            c.name,
            c.pid
        );
    }
    ensure!(!state_dir.exists(), "down removes the state");
    ensure!(cluster.status()?.is_none());
    ensure!(
        matches!(cluster.kubeconfig(), Err(localcluster::Error::NotRunning)),
        "no kubeconfig without a cluster"
    );
    Ok(())
}
