//! The garbage collector, the consumer of our owner references, in every served-version
//! state of the AppService CRD (issue 21): both versions served, `v1beta1` only, and
//! children that still name `v1alpha1` (as an earlier release made them) once it is no
//! longer served. Deleting an AppService, in background and in foreground, must take its
//! Deployment, Service and `<name>-database` Secret with it, through the real
//! garbage collector of kube-controller-manager.
//!
//! The last state shows why the controller re-points owner references: a child naming
//! an unserved version is never collected (the collector cannot map the owner, and
//! retries for ever), while the same child re-pointed by a running controller before
//! the version is unserved is collected like any other.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use common::{AppService, DatabaseSpec};
use harness::{ControlPlane, Options, Postgres, eventually};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(120);
const V1ALPHA1: &str = "platform.example.com/v1alpha1";
const V1BETA1: &str = "platform.example.com/v1beta1";

fn init() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

/// One test's world: a private full control plane (the CRD changes), a PostgreSQL
/// server with its DatabaseClass, and a controller that may be started and stopped.
struct World {
    cp: ControlPlane,
    _ns: harness::TestNamespace,
    ns: String,
    client: Client,
    pg: Postgres,
    class: String,
    controller: Option<Running>,
}

/// A running controller: what stops it, and its task.
type Running = (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), controller::RunError>>,
);

impl World {
    async fn new() -> World {
        init();
        let cp = ControlPlane::start(Options::full()).await.unwrap();
        let ns_guard = cp.namespace().await.unwrap();
        let ns = ns_guard.name().to_owned();
        let client = cp.client();
        let pg = Postgres::start().await.unwrap();
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
        for (name, data) in [
            (
                "pg-admin",
                json!({"username": harness::postgres::SUPERUSER, "password": pg.password()}),
            ),
            ("pg-ca", json!({"ca.crt": pg.ca_pem()})),
        ] {
            let labels = if name == "pg-admin" {
                json!({(common::database_class::ADMIN_SECRET_LABEL): "true"})
            } else {
                json!({})
            };
            let secret: Secret = serde_json::from_value(
                json!({"metadata": {"name": name, "labels": labels}, "stringData": data}),
            )
            .unwrap();
            secrets
                .create(&PostParams::default(), &secret)
                .await
                .unwrap();
        }
        let class = format!("{ns}-pg");
        let object: common::DatabaseClass = serde_json::from_value(json!({
            "apiVersion": "platform.example.com/v1alpha1", "kind": "DatabaseClass",
            "metadata": {"name": class},
            "spec": {"host": "localhost", "port": pg.port(),
                     "tls": {"mode": "verify-full", "ca": {"secretRef": {"name": "pg-ca"}}},
                     "adminCredentials": {"secretName": "pg-admin"}, "deletionPolicy": "Delete"}
        }))
        .unwrap();
        Api::<common::DatabaseClass>::all(client.clone())
            .create(&PostParams::default(), &object)
            .await
            .unwrap();
        World {
            cp,
            _ns: ns_guard,
            ns,
            client,
            pg,
            class,
            controller: None,
        }
    }

    /// The controller at its shipped defaults, with the real database step.
    fn start_controller(&mut self) {
        let metrics = Arc::new(controller::metrics::Metrics::default());
        let databases = controller::database::Databases::new(
            self.client.clone(),
            &controller::database::DatabaseConfig {
                admin_namespace: Some(self.ns.clone()),
                pool_size: 2,
                connect_timeout: Duration::from_secs(3),
                statement_timeout: Duration::from_secs(10),
                orphan_scan_interval: Duration::from_secs(3600),
            },
            &self.ns,
            metrics.clone(),
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let handle = tokio::spawn(controller::run_with(
            controller::Config::for_namespace(&self.ns),
            self.client.clone(),
            controller::Hooks {
                metrics,
                external: Arc::new(databases),
                ..controller::Hooks::default()
            },
            async move {
                let _ = stopped.await;
            },
        ));
        self.controller = Some((stop, handle));
    }

    async fn stop_controller(&mut self) {
        if let Some((stop, handle)) = self.controller.take() {
            stop.send(()).unwrap();
            handle.await.unwrap().unwrap();
        }
    }

    fn apps(&self) -> Api<AppService> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// An AppService with a database; returns once its three children exist.
    async fn create(&self, name: &str) {
        let mut app = AppService::new(
            name,
            common::AppServiceSpec {
                image: "registry.example.com/gc:v1".into(),
                ..Default::default()
            },
        );
        app.spec.database = Some(DatabaseSpec {
            class: self.class.clone(),
        });
        self.apps()
            .create(&PostParams::default(), &app)
            .await
            .unwrap();
        eventually(&format!("{name}'s children"), WAIT, || async {
            Ok((self.owner_versions(name).await?.len() == 3).then_some(()))
        })
        .await
        .unwrap();
    }

    /// The apiVersion each existing child of `name` names its controller owner through.
    async fn owner_versions(&self, name: &str) -> Result<Vec<String>, kube::Error> {
        let mut versions = Vec::new();
        let owner = |refs: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference]| {
            refs.iter()
                .find(|r| r.controller == Some(true))
                .map(|r| r.api_version.clone())
                .unwrap_or_default()
        };
        let (d, s, secret) = (
            Api::<Deployment>::namespaced(self.client.clone(), &self.ns)
                .get_opt(name)
                .await?,
            Api::<Service>::namespaced(self.client.clone(), &self.ns)
                .get_opt(name)
                .await?,
            Api::<Secret>::namespaced(self.client.clone(), &self.ns)
                .get_opt(&format!("{name}-database"))
                .await?,
        );
        versions.extend(d.map(|d| owner(d.owner_references())));
        versions.extend(s.map(|s| owner(s.owner_references())));
        versions.extend(secret.map(|s| owner(s.owner_references())));
        Ok(versions)
    }

