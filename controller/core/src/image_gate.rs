//! The seam of image verification (the crate `controller_images` implements it): the
//! step of a pass that may hold an image back ([`ImageGate`]); what it reports is in
//! [`crate::image_verdict`].

use std::sync::Arc;
use std::time::Duration;

use common::AppService;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::watch;

use crate::external::Report;
use crate::image_verdict::Live;
use crate::subject::Subject;

/// A held image is looked at again this often at the latest (besides every change of
/// the AppService and of what the gate watches); a pass that waits on a registry is
/// retried at least this often, whatever its backoff.
pub const HOLD_RECHECK: Duration = Duration::from_secs(60);

/// A step of each pass, after the external resources and before the children, that
/// decides which images the children run.
pub trait ImageGate: Send + Sync {
    /// Checks the images of `app` (what our Deployments run now is `live`) and records
    /// the verdict in `report`: its [`crate::image_verdict::Images`], and an outcome that holds the pass back
    /// when an image may not run or a registry is down.
    fn check<'a>(
        &'a self,
        app: &'a Subject<'a>,
        live: &'a Live,
        report: &'a mut Report,
        now: &'a Time,
    ) -> BoxFuture<'a, ()>;

    /// Starts what the gate watches: a stream that yields when every AppService needs a
    /// pass (a policy changed), and one of the AppServices that need one (their
    /// namespace's labels changed). `apps` is the controller's AppService cache.
    fn watch(
        self: Arc<Self>,
        client: &kube::Client,
        apps: Store<AppService>,
    ) -> (
        BoxStream<'static, ()>,
        BoxStream<'static, ObjectRef<AppService>>,
    );

    /// Its own background work (the policies' status), acting only while `leading` is
    /// true, until `stop`.
    fn background(
        self: Arc<Self>,
        leading: watch::Receiver<bool>,
        stop: watch::Receiver<bool>,
    ) -> BoxFuture<'static, ()>;
}
