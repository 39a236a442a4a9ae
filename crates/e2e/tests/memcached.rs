//! The Memcached controller end to end: the real manager, with only the generated RBAC, against
//! the local control plane.
//!
//! Each test has a namespace and a manager of its own (`--leader-elect=false`). Managers of
//! tests running at the same time also reconcile the other tests' objects; they all apply the
//! same desired state, so that does not change what a test observes.

mod workloads;

use std::collections::BTreeMap;

use anyhow::{Context as _, Result, ensure};
use apis::{Memcached, MemcachedSpec};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, PodTemplateSpec, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube_operator_runtime::conditions::{AVAILABLE, DEGRADED};
use serde_json::json;
use testkit::PodSecurity;
use workloads::{Env, Scope, TIMEOUT, has_condition};

const SAMPLE: &str = "memcached-sample";

/// Pods of the Memcached controller (each test namespace holds one `Memcached` unless said).
const PODS: &str = "app=memcached";

/// Applies the repository's sample (`deploy/samples`) into the test's namespace.
async fn apply_sample(env: &Env) -> Result<()> {
    let path = testkit::deploy_dir()
        .join("samples")
        .join("cache_v1beta1_memcached.yaml");
    let objects = testkit::read_yaml_file(&path)?;
    testkit::apply_objects(&env.cluster.client, objects, Some(env.namespace())).await?;
    Ok(())
}

/// Creates a `Memcached` of `size` named `name`.
async fn create(env: &Env, name: &str, size: i32) -> Result<Memcached> {
    let mc = Memcached::new(
        name,
        MemcachedSpec {
            size,
            image: apis::memcached::DEFAULT_IMAGE.to_owned(),
            ..Default::default()
        },
    );
    Ok(env
        .api::<Memcached>()
        .create(&PostParams::default(), &mc)
        .await?)
}

/// Waits until `name` has a Deployment of `size` replicas, exactly `size` running pods, and a
/// status listing exactly those pods, `size` ready replicas, the current generation and
/// `Available=True`, all seen at once. Returns the pod names.
///
/// Everything is checked inside one wait: managers of other tests running at the same time also
/// reconcile this object, and one with a stale cache may briefly write an older status.
async fn converged(env: &Env, name: &str, size: usize) -> Result<Vec<String>> {
    let replicas = i32::try_from(size)?;
    let memcacheds = env.api::<Memcached>();
    let deployments = env.api::<Deployment>();
    let what = format!("Memcached {name} to list exactly its {size} running pods and be Available");
    let names = testkit::wait_for(&what, TIMEOUT, || async {
        let deployment = deployments.get_opt(name).await.map_err(|e| e.to_string())?;
        let deployment_replicas = deployment.and_then(|d| d.spec.replicas);
        let pods = env.pods(PODS).await.map_err(|e| e.to_string())?;
        let running: Vec<String> = pods
            .iter()
            .filter(|(_, p)| *p == "Running")
            .map(|(n, _)| n.clone())
            .collect();
        let mc = memcacheds.get(name).await.map_err(|e| e.to_string())?;
        let generation = mc.metadata.generation;
        let status = mc.status.unwrap_or_default();
        let available = has_condition(&status.conditions, AVAILABLE, "True");
        if deployment_replicas == Some(replicas)
            && running.len() == size
            && pods.len() == size
            && status.nodes == running
            && status.ready_replicas == replicas
            && status.observed_generation == generation
            && available
        {
            Ok(running)
        } else {
            Err(format!(
                "Deployment replicas {deployment_replicas:?}, pods {pods:?}, status {status:?}"
            ))
        }
    })
    .await?;
    Ok(names)
}

#[tokio::test]
async fn sample_converges_and_follows_size() -> Result<()> {
    let env = Env::start("mc-sample", None, "memcached", Scope::Namespace).await?;
    let result = async {
        apply_sample(&env).await?;
        // Deployment of 3, 3 running pods, status.nodes exactly their names, readyReplicas 3,
        // observedGeneration current, Available.
        let pods = converged(&env, SAMPLE, 3).await?;
        ensure!(pods.len() == 3, "{pods:?}");

        // As the tutorial says it.
        env.kubectl(&[
            "patch",
            "memcached",
            SAMPLE,
            "-p",
            r#"{"spec":{"size":5}}"#,
            "--type=merge",
        ])?;
        let five = converged(&env, SAMPLE, 5).await?;
        ensure!(five.len() == 5);
        env.wait_for_event(SAMPLE, "Scaled").await?;

        env.kubectl(&[
            "patch",
            "memcached",
            SAMPLE,
            "-p",
            r#"{"spec":{"size":0}}"#,
            "--type=merge",
        ])?;
        // No pods, and no nodes in the status.
        let none = converged(&env, SAMPLE, 0).await?;
        ensure!(none.is_empty());
        Ok(())
    }
    .await;
    env.finish(result)
}

