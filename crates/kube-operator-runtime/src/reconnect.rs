//! How a broken watch comes back: when to wait, and when to list again instead of resuming.
//!
//! kube's watcher resumes a watch that could not start from the resourceVersion it last saw,
//! and `StreamBackoff` waits after every error alike. After an API server restarts, both cost
//! seconds: the new server's watch cache begins at the current version, so a watch resumed from
//! an older one is held until that cache is ready and then told its version is too old (410
//! Gone), and the wait before the re-list that follows is the backoff grown during the outage.
//! Measured after a 20 s outage, the Memcached watch acted on changes made the moment the API
//! server was ready only six seconds later.
//!
//! [`reconnecting`] handles the two cases apart. A watch that could not start lists again at
//! its next attempt (a list is answered from etcd while the watch cache fills), unless the
//! server said it was overloaded (429), where a list would cost it more than a watch; a 410
//! asks for that re-list at once. Every other error waits its turn of [`WatchBackoff`], which
//! starts again from its first step once the server has answered (any event but the
//! [`Event::Init`] that a new watcher sends before its list).
//!
//! A restarted API server answers before it serves: it denies requests (403) until its
//! authorizer has read the RBAC objects, and a custom resource's API is unavailable (503) until
//! its CRD is loaded, for about a second. A watch whose first attempt after the outage met
//! one of those answers would wait the step its backoff had grown to while the server was
//! unreachable (up to [`crate::backoff::WATCH_MAX_DELAY`]), and that wait could be most of the
//! time the manager took to act again. So the first answer after the server could not be reached
//! starts the backoff again from its first step; later errors grow it as before, until events
//! flow again (a server that keeps denying still ends at the cap, and one that flaps between
//! unreachable and answering gets this shortcut once). An overloaded server's 429 does not
//! count as that answer: coming back sooner is what it asked clients not to do.

use std::time::Duration;

use futures::{Stream, StreamExt, stream};
use kube::runtime::utils::Backoff as _;
use kube::runtime::watcher::{self, Event};

use crate::backoff::WatchBackoff;

/// What a watch does after an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Retry {
    /// Go on at once: the watcher lists again next, which is what the error asked for.
    Now,
    /// Wait the backoff, then go on where the watch was.
    Later,
    /// Wait the backoff, then list again with a new watcher.
    Relist,
}

fn retry_after(error: &watcher::Error) -> Retry {
    match error {
        watcher::Error::WatchError(status) if status.code == 410 => Retry::Now,
        // An overloaded server asks clients to come back later; a list would cost it more.
        watcher::Error::WatchStartFailed(kube::Error::Api(status)) if status.code == 429 => {
            Retry::Later
        }
        watcher::Error::WatchStartFailed(_) => Retry::Relist,
        _ => Retry::Later,
    }
}

/// Whether the API server was last heard from, which decides when an error restarts the backoff.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Server {
    /// Events flowed since the last error that could not reach it.
    Serving,
    /// It could not be reached since it last served events.
    Unreachable,
    /// It answered (with an error) since it could not be reached; the backoff started again.
    Answering,
}

impl Server {
    /// The state after `error`, and whether the backoff starts again from its first step.
    fn after(self, error: &watcher::Error) -> (Self, bool) {
        match (self, answer_of(error)) {
            (_, Some(429)) => (self, false),
            (Self::Unreachable, Some(_)) => (Self::Answering, true),
            (Self::Serving, None) => (Self::Unreachable, false),
            (state, _) => (state, false),
        }
    }
}

/// The status code of an error the API server answered with, or `None` when it was not reached
/// (or the error came from the client itself).
fn answer_of(error: &watcher::Error) -> Option<u16> {
    match error {
        watcher::Error::WatchError(status) => Some(status.code),
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => Some(status.code),
        _ => None,
    }
}

