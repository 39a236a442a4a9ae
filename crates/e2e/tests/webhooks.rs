//! Admission webhooks through the real API server, with the manager as a local process: the
//! generated webhook configurations, pointed at the manager on loopback (a URL client config)
//! and limited to this test's namespace, call it for every write of a Memcached or MyApp.
//!
//! The Memcached CRD's conversion is pointed there too for the test's duration, and put back
//! as generated afterwards.
//!
//! One scenario in order, because the configurations are cluster-wide objects with fixed
//! names: the manager provisions its certificate Secret and injects the CA; defaulting and
//! each validation rule through `kubectl apply`; objects written through one version and read
//! through the other, both versions listed; a restart keeps the certificate and admits
//! at once after readiness; a validity shortened to 30 s rotates both the serving certificate
//! and the CA, several times, under a steady stream of writes none of which fails; with the
//! manager down, writes are refused (failure policy `Fail`).

mod webhook_configurations;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use apis::Memcached;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testkit::{ManagerProcess, TestCluster, TestNamespace};
use webhook_configurations::{
    MANAGER_NAMESPACE, gone, install_configurations, provisioned_ca, remove_configurations,
};

/// How long writes are sent while certificates rotate: with a 30 s validity the serving
/// certificate is renewed every 20 s and the CA (valid 120 s) starts its rotation at 60 s.
const ROTATION_WINDOW: Duration = Duration::from_secs(90);

const TIMEOUT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn webhooks_default_validate_survive_a_restart_and_fail_closed() -> Result<()> {
    let cluster = testkit::cluster().await?;
    let identity = testkit::manager_kubeconfig(&cluster, &testkit::deploy_dir()).await?;
    let ns = TestNamespace::create(&cluster, "webhooks").await?;
    let port = testkit::free_port()?;

    // A fresh start: no certificate from an earlier run.
    let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), MANAGER_NAMESPACE);
    gone(
        secrets
            .delete(product::WEBHOOK_CERT_SECRET, &DeleteParams::default())
            .await,
    )?;
    install_configurations(&cluster, &ns, port).await?;
    convert_at(
        &cluster,
        &codegen::WebhookTarget::Url {
            base: format!("https://127.0.0.1:{port}"),
        },
    )
    .await?;

    let mut manager = start(&identity.path, port, &[]).await?;
    let result = scenario(&cluster, &ns, &identity.path, port, &mut manager).await;
    let log = manager.log_text();
    manager.terminate();
    let removed = remove_configurations(&cluster).await.and(
        convert_at(
            &cluster,
            &codegen::WebhookTarget::Service {
                namespace: MANAGER_NAMESPACE.to_owned(),
            },
        )
        .await,
    );
    result.with_context(|| format!("manager log:\n{}", tail(&log, 80)))?;
    removed
}

