//! Helpers shared by the controller's integration tests: the [`Fixture`] every test starts
//! from (a namespace, a client, and an in-process controller scoped to that namespace),
//! and AppService objects. Polling is `harness::eventually`.

#![allow(dead_code)]

pub mod binary;
pub mod hostile;
pub mod world;

use std::sync::{Arc, Once};
use std::time::Duration;

use anyhow::Context as _;
use common::AppService;
use controller::metrics::Metrics;
use controller::{Config, Hooks};
use harness::{ControlPlane, PodSecurityLevel, TestNamespace};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Patch, PatchParams, PostParams};
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
    /// Whether the control plane runs the Deployment controller (and Pods for it), so
    /// that Deployments roll out: [`settle`] waits for them then.
    pub rollouts: bool,
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
    SharedRealNode,
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

    /// On the shared control plane with a real node: the Pods' containers run.
    pub fn real_node(mut self) -> Self {
        self.control_plane = Plane::SharedRealNode;
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
        let (client, requests) = harness::recording(fixture.client.clone(), &fixture.ns);
        let mut ctl = start_controller_with(client, &fixture.ns, self.tweak, self.external);
        ctl.requests = requests;
        Ok((fixture, ctl))
    }
}

impl Fixture {
    async fn on(control_plane: Plane<'_>, level: PodSecurityLevel) -> anyhow::Result<Fixture> {
        init();
        let cp = match control_plane {
            Plane::Shared => harness::shared().await?,
            Plane::SharedFull => harness::shared_full().await?,
            Plane::SharedRealNode => harness::shared_real_node().await?,
            Plane::Given(cp) => cp,
        };
        let ns = cp.namespace_with("test", level).await?;
        let client = cp.client();
        Ok(Fixture {
            apps: Api::namespaced(client.clone(), &ns),
            deployments: Api::namespaced(client.clone(), &ns),
            services: Api::namespaced(client.clone(), &ns),
            rollouts: cp.options().full,
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
    /// The writes the controller sent, where its fixture recorded them
    /// ([`Setup::start`]); empty otherwise.
    pub requests: harness::Requests,
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
    // The shipped defaults (resync 10 min, rollout requeue 10 s): a test that needs the
    // controller to look again makes the event that should wake it (see [`poke`]).
    let mut config = Config::for_namespace(namespace);
    tweak(&mut config);
    start_controller_counted(client, config, external, Arc::new(Metrics::default()))
}

/// A controller with `config`, `external` and `metrics` (shared with the external step,
/// so one set of counters sees every write).
pub fn start_controller_counted(
    client: Client,
    config: Config,
    external: Arc<dyn controller::external::External>,
    metrics: Arc<Metrics>,
) -> Running {
    let hooks = Hooks {
        metrics,
        external,
        ..Hooks::default()
    };
    start_controller_hooks(client, config, hooks)
}

/// A controller with `config` and `hooks` as they are.
/// A controller verifying images with `images`, at every other shipped default, watching
/// `f`'s namespace.
pub fn verifying(
    f: &Fixture,
    images: controller::images::ImageConfig,
) -> anyhow::Result<(Running, Arc<Metrics>)> {
    let config = Config::for_namespace(&f.ns);
    let metrics = Arc::new(Metrics::default());
    let verifier = controller::images::Verifier::new(
        f.client.clone(),
        images,
        &config.lease_namespace,
        &metrics,
    )?
    .scoped_to(config.watch_namespace.as_deref());
    let hooks = Hooks {
        metrics: metrics.clone(),
        images: Some(Arc::new(verifier)),
        ..Hooks::default()
    };
    Ok((
        start_controller_hooks(f.client.clone(), config, hooks),
        metrics,
    ))
}

pub fn start_controller_hooks(client: Client, config: Config, hooks: Hooks) -> Running {
    let metrics = hooks.metrics.clone();
    let (tx, rx) = oneshot::channel::<()>();
    let handle = tokio::spawn(controller::run_with(config, client, hooks, async move {
        let _ = rx.await;
    }));
    Running {
        shutdown: Some(tx),
        handle,
        metrics,
        requests: harness::Requests::default(),
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

/// An AppService named `name` running `image` with `replicas`: the common builder's
/// (`common::testing`), the shape most tests here create.
pub fn app(name: &str, image: &str, replicas: i32) -> AppService {
    common::testing::app(name, image).replicas(replicas).build()
}

/// The image our container of `d` runs.
pub fn image_of(d: &Deployment) -> Option<String> {
    d.spec
        .template
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == controller::desired::CONTAINER_NAME)?
        .image
        .clone()
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

/// Makes the controller reconcile at least `n` more times without changing anything it
/// owns: an unrelated label on one of `names`' AppService, Deployment and Service in
/// turn, each awaited by the reconcile count. These are events the controller must see,
/// whatever its resync interval; a test counts writes over them.
pub async fn poke(f: &Fixture, metrics: &Metrics, names: &[String], n: u64) -> anyhow::Result<()> {
    anyhow::ensure!(!names.is_empty(), "nothing to poke");
    let params = poke_params();
    let nonce = poke_nonce()?;
    for i in 0..n {
        let name = &names[usize::try_from(i)? % names.len()];
        let patch = poke_patch(nonce, i);
        let before = metrics.reconcile_count();
        let child = match i % 3 {
            0 => None,
            1 => Some(f.deployments.patch(name, &params, &patch).await.map(drop)),
            _ => Some(f.services.patch(name, &params, &patch).await.map(drop)),
        };
        match child {
            Some(Ok(())) => {}
            // No such child (an AppService blocked before its children): poke the
            // AppService instead.
            None => drop(f.apps.patch(name, &params, &patch).await?),
            Some(Err(kube::Error::Api(s))) if s.code == 404 => {
                drop(f.apps.patch(name, &params, &patch).await?)
            }
            Some(Err(e)) => return Err(e.into()),
        }
        reconciled_since(
            metrics,
            before,
            &format!("a reconcile after poke {i} of {name}"),
        )
        .await?;
    }
    Ok(())
}

/// The field manager of pokes.
pub fn poke_params() -> PatchParams {
    PatchParams {
        field_manager: Some("poke".to_owned()),
        ..PatchParams::default()
    }
}

/// A value no earlier poke used: the same value again would be no change, no event.
pub fn poke_nonce() -> anyhow::Result<u128> {
    Ok(std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos())
}

/// The unrelated label of poke `i`.
pub fn poke_patch(nonce: u128, i: u64) -> Patch<serde_json::Value> {
    Patch::Merge(serde_json::json!({
        "metadata": {"labels": {"example.com/poked": format!("{nonce}-{i}")}}
    }))
}

/// Waits for a reconcile after the count `before`; on a timeout, says what the work
/// queue was doing, to tell a stuck reconcile from a lost event.
pub async fn reconciled_since(metrics: &Metrics, before: u64, what: &str) -> anyhow::Result<()> {
    let waited = harness::eventually(what, Duration::from_secs(60), || async {
        (metrics.reconcile_count() > before).then_some(())
    })
    .await;
    if let Err(e) = waited {
        let queue: Vec<String> = metrics
            .encode()?
            .lines()
            .filter(|l| l.starts_with("workqueue_") || l.starts_with("controller_runtime_"))
            .map(str::to_owned)
            .collect();
        anyhow::bail!("{e}\n{}", queue.join("\n"));
    }
    Ok(())
}

/// The Secrets a DatabaseClass for `pg` names, in the test's namespace: `pg-admin`
/// (opted in as a class's login; the admin password `admin_password`, the real one when
/// `None`) and `pg-ca` (the server's CA).
pub async fn database_secrets(
    fixture: &Fixture,
    pg: &harness::Postgres,
    admin_password: Option<&str>,
) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Secret;
    use serde_json::json;
    let secrets: Api<Secret> = fixture.api();
    let secret = |name: &str, data: serde_json::Value| -> anyhow::Result<Secret> {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": name},
            "stringData": data,
        }))?)
    };
    // The admin Secret opts in to being a class's login, as a cluster admin does.
    let admin_secret = |data: serde_json::Value| -> anyhow::Result<Secret> {
        let mut s = secret("pg-admin", data)?;
        s.metadata.labels = Some(
            [(
                common::database_class::ADMIN_SECRET_LABEL.to_owned(),
                "true".to_owned(),
            )]
            .into(),
        );
        Ok(s)
    };
    secrets
        .create(
            &PostParams::default(),
            &admin_secret(json!({
                "username": harness::postgres::SUPERUSER,
                "password": admin_password.unwrap_or(pg.password()),
            }))?,
        )
        .await?;
    secrets
        .create(
            &PostParams::default(),
            &secret("pg-ca", json!({"ca.crt": pg.ca_pem()}))?,
        )
        .await?;
    Ok(())
}

