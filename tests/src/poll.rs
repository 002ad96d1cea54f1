//! Waiting for something to become true: the one poller of every test.
//!
//! Tests never assert on elapsed time. They wait on an observable condition, and the
//! timeout is only an upper bound that turns a hang into a failure saying what was awaited
//! and what the last look saw.

use std::future::Future;
use std::time::Duration;

use crate::error::{Error, Result};

/// The first pause between two looks; it doubles up to [`MAX_PAUSE`], so a condition
/// that holds soon is seen soon and a slow one is not polled in a busy loop.
const FIRST_PAUSE: Duration = Duration::from_millis(10);
const MAX_PAUSE: Duration = Duration::from_millis(200);

/// Why one look at a condition failed. Any error converts into it with `?`, and its one
/// concrete type lets `?` in a check's `async` block infer the error type.
pub type Failure = Box<dyn std::error::Error + Send + Sync>;

/// What one look at a condition saw: done (with a value), not yet, or a failure to look.
/// Implemented for `bool`, `Option<T>` and `Result<Option<T>, Failure>`, so a check
/// returns whichever is natural for it.
pub trait Observation {
    /// What [`eventually`] returns once the condition holds.
    type Value;
    /// `Ok(value)` when done; `Err(None)` when not yet; `Err(Some(why))` when the look
    /// itself failed (kept, and reported if the wait times out).
    fn observe(self) -> std::result::Result<Self::Value, Option<String>>;
}

impl Observation for bool {
    type Value = ();
    fn observe(self) -> std::result::Result<(), Option<String>> {
        if self { Ok(()) } else { Err(None) }
    }
}

impl<T> Observation for Option<T> {
    type Value = T;
    fn observe(self) -> std::result::Result<T, Option<String>> {
        self.ok_or(None)
    }
}

impl<T> Observation for std::result::Result<Option<T>, Failure> {
    type Value = T;
    fn observe(self) -> std::result::Result<T, Option<String>> {
        match self {
            Ok(Some(value)) => Ok(value),
            Ok(None) => Err(None),
            Err(err) => Err(Some(err.to_string())),
        }
    }
}

/// Looks at `check` until it reports done, and returns its value. After `timeout`,
/// fails with [`Error::GaveUp`], which names `what` was awaited and the last failure
/// `check` reported, if any.
pub async fn eventually<F, Fut>(
    what: &str,
    timeout: Duration,
    mut check: F,
) -> Result<<Fut::Output as Observation>::Value>
where
    F: FnMut() -> Fut,
    Fut: Future,
    Fut::Output: Observation,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pause = FIRST_PAUSE;
    let mut last = None;
    loop {
        match check().await.observe() {
            Ok(value) => return Ok(value),
            Err(None) => {}
            Err(Some(failure)) => last = Some(failure),
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::GaveUp {
                what: what.to_owned(),
                timeout,
                last,
            });
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[tokio::test]
    async fn returns_the_value_once_the_check_is_done() {
        let mut looks = 0;
        let value = eventually("the third look", Duration::from_secs(60), || {
            looks += 1;
            let done = looks >= 3;
            async move { Ok::<_, Failure>(done.then_some(looks)) }
        })
        .await
        .unwrap();
        assert_eq!(value, 3);
        assert!(
            eventually("true", Duration::ZERO, || async { true })
                .await
                .is_ok()
        );
    }

    #[tokio::test]
    async fn a_timeout_names_what_and_the_last_failure() {
        let mut looks = 0;
        let err = eventually("the impossible", Duration::ZERO, || {
            looks += 1;
            let failure: Failure = format!("look {looks} failed").into();
            async move { Err::<Option<()>, _>(failure) }
        })
        .await
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "timed out after 0ns waiting for the impossible; last failure: look 1 failed"
        );
        let err = eventually("never", Duration::ZERO, || async { None::<()> })
            .await
            .unwrap_err();
        assert_eq!(err.to_string(), "timed out after 0ns waiting for never");
    }
}
