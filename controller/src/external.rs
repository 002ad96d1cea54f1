//! External resources of an AppService: things outside the cluster that reconcile creates
//! behind the finalizer and deletes before releasing it.
//!
//! There are none yet. The database (ARCHITECTURE.md, "Databases") slots in here: `ensure`
//! creates the role and database named from the AppService UID and the `<name>-database`
//! Secret; `cleanup` drops them, treating "already gone" as success. Both are idempotent
//! and may answer [`Step::NotReady`] to be called again later.

use std::time::Duration;

use common::AppService;

use crate::context::Context;
use crate::error::Result;

/// Outcome of one idempotent reconcile step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The step's goal holds; go on.
    Done,
    /// Not there yet (e.g. waiting for an external server); call again after this long.
    NotReady(Duration),
}

/// Makes the external resources of `app` exist. Runs after the finalizer is in place.
pub async fn ensure(_ctx: &Context, _app: &AppService) -> Result<Step> {
    Ok(Step::Done)
}

/// Deletes the external resources of a terminating `app`; `Done` lets the finalizer go.
pub async fn cleanup(_ctx: &Context, _app: &AppService) -> Result<Step> {
    Ok(Step::Done)
}