/// A DatabaseClass named after the test's namespace for the server `pg` (verify-full,
/// its CA and admin Secrets in the test's namespace), with `policy`, and the admin
/// password `admin_password` (the real one when `None`). Returns the class's name.
pub async fn database_class(
    fixture: &Fixture,
    pg: &harness::Postgres,
    policy: &str,
    admin_password: Option<&str>,
) -> anyhow::Result<String> {
    use serde_json::json;
    database_secrets(fixture, pg, admin_password).await?;
    let class = format!("{}-pg", fixture.ns.name());
    let classes: Api<common::DatabaseClass> = Api::all(fixture.client.clone());
    let object: common::DatabaseClass = serde_json::from_value(json!({
        "apiVersion": "platform.example.com/v1alpha1",
        "kind": "DatabaseClass",
        "metadata": {"name": class},
        "spec": {
            // A name, not the address: verify-full checks it against the certificate.
            "host": "localhost",
            "port": pg.port(),
            "tls": {"mode": "verify-full", "ca": {"secretRef": {"name": "pg-ca"}}},
            "adminCredentials": {"secretName": "pg-admin"},
            "deletionPolicy": policy,
        }
    }))?;
    classes.create(&PostParams::default(), &object).await?;
    Ok(class)
}

/// The real database step for the fixture's namespace (admin Secrets read there),
/// counting into `metrics`.
pub fn databases(fixture: &Fixture, metrics: Arc<Metrics>) -> controller::database::Databases {
    let config = controller::database::DatabaseConfig {
        admin_namespace: Some(fixture.ns.name().to_owned()),
        pool_size: 4,
        connect_timeout: Duration::from_secs(3),
        statement_timeout: Duration::from_secs(10),
        orphan_scan_interval: Duration::from_secs(3600),
    };
    controller::database::Databases::new(
        fixture.client.clone(),
        &config,
        fixture.ns.name(),
        metrics,
    )
}

