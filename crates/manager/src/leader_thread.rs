//! Leader election on a thread of its own, with its own runtime and its own API client, so that
//! nothing else the process does can delay a renewal: not a flood of webhook reviews or
//! scrapes, not thousands of reconciles queued on the main runtime's workers, not the main
//! client's connection pool. Only the operating system schedules it.
//!
//! [`ElectorThread`] offers what [`LeaderElector`] does (acquire, hold, release) to the main
//! runtime, and runs each call on the thread. Dropping a pending call stops it there as
//! dropping the [`LeaderElector`]'s own future would.

use std::thread::JoinHandle;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::leader::{Acquired, LeaderElector, LeadershipEnd, Release};

/// The elector, running on its thread. Dropping it closes the channel of calls, which ends the
/// thread once its current call returns (it is not joined: that call may still wait on the API
/// server, and dropping must not block the runtime).
#[derive(Debug)]
pub struct ElectorThread {
    calls: mpsc::Sender<Call>,
    _thread: JoinHandle<()>,
}

/// One call from the main runtime, answered on `reply`.
enum Call {
    Acquire {
        shutdown: CancellationToken,
        reply: oneshot::Sender<Option<Acquired>>,
    },
    Hold {
        stop: CancellationToken,
        reply: oneshot::Sender<LeadershipEnd>,
    },
    Release {
        budget: Duration,
        stopped_acting: Option<Timestamp>,
        reply: oneshot::Sender<Release>,
    },
}

impl ElectorThread {
    /// Starts the thread and makes the elector there with `make` (its client, its Lease watch
    /// and their connections then belong to the thread's runtime).
    ///
    /// # Errors
    /// [`Error::LeaderElection`] when the thread or its runtime cannot start, or what `make`
    /// returns.
    pub fn start(
        make: impl FnOnce() -> Result<LeaderElector, Error> + Send + 'static,
    ) -> Result<Self, Error> {
        let (calls, receiver) = mpsc::channel(1);
        let (made, made_receiver) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("leader-election".to_owned())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(error) => {
                        let _ = made.send(Err(Error::LeaderElection(format!(
                            "cannot start the leader election runtime: {error}"
                        ))));
                        return;
                    }
                };
                runtime.block_on(async move {
                    match make() {
                        Ok(elector) => {
                            let _ = made.send(Ok(()));
                            serve(elector, receiver).await;
                        }
                        Err(error) => {
                            let _ = made.send(Err(error));
                        }
                    }
                });
            })
            .map_err(|error| {
                Error::LeaderElection(format!("cannot start the leader election thread: {error}"))
            })?;
        let started = made_receiver.recv().unwrap_or_else(|_| {
            Err(Error::LeaderElection(
                "the leader election thread ended while starting".to_owned(),
            ))
        });
        let elector = Self {
            calls,
            _thread: thread,
        };
        started.map(|()| elector)
    }

    /// [`LeaderElector::acquire`], on the thread.
    pub async fn acquire(&mut self, shutdown: &CancellationToken) -> Option<Acquired> {
        let shutdown = shutdown.child_token();
        let _stop_if_dropped = shutdown.clone().drop_guard();
        self.call(|reply| Call::Acquire { shutdown, reply })
            .await
            .flatten()
    }

    /// [`LeaderElector::hold`], on the thread.
    pub async fn hold(&mut self, stop: &CancellationToken) -> LeadershipEnd {
        let stop = stop.child_token();
        let _stop_if_dropped = stop.clone().drop_guard();
        self.call(|reply| Call::Hold { stop, reply })
            .await
            .unwrap_or_else(|| LeadershipEnd::Lost(THREAD_GONE.to_owned()))
    }

    /// [`LeaderElector::release`], on the thread.
    pub async fn release(
        &mut self,
        budget: Duration,
        stopped_acting: Option<Timestamp>,
    ) -> Release {
        self.call(|reply| Call::Release {
            budget,
            stopped_acting,
            reply,
        })
        .await
        .unwrap_or_else(|| Release::GaveUp(THREAD_GONE.to_owned()))
    }

    async fn call<T>(&self, call: impl FnOnce(oneshot::Sender<T>) -> Call) -> Option<T> {
        let (reply, answer) = oneshot::channel();
        self.calls.send(call(reply)).await.ok()?;
        answer.await.ok()
    }
}

const THREAD_GONE: &str = "the leader election thread is gone";

/// Answers calls until the channel closes.
async fn serve(mut elector: LeaderElector, mut calls: mpsc::Receiver<Call>) {
    while let Some(call) = calls.recv().await {
        match call {
            // Acquiring handles its own cancellation: an attempt cut short is remembered, so a
            // release reads the Lease before writing.
            Call::Acquire { shutdown, reply } => {
                let _ = reply.send(elector.acquire(&shutdown).await);
            }
            // Holding is dropped mid-renewal when stopped, as the caller's select drops it.
            Call::Hold { stop, reply } => {
                let end = tokio::select! {
                    end = elector.hold(&stop) => end,
                    () = stop.cancelled() => LeadershipEnd::Stopped,
                };
                let _ = reply.send(end);
            }
            Call::Release {
                budget,
                stopped_acting,
                reply,
            } => {
                let _ = reply.send(elector.release(budget, stopped_acting).await);
            }
        }
    }
}
