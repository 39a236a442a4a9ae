//! The local cluster's registry: an image pushed to it is pulled by the real node's containerd,
//! over plain HTTP, and runs; the pod reports the digest that was pushed.

use std::path::Path;

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use kube::api::{Api, LogParams, ObjectMeta, PostParams};
use ociimage::{Image, ImageConfig, ImageFile, Metadata, Reference, User};
use testkit::{PodSecurity, TestNamespace};

/// The distribution's static busybox (`cargo xtask setup` installs it): a program that needs no
/// libraries, for an image of one file.
const BUSYBOX: &str = "/bin/busybox";
/// What the pod prints.
const GREETING: &str = "pulled from the local registry";

#[tokio::test]
async fn an_image_pushed_to_the_local_registry_runs_on_the_real_node() -> Result<()> {
    let cluster = testkit::cluster().await?;
    let registry = cluster
        .state
        .registry()
        .context("the local cluster runs no registry: start it with `cargo xtask cluster up`")?
        .to_string();
    let ns = TestNamespace::on_real_node(&cluster, "registry", PodSecurity::Baseline).await?;
    // The namespace goes when dropped, whatever the result.
    pushed_image_runs(&cluster.client, ns.name(), &registry).await
}

async fn pushed_image_runs(client: &kube::Client, namespace: &str, registry: &str) -> Result<()> {
    let dir = tempfile::tempdir()?;
    // A tag of its own, so no earlier push or import can stand in for this one.
    let tag = format!("t{}", fastrand::u64(..));
    let built = busybox_image(dir.path(), &tag)?;
    let pushed = ociimage::push(&built.archive, registry, "e2e/pull-check", &tag)?;
    ensure!(
        pushed.manifest_digest == built.manifest_digest,
        "{pushed:?}"
    );

    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("pull-check".into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some("Never".into()),
            containers: vec![Container {
                name: "check".into(),
                image: Some(pushed.name.clone()),
                image_pull_policy: Some("Always".into()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    };
    pods.create(&PostParams::default(), &pod).await?;
    let done = testkit::wait_for(
        "the pod of the pushed image to succeed",
        std::time::Duration::from_secs(120),
        || async {
            let pod = pods.get("pull-check").await.map_err(|e| e.to_string())?;
            let status = pod.status.clone().unwrap_or_default();
            match status.phase.as_deref() {
                Some("Succeeded") => Ok(pod),
                phase => Err(format!(
                    "phase {phase:?}, containers {:?}",
                    status.container_statuses
                )),
            }
        },
    )
    .await?;
    let image_id = done
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|statuses| statuses.into_iter().next())
        .map(|status| status.image_id)
        .unwrap_or_default();
    ensure!(
        image_id.ends_with(&pushed.manifest_digest),
        "the pod ran {image_id}, not the pushed {}",
        pushed.manifest_digest
    );
    let logs = pods.logs("pull-check", &LogParams::default()).await?;
    ensure!(logs.trim() == GREETING, "the pod printed {logs:?}");
    Ok(())
}

fn busybox_image(dir: &Path, tag: &str) -> Result<ociimage::BuiltImage> {
    let config = ImageConfig::new(
        User::new("nobody", 65534),
        vec![BUSYBOX.into(), "echo".into(), GREETING.into()],
        Metadata {
            title: "pull-check".into(),
            description: "an image the local registry serves to the real node".into(),
            version: tag.into(),
            revision: None,
            source: None,
            url: None,
            licenses: None,
            labels: Default::default(),
            created: 1_700_000_000,
        },
    );
    let mut image = Image::new(Reference::parse(&format!("pull-check:{tag}"))?, config);
    image.add(ImageFile::executable(BUSYBOX, BUSYBOX))?;
    Ok(image.write(&dir.join("pull-check.oci.tar"))?)
}