/// Creates a ResourceQuota `name` of `pods` Pods in the fixture's namespace and waits
/// until the quota controller has counted usage: until then quota admission refuses
/// every Pod, whatever the quota allows. Returns the quotas' API.
#[allow(dead_code)] // not every test binary uses every helper
pub async fn pod_quota(
    f: &Fixture,
    name: &str,
    pods: u32,
) -> anyhow::Result<Api<k8s_openapi::api::core::v1::ResourceQuota>> {
    use k8s_openapi::api::core::v1::ResourceQuota;
    let quotas = f.api::<ResourceQuota>();
    let quota: ResourceQuota = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"hard": {"pods": pods.to_string()}}
    }))?;
    quotas.create(&PostParams::default(), &quota).await?;
    harness::eventually(
        "the quota controller to count usage",
        Duration::from_secs(90),
        || async {
            let q = quotas.get(name).await?;
            let counted = q
                .status
                .and_then(|s| s.hard)
                .is_some_and(|h| h.contains_key("pods"));
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(counted.then_some(()))
        },
    )
    .await?;
    Ok(quotas)
}

/// Reconciles that may still write before the world counts as unsettled.
pub const SETTLE_ATTEMPTS: usize = 5;

/// The controller's writes so far, by resource.
pub fn writes_by_resource(metrics: &Metrics) -> Vec<(&'static str, u64)> {
    controller::metrics::Written::ALL
        .iter()
        .map(|&r| (r.as_str(), metrics.writes_to(r)))
        .collect()
}

/// Waits until the world has settled, and returns the names of the namespace's
/// AppServices. Settled means, first, that the control plane finished what a
/// perturbation started: every Deployment of these AppServices has rolled out (or is
/// stuck, by its own conditions), so status has nothing left to follow; then that one
/// reconcile of each AppService wrote nothing (status follows the last rollout step with
/// one write). A controller that writes on every reconcile never settles and fails.
pub async fn settle(f: &Fixture, metrics: &Metrics) -> anyhow::Result<Vec<String>> {
    let apps = f.apps.list(&kube::api::ListParams::default()).await?.items;
    if f.rollouts {
        for app in &apps {
            rollouts_done(f, app).await?;
        }
    }
    let names: Vec<String> = apps.iter().map(kube::ResourceExt::name_any).collect();
    let rounds = u64::try_from(names.len())?;
    let mut history = Vec::new();
    for _ in 0..SETTLE_ATTEMPTS {
        let before = writes_by_resource(metrics);
        poke(f, metrics, &names, rounds).await?;
        let after = writes_by_resource(metrics);
        if after == before {
            return Ok(names);
        }
        history.push(after);
    }
    anyhow::bail!("still writing after {SETTLE_ATTEMPTS} reconciles of each: {history:?}")
}

