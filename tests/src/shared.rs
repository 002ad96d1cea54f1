//! One control plane per test binary, started by the first test that asks for it.
//!
//! Statics are never dropped, so the components of a shared control plane are stopped
//! by their wrappers when the test process exits (see [`crate::process`]). Starting it
//! runs no background task in the first test's tokio runtime: components are OS
//! processes and readiness is polled by that test, so later tests (each with its own
//! runtime) can use it safely as long as each makes its own client
//! ([`ControlPlane::client`]).

use tokio::sync::OnceCell;

use crate::control_plane::{ControlPlane, Options};
use crate::error::{Error, Result};

type Slot = OnceCell<Result<ControlPlane, String>>;

static PLAIN: Slot = OnceCell::const_new();
static FULL: Slot = OnceCell::const_new();
static REAL_NODE: Slot = OnceCell::const_new();

/// The shared control plane of this test binary with `options`, started on first use.
/// A failed start is remembered: every later call returns the same error at once.
pub async fn shared_with(options: Options) -> Result<&'static ControlPlane> {
    let slot = if options.real_node {
        &REAL_NODE
    } else if options.full {
        &FULL
    } else {
        &PLAIN
    };
    let started = slot
        .get_or_init(|| async move {
            let result = ControlPlane::start(options).await;
            match &result {
                Ok(cp) => eprintln!(
                    "harness: control plane ({}) up in {:.1?} at {}; logs in {}",
                    if options.real_node {
                        "full, real node"
                    } else if options.full {
                        "full"
                    } else {
                        "plain"
                    },
                    cp.startup_time(),
                    cp.server_url(),
                    cp.log_dir().display()
                ),
                Err(e) => eprintln!("harness: control plane failed to start: {e}"),
            }
            result.map_err(|e| e.to_string())
        })
        .await;
    started.as_ref().map_err(|e| Error::Shared(e.clone()))
}

/// The shared etcd + kube-apiserver of this test binary.
pub async fn shared() -> Result<&'static ControlPlane> {
    shared_with(Options::plain()).await
}

/// The shared full control plane (controllers, scheduler, kwok node) of this test binary.
pub async fn shared_full() -> Result<&'static ControlPlane> {
    shared_with(Options::full()).await
}

/// The shared full control plane with a real node ([`crate::RealNode`]) of this test
/// binary. One real node per machine: a second test binary asking for one waits for it.
pub async fn shared_real_node() -> Result<&'static ControlPlane> {
    shared_with(Options::real_node()).await
}