#[tokio::test]
async fn drift_is_undone_and_nodes_follow_pods() -> Result<()> {
    let env = Env::start("mc-drift", None, "memcached", Scope::Namespace).await?;
    let result = async {
        create(&env, "drift", 3).await?;
        let before = converged(&env, "drift", 3).await?;
        let deployments = env.api::<Deployment>();

        // Someone scales the Deployment by hand: it is put back.
        env.kubectl(&["scale", "deployment", "drift", "--replicas=6"])?;
        env.wait_for_deployment("drift", "scaled back to 3", |d| {
            d.spec.replicas == Some(3) && d.metadata.generation.unwrap_or(0) > 1
        })
        .await?;
        converged(&env, "drift", 3).await?;

        // Someone deletes the Deployment: it is recreated.
        let old_uid = deployments.get("drift").await?.metadata.uid;
        deployments
            .delete("drift", &DeleteParams::default())
            .await?;
        env.wait_for_deployment("drift", "recreated", |d| d.metadata.uid != old_uid)
            .await?;
        converged(&env, "drift", 3).await?;

        // A pod is deleted: status.nodes follows its replacement.
        let current = env.pods(PODS).await?;
        let victim = current.keys().next().cloned().context("a pod to delete")?;
        env.api::<Pod>()
            .delete(&victim, &DeleteParams::default().grace_period(0))
            .await?;
        let after = testkit::wait_for("the deleted pod to leave status.nodes", TIMEOUT, || async {
            let names = converged(&env, "drift", 3)
                .await
                .map_err(|e| e.to_string())?;
            if names.contains(&victim) {
                Err(format!("{victim} still listed"))
            } else {
                Ok(names)
            }
        })
        .await?;
        ensure!(
            after.len() == 3 && !after.contains(&victim),
            "{after:?} replaced {victim}"
        );
        ensure!(before != after);
        Ok(())
    }
    .await;
    env.finish(result)
}

/// The target port of the Service's `memcached` port, if it has one.
fn memcached_target(service: &Service) -> Option<IntOrString> {
    let ports = service.spec.as_ref()?.ports.as_ref()?;
    let port = ports.iter().find(|p| p.port == 11211)?;
    port.target_port.clone()
}