/// How long the Deployment controller may take to finish a rollout in a test.
const ROLLOUT_BOUND: Duration = Duration::from_secs(60);

/// Waits until the Deployments `app` controls (its own and its canary's)
/// are done rolling out: the Deployment controller saw the current generation, every
/// replica is updated, ready and available and no old one is left, and each of its
/// ReplicaSets has the Pods it asks for; or the Deployment says it is stuck
/// (`ReplicaFailure`, `ProgressDeadlineExceeded`). Until then the control plane still
/// moves, and status rightly follows it.
async fn rollouts_done(f: &Fixture, app: &AppService) -> anyhow::Result<()> {
    use controller::desired::is_controlled_by;
    if app.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let name = kube::ResourceExt::name_any(app);
    let uid = app
        .metadata
        .uid
        .clone()
        .context("AppService without a uid")?;
    for deployment in [name.clone(), common::names::canary_deployment_name(&name)] {
        let what = format!("the Deployment {deployment} to finish rolling out");
        harness::eventually(&what, ROLLOUT_BOUND, || async {
            let Some(d) = f.deployments.get_opt(&deployment).await? else {
                return Ok(Some(()));
            };
            let ours = is_controlled_by(d.metadata.owner_references.as_deref(), &uid);
            if !ours || d.metadata.deletion_timestamp.is_some() {
                return Ok(Some(()));
            }
            // The reasons are kept for the message if the wait times out.
            match rollout(&d) {
                Rollout::Stuck => Ok(Some(())),
                Rollout::Done => {
                    let unsettled = replica_sets_unsettled(f, &d).await?;
                    if unsettled.is_empty() {
                        Ok(Some(()))
                    } else {
                        Err(format!("{deployment}'s ReplicaSets: {unsettled:?}").into())
                    }
                }
                Rollout::Going => Err::<Option<()>, harness::poll::Failure>(
                    format!("{deployment}: {:?}", d.status).into(),
                ),
            }
        })
        .await?;
    }
    let what = format!("the ReplicaSets and Pods of {name}'s earlier Deployments to go");
    harness::eventually(&what, ROLLOUT_BOUND, || async {
        let left = leftovers(f, &name).await?;
        if left.is_empty() {
            Ok(Some(()))
        } else {
            Err::<Option<()>, harness::poll::Failure>(format!("{left:?}").into())
        }
    })
    .await?;
    Ok(())
}

/// The ReplicaSets and Pods with `app`'s selector labels that no live Deployment of it
/// controls, or that are being deleted: what a deleted Deployment left to the garbage
/// collector. While they go, a Deployment re-created with the same template may find its
/// ReplicaSet's name taken, and its status (which the AppService's follows) still moves.
async fn leftovers(f: &Fixture, app: &str) -> anyhow::Result<Vec<String>> {
    use controller::desired::is_controlled_by;
    use k8s_openapi::api::apps::v1::ReplicaSet;
    use k8s_openapi::api::core::v1::Pod;
    let selector = common::names::selector_labels(app)
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let by_labels = kube::api::ListParams::default().labels(&selector);
    let deployments: Vec<String> = f
        .deployments
        .list(&by_labels)
        .await?
        .into_iter()
        .filter(|d| d.metadata.deletion_timestamp.is_none())
        .filter_map(|d| d.metadata.uid)
        .collect();
    let sets: Api<ReplicaSet> = f.api();
    let mut left = Vec::new();
    let mut live_sets = Vec::new();
    for rs in sets.list(&by_labels).await? {
        let refs = rs.metadata.owner_references.as_deref();
        let live = rs.metadata.deletion_timestamp.is_none()
            && deployments.iter().any(|uid| is_controlled_by(refs, uid));
        match (live, rs.metadata.uid.clone()) {
            (true, Some(uid)) => live_sets.push(uid),
            _ => left.push(format!("ReplicaSet {}", kube::ResourceExt::name_any(&rs))),
        }
    }
    let pods: Api<Pod> = f.api();
    for pod in pods.list(&by_labels).await? {
        let refs = pod.metadata.owner_references.as_deref();
        let live = pod.metadata.deletion_timestamp.is_none()
            && live_sets.iter().any(|uid| is_controlled_by(refs, uid));
        if !live {
            left.push(format!("Pod {}", kube::ResourceExt::name_any(&pod)));
        }
    }
    Ok(left)
}

