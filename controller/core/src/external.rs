//! External resources of an AppService: things outside the cluster that reconcile creates
//! behind the finalizer and deletes before releasing it.
//!
//! The database (`docs/architecture.md`, "The database from the Pod's side") is the one
//! implementation, `Databases` of the crate `controller_database`, which depends on this
//! one: `ensure` creates the role and database named from the
//! AppService UID and the `<name>-database` Secret; `cleanup` drops them, treating
//! "already gone" as success. Both are idempotent. `ensure` answers a [`Report`]: whether
//! the children may go on, and the conditions it owns (`DatabaseReady`), which reconcile
//! writes into status; an error of `cleanup` keeps the finalizer and is retried with backoff.

use std::time::Duration;

use futures::future::BoxFuture;

use crate::desired::PodDatabase;
use crate::error::{Error, Result};
use crate::subject::Subject;

/// Outcome of one idempotent reconcile step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The step's goal holds; go on.
    Done,
    /// Not there yet (e.g. waiting for an external server); call again after this long.
    NotReady(Duration),
}

/// Whether reconcile may go on to the children after [`External::ensure`].
#[derive(Debug)]
pub enum Readiness {
    /// Everything external is in place.
    Done,
    /// Waiting for something outside our control (a class to appear, an admin to fix
    /// credentials); look again after this long. Not an error: no backoff growth.
    NotReady(Duration),
    /// A failure to retry with the error policy's backoff (e.g. server unreachable).
    Failed(Error),
}

/// A condition an external step owns, before it is stamped with generation and time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConditionReport {
    pub type_: &'static str,
    pub status: &'static str,
    pub reason: &'static str,
    pub message: String,
}

/// What [`External::ensure`] found.
#[derive(Debug)]
pub struct Report {
    pub outcome: Readiness,
    /// Conditions to set on the AppService's status.
    pub conditions: Vec<ConditionReport>,
    /// Condition types this step owns that do not apply now (removed from status).
    pub absent: Vec<&'static str>,
    /// What the Pods get from the database's Secret, once it is provisioned
    /// ([`crate::desired::desired_deployment`] mounts and stamps it).
    pub database: Option<PodDatabase>,
    /// What image verification found ([`crate::images`]): the images' status, the
    /// digests the children run. None when no policy governs the AppService's images.
    pub images: Option<crate::images::found::Images>,
}

impl Report {
    /// Nothing external, nothing to report.
    pub fn done() -> Self {
        Report {
            outcome: Readiness::Done,
            conditions: vec![],
            absent: vec![],
            database: None,
            images: None,
        }
    }

    /// The first condition that is not `True`: what blocks readiness.
    pub fn blocking(&self) -> Option<&ConditionReport> {
        self.conditions
            .iter()
            .find(|c| c.status != common::conditions::TRUE)
    }
}

/// Resources outside the cluster that belong to an AppService.
pub trait External: Send + Sync {
    /// Makes them exist (or, when no longer wanted, go away). Runs after the finalizer
    /// is in place, before the children.
    fn ensure<'a>(&'a self, app: &'a Subject<'a>) -> BoxFuture<'a, Result<Report>>;
    /// Deletes them for a terminating AppService; `Done` lets the finalizer go.
    fn cleanup<'a>(&'a self, app: &'a Subject<'a>) -> BoxFuture<'a, Result<Step>>;
    /// Periodic work of its own (the database's orphan scan), run while the controller
    /// runs and acting only while `leading` is true. None by default.
    fn background(
        self: std::sync::Arc<Self>,
        _leading: tokio::sync::watch::Receiver<bool>,
    ) -> Option<BoxFuture<'static, ()>> {
        None
    }
}

/// No external resources: every step is done at once.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoExternal;

impl External for NoExternal {
    fn ensure<'a>(&'a self, _app: &'a Subject<'a>) -> BoxFuture<'a, Result<Report>> {
        Box::pin(async { Ok(Report::done()) })
    }

    fn cleanup<'a>(&'a self, _app: &'a Subject<'a>) -> BoxFuture<'a, Result<Step>> {
        Box::pin(async { Ok(Step::Done) })
    }
}
