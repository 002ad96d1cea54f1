//! The controller's error type and how each error is retried.
//!
//! Outcomes a user must fix (an invalid spec, a name taken by someone else's object) are
//! not errors: reconcile reports them in status and waits for a change. What remains
//! here is classified by [`Error::retry`]: permanent errors are not retried until the
//! object changes, conflicts are retried promptly, everything else backs off.
//!
//! Every error of the workspace says its cause in its own message and does not also
//! return it from `source()`, so whatever prints an error prints each cause once.

use std::time::Duration;

/// How [`crate::reconcile::error_policy`] treats an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// Retrying cannot help until the object changes.
    Permanent,
    /// Someone else wrote first (HTTP 409): re-read and retry soon.
    Conflict,
    /// The API server or the network is struggling: back off exponentially.
    Transient,
    /// The API server rejected what we sent (HTTP 400/422) even after reconcile put back
    /// what other writers changed: back off exponentially from a slower start, since only
    /// a change of the spec or of another writer's fields can help.
    Rejected,
}

#[derive(thiserror::Error, Debug)]
pub enum Error {
    #[error("Kubernetes API request failed: {0}")]
    Kube(kube::Error),

    #[error("object has no {0}")]
    MissingField(&'static str),

    #[error("could not serialize the desired {kind}: {error}")]
    Serialize {
        kind: &'static str,
        error: serde_json::Error,
    },

    #[error("another writer keeps changing the {kind}'s {}; backing off", paths.join(", "))]
    Drift {
        kind: &'static str,
        paths: Vec<String>,
    },

    /// A step of an external provider ([`crate::external::External`]) failed: its
    /// `ensure` (a server down, credentials refused) or its `cleanup`. Retried with
    /// backoff. The provider writes the whole message and picks the reason it counts
    /// under; a cleanup's message becomes the Degraded condition's, so it leaves out what
    /// changes at every retry.
    #[error("{message}")]
    External {
        reason: ErrorReason,
        message: String,
    },

    #[error("leadership lost while reconciling")]
    NotLeader,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<kube::Error> for Error {
    fn from(e: kube::Error) -> Self {
        Error::Kube(e)
    }
}

impl Error {
    /// Classifies the error for retrying.
    pub fn retry(&self) -> Retry {
        match self {
            Error::Kube(kube::Error::Api(status)) => match status.code {
                409 => Retry::Conflict,
                // Bad request / unprocessable: reconcile has already put back what other
                // writers changed and retried once; what is left may be the spec (then
                // only a change helps) or another writer racing us (then a retry does):
                // back off rather than wait for an edit that may never come.
                400 | 422 => Retry::Rejected,
                // 403 (RBAC being fixed), 404 of a parent, 429, 5xx, ...: may heal.
                _ => Retry::Transient,
            },
            // Transport errors, timeouts, bad responses.
            Error::Kube(_) => Retry::Transient,
            Error::MissingField(_) | Error::Serialize { .. } => Retry::Permanent,
            Error::Drift { .. } => Retry::Rejected,
            // The server is down or failing: back off (waiting states are not errors).
            Error::External { .. } => Retry::Transient,
            // Not retried by us: the new leader reconciles everything.
            Error::NotLeader => Retry::Permanent,
        }
    }

    /// The reason this error counts under in the `reconcile_errors` metric.
    pub fn metric_label(&self) -> ErrorReason {
        match self {
            Error::Kube(kube::Error::Api(status)) => match status.code {
                409 => ErrorReason::Conflict,
                429 => ErrorReason::Throttled,
                400 | 422 => ErrorReason::Invalid,
                403 => ErrorReason::Forbidden,
                404 => ErrorReason::NotFound,
                500..=599 => ErrorReason::ServerError,
                _ => ErrorReason::ApiOther,
            },
            Error::Kube(_) => ErrorReason::Transport,
            Error::MissingField(_) => ErrorReason::MissingField,
            Error::Serialize { .. } => ErrorReason::Serialize,
            Error::Drift { .. } => ErrorReason::Drift,
            Error::External { reason, .. } => *reason,
            Error::NotLeader => ErrorReason::NotLeader,
        }
    }
}

telemetry::label_values! {
    /// Why a reconcile failed, as the `reconcile_errors` metric counts it (a fixed set:
    /// low cardinality by construction).
    pub enum ErrorReason {
        Conflict => "conflict",
        Throttled => "throttled",
        Invalid => "invalid",
        Forbidden => "forbidden",
        NotFound => "not_found",
        ServerError => "server_error",
        ApiOther => "api_other",
        Transport => "transport",
        MissingField => "missing_field",
        Serialize => "serialize",
        Cleanup => "cleanup",
        Drift => "drift",
        Database => "database",
        Registry => "registry",
        NotLeader => "not_leader",
    }
}

/// Whether a kube error is an API NotFound.
pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Retry timing for one object, capped exponential with jitter.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BackoffPolicy {
    /// First delay after a transient error.
    pub base: Duration,
    /// Largest delay.
    pub cap: Duration,
    /// First delay after a conflict; conflicts double from here, so a stuck conflict
    /// cannot hot-loop.
    pub conflict_base: Duration,
    /// First delay after a rejected request ([`Retry::Rejected`]).
    pub rejected_base: Duration,
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        BackoffPolicy {
            base: Duration::from_millis(500),
            cap: Duration::from_secs(300),
            conflict_base: Duration::from_millis(50),
            rejected_base: Duration::from_secs(2),
        }
    }
}

impl BackoffPolicy {
    /// Delay before retry number `attempt` (0 = first retry) for an error of class
    /// `retry`, `None` for permanent errors. `jitter` in `[0, 1)` picks a point in the
    /// upper half of the window ("equal jitter"): never less than half the nominal delay,
    /// so retries stay spread out without collapsing to zero.
    pub fn delay(&self, retry: Retry, attempt: u32, jitter: f64) -> Option<Duration> {
        let base = match retry {
            Retry::Permanent => return None,
            Retry::Conflict => self.conflict_base,
            Retry::Transient => self.base,
            Retry::Rejected => self.rejected_base,
        };
        let nominal = base
            .checked_mul(2u32.saturating_pow(attempt.min(30)))
            .unwrap_or(self.cap)
            .min(self.cap);
        let half = nominal / 2;
        Some(half + half.mul_f64(jitter.clamp(0.0, 1.0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn external(reason: ErrorReason) -> Error {
        Error::External {
            reason,
            message: "x".into(),
        }
    }

    fn api(code: u16) -> Error {
        Error::Kube(kube::Error::Api(Box::new(Status {
            code,
            ..Status::default()
        })))
    }

    #[test]
    fn classification() {
        assert_eq!(api(409).retry(), Retry::Conflict);
        assert_eq!(api(429).retry(), Retry::Transient);
        assert_eq!(api(500).retry(), Retry::Transient);
        assert_eq!(api(503).retry(), Retry::Transient);
        assert_eq!(api(504).retry(), Retry::Transient);
        assert_eq!(api(403).retry(), Retry::Transient);
        assert_eq!(api(422).retry(), Retry::Rejected);
        assert_eq!(api(400).retry(), Retry::Rejected);
        assert_eq!(
            Error::MissingField("metadata.uid").retry(),
            Retry::Permanent
        );
        assert_eq!(external(ErrorReason::Cleanup).retry(), Retry::Transient);
        assert_eq!(
            Error::Kube(kube::Error::LinesCodecMaxLineLengthExceeded).retry(),
            Retry::Transient
        );
    }

    #[test]
    fn metric_labels_are_fixed() {
        assert_eq!(api(409).metric_label().as_str(), "conflict");
        assert_eq!(api(429).metric_label().as_str(), "throttled");
        assert_eq!(api(502).metric_label().as_str(), "server_error");
        assert_eq!(
            external(ErrorReason::Cleanup).metric_label().as_str(),
            "cleanup"
        );
        assert_eq!(
            external(ErrorReason::Database).metric_label().as_str(),
            "database"
        );
        for e in [
            api(409),
            api(429),
            api(422),
            api(403),
            api(404),
            api(500),
            api(418),
            Error::MissingField("x"),
            external(ErrorReason::Cleanup),
            Error::Drift {
                kind: "Service",
                paths: vec![],
            },
            external(ErrorReason::Database),
            Error::NotLeader,
        ] {
            assert!(ErrorReason::ALL.contains(&e.metric_label()), "{e}");
        }
    }

    #[test]
    fn backoff_grows_is_capped_and_jittered() {
        let p = BackoffPolicy::default();
        assert_eq!(p.delay(Retry::Permanent, 0, 0.5), None);
        let first = p.delay(Retry::Transient, 0, 0.0).unwrap();
        assert_eq!(first, Duration::from_millis(250));
        assert_eq!(
            p.delay(Retry::Transient, 0, 0.999_999).unwrap().as_millis(),
            499
        );
        let mut last = Duration::ZERO;
        for attempt in 0..40 {
            let d = p.delay(Retry::Transient, attempt, 0.0).unwrap();
            assert!(d >= last, "non-decreasing");
            assert!(d <= p.cap);
            last = d;
        }
        assert_eq!(last, p.cap / 2);
        assert!(p.delay(Retry::Transient, 40, 0.99).unwrap() <= p.cap);
    }

    #[test]
    fn conflicts_retry_promptly_but_not_in_a_hot_loop() {
        let p = BackoffPolicy::default();
        let first = p.delay(Retry::Conflict, 0, 1.0).unwrap();
        assert!(first <= Duration::from_millis(50));
        assert!(first >= Duration::from_millis(25));
        let tenth = p.delay(Retry::Conflict, 10, 0.0).unwrap();
        assert!(tenth >= Duration::from_secs(10));
    }
}
