//! The KeyValueStore controller end to end, with only the generated RBAC and the real
//! StatefulSet controller, scheduler and garbage collector:
//! - on the fake nodes, with volume claims bound to volumes the test makes (the fake nodes mount
//!   nothing);
//! - on the real node, with real redis servers (the image `cargo xtask image redis --load`
//!   builds from the distribution's package) on real volumes that the local-path provisioner
//!   makes for the cluster's default StorageClass.

mod workloads;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use apis::{KeyValueStore, KeyValueStoreSpec, Memcached, MemcachedSpec};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube_operator_runtime::conditions::READY;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use workloads::{Env, Scope, TIMEOUT, has_condition};

const CLAIMS: &str = "app.kubernetes.io/name=keyvaluestore,app.kubernetes.io/instance=store";

/// A volume for one claim of class `class`, on a path nothing mounts.
fn volume(name: &str, class: &str) -> Result<PersistentVolume> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": class,
            "hostPath": {"path": format!("/tmp/{name}")},
        },
    }))?)
}

/// Waits until the store reports `Ready=True` with `replicas` ready.
async fn ready(env: &Env, replicas: i32) -> Result<()> {
    let stores = env.api::<KeyValueStore>();
    testkit::wait_for(
        &format!("the store to be Ready with {replicas} replicas"),
        TIMEOUT,
        || async {
            let store = stores.get("store").await.map_err(|e| e.to_string())?;
            let status = store.status.unwrap_or_default();
            if status.ready_replicas == replicas && has_condition(&status.conditions, READY, "True")
            {
                Ok(())
            } else {
                Err(format!("{status:?}"))
            }
        },
    )
    .await?;
    Ok(())
}

/// The configuration hash of `set`'s pod template.
fn config_hash(set: &StatefulSet) -> Option<String> {
    let template = set.spec.template.metadata.as_ref()?;
    template
        .annotations
        .as_ref()?
        .get(concat!(product::group!(cache), "/config-hash"))
        .cloned()
}