    /// What an earlier release left: every child of `name` naming its owner through
    /// `v1alpha1` (a JSON patch by someone else, the controller being stopped).
    async fn point_children_at_v1alpha1(&self, name: &str) {
        let patch: json_patch::Patch = serde_json::from_value(json!([{
            "op": "replace", "path": "/metadata/ownerReferences/0/apiVersion", "value": V1ALPHA1
        }]))
        .unwrap();
        let params = PatchParams::default();
        Api::<Deployment>::namespaced(self.client.clone(), &self.ns)
            .patch(name, &params, &Patch::Json::<()>(patch.clone()))
            .await
            .unwrap();
        Api::<Service>::namespaced(self.client.clone(), &self.ns)
            .patch(name, &params, &Patch::Json::<()>(patch.clone()))
            .await
            .unwrap();
        Api::<Secret>::namespaced(self.client.clone(), &self.ns)
            .patch(
                &format!("{name}-database"),
                &params,
                &Patch::Json::<()>(patch),
            )
            .await
            .unwrap();
        assert_eq!(self.owner_versions(name).await.unwrap(), [V1ALPHA1; 3]);
    }

    /// Deletes `name` with `policy`; with no controller running, its finalizer is
    /// released by hand first, as an admin would.
    async fn delete(&self, name: &str, policy: PropagationPolicy) {
        if self.controller.is_none() {
            self.apps()
                .patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                )
                .await
                .unwrap();
        }
        self.apps()
            .delete(
                name,
                &DeleteParams {
                    propagation_policy: Some(policy),
                    ..DeleteParams::default()
                },
            )
            .await
            .unwrap();
    }

    /// Waits until `name` and all its children are gone.
    async fn collected(&self, name: &str) {
        eventually(
            &format!("{name} and its children collected"),
            WAIT,
            || async {
                let app = self.apps().get_opt(name).await?;
                Ok((app.is_none() && self.owner_versions(name).await?.is_empty()).then_some(()))
            },
        )
        .await
        .unwrap();
    }

    /// Serves `v1alpha1` or not (`v1beta1` stays the storage version).
    async fn serve_v1alpha1(&self, served: bool) {
        let mut crd: CustomResourceDefinition =
            harness::load_crd(&harness::appservice_crd_path()).unwrap();
        for version in &mut crd.spec.versions {
            if version.name == "v1alpha1" {
                version.served = served;
            }
        }
        self.cp.apply_crd(&crd).await.unwrap();
    }

    /// Returns once kube-controller-manager's garbage collector has rediscovered the
    /// API after this call: a ConfigMap owned by an object of a CRD created now is
    /// collected only once the collector can map that CRD's kind. After that, it no
    /// longer maps what was unserved before the call.
    async fn collector_rediscovered(&self, probe: &str) {
        let crd: CustomResourceDefinition = serde_json::from_value(json!({
            "metadata": {"name": format!("{probe}s.gc-probe.example.com")},
            "spec": {
                "group": "gc-probe.example.com",
                "names": {"plural": format!("{probe}s"), "singular": probe, "kind": "Probe",
                          "listKind": "ProbeList"},
                "scope": "Namespaced",
                "versions": [{"name": "v1", "served": true, "storage": true,
                              "schema": {"openAPIV3Schema": {"type": "object"}}}]
            }
        }))
        .unwrap();
        self.cp.apply_crd(&crd).await.unwrap();
        let dependent: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": probe, "ownerReferences": [{
                "apiVersion": "gc-probe.example.com/v1", "kind": "Probe", "name": "gone",
                "uid": "00000000-0000-0000-0000-000000000000"
            }]}
        }))
        .unwrap();
        let configmaps: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.ns);
        configmaps
            .create(&PostParams::default(), &dependent)
            .await
            .unwrap();
        eventually("the collector to know a new kind", WAIT, || async {
            Ok(configmaps.get_opt(probe).await?.is_none().then_some(()))
        })
        .await
        .unwrap();
    }
}

