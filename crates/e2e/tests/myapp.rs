//! The MyApp controller end to end, and both controllers in one manager.

mod workloads;

use anyhow::{Result, ensure};
use apis::{Memcached, MemcachedSpec, MyApp, MyAppSpec};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube_operator_runtime::conditions::AVAILABLE;
use serde_json::json;
use testkit::PodSecurity;
use workloads::{Env, Scope, TIMEOUT, has_condition};

const PODS: &str = "app.kubernetes.io/name=myapp";

fn image_of(d: &Deployment) -> Option<String> {
    let pod = d.spec.template.spec.as_ref()?;
    pod.containers
        .iter()
        .find(|c| c.name == "app")?
        .image
        .clone()
}

async fn create(env: &Env, name: &str, replicas: i32, image: &str) -> Result<MyApp> {
    let app = MyApp::new(
        name,
        MyAppSpec {
            replicas,
            image: image.to_owned(),
        },
    );
    Ok(env
        .api::<MyApp>()
        .create(&PostParams::default(), &app)
        .await?)
}

/// Waits until `name` reports `replicas` ready replicas of `image` and `Available=True`.
async fn converged(env: &Env, name: &str, replicas: i32, image: &str) -> Result<()> {
    env.wait_for_deployment(
        name,
        &format!("{replicas} replicas of {image} rolled out"),
        |d| {
            let status = d.status.clone().unwrap_or_default();
            d.spec.replicas == Some(replicas)
                && image_of(d).as_deref() == Some(image)
                && status.updated_replicas.unwrap_or(0) == replicas
                && status.ready_replicas.unwrap_or(0) == replicas
                && status.replicas.unwrap_or(0) == replicas
        },
    )
    .await?;
    let apps = env.api::<MyApp>();
    testkit::wait_for(
        &format!("MyApp {name} to report {replicas} ready and Available"),
        TIMEOUT,
        || async {
            let app = apps.get(name).await.map_err(|e| e.to_string())?;
            let status = app.status.unwrap_or_default();
            let available = has_condition(&status.conditions, AVAILABLE, "True");
            if status.ready_replicas == replicas && status.replicas == replicas && available {
                Ok(())
            } else {
                Err(format!("status {status:?}"))
            }
        },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn image_change_rolls_and_hand_edits_are_undone() -> Result<()> {
    let env = Env::start(
        "myapp-roll",
        Some(PodSecurity::Restricted),
        "myapp",
        Scope::Namespace,
    )
    .await?;
    let result = async {
        create(&env, "web", 2, "nginx:1.28-alpine").await?;
        converged(&env, "web", 2, "nginx:1.28-alpine").await?;
        env.wait_for_running_pods(PODS, 2).await?;

        // The user changes the image: the Deployment rolls to a new ReplicaSet.
        let patch = json!({"spec": {"image": "nginx:1.29-alpine"}});
        env.api::<MyApp>()
            .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        converged(&env, "web", 2, "nginx:1.29-alpine").await?;
        let sets = env
            .api::<ReplicaSet>()
            .list(&ListParams::default().labels(PODS))
            .await?;
        ensure!(
            sets.items.len() >= 2,
            "a new ReplicaSet rolled out: {} found",
            sets.items.len()
        );
        env.wait_for_event("web", "Updated").await?;

        // Someone edits the container image by hand: it is put back.
        env.kubectl(&["set", "image", "deployment/web", "app=busybox:1.37"])?;
        converged(&env, "web", 2, "nginx:1.29-alpine").await?;

        // And a hand-scaled replica count.
        env.kubectl(&["scale", "deployment", "web", "--replicas=4"])?;
        env.wait_for_deployment("web", "scaled back to 2", |d| {
            d.spec.replicas == Some(2) && d.metadata.generation.unwrap_or(0) > 3
        })
        .await?;
        Ok(())
    }
    .await;
    env.finish(result)
}

#[tokio::test]
async fn both_controllers_run_in_one_manager() -> Result<()> {
    let env = Env::start("both", None, "memcached,myapp", Scope::Namespace).await?;
    let result = async {
        let mc = Memcached::new(
            "cache",
            MemcachedSpec {
                size: 2,
                image: apis::memcached::DEFAULT_IMAGE.to_owned(),
                ..Default::default()
            },
        );
        env.api::<Memcached>()
            .create(&PostParams::default(), &mc)
            .await?;
        create(&env, "app", 1, "nginx:1.29-alpine").await?;
        converged(&env, "app", 1, "nginx:1.29-alpine").await?;
        env.wait_for_running_pods("app=memcached", 2).await?;
        let memcacheds = env.api::<Memcached>();
        testkit::wait_for("Memcached cache to be Available", TIMEOUT, || async {
            let mc = memcacheds.get("cache").await.map_err(|e| e.to_string())?;
            let status = mc.status.unwrap_or_default();
            if status.nodes.len() == 2 && has_condition(&status.conditions, AVAILABLE, "True") {
                Ok(())
            } else {
                Err(format!("{status:?}"))
            }
        })
        .await?;

        // A counter moves when a reconcile returns, a moment after the write the waits above
        // saw: read until every series shows both controllers' work.
        testkit::wait_for("both controllers' metrics", TIMEOUT, || async {
            let metrics = env.metrics().await.map_err(|e| e.to_string())?;
            both_controllers_in(&metrics)
        })
        .await?;
        Ok(())
    }
    .await;
    env.finish(result)
}

/// Whether `metrics` show both controllers' reconciles, queues and requests; what is missing.
fn both_controllers_in(metrics: &str) -> Result<(), String> {
    let check = |ok: bool, what: String| if ok { Ok(()) } else { Err(what) };
    for controller in ["memcached", "myapp"] {
        let successes = workloads::sample(
            metrics,
            &format!(
                "controller_runtime_reconcile_total{{controller=\"{controller}\",result=\"success\"}}"
            ),
        );
        check(
            successes.is_some_and(|n| n > 0.0),
            format!("{controller} reconciled: {successes:?}"),
        )?;
        let workers = workloads::sample(
            metrics,
            &format!("controller_runtime_max_concurrent_reconciles{{controller=\"{controller}\"}}"),
        );
        check(
            workers.is_some_and(|n| n >= 1.0),
            format!("{controller} concurrency: {workers:?}"),
        )?;
        let queue = format!("{{controller=\"{controller}\",name=\"{controller}\"");
        for priority in ["0", "-100"] {
            let depth = workloads::sample(
                metrics,
                &format!("workqueue_depth{queue},priority=\"{priority}\"}}"),
            );
            check(
                depth.is_some(),
                format!("workqueue_depth{{priority=\"{priority}\"}} for {controller}"),
            )?;
        }
        // No reconcile started from a cache older than the controller's own last write.
        let waits =
            format!("operator_manager_reconcile_cache_waits_total{{controller=\"{controller}\"");
        let behind = workloads::sample(metrics, &format!("{waits},outcome=\"behind\"}}"));
        let caught_up = workloads::sample(metrics, &format!("{waits},outcome=\"caught_up\"}}"));
        check(
            behind == Some(0.0) && caught_up.is_some(),
            format!(
                "{controller} reconciles behind their own writes: {behind:?} (caught up: {caught_up:?})"
            ),
        )?;
        for series in [
            "workqueue_queue_duration_seconds_count",
            "workqueue_work_duration_seconds_count",
        ] {
            let observed = workloads::sample(metrics, &format!("{series}{queue}}}"));
            check(
                observed.is_some_and(|n| n > 0.0),
                format!("{series} for {controller}: {observed:?}"),
            )?;
        }
        let timed = format!(
            "controller_runtime_reconcile_time_seconds_bucket{{controller=\"{controller}\""
        );
        check(metrics.contains(&timed), format!("{timed}..."))?;
    }
    let requests = metrics
        .lines()
        .filter(|l| l.starts_with("rest_client_requests_total{code=\"200\",host=\"127.0.0.1:"))
        .count();
    check(
        requests > 0,
        "rest_client_requests_total of the manager's requests".to_owned(),
    )
}