#[tokio::test]
async fn a_store_converges_rolls_on_a_config_change_and_takes_its_volumes_along() -> Result<()> {
    let env = Env::start("kvs", None, "keyvaluestore", Scope::Namespace).await?;
    let class = format!("{}-volumes", env.namespace());
    let volumes = Api::<PersistentVolume>::all(env.cluster.client.clone());
    let names: Vec<String> = (0..2).map(|i| format!("{class}-{i}")).collect();
    let result = async {
        for name in &names {
            volumes
                .create(&PostParams::default(), &volume(name, &class)?)
                .await?;
        }
        let store = KeyValueStore::new(
            "store",
            KeyValueStoreSpec {
                replicas: 2,
                image: apis::keyvaluestore::DEFAULT_IMAGE.to_owned(),
                max_memory: Quantity("64Mi".into()),
                config: BTreeMap::new(),
                storage: Quantity("1Gi".into()),
                storage_class_name: Some(class.clone()),
            },
        );
        env.api::<KeyValueStore>()
            .create(&PostParams::default(), &store)
            .await?;
        ready(&env, 2).await?;
        let sets = env.api::<StatefulSet>();
        let before = config_hash(&sets.get("store").await?);
        ensure!(before.is_some(), "the pod template carries the config hash");

        // A config line changes: the pods roll to a template of another hash.
        let patch = json!({"spec": {"config": {"maxmemory-policy": "allkeys-lru"}}});
        env.api::<KeyValueStore>()
            .patch("store", &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        testkit::wait_for("the StatefulSet to roll", TIMEOUT, || async {
            let set = sets.get("store").await.map_err(|e| e.to_string())?;
            let status = set.status.clone().unwrap_or_default();
            let rolled = config_hash(&set) != before
                && status.update_revision.is_some()
                && status.update_revision == status.current_revision
                && status.updated_replicas == Some(2);
            if rolled {
                Ok(())
            } else {
                Err(format!("{status:?}"))
            }
        })
        .await?;
        ready(&env, 2).await?;
        let config = env.kubectl(&[
            "get",
            "configmap",
            "store-config",
            "-o",
            "jsonpath={.data.redis\\.conf}",
        ])?;
        ensure!(config.contains("maxmemory-policy allkeys-lru"), "{config}");

        // Deleting the store deletes its claims before it goes.
        let claims = env.api::<PersistentVolumeClaim>();
        let bound = claims.list(&ListParams::default().labels(CLAIMS)).await?;
        ensure!(
            bound.items.len() == 2,
            "a claim per replica: {}",
            bound.items.len()
        );
        env.api::<KeyValueStore>()
            .delete("store", &DeleteParams::default())
            .await?;
        testkit::wait_for("the store and its claims to be gone", TIMEOUT, || async {
            let left = claims
                .list(&ListParams::default().labels(CLAIMS))
                .await
                .map_err(|e| e.to_string())?;
            let store = env
                .api::<KeyValueStore>()
                .get_opt("store")
                .await
                .map_err(|e| e.to_string())?;
            if left.items.is_empty() && store.is_none() {
                Ok(())
            } else {
                Err(format!(
                    "{} claims, store {}",
                    left.items.len(),
                    store.is_some()
                ))
            }
        })
        .await?;
        Ok(())
    }
    .await;
    for name in &names {
        let _ = volumes.delete(name, &DeleteParams::default()).await;
    }
    env.finish(result)
}

/// A store's rollout costs no more status writes than a Memcached's, counted by the API server
/// (its audit log): both converge on the real node, then both roll their pods at once (a config
/// line, the item memory), and the writes to each one's status until both have settled are
/// compared. A StatefulSet's rollout (one pod at a time, each Ready before the next) passes
/// through more states than a Deployment's; the status writer holds them back alike.
#[tokio::test]
async fn a_store_rollout_writes_no_more_statuses_than_a_memcached_rollout() -> Result<()> {
    let env = Env::on_real_node("kvs-writes", "memcached,keyvaluestore", Scope::Namespace).await?;
    let result = async {
        let mut store = store_spec(3);
        store.image = env.cluster.loaded_image(REDIS_IMAGE, "redis")?;
        env.api::<KeyValueStore>()
            .create(&PostParams::default(), &KeyValueStore::new("store", store))
            .await?;
        let memcached_image = env
            .cluster
            .loaded_image(concat!(product::name!(), ".local/memcached"), "memcached")?;
        let mc = Memcached::new("cache", MemcachedSpec::new(3, memcached_image));
        env.api::<Memcached>()
            .create(&PostParams::default(), &mc)
            .await?;
        settled(&env).await?;
        // A write of the first rollout still on its way lands within the hold that ends a
        // rollout: it is not the measured rollout's.
        tokio::time::sleep(Duration::from_secs(2)).await;

        let rollout_started = k8s_openapi::jiff::Timestamp::now();
        let store_patch = json!({"spec": {"config": {"maxmemory-policy": "allkeys-lru"}}});
        env.api::<KeyValueStore>()
            .patch(
                "store",
                &PatchParams::default(),
                &Patch::Merge(&store_patch),
            )
            .await?;
        let cache_patch = json!({"spec": {"memory": "32Mi"}});
        env.api::<Memcached>()
            .patch(
                "cache",
                &PatchParams::default(),
                &Patch::Merge(&cache_patch),
            )
            .await?;
        let rolling = std::time::Instant::now();
        settled(&env).await?;
        let rollout = rolling.elapsed();
        // A write still on its way would land within the hold that ends a rollout.
        tokio::time::sleep(Duration::from_secs(2)).await;

        let namespace = env.namespace().to_owned();
        let files = env.cluster.state.audit_log_files()?;
        let events = testkit::read_audit_files_where(&files, |line| line.contains(&namespace))?;
        let writes = |resource: &str| {
            events
                .iter()
                .filter(|e| {
                    e.namespace == namespace
                        && e.resource == resource
                        && e.subresource == "status"
                        && e.received >= rollout_started
                        && e.succeeded()
                })
                .map(|e| format!("{} {} at {}", e.verb, e.name, e.received))
                .collect::<Vec<_>>()
        };
        let (store, cache) = (writes("keyvaluestores"), writes("memcacheds"));
        let (store_writes, cache_writes) = (store.len(), cache.len());
        // A rollout still in motion reports its progress once per longest hold, whatever owns
        // it: a StatefulSet's, one pod at a time, may run past one on a loaded machine. And a
        // rollout whose state stood past the hold reports that state once (its start): the
        // StatefulSet's one phase for all three pods can, where the Deployment's move on.
        let spacing = kube_operator_runtime::status_writer::PROGRESS_MAX_HOLD;
        let hold = kube_operator_runtime::status_writer::PROGRESS_HOLD;
        let progress_reports = (rollout.as_secs_f64() / spacing.as_secs_f64()).floor() as usize
            + usize::from(rollout > hold);
        println!(
            "status writes during a rollout of 3 pods ({rollout:.1?} until both settled): \
             KeyValueStore {store_writes}, Memcached {cache_writes}"
        );
        ensure!(store_writes > 0, "the store reported its rollout");
        ensure!(
            store_writes <= cache_writes + progress_reports,
            "the store's rollout wrote its status {store_writes} times in {rollout:.1?}, \
             Memcached's {cache_writes} (plus {progress_reports} progress reports allowed: one \
             past the {hold:?} hold, one per {spacing:?}), the rollout starting at \
             {rollout_started}: {store:?}, {cache:?}"
        );
        Ok(())
    }
    .await;
    env.finish(result)
}

/// A store of `replicas` servers of the default image, memory and size.
fn store_spec(replicas: i32) -> KeyValueStoreSpec {
    KeyValueStoreSpec {
        replicas,
        image: apis::keyvaluestore::DEFAULT_IMAGE.to_owned(),
        max_memory: Quantity("64Mi".into()),
        config: BTreeMap::new(),
        storage: Quantity("1Gi".into()),
        storage_class_name: None,
    }
}

/// Waits until the store `store` and the Memcached `cache` report their current generation's
/// rollout done: 3 ready replicas each, the store `Ready`, the cache `Available` and no longer
/// `Progressing`.
async fn settled(env: &Env) -> Result<()> {
    testkit::wait_for("the store and the cache to settle", TIMEOUT, || async {
        let store = env
            .api::<KeyValueStore>()
            .get("store")
            .await
            .map_err(|e| e.to_string())?;
        let cache = env
            .api::<Memcached>()
            .get("cache")
            .await
            .map_err(|e| e.to_string())?;
        let (store_status, cache_status) = (
            store.status.clone().unwrap_or_default(),
            cache.status.clone().unwrap_or_default(),
        );
        let store_done = store_status.observed_generation == store.metadata.generation
            && store_status.ready_replicas == 3
            && has_condition(&store_status.conditions, READY, "True");
        let cache_done = cache_status.observed_generation == cache.metadata.generation
            && cache_status.ready_replicas == 3
            && cache_status.nodes.len() == 3
            && has_condition(&cache_status.conditions, "Available", "True")
            && has_condition(&cache_status.conditions, "Progressing", "False");
        if store_done && cache_done {
            Ok(())
        } else {
            Err(format!("store {store_status:?}; cache {cache_status:?}"))
        }
    })
    .await?;
    Ok(())
}

/// The repository of the redis image built from the distribution's package.
const REDIS_IMAGE: &str = concat!(product::name!(), ".local/redis");

#[tokio::test]
async fn a_store_on_the_real_node_serves_keys_from_real_volumes_that_go_with_it() -> Result<()> {
    let env = Env::on_real_node("real-kvs", "keyvaluestore", Scope::Namespace).await?;
    let result = serves_keys_from_real_volumes(&env).await;
    env.finish(result)
}

async fn serves_keys_from_real_volumes(env: &Env) -> Result<()> {
    let image = env.cluster.loaded_image(REDIS_IMAGE, "redis")?;
    let store = KeyValueStore::new(
        "store",
        KeyValueStoreSpec {
            replicas: 2,
            image,
            max_memory: Quantity("32Mi".into()),
            config: BTreeMap::new(),
            storage: Quantity("64Mi".into()),
            // The cluster's default class: the local-path provisioner on the real node.
            storage_class_name: None,
        },
    );
    env.api::<KeyValueStore>()
        .create(&PostParams::default(), &store)
        .await?;
    ready(env, 2)
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", pod_report(env)))?;

    // Every server answers, with `maxmemory` from the spec, and keeps a key.
    for pod in ["store-0", "store-1"] {
        let ip = pod_ip(env, pod).await?;
        let maxmemory = redis(ip, &["CONFIG", "GET", "maxmemory"]).await?;
        ensure!(
            maxmemory == ["maxmemory", "33554432"],
            "{pod}: maxmemory {maxmemory:?}"
        );
        ensure!(
            redis(ip, &["SET", "owner", pod]).await? == ["OK"],
            "{pod}: SET"
        );
    }
    let volumes = Api::<PersistentVolume>::all(env.cluster.client.clone());
    let claims = env.api::<PersistentVolumeClaim>();
    let bound = claims.list(&ListParams::default().labels(CLAIMS)).await?;
    let volume_names: Vec<String> = bound
        .items
        .iter()
        .filter_map(|claim| claim.spec.as_ref()?.volume_name.clone())
        .collect();
    ensure!(
        volume_names.len() == 2,
        "two claims bound by the provisioner: {volume_names:?}"
    );

    // A config change rolls the pods; each new server runs the new config and still has its key
    // (appendonly, on its volume).
    let sets = env.api::<StatefulSet>();
    let before = config_hash(&sets.get("store").await?);
    let patch = json!({"spec": {"config": {"maxmemory-policy": "allkeys-lru"}}});
    env.api::<KeyValueStore>()
        .patch("store", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    testkit::wait_for("the servers to run the new config", TIMEOUT, || async {
        let set = sets.get("store").await.map_err(|e| e.to_string())?;
        if config_hash(&set) == before {
            return Err("the pod template has the old hash".to_owned());
        }
        for pod in ["store-0", "store-1"] {
            let ip = pod_ip(env, pod).await.map_err(|e| format!("{e:#}"))?;
            let policy = redis(ip, &["CONFIG", "GET", "maxmemory-policy"])
                .await
                .map_err(|e| format!("{pod}: {e:#}"))?;
            if policy != ["maxmemory-policy", "allkeys-lru"] {
                return Err(format!("{pod}: {policy:?}"));
            }
        }
        Ok(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", pod_report(env)))?;
    ready(env, 2).await?;
    for pod in ["store-0", "store-1"] {
        let value = redis(pod_ip(env, pod).await?, &["GET", "owner"]).await?;
        ensure!(
            value == [pod],
            "{pod} kept its key on its volume: {value:?}"
        );
    }

    // Deleting the store deletes its claims, and the provisioner their volumes and the
    // volumes' directories on the node (`pvc-<uid>_<namespace>_<claim>`).
    let directories = env.cluster.real_node()?.dir.join("local-path");
    let of_this_test = format!("_{}_", env.namespace());
    let directories_left = || -> Result<Vec<String>, String> {
        let entries = std::fs::read_dir(&directories)
            .map_err(|e| format!("reading {}: {e}", directories.display()))?;
        Ok(entries
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .filter(|name| name.contains(&of_this_test))
            .collect())
    };
    let made = directories_left().map_err(anyhow::Error::msg)?;
    ensure!(made.len() == 2, "a directory per volume: {made:?}");
    env.api::<KeyValueStore>()
        .delete("store", &DeleteParams::default())
        .await?;
    testkit::wait_for(
        "the store, its claims, their volumes and directories to be gone",
        TIMEOUT,
        || async {
            let left = claims
                .list(&ListParams::default().labels(CLAIMS))
                .await
                .map_err(|e| e.to_string())?;
            let store = env
                .api::<KeyValueStore>()
                .get_opt("store")
                .await
                .map_err(|e| e.to_string())?;
            let mut volumes_left = Vec::new();
            for name in &volume_names {
                if volumes
                    .get_opt(name)
                    .await
                    .map_err(|e| e.to_string())?
                    .is_some()
                {
                    volumes_left.push(name.clone());
                }
            }
            let directories = directories_left()?;
            if left.items.is_empty()
                && store.is_none()
                && volumes_left.is_empty()
                && directories.is_empty()
            {
                Ok(())
            } else {
                Err(format!(
                    "{} claims, store {}, volumes {volumes_left:?}, directories {directories:?}",
                    left.items.len(),
                    store.is_some()
                ))
            }
        },
    )
    .await?;
    Ok(())
}

/// The IP of pod `name`, once it is Ready.
async fn pod_ip(env: &Env, name: &str) -> Result<IpAddr> {
    let pod = env.api::<Pod>().get(name).await?;
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    ensure!(ready, "pod {name} is not Ready");
    let spec = pod.spec.clone().unwrap_or_default();
    ensure!(
        spec.node_name.as_deref() == Some(localcluster::node::NODE_NAME),
        "pod {name} runs on {:?}, not on the real node",
        spec.node_name
    );
    Ok(pod
        .status
        .and_then(|s| s.pod_ip)
        .with_context(|| format!("pod {name} has no IP"))?
        .parse()?)
}

/// A connection to the redis server at `ip`. The server has no readiness probe (like
/// memcached's), so its pod can report ready a moment before it listens: a refused
/// connection is tried again, for up to 10 s.
async fn connect(ip: IpAddr) -> Result<tokio::net::TcpStream> {
    let give_up = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let connect = tokio::net::TcpStream::connect((ip, 6379));
        match tokio::time::timeout(Duration::from_secs(5), connect)
            .await
            .context("connecting timed out")?
        {
            Ok(stream) => return Ok(stream),
            Err(e)
                if e.kind() == std::io::ErrorKind::ConnectionRefused
                    && tokio::time::Instant::now() < give_up =>
            {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e).with_context(|| format!("connecting to {ip}:6379")),
        }
    }
}

/// Sends one command to the redis server at `ip` and returns its answer: a status, a bulk
/// string or an array of bulk strings, as strings.
async fn redis(ip: IpAddr, args: &[&str]) -> Result<Vec<String>> {
    let stream = connect(ip).await?;
    let (read, mut write) = stream.into_split();
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    write.write_all(request.as_bytes()).await?;
    let mut reader = BufReader::new(read);
    let answer = tokio::time::timeout(Duration::from_secs(5), async {
        let header = read_line(&mut reader).await?;
        match header.split_at(1) {
            ("+", status) => Ok(vec![status.to_owned()]),
            ("$", _) => Ok(vec![read_bulk(&mut reader, &header).await?]),
            ("*", count) => {
                let mut items = Vec::new();
                for _ in 0..count.parse::<usize>()? {
                    let header = read_line(&mut reader).await?;
                    items.push(read_bulk(&mut reader, &header).await?);
                }
                Ok(items)
            }
            _ => bail!("{args:?} answered {header:?}"),
        }
    });
    answer.await.context("no answer within 5s")?
}

async fn read_line(reader: &mut BufReader<tokio::net::tcp::OwnedReadHalf>) -> Result<String> {
    let mut line = String::new();
    if reader.read_line(&mut line).await? == 0 {
        bail!("the server closed the connection");
    }
    Ok(line.trim_end_matches("\r\n").to_owned())
}

/// The bulk string whose `$<length>` header was just read.
async fn read_bulk(
    reader: &mut BufReader<tokio::net::tcp::OwnedReadHalf>,
    header: &str,
) -> Result<String> {
    let length: usize = header
        .strip_prefix('$')
        .with_context(|| format!("a bulk string, not {header:?}"))?
        .parse()
        .with_context(|| format!("a bulk string's length, not {header:?}"))?;
    let mut data = vec![0; length + 2];
    reader.read_exact(&mut data).await?;
    data.truncate(length);
    Ok(String::from_utf8(data)?)
}

/// The test namespace's pods, claims and events, for a failure message.
fn pod_report(env: &Env) -> String {
    env.kubectl(&["get", "pods,pvc", "-o", "wide"])
        .and_then(|pods| {
            let events = env.kubectl(&["get", "events", "--sort-by=.lastTimestamp"])?;
            Ok(format!("pods and claims:\n{pods}\nevents:\n{events}"))
        })
        .unwrap_or_else(|e| format!("(could not list pods: {e})"))
}