async fn scenario(
    cluster: &TestCluster,
    ns: &TestNamespace,
    kubeconfig: &Path,
    port: u16,
    manager: &mut Started,
) -> Result<()> {
    // Provisioned and injected: the Secret holds a CA, both configurations carry it.
    let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), MANAGER_NAMESPACE);
    let ca = provisioned_ca(cluster, MANAGER_NAMESPACE).await?;
    let injected = injected_bundles(cluster).await?;
    ensure!(
        injected.iter().all(|bundle| bundle == &ca),
        "every webhook carries the Secret's CA bundle"
    );
    let crd = Api::<CustomResourceDefinition>::all(cluster.client.clone())
        .get(concat!("memcacheds.", product::group!(cache)))
        .await?;
    let crd_bundle = crd
        .spec
        .conversion
        .and_then(|c| c.webhook)
        .and_then(|w| w.client_config)
        .and_then(|c| c.ca_bundle)
        .map(|b| b.0)
        .unwrap_or_default();
    ensure!(
        crd_bundle == ca,
        "the CRD's conversion carries the Secret's CA bundle"
    );
    println!(
        "the manager provisioned its certificate and injected the CA into both configurations"
    );

    // Defaulting: a blank image becomes the default, with a warning to the user.
    let applied = kubectl_apply(cluster, ns, &memcached_yaml("defaulted", " "))?;
    ensure!(applied.status.success(), "applied: {}", text(&applied));
    ensure!(
        stderr(&applied).contains("Warning: spec.image: empty"),
        "kubectl shows the defaulting warning: {}",
        text(&applied)
    );
    let mcs: Api<Memcached> = Api::namespaced(cluster.client.clone(), ns.name());
    let image = mcs.get("defaulted").await?.spec.image;
    ensure!(
        image == apis::memcached::DEFAULT_IMAGE,
        "the blank image was defaulted, got {image:?}"
    );

    // Validation on create, for both types, naming the field and why.
    let refused = kubectl_apply(cluster, ns, &memcached_yaml("bad", "memcached:1.6 -alpine"))?;
    expect_refused(
        &refused,
        "Memcached \"bad\"",
        "spec.image: Invalid value: \"memcached:1.6 -alpine\": not an image reference: it must not contain ' '",
    )?;
    let refused = kubectl_apply(cluster, ns, &myapp_yaml("bad-app", "nginx:"))?;
    expect_refused(
        &refused,
        "MyApp \"bad-app\"",
        "spec.image: Invalid value: \"nginx:\": not an image reference: it has a malformed tag",
    )?;
    // An untagged image is admitted, with a warning.
    let warned = kubectl_apply(cluster, ns, &myapp_yaml("untagged", "nginx"))?;
    ensure!(
        warned.status.success() && stderr(&warned).contains("names no tag or digest"),
        "an untagged image is admitted with a warning: {}",
        text(&warned)
    );
    // The item memory: at least 1Mi, within the memory limit; the request defaulted from it.
    let refused = kubectl_apply(
        cluster,
        ns,
        &memcached_with_memory("too-big", "1Gi", "512Mi"),
    )?;
    expect_refused(
        &refused,
        "Memcached \"too-big\"",
        "spec.memory: Invalid value: \"1Gi\": must fit in spec.resources.limits.memory (512Mi)",
    )?;
    let refused = kubectl_apply(
        cluster,
        ns,
        &memcached_with_memory("too-small", "512Ki", "512Mi"),
    )?;
    expect_refused(
        &refused,
        "Memcached \"too-small\"",
        "spec.memory: Invalid value: \"512Ki\": must be at least 1Mi",
    )?;
    let applied = kubectl_apply(
        cluster,
        ns,
        &memcached_with_memory("sized", "256Mi", "512Mi"),
    )?;
    ensure!(applied.status.success(), "applied: {}", text(&applied));
    let requests = mcs
        .get("sized")
        .await?
        .spec
        .resources
        .and_then(|r| r.requests)
        .unwrap_or_default();
    ensure!(
        requests.get("memory").map(|q| q.0.as_str()) == Some("256Mi"),
        "the memory request was defaulted from spec.memory: {requests:?}"
    );
    // Validation on update.
    let patched = cluster
        .kubectl()
        .args([
            "patch",
            "memcached",
            "defaulted",
            "-n",
            ns.name(),
            "--type=merge",
            "-p",
            r#"{"spec":{"image":"Memcached:1.6"}}"#,
        ])
        .output()?;
    expect_refused(
        &patched,
        "Memcached \"defaulted\"",
        "spec.image: Invalid value: \"Memcached:1.6\": not an image reference",
    )?;
    println!("defaulting and every validation rule answered through the API server");

    conversion(cluster, ns, &mcs).await?;

    // A restart keeps the certificate, and admits as soon as it is ready again.
    manager.process.terminate();
    manager.process.wait_timeout(TIMEOUT).await?;
    *manager = start(kubeconfig, port, &[]).await?;
    let after = provisioned_ca(cluster, MANAGER_NAMESPACE)
        .await
        .context("the certificate Secret survives the restart")?;
    ensure!(after == ca, "the restarted manager kept the CA");
    let applied = kubectl_apply(
        cluster,
        ns,
        &memcached_yaml("after-restart", "memcached:1.6"),
    )?;
    ensure!(
        applied.status.success(),
        "admitted right after readiness: {}",
        text(&applied)
    );
    println!("restarted: the same certificate, admission at once after readiness");

    // A shortened validity: both certificates are replaced, then renewed again and again,
    // while every write keeps being admitted.
    manager.process.terminate();
    manager.process.wait_timeout(TIMEOUT).await?;
    *manager = start(kubeconfig, port, &["--webhook-cert-validity=30s"]).await?;
    let rotation = write_through_rotations(&mcs, &secrets, "after-restart").await?;
    ensure!(
        rotation.failed.is_empty(),
        "{} of {} writes failed while the certificates rotated: {:?}",
        rotation.failed.len(),
        rotation.writes,
        rotation.failed
    );
    ensure!(
        rotation.signers.len() >= 3 && rotation.serving.len() >= 4,
        "expected the CA to change at least twice and the serving certificate at least three \
         times in {ROTATION_WINDOW:?}; saw {} CAs and {} serving certificates",
        rotation.signers.len(),
        rotation.serving.len()
    );
    let bundle = secrets
        .get(product::WEBHOOK_CERT_SECRET)
        .await?
        .data
        .and_then(|data| data.get("ca.crt").cloned())
        .context("the Secret has a ca.crt")?;
    ensure!(
        injected_bundles(cluster)
            .await?
            .iter()
            .all(|b| b == &bundle.0),
        "the configurations carry the rotated bundle"
    );
    println!(
        "rotation: {} writes admitted, none failed, while {} CAs and {} serving certificates took turns",
        rotation.writes,
        rotation.signers.len(),
        rotation.serving.len()
    );

    // Down: the failure policy refuses, it does not admit unchecked.
    manager.process.terminate();
    manager.process.wait_timeout(TIMEOUT).await?;
    let refused = kubectl_apply(cluster, ns, &memcached_yaml("while-down", "memcached:1.6"))?;
    ensure!(
        !refused.status.success() && stderr(&refused).contains("failed calling webhook"),
        "with the manager down, a create is refused: {}",
        text(&refused)
    );
    ensure!(
        mcs.get_opt("while-down").await?.is_none(),
        "nothing was admitted while the manager was down"
    );
    println!("with the manager down, writes are refused (failurePolicy Fail)");
    Ok(())
}