#[tokio::test]
async fn the_service_and_the_budget_are_kept_as_the_memcached_asks() -> Result<()> {
    let env = Env::start("mc-svc", None, "memcached", Scope::Namespace).await?;
    let result = async {
        create(&env, "svc", 2).await?;
        converged(&env, "svc", 2).await?;
        let (memcacheds, services) = (env.api::<Memcached>(), env.api::<Service>());
        let budgets = env.api::<PodDisruptionBudget>();
        testkit::wait_for("status.service to name the Service", TIMEOUT, || async {
            let mc = memcacheds.get("svc").await.map_err(|e| e.to_string())?;
            match mc.status.and_then(|s| s.service) {
                Some(name) if name == "svc" => Ok(()),
                other => Err(format!("status.service is {other:?}")),
            }
        })
        .await?;
        let service = services.get("svc").await?;
        let named = Some(IntOrString::String("memcached".into()));
        ensure!(memcached_target(&service) == named, "{service:?}");
        let budget = budgets.get("svc").await?;
        let max_unavailable = budget.spec.and_then(|s| s.max_unavailable);
        ensure!(
            max_unavailable == Some(IntOrString::Int(1)),
            "{max_unavailable:?}"
        );

        // Someone points the Service elsewhere: it is put back.
        let edit = json!({"spec": {"ports": [{"port": 11211, "targetPort": 8080}]}});
        services
            .patch("svc", &PatchParams::default(), &Patch::Strategic(&edit))
            .await?;
        testkit::wait_for(
            "the Service's target port to be restored",
            TIMEOUT,
            || async {
                let service = services.get("svc").await.map_err(|e| e.to_string())?;
                let target = memcached_target(&service);
                (target == named).then_some(()).ok_or(format!("{target:?}"))
            },
        )
        .await?;

        // Someone deletes the Service: it is made again.
        let old_uid = services.get("svc").await?.metadata.uid;
        services.delete("svc", &DeleteParams::default()).await?;
        testkit::wait_for("the Service to be recreated", TIMEOUT, || async {
            let service = services.get_opt("svc").await.map_err(|e| e.to_string())?;
            let uid = service.and_then(|s| s.metadata.uid);
            (uid.is_some() && uid != old_uid)
                .then_some(())
                .ok_or(format!("uid {uid:?}"))
        })
        .await?;

        // One pod needs no disruption budget; two or more get one again.
        for (size, wanted) in [(1, false), (3, true)] {
            let patch = json!({"spec": {"size": size}});
            memcacheds
                .patch("svc", &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            testkit::wait_for("the budget to follow the size", TIMEOUT, || async {
                let budget = budgets.get_opt("svc").await.map_err(|e| e.to_string())?;
                (budget.is_some() == wanted)
                    .then_some(())
                    .ok_or(format!("size {size}: budget exists is {}", !wanted))
            })
            .await?;
        }
        Ok(())
    }
    .await;
    env.finish(result)
}

#[tokio::test]
async fn deleting_the_memcached_collects_its_deployment_and_pods() -> Result<()> {
    let env = Env::start("mc-gc", None, "memcached", Scope::Namespace).await?;
    let result = async {
        create(&env, "doomed", 2).await?;
        converged(&env, "doomed", 2).await?;
        let deployment = env.api::<Deployment>().get("doomed").await?;
        let owner = deployment.metadata.owner_references.unwrap_or_default();
        ensure!(
            owner
                .iter()
                .any(|o| o.kind == "Memcached" && o.controller == Some(true)),
            "{owner:?}"
        );

        env.api::<Memcached>()
            .delete("doomed", &DeleteParams::foreground())
            .await?;
        let deployments = env.api::<Deployment>();
        testkit::wait_for("the Deployment to be collected", TIMEOUT, || async {
            match deployments.get_opt("doomed").await {
                Ok(None) => Ok(()),
                Ok(Some(_)) => Err("still there".to_owned()),
                Err(e) => Err(e.to_string()),
            }
        })
        .await?;
        env.wait_for_running_pods(PODS, 0).await?;
        Ok(())
    }
    .await;
    env.finish(result)
}

#[tokio::test]
async fn a_hundred_character_name_converges() -> Result<()> {
    let env = Env::start("mc-long", None, "memcached", Scope::Namespace).await?;
    let result = async {
        let name = format!("memcached-{}", "x".repeat(90));
        ensure!(name.len() == 100);
        create(&env, &name, 2).await?;
        let pods = converged(&env, &name, 2).await?;
        let deployment = env.api::<Deployment>().get(&name).await?;
        let labels = deployment.metadata.labels.unwrap_or_default();
        ensure!(
            labels.values().all(|v| v.len() <= 63),
            "label values fit: {labels:?}"
        );
        ensure!(pods.len() == 2);
        Ok(())
    }
    .await;
    env.finish(result)
}

#[tokio::test]
async fn a_foreign_deployment_is_left_alone_and_reported() -> Result<()> {
    let env = Env::start("mc-foreign", None, "memcached", Scope::Namespace).await?;
    let result = async {
        let labels = BTreeMap::from([("app".to_owned(), "someone-else".to_owned())]);
        let foreign = Deployment {
            metadata: ObjectMeta {
                name: Some("clash".into()),
                labels: Some(labels.clone()),
                ..ObjectMeta::default()
            },
            spec: DeploymentSpec {
                replicas: Some(1),
                selector: LabelSelector {
                    match_labels: Some(labels.clone()),
                    match_expressions: None,
                },
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(labels),
                        ..ObjectMeta::default()
                    }),
                    spec: Some(PodSpec {
                        containers: vec![Container {
                            name: "web".into(),
                            image: Some("nginx:1.29-alpine".into()),
                            ..Container::default()
                        }],
                        ..PodSpec::default()
                    }),
                },
                ..DeploymentSpec::default()
            },
            ..Deployment::default()
        };
        let deployments = env.api::<Deployment>();
        let created = deployments.create(&PostParams::default(), &foreign).await?;
        create(&env, "clash", 3).await?;

        let memcacheds = env.api::<Memcached>();
        let degraded = testkit::wait_for("Memcached clash to report Degraded", TIMEOUT, || async {
            let mc = memcacheds.get("clash").await.map_err(|e| e.to_string())?;
            let conditions = mc.status.unwrap_or_default().conditions;
            workloads::condition(&conditions, DEGRADED)
                .filter(|c| c.status == "True")
                .cloned()
                .ok_or_else(|| format!("conditions {conditions:?}"))
        })
        .await?;
        ensure!(
            degraded.reason == "DeploymentNotOwned",
            "reason {}",
            degraded.reason
        );
        ensure!(
            degraded.message.contains("clash"),
            "message {}",
            degraded.message
        );
        let note = env.wait_for_event("clash", "DeploymentNotOwned").await?;
        ensure!(note.contains("not controlled"), "event note {note}");

        // Give any (wrong) write time to happen, then check nothing changed.
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        let now = deployments.get("clash").await?;
        ensure!(
            now.metadata.generation == created.metadata.generation,
            "the spec was not touched"
        );
        ensure!(now.spec.replicas == Some(1));
        ensure!(
            now.metadata.owner_references.unwrap_or_default().is_empty(),
            "no owner was added"
        );
        ensure!(
            now.metadata.labels == created.metadata.labels,
            "labels untouched"
        );
        let managers: Vec<String> = now
            .metadata
            .managed_fields
            .unwrap_or_default()
            .into_iter()
            .filter_map(|m| m.manager)
            .collect();
        ensure!(
            !managers.iter().any(|m| m.starts_with(product::name!())),
            "field managers {managers:?}"
        );

        // Once the foreign Deployment goes, the Memcached takes the name: its deletion is an
        // event the controller follows, not something found at the next recheck (minutes away).
        deployments
            .delete("clash", &DeleteParams::default())
            .await?;
        testkit::wait_for(
            "the Memcached to create its own Deployment once the foreign one is gone",
            std::time::Duration::from_secs(30),
            || async {
                let d = deployments
                    .get_opt("clash")
                    .await
                    .map_err(|e| e.to_string())?
                    .ok_or("no Deployment yet")?;
                let owners = d.metadata.owner_references.unwrap_or_default();
                owners
                    .iter()
                    .any(|o| o.kind == "Memcached" && o.controller == Some(true))
                    .then_some(())
                    .ok_or_else(|| format!("owners {owners:?}"))
            },
        )
        .await?;
        converged(&env, "clash", 3).await?;
        Ok(())
    }
    .await;
    env.finish(result)
}

