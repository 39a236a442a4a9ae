//! How the watches fill their caches: with a streamed initial list where the API server serves
//! one (KEP-3157's `sendInitialEvents`: the objects come as watch events, and the API server
//! never assembles a page of them), with paged lists where it does not.
//!
//! Which one is found out once per run, before the first watch starts, with a watch of that
//! watch's own resource that selects nothing: a server that streams answers it with the
//! bookmark that ends the initial events; one with the `WatchList` feature gate off refuses
//! `sendInitialEvents`; one older than 1.27 ignores it, and sends no such bookmark within
//! [`PROBE_TIMEOUT`]. The version alone cannot tell: the gate is on by default in 1.32 and from
//! 1.34, off in 1.33, and any cluster may turn it off. The answer is logged.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt as _;
use kube::api::{Api, WatchEvent, WatchParams};
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use tokio::sync::OnceCell;

/// How long the probe waits for the bookmark that ends the initial events.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// The annotation of the bookmark that ends a streamed list's initial events.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// A name no object has, for the probe to select nothing (names are DNS labels or subdomains,
/// which never start with a dot).
const NO_OBJECT: &str = ".initial-lists-probe";

/// Whether the watches of one run stream their initial lists: found out by the first watch to
/// start, then shared by all. Cloning shares it.
#[derive(Clone, Debug, Default)]
pub struct InitialLists {
    streamed: Arc<OnceCell<bool>>,
}

impl InitialLists {
    /// The lists found out on their own by the first watch.
    pub fn detect() -> Self {
        Self::default()
    }

    /// Lists that are paged, whatever the API server serves.
    pub fn paged() -> Self {
        Self {
            streamed: Arc::new(OnceCell::new_with(Some(false))),
        }
    }

    /// Whether the initial lists are streamed, probing `api` the first time.
    pub async fn streamed<K>(&self, api: Api<K>) -> bool
    where
        K: kube::Resource + Clone + DeserializeOwned + Debug,
    {
        *self
            .streamed
            .get_or_init(|| async move {
                match probe(&api).await {
                    Ok(()) => {
                        tracing::info!(
                            "initial lists: streamed (the API server sends initial events)"
                        );
                        true
                    }
                    Err(reason) => {
                        tracing::info!(%reason, "initial lists: paged");
                        false
                    }
                }
            })
            .await
    }

    /// `config` with the initial lists streamed or paged.
    pub fn config(config: watcher::Config, streamed: bool) -> watcher::Config {
        if streamed {
            config.streaming_lists()
        } else {
            config
        }
    }
}

/// Watches `api` for no object with `sendInitialEvents`: `Ok` once the bookmark that ends the
/// initial events comes, else why not.
async fn probe<K>(api: &Api<K>) -> Result<(), String>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug,
{
    let params = WatchParams::streaming_lists()
        .fields(&format!("metadata.name={NO_OBJECT}"))
        .timeout(u32::try_from(PROBE_TIMEOUT.as_secs()).unwrap_or(10));
    let answered = async {
        let events = api
            .watch(&params, "0")
            .await
            .map_err(|e| format!("refused: {e}"))?;
        let mut events = std::pin::pin!(events);
        while let Some(event) = events
            .try_next()
            .await
            .map_err(|e| format!("failed: {e}"))?
        {
            match event {
                WatchEvent::Bookmark(mark)
                    if mark.metadata.annotations.contains_key(INITIAL_EVENTS_END) =>
                {
                    return Ok(());
                }
                WatchEvent::Error(e) => return Err(format!("refused: {}", e.message)),
                _ => {}
            }
        }
        Err("the watch ended without the bookmark that ends the initial events".to_owned())
    };
    tokio::time::timeout(PROBE_TIMEOUT, answered)
        .await
        .unwrap_or_else(|_| Err(format!("no end of initial events within {PROBE_TIMEOUT:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{ApiServer, failure};
    use k8s_openapi::api::core::v1::ConfigMap;

    fn bookmark(annotations: serde_json::Value) -> serde_json::Value {
        serde_json::json!({
            "type": "BOOKMARK",
            "object": {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"resourceVersion": "7", "annotations": annotations},
            },
        })
    }

    async fn streamed(server: &ApiServer) -> bool {
        let api = Api::<ConfigMap>::namespaced(server.client(), "team-a");
        InitialLists::detect().streamed(api).await
    }

    #[tokio::test]
    async fn a_server_that_ends_the_initial_events_streams() {
        let server = ApiServer::answering(|_| {
            (
                200,
                bookmark(serde_json::json!({INITIAL_EVENTS_END: "true"})),
            )
        });
        assert!(streamed(&server).await);
        let sent = server.requests();
        assert_eq!(sent.len(), 1);
        for part in [
            "watch=true",
            "sendInitialEvents=true",
            "resourceVersionMatch=NotOlderThan",
        ] {
            assert!(sent[0].query.contains(part), "{part} in {}", sent[0].query);
        }
    }

    #[tokio::test]
    async fn a_server_that_refuses_or_ignores_initial_events_pages() {
        let forbidden =
            "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled";
        let refusing = ApiServer::answering(move |_| failure(422, "Invalid", forbidden));
        assert!(!streamed(&refusing).await);
        let ignoring = ApiServer::answering(|_| (200, bookmark(serde_json::json!({}))));
        assert!(!streamed(&ignoring).await);
    }

    #[tokio::test]
    async fn the_answer_is_found_once_and_shared() {
        let server = ApiServer::answering(|_| {
            (
                200,
                bookmark(serde_json::json!({INITIAL_EVENTS_END: "true"})),
            )
        });
        let lists = InitialLists::detect();
        let shared = lists.clone();
        for lists in [&lists, &shared] {
            let api = Api::<ConfigMap>::namespaced(server.client(), "team-a");
            assert!(lists.streamed(api).await);
        }
        assert_eq!(server.requests().len(), 1, "probed once");
        let paged = InitialLists::paged();
        assert!(!paged.streamed(Api::<ConfigMap>::all(server.client())).await);
        assert_eq!(server.requests().len(), 1, "paged lists probe nothing");
    }
}