/// What [`write_through_rotations`] saw.
struct Rotation {
    writes: usize,
    failed: Vec<String>,
    signers: BTreeSet<Vec<u8>>,
    serving: BTreeSet<Vec<u8>>,
}

/// For [`ROTATION_WINDOW`], changes an annotation of Memcached `name` (an update every
/// webhook is called for) every 250 ms, and notes each CA and serving certificate the
/// Secret holds along the way.
async fn write_through_rotations(
    mcs: &Api<Memcached>,
    secrets: &Api<Secret>,
    name: &str,
) -> Result<Rotation> {
    let mut rotation = Rotation {
        writes: 0,
        failed: Vec::new(),
        signers: BTreeSet::new(),
        serving: BTreeSet::new(),
    };
    let start = Instant::now();
    while start.elapsed() < ROTATION_WINDOW {
        rotation.writes += 1;
        let patch =
            json!({"metadata": {"annotations": {"e2e/write": rotation.writes.to_string()}}});
        if let Err(error) = mcs
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            rotation
                .failed
                .push(format!("at {:.1}s: {error}", start.elapsed().as_secs_f64()));
        }
        if let Some(data) = secrets.get(product::WEBHOOK_CERT_SECRET).await?.data {
            rotation
                .signers
                .extend(data.get("ca-signer.crt").map(|b| b.0.clone()));
            rotation
                .serving
                .extend(data.get("tls.crt").map(|b| b.0.clone()));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(rotation)
}

/// The manager with its webhooks on `port`, every other endpoint off or on a free port, and
/// `extra` arguments; returns once `/readyz` answers, which it does only once the webhooks are
/// served.
async fn start(kubeconfig: &Path, port: u16, extra: &[&str]) -> Result<Started> {
    let process = webhook_configurations::start_serving_webhooks(kubeconfig, port, extra).await?;
    Ok(Started { process })
}

/// A running manager (a struct so the scenario can replace it in place).
struct Started {
    process: ManagerProcess,
}

impl Started {
    fn log_text(&self) -> String {
        self.process.log_text()
    }

    fn terminate(&self) {
        self.process.terminate();
    }
}

/// The installed Memcached CRD with the generated conversion, calling `target` (a replace:
/// an apply would keep the other client config beside the new one).
async fn convert_at(cluster: &TestCluster, target: &codegen::WebhookTarget) -> Result<()> {
    let generated = codegen::crds::crds(target)?
        .into_iter()
        .find(|crd| crd.spec.names.kind == "Memcached")
        .context("the Memcached CRD")?;
    let name = generated.metadata.name.clone().unwrap_or_default();
    let crds: Api<CustomResourceDefinition> = Api::all(cluster.client.clone());
    let mut installed = crds.get(&name).await?;
    installed.spec.conversion = generated.spec.conversion;
    crds.replace(&name, &PostParams::default(), &installed)
        .await?;
    Ok(())
}

/// Written through one version, read through the other, edited through the old one without
/// losing what only the new one has; `kubectl get` lists both versions.
async fn conversion(cluster: &TestCluster, ns: &TestNamespace, mcs: &Api<Memcached>) -> Result<()> {
    // Through v1alpha1, read as v1beta1.
    let applied = kubectl_apply(
        cluster,
        ns,
        &memcached_yaml_at("v1alpha1", "converted", "memcached:1.6"),
    )?;
    ensure!(
        applied.status.success(),
        "v1alpha1 write: {}",
        text(&applied)
    );
    let stored = mcs.get("converted").await?;
    ensure!(
        stored.spec.size == 0
            && stored.spec.image == "memcached:1.6"
            && stored.spec.memory.is_none(),
        "read through v1beta1: {:?}",
        stored.spec
    );
    // v1beta1's own field, read through v1alpha1: kept in the annotation.
    let patch = json!({"spec": {"memory": "128Mi"}});
    mcs.patch("converted", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let old = kubectl_json(
        cluster,
        ns,
        &[
            "get",
            concat!("memcacheds.v1alpha1.", product::group!(cache)),
            "converted",
        ],
    )?;
    ensure!(
        old["apiVersion"] == concat!(product::group!(cache), "/v1alpha1")
            && old["spec"].get("memory").is_none(),
        "read through v1alpha1: {old}"
    );
    let kept = old["metadata"]["annotations"][apis::memcached::conversion::PRESERVED_FIELDS]
        .as_str()
        .unwrap_or_default();
    ensure!(
        kept.contains("128Mi"),
        "v1alpha1 carries the memory in its annotation: {old}"
    );
    // An edit through v1alpha1 keeps it.
    let edited = patch_v1alpha1(
        cluster,
        ns,
        "converted",
        r#"{"spec":{"image":"memcached:1.6.39"}}"#,
    )?;
    ensure!(edited.status.success(), "v1alpha1 patch: {}", text(&edited));
    let after = mcs.get("converted").await?;
    ensure!(
        after.spec.image == "memcached:1.6.39"
            && after.spec.memory.as_ref().map(|q| q.0.as_str()) == Some("128Mi"),
        "the v1alpha1 edit kept the memory: {:?}",
        after.spec
    );
    // The annotation is the conversion's: a write through v1alpha1 may carry it back as read,
    // never set or change it by hand.
    let key = apis::memcached::conversion::PRESERVED_FIELDS;
    let forged = json!({"metadata": {"annotations": {key: r#"{"memory":"1Gi"}"#}}});
    let changed = patch_v1alpha1(cluster, ns, "converted", &forged.to_string())?;
    let says = format!("metadata.annotations[{key}]: Invalid value: \"\": is reserved");
    expect_refused(&changed, "Memcached \"converted\"", &says)?;
    let mut created = memcached_yaml_at("v1alpha1", "forged", "memcached:1.6");
    created = created.replace(
        "metadata:\n",
        &format!("metadata:\n  annotations:\n    {key}: '{{\"memory\":\"1Gi\"}}'\n"),
    );
    let refused = kubectl_apply(cluster, ns, &created)?;
    expect_refused(&refused, "Memcached \"forged\"", &says)?;
    ensure!(
        mcs.get("converted")
            .await?
            .spec
            .memory
            .as_ref()
            .map(|q| q.0.as_str())
            == Some("128Mi"),
        "the refused edit changed nothing"
    );
    for version in ["v1alpha1", "v1beta1"] {
        let group = product::group!(cache);
        let resource = format!("memcacheds.{version}.{group}");
        let listed = kubectl_json(cluster, ns, &["get", &resource])?;
        let names: Vec<&str> = listed["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|item| item["metadata"]["name"].as_str())
            .collect();
        ensure!(
            names.contains(&"converted")
                && listed["items"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .all(|item| item["apiVersion"] == format!("{group}/{version}")),
            "kubectl get {resource}: {listed}"
        );
    }
    println!(
        "conversion: written through v1alpha1 and read through v1beta1, v1beta1's memory kept through a v1alpha1 edit, its annotation refused when written by hand, both versions listed"
    );
    Ok(())
}

/// `kubectl patch` of Memcached `name` through v1alpha1 with the merge patch `patch`.
fn patch_v1alpha1(
    cluster: &TestCluster,
    ns: &TestNamespace,
    name: &str,
    patch: &str,
) -> Result<Output> {
    let resource = concat!("memcacheds.v1alpha1.", product::group!(cache));
    let args = [
        "patch",
        resource,
        name,
        "-n",
        ns.name(),
        "--type=merge",
        "-p",
        patch,
    ];
    Ok(cluster.kubectl().args(args).output()?)
}

/// `kubectl <args> -n ns -o json`, parsed.
fn kubectl_json(cluster: &TestCluster, ns: &TestNamespace, args: &[&str]) -> Result<Value> {
    let out = cluster
        .kubectl()
        .args(args)
        .args(["-n", ns.name(), "-o", "json"])
        .output()?;
    ensure!(
        out.status.success(),
        "kubectl {}: {}",
        args.join(" "),
        text(&out)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// Every webhook's `caBundle`, from both configurations.
async fn injected_bundles(cluster: &TestCluster) -> Result<Vec<Vec<u8>>> {
    let mutating = Api::<MutatingWebhookConfiguration>::all(cluster.client.clone())
        .get(product::MUTATING_CONFIGURATION)
        .await?;
    let validating = Api::<ValidatingWebhookConfiguration>::all(cluster.client.clone())
        .get(product::VALIDATING_CONFIGURATION)
        .await?;
    let bundles: Vec<Vec<u8>> = mutating
        .webhooks
        .iter()
        .flatten()
        .map(|w| w.client_config.ca_bundle.clone())
        .chain(
            validating
                .webhooks
                .iter()
                .flatten()
                .map(|w| w.client_config.ca_bundle.clone()),
        )
        .map(|bundle| bundle.map(|b| b.0).unwrap_or_default())
        .collect();
    ensure!(bundles.len() == 4, "four webhooks, got {}", bundles.len());
    Ok(bundles)
}

fn memcached_yaml(name: &str, image: &str) -> String {
    memcached_yaml_at("v1beta1", name, image)
}

fn memcached_with_memory(name: &str, memory: &str, limit: &str) -> String {
    format!(
        "{}  memory: {memory}\n  resources:\n    limits:\n      memory: {limit}\n",
        memcached_yaml(name, "memcached:1.6")
    )
}

fn memcached_yaml_at(version: &str, name: &str, image: &str) -> String {
    let group = product::group!(cache);
    format!(
        "apiVersion: {group}/{version}\nkind: Memcached\nmetadata:\n  name: {name}\nspec:\n  size: 0\n  image: {image:?}\n"
    )
}

fn myapp_yaml(name: &str, image: &str) -> String {
    let group = product::group!(myscheme);
    format!(
        "apiVersion: {group}/v1\nkind: MyApp\nmetadata:\n  name: {name}\nspec:\n  replicas: 0\n  image: {image:?}\n"
    )
}

/// `kubectl apply -f -` of `yaml` in `ns`, as the administrator.
fn kubectl_apply(cluster: &TestCluster, ns: &TestNamespace, yaml: &str) -> Result<Output> {
    use std::io::Write as _;
    let mut child = cluster
        .kubectl()
        .args(["apply", "-n", ns.name(), "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(yaml.as_bytes())?;
    }
    Ok(child.wait_with_output()?)
}

/// A refusal by a validating webhook, which answers as the API server's own validation does
/// (422 Invalid, the field and the reason) with a reason no schema could give.
fn expect_refused(out: &Output, kind_and_name: &str, says: &str) -> Result<()> {
    let err = stderr(out);
    ensure!(
        !out.status.success()
            && err.contains(&format!("{kind_and_name} is invalid"))
            && err.contains(says),
        "expected {kind_and_name} to be refused with {says:?}, got: {}",
        text(out)
    );
    Ok(())
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\n{}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        stderr(out)
    )
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
