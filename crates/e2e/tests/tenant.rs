//! The Tenant controller end to end: a cluster-scoped owner of a namespace and what it holds,
//! with only the generated RBAC (which must let it bind `edit`).

mod workloads;

use std::collections::BTreeMap;

use anyhow::{Result, ensure};
use apis::{Tenant, TenantSpec, TenantStatus};
use k8s_openapi::api::core::v1::{LimitRange, Namespace, ResourceQuota};
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube_operator_runtime::conditions::READY;
use serde_json::json;
use workloads::{Env, Scope, TIMEOUT, condition};

fn tenant(name: &str, namespace: Option<&str>, pods: &str) -> Tenant {
    Tenant::new(
        name,
        TenantSpec {
            namespace: namespace.map(str::to_owned),
            group: format!("{name}-devs"),
            quota: BTreeMap::from([("pods".to_owned(), Quantity(pods.to_owned()))]),
        },
    )
}

/// Waits until the Tenant `name` reports `Ready` with `reason`, and returns its status.
async fn reported(tenants: &Api<Tenant>, name: &str, reason: &str) -> Result<TenantStatus> {
    let status = testkit::wait_for(
        &format!("Tenant {name} to report Ready with reason {reason}"),
        TIMEOUT,
        || async {
            let tenant = tenants.get(name).await.map_err(|e| e.to_string())?;
            let status = tenant.status.unwrap_or_default();
            match condition(&status.conditions, READY) {
                Some(ready) if ready.reason == reason => Ok(status),
                _ => Err(format!("status {status:?}")),
            }
        },
    )
    .await?;
    Ok(status)
}

#[tokio::test]
async fn a_tenant_gets_its_namespace_quota_limits_and_binding_and_takes_them_along() -> Result<()> {
    let env = Env::start("tenant", None, "tenant", Scope::Cluster).await?;
    let client = env.cluster.client.clone();
    let tenants = Api::<Tenant>::all(client.clone());
    // Cluster-scoped: named after the test's namespace, which is unique per run.
    let name = format!("{}-team", env.namespace());
    let result = async {
        tenants
            .create(&PostParams::default(), &tenant(&name, None, "5"))
            .await?;
        let status = reported(&tenants, &name, "Provisioned").await?;
        ensure!(
            status.namespace.as_deref() == Some(name.as_str()),
            "{status:?}"
        );

        let namespace = Api::<Namespace>::all(client.clone()).get(&name).await?;
        let owner = namespace.metadata.owner_references.unwrap_or_default();
        ensure!(
            owner
                .iter()
                .any(|o| o.kind == "Tenant" && o.controller == Some(true)),
            "the namespace is controlled by its Tenant: {owner:?}"
        );
        let quota = Api::<ResourceQuota>::namespaced(client.clone(), &name)
            .get("tenant")
            .await?;
        let hard = quota.spec.and_then(|s| s.hard).unwrap_or_default();
        ensure!(hard.get("pods") == Some(&Quantity("5".into())), "{hard:?}");
        Api::<LimitRange>::namespaced(client.clone(), &name)
            .get("tenant")
            .await?;
        let binding = Api::<RoleBinding>::namespaced(client.clone(), &name)
            .get("tenant-edit")
            .await?;
        ensure!(binding.role_ref.name == "edit", "{:?}", binding.role_ref);

        // The binding works: the group may now create Deployments there, and nowhere else.
        let group = format!("{name}-devs");
        let can = |namespace: &str| {
            env.cluster
                .kubectl()
                .args(["auth", "can-i", "create", "deployments", "-n", namespace])
                .args(["--as", "someone", "--as-group", &group])
                .output()
        };
        ensure!(
            can(&name)?.status.success(),
            "the group may edit its namespace"
        );
        ensure!(!can("default")?.status.success(), "and only its namespace");

        // A changed quota is applied; a hand edit of it is undone.
        let patch = json!({"spec": {"quota": {"pods": "7"}}});
        tenants
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        let quotas = Api::<ResourceQuota>::namespaced(client.clone(), &name);
        let pods_allowed = |want: &'static str| {
            let quotas = quotas.clone();
            async move {
                testkit::wait_for(
                    &format!("the quota to allow {want} pods"),
                    TIMEOUT,
                    || async {
                        let quota = quotas.get("tenant").await.map_err(|e| e.to_string())?;
                        let hard = quota.spec.and_then(|s| s.hard).unwrap_or_default();
                        match hard.get("pods") {
                            Some(pods) if pods.0 == want => Ok(()),
                            other => Err(format!("pods: {other:?}")),
                        }
                    },
                )
                .await
            }
        };
        pods_allowed("7").await?;
        let edit = json!({"spec": {"hard": {"pods": "100"}}});
        quotas
            .patch("tenant", &PatchParams::default(), &Patch::Merge(&edit))
            .await?;
        pods_allowed("7").await?;

        // Deleting the Tenant takes its namespace and everything in it.
        tenants.delete(&name, &DeleteParams::default()).await?;
        let namespaces = Api::<Namespace>::all(client.clone());
        testkit::wait_for("the tenant's namespace to be gone", TIMEOUT, || async {
            match namespaces.get_opt(&name).await.map_err(|e| e.to_string())? {
                None => Ok(()),
                Some(ns) => Err(format!("still there: {:?}", ns.status)),
            }
        })
        .await?;
        Ok(())
    }
    .await;
    // A failed run leaves nothing behind either.
    let _ = tenants.delete(&name, &DeleteParams::default()).await;
    env.finish(result)
}

