//! What the world does to an AppService's objects, on a full control plane (Pods become
//! ready through kwok, owned objects are garbage-collected): children deleted, edited by
//! other field managers, taken by foreign objects, status edited, the finalizer removed,
//! the controller restarted. After each perturbation the AppService must be back to its
//! spec and `Ready=True` within [`HEAL`] (the time is printed), and then the controller
//! must make no writes at all over several reconciles.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use common::conditions::{DEGRADED, READY, TRUE, reasons};
use common::defaults::DEFAULT_PORT_NAME as PORT_NAME;
use common::names::{FINALIZER, child_labels, endpoint, selector_labels};
use common::{AppService, AppServiceSpec, EnvVar};
use controller::desired::CONTAINER_NAME;
use harness::eventually;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use support::world::World;
use support::{Fixture, ROLLOUT, condition, init, start_controller};

/// How long healing may take. Generous for a loaded CI machine; the measured times are
/// printed and are normally well under a second plus the Pods' start.
const HEAL: Duration = Duration::from_secs(10);
/// How long until Ready=True again, which also waits for the control plane's own
/// controllers (the Deployment controller, garbage collection, kwok's Pods).
const READY_BOUND: Duration = Duration::from_secs(45);
const WAIT: Duration = Duration::from_secs(90);
/// The field manager of "someone else".
const INTRUDER: &str = "intruder";
/// Another party's finalizer (a backup tool, say), which the controller leaves alone.
const OTHER_FINALIZER: &str = "example.com/backup";

/// A [`Fixture`] on the shared full control plane and its controller, at the shipped
/// defaults (resync 10 minutes): every heal below is the work of an event.
async fn fixture() -> anyhow::Result<World> {
    World::start(Fixture::setup().full()).await
}

fn spec(image: &str, replicas: i32) -> AppServiceSpec {
    AppServiceSpec {
        image: image.to_owned(),
        replicas: Some(replicas),
        env: vec![EnvVar {
            name: "LOG_LEVEL".into(),
            value: Some("info".into()),
            value_from: None,
        }],
        ..AppServiceSpec::default()
    }
}

impl support::Converges for World {
    fn problems<'a>(
        &'a self,
        name: &'a str,
    ) -> futures::future::BoxFuture<'a, anyhow::Result<Vec<String>>> {
        Box::pin(self.problems_of(name))
    }
}

impl World {
    /// Everything about `name` that does not match its spec, empty when converged: the
    /// children carry the spec, the Deployment has rolled out, and status says so for
    /// the current generation.
    async fn problems_of(&self, name: &str) -> anyhow::Result<Vec<String>> {
        let mut p = Vec::new();
        let app = self.apps.get(name).await?;
        let spec = &app.spec;
        let replicas = spec.replicas.unwrap_or(1);
        let port = spec.port();
        let uid = app.uid().context("uid")?;
        let generation = app.metadata.generation;

        if !app.finalizers().iter().any(|f| f == FINALIZER) {
            p.push(format!("no finalizer: {:?}", app.finalizers()));
        }
        let status = app.status.clone().unwrap_or_default();
        if status.observed_generation != generation {
            p.push(format!(
                "status.observedGeneration {:?} != {generation:?}",
                status.observed_generation
            ));
        }
        match condition(&app, READY) {
            Some((s, _, _)) if s == TRUE => {}
            other => p.push(format!("{ROLLOUT}Ready is {other:?}")),
        }
        for c in &status.conditions {
            if c.observed_generation != generation {
                p.push(format!(
                    "condition {} is for generation {:?}",
                    c.type_, c.observed_generation
                ));
            }
        }
        if status.ready_replicas != Some(replicas) {
            p.push(format!(
                "{ROLLOUT}status.readyReplicas {:?} != {replicas}",
                status.ready_replicas
            ));
        }
        if status.endpoint.as_deref() != Some(endpoint(name, &self.ns, port).as_str()) {
            p.push(format!("status.endpoint {:?}", status.endpoint));
        }

        let owned = |refs: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference]| {
            refs.iter()
                .any(|r| r.uid == uid && r.controller == Some(true))
        };
        let has_labels = |labels: &BTreeMap<String, String>| {
            child_labels(name)
                .iter()
                .all(|(k, v)| labels.get(k) == Some(v))
        };
        match self.deployments.get_opt(name).await? {
            None => p.push("no Deployment".to_owned()),
            Some(d) => {
                if !owned(d.owner_references()) {
                    p.push("Deployment not controlled by the AppService".to_owned());
                }
                if !has_labels(d.labels()) {
                    p.push(format!("Deployment labels {:?}", d.labels()));
                }
                if d.spec.replicas != Some(replicas) {
                    p.push(format!("Deployment replicas {:?}", d.spec.replicas));
                }
                let template_labels = d
                    .spec
                    .template
                    .metadata
                    .as_ref()
                    .and_then(|m| m.labels.clone())
                    .unwrap_or_default();
                if !has_labels(&template_labels) {
                    p.push(format!("template labels {template_labels:?}"));
                }
                let containers = d
                    .spec
                    .template
                    .spec
                    .as_ref()
                    .map(|s| s.containers.clone())
                    .unwrap_or_default();
                match containers.iter().find(|c| c.name == CONTAINER_NAME) {
                    None => p.push("no app container".to_owned()),
                    Some(c) => {
                        if c.image.as_deref() != Some(spec.image.as_str()) {
                            p.push(format!("image {:?}", c.image));
                        }
                        let ports: Vec<(Option<String>, i32)> = c
                            .ports
                            .clone()
                            .unwrap_or_default()
                            .into_iter()
                            .map(|p| (p.name, p.container_port))
                            .collect();
                        if ports != [(Some(PORT_NAME.to_owned()), port)] {
                            p.push(format!("container ports {ports:?}"));
                        }
                        let env: Vec<(String, Option<String>)> = c
                            .env
                            .clone()
                            .unwrap_or_default()
                            .into_iter()
                            .map(|e| (e.name, e.value.filter(|v| !v.is_empty())))
                            .collect();
                        let mut want: Vec<(String, Option<String>)> = spec
                            .env
                            .iter()
                            .map(|e| (e.name.clone(), e.value.clone().filter(|v| !v.is_empty())))
                            .collect();
                        if spec.database.is_some() {
                            // From the Secret, never as a value: the URL, then the libpq
                            // variables the spec does not set (the class verifies the
                            // server, so PGSSLROOTCERT too).
                            want.push((common::names::DATABASE_URL_ENV.to_owned(), None));
                            for key in [
                                "PGHOST",
                                "PGPORT",
                                "PGDATABASE",
                                "PGUSER",
                                "PGPASSWORD",
                                "PGSSLMODE",
                                "PGSSLROOTCERT",
                            ] {
                                if !spec.env.iter().any(|e| e.name == key) {
                                    want.push((key.to_owned(), None));
                                }
                            }
                        }
                        if env != want {
                            p.push(format!("env {env:?}"));
                        }
                    }
                }
                let st = d.status.clone().unwrap_or_default();
                let rolled_out = st.observed_generation == d.metadata.generation
                    && st.ready_replicas.unwrap_or(0) == replicas
                    && st.replicas.unwrap_or(0) == replicas
                    && st.updated_replicas.unwrap_or(0) == replicas;
                if condition(&app, READY).is_some_and(|(s, _, _)| s == TRUE)
                    && !rolled_out
                    && status.observed_generation == generation
                {
                    p.push(format!(
                        "{ROLLOUT}Ready=True but the Deployment is not rolled out: {st:?}"
                    ));
                }
                if st.observed_generation != d.metadata.generation {
                    p.push(format!("{ROLLOUT}Deployment not yet observed"));
                }
                if st.ready_replicas.unwrap_or(0) != replicas
                    || st.replicas.unwrap_or(0) != replicas
                    || st.updated_replicas.unwrap_or(0) != replicas
                {
                    p.push(format!(
                        "{ROLLOUT}Deployment rollout: {}/{}/{} (ready/total/updated) of {replicas}",
                        st.ready_replicas.unwrap_or(0),
                        st.replicas.unwrap_or(0),
                        st.updated_replicas.unwrap_or(0)
                    ));
                }
            }
        }
        match self.services.get_opt(name).await? {
            None => p.push("no Service".to_owned()),
            Some(s) => {
                if !owned(s.owner_references()) {
                    p.push("Service not controlled by the AppService".to_owned());
                }
                if !has_labels(s.labels()) {
                    p.push(format!("Service labels {:?}", s.labels()));
                }
                let sp = s.spec.clone().unwrap_or_default();
                if sp.type_.as_deref() != Some("ClusterIP") {
                    p.push(format!("Service type {:?}", sp.type_));
                }
                if sp.selector != Some(selector_labels(name)) {
                    p.push(format!("Service selector {:?}", sp.selector));
                }
                let ports: Vec<_> = sp
                    .ports
                    .unwrap_or_default()
                    .into_iter()
                    .map(|p| (p.name, p.port, p.target_port, p.node_port))
                    .collect();
                if ports
                    != [(
                        Some(PORT_NAME.to_owned()),
                        port,
                        Some(IntOrString::Int(port)),
                        None,
                    )]
                {
                    p.push(format!("Service ports {ports:?}"));
                }
            }
        }
        Ok(p)
    }

    /// Waits until `name` is converged; fails after `bound` with what is still off.
    async fn converged_within(&self, name: &str, bound: Duration) -> anyhow::Result<Duration> {
        self.within(name, bound, true).await
    }

    /// Like [`Self::converged_within`]; without `rollout`, only the children's content
    /// and the status's generation count, not the Pods' progress (which is the control
    /// plane's, e.g. garbage collection of a deleted Deployment's ReplicaSets).
    async fn within(&self, name: &str, bound: Duration, rollout: bool) -> anyhow::Result<Duration> {
        support::no_problems_within(self, name, bound, rollout).await
    }

    /// Applies `p` to `name`, then asserts it heals within [`HEAL`] and prints the time.
    async fn heals(&self, name: &str, p: Perturbation) -> anyhow::Result<()> {
        // Converged first: the Pods of an earlier perturbation (a scale-up put back)
        // may still be going away, and status follows them.
        self.converged_within(name, READY_BOUND)
            .await
            .with_context(|| format!("before {p:?}"))?;
        let before = self.apps.get(name).await?;
        p.apply(self, name).await?;
        self.recovers(name, &format!("healed {p:?} on {name}"))
            .await
            .with_context(|| format!("after {p:?}"))?;
        if p.status_edit().is_some() {
            // Everything the controller wrote is back as it was, not only what
            // `problems_of` looks at (a condition put back is new, so its time is too).
            let after = self.apps.get(name).await?;
            assert_eq!(
                timeless(after.status.as_ref()),
                timeless(before.status.as_ref()),
                "status after {p:?}"
            );
        }
        if p == Perturbation::ReplaceFinalizers {
            let after = self.apps.get(name).await?;
            assert_eq!(
                after.finalizers(),
                [OTHER_FINALIZER.to_owned(), FINALIZER.to_owned()],
                "ours put back next to the other party's"
            );
            // The other party lets go.
            self.apps
                .patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"finalizers": [FINALIZER]}})),
                )
                .await?;
        }
        Ok(())
    }

    /// Waits until `name`'s children (within [`HEAL`]) and then its Ready condition
    /// (within [`READY_BOUND`]) are back, and prints how long each took after `what`.
    async fn recovers(&self, name: &str, what: &str) -> anyhow::Result<()> {
        support::recovers(self, name, what, HEAL, READY_BOUND).await
    }

    async fn json_patch<K>(&self, api: &Api<K>, name: &str, ops: Value) -> anyhow::Result<()>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let patch: json_patch::Patch = serde_json::from_value(ops)?;
        api.patch(
            name,
            &PatchParams {
                field_manager: Some(INTRUDER.to_owned()),
                ..PatchParams::default()
            },
            &Patch::Json::<()>(patch),
        )
        .await?;
        Ok(())
    }
}

