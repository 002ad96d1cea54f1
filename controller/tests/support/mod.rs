//! Helpers shared by the controller's integration tests: the [`Fixture`] every test starts
//! from (a namespace, a client, and an in-process controller scoped to that namespace),
//! and AppService objects. Polling is `harness::eventually`.

#![allow(dead_code)]

use std::sync::{Arc, Once};
use std::time::Duration;

use anyhow::Context as _;
use common::{AppService, AppServiceSpec};
use controller::metrics::Metrics;
use controller::{Config, Hooks};
use harness::{ControlPlane, PodSecurityLevel, TestNamespace};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::api::PostParams;
use kube::{Api, Client, Resource};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Installs the rustls crypto provider once per test binary.
pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,controller=info")),
            )
            .with_test_writer()
            .try_init();
    });
}

/// One test's world: its own namespace on a control plane, a client made in this test's
/// runtime, and the Apis of what the controller reads and writes there.
pub struct Fixture {
    pub ns: TestNamespace,
    pub client: Client,
    pub apps: Api<AppService>,
    pub deployments: Api<Deployment>,
    pub services: Api<Service>,
}

impl Fixture {
    /// A namespace on the shared plain control plane and a controller watching it, with
    /// the defaults of [`start_controller`].
    pub async fn start() -> anyhow::Result<(Fixture, Running)> {
        Fixture::setup().start().await
    }

    /// What a test varies: the control plane, the controller's configuration, its
    /// external resources.
    pub fn setup<'a>() -> Setup<'a> {
        Setup {
            control_plane: Plane::Shared,
            pod_security: PodSecurityLevel::Restricted,
            tweak: Box::new(|_| {}),
            external: Arc::new(controller::external::NoExternal),
        }
    }

    /// An Api of another namespaced kind in the test's namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }
}

enum Plane<'a> {
    Shared,
    SharedFull,
    Given(&'a ControlPlane),
}

/// The options of a [`Fixture`]; [`Setup::start`] makes it.
pub struct Setup<'a> {
    control_plane: Plane<'a>,
    pod_security: PodSecurityLevel,
    tweak: Box<dyn FnOnce(&mut Config)>,
    external: Arc<dyn controller::external::External>,
}

impl<'a> Setup<'a> {
    /// On the shared full control plane (Pods become ready, the garbage collector runs).
    pub fn full(mut self) -> Self {
        self.control_plane = Plane::SharedFull;
        self
    }

    /// On a control plane of the test's own (one it restarts, for example).
    pub fn on(mut self, cp: &'a ControlPlane) -> Self {
        self.control_plane = Plane::Given(cp);
        self
    }

    /// The Pod Security level the test's namespace enforces (`restricted` by default).
    pub fn pod_security(mut self, level: PodSecurityLevel) -> Self {
        self.pod_security = level;
        self
    }

    /// Changes the controller's configuration after [`start_controller`]'s defaults.
    pub fn config(mut self, tweak: impl FnOnce(&mut Config) + 'static) -> Self {
        self.tweak = Box::new(tweak);
        self
    }

    /// The external resources behind the finalizer (none by default).
    pub fn external(mut self, external: Arc<dyn controller::external::External>) -> Self {
        self.external = external;
        self
    }

    /// The namespace and client only; the test starts controllers itself.
    pub async fn without_controller(self) -> anyhow::Result<Fixture> {
        Fixture::on(self.control_plane, self.pod_security).await
    }

    /// The fixture and a controller watching its namespace.
    pub async fn start(self) -> anyhow::Result<(Fixture, Running)> {
        let fixture = Fixture::on(self.control_plane, self.pod_security).await?;
        let ctl = start_controller_with(
            fixture.client.clone(),
            &fixture.ns,
            self.tweak,
            self.external,
        );
        Ok((fixture, ctl))
    }
}

impl Fixture {
    async fn on(control_plane: Plane<'_>, level: PodSecurityLevel) -> anyhow::Result<Fixture> {
        init();
        let cp = match control_plane {
            Plane::Shared => harness::shared().await?,
            Plane::SharedFull => harness::shared_full().await?,
            Plane::Given(cp) => cp,
        };
        let ns = cp.namespace_with("test", level).await?;
        let client = cp.client();
        Ok(Fixture {
            apps: Api::namespaced(client.clone(), &ns),
            deployments: Api::namespaced(client.clone(), &ns),
            services: Api::namespaced(client.clone(), &ns),
            ns,
            client,
        })
    }
}

/// A controller running in this test's runtime, watching one namespace.
pub struct Running {
    shutdown: Option<oneshot::Sender<()>>,
    handle: JoinHandle<Result<(), controller::RunError>>,
    pub metrics: Arc<Metrics>,
}

/// Starts an in-process controller for `namespace`, without leader election.
pub fn start_controller(
    client: Client,
    namespace: &str,
    tweak: impl FnOnce(&mut Config),
) -> Running {
    start_controller_with(
        client,
        namespace,
        tweak,
        Arc::new(controller::external::NoExternal),
    )
}

/// Like [`start_controller`], with the given external resources behind the finalizer.
pub fn start_controller_with(
    client: Client,
    namespace: &str,
    tweak: impl FnOnce(&mut Config),
    external: Arc<dyn controller::external::External>,
) -> Running {
    let mut config = Config::for_namespace(namespace);
    config.rollout_requeue = Duration::from_secs(1);
    tweak(&mut config);
    let metrics = Arc::new(Metrics::default());
    let hooks = Hooks {
        metrics: metrics.clone(),
        external,
        ..Hooks::default()
    };
    let (tx, rx) = oneshot::channel::<()>();
    let handle = tokio::spawn(controller::run_with(config, client, hooks, async move {
        let _ = rx.await;
    }));
    Running {
        shutdown: Some(tx),
        handle,
        metrics,
    }
}

impl Running {
    /// Shuts the controller down gracefully and returns its result.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(Duration::from_secs(30), &mut self.handle)
            .await
            .context("controller did not stop within 30s")???;
        Ok(())
    }
}

/// An AppService named `name` running `image`.
pub fn app(name: &str, image: &str, replicas: i32) -> AppService {
    AppService::new(
        name,
        AppServiceSpec {
            image: image.to_owned(),
            replicas: Some(replicas),
            ..AppServiceSpec::default()
        },
    )
}

pub async fn create(api: &Api<AppService>, app: &AppService) -> anyhow::Result<AppService> {
    Ok(api.create(&PostParams::default(), app).await?)
}

/// The condition `type_` of an AppService's status as `(status, reason, message)`.
pub fn condition(app: &AppService, type_: &str) -> Option<(String, String, String)> {
    let status = app.status.as_ref()?;
    common::conditions::find(&status.conditions, type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}
