//! What a share ([`crate::share`]) runs during one run of the controller: its membership
//! Lease, and what follows its ring. Apart from the share itself, which the `Context`
//! holds, because this needs the `Context`.

use std::sync::Arc;

use common::AppService;
use kube::runtime::reflector::Store;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::context::Context;
use crate::fence::Fence;
use crate::share::Share;

/// What a share needs to follow its ring for one run of the controller.
pub struct Ring {
    pub ctx: Arc<Context>,
    /// A client whose writes are not fenced (the Leases keep the fence open).
    pub lease_client: kube::Client,
    pub identity: String,
    /// The controller's AppService cache.
    pub apps: Store<AppService>,
    /// Opened by each renewal of the membership Lease.
    pub fence: Fence,
    /// True while the membership Lease is current: the gate of the `Context`.
    pub member: watch::Sender<bool>,
    /// Stops the membership Lease (released) once the controller has stopped.
    pub membership_stop: watch::Receiver<bool>,
    /// Stops everything else.
    pub stop: watch::Receiver<bool>,
}

/// The tasks a share runs for one run: its membership Lease, and what follows the ring.
pub struct Following {
    pub membership: JoinHandle<()>,
    pub ring: JoinHandle<()>,
}

/// A share that follows a ring: what `--sharding` needs ([`crate::Hooks::share`]).
pub trait Ringed: Share {
    /// Starts the membership Lease and what follows the ring.
    fn start(self: Arc<Self>, ring: Ring) -> Following;
}