/// `status` as JSON without the conditions' transition times.
fn timeless(status: Option<&common::AppServiceStatus>) -> Value {
    let mut value = serde_json::to_value(status).unwrap_or(Value::Null);
    if let Some(conditions) = value.get_mut("conditions").and_then(Value::as_array_mut) {
        for c in conditions {
            if let Some(c) = c.as_object_mut() {
                c.remove("lastTransitionTime");
            }
        }
    }
    value
}

/// Something the world does to an AppService or its children.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Perturbation {
    DeleteDeployment,
    DeleteService,
    DeleteBoth,
    Image,
    Replicas,
    ContainerPort,
    ExtraEnv,
    ServicePort,
    ServiceTypeNodePort,
    ServiceTypeLoadBalancer,
    ServiceSelector,
    ServiceSelectorExtraKey,
    RemoveDeploymentLabel,
    RemoveServiceLabel,
    ForceApplyDeployment,
    ForceApplyService,
    EditStatus,
    /// Every field the controller owns on the AppService itself, removed or edited by
    /// another writer: the status as a whole, its conditions, its generation, the
    /// finalizer.
    ClearStatus,
    RemoveConditions,
    FlipReady,
    StaleObservedGeneration,
    RemoveFinalizer,
    ReplaceFinalizers,
}

impl Perturbation {
    const ALL: [Perturbation; 23] = [
        Perturbation::DeleteDeployment,
        Perturbation::DeleteService,
        Perturbation::DeleteBoth,
        Perturbation::Image,
        Perturbation::Replicas,
        Perturbation::ContainerPort,
        Perturbation::ExtraEnv,
        Perturbation::ServicePort,
        Perturbation::ServiceTypeNodePort,
        Perturbation::ServiceTypeLoadBalancer,
        Perturbation::ServiceSelector,
        Perturbation::ServiceSelectorExtraKey,
        Perturbation::RemoveDeploymentLabel,
        Perturbation::RemoveServiceLabel,
        Perturbation::ForceApplyDeployment,
        Perturbation::ForceApplyService,
        Perturbation::EditStatus,
        Perturbation::ClearStatus,
        Perturbation::RemoveConditions,
        Perturbation::FlipReady,
        Perturbation::StaleObservedGeneration,
        Perturbation::RemoveFinalizer,
        Perturbation::ReplaceFinalizers,
    ];

    /// The merge patch of the AppService's status another writer sends, for the
    /// perturbations that are one.
    fn status_edit(self) -> Option<Value> {
        Some(match self {
            Perturbation::EditStatus => json!({"status": {
                "readyReplicas": 99,
                "endpoint": "http://elsewhere:1",
            }}),
            Perturbation::ClearStatus => json!({"status": null}),
            Perturbation::RemoveConditions => json!({"status": {"conditions": null}}),
            Perturbation::FlipReady => json!({"status": {"conditions": [{
                "type": READY, "status": "False", "reason": "Intruder",
                "message": "written by another writer",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }]}}),
            Perturbation::StaleObservedGeneration => json!({"status": {"observedGeneration": 7}}),
            _ => return None,
        })
    }

