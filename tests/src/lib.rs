//! Integration-test harness: a real kube-apiserver + etcd (and, in full mode,
//! kube-controller-manager, kube-scheduler and kwok with one simulated Node), built from
//! their Go modules by `tests/envtest/assets/build.sh`, the way controller-runtime's
//! envtest works. Nothing is mocked.
//!
//! ```no_run
//! # async fn example() -> Result<(), harness::Error> {
//! // One control plane per test binary; each test gets its own namespace and client.
//! let cp = harness::shared().await?;          // or harness::shared_full()
//! let ns = cp.namespace().await?;             // random, Pod Security restricted, deleted when dropped
//! let client = cp.client();                   // a NEW client, for this test's runtime
//! let apps: kube::Api<common::AppService> = kube::Api::namespaced(client, &ns);
//! # let _ = apps; Ok(()) }
//! ```
//!
//! * [`ControlPlane::start`] starts a private control plane, stopped when dropped;
//!   [`shared`]/[`shared_full`] share one per test binary.
//! * The CRDs of `charts/appservice-operator/crds/` are installed at startup
//!   ([`ControlPlane::install_crds`]).
//! * [`ControlPlane::register_webhooks`] points Mutating/ValidatingWebhookConfigurations
//!   for one namespace at a local HTTPS server; [`webhook_tls`] makes its certificates.
//! * Component logs are in [`ControlPlane::log_dir`] and survive the control plane
//!   (directories older than a day are pruned at the next start). Every test that
//!   creates a [`TestNamespace`] prints that path (shown by the test runner only when the
//!   test fails); a [`LogGuard`] prints it on panic. `APPSERVICE_KEEP_LOGS=1` also keeps
//!   certificates, kubeconfig and etcd data of a stopped control plane.
//! * [`eventually`] waits for a condition (the one poller of every test): a timeout is
//!   a failure naming what was awaited and the last failure seen, never a timing assertion.
//! * [`Binary`] runs a binary under test and reads its JSON log; [`pprof`] checks the
//!   profiles it serves.
//! * [`PodView`] resolves what a Pod of a Deployment would get (its environment with
//!   Secret and ConfigMap references resolved, its mounted files) and runs a real client
//!   with only that: kwok runs no container, so this stands in for the Pod.
//! * [`RealNode::gateway`] runs Traefik as the Gateway API implementation of the real
//!   node (a Gateway on loopback ports, routes to the node's Pods);
//!   [`gateway_api::install_crds`] installs the Gateway API CRDs on any control plane.
//! * [`OtlpReceiver`] receives the traces a binary under test exports over OTLP/gRPC.
//! * [`Registry`] is a real OCI registry (CNCF distribution, TLS, optional basic auth)
//!   behind a proxy that can fail or slow it down; it pushes images with crane, signs
//!   them with cosign ([`KeyPair`]) and counts the requests it served.
//! * [`HostileRegistry`] answers what no registry should (manifests, tokens and error
//!   bodies of hundreds of MiB generated as they are sent, redirect loops, a 1 MiB
//!   header, a drip), one [`Scenario`] per repository, and counts the bytes it sent.
//! * Binaries: `APPSERVICE_ASSETS_BIN`, else the cache that `cargo xtask assets` fills
//!   (built on demand when missing; needs `go`).

#![forbid(unsafe_code)]

pub mod assets;
pub mod binary;
mod control_plane;
mod crds;
mod error;
pub mod gateway_api;
pub mod hostile_registry;
mod namespace;
pub mod otlp;
pub mod pod_view;
pub mod poll;
pub mod postgres;
pub mod pprof;
pub mod process;
pub mod real_node;
pub mod recording;
pub mod registry;
mod shared;
mod webhooks;

pub use binary::{Binary, logged_addr};
pub use control_plane::{ControlPlane, KWOK_NODE_ANNOTATION, LogGuard, NODE_NAME, Options};
pub use crds::{FIELD_MANAGER, appservice_crd_path, crd_dir, load_crd, load_crds};
pub use error::{Error, Result};
pub use hostile_registry::{HostileRegistry, HostileRequest, Scenario};
pub use namespace::{
    POD_SECURITY_ENFORCE_LABEL, PodSecurityLevel, TEST_NAMESPACE_LABEL, TestNamespace,
};
pub use otlp::{OtlpReceiver, ReceivedSpan};
pub use pod_view::PodView;
pub use poll::eventually;
pub use postgres::Postgres;
pub use real_node::RealNode;
pub use recording::{Hold, Requests, holding, recording};
pub use registry::{KeyPair, Registry, RegistryOptions, RegistryRequest};
pub use shared::{shared, shared_full, shared_real_node, shared_with};
pub use webhooks::{PROBE_LABEL, Webhooks, admission_rules};

/// A CA and a serving certificate for a webhook server listening on 127.0.0.1: serve
/// with `cert_pem`/`key_pem` and pass `ca.cert_pem()` as the `caBundle` to
/// [`ControlPlane::register_webhooks`].
pub fn webhook_tls() -> Result<(certs::Ca, certs::CertKey)> {
    let ca = certs::Ca::new("appservice-tests webhook CA")?;
    let serving = ca.serving_cert(&["127.0.0.1", "localhost", "::1"])?;
    Ok((ca, serving))
}