/// Both versions served, then `v1beta1` only: the controller's children name the
/// storage version, and the garbage collector takes them with their AppService, in
/// background and in foreground.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_are_collected_in_every_served_state() {
    let mut w = World::new().await;
    w.start_controller();
    for (state, served) in [("both", true), ("beta", false)] {
        w.serve_v1alpha1(served).await;
        for (policy, suffix) in [
            (PropagationPolicy::Background, "bg"),
            (PropagationPolicy::Foreground, "fg"),
        ] {
            let name = format!("{state}-{suffix}");
            w.create(&name).await;
            assert_eq!(w.owner_versions(&name).await.unwrap(), [V1BETA1; 3]);
            w.delete(&name, policy).await;
            w.collected(&name).await;
        }
    }
    w.stop_controller().await;
    drop(w.pg);
}

/// Children naming `v1alpha1` when it is unserved: never collected, and a foreground
/// deletion of their owner never ends. The same children, re-pointed by the controller
/// while `v1alpha1` was still served, are collected after it is unserved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_pointing_before_unserving_v1alpha1_prevents_orphans() {
    let mut w = World::new().await;
    w.start_controller();
    for name in ["left-bg", "left-fg", "kept-bg", "kept-fg", "control"] {
        w.create(name).await;
    }
    w.stop_controller().await;
    // As an earlier release left them.
    for name in ["left-bg", "left-fg", "kept-bg", "kept-fg"] {
        w.point_children_at_v1alpha1(name).await;
    }

    // The controller of this release, started while v1alpha1 is served, re-points the
    // children it converges; nothing else changes in them (no new generation, the same
    // Pod template, the same hash).
    let before = Api::<Deployment>::namespaced(w.client.clone(), &w.ns)
        .get("kept-bg")
        .await
        .unwrap();
    w.start_controller();
    for name in ["kept-bg", "kept-fg", "left-bg", "left-fg"] {
        eventually(&format!("{name}'s children re-pointed"), WAIT, || async {
            Ok((w.owner_versions(name).await? == [V1BETA1; 3]).then_some(()))
        })
        .await
        .unwrap();
    }
    let after = Api::<Deployment>::namespaced(w.client.clone(), &w.ns)
        .get("kept-bg")
        .await
        .unwrap();
    assert_eq!(after.metadata.generation, before.metadata.generation);
    assert_eq!(after.spec.template, before.spec.template);
    assert_eq!(
        after
            .annotations()
            .get(common::names::ANNOTATION_DESIRED_HASH),
        before
            .annotations()
            .get(common::names::ANNOTATION_DESIRED_HASH)
    );
    w.stop_controller().await;
    // Two of them are put back on v1alpha1: a release that never re-pointed.
    for name in ["left-bg", "left-fg"] {
        w.point_children_at_v1alpha1(name).await;
    }

    // The last step of the migration, and the collector has seen it.
    w.serve_v1alpha1(false).await;
    w.collector_rediscovered("after-unserve").await;

    w.delete("kept-bg", PropagationPolicy::Background).await;
    w.delete("kept-fg", PropagationPolicy::Foreground).await;
    w.delete("left-bg", PropagationPolicy::Background).await;
    w.delete("left-fg", PropagationPolicy::Foreground).await;
    w.delete("control", PropagationPolicy::Background).await;
    for name in ["kept-bg", "kept-fg", "control"] {
        w.collected(name).await;
    }
    // The collector worked through every deletion above, and still: the children
    // naming v1alpha1 are there, and the foreground deletion waits on them for ever.
    assert_eq!(w.owner_versions("left-bg").await.unwrap(), [V1ALPHA1; 3]);
    assert!(w.apps().get_opt("left-bg").await.unwrap().is_none());
    assert_eq!(w.owner_versions("left-fg").await.unwrap(), [V1ALPHA1; 3]);
    let stuck = w.apps().get("left-fg").await.unwrap();
    assert!(stuck.metadata.deletion_timestamp.is_some());
    assert!(stuck.finalizers().iter().any(|f| f == "foregroundDeletion"));

    // Serving v1alpha1 again (the runbook's way out) lets the collector finish.
    w.serve_v1alpha1(true).await;
    w.collected("left-bg").await;
    w.collected("left-fg").await;
    drop(w.pg);
}