    /// The JSON patch another field manager sends, for the perturbations that are one:
    /// which child it edits (`true` for the Deployment) and the operations.
    fn edit(self) -> Option<(bool, Value)> {
        let c = "/spec/template/spec/containers/0";
        let (deployment, op, path, value) = match self {
            Perturbation::Image => (
                true,
                "replace",
                format!("{c}/image"),
                json!("registry.example.com/other:v9"),
            ),
            Perturbation::Replicas => (true, "replace", "/spec/replicas".into(), json!(5)),
            Perturbation::ContainerPort => (
                true,
                "replace",
                format!("{c}/ports/0/containerPort"),
                json!(9999),
            ),
            Perturbation::ExtraEnv => (
                true,
                "add",
                format!("{c}/env/-"),
                json!({"name": "INJECTED", "value": "1"}),
            ),
            Perturbation::ServicePort => {
                (false, "replace", "/spec/ports/0/port".into(), json!(9999))
            }
            Perturbation::ServiceTypeNodePort => {
                (false, "replace", "/spec/type".into(), json!("NodePort"))
            }
            Perturbation::ServiceTypeLoadBalancer => {
                (false, "replace", "/spec/type".into(), json!("LoadBalancer"))
            }
            Perturbation::ServiceSelector => (
                false,
                "replace",
                "/spec/selector/app.kubernetes.io~1instance".into(),
                json!("someone-else"),
            ),
            Perturbation::ServiceSelectorExtraKey => {
                (false, "add", "/spec/selector/tier".into(), json!("backend"))
            }
            Perturbation::RemoveDeploymentLabel => (
                true,
                "remove",
                "/metadata/labels/app.kubernetes.io~1managed-by".into(),
                Value::Null,
            ),
            Perturbation::RemoveServiceLabel => (
                false,
                "remove",
                "/metadata/labels/app.kubernetes.io~1instance".into(),
                Value::Null,
            ),
            _ => return None,
        };
        let mut operation = json!({"op": op, "path": path});
        if !value.is_null() {
            operation["value"] = value;
        }
        Some((deployment, json!([operation])))
    }

    async fn apply(self, f: &World, name: &str) -> anyhow::Result<()> {
        if let Some(edit) = self.status_edit() {
            f.apps
                .patch_status(name, &PatchParams::default(), &Patch::Merge(edit))
                .await?;
            return Ok(());
        }
        if let Some((deployment, ops)) = self.edit() {
            return if deployment {
                f.json_patch(&f.deployments, name, ops).await
            } else {
                f.json_patch(&f.services, name, ops).await
            };
        }
        match self {
            Perturbation::DeleteDeployment => {
                f.deployments.delete(name, &DeleteParams::default()).await?;
            }
            Perturbation::DeleteService => {
                f.services.delete(name, &DeleteParams::default()).await?;
            }
            Perturbation::DeleteBoth => {
                f.deployments.delete(name, &DeleteParams::default()).await?;
                f.services.delete(name, &DeleteParams::default()).await?;
            }
            Perturbation::ForceApplyDeployment => {
                let mut d = f.deployments.get(name).await?;
                d.metadata.managed_fields = None;
                d.metadata.resource_version = None;
                d.status = None;
                d.spec.replicas = Some(3);
                if let Some(c) = d.spec.template.spec.as_mut().map(|s| &mut s.containers[0]) {
                    c.image = Some("registry.example.com/taken-over:v1".into());
                }
                f.deployments
                    .patch(
                        name,
                        &PatchParams::apply(INTRUDER).force(),
                        &Patch::Apply(&d),
                    )
                    .await?;
            }
            Perturbation::ForceApplyService => {
                let mut s = f.services.get(name).await?;
                s.metadata.managed_fields = None;
                s.metadata.resource_version = None;
                s.status = None;
                if let Some(sp) = s.spec.as_mut() {
                    sp.ports = Some(vec![k8s_openapi::api::core::v1::ServicePort {
                        name: Some("web".into()),
                        port: 80,
                        target_port: Some(IntOrString::Int(80)),
                        protocol: Some("TCP".into()),
                        ..Default::default()
                    }]);
                }
                f.services
                    .patch(
                        name,
                        &PatchParams::apply(INTRUDER).force(),
                        &Patch::Apply(&s),
                    )
                    .await?;
            }
            Perturbation::RemoveFinalizer => {
                f.apps
                    .patch(
                        name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                    )
                    .await?;
            }
            Perturbation::ReplaceFinalizers => {
                f.apps
                    .patch(
                        name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"finalizers": [OTHER_FINALIZER]}})),
                    )
                    .await?;
            }
            // JSON patches of another field manager, sent above.
            _ => {}
        }
        Ok(())
    }
}

async fn one_by_one(name: &str, perturbations: &[Perturbation]) -> anyhow::Result<()> {
    let f = fixture().await?;
    f.create(name, spec("registry.example.com/web:v1", 2))
        .await?;
    f.converged_within(name, WAIT).await?;
    f.quiet(3).await?;
    for p in perturbations {
        f.heals(name, *p).await?;
    }
    f.quiet(3).await?;
    f.ctl.stop().await?;
    Ok(())
}

#[tokio::test]
async fn deleted_children_come_back() -> anyhow::Result<()> {
    one_by_one(
        "deleted",
        &[
            Perturbation::DeleteDeployment,
            Perturbation::DeleteService,
            Perturbation::DeleteBoth,
        ],
    )
    .await
}

#[tokio::test]
async fn deployment_edits_by_another_manager_are_put_back() -> anyhow::Result<()> {
    one_by_one(
        "dedits",
        &[
            Perturbation::Image,
            Perturbation::Replicas,
            Perturbation::ContainerPort,
            Perturbation::ExtraEnv,
            Perturbation::RemoveDeploymentLabel,
            Perturbation::ForceApplyDeployment,
        ],
    )
    .await
}

#[tokio::test]
async fn service_edits_by_another_manager_are_put_back() -> anyhow::Result<()> {
    one_by_one(
        "sedits",
        &[
            Perturbation::ServicePort,
            Perturbation::ServiceTypeNodePort,
            Perturbation::ServiceTypeLoadBalancer,
            Perturbation::ServiceSelector,
            Perturbation::ServiceSelectorExtraKey,
            Perturbation::RemoveServiceLabel,
            Perturbation::ForceApplyService,
        ],
    )
    .await
}

#[tokio::test]
async fn status_and_finalizer_edits_are_put_back() -> anyhow::Result<()> {
    one_by_one(
        "meta",
        &[
            Perturbation::EditStatus,
            Perturbation::ClearStatus,
            Perturbation::RemoveConditions,
            Perturbation::FlipReady,
            Perturbation::StaleObservedGeneration,
            Perturbation::RemoveFinalizer,
            Perturbation::ReplaceFinalizers,
        ],
    )
    .await
}

/// After the spec changes, a Service port another manager had re-keyed must not block
/// the apply of the new port (the 422 "Duplicate value" case).
#[tokio::test]
async fn spec_change_after_a_foreign_port_edit_converges() -> anyhow::Result<()> {
    let f = fixture().await?;
    f.create("ports", spec("registry.example.com/web:v1", 1))
        .await?;
    f.converged_within("ports", WAIT).await?;
    f.heals("ports", Perturbation::ServicePort).await?;
    f.heals("ports", Perturbation::ContainerPort).await?;
    f.apps
        .patch(
            "ports",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"ports": [{"name": "http", "port": 9090}]}})),
        )
        .await?;
    f.recovers("ports", "port change").await?;
    f.quiet(3).await?;
    f.ctl.stop().await?;
    Ok(())
}