#[tokio::test]
async fn a_namespace_that_is_not_the_tenants_is_refused_and_left_untouched() -> Result<()> {
    let env = Env::start("tenant-foreign", None, "tenant", Scope::Cluster).await?;
    let client = env.cluster.client.clone();
    let tenants = Api::<Tenant>::all(client.clone());
    let name = format!("{}-team", env.namespace());
    let result = async {
        // The test's own namespace exists and is nobody's Tenant's.
        let taken = env.namespace().to_owned();
        let before = Api::<Namespace>::all(client.clone()).get(&taken).await?;
        tenants
            .create(&PostParams::default(), &tenant(&name, Some(&taken), "5"))
            .await?;
        let status = reported(&tenants, &name, "NamespaceNotOwned").await?;
        ensure!(status.namespace.is_none(), "{status:?}");
        let ready = condition(&status.conditions, READY).map(|c| c.status.clone());
        ensure!(ready.as_deref() == Some("False"), "{status:?}");
        let note = env
            .wait_for_cluster_event(&name, "NamespaceNotOwned")
            .await?;
        ensure!(
            note.starts_with(&format!("Namespace {taken} exists")),
            "{note}"
        );

        let after = Api::<Namespace>::all(client.clone()).get(&taken).await?;
        ensure!(
            after.metadata.labels == before.metadata.labels
                && after.metadata.owner_references == before.metadata.owner_references,
            "the namespace is untouched: {:?}",
            after.metadata
        );
        let quotas = Api::<ResourceQuota>::namespaced(client.clone(), &taken);
        ensure!(quotas.get_opt("tenant").await?.is_none(), "no quota made");
        let bindings = Api::<RoleBinding>::namespaced(client.clone(), &taken);
        ensure!(
            bindings.get_opt("tenant-edit").await?.is_none(),
            "no binding"
        );

        // Deleting such a Tenant leaves the namespace where it is.
        tenants.delete(&name, &DeleteParams::default()).await?;
        testkit::wait_for("the Tenant to be gone", TIMEOUT, || async {
            match tenants.get_opt(&name).await.map_err(|e| e.to_string())? {
                None => Ok(()),
                Some(_) => Err("still there".to_owned()),
            }
        })
        .await?;
        let namespace = Api::<Namespace>::all(client.clone()).get(&taken).await?;
        ensure!(namespace.metadata.deletion_timestamp.is_none(), "kept");
        Ok(())
    }
    .await;
    let _ = tenants.delete(&name, &DeleteParams::default()).await;
    env.finish(result)
}
