//! A workload of Memcacheds for the fault tests: created, then scaled and replaced while
//! faults happen, until each converges.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use serde_json::json;

use crate::Result;

/// The Memcached resource at its storage version, for dynamic clients.
pub fn memcached_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(product::group!(cache), "v1beta1", "Memcached"),
        "memcacheds",
    )
}

/// Creates the Memcached `name` of `size` pods.
///
/// # Errors
/// When the API server refuses.
pub async fn create_memcached(
    api: &Api<DynamicObject>,
    name: &str,
    size: usize,
) -> kube::Result<()> {
    let object =
        DynamicObject::new(name, &memcached_resource()).data(json!({ "spec": { "size": size } }));
    api.create(&PostParams::default(), &object).await?;
    Ok(())
}

/// A small deterministic generator, enough to vary the workload.
struct XorShift(u64);

impl XorShift {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        usize::try_from(self.0 % (n as u64)).unwrap_or_default()
    }
}

/// Scales and replaces the Memcacheds `mc-0` to `mc-<count - 1>` (a replacement is called
/// `mc-<count>`, `mc-<count + 1>`, …), a change every 100 ms, until `stop` turns true; errors
/// (the API server restarts meanwhile) are counted, not fatal. Returns (changes made, errors).
pub async fn churn(
    api: Api<DynamicObject>,
    count: usize,
    stop: tokio::sync::watch::Receiver<bool>,
) -> (u64, u64) {
    let mut random = XorShift(0x9e37_79b9_7f4a_7c15);
    let mut names: Vec<String> = (0..count).map(|i| format!("mc-{i}")).collect();
    let mut next = count;
    let (mut changes, mut errors) = (0, 0);
    while !*stop.borrow() && !names.is_empty() {
        let index = random.below(names.len());
        let result = if random.below(4) == 0 {
            // Replace: delete one, create a new one.
            let gone = names[index].clone();
            let fresh = format!("mc-{next}");
            match api.delete(&gone, &DeleteParams::default()).await {
                Ok(_) => {
                    next += 1;
                    names[index] = fresh.clone();
                    create_memcached(&api, &fresh, 1 + random.below(3)).await
                }
                Err(error) => Err(error),
            }
        } else {
            let size = 1 + random.below(4);
            api.patch(
                &names[index],
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "size": size } })),
            )
            .await
            .map(|_| ())
        };
        match result {
            Ok(()) => changes += 1,
            Err(_) => errors += 1,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (changes, errors)
}

/// Waits until every Memcached's Deployment asks for its size and its status has observed its
/// latest generation.
///
/// # Errors
/// [`crate::Error::Timeout`] naming some of those still behind.
pub async fn wait_all_converged(
    api: &Api<DynamicObject>,
    deployments: &Api<Deployment>,
    timeout: Duration,
) -> Result<()> {
    crate::wait_for("every Memcached to converge", timeout, || async {
        let objects = api
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let deployed = deployments
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let mut behind = Vec::new();
        for object in &objects.items {
            let name = object.metadata.name.clone().unwrap_or_default();
            let size = object.data["spec"]["size"].as_i64();
            let replicas = deployed
                .items
                .iter()
                .find(|d| d.metadata.name.as_deref() == Some(name.as_str()))
                .and_then(|d| d.spec.replicas)
                .map(i64::from);
            let observed = object.data["status"]["observedGeneration"].as_i64();
            if replicas != size || observed != object.metadata.generation {
                behind.push(name);
            }
        }
        if behind.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{} of {} behind, e.g. {:?}",
                behind.len(),
                objects.items.len(),
                &behind[..behind.len().min(5)]
            ))
        }
    })
    .await?;
    Ok(())
}