#[tokio::test]
async fn labels_and_annotations_added_by_users_are_kept_without_a_fight() -> anyhow::Result<()> {
    let f = fixture().await?;
    f.create("kept", spec("registry.example.com/web:v1", 1))
        .await?;
    f.converged_within("kept", WAIT).await?;
    let extra = json!({"metadata": {
        "labels": {"team": "payments"},
        "annotations": {"example.com/owner": "payments"},
    }});
    let pp = PatchParams {
        field_manager: Some(INTRUDER.to_owned()),
        ..PatchParams::default()
    };
    let d0 = f
        .deployments
        .patch("kept", &pp, &Patch::Merge(&extra))
        .await?;
    let s0 = f.services.patch("kept", &pp, &Patch::Merge(&extra)).await?;
    let writes = f.ctl.metrics.write_count();
    // Three reconciles after events that follow the intruder's in each watch (the
    // AppService, then the Deployment, then the Service poked): each saw its edits.
    support::poke(&f, &f.ctl.metrics, &["kept".to_owned()], 3).await?;
    let d1 = f.deployments.get("kept").await?;
    let s1 = f.services.get("kept").await?;
    // Status updates by the Deployment controller move resourceVersions; what must not
    // move is the spec (generation) and anything our field manager wrote.
    assert_eq!(
        ours(&d1),
        ours(&d0),
        "Deployment rewritten by the controller"
    );
    assert_eq!(ours(&s1), ours(&s0), "Service rewritten by the controller");
    assert_eq!(d1.metadata.generation, d0.metadata.generation);
    assert_eq!(d1.labels()["team"], "payments");
    assert_eq!(s1.annotations()["example.com/owner"], "payments");
    assert_eq!(f.ctl.metrics.write_count(), writes);
    // Still converged with the user's labels (the control plane may still be reporting a
    // status change of its own, so within the bound, not at this instant).
    f.converged_within("kept", WAIT).await?;
    f.ctl.stop().await?;
    Ok(())
}

/// When and how our field manager last wrote an object.
fn ours<K: kube::Resource>(obj: &K) -> Vec<String> {
    obj.meta()
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| m.manager.as_deref() == Some(common::names::FIELD_MANAGER))
        .map(|m| format!("{:?} {:?}", m.operation, m.time))
        .collect()
}

/// A foreign object holding one of the names blocks both children (no half-built
/// AppService), status says who must act, and the name's release is noticed at once.
#[tokio::test]
async fn foreign_objects_block_until_they_go_away() -> anyhow::Result<()> {
    let f = fixture().await?;
    for kind in ["Deployment", "Service"] {
        let name = format!("taken-{}", kind.to_lowercase());
        let labels = BTreeMap::from([("app".to_owned(), "legacy".to_owned())]);
        match kind {
            "Deployment" => {
                let d: Deployment = serde_json::from_value(json!({
                    "metadata": {"name": name, "labels": labels},
                    "spec": {
                        "replicas": 1,
                        "selector": {"matchLabels": labels},
                        "template": {
                            "metadata": {"labels": labels},
                            "spec": {"containers": [{"name": "legacy", "image": "legacy:1"}]}
                        }
                    }
                }))?;
                f.deployments.create(&PostParams::default(), &d).await?;
            }
            _ => {
                let s: Service = serde_json::from_value(json!({
                    "metadata": {"name": name, "labels": labels},
                    "spec": {"selector": labels, "ports": [{"port": 80}]}
                }))?;
                f.services.create(&PostParams::default(), &s).await?;
            }
        }
        f.create(&name, spec("registry.example.com/web:v1", 1))
            .await?;
        let a = eventually("ResourceConflict", WAIT, || async {
            let a = f.apps.get(&name).await?;
            Ok(condition(&a, READY)
                .is_some_and(|(_, r, _)| r == reasons::RESOURCE_CONFLICT)
                .then_some(a))
        })
        .await?;
        let (_, _, message) = condition(&a, READY).unwrap();
        assert!(message.contains(kind), "{message}");
        assert!(
            message.contains("not controlled by this AppService"),
            "{message}"
        );
        assert_eq!(condition(&a, DEGRADED).unwrap().0, TRUE);
        let status = a.status.clone().unwrap();
        assert_eq!(status.ready_replicas, Some(0));
        if kind == "Service" {
            assert_eq!(
                status.endpoint, None,
                "the endpoint would reach someone else"
            );
            // Another writer sets one anyway: ours has none, and an apply of ours would
            // leave a field it does not set; the controller removes it.
            f.apps
                .patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"endpoint": "http://elsewhere:1"}})),
                )
                .await?;
            eventually("the foreign endpoint removed", WAIT, || async {
                let a = f.apps.get(&name).await?;
                Ok(a.status
                    .unwrap_or_default()
                    .endpoint
                    .is_none()
                    .then_some(()))
            })
            .await?;
        }
        // Neither child was created, not even by a later pass: nothing half-built.
        support::poke(&f, &f.ctl.metrics, std::slice::from_ref(&name), 1).await?;
        let ours = |refs: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference]| {
            refs.iter().any(|r| Some(&r.uid) == a.metadata.uid.as_ref())
        };
        if let Some(d) = f.deployments.get_opt(&name).await? {
            assert!(
                !ours(d.owner_references()),
                "Deployment created despite the conflict"
            );
        }
        if let Some(s) = f.services.get_opt(&name).await? {
            assert!(
                !ours(s.owner_references()),
                "Service created despite the conflict"
            );
        }

        if kind == "Deployment" {
            f.deployments
                .delete(&name, &DeleteParams::default())
                .await?;
        } else {
            f.services.delete(&name, &DeleteParams::default()).await?;
        }
        f.recovers(&name, &format!("foreign {kind} gone")).await?;
    }
    f.quiet(3).await?;
    f.ctl.stop().await?;
    Ok(())
}

