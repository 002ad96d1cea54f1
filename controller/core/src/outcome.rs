//! How a pass ends, shared by the steps that end one (reconcile, the finalizer): its
//! own module, so that neither imports the other.

use common::AppServiceStatus;

use crate::error::Result;
use crate::queue::Next;

/// How a pass ends: what it observed, reported by `reconcile::finish` in one place.
pub(crate) struct Outcome {
    /// The status the pass observed; `None` leaves the status as it is.
    pub(crate) status: Option<AppServiceStatus>,
    /// The AppService is gone for good (its finalizer released, or never ours).
    pub(crate) gone: bool,
    /// What happens next: when to look again, or the error the policy retries.
    pub(crate) next: Result<Next>,
}

impl Outcome {
    /// Nothing to report; `next` decides.
    pub(crate) fn next(next: Result<Next>) -> Self {
        Outcome {
            status: None,
            gone: false,
            next,
        }
    }

    /// `status` observed; `next` decides.
    pub(crate) fn status(status: AppServiceStatus, next: Result<Next>) -> Self {
        Outcome {
            status: Some(status),
            ..Outcome::next(next)
        }
    }

    /// The AppService is gone: forget it.
    pub(crate) fn gone() -> Self {
        Outcome {
            gone: true,
            ..Outcome::next(Ok(Next::await_change()))
        }
    }
}
