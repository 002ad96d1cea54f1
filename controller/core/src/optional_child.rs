//! A child that exists only while the spec asks for it: the PodDisruptionBudget (two or
//! more Pods), the HorizontalPodAutoscaler (`spec.autoscaling`). While asked for, it is
//! converged like the Deployment and the Service; someone else's object in its name
//! blocks the AppService (`ResourceConflict`) and is never adopted; ours, no longer asked
//! for, is deleted once, on its uid.

use common::AppService;
use common::names::{LABEL_MANAGED_BY, MANAGED_BY};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};

use crate::children::{converge, delete, lookup};
use crate::context::Context;
use crate::desired::is_controlled_by;
use crate::error::{Error, Result};
use crate::view::{Child, Labelled};

/// One optional child of an AppService: what is asked for and what lives.
pub struct Optional<K: Child> {
    name: String,
    want: Option<K>,
    live: Option<K::View>,
}

impl<K: Child> Optional<K> {
    /// Looks up the child `name` of `owner` (asked for when `want` is some), from the
    /// caches as [`lookup`] does.
    pub async fn look(
        ctx: &Context,
        owner: &ObjectRef<AppService>,
        (cache, others): (&Store<K::View>, Option<&Store<PartialObjectMeta<K>>>),
        (name, namespace): (String, &str),
        want: Option<K>,
    ) -> Result<Self> {
        let live = lookup(ctx, owner, K::KIND, cache, others, (&name, namespace)).await?;
        Ok(Optional { name, want, live })
    }

    /// The live child, if there is one (ours or not).
    pub fn live(&self) -> Option<&K::View> {
        self.live.as_ref()
    }

    /// `Kind namespace/name` when it is asked for and someone else's object holds the name.
    pub fn taken(&self, uid: &str) -> Option<String> {
        let live = self.live.as_ref()?;
        (self.want.is_some() && !is_controlled_by(live.meta().owner_references.as_deref(), uid))
            .then(|| {
                format!(
                    "{} {}/{}",
                    K::KIND,
                    live.namespace().unwrap_or_default(),
                    live.name_any()
                )
            })
    }

    /// Creates or applies it while asked for; deletes ours once not (putting our label
    /// back first when someone removed it: the chart's admission policy lets the
    /// controller delete only what carries it). Whether a create was refused because the
    /// name was taken comes with the result.
    pub async fn converge(
        self,
        ctx: &Context,
        owner: &ObjectRef<AppService>,
        namespace: &str,
        uid: &str,
    ) -> Converged {
        let created = self.live.is_none();
        let result = match self.want {
            Some(want) => converge(ctx, owner, K::KIND, want, self.live)
                .await
                .map(|_| ()),
            None => match self.live.as_ref().filter(|live| {
                is_controlled_by(live.meta().owner_references.as_deref(), uid)
                    && live.meta().deletion_timestamp.is_none()
            }) {
                Some(ours) => {
                    let relabel = ours.kept_labels().get(LABEL_MANAGED_BY) != Some(MANAGED_BY);
                    match ours.meta().uid.clone() {
                        Some(live_uid) => {
                            delete::<K>(
                                ctx,
                                owner,
                                K::KIND,
                                (&self.name, namespace),
                                &live_uid,
                                relabel,
                            )
                            .await
                        }
                        None => Ok(()),
                    }
                }
                None => Ok(()),
            },
        };
        let refused = created && result.as_ref().is_err_and(refused_create);
        Converged {
            kind: K::KIND,
            result,
            refused,
        }
    }
}

/// What converging an optional child did.
pub struct Converged {
    pub kind: &'static str,
    pub result: Result<()>,
    /// Its create was refused: the name was taken after the caches last heard.
    pub refused: bool,
}

/// Whether `error` is a create refused because the name exists.
pub fn refused_create(error: &Error) -> bool {
    matches!(error, Error::Kube(kube::Error::Api(status)) if status.is_already_exists())
}
