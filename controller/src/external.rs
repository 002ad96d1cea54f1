//! External resources of an AppService: things outside the cluster that reconcile creates
//! behind the finalizer and deletes before releasing it.
//!
//! There are none yet ([`NoExternal`]). The database (ARCHITECTURE.md, "Databases") slots
//! in as an [`External`] implementation: `ensure` creates the role and database named from
//! the AppService UID and the `<name>-database` Secret; `cleanup` drops them, treating
//! "already gone" as success. Both are idempotent and may answer [`Step::NotReady`] to be
//! called again later; an error keeps the finalizer and is retried with backoff.

use std::time::Duration;

use common::AppService;
use futures::future::BoxFuture;

use crate::error::Result;

/// Outcome of one idempotent reconcile step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The step's goal holds; go on.
    Done,
    /// Not there yet (e.g. waiting for an external server); call again after this long.
    NotReady(Duration),
}

/// Resources outside the cluster that belong to an AppService.
pub trait External: Send + Sync {
    /// Makes them exist. Runs after the finalizer is in place, before the children.
    fn ensure<'a>(&'a self, app: &'a AppService) -> BoxFuture<'a, Result<Step>>;
    /// Deletes them for a terminating AppService; `Done` lets the finalizer go.
    fn cleanup<'a>(&'a self, app: &'a AppService) -> BoxFuture<'a, Result<Step>>;
}

/// No external resources: every step is done at once.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoExternal;

impl External for NoExternal {
    fn ensure<'a>(&'a self, _app: &'a AppService) -> BoxFuture<'a, Result<Step>> {
        Box::pin(async { Ok(Step::Done) })
    }

    fn cleanup<'a>(&'a self, _app: &'a AppService) -> BoxFuture<'a, Result<Step>> {
        Box::pin(async { Ok(Step::Done) })
    }
}