/// A name taken right before its AppService is created, while the controller's caches
/// of foreign objects have not heard of it (their watches are held back, so the timing
/// is made, not hoped for): the create of that child fails with AlreadyExists. The
/// children are a set the pass converges, never undone: a new Service is created first
/// and alone, so a taken Service name starts no Deployment, and a taken Deployment name
/// leaves only our Service, which selects no Pod. Each ends in `ResourceConflict`, no
/// pass deletes anything, and each converges once the foreign object is gone.
#[tokio::test]
async fn a_name_taken_before_the_caches_heard_starts_no_pod_and_undoes_nothing()
-> anyhow::Result<()> {
    // A controller that reconciles before its caches are listed asks the API server
    // and never gets to the race: try again with new names until it has.
    const ATTEMPTS: usize = 10;
    let f = Fixture::setup().full().without_controller().await?;
    let (client, hold) = harness::holding(f.client.clone(), &f.ns, |r| {
        let (path, query) = (r.uri().path(), r.uri().query().unwrap_or_default());
        (path.ends_with("/deployments") || path.ends_with("/services"))
            && query.contains("watch=true")
            && query.contains("%21%3D")
    });
    let (client, requests) = harness::recording(client, &f.ns);
    let ctl = support::start_controller(client, &f.ns, |_| {});
    let labels = BTreeMap::from([("app".to_owned(), "legacy".to_owned())]);
    let service_creates = || {
        requests
            .writes_to("services")
            .iter()
            .filter(|w| w.starts_with("POST"))
            .count()
    };
    let mut raced = None;
    for attempt in 0..ATTEMPTS {
        let (by_deployment, by_service) =
            (format!("taken-d{attempt}"), format!("taken-s{attempt}"));
        let d: Deployment = serde_json::from_value(json!({
            "metadata": {"name": by_deployment, "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "legacy", "image": "legacy:1"}]}
                }
            }
        }))?;
        f.deployments.create(&PostParams::default(), &d).await?;
        let s: Service = serde_json::from_value(json!({
            "metadata": {"name": by_service, "labels": labels},
            "spec": {"selector": labels, "ports": [{"port": 80}]}
        }))?;
        f.services.create(&PostParams::default(), &s).await?;
        let creates_before = service_creates();
        for name in [&by_deployment, &by_service] {
            f.apps
                .create(
                    &PostParams::default(),
                    &AppService::new(name, spec("registry.example.com/web:v1", 1)),
                )
                .await?;
        }
        for name in [&by_deployment, &by_service] {
            eventually(&format!("ResourceConflict of {name}"), WAIT, || async {
                let a = f.apps.get(name).await?;
                Ok(condition(&a, READY)
                    .is_some_and(|(_, r, _)| r == reasons::RESOURCE_CONFLICT)
                    .then_some(()))
            })
            .await?;
        }
        // Whatever the timing: no Deployment of ours beside a taken Service name, and
        // nothing deleted.
        assert!(
            !beside_taken(&f, &by_service, "Deployment").await?,
            "{by_service}: our Deployment was created beside the taken Service name"
        );
        let deletes: Vec<_> = requests
            .writes()
            .into_iter()
            .filter(|w| w.starts_with("DELETE"))
            .collect();
        assert!(deletes.is_empty(), "a pass undid a write: {deletes:?}");
        // The race: our Service of `by_deployment` exists only if it was created while
        // the Deployment's name was taken unknown to the caches (a conflict known before
        // creates nothing); a second Service create in this attempt is `by_service`'s,
        // refused.
        let raced_deployment = beside_taken(&f, &by_deployment, "Service").await?;
        let raced_service = service_creates() - creates_before == usize::from(raced_deployment) + 1;
        if raced_deployment && raced_service {
            println!("the race made at attempt {attempt}");
            raced = Some([by_deployment, by_service]);
            break;
        }
    }
    let Some(names) = raced else {
        bail!(
            "in {ATTEMPTS} attempts the controller never created a child of a name its caches had not heard of; held: {:?}",
            hold.held()
        );
    };
    // More passes: none creates a Deployment beside a taken name later, or deletes.
    support::poke(&f, &ctl.metrics, &names, 4).await?;
    assert!(
        !beside_taken(&f, &names[1], "Deployment").await?,
        "{}: our Deployment exists after more passes",
        names[1]
    );
    assert!(
        beside_taken(&f, &names[0], "Service").await?,
        "{}: our Service, desired, went",
        names[0]
    );
    let deletes = requests
        .writes()
        .into_iter()
        .filter(|w| w.starts_with("DELETE"))
        .count();
    assert_eq!(deletes, 0, "a later pass deleted a child");
    hold.release();
    f.deployments
        .delete(&names[0], &DeleteParams::default())
        .await?;
    f.services
        .delete(&names[1], &DeleteParams::default())
        .await?;
    let world = World { fixture: f, ctl };
    for name in &names {
        world.recovers(name, "the foreign object gone").await?;
    }
    world.ctl.stop().await?;
    Ok(())
}

/// Whether `name`'s `other` child ("Service" or "Deployment") exists and is controlled by
/// the AppService `name`.
async fn beside_taken(f: &Fixture, name: &str, other: &str) -> anyhow::Result<bool> {
    let uid = f.apps.get(name).await?.metadata.uid;
    let ours = |refs: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference]| {
        refs.iter().any(|r| Some(&r.uid) == uid.as_ref())
    };
    Ok(match other {
        "Service" => f
            .services
            .get_opt(name)
            .await?
            .is_some_and(|s| ours(s.owner_references())),
        _ => f
            .deployments
            .get_opt(name)
            .await?
            .is_some_and(|d| ours(d.owner_references())),
    })
}

/// Every optional field empty or zero-like: converged, then not a single write.
#[tokio::test]
async fn zero_like_specs_converge_and_stay_quiet() -> anyhow::Result<()> {
    let f = fixture().await?;
    let shapes = [
        (
            "empty-value",
            json!({"image": "nginx:1.27", "env": [{"name": "EMPTY", "value": ""}]}),
        ),
        (
            "empty-lists",
            json!({"image": "nginx:1.27", "env": [], "resources": {}}),
        ),
        ("zero", json!({"image": "nginx:1.27", "replicas": 0})),
        (
            "empty-maps",
            json!({"image": "nginx:1.27", "resources": {"limits": {}, "requests": {}}, "env": [{"name": "A", "value": ""}, {"name": "B"}]}),
        ),
        (
            "quantities",
            json!({"image": "nginx:1.27", "resources": {"requests": {"cpu": "1000m", "memory": "1024Mi"}, "limits": {"cpu": "2", "memory": "1Gi"}}}),
        ),
        (
            "value-from",
            json!({"image": "nginx:1.27", "env": [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}),
        ),
    ];
    for (name, spec) in &shapes {
        let obj: AppService = serde_json::from_value(json!({
            "apiVersion": "platform.example.com/v1beta1",
            "kind": "AppService",
            "metadata": {"name": name},
            "spec": spec,
        }))?;
        f.apps.create(&PostParams::default(), &obj).await?;
    }
    for (name, _) in &shapes {
        f.converged_within(name, WAIT).await?;
    }
    let versions = child_versions(&f).await?;
    f.quiet(3 * shapes.len() as u64).await?;
    assert_eq!(
        child_versions(&f).await?,
        versions,
        "children rewritten at steady state"
    );
    f.ctl.stop().await?;
    Ok(())
}

/// What our field manager wrote of an object (when and how, per managedFields entry)
/// and its generation: unchanged unless the controller wrote it. (Not the
/// resourceVersion: `poke` moves it with labels of its own.)
fn written<K: kube::Resource>(obj: &K) -> String {
    format!("{:?} {:?}", obj.meta().generation, ours(obj))
}

/// What the controller wrote of every AppService child in the namespace.
async fn child_versions(f: &World) -> anyhow::Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for d in f.deployments.list(&ListParams::default()).await? {
        out.insert(format!("deployment/{}", d.name_any()), written(&d));
    }
    for s in f.services.list(&ListParams::default()).await? {
        out.insert(format!("service/{}", s.name_any()), written(&s));
    }
    Ok(out)
}

/// A restarted controller with 100 converged AppServices writes nothing.
#[tokio::test]
async fn restart_with_100_converged_appservices_writes_nothing() -> anyhow::Result<()> {
    let f = fixture().await?;
    let names: Vec<String> = (0..100).map(|i| format!("app-{i:03}")).collect();
    for (i, name) in names.iter().enumerate() {
        let mut s = spec("registry.example.com/web:v1", (i % 2) as i32);
        if i % 3 == 0 {
            s.env.push(EnvVar {
                name: "EMPTY".into(),
                value: Some(String::new()),
                value_from: None,
            });
        }
        f.create(name, s).await?;
    }
    for name in &names {
        f.converged_within(name, WAIT).await?;
    }
    let World {
        fixture:
            Fixture {
                client,
                ns,
                apps,
                rollouts,
                ..
            },
        ctl,
    } = f;
    ctl.stop().await?;
    let versions: BTreeMap<String, String> = apps
        .list(&ListParams::default())
        .await?
        .into_iter()
        .map(|a| (a.name_any(), written(&a)))
        .collect();

    // At start every AppService is reconciled (the initial lists trigger them all),
    // then a few more times by events.
    let again = start_controller(client.clone(), &ns, |_| {});
    eventually("every AppService reconciled", WAIT, || async {
        Ok((again.metrics.reconcile_count() >= 100).then_some(()))
    })
    .await?;
    let f = World {
        fixture: Fixture {
            deployments: Api::namespaced(client.clone(), &ns),
            services: Api::namespaced(client.clone(), &ns),
            apps: apps.clone(),
            client: client.clone(),
            rollouts,
            ns,
        },
        ctl: again,
    };
    support::poke(&f, &f.ctl.metrics, &names, 30).await?;
    let again = f.ctl;
    assert_eq!(again.metrics.write_count(), 0, "writes after a restart");
    let after: BTreeMap<String, String> = apps
        .list(&ListParams::default())
        .await?
        .into_iter()
        .map(|a| (a.name_any(), written(&a)))
        .collect();
    assert_eq!(after, versions);
    again.stop().await?;
    Ok(())
}