/// The events of the watches `start` begins, retried as the module describes with `backoff`
/// (reset by any event that is not an error). Errors are passed on for the caller to log.
pub fn reconnecting<K, S>(
    start: impl FnMut() -> S + Send + 'static,
    backoff: WatchBackoff,
) -> impl Stream<Item = watcher::Result<Event<K>>> + Send
where
    K: Send + 'static,
    S: Stream<Item = watcher::Result<Event<K>>> + Send + 'static,
{
    struct State<F, S> {
        start: F,
        watch: Option<std::pin::Pin<Box<S>>>,
        backoff: WatchBackoff,
        wait: Option<Duration>,
        server: Server,
    }
    let state = State {
        start,
        watch: None,
        backoff,
        wait: None,
        server: Server::Serving,
    };
    stream::unfold(state, |mut state| async move {
        if let Some(wait) = state.wait.take() {
            tokio::time::sleep(wait).await;
        }
        let watch = match &mut state.watch {
            Some(watch) => watch,
            empty => empty.insert(Box::pin((state.start)())),
        };
        let item = watch.next().await?;
        match &item {
            // A new watcher announces its list before it asks for it: nothing has answered yet.
            // Reset by that, the backoff of a watch whose lists keep failing (an API server
            // away, overloaded, or denying the list) would never grow past its first step.
            Ok(Event::Init) => {}
            Ok(_) => {
                state.backoff.reset();
                state.server = Server::Serving;
            }
            Err(error) => {
                let (server, restart_backoff) = state.server.after(error);
                state.server = server;
                if restart_backoff {
                    state.backoff.reset();
                }
                match retry_after(error) {
                    Retry::Now => {}
                    Retry::Later => state.wait = state.backoff.next(),
                    Retry::Relist => {
                        state.watch = None;
                        state.wait = state.backoff.next();
                    }
                }
            }
        }
        Some((item, state))
    })
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use futures::channel::mpsc;
    use kube::core::Status;

    use super::*;

    fn gone() -> watcher::Error {
        watcher::Error::WatchError(Box::new(
            Status::failure("too old resource version", "Expired").with_code(410),
        ))
    }

    fn refused() -> watcher::Error {
        watcher::Error::WatchStartFailed(kube::Error::Service("connection refused".into()))
    }

    fn list_failed() -> watcher::Error {
        watcher::Error::InitialListFailed(kube::Error::Service("connection refused".into()))
    }

    /// A list the API server answered with `code`.
    fn list_answered(code: u16) -> watcher::Error {
        watcher::Error::InitialListFailed(kube::Error::Api(Box::new(
            Status::failure("", "").with_code(code),
        )))
    }

    #[test]
    fn the_first_answer_after_the_server_was_unreachable_restarts_the_backoff() {
        let serving = Server::Serving;
        assert_eq!(serving.after(&list_failed()), (Server::Unreachable, false));
        assert_eq!(
            serving.after(&list_answered(403)),
            (Server::Serving, false),
            "an answer while serving is an ordinary error"
        );
        let unreachable = Server::Unreachable;
        assert_eq!(
            unreachable.after(&list_answered(403)),
            (Server::Answering, true)
        );
        assert_eq!(unreachable.after(&gone()), (Server::Answering, true));
        assert_eq!(
            unreachable.after(&list_answered(429)),
            (Server::Unreachable, false),
            "an overloaded server asked for the grown wait"
        );
        assert_eq!(
            unreachable.after(&list_failed()),
            (Server::Unreachable, false)
        );
        let answering = Server::Answering;
        assert_eq!(
            answering.after(&list_failed()),
            (Server::Answering, false),
            "once per outage"
        );
        assert_eq!(
            answering.after(&list_answered(503)),
            (Server::Answering, false)
        );
    }

    #[test]
    fn each_error_is_retried_its_own_way() {
        assert_eq!(retry_after(&gone()), Retry::Now);
        assert_eq!(retry_after(&refused()), Retry::Relist);
        assert_eq!(retry_after(&list_failed()), Retry::Later);
        let other = watcher::Error::WatchError(Box::new(
            Status::failure("internal", "InternalError").with_code(500),
        ));
        assert_eq!(retry_after(&other), Retry::Later);
        assert_eq!(
            retry_after(&watcher::Error::NoResourceVersion),
            Retry::Later
        );
        let status = |code| {
            watcher::Error::WatchStartFailed(kube::Error::Api(Box::new(
                Status::failure("", "").with_code(code),
            )))
        };
        assert_eq!(retry_after(&status(429)), Retry::Later, "overloaded");
        assert_eq!(retry_after(&status(503)), Retry::Relist, "not served yet");
    }

    type Item = watcher::Result<Event<u32>>;

    /// Watches whose items the test sends, one channel per watch started, and how many were.
    struct Watches {
        senders: Arc<Mutex<Vec<mpsc::UnboundedSender<Item>>>>,
    }

    impl Watches {
        fn new() -> (
            Self,
            impl FnMut() -> mpsc::UnboundedReceiver<Item> + Send + 'static,
        ) {
            let senders = Arc::new(Mutex::new(Vec::new()));
            let started = Arc::clone(&senders);
            let start = move || {
                let (tx, rx) = mpsc::unbounded();
                started.lock().expect("not poisoned").push(tx);
                rx
            };
            (Self { senders }, start)
        }

        fn started(&self) -> usize {
            self.senders.lock().expect("not poisoned").len()
        }

        /// Sends `item` on the latest watch.
        fn send(&self, item: Item) {
            let senders = self.senders.lock().expect("not poisoned");
            senders
                .last()
                .expect("a watch")
                .unbounded_send(item)
                .expect("open");
        }
    }

    /// The events of [`reconnecting`] over [`Watches`], polled once so the first watch has
    /// started (and nothing has come of it yet).
    async fn first_watch() -> (Watches, futures::stream::BoxStream<'static, Item>) {
        let (watches, start) = Watches::new();
        let mut events = reconnecting(start, WatchBackoff::new(Duration::from_secs(2))).boxed();
        let waiting = tokio::time::timeout(Duration::from_millis(1), events.next()).await;
        assert!(waiting.is_err(), "nothing sent yet");
        assert_eq!(watches.started(), 1);
        (watches, events)
    }

    fn applied(item: Option<Item>) -> u32 {
        match item {
            Some(Ok(Event::Apply(n))) => n,
            other => panic!("expected an applied object, got {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_that_cannot_start_lists_again_after_the_backoff() {
        let (watches, mut events) = first_watch().await;
        watches.send(Ok(Event::Apply(1)));
        assert_eq!(applied(events.next().await), 1);

        watches.send(Err(refused()));
        assert!(matches!(
            events.next().await,
            Some(Err(watcher::Error::WatchStartFailed(_)))
        ));
        let before = tokio::time::Instant::now();
        let next = tokio::spawn(async move {
            let item = events.next().await;
            (item, tokio::time::Instant::now())
        });
        // The new watch starts only after the first step of the backoff (100 ms).
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(watches.started(), 1);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(watches.started(), 2, "a new watcher, which lists first");
        watches.send(Ok(Event::Apply(2)));
        let (item, at) = next.await.expect("joined");
        assert_eq!(applied(item), 2);
        assert!(at - before >= Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn a_gone_watch_lists_again_at_once_and_other_errors_wait() {
        let (watches, mut events) = first_watch().await;
        let started = tokio::time::Instant::now();
        // Two list failures grow the backoff to 200 ms.
        watches.send(Err(list_failed()));
        watches.send(Err(list_failed()));
        watches.send(Err(gone()));
        watches.send(Ok(Event::Apply(7)));
        for _ in 0..2 {
            assert!(matches!(
                events.next().await,
                Some(Err(watcher::Error::InitialListFailed(_)))
            ));
        }
        let after_waits = tokio::time::Instant::now();
        assert!(
            after_waits - started >= Duration::from_millis(100),
            "waited after the first"
        );
        assert!(matches!(
            events.next().await,
            Some(Err(watcher::Error::WatchError(_)))
        ));
        let gone_at = tokio::time::Instant::now();
        assert!(
            gone_at - after_waits >= Duration::from_millis(200),
            "waited after the second"
        );
        assert_eq!(applied(events.next().await), 7);
        assert_eq!(tokio::time::Instant::now(), gone_at, "no wait after a 410");
        assert_eq!(
            watches.started(),
            1,
            "the watcher relists by itself after a 410"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_event_resets_the_backoff() {
        let (watches, mut events) = first_watch().await;
        for _ in 0..4 {
            watches.send(Err(list_failed()));
        }
        watches.send(Ok(Event::Apply(1)));
        watches.send(Err(list_failed()));
        watches.send(Ok(Event::Apply(2)));
        for _ in 0..4 {
            assert!(events.next().await.is_some_and(|e| e.is_err()));
        }
        assert_eq!(applied(events.next().await), 1);
        assert!(events.next().await.is_some_and(|e| e.is_err()));
        let before = tokio::time::Instant::now();
        assert_eq!(applied(events.next().await), 2);
        assert_eq!(
            tokio::time::Instant::now() - before,
            Duration::from_millis(100),
            "back to the first step"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn lists_that_keep_failing_back_off_though_each_new_watcher_announces_its_list() {
        let (watches, mut events) = first_watch().await;
        // A kube watcher's cycle while the API server is away: `Init`, then the failed list.
        for _ in 0..4 {
            watches.send(Ok(Event::Init));
            watches.send(Err(list_failed()));
        }
        watches.send(Ok(Event::Apply(1)));
        let mut waits = Vec::new();
        let mut last = tokio::time::Instant::now();
        for _ in 0..4 {
            assert!(matches!(events.next().await, Some(Ok(Event::Init))));
            assert!(matches!(
                events.next().await,
                Some(Err(watcher::Error::InitialListFailed(_)))
            ));
            let now = tokio::time::Instant::now();
            waits.push((now - last).as_millis());
            last = now;
        }
        assert_eq!(applied(events.next().await), 1);
        waits.push((tokio::time::Instant::now() - last).as_millis());
        assert_eq!(
            waits,
            [0, 100, 200, 400, 800],
            "doubling after each failed list"
        );
    }

    /// The waits between the items of `events` once `sent` have been sent, the first counted
    /// from now; the last item is an applied object.
    async fn waits_between(
        watches: &Watches,
        events: &mut futures::stream::BoxStream<'static, Item>,
        sent: Vec<Item>,
    ) -> Vec<u128> {
        let count = sent.len();
        for item in sent {
            watches.send(item);
        }
        let mut waits = Vec::new();
        let mut last = tokio::time::Instant::now();
        for _ in 0..count {
            assert!(events.next().await.is_some());
            let now = tokio::time::Instant::now();
            waits.push((now - last).as_millis());
            last = now;
        }
        waits
    }

    #[tokio::test(start_paused = true)]
    async fn a_restarted_server_is_asked_again_soon_after_its_first_answer() {
        let (watches, mut events) = first_watch().await;
        let waits = waits_between(
            &watches,
            &mut events,
            vec![
                // Away: the backoff grows to 800 ms.
                Err(list_failed()),
                Err(list_failed()),
                Err(list_failed()),
                Err(list_failed()),
                // Back, but denying until its authorizer has read RBAC.
                Err(list_answered(403)),
                Err(list_answered(403)),
                // A moment unreachable again, and denying again: no second restart.
                Err(list_failed()),
                Err(list_answered(403)),
                Ok(Event::Apply(1)),
            ],
        )
        .await;
        assert_eq!(waits, [0, 100, 200, 400, 800, 100, 200, 400, 800]);

        // Served again: the next outage gets the shortcut too.
        let waits = waits_between(
            &watches,
            &mut events,
            vec![
                Err(list_failed()),
                Err(list_failed()),
                Err(list_answered(503)),
                Ok(Event::Apply(2)),
            ],
        )
        .await;
        assert_eq!(waits, [0, 100, 200, 100]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_overloaded_server_is_given_the_grown_wait() {
        let (watches, mut events) = first_watch().await;
        let waits = waits_between(
            &watches,
            &mut events,
            vec![
                Err(list_failed()),
                Err(list_failed()),
                Err(list_answered(429)),
                Ok(Event::Apply(1)),
            ],
        )
        .await;
        assert_eq!(waits, [0, 100, 200, 400]);
    }

    #[tokio::test]
    async fn the_stream_ends_when_the_watch_does() {
        let mut events = Box::pin(reconnecting(
            || stream::iter([Ok(Event::Apply(1_u32))]),
            WatchBackoff::new(Duration::from_secs(2)),
        ));
        assert_eq!(applied(events.next().await), 1);
        assert!(events.next().await.is_none());
    }
}
