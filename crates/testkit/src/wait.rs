//! Polling until a condition holds, with a failure message that says what was awaited and what
//! was last seen.

use std::fmt::Display;
use std::future::Future;
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// How often conditions are polled.
pub const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// Polls `check` until it returns `Ok`, and returns that value.
///
/// `what` names the condition for the failure message, which also carries the last `Err`
/// seen, e.g. "timed out after 60.0s waiting for deployment web to be available; last
/// observation: 1 of 3 replicas ready".
///
/// ```no_run
/// # async fn demo(pods: kube::Api<k8s_openapi::api::core::v1::Pod>) -> testkit::Result<()> {
/// use std::time::Duration;
/// let pod = testkit::wait_for("pod web-0 to exist", Duration::from_secs(30), || async {
///     pods.get("web-0").await
/// })
/// .await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::Timeout`] when `timeout` passes first.
pub async fn wait_for<T, E, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T>
where
    E: Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, E>>,
{
    let start = Instant::now();
    loop {
        let last = match check().await {
            Ok(value) => return Ok(value),
            Err(e) => e.to_string(),
        };
        if start.elapsed() >= timeout {
            return Err(Error::Timeout {
                what: what.to_owned(),
                seconds: timeout.as_secs_f64(),
                last,
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Polls `condition` until it is true.
///
/// # Errors
/// [`Error::Timeout`] when `timeout` passes first.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut condition: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_for(what, timeout, || {
        let fut = condition();
        async move {
            if fut.await {
                Ok(())
            } else {
                Err("condition not met")
            }
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn returns_the_first_success() {
        let mut n = 0;
        let v = wait_for("n to reach 3", Duration::from_secs(5), || {
            n += 1;
            let n = n;
            async move {
                if n >= 3 {
                    Ok(n)
                } else {
                    Err(format!("n is {n}"))
                }
            }
        })
        .await
        .expect("reached");
        assert_eq!(v, 3);
    }

    #[tokio::test]
    async fn times_out_with_the_last_observation() {
        let err = wait_until("the impossible", Duration::from_millis(300), || async {
            false
        })
        .await
        .expect_err("must time out");
        let msg = err.to_string();
        assert!(msg.contains("waiting for the impossible"), "{msg}");
        assert!(msg.contains("condition not met"), "{msg}");
    }
}