/// Random sequences of perturbations on a few AppServices at once (seeded; the seed is
/// printed and `PERTURB_SEED` replays it): each AppService converges, then no writes.
#[tokio::test]
async fn random_perturbation_sequences_converge() -> anyhow::Result<()> {
    let seed: u64 = std::env::var("PERTURB_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("PERTURB_SEED={seed}");
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(seed);
    let f = fixture().await?;
    let names = ["rand-a", "rand-b", "rand-c"];
    for (i, name) in names.iter().enumerate() {
        f.create(name, spec("registry.example.com/web:v1", 1 + i as i32 % 2))
            .await?;
    }
    for name in names {
        f.converged_within(name, WAIT).await?;
    }
    for round in 0..4 {
        let mut applied = Vec::new();
        for name in names {
            // One to three perturbations in a row, without waiting in between.
            let n = rand::Rng::random_range(&mut rng, 1..=3);
            for _ in 0..n {
                let p = Perturbation::ALL
                    [rand::Rng::random_range(&mut rng, 0..Perturbation::ALL.len())];
                // Tolerate an edit of an object another perturbation just deleted.
                if let Err(e) = p.apply(&f, name).await {
                    println!("round {round}: {p:?} on {name} not applied: {e}");
                } else {
                    applied.push((name, p));
                }
            }
        }
        println!("round {round}: {applied:?}");
        for name in names {
            f.recovers(name, &format!("round {round}: {name}"))
                .await
                .with_context(|| format!("seed {seed}, round {round}, after {applied:?}"))?;
        }
    }
    f.quiet(3 * names.len() as u64).await?;
    // The other party of `ReplaceFinalizers` lets go, so the namespace can.
    let World { fixture: f, ctl } = f;
    ctl.stop().await?;
    for name in names {
        f.apps
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await?;
    }
    Ok(())
}

/// An API server restart cuts every watch: the controller reconnects, writes nothing for
/// objects that did not change, and still heals what happens afterwards.
#[tokio::test]
async fn api_server_restart_loses_nothing_and_writes_nothing() -> anyhow::Result<()> {
    init();
    let cp = harness::ControlPlane::start(harness::Options::full()).await?;
    let _logs = cp.log_guard();
    let f = World::start(Fixture::setup().on(&cp)).await?;
    for name in ["r-a", "r-b"] {
        f.create(name, spec("registry.example.com/web:v1", 1))
            .await?;
    }
    for name in ["r-a", "r-b"] {
        f.converged_within(name, WAIT).await?;
    }
    let writes = f.ctl.metrics.write_count();
    let versions = child_versions(&f).await?;
    cp.restart_apiserver().await?;
    // Reconciles resume (on events: the watches are back) without a single write.
    f.quiet(6).await?;
    assert_eq!(f.ctl.metrics.write_count(), writes);
    assert_eq!(child_versions(&f).await?, versions);
    // And the watches are back: a deletion is healed as fast as before.
    f.heals("r-a", Perturbation::DeleteDeployment).await?;
    f.heals("r-b", Perturbation::ServicePort).await?;
    f.ctl.stop().await?;
    Ok(())
}

/// A child without the desired-hash annotation (removed by someone, or made by an
/// earlier controller version) gets it back with one apply; its Pods do not roll and
/// Ready does not flap, although the annotation bumps the Deployment's generation.
#[tokio::test]
async fn missing_hash_annotation_is_put_back_without_a_ready_flap() -> anyhow::Result<()> {
    let f = fixture().await?;
    f.create("hash", spec("registry.example.com/web:v1", 1))
        .await?;
    f.converged_within("hash", WAIT).await?;
    let ready_since = |a: &AppService| {
        a.status
            .as_ref()
            .and_then(|s| common::conditions::find(&s.conditions, READY))
            .map(|c| c.last_transition_time.clone())
    };
    // Transition times have a resolution of one second.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let before = ready_since(&f.apps.get("hash").await?);
    let template = f.deployments.get("hash").await?.spec.template;
    let status_writes = || {
        f.ctl
            .metrics
            .writes_to(controller::metrics::Written::AppServiceStatus)
    };
    let status_writes_before = status_writes();
    for api in ["deployments", "services"] {
        let ops = json!([{"op": "remove", "path": "/metadata/annotations/platform.example.com~1desired-hash"}]);
        if api == "deployments" {
            f.json_patch(&f.deployments, "hash", ops).await?;
        } else {
            f.json_patch(&f.services, "hash", ops).await?;
        }
    }
    eventually("the hash annotations back", HEAL, || async {
        let d = f.deployments.get("hash").await?;
        let s = f.services.get("hash").await?;
        let has =
            |a: &BTreeMap<String, String>| a.contains_key(common::names::ANNOTATION_DESIRED_HASH);
        Ok((has(d.annotations()) && has(s.annotations())).then_some(()))
    })
    .await?;
    f.converged_within("hash", READY_BOUND).await?;
    assert_eq!(
        ready_since(&f.apps.get("hash").await?),
        before,
        "Ready flapped"
    );
    assert_eq!(status_writes(), status_writes_before, "status rewritten");
    assert_eq!(
        f.deployments.get("hash").await?.spec.template,
        template,
        "Pods rolled"
    );
    f.quiet(3).await?;
    f.ctl.stop().await?;
    Ok(())
}

/// The proof that healing is the work of events: the controller runs with the shipped
/// resync (10 minutes) and rollout requeue, and a deleted or edited child of a converged
/// AppService (whose next timer is the resync) is back within seconds.
#[tokio::test]
async fn perturbations_heal_by_events_with_the_shipped_resync() -> anyhow::Result<()> {
    let fixture = Fixture::setup().full().without_controller().await?;
    let config = controller::Config::for_namespace(&fixture.ns);
    assert_eq!(config.resync_interval, Duration::from_secs(600));
    assert_eq!(config.rollout_requeue, Duration::from_secs(10));
    let ctl = support::start_controller_counted(
        fixture.client.clone(),
        config,
        std::sync::Arc::new(controller::external::NoExternal),
        std::sync::Arc::new(controller::metrics::Metrics::default()),
    );
    let f = World { fixture, ctl };
    f.create("events", spec("registry.example.com/web:v1", 2))
        .await?;
    f.converged_within("events", WAIT).await?;
    for p in [
        Perturbation::DeleteDeployment,
        Perturbation::Image,
        Perturbation::Replicas,
        Perturbation::DeleteService,
        Perturbation::ServicePort,
    ] {
        let reconciles = f.ctl.metrics.reconcile_count();
        f.heals("events", p).await?;
        // Healed by a reconcile the perturbation's event caused: no timer was due.
        assert!(f.ctl.metrics.reconcile_count() > reconciles);
    }
    f.quiet(3).await?;
    f.ctl.stop().await?;
    Ok(())
}

// ---- The `<name>-database` Secret ------------------------------------------------------

/// A [`World`] whose controller runs the real database step against a real PostgreSQL
/// server, counting its Secret writes with the rest.
struct DbWorld {
    world: World,
    pg: harness::Postgres,
    secrets: Api<Secret>,
}

impl std::ops::Deref for DbWorld {
    type Target = World;
    fn deref(&self) -> &World {
        &self.world
    }
}

/// Something the world does to an AppService's credentials Secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SecretPerturbation {
    Delete,
    EditPassword,
    EditUrl,
    EditHost,
    RemoveKey,
    AddKey,
    RemoveOwnerReference,
    OwnerThroughV1alpha1,
    RemoveManagedByLabel,
    ReplaceData,
}

