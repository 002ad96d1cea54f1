//! External resources of an AppService: things outside the cluster that reconcile creates
//! behind the finalizer and deletes before releasing it.
//!
//! The database (`docs/architecture.md`, "The database from the Pod's side") is the one
//! implementation, `Databases` of the crate `controller_database`, which depends on this
//! one: `ensure` creates the role and database named from the
//! AppService UID and the `<name>-database` Secret; `cleanup` drops them, treating
//! "already gone" as success. Both are idempotent. `ensure` answers a [`Report`]: whether
//! the children may go on, the conditions it owns (`DatabaseReady`), which reconcile
//! writes into status, and what it adds to the Pods ([`PodAdditions`]: the core puts it
//! in the template without knowing what it is for); an error of `cleanup` keeps the
//! finalizer and is retried with backoff.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{EnvVar, Volume, VolumeMount};

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
    /// What the step adds to the Pods ([`crate::desired::desired_deployment`] puts it
    /// in the template of each Deployment).
    pub pod: PodAdditions,
    /// What image verification found ([`crate::image_verdict`]): the images' status, the
    /// digests the children run. None when no policy governs the AppService's images.
    pub images: Option<crate::image_verdict::Images>,
}

impl Report {
    /// Nothing external, nothing to report.
    pub fn done() -> Self {
        Report {
            outcome: Readiness::Done,
            conditions: vec![],
            absent: vec![],
            pod: PodAdditions::default(),
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

/// What a provider adds to the Pods of an AppService (of the stable and the canary
/// Deployment alike): the core puts it in the Pod template without knowing what it is
/// for. The names it may own are declared in `common::names` ([`OWNED_POD_VOLUMES`],
/// [`OWNED_TEMPLATE_ANNOTATIONS`]); the drift check keeps those as the provider wants
/// them.
///
/// [`OWNED_POD_VOLUMES`]: common::names::OWNED_POD_VOLUMES
/// [`OWNED_TEMPLATE_ANNOTATIONS`]: common::names::OWNED_TEMPLATE_ANNOTATIONS
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodAdditions {
    /// Variables of the application container, after the user's own; one the user's
    /// `env` sets is left out (theirs wins).
    pub env: Vec<EnvVar>,
    /// Volumes of the Pod.
    pub volumes: Vec<Volume>,
    /// Mounts of those volumes in the application container.
    pub mounts: Vec<VolumeMount>,
    /// Annotations of the Pod template: a change of one rolls the Pods (a new password's
    /// revision, say).
    pub annotations: BTreeMap<String, String>,
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

#[cfg(test)]
pub(crate) mod testing {
    use super::PodAdditions;
    use common::names::{ANNOTATION_DATABASE_REVISION, DATABASE_CA_VOLUME};
    use k8s_openapi::api::core::v1::{EnvVar, SecretVolumeSource, Volume, VolumeMount};

    /// Additions shaped like a provider's: a variable, an owned volume (when `volume`)
    /// mounted read-only, and an owned annotation at `revision`.
    pub fn additions(volume: bool, revision: &str) -> PodAdditions {
        PodAdditions {
            env: vec![EnvVar {
                name: "ADDED".into(),
                value: Some("by a provider".into()),
                value_from: None,
            }],
            volumes: volume
                .then(|| Volume {
                    name: DATABASE_CA_VOLUME.into(),
                    secret: Some(SecretVolumeSource {
                        secret_name: Some("web-database".into()),
                        ..SecretVolumeSource::default()
                    }),
                    ..Volume::default()
                })
                .into_iter()
                .collect(),
            mounts: volume
                .then(|| VolumeMount {
                    name: DATABASE_CA_VOLUME.into(),
                    mount_path: "/var/run/added".into(),
                    read_only: Some(true),
                    ..VolumeMount::default()
                })
                .into_iter()
                .collect(),
            annotations: [(ANNOTATION_DATABASE_REVISION.to_owned(), revision.to_owned())].into(),
        }
    }
}