#[tokio::test]
async fn a_restricted_namespace_admits_the_memcached_pods() -> Result<()> {
    let env = Env::start(
        "mc-restricted",
        Some(PodSecurity::Restricted),
        "memcached",
        Scope::Namespace,
    )
    .await?;
    let result = async {
        create(&env, "locked-down", 2).await?;
        converged(&env, "locked-down", 2).await?;
        // The pods were admitted under `enforce: restricted`; no ReplicaSet reports a failure.
        let d = env.api::<Deployment>().get("locked-down").await?;
        let failure = d
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| {
                c.type_.as_deref() == Some("ReplicaFailure") && c.status.as_deref() == Some("True")
            });
        ensure!(failure.is_none(), "{failure:?}");
        Ok(())
    }
    .await;
    env.finish(result)
}

#[tokio::test]
async fn a_status_is_written_only_when_it_changes() -> Result<()> {
    let env = Env::start("mc-quiet", None, "memcached", Scope::Namespace).await?;
    let result = async {
        create(&env, "quiet", 1).await?;
        converged(&env, "quiet", 1).await?;
        let memcacheds: Api<Memcached> = env.api();
        // Settled: a few seconds later the object has not been rewritten.
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        let settled = memcacheds.get("quiet").await?.metadata.resource_version;
        tokio::time::sleep(std::time::Duration::from_secs(4)).await;
        let later = memcacheds.get("quiet").await?.metadata.resource_version;
        ensure!(
            settled == later,
            "resourceVersion moved from {settled:?} to {later:?} without a change"
        );
        // A metadata-only change triggers a reconcile that finds nothing to write.
        let patch = json!({"metadata": {"labels": {"touched": "yes"}}});
        memcacheds
            .patch("quiet", &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        let touched = memcacheds.get("quiet").await?.metadata.resource_version;
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        let after = memcacheds.get("quiet").await?.metadata.resource_version;
        ensure!(touched == after, "status rewritten after a no-op reconcile");
        Ok(())
    }
    .await;
    env.finish(result)
}
