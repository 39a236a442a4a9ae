//! The watch of a sharded replica's own objects: only its slots, where the API server can
//! select them.
//!
//! An API server with KEP-5866's sharded lists and watches (`ShardedListAndWatch`, alpha in
//! 1.36) sends a client only the objects whose uid hashes into the ranges of its
//! `shardSelector`. A replica that owns a third of the slots then lists, caches and decodes a
//! third of the objects. Each time its slots change, the watch starts again with the new
//! selector: the objects of gained slots arrive with its list (and are triggered as new), those
//! of lost slots leave the cache at its end.
//!
//! Where the API server cannot select ([`crate::shards::ShardControl::lists_by_shard`] says
//! so), the watch takes everything, once, and the driver skips what is not its own: the same
//! objects are reconciled either way, since the driver checks every key against its slots.

use std::task::{Context, Poll};

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt as _};
use kube::client::Body;
use kube::runtime::watcher;
use tokio::sync::watch;

use crate::shards::Assignment;
use crate::slots::Slots;

/// A client that asks for the objects of `slots` only, on every request (the watch's lists and
/// watches are its only requests).
pub fn selecting(client: &kube::Client, slots: Slots) -> kube::Client {
    match slots.uid_selector() {
        Some(selector) => kube::Client::new(
            ShardSelected {
                inner: client.clone(),
                selector: query_escape(&selector),
            },
            client.default_namespace(),
        ),
        None => client.clone(),
    }
}

/// The service of [`selecting`]: `client` with `shardSelector` added to each request's query.
#[derive(Clone)]
struct ShardSelected {
    inner: kube::Client,
    /// The selector, escaped for a query.
    selector: String,
}

impl tower::Service<http::Request<Body>> for ShardSelected {
    type Response = http::Response<Body>;
    type Error = kube::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        let inner = self.inner.clone();
        let uri = with_query(request.uri(), "shardSelector", &self.selector);
        Box::pin(async move {
            *request.uri_mut() = uri.map_err(kube::Error::HttpError)?;
            inner.send(request).await
        })
    }
}

