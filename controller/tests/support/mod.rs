//! Helpers shared by the controller's integration tests: an in-process controller scoped
//! to one test namespace, AppService fixtures, and polling for eventual conditions.

#![allow(dead_code)]

use std::future::Future;
use std::sync::{Arc, Once};
use std::time::Duration;

use anyhow::{Context as _, bail};
use common::{AppService, AppServiceSpec};
use controller::metrics::Metrics;
use controller::{Config, Hooks};
use kube::api::PostParams;
use kube::{Api, Client};
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

/// Polls `check` every 200ms until it returns `Some`, failing after `timeout` with the
/// last observation.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last_err = None;
    loop {
        match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_err = Some(e),
        }
        if tokio::time::Instant::now() >= deadline {
            match last_err {
                Some(e) => {
                    bail!("timed out after {timeout:?} waiting for {what}; last error: {e:#}")
                }
                None => bail!("timed out after {timeout:?} waiting for {what}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The condition `type_` of an AppService's status as `(status, reason, message)`.
pub fn condition(app: &AppService, type_: &str) -> Option<(String, String, String)> {
    let status = app.status.as_ref()?;
    common::conditions::find(&status.conditions, type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}
