//! Namespace scope end to end: managers started with `--namespace`, each running as a
//! ServiceAccount that holds only the generated namespaced Role (`deploy/namespaced/`) in its
//! own namespace, side by side on one cluster.
//!
//! This binary runs no cluster-wide manager, so whatever reconciles an object here is one of the
//! scoped managers.

mod workloads;

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use apis::{Memcached, MemcachedSpec};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, DynamicObject, PostParams};
use kube_operator_runtime::conditions::AVAILABLE;
use testkit::{ServiceAccountKubeconfig, TestCluster, TestNamespace};
use workloads::{Env, TIMEOUT, has_condition};

/// The manager's ServiceAccount, and the namespaced Role and binding as generated, installed in
/// a new namespace named after `prefix`; returns the namespace and a kubeconfig of the account.
async fn namespace_with_role(
    cluster: &TestCluster,
    prefix: &str,
) -> Result<(TestNamespace, ServiceAccountKubeconfig)> {
    let ns = TestNamespace::create(cluster, prefix).await?;
    let deploy = testkit::deploy_dir();
    let mut objects = testkit::read_yaml_file(&deploy.join("rbac").join("service_account.yaml"))?;
    let account = objects
        .first()
        .and_then(|sa| sa.metadata.name.clone())
        .context("the generated ServiceAccount has a name")?;
    for file in ["role.yaml", "role_binding.yaml"] {
        objects.extend(testkit::read_yaml_file(
            &deploy.join("namespaced").join(file),
        )?);
    }
    for binding in objects.iter_mut().filter(|o| kind(o) == "RoleBinding") {
        if let Some(subjects) = binding.data["subjects"].as_array_mut() {
            for subject in subjects {
                subject["namespace"] = ns.name().into();
            }
        }
    }
    testkit::apply_objects(&cluster.client, objects, Some(ns.name())).await?;
    let kubeconfig = testkit::service_account_kubeconfig(cluster, ns.name(), &account).await?;
    Ok((ns, kubeconfig))
}

fn kind(obj: &DynamicObject) -> &str {
    obj.types.as_ref().map_or("", |t| t.kind.as_str())
}

/// A manager for `prefix`'s own namespace, as its own ServiceAccount with only its Role.
async fn scoped_env(prefix: &str) -> Result<Env> {
    let cluster = testkit::cluster().await?;
    workloads::wait_for_crds(&cluster).await?;
    let (ns, identity) = namespace_with_role(&cluster, prefix).await?;
    let scope = format!("--namespace={}", ns.name());
    Env::with_manager(cluster, ns, &identity.path, &[&scope]).await
}

async fn create_memcached(env: &Env, name: &str) -> Result<()> {
    let mc = Memcached::new(
        name,
        MemcachedSpec {
            size: 1,
            image: apis::memcached::DEFAULT_IMAGE.to_owned(),
            ..Default::default()
        },
    );
    env.api::<Memcached>()
        .create(&PostParams::default(), &mc)
        .await?;
    Ok(())
}

async fn wait_available(env: &Env, name: &str) -> Result<()> {
    let memcacheds = env.api::<Memcached>();
    testkit::wait_for(
        &format!("Memcached {}/{name} to be Available", env.namespace()),
        TIMEOUT,
        || async {
            let mc = memcacheds.get(name).await.map_err(|e| e.to_string())?;
            let status = mc.status.unwrap_or_default();
            if has_condition(&status.conditions, AVAILABLE, "True") {
                Ok(())
            } else {
                Err(format!("{status:?}"))
            }
        },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn two_managers_scoped_to_two_namespaces_each_keep_to_their_own() -> Result<()> {
    let team_a = scoped_env("scope-a").await?;
    let team_b = match scoped_env("scope-b").await {
        Ok(env) => env,
        Err(e) => return team_a.finish(Err(e)),
    };
    let result = async {
        // Nobody's namespace: created first, so by the time both teams' objects converged, a
        // manager watching it would have acted on it too.
        let cluster = &team_a.cluster;
        let nobody = TestNamespace::create(cluster, "scope-none").await?;
        let unwatched = Memcached::new(
            "unwatched",
            MemcachedSpec {
                size: 1,
                image: apis::memcached::DEFAULT_IMAGE.to_owned(),
                ..Default::default()
            },
        );
        Api::<Memcached>::namespaced(cluster.client.clone(), nobody.name())
            .create(&PostParams::default(), &unwatched)
            .await?;

        for env in [&team_a, &team_b] {
            create_memcached(env, "cache").await?;
        }
        for env in [&team_a, &team_b] {
            wait_available(env, "cache").await?;
        }

        let deployments = Api::<Deployment>::namespaced(cluster.client.clone(), nobody.name());
        ensure!(
            deployments.get_opt("unwatched").await?.is_none(),
            "no manager watches {}, yet its Memcached got a Deployment",
            nobody.name()
        );
        let unwatched = Api::<Memcached>::namespaced(cluster.client.clone(), nobody.name())
            .get("unwatched")
            .await?;
        ensure!(
            unwatched.status.is_none(),
            "no manager watches {}, yet its Memcached has a status: {:?}",
            nobody.name(),
            unwatched.status
        );

        // Each manager's log names only its own namespace, and nothing was forbidden to it.
        for (env, other) in [(&team_a, &team_b), (&team_b, &team_a)] {
            let log = env.manager.log_text();
            ensure!(
                log.contains(env.namespace()),
                "the manager of {} logs its reconciles",
                env.namespace()
            );
            for foreign in [other.namespace(), nobody.name()] {
                ensure!(
                    !log.contains(foreign),
                    "the manager of {} mentions {foreign}",
                    env.namespace()
                );
            }
            ensure!(
                !log.contains("forbidden"),
                "the manager of {} was refused something",
                env.namespace()
            );
        }
        nobody.delete().await?;
        Ok(())
    }
    .await;
    let result = team_b.finish(result);
    team_a.finish(result)
}

#[tokio::test]
async fn a_namespace_the_roles_do_not_cover_fails_fast_with_the_403_explained() -> Result<()> {
    let cluster = testkit::cluster().await?;
    workloads::wait_for_crds(&cluster).await?;
    let (ns, identity) = namespace_with_role(&cluster, "scope-own").await?;
    let elsewhere = TestNamespace::create(&cluster, "scope-elsewhere").await?;
    let scope = format!("--namespace={},{}", ns.name(), elsewhere.name());
    let mut manager = testkit::spawn_manager(
        &identity.path,
        &[
            "--metrics-bind-address=0",
            "--health-probe-bind-address=0",
            "--leader-elect=false",
            &scope,
        ],
        &[],
    )
    .await?;
    let exit = manager.wait_timeout(Duration::from_secs(60)).await?;
    let log = manager.log_text();
    if exit.is_none() {
        manager.kill().await?;
    }
    let exit = exit.with_context(|| format!("the manager still runs after 60s:\n{log}"))?;
    ensure!(!exit.success(), "the manager failed: {exit}\n{log}");
    for expected in [
        "forbidden",
        &format!("in the namespace \"{}\"", elsewhere.name()),
        "RBAC does not allow listing it",
        "Roles of a namespaced install",
    ] {
        ensure!(log.contains(expected), "{expected:?} in the log:\n{log}");
    }
    Ok(())
}
