//! A policy added after an AppService was written never blocks the controller's own
//! writes: the real controller and the real webhook (over TLS, with the chart's rules)
//! on the real API server. The AppService violates the new policy, a user's change of
//! it is refused, and yet it is deleted: its finalizer is released and it goes away.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Once;
use std::time::Duration;

use common::AppService;
use common::names::FINALIZER;
use harness::eventually;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

fn install_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(webhook::tls::install_crypto_provider);
}

/// External resources behind the finalizer (a database stands for them in production):
/// nothing to make or remove, but every AppService carries the finalizer for them.
struct Held;

impl controller::external::External for Held {
    fn ensure<'a>(
        &'a self,
        _app: &'a controller::subject::Subject<'a>,
    ) -> futures::future::BoxFuture<'a, controller::error::Result<controller::external::Report>>
    {
        Box::pin(async { Ok(controller::external::Report::done()) })
    }

    fn cleanup<'a>(
        &'a self,
        _app: &'a controller::subject::Subject<'a>,
    ) -> futures::future::BoxFuture<'a, controller::error::Result<controller::external::Step>> {
        Box::pin(async { Ok(controller::external::Step::Done) })
    }
}

#[tokio::test]
async fn an_appservice_violating_a_later_policy_is_still_finalized_and_deleted() {
    install_provider();
    let cp = harness::shared().await.expect("control plane");
    let _logs = cp.log_guard();
    // A namespace the shipped policy treats as production.
    let ns = cp.namespace_with_prefix("prod").await.expect("namespace");

    // The webhook at its shipped settings (the AppService watch on), with no policy yet.
    let dir = tempfile::tempdir().expect("temp dir");
    let (ca, serving) = harness::webhook_tls().expect("certificates");
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    serving.write(&cert, &key).expect("writing certificates");
    let policies = dir.path().join("policies.yaml");
    std::fs::write(&policies, "policies: []\n").unwrap();
    let mut config = webhook::config::Config::local(cert, key, Some(policies.clone()));
    config.watch_appservices = true;
    config.reload_interval = Duration::from_secs(1);
    let server = webhook::server::start_with_client(&config, Some(cp.client()))
        .await
        .expect("webhook starts");
    let webhooks = cp
        .register_webhooks(
            &ns,
            &format!("https://{}", server.tls_addr()),
            ca.cert_pem(),
        )
        .await
        .expect("webhooks in effect");

    // The controller at its production defaults, with external resources to clean up.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(controller::run_with(
        controller::Config::for_namespace(&ns),
        cp.client(),
        controller::Hooks {
            external: std::sync::Arc::new(Held),
            ..controller::Hooks::default()
        },
        async move {
            let _ = stopped.await;
        },
    ));

    let apps: Api<AppService> = Api::namespaced(cp.client(), &ns);
    let app: AppService = serde_json::from_value(json!({
        "apiVersion": "platform.example.com/v1beta1", "kind": "AppService",
        "metadata": {"name": "legacy"},
        "spec": {"image": "registry.example.com/legacy:latest", "replicas": 1}
    }))
    .unwrap();
    apps.create(&PostParams::default(), &app).await.unwrap();
    eventually(
        "the controller's finalizer on the AppService",
        Duration::from_secs(60),
        || async {
            let app = apps.get("legacy").await.ok()?;
            app.metadata
                .finalizers
                .unwrap_or_default()
                .iter()
                .any(|f| f == FINALIZER)
                .then_some(())
        },
    )
    .await
    .unwrap();

    // The admin adds the shipped policy: `legacy` runs latest with one replica in a
    // production namespace, which it forbids twice over.
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/policies/no-latest-in-production.yaml");
    std::fs::copy(&shipped, &policies).unwrap();
    let change = json!({"spec": {"replicas": 1, "env": [{"name": "A", "value": "1"}]}});
    let dry_run = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    let refused = eventually(
        "the new policy to refuse a change of the AppService",
        Duration::from_secs(30),
        || async {
            match apps.patch("legacy", &dry_run, &Patch::Merge(&change)).await {
                Err(kube::Error::Api(status)) => Some(status.message),
                _ => None,
            }
        },
    )
    .await
    .unwrap();
    assert!(
        refused.contains("pinned-images-in-production")
            && refused.contains("production-replicas-by-name"),
        "{refused}"
    );

    // Deleting it: the controller cleans up and releases its finalizer through the same
    // webhook, and the AppService goes away.
    apps.delete("legacy", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the AppService to be finalized and gone",
        Duration::from_secs(60),
        || async { apps.get_opt("legacy").await.ok()?.is_none().then_some(()) },
    )
    .await
    .unwrap();

    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("controller stops")
        .expect("controller task")
        .expect("controller ran without error");
    webhooks.remove(cp.client()).await.unwrap();
    server.shutdown().await.unwrap();
    ns.cleanup().await.unwrap();
}