/// `uri` with `name=value` (already escaped) added to its query.
fn with_query(uri: &http::Uri, name: &str, value: &str) -> Result<http::Uri, http::Error> {
    let path = uri.path();
    let pair = format!("{name}={value}");
    let path_and_query = match uri.query() {
        Some(query) if !query.is_empty() => format!("{path}?{query}&{pair}"),
        _ => format!("{path}?{pair}"),
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(path_and_query.parse().map_err(http::Error::from)?);
    Ok(http::Uri::from_parts(parts)?)
}

/// `text` as a URL query value: every byte but the unreserved ones percent-encoded.
pub fn query_escape(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The events of `start(slots)`, from the first assignment on (a replica may need only a share
/// of the objects), started again with the slots of each new assignment while `by_shard()` says
/// the watch can select by shard; `start(None)` takes every object. With no slot it watches
/// nothing: its cache is emptied (an empty list) and waits. Each event comes with the
/// generation of the assignment its watch started for. Ends when the coordinator is gone.
pub fn restarting<K, S>(
    assignments: watch::Receiver<Assignment>,
    by_shard: impl Fn() -> bool + Send + Sync + Clone + 'static,
    start: impl Fn(Option<Slots>) -> S + Send + Sync + 'static,
) -> BoxStream<'static, (u64, watcher::Result<watcher::Event<K>>)>
where
    K: Send + 'static,
    S: Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
{
    let start = std::sync::Arc::new(start);
    futures::stream::unfold(assignments, move |mut assignments| {
        let (by_shard, start) = (by_shard.clone(), start.clone());
        async move {
            let assigned = assignments.wait_for(|a| a.generation > 0).await.is_ok();
            // `wait_for` still answers with the last value once the coordinator is gone.
            if !assigned || assignments.has_changed().is_err() {
                return None;
            }
            let (slots, generation) = {
                let assignment = assignments.borrow_and_update();
                (assignment.slots, assignment.generation)
            };
            let slots = by_shard().then_some(slots);
            let mut next = assignments.clone();
            // Ends this watch at the next assignment, once the API server can select by shard.
            let changed = async move {
                // Or when the coordinator is gone: the replica is stopping.
                while next.changed().await.is_ok() && !by_shard() {}
            };
            let events: BoxStream<'static, _> = match slots {
                Some(slots) if slots.is_empty() => {
                    let empty = [watcher::Event::Init, watcher::Event::InitDone].map(Ok);
                    futures::stream::iter(empty)
                        .chain(futures::stream::pending())
                        .boxed()
                }
                _ => start(slots).boxed(),
            };
            let events = events
                .take_until(changed)
                .map(move |event| (generation, event));
            Some((events, assignments))
        }
    })
    .flatten()
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_selector_joins_the_query_escaped() {
        let uri: http::Uri = "https://h/apis/g/v1/things?watch=true&limit=5"
            .parse()
            .expect("uri");
        let with = with_query(&uri, "shardSelector", &query_escape("shardRange(a, '0x0')"))
            .expect("a uri");
        assert_eq!(
            with.to_string(),
            "https://h/apis/g/v1/things?watch=true&limit=5&shardSelector=shardRange%28a%2C%20%270x0%27%29"
        );
        let bare: http::Uri = "/api/v1/pods".parse().expect("uri");
        assert_eq!(
            with_query(&bare, "s", "x").expect("a uri").to_string(),
            "/api/v1/pods?s=x"
        );
    }

    #[tokio::test]
    async fn a_new_assignment_starts_the_watch_again_with_its_slots() {
        let (send, assignments) = watch::channel(Assignment::default());
        let started = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let recorded = started.clone();
        let mut events = restarting::<(), _>(
            assignments,
            || true,
            move |slots| {
                recorded.lock().expect("not poisoned").push(slots);
                futures::stream::iter([Ok(watcher::Event::Init)]).chain(futures::stream::pending())
            },
        );
        let assign = |slots: Slots| {
            send.send_modify(|a| {
                a.slots = slots;
                a.generation += 1;
            });
        };
        // Nothing is watched before the first assignment.
        let waited = tokio::time::timeout(std::time::Duration::from_millis(50), events.next());
        assert!(waited.await.is_err());
        assign(Slots::one(3));
        assert!(matches!(
            events.next().await,
            Some((1, Ok(watcher::Event::Init)))
        ));
        assign(Slots::one(4));
        assert!(matches!(
            events.next().await,
            Some((2, Ok(watcher::Event::Init)))
        ));
        // No slot: an empty list, and no watch.
        assign(Slots::NONE);
        assert!(matches!(
            events.next().await,
            Some((3, Ok(watcher::Event::Init)))
        ));
        assert!(matches!(
            events.next().await,
            Some((3, Ok(watcher::Event::InitDone)))
        ));
        assert_eq!(
            *started.lock().expect("not poisoned"),
            [Some(Slots::one(3)), Some(Slots::one(4))]
        );
        drop(send);
        assert!(events.next().await.is_none(), "the coordinator is gone");
    }

    #[tokio::test]
    async fn without_sharded_lists_one_watch_takes_everything() {
        let (send, assignments) = watch::channel(Assignment::default());
        let started = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let recorded = started.clone();
        let mut events = restarting::<(), _>(
            assignments,
            || false,
            move |slots| {
                recorded.lock().expect("not poisoned").push(slots);
                futures::stream::iter([Ok(watcher::Event::Init)]).chain(futures::stream::pending())
            },
        );
        for slots in [Slots::one(3), Slots::NONE, Slots::ALL] {
            send.send_modify(|a| {
                a.slots = slots;
                a.generation += 1;
            });
        }
        assert!(matches!(
            events.next().await,
            Some((_, Ok(watcher::Event::Init)))
        ));
        let waited = tokio::time::timeout(std::time::Duration::from_millis(50), events.next());
        assert!(waited.await.is_err(), "never started again");
        assert_eq!(*started.lock().expect("not poisoned"), [None]);
    }
}