impl DbWorld {
    async fn new() -> anyhow::Result<DbWorld> {
        let fixture = Fixture::setup().full().without_controller().await?;
        let pg = harness::Postgres::start().await?;
        support::database_class(&fixture, &pg, "Delete", None).await?;
        let metrics = std::sync::Arc::new(controller::metrics::Metrics::default());
        let databases = support::databases(&fixture, metrics.clone());
        let ctl = support::start_controller_counted(
            fixture.client.clone(),
            controller::Config::for_namespace(&fixture.ns),
            std::sync::Arc::new(databases),
            metrics,
        );
        let secrets = fixture.api();
        Ok(DbWorld {
            world: World { fixture, ctl },
            pg,
            secrets,
        })
    }

    async fn create_with_database(&self, name: &str) -> anyhow::Result<AppService> {
        let mut s = spec("registry.example.com/web:v1", 1);
        s.database = Some(common::DatabaseSpec {
            class: format!("{}-pg", self.ns.name()),
        });
        self.create(name, s).await
    }

    /// Everything about `name`'s Secret that is not as the controller keeps it: ours
    /// (labels, one controller owner reference through the storage version), settled,
    /// every key there and consistent, the password the role's (a real login), and
    /// DatabaseReady=True for the current generation.
    async fn secret_problems(&self, name: &str) -> anyhow::Result<Vec<String>> {
        let mut p = Vec::new();
        let app = self.apps.get(name).await?;
        let uid = app.uid().context("uid")?;
        let db = controller::database::sql::db_name(&uid);
        match condition(&app, common::conditions::DATABASE_READY) {
            Some((s, _, _)) if s == TRUE => {}
            other => p.push(format!("DatabaseReady is {other:?}")),
        }
        let Some(secret) = self.secrets.get_opt(&format!("{name}-database")).await? else {
            p.push("no Secret".into());
            return Ok(p);
        };
        for (k, v) in child_labels(name) {
            if secret.labels().get(&k) != Some(&v) {
                p.push(format!("label {k} is {:?}", secret.labels().get(&k)));
            }
        }
        let controllers: Vec<_> = secret
            .owner_references()
            .iter()
            .filter(|r| r.controller == Some(true))
            .collect();
        let want = k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "platform.example.com/v1beta1".into(),
            kind: "AppService".into(),
            name: name.into(),
            uid: uid.clone(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        };
        if controllers != [&want] {
            p.push(format!("owner references {:?}", secret.owner_references()));
        }
        if secret
            .annotations()
            .contains_key(controller::database::PASSWORD_PENDING_ANNOTATION)
        {
            p.push("password pending".into());
        }
        let data: BTreeMap<String, String> = secret
            .data
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
            .collect();
        use controller::database::secret as keys;
        let expected = [
            keys::CA_CRT,
            keys::DATABASE_URL,
            keys::PGDATABASE,
            keys::PGHOST,
            keys::PGPASSWORD,
            keys::PGPORT,
            keys::PGSSLMODE,
            keys::PGUSER,
        ];
        let have: Vec<&str> = data.keys().map(String::as_str).collect();
        if !expected.iter().all(|k| have.contains(k)) || have.len() < expected.len() {
            p.push(format!("keys {have:?}"));
        }
        if !have
            .iter()
            .all(|k| expected.contains(k) || k.starts_with("PGSSL"))
        {
            p.push(format!("foreign keys in {have:?}"));
        }
        let get = |k: &str| data.get(k).cloned().unwrap_or_default();
        if get(keys::PGHOST) != "localhost" || get(keys::PGPORT) != self.pg.port().to_string() {
            p.push(format!(
                "host {} port {}",
                get(keys::PGHOST),
                get(keys::PGPORT)
            ));
        }
        if get(keys::PGUSER) != db || get(keys::PGDATABASE) != db {
            p.push(format!(
                "user {} database {}",
                get(keys::PGUSER),
                get(keys::PGDATABASE)
            ));
        }
        let password = get(keys::PGPASSWORD);
        let url = get(keys::DATABASE_URL);
        let expected_url = format!(
            "postgres://{db}:{password}@localhost:{}/{db}?",
            self.pg.port()
        );
        if !url.starts_with(&expected_url) {
            p.push(format!("DATABASE_URL does not start with {expected_url:?}"));
        }
        if self.pg.connect(&db, &password, &db).await.is_err() {
            p.push("the Secret's password does not log in".into());
        }
        Ok(p)
    }