/// Where the Deployment controller is with a Deployment, by the Deployment's own status.
enum Rollout {
    Going,
    Done,
    Stuck,
}

fn rollout(d: &Deployment) -> Rollout {
    let Some(status) = d.status.as_ref() else {
        return Rollout::Going;
    };
    if status.observed_generation < d.metadata.generation {
        return Rollout::Going;
    }
    let stuck = status.conditions.iter().flatten().any(|c| {
        let (kind, reason) = (c.type_.as_deref(), c.reason.as_deref());
        (kind == Some("ReplicaFailure") && c.status.as_deref() == Some("True"))
            || (kind == Some("Progressing") && reason == Some("ProgressDeadlineExceeded"))
    });
    let desired = d.spec.replicas.unwrap_or(1);
    let count = |n: Option<i32>| n.unwrap_or(0);
    if stuck {
        Rollout::Stuck
    } else if count(status.updated_replicas) == desired
        && count(status.replicas) == desired
        && count(status.ready_replicas) == desired
        && count(status.available_replicas) == desired
    {
        Rollout::Done
    } else {
        Rollout::Going
    }
}

/// The ReplicaSets of `d` whose own controller is not done with them: it has not seen
/// their current generation, or they do not have the Pods they ask for yet (or still
/// have Pods they no longer ask for). A Deployment's status is the sum of its
/// ReplicaSets' statuses, so it can read "rolled out" while a ReplicaSet scaled away by
/// a put-back template still creates the Pods of its earlier size; the Deployment's
/// status then moves again, and the AppService's status rightly follows it.
async fn replica_sets_unsettled(f: &Fixture, d: &Deployment) -> anyhow::Result<Vec<String>> {
    use controller::desired::is_controlled_by;
    use k8s_openapi::api::apps::v1::ReplicaSet;
    let uid = d
        .metadata
        .uid
        .as_deref()
        .context("Deployment without a uid")?;
    let sets: Api<ReplicaSet> = f.api();
    Ok(sets
        .list(&kube::api::ListParams::default())
        .await?
        .into_iter()
        .filter(|rs| is_controlled_by(rs.metadata.owner_references.as_deref(), uid))
        .filter_map(|rs| {
            let wanted = rs.spec.replicas.unwrap_or(1);
            let status = rs.status.as_ref();
            let has = status.map_or(0, |s| s.replicas);
            let seen = status.and_then(|s| s.observed_generation);
            let settled = seen >= rs.metadata.generation && has == wanted;
            (!settled).then(|| {
                format!(
                    "{}: wants {wanted}, has {has}, saw generation {seen:?} of {:?}",
                    kube::ResourceExt::name_any(&rs),
                    rs.metadata.generation
                )
            })
        })
        .collect())
}

/// Prefix of the problems that are about Pods' progress rather than the children's
/// content (the control plane's part: Pods becoming ready, old ones going away).
pub const ROLLOUT: &str = "rollout: ";

/// A test world that can say what about an AppService does not match its spec.
pub trait Converges {
    /// Everything about `name` that does not match its spec, empty when converged;
    /// problems about Pods' progress start with [`ROLLOUT`].
    fn problems<'a>(
        &'a self,
        name: &'a str,
    ) -> futures::future::BoxFuture<'a, anyhow::Result<Vec<String>>>;
}

/// Waits until `name` has no problems (without `rollout`: none but Pods' progress);
/// fails after `bound` with what is still off. Returns how long it took.
pub async fn no_problems_within(
    world: &impl Converges,
    name: &str,
    bound: Duration,
    rollout: bool,
) -> anyhow::Result<Duration> {
    let started = std::time::Instant::now();
    loop {
        let mut problems = world.problems(name).await?;
        if !rollout {
            problems.retain(|p| !p.starts_with(ROLLOUT));
        }
        if problems.is_empty() {
            return Ok(started.elapsed());
        }
        if started.elapsed() > bound {
            anyhow::bail!("{name} not converged after {bound:?}: {problems:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `name`'s children (within `heal`) and then its Ready condition (within
/// `ready`) are back, and prints how long each took after `what`.
pub async fn recovers(
    world: &impl Converges,
    name: &str,
    what: &str,
    heal: Duration,
    ready: Duration,
) -> anyhow::Result<()> {
    let children = no_problems_within(world, name, heal, false).await?;
    let ready = no_problems_within(world, name, ready, true).await?;
    println!(
        "{what}: children in {} ms, Ready in {} ms",
        children.as_millis(),
        ready.as_millis()
    );
    Ok(())
}
