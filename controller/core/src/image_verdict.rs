//! What image verification reports to a pass ([`crate::image_gate::ImageGate`]): the
//! verdict the core acts on without knowing how it was reached: the images' status, the
//! `image@digest` references the children run ([`Pins`]), or what keeps running while
//! an image is held ([`Hold`]).

use std::time::Duration;

use common::{AppService, ImageStatus};

/// What the step found, for the report of the pass.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Images {
    pub image: Option<ImageStatus>,
    pub canary_image: Option<ImageStatus>,
    pub pins: Pins,
    /// Look again this soon at the latest (a tag may move).
    pub recheck: Option<Duration>,
    /// Set while an image is held or waits for the registry: what the children converge
    /// to meanwhile (what ran before), so a held AppService's children are repaired like
    /// any other's.
    pub hold: Option<Hold>,
}

/// What the children run while an image is held: the images that ran before.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hold {
    /// The stable Deployment's image; none when nothing ran: then no child is created.
    pub image: Option<String>,
    /// The canary's; none when no canary ran (or none is asked for): then none runs.
    pub canary: Option<String>,
    /// What runs fails a policy that scales it to zero (`onRunningFailure`): the
    /// Deployment keeps its image at zero replicas, and no canary runs.
    pub stop: bool,
}

impl Hold {
    /// `app` rendered with what runs while held, or none when nothing may run.
    pub fn apply(&self, app: &AppService) -> Option<AppService> {
        let mut held = app.clone();
        held.spec.image = self.image.clone()?;
        match (&self.canary, held.spec.canary.as_mut()) {
            (Some(image), Some(canary)) if !self.stop => canary.image = image.clone(),
            _ => held.spec.canary = None,
        }
        if self.stop {
            held.spec.replicas = Some(0);
        }
        Some(held)
    }
}

/// What our live Deployments of an AppService run, from the controller's caches: what
/// keeps running when an image is held and status records nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Live {
    pub image: Option<String>,
    pub canary: Option<String>,
}

/// The references the children run instead of the spec's: `image@digest`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pins {
    pub image: Option<String>,
    pub canary: Option<String>,
}

impl Pins {
    pub fn is_empty(&self) -> bool {
        self.image.is_none() && self.canary.is_none()
    }

    /// `app` with its images replaced by the pinned ones, for rendering the children.
    pub fn apply(&self, app: &AppService) -> AppService {
        let mut pinned = app.clone();
        if let Some(image) = &self.image {
            pinned.spec.image = image.clone();
        }
        if let (Some(image), Some(canary)) = (&self.canary, pinned.spec.canary.as_mut()) {
            canary.image = image.clone();
        }
        pinned
    }
}