    /// Waits until `name`'s Secret has no problem; fails after `bound` with what is off.
    async fn secret_healed_within(&self, name: &str, bound: Duration) -> anyhow::Result<Duration> {
        let started = Instant::now();
        loop {
            let problems = self.secret_problems(name).await?;
            if problems.is_empty() {
                return Ok(started.elapsed());
            }
            if started.elapsed() > bound {
                bail!("{name}'s Secret not healed after {bound:?}: {problems:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn password(&self, name: &str) -> anyhow::Result<String> {
        let s = self.secrets.get(&format!("{name}-database")).await?;
        let pw = s
            .data
            .unwrap_or_default()
            .remove("PGPASSWORD")
            .context("PGPASSWORD")?;
        Ok(String::from_utf8(pw.0)?)
    }

    async fn apply(&self, name: &str, p: SecretPerturbation) -> anyhow::Result<()> {
        let secret = format!("{name}-database");
        // A Secret's data as the API has it: base64, as ByteString serializes.
        let b64 = |v: &str| json!(k8s_openapi::ByteString(v.as_bytes().to_vec()));
        let ops = match p {
            SecretPerturbation::Delete => {
                self.secrets
                    .delete(&secret, &DeleteParams::default())
                    .await?;
                return Ok(());
            }
            SecretPerturbation::EditPassword => {
                json!([{"op": "replace", "path": "/data/PGPASSWORD", "value": b64("guessed")}])
            }
            SecretPerturbation::EditUrl => json!([{"op": "replace", "path": "/data/DATABASE_URL",
                "value": b64("postgres://someone:else@elsewhere:5432/other")}]),
            SecretPerturbation::EditHost => {
                json!([{"op": "replace", "path": "/data/PGHOST", "value": b64("elsewhere")}])
            }
            SecretPerturbation::RemoveKey => json!([{"op": "remove", "path": "/data/PGPORT"}]),
            SecretPerturbation::AddKey => {
                json!([{"op": "add", "path": "/data/INJECTED", "value": b64("1")}])
            }
            SecretPerturbation::RemoveOwnerReference => {
                json!([{"op": "remove", "path": "/metadata/ownerReferences"}])
            }
            SecretPerturbation::OwnerThroughV1alpha1 => json!([{"op": "replace",
                "path": "/metadata/ownerReferences/0/apiVersion",
                "value": "platform.example.com/v1alpha1"}]),
            SecretPerturbation::RemoveManagedByLabel => json!([{"op": "remove",
                "path": "/metadata/labels/app.kubernetes.io~1managed-by"}]),
            SecretPerturbation::ReplaceData => {
                json!([{"op": "replace", "path": "/data", "value": {"token": b64("x")}}])
            }
        };
        self.json_patch(&self.secrets, &secret, ops).await
    }
}

/// The credentials Secret is healed like the other children, within seconds of each
/// perturbation (the resync is 10 minutes): deleted or all its data replaced (a new
/// password, set on the role), any key edited, removed or added (put back with the
/// role's password: running Pods keep working), its owner reference removed or pointed at another version, its label
/// removed. Then no writes at all.
#[tokio::test]
async fn the_database_secret_heals_by_events() -> anyhow::Result<()> {
    let f = DbWorld::new().await?;
    f.create_with_database("creds").await?;
    f.converged_within("creds", WAIT).await?;
    f.secret_healed_within("creds", WAIT).await?;
    f.quiet(3).await?;
    for p in [
        SecretPerturbation::EditPassword,
        SecretPerturbation::EditUrl,
        SecretPerturbation::EditHost,
        SecretPerturbation::RemoveKey,
        SecretPerturbation::AddKey,
        SecretPerturbation::ReplaceData,
        SecretPerturbation::RemoveOwnerReference,
        SecretPerturbation::OwnerThroughV1alpha1,
        SecretPerturbation::RemoveManagedByLabel,
        SecretPerturbation::Delete,
    ] {
        let before = f.password("creds").await?;
        f.apply("creds", p).await?;
        let took = f
            .secret_healed_within("creds", HEAL)
            .await
            .with_context(|| format!("after {p:?}"))?;
        println!("healed {p:?} on the Secret in {} ms", took.as_millis());
        if matches!(
            p,
            SecretPerturbation::Delete | SecretPerturbation::ReplaceData
        ) {
            // Both copies of the password gone: the role now has a new one.
            assert_ne!(f.password("creds").await?, before);
        } else {
            // The role's password, put back: nothing that uses it breaks.
            assert_eq!(f.password("creds").await?, before, "after {p:?}");
        }
        f.converged_within("creds", READY_BOUND).await?;
    }
    f.quiet(6).await?;
    f.world.ctl.stop().await?;
    Ok(())
}

/// A foreign Secret holding the name: a clear conflict in status, the Secret left as it
/// is, no child created; its deletion is noticed at once and the database goes ahead.
/// What the Pods of `d` get of the database that the controller owns: the revision on
/// the template, the CA volume, and its mount in our container (as JSON, `null` when
/// absent).
fn database_parts(d: &Deployment) -> anyhow::Result<(Value, Value, Value)> {
    let v = serde_json::to_value(d)?;
    let template = &v["spec"]["template"];
    let named = |list: &Value| {
        list.as_array()
            .and_then(|l| {
                l.iter()
                    .find(|e| e["name"] == common::names::DATABASE_CA_VOLUME)
                    .cloned()
            })
            .unwrap_or(Value::Null)
    };
    let container = template["spec"]["containers"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == CONTAINER_NAME).cloned())
        .unwrap_or(Value::Null);
    Ok((
        template["metadata"]["annotations"][common::names::ANNOTATION_DATABASE_REVISION].clone(),
        named(&template["spec"]["volumes"]),
        named(&container["volumeMounts"]),
    ))
}

/// The database CA's volume and mount and the revision on the Pod template are healed
/// like the rest of the Deployment, within seconds (resync 10 minutes), while volumes,
/// mounts and annotations others add stay; then no writes at all.
#[tokio::test]
async fn the_database_mount_and_revision_heal_by_events() -> anyhow::Result<()> {
    let f = DbWorld::new().await?;
    f.create_with_database("mounted").await?;
    f.converged_within("mounted", WAIT).await?;
    f.secret_healed_within("mounted", WAIT).await?;
    f.quiet(3).await?;
    let want = database_parts(&f.deployments.get("mounted").await?)?;
    assert!(want.0.is_string(), "a revision on the template: {want:?}");
    assert_eq!(
        want.1["secret"]["items"],
        json!([{"key": "ca.crt", "path": "ca.crt"}])
    );
    assert_eq!(want.2["readOnly"], true);
    let revision = common::names::ANNOTATION_DATABASE_REVISION.replace('/', "~1");
    let perturbations = [
        // (A mount without its volume is refused by the API server: both go.)
        json!([
            {"op": "remove", "path": "/spec/template/spec/volumes"},
            {"op": "remove", "path": "/spec/template/spec/containers/0/volumeMounts"},
        ]),
        json!([{"op": "remove", "path": "/spec/template/spec/containers/0/volumeMounts"}]),
        json!([{"op": "replace", "path": format!("/spec/template/metadata/annotations/{revision}"), "value": "forged"}]),
        json!([{"op": "replace", "path": "/spec/template/spec/volumes/0/secret/secretName", "value": "someone-elses"}]),
        // Others' entries next to ours: kept, ours healed around them.
        json!([
            {"op": "add", "path": "/spec/template/spec/volumes/0", "value": {"name": "cache", "emptyDir": {}}},
            {"op": "add", "path": "/spec/template/metadata/annotations/example.com~1team", "value": "payments"},
            {"op": "remove", "path": "/spec/template/spec/containers/0/volumeMounts"},
        ]),
    ];
    for ops in perturbations {
        f.json_patch(&f.deployments, "mounted", ops.clone()).await?;
        let started = Instant::now();
        eventually(
            &format!("the database parts back after {ops}"),
            HEAL,
            || async {
                let d = f.deployments.get("mounted").await?;
                Ok::<_, harness::poll::Failure>((database_parts(&d)? == want).then_some(()))
            },
        )
        .await?;
        println!(
            "healed {ops} on the Deployment in {} ms",
            started.elapsed().as_millis()
        );
        f.converged_within("mounted", READY_BOUND).await?;
    }
    let d = serde_json::to_value(f.deployments.get("mounted").await?)?;
    let template = &d["spec"]["template"];
    assert_eq!(
        template["metadata"]["annotations"]["example.com/team"],
        "payments"
    );
    assert!(
        template["spec"]["volumes"]
            .as_array()
            .is_some_and(|v| v.iter().any(|v| v["name"] == "cache")),
        "{template}"
    );
    f.quiet(6).await?;
    f.world.ctl.stop().await?;
    Ok(())
}

#[tokio::test]
async fn a_foreign_secret_holding_the_name_blocks_until_it_goes() -> anyhow::Result<()> {
    let f = DbWorld::new().await?;
    let foreign: Secret = serde_json::from_value(json!({
        "metadata": {"name": "taken-database", "labels": {"app": "legacy"}},
        "stringData": {"password": "theirs"},
    }))?;
    let foreign = f.secrets.create(&PostParams::default(), &foreign).await?;
    f.create_with_database("taken").await?;
    let a = eventually("DatabaseSecretConflict", WAIT, || async {
        let a = f.apps.get("taken").await?;
        Ok(condition(&a, READY)
            .is_some_and(|(_, r, _)| r == controller::database::reasons::SECRET_CONFLICT)
            .then_some(a))
    })
    .await?;
    let (_, _, message) = condition(&a, READY).unwrap();
    assert!(message.contains("taken-database"), "{message}");
    assert!(
        message.contains("not controlled by this AppService"),
        "{message}"
    );
    assert_eq!(condition(&a, DEGRADED).unwrap().0, TRUE);
    // Nothing overwritten, nothing created while blocked.
    f.quiet(3).await?;
    let still = f.secrets.get("taken-database").await?;
    assert_eq!(still.resource_version(), foreign.resource_version());
    assert!(f.deployments.get_opt("taken").await?.is_none());

    f.secrets
        .delete("taken-database", &DeleteParams::default())
        .await?;
    let took = f.secret_healed_within("taken", HEAL).await?;
    println!("foreign Secret gone: ours in {} ms", took.as_millis());
    f.converged_within("taken", READY_BOUND).await?;
    f.quiet(3).await?;
    f.world.ctl.stop().await?;
    Ok(())
}
