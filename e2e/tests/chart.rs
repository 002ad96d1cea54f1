//! The Helm chart installed (its rendering with no cluster is `chart_template.rs`): an
//! install into a real kube-apiserver (namespace enforcing the "restricted" Pod Security
//! Standard, Pods created by the real ReplicaSet controller), and the RBAC proof: the
//! controller does all of its work with the chart's ServiceAccount token and nothing more.
//!
//! The chart's webhook configurations are cluster-scoped, so this file is its own test
//! binary with its own control plane.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the failure

mod chart_render;

use chart_render::*;
use std::collections::BTreeMap;
use std::time::Duration;

use common::AppService;
use harness::eventually;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::sync::OnceCell;

/// The namespace `installed()` excludes through `controller.excludeNamespaces`.
const EXCLUDED_BY_VALUE: &str = "aso-excluded";

/// The migration does its whole job (list, rewrite, narrow storedVersions) with the
/// hook's ServiceAccount and ClusterRole as the chart renders them, and nothing more.
#[tokio::test]
async fn storage_migration_runs_with_the_hooks_rbac() {
    let (cp, _) = installed().await;
    let _logs = cp.log_guard();
    let ns = cp.namespace().await.expect("namespace");
    let admin = cp.client();
    let docs = template(ns.name(), &["storageMigration.enabled=true".to_owned()]);
    let mut role: ClusterRole =
        serde_json::from_value(find(&docs, "ClusterRole", MIGRATE).clone()).expect("ClusterRole");
    // A name of this test's own: other tests may render the same release.
    let role_name = format!("{MIGRATE}-{}", ns.name());
    role.metadata = ObjectMeta {
        name: Some(role_name.clone()),
        ..Default::default()
    };
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await
        .expect("creating the hook's ClusterRole");
    Api::<ServiceAccount>::namespaced(admin.clone(), ns.name())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": MIGRATE}})).expect("sa"),
        )
        .await
        .expect("creating the ServiceAccount");
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": role_name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
        "subjects": [{"kind": "ServiceAccount", "name": MIGRATE, "namespace": ns.name()}]
    }))
    .expect("binding");
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("creating the binding");
    let apps: Api<AppService> = Api::namespaced(admin.clone(), ns.name());
    let app: AppService = serde_json::from_value(json!({
        "apiVersion": "platform.example.com/v1beta1", "kind": "AppService",
        "metadata": {"name": "migrated"},
        "spec": {"image": "registry.example.com/hello:v1.0.0"}
    }))
    .expect("app");
    apps.create(&PostParams::default(), &app)
        .await
        .expect("creating an AppService");

    let sa_client = service_account_client(cp, ns.name(), MIGRATE).await;
    // RBAC takes effect through an informer: retry until the role is in force.
    let report = eventually(
        "a migration with the hook's RBAC",
        Duration::from_secs(30),
        || {
            let client = sa_client.clone();
            async move { controller::migrate::run(client).await.ok() }
        },
    )
    .await
    .unwrap();
    assert!(report.rewritten >= 1, "{report:?}");
    assert_eq!(report.stored_versions, ["v1beta1"]);
    // Nothing more: it cannot delete what it rewrites.
    let forbidden = |e: kube::Error| matches!(e, kube::Error::Api(ref s) if s.code == 403);
    let sa_apps: Api<AppService> = Api::namespaced(sa_client, ns.name());
    assert!(forbidden(
        sa_apps
            .delete("migrated", &DeleteParams::default())
            .await
            .expect_err("the migration deletes an AppService")
    ));
    Api::<ClusterRoleBinding>::all(admin.clone())
        .delete(&role_name, &DeleteParams::default())
        .await
        .expect("deleting the binding");
    Api::<ClusterRole>::all(admin)
        .delete(&role_name, &DeleteParams::default())
        .await
        .expect("deleting the ClusterRole");
    ns.cleanup().await.expect("namespace cleanup");
}

/// Installs the chart once per test binary into a namespace enforcing the restricted
/// profile; returns that namespace.
async fn installed() -> (&'static harness::ControlPlane, &'static str) {
    static INSTALLED: OnceCell<String> = OnceCell::const_new();
    let cp = harness::shared_full().await.expect("control plane");
    let ns = INSTALLED
        .get_or_init(|| async {
            let name = "appservice-system".to_owned();
            let namespaces: Api<Namespace> = Api::all(cp.client());
            let ns = Namespace {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    labels: Some(BTreeMap::from([
                        ("pod-security.kubernetes.io/enforce".into(), "restricted".into()),
                        ("pod-security.kubernetes.io/enforce-version".into(), "latest".into()),
                    ])),
                    ..Default::default()
                },
                ..Default::default()
            };
            namespaces.create(&PostParams::default(), &ns).await.expect("creating the release namespace");
            let chart = chart_dir();
            let kubeconfig = cp.kubeconfig_path().to_str().unwrap().to_owned();
            // The test namespaces that hold AppServices are excluded from the webhooks:
            // no webhook Pod really serves on a kwok node.
            let (ok, stdout, stderr) = run_helm(&[
                "install",
                RELEASE,
                chart.to_str().unwrap(),
                "--namespace",
                &name,
                "--kubeconfig",
                &kubeconfig,
                // Installs the webhook's namespace-label RBAC too, for its RBAC proof.
                "--set",
                "webhook.namespaceLabels=true",
                // The harness installed the CRD (without a conversion webhook: no webhook
                // Pod really serves on a kwok node); the rendered one is checked by
                // `the_crd_converts_through_the_release_webhook`.
                "--set",
                "crd.install=false",
                "--set",
                "webhook.namespaceSelectorExpressions[0].key=appservice-tests.example.com/test-namespace",
                "--set",
                "webhook.namespaceSelectorExpressions[0].operator=DoesNotExist",
                // One namespace excluded by value, besides kube-system and the release's.
                "--set",
                &format!("controller.excludeNamespaces[0]={EXCLUDED_BY_VALUE}"),
            ]);
            assert!(ok, "helm install failed:\n{stdout}\n{stderr}");
            assert!(!stderr.contains("would violate PodSecurity"), "PodSecurity warnings: {stderr}");
            name
        })
        .await;
    (cp, ns.as_str())
}

/// Rendered against a cluster without any network value (`helm template
/// --dry-run=server`, as `helm install` renders), the webhook port admits exactly the
/// addresses of the `kubernetes` Service's EndpointSlices. (The harness's API server
/// runs without an endpoint reconciler, so the test writes that EndpointSlice itself,
/// as the API server would.)
#[tokio::test]
async fn rendered_on_a_cluster_the_webhook_port_admits_the_api_servers_addresses() {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let (cp, _) = installed().await;
    let slices: Api<EndpointSlice> = Api::namespaced(cp.client(), "default");
    let name = "aso-test-kubernetes";
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": "kubernetes"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["192.0.2.10", "192.0.2.11"]}],
        "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}]
    }))
    .unwrap();
    let _ = slices.delete(name, &DeleteParams::default()).await;
    slices.create(&PostParams::default(), &slice).await.unwrap();
    let kubeconfig = cp.kubeconfig_path().to_str().unwrap().to_owned();
    let chart = chart_dir();
    let (ok, stdout, stderr) = run_helm(&[
        "template",
        RELEASE,
        chart.to_str().unwrap(),
        "--namespace",
        "ops",
        "--kubeconfig",
        &kubeconfig,
        "--dry-run=server",
    ]);
    slices.delete(name, &DeleteParams::default()).await.unwrap();
    assert!(ok, "helm template --dry-run=server failed: {stderr}");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&stdout).expect("helm renders YAML");
    let docs: Vec<Value> = docs.into_iter().filter(|d| d.is_object()).collect();
    let mut peers = webhook_port_peers(&docs)
        .as_array()
        .cloned()
        .expect("the webhook port admits listed peers only");
    // Any other EndpointSlice of the Service (none in the harness) would be listed too.
    peers.sort_by_key(Value::to_string);
    assert_eq!(
        peers,
        vec![
            json!({"ipBlock": {"cidr": "192.0.2.10/32"}}),
            json!({"ipBlock": {"cidr": "192.0.2.11/32"}}),
        ]
    );
}

#[tokio::test]
async fn installs_into_a_restricted_namespace_and_pods_are_admitted() {
    let (cp, ns) = installed().await;
    let _logs = cp.log_guard();
    let client = cp.client();
    for name in [WEBHOOK, CONTROLLER] {
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
        assert!(deployments.get(name).await.is_ok(), "{name} installed");
    }
    for kind in [
        "mutatingwebhookconfigurations",
        "validatingwebhookconfigurations",
    ] {
        let gvk = kube::api::GroupVersionKind::gvk(
            "admissionregistration.k8s.io",
            "v1",
            if kind.starts_with('m') {
                "MutatingWebhookConfiguration"
            } else {
                "ValidatingWebhookConfiguration"
            },
        );
        let (ar, _) = kube::discovery::pinned_kind(&client, &gvk)
            .await
            .expect("discovery");
        let api: Api<kube::api::DynamicObject> = Api::all_with(client.clone(), &ar);
        assert!(api.get(WEBHOOK).await.is_ok(), "{kind} installed");
    }
    // The real ReplicaSet controller creates the Pods, and Pod Security admission in
    // enforce mode lets them in: two of each component.
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    for component in ["webhook", "controller"] {
        let selector =
            format!("app.kubernetes.io/component={component},app.kubernetes.io/instance={RELEASE}");
        let count = eventually(
            &format!("{component} pods"),
            Duration::from_secs(90),
            || {
                let pods = pods.clone();
                let selector = selector.clone();
                async move {
                    let list = pods
                        .list(&ListParams::default().labels(&selector))
                        .await
                        .ok()?;
                    (list.items.len() >= 2).then_some(list.items.len())
                }
            },
        )
        .await
        .unwrap();
        assert_eq!(count, 2, "{component}");
    }
    // A privileged Pod in the same namespace is refused: the profile is really enforced.
    let bad: Pod = serde_json::from_value(json!({
        "metadata": {"name": "privileged"},
        "spec": {"containers": [{"name": "c", "image": "busybox:1.36", "securityContext": {"privileged": true}}]}
    }))
    .unwrap();
    let err = pods
        .create(&PostParams::default(), &bad)
        .await
        .expect_err("privileged pod must be refused");
    assert!(err.to_string().contains("violates PodSecurity"), "{err}");
}

/// The RBAC proofs run a controller over all namespaces; two at once would reconcile
/// each other's AppServices.
static CLUSTER_WIDE_CONTROLLER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A client authenticated as `system:serviceaccount:<ns>:<sa>` with a bound token.
/// The real controller, in this test, with the credentials of the chart's ServiceAccount.
struct ChartController {
    stop: tokio::sync::oneshot::Sender<()>,
    run: tokio::task::JoinHandle<()>,
}

impl ChartController {
    fn start(config: controller::Config, client: Client, hooks: controller::Hooks) -> Self {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let run = tokio::spawn(async move {
            controller::run_with(config, client, hooks, async move {
                let _ = stopped.await;
            })
            .await
            .expect("controller ran without error under the chart's RBAC");
        });
        ChartController { stop, run }
    }

    /// Deletes the AppService `name` and waits until it is gone: the controller ran its
    /// finalizer (where it had one) and removed it, with the chart's permissions.
    async fn deletes(&self, apps: &Api<AppService>, name: &str) {
        apps.delete(name, &DeleteParams::default())
            .await
            .expect("deleting");
        eventually(
            "the AppService to be gone",
            Duration::from_secs(60),
            || async { apps.get_opt(name).await.ok()?.is_none().then_some(()) },
        )
        .await
        .unwrap();
    }

    /// Stops the controller; it must have run without an error.
    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(60), self.run)
            .await
            .expect("controller stops")
            .expect("controller task");
    }
}

async fn service_account_client(cp: &harness::ControlPlane, ns: &str, sa: &str) -> Client {
    let sas: Api<ServiceAccount> = Api::namespaced(cp.client(), ns);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    let token = sas
        .create_token_request(sa, &PostParams::default(), &request)
        .await
        .expect("token for the ServiceAccount")
        .status
        .expect("token status")
        .token
        .expect("a token");
    let mut config = cp.admin_config();
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    Client::try_from(config).expect("service account client")
}

#[tokio::test]
async fn controller_does_its_work_with_the_charts_rbac_and_nothing_more() {
    let _one_controller = CLUSTER_WIDE_CONTROLLER.lock().await;
    let (cp, release_ns) = installed().await;
    let _logs = cp.log_guard();
    let admin = cp.client();
    let test_ns = cp.namespace().await.expect("namespace");
    let sa_client = service_account_client(cp, release_ns, CONTROLLER).await;

    // What it must not do. (It may list and watch Secrets, for the metadata-only watch
    // of its `<name>-database` Secrets, but neither patch them nor delete them in bulk.)
    let forbidden = |e: kube::Error| matches!(e, kube::Error::Api(ref s) if s.code == 403);
    let secrets_release: Api<Secret> = Api::namespaced(sa_client.clone(), release_ns);
    assert!(forbidden(
        secrets_release
            .patch(
                "anything",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}}))
            )
            .await
            .expect_err("patch secrets")
    ));
    assert!(forbidden(
        secrets_release
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await
            .expect_err("deletecollection secrets")
    ));
    // It may list Pods (why a rollout's Pods do not start, in status), nothing more.
    let pods: Api<Pod> = Api::namespaced(sa_client.clone(), &test_ns);
    pods.list(&ListParams::default()).await.expect("list pods");
    assert!(forbidden(
        pods.get("anything").await.expect_err("get a pod")
    ));
    assert!(forbidden(
        pods.delete("anything", &DeleteParams::default())
            .await
            .expect_err("delete a pod")
    ));
    // It may delete a Deployment (its canary, once promoted or aborted; the admission
    // policy keeps that to its own), never a collection of them.
    let deployments: Api<Deployment> = Api::namespaced(sa_client.clone(), &test_ns);
    assert!(forbidden(
        deployments
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await
            .expect_err("deletecollection deployments")
    ));
    let roles: Api<ClusterRole> = Api::all(sa_client.clone());
    let escalate: ClusterRole =
        serde_json::from_value(json!({"metadata": {"name": "escalate"}, "rules": []})).unwrap();
    assert!(forbidden(
        roles
            .create(&PostParams::default(), &escalate)
            .await
            .expect_err("create clusterroles")
    ));
    let other_lease: Api<Lease> = Api::namespaced(sa_client.clone(), &test_ns);
    assert!(forbidden(
        other_lease
            .get("appservice-controller")
            .await
            .expect_err("leases elsewhere")
    ));

    // What it must do: run the real controller, leader election on, with only that token.
    let mut config = controller::Config::for_namespace(&test_ns);
    config.watch_namespace = None; // cluster-wide, as the chart deploys it
    config.leader_election = true;
    config.lease_namespace = release_ns.to_owned();
    config.identity = Some("rbac-proof".into());
    // The excluded namespaces exactly as the chart passes them to the binary.
    let docs = template(
        release_ns,
        &[format!(
            "controller.excludeNamespaces[0]={EXCLUDED_BY_VALUE}"
        )],
    );
    let env =
        find(&docs, "Deployment", CONTROLLER)["spec"]["template"]["spec"]["containers"][0]["env"]
            .clone();
    let excluded = env
        .as_array()
        .and_then(|e| e.iter().find(|v| v["name"] == "EXCLUDE_NAMESPACES"))
        .and_then(|v| v["value"].as_str())
        .expect("EXCLUDE_NAMESPACES");
    config.exclude_namespaces = excluded.split(',').map(str::to_owned).collect();
    assert!(config.is_excluded(release_ns));
    let metrics = std::sync::Arc::new(controller::metrics::Metrics::default());
    let hooks = controller::Hooks {
        metrics: metrics.clone(),
        ..controller::Hooks::default()
    };
    let ctl = ChartController::start(config.clone(), sa_client.clone(), hooks);

    // An AppService in the release namespace (excluded) is left alone: nothing written.
    let excluded_apps: Api<AppService> = Api::namespaced(admin.clone(), release_ns);
    let name = format!("excluded-{}", test_ns.name());
    let excluded_app: AppService = serde_json::from_value(json!({
        "apiVersion": "platform.example.com/v1beta1", "kind": "AppService",
        "metadata": {"name": name},
        "spec": {"image": "registry.example.com/hello:v1.0.0"}
    }))
    .unwrap();
    excluded_apps
        .create(&PostParams::default(), &excluded_app)
        .await
        .expect("an AppService in the release namespace");

    let apps: Api<AppService> = Api::namespaced(admin.clone(), &test_ns);
    let app: AppService = serde_json::from_value(json!({
        "apiVersion": "platform.example.com/v1beta1", "kind": "AppService",
        // The controller puts its finalizer on (a patch of the AppService).
        "metadata": {"name": "rbac-proof"},
        "spec": {"image": "registry.example.com/hello:v1.0.0", "replicas": 1}
    }))
    .unwrap();
    apps.create(&PostParams::default(), &app)
        .await
        .expect("creating the AppService");

    let leases: Api<Lease> = Api::namespaced(admin.clone(), release_ns);
    let holder = eventually("the lease", Duration::from_secs(60), || {
        let leases = leases.clone();
        async move {
            leases
                .get("appservice-controller")
                .await
                .ok()?
                .spec?
                .holder_identity
        }
    })
    .await
    .unwrap();
    assert_eq!(holder, "rbac-proof");

    let admin_deployments: Api<Deployment> = Api::namespaced(admin.clone(), &test_ns);
    let admin_services: Api<Service> = Api::namespaced(admin.clone(), &test_ns);
    eventually("Deployment and Service", Duration::from_secs(60), || {
        let (d, s) = (admin_deployments.clone(), admin_services.clone());
        async move {
            (d.get("rbac-proof").await.is_ok() && s.get("rbac-proof").await.is_ok()).then_some(())
        }
    })
    .await
    .unwrap();
    let reconciled = eventually("finalizer and status", Duration::from_secs(60), || {
        let apps = apps.clone();
        async move {
            let app = apps.get("rbac-proof").await.ok()?;
            let has_finalizer = app
                .metadata
                .finalizers
                .iter()
                .flatten()
                .any(|f| f == common::names::FINALIZER);
            let has_status = app
                .status
                .as_ref()
                .is_some_and(|s| !s.conditions.is_empty());
            (has_finalizer && has_status).then_some(app)
        }
    })
    .await
    .unwrap();
    assert!(
        reconciled
            .status
            .and_then(|s| s.observed_generation)
            .is_some()
    );

    // A canary, then its abort: created and deleted with only the chart's RBAC, also
    // when someone removed our label from it while the controller was down (the policy
    // lets it delete only what carries the label: it puts the label back first).
    apps.patch(
        "rbac-proof",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 2,
            "canary": {"image": "registry.example.com/hello:v1.1.0"}}})),
    )
    .await
    .expect("adding a canary");
    eventually("the canary Deployment", Duration::from_secs(60), || {
        let d = admin_deployments.clone();
        async move { d.get_opt("rbac-proof-canary").await.ok()?.map(drop) }
    })
    .await
    .unwrap();
    ctl.stop().await;
    let unlabel: json_patch::Patch = serde_json::from_value(json!([
        {"op": "remove", "path": "/metadata/labels/app.kubernetes.io~1managed-by"}
    ]))
    .unwrap();
    admin_deployments
        .patch(
            "rbac-proof-canary",
            &PatchParams::default(),
            &Patch::Json::<()>(unlabel),
        )
        .await
        .expect("removing our label from the canary");
    apps.patch(
        "rbac-proof",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"canary": null}})),
    )
    .await
    .expect("aborting the canary");
    let ctl = ChartController::start(
        config.clone(),
        sa_client.clone(),
        controller::Hooks {
            metrics: metrics.clone(),
            ..controller::Hooks::default()
        },
    );
    eventually("the canary deleted", Duration::from_secs(60), || {
        let d = admin_deployments.clone();
        async move {
            match d.get_opt("rbac-proof-canary").await.ok()? {
                None => Some(()),
                Some(_) => None,
            }
        }
    })
    .await
    .unwrap();

    let events: Api<Event> = Api::namespaced(admin.clone(), &test_ns);
    eventually(
        "an Event from the controller",
        Duration::from_secs(60),
        || {
            let events = events.clone();
            async move {
                let list = events.list(&ListParams::default()).await.ok()?;
                list.items
                    .iter()
                    .any(|e| {
                        e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("rbac-proof")
                    })
                    .then_some(())
            }
        },
    )
    .await
    .unwrap();

    // The excluded one was seen (counted, in the reconcile that would have written) and
    // got nothing: no finalizer, no status, no children, no Event.
    eventually(
        "the excluded AppService counted",
        Duration::from_secs(60),
        || async { (metrics.excluded_count() >= 1).then_some(()) },
    )
    .await
    .unwrap();
    let untouched = excluded_apps.get(&name).await.unwrap();
    assert!(untouched.metadata.finalizers.is_none(), "{untouched:?}");
    assert!(untouched.status.is_none(), "{untouched:?}");
    let release_deployments: Api<Deployment> = Api::namespaced(admin.clone(), release_ns);
    let release_services: Api<Service> = Api::namespaced(admin.clone(), release_ns);
    assert!(release_deployments.get_opt(&name).await.unwrap().is_none());
    assert!(release_services.get_opt(&name).await.unwrap().is_none());
    let release_events: Api<Event> = Api::namespaced(admin.clone(), release_ns);
    assert!(
        !release_events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .any(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name.as_str()))
    );
    excluded_apps
        .delete(&name, &DeleteParams::default())
        .await
        .expect("deleting it needs no controller: it has no finalizer");

    // Deletion: the finalizer runs and is removed with the same credentials.
    ctl.deletes(&apps, "rbac-proof").await;
    ctl.stop().await;
}

/// The controller's identity is refused every write to what it does not own, by the
/// chart's ValidatingAdmissionPolicy on the real API server: foreign Deployments,
/// Services and Secrets, adoption of a foreign object, Secrets not named `*-database`,
/// objects missing the label or the owner, and anything in an excluded namespace (the
/// webhook's CA Secret in the release namespace included). Its own objects pass (and the
/// full lifecycle tests in this file run under the same policy).
#[tokio::test]
async fn the_controllers_identity_writes_only_what_it_owns() {
    use kube::api::{Patch, PatchParams};

    let _one_controller = CLUSTER_WIDE_CONTROLLER.lock().await;
    let (cp, release_ns) = installed().await;
    let _logs = cp.log_guard();
    let admin = cp.client();
    let test_ns = cp.namespace().await.expect("namespace");
    let ns = test_ns.name();
    let sa = service_account_client(cp, release_ns, CONTROLLER).await;
    let post = PostParams::default();

    // An AppService to own things, and foreign objects made by the admin.
    let apps: Api<AppService> = Api::namespaced(admin.clone(), ns);
    let app: AppService = serde_json::from_value(json!({
        "apiVersion": "platform.example.com/v1beta1", "kind": "AppService",
        "metadata": {"name": "owner"},
        "spec": {"image": "registry.example.com/hello:v1.0.0"}
    }))
    .unwrap();
    let app = apps.create(&post, &app).await.expect("AppService");
    let admin_deployments: Api<Deployment> = Api::namespaced(admin.clone(), ns);
    let admin_services: Api<Service> = Api::namespaced(admin.clone(), ns);
    let admin_secrets: Api<Secret> = Api::namespaced(admin.clone(), ns);
    admin_deployments
        .create(&post, &object("Deployment", "foreign", None, false))
        .await
        .expect("foreign Deployment");
    admin_services
        .create(&post, &object("Service", "foreign", None, false))
        .await
        .expect("foreign Service");
    admin_secrets
        .create(&post, &object("Secret", "foreign-database", None, false))
        .await
        .expect("foreign Secret");

    let deployments: Api<Deployment> = Api::namespaced(sa.clone(), ns);
    let services: Api<Service> = Api::namespaced(sa.clone(), ns);
    let secrets: Api<Secret> = Api::namespaced(sa.clone(), ns);
    let merge = |v: Value| Patch::Merge(v);
    let touch = json!({"metadata": {"labels": {"touched": "yes"}}});
    let not_owned = "it owns (label app.kubernetes.io/managed-by=appservice-operator";

    // The policy takes effect through an informer: the first refusal may take a moment.
    eventually("the policy in effect", Duration::from_secs(30), || {
        let deployments = deployments.clone();
        let touch = touch.clone();
        async move {
            match deployments
                .patch("foreign", &PatchParams::default(), &Patch::Merge(&touch))
                .await
            {
                Err(kube::Error::Api(s)) if s.message.contains(OWNED_POLICY) => Some(()),
                _ => None,
            }
        }
    })
    .await
    .unwrap();

    // Foreign objects: patched, replaced, deleted.
    refused_by_policy(
        deployments
            .patch("foreign", &PatchParams::default(), &merge(touch.clone()))
            .await,
        &format!("deployments {not_owned}"),
    );
    refused_by_policy(
        services
            .patch("foreign", &PatchParams::default(), &merge(touch.clone()))
            .await,
        &format!("services {not_owned}"),
    );
    let mut foreign_secret = admin_secrets.get("foreign-database").await.unwrap();
    foreign_secret.string_data = Some(BTreeMap::from([("k".into(), "stolen".into())]));
    refused_by_policy(
        secrets
            .replace("foreign-database", &post, &foreign_secret)
            .await,
        &format!("secrets {not_owned}"),
    );
    refused_by_policy(
        secrets
            .delete("foreign-database", &DeleteParams::default())
            .await,
        &format!("secrets {not_owned}"),
    );
    // RBAC lets it delete Deployments (a canary once promoted or aborted); the policy
    // keeps that to its own.
    refused_by_policy(
        deployments
            .delete("foreign", &DeleteParams::default())
            .await,
        &format!("deployments {not_owned}"),
    );
    // Server-side apply onto a foreign object is an update like any other.
    refused_by_policy(
        services
            .patch(
                "foreign",
                &PatchParams::apply(common::names::FIELD_MANAGER).force(),
                &Patch::Apply(json!({"apiVersion": "v1", "kind": "Service",
                    "metadata": {"name": "foreign", "labels": {"touched": "yes"}}})),
            )
            .await,
        &format!("services {not_owned}"),
    );

    // Adoption: our label and owner added to a foreign object in one write.
    let adopt = json!({"metadata": {
        "labels": {common::names::LABEL_MANAGED_BY: common::names::MANAGED_BY},
        "ownerReferences": [{"apiVersion": "platform.example.com/v1alpha1", "kind": "AppService",
            "name": "owner", "uid": app.metadata.uid, "controller": true}],
    }});
    refused_by_policy(
        deployments
            .patch("foreign", &PatchParams::default(), &merge(adopt.clone()))
            .await,
        "may not adopt deployments",
    );
    refused_by_policy(
        services
            .patch("foreign", &PatchParams::default(), &merge(adopt))
            .await,
        "may not adopt services",
    );

    // New objects need both the label and the owner; Secrets also the name.
    refused_by_policy(
        deployments
            .create(&post, &object("Deployment", "no-owner", None, true))
            .await,
        not_owned,
    );
    refused_by_policy(
        services
            .create(&post, &object("Service", "no-label", Some(&app), false))
            .await,
        not_owned,
    );
    refused_by_policy(
        secrets
            .create(&post, &object("Secret", "owner-token", Some(&app), true))
            .await,
        "only write the <name>-database Secrets",
    );

    // Excluded namespaces: the release namespace (the webhook's keys, the classes'
    // admin Secrets), kube-system and one excluded by value; even an object that looks
    // owned.
    let excluded_ns: Api<Namespace> = Api::all(admin.clone());
    if excluded_ns
        .get_opt(EXCLUDED_BY_VALUE)
        .await
        .unwrap()
        .is_none()
    {
        let created: Namespace =
            serde_json::from_value(json!({"metadata": {"name": EXCLUDED_BY_VALUE}})).unwrap();
        excluded_ns
            .create(&post, &created)
            .await
            .expect("excluded namespace");
    }
    for excluded in [release_ns, "kube-system", EXCLUDED_BY_VALUE] {
        let secrets: Api<Secret> = Api::namespaced(sa.clone(), excluded);
        refused_by_policy(
            secrets
                .create(&post, &object("Secret", "owner-database", Some(&app), true))
                .await,
            &format!("does not write in namespace {excluded}"),
        );
        let deployments: Api<Deployment> = Api::namespaced(sa.clone(), excluded);
        refused_by_policy(
            deployments
                .create(&post, &object("Deployment", "owner", Some(&app), true))
                .await,
            &format!("does not write in namespace {excluded}"),
        );
    }
    let release_secrets: Api<Secret> = Api::namespaced(admin.clone(), release_ns);
    let target = format!("policy-target-{ns}");
    release_secrets
        .create(&post, &object("Secret", &target, None, false))
        .await
        .expect("a Secret in the release namespace");
    refused_by_policy(
        Api::<Secret>::namespaced(sa.clone(), release_ns)
            .delete(&target, &DeleteParams::default())
            .await,
        &format!("does not write in namespace {release_ns}"),
    );
    assert!(release_secrets.get_opt(&target).await.unwrap().is_some());
    release_secrets
        .delete(&target, &DeleteParams::default())
        .await
        .expect("admin deletes it");

    // Nothing foreign changed.
    let foreign = admin_deployments.get("foreign").await.unwrap();
    assert!(foreign.metadata.owner_references.is_none());
    assert!(
        !foreign
            .metadata
            .labels
            .unwrap_or_default()
            .contains_key("touched")
    );
    let secret = admin_secrets.get("foreign-database").await.unwrap();
    assert_eq!(secret.data.unwrap()["k"].0, b"v");

    // Its own objects pass: create, update and (Secrets) delete.
    deployments
        .create(&post, &object("Deployment", "owner", Some(&app), true))
        .await
        .expect("its own Deployment");
    deployments
        .patch("owner", &PatchParams::default(), &merge(touch.clone()))
        .await
        .expect("patching its own Deployment");
    deployments
        .create(
            &post,
            &object("Deployment", "owner-canary", Some(&app), true),
        )
        .await
        .expect("its own canary Deployment");
    deployments
        .delete("owner-canary", &DeleteParams::default())
        .await
        .expect("deleting its own canary Deployment");
    services
        .create(&post, &object("Service", "owner", Some(&app), true))
        .await
        .expect("its own Service");
    let own_secret = secrets
        .create(&post, &object("Secret", "owner-database", Some(&app), true))
        .await
        .expect("its own database Secret");
    secrets
        .replace("owner-database", &post, &own_secret)
        .await
        .expect("replacing its own database Secret");
    // Our label put back on our own child (someone removed it) is not an adoption.
    admin_deployments
        .patch(
            "owner",
            &PatchParams::default(),
            &merge(json!({"metadata": {"labels": {common::names::LABEL_MANAGED_BY: null}}})),
        )
        .await
        .unwrap();
    deployments
        .patch(
            "owner",
            &PatchParams::default(),
            &merge(json!({"metadata": {"labels": {common::names::LABEL_MANAGED_BY: common::names::MANAGED_BY}}})),
        )
        .await
        .expect("healing its own Deployment's label");
    secrets
        .delete("owner-database", &DeleteParams::default())
        .await
        .expect("deleting its own database Secret");
    test_ns.cleanup().await.expect("namespace cleanup");
}

#[tokio::test]
async fn webhook_watches_appservices_and_namespaces_with_the_charts_rbac_and_nothing_more() {
    let (cp, release_ns) = installed().await;
    let _logs = cp.log_guard();
    let test_ns = cp.namespace().await.expect("namespace");
    let sa_client = service_account_client(cp, release_ns, WEBHOOK).await;
    let forbidden = |e: kube::Error| matches!(e, kube::Error::Api(ref s) if s.code == 403);

    // Nothing but watching AppServices and namespaces: no reads of one object, no
    // writes, no Secrets.
    let apps: Api<AppService> = Api::namespaced(sa_client.clone(), &test_ns);
    apps.list(&ListParams::default())
        .await
        .expect("the webhook lists appservices");
    assert!(forbidden(
        apps.get("any")
            .await
            .expect_err("webhook gets an appservice")
    ));
    assert!(forbidden(
        apps.delete_collection(&DeleteParams::default(), &ListParams::default())
            .await
            .expect_err("webhook deletes appservices")
    ));
    let secrets: Api<Secret> = Api::all(sa_client.clone());
    assert!(forbidden(
        secrets
            .list(&ListParams::default())
            .await
            .expect_err("webhook lists secrets")
    ));
    let namespaces: Api<Namespace> = Api::all(sa_client.clone());
    assert!(forbidden(
        namespaces
            .delete(&test_ns, &DeleteParams::default())
            .await
            .expect_err("webhook deletes a namespace")
    ));

    // The real webhook, with --namespace-labels and only that token, gets ready (its
    // namespace cache synced) and sees the test namespace's labels.
    let dir = tempfile::tempdir().expect("temp dir");
    let (_ca, serving) = harness::webhook_tls().expect("certificates");
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    serving.write(&cert, &key).expect("writing certificates");
    let mut config = webhook::config::Config::local(cert, key, None);
    config.namespace_labels = true;
    config.watch_appservices = true;
    let server = webhook::server::start_with_client(&config, Some(sa_client))
        .await
        .expect("webhook starts");
    let state = server.state().clone();
    eventually(
        "webhook readiness with the namespace and AppService caches",
        Duration::from_secs(60),
        || {
            let state = state.clone();
            async move { state.readiness().is_ok().then_some(()) }
        },
    )
    .await
    .unwrap();
    let seen = eventually(
        "the test namespace in the webhook's cache",
        Duration::from_secs(30),
        || {
            let state = state.clone();
            let ns = test_ns.to_string();
            async move { state.namespace_object(Some(&ns)) }
        },
    )
    .await
    .unwrap();
    assert_eq!(
        seen["metadata"]["labels"]["appservice-tests.example.com/test-namespace"], "true",
        "{seen}"
    );
    server.shutdown().await.expect("webhook shuts down");
}

/// The database step under the chart's RBAC: reading the class, the namespace's labels (its
/// allowedNamespaces.selector), its admin Secret and its
/// CA ConfigMap in the release namespace, writing the class's status, creating, updating
/// and deleting the `<name>-database` Secret, against a real PostgreSQL server.
#[tokio::test]
async fn databases_work_with_the_charts_rbac() {
    use controller::database::{DatabaseConfig, Databases};
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::ResourceExt;

    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let _one_controller = CLUSTER_WIDE_CONTROLLER.lock().await;
    let (cp, release_ns) = installed().await;
    let _logs = cp.log_guard();
    let admin = cp.client();
    let test_ns = cp.namespace().await.expect("namespace");
    let pg = harness::Postgres::start().await.expect("PostgreSQL");
    let sa_client = service_account_client(cp, release_ns, CONTROLLER).await;

    let suffix = test_ns.name().to_owned();
    let admin_secret = format!("pg-admin-{suffix}");
    let ca = format!("pg-ca-{suffix}");
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), release_ns);
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": admin_secret, "labels": {(common::database_class::ADMIN_SECRET_LABEL): "true"}},
        "stringData": {"username": harness::postgres::SUPERUSER, "password": pg.password()},
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("admin Secret");
    let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), release_ns);
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": ca}, "data": {"ca.crt": pg.ca_pem()},
    }))
    .unwrap();
    config_maps
        .create(&PostParams::default(), &cm)
        .await
        .expect("CA ConfigMap");
    let class_name = format!("rbac-{suffix}");
    let classes: Api<common::DatabaseClass> = Api::all(admin.clone());
    let class: common::DatabaseClass = serde_json::from_value(json!({
        "apiVersion": "platform.example.com/v1alpha1", "kind": "DatabaseClass",
        "metadata": {"name": class_name},
        "spec": {
            "host": "localhost", "port": pg.port(),
            "tls": {"mode": "verify-full", "ca": {"configMapRef": {"name": ca}}},
            "adminCredentials": {"secretName": admin_secret},
            // Matched against the namespace's labels: the chart's RBAC must let the
            // controller read them.
            "allowedNamespaces": {"selector": {"matchLabels": {"kubernetes.io/metadata.name": suffix}}},
        }
    }))
    .unwrap();
    classes
        .create(&PostParams::default(), &class)
        .await
        .expect("class");

    let mut config = controller::Config::for_namespace(&test_ns);
    config.watch_namespace = None; // cluster-wide, as the chart deploys it
    let metrics = std::sync::Arc::new(controller::metrics::Metrics::default());
    let databases = Databases::new(
        sa_client.clone(),
        &DatabaseConfig {
            admin_namespace: Some(release_ns.to_owned()),
            pool_size: 2,
            connect_timeout: Duration::from_secs(3),
            statement_timeout: Duration::from_secs(10),
            orphan_scan_interval: Duration::from_secs(3600),
        },
        release_ns,
        metrics.clone(),
    );
    let hooks = controller::Hooks {
        metrics,
        external: std::sync::Arc::new(databases),
        ..controller::Hooks::default()
    };
    let ctl = ChartController::start(config, sa_client.clone(), hooks);

    let apps: Api<AppService> = Api::namespaced(admin.clone(), &test_ns);
    let app: AppService = serde_json::from_value(json!({
        "apiVersion": "platform.example.com/v1beta1", "kind": "AppService",
        "metadata": {"name": "rbac-db"},
        "spec": {"image": "registry.example.com/hello:v1.0.0", "database": {"class": class_name}}
    }))
    .unwrap();
    apps.create(&PostParams::default(), &app)
        .await
        .expect("AppService");
    let ready = eventually("DatabaseReady=True", Duration::from_secs(60), || {
        let apps = apps.clone();
        async move {
            let app = apps.get("rbac-db").await.ok()?;
            let status = app.status.as_ref()?;
            common::conditions::is_true(&status.conditions, common::conditions::DATABASE_READY)
                .then_some(app)
        }
    })
    .await
    .unwrap();
    let db = controller::database::sql::db_name(&ready.uid().unwrap());
    let app_secrets: Api<Secret> = Api::namespaced(admin.clone(), &test_ns);
    let creds = app_secrets
        .get("rbac-db-database")
        .await
        .expect("credentials Secret");
    let password = String::from_utf8(creds.data.unwrap()["PGPASSWORD"].0.clone()).unwrap();
    pg.connect(&db, &password, &db)
        .await
        .expect("login with the Secret's credentials");
    // The chart's RBAC lets the controller watch the Secret: deleted, it is back within
    // seconds (the resync is 10 minutes), and its credentials work.
    let gone = creds.metadata.uid.clone();
    app_secrets
        .delete("rbac-db-database", &DeleteParams::default())
        .await
        .expect("deleting the Secret");
    let back = eventually("the Secret recreated", Duration::from_secs(20), || {
        let app_secrets = app_secrets.clone();
        let gone = gone.clone();
        async move {
            let s = app_secrets.get_opt("rbac-db-database").await.ok()??;
            let settled = !s
                .annotations()
                .contains_key(controller::database::PASSWORD_PENDING_ANNOTATION);
            (s.metadata.uid != gone && settled).then_some(s)
        }
    })
    .await
    .unwrap();
    let password = String::from_utf8(back.data.unwrap()["PGPASSWORD"].0.clone()).unwrap();
    pg.connect(&db, &password, &db)
        .await
        .expect("login with the recreated Secret's credentials");
    let reachable = eventually(
        "the class's Reachable=True",
        Duration::from_secs(30),
        || {
            let classes = classes.clone();
            let name = class_name.clone();
            async move {
                let c = classes.get(&name).await.ok()?;
                let s = c.status?;
                (common::conditions::is_true(&s.conditions, "Reachable")).then_some(s)
            }
        },
    )
    .await
    .unwrap();
    assert!(reachable.server_version.is_some());

    // Disabling deletes the Secret (and the database: the class's policy is Delete).
    let disable = json!({"spec": {"database": null}});
    apps.patch(
        "rbac-db",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&disable),
    )
    .await
    .expect("disable");
    eventually("the Secret deleted", Duration::from_secs(60), || {
        let app_secrets = app_secrets.clone();
        async move {
            app_secrets
                .get_opt("rbac-db-database")
                .await
                .ok()?
                .is_none()
                .then_some(())
        }
    })
    .await
    .unwrap();
    ctl.deletes(&apps, "rbac-db").await;
    ctl.stop().await;
    let _ = classes.delete(&class_name, &DeleteParams::default()).await;
}

/// The chart as installed: users bound by a RoleBinding to Kubernetes' own `edit`,
/// `admin` and `view` in their namespace (as a platform hands a namespace to a team) do
/// their job with AppServices there, through the real RBAC aggregation controller, and
/// reach nothing elsewhere: not another namespace's AppServices or Secrets, not the
/// DatabaseClasses, not the status the controller owns.
#[tokio::test]
async fn tenants_with_the_default_roles_work_in_their_namespace_and_nowhere_else() {
    use k8s_openapi::api::rbac::v1::{RoleBinding, RoleRef, Subject};

    // No controller adds finalizers meanwhile: what is deleted here goes at once.
    let _no_controller = CLUSTER_WIDE_CONTROLLER.lock().await;
    let (cp, _release_ns) = installed().await;
    let _logs = cp.log_guard();
    let admin = cp.client();
    let own = cp.namespace().await.expect("namespace");
    let other = cp.namespace().await.expect("namespace");
    let (own, other) = (own.name(), other.name());
    let post = PostParams::default();

    for role in ["edit", "admin", "view"] {
        let binding = RoleBinding {
            metadata: ObjectMeta {
                name: Some(format!("tenant-{role}")),
                ..Default::default()
            },
            role_ref: RoleRef {
                api_group: Some("rbac.authorization.k8s.io".into()),
                kind: "ClusterRole".into(),
                name: role.into(),
            },
            subjects: Some(vec![Subject {
                kind: "User".into(),
                api_group: Some("rbac.authorization.k8s.io".into()),
                name: format!("tenant-{role}"),
                ..Default::default()
            }]),
        };
        Api::<RoleBinding>::namespaced(admin.clone(), own)
            .create(&post, &binding)
            .await
            .expect("RoleBinding");
    }
    // Another team's AppService and Secret.
    Api::<AppService>::namespaced(admin.clone(), other)
        .create(&post, &tenant_app("theirs"))
        .await
        .expect("their AppService");
    Api::<Secret>::namespaced(admin.clone(), other)
        .create(&post, &object("Secret", "theirs-database", None, false))
        .await
        .expect("their Secret");

    for role in ["edit", "admin"] {
        let user = format!("tenant-{role}");
        let client = impersonating(cp, &user);
        let apps: Api<AppService> = Api::namespaced(client.clone(), own);
        // The aggregation controller folds our roles into `edit` and `admin` a moment
        // after the install: the first create may be refused until then.
        eventually(
            &format!("{user} creates an AppService"),
            Duration::from_secs(60),
            || {
                let apps = apps.clone();
                let name = user.clone();
                async move {
                    apps.create(&PostParams::default(), &tenant_app(&name))
                        .await
                        .ok()
                }
            },
        )
        .await
        .unwrap();
        apps.get(&user).await.expect("get own AppService");
        assert!(
            !apps
                .list(&ListParams::default())
                .await
                .expect("list")
                .items
                .is_empty()
        );
        let merge = |v: Value| Patch::Merge(v);
        apps.patch(
            &user,
            &PatchParams::default(),
            &merge(json!({"spec": {"replicas": 2}})),
        )
        .await
        .expect("edit the spec");
        // kubectl scale, as the scale subresource.
        apps.patch_scale(
            &user,
            &PatchParams::default(),
            &merge(json!({"spec": {"replicas": 3}})),
        )
        .await
        .expect("scale");
        let scaled = Api::<AppService>::namespaced(admin.clone(), own)
            .get(&user)
            .await
            .expect("read back");
        assert_eq!(
            scaled.spec.replicas,
            Some(3),
            "{user} scaled through /scale"
        );
        assert!(
            forbidden(
                apps.patch_status(
                    &user,
                    &PatchParams::default(),
                    &merge(json!({"status": {"readyReplicas": 3}}))
                )
                .await
            ),
            "{user} must not write status"
        );

        // The shard and drain labels decide which controller shard writes an object:
        // a tenant can neither set, change nor remove them (on the AppService or on a
        // Secret or Service of theirs), while any other label is theirs.
        apps.patch(
            &user,
            &PatchParams::default(),
            &merge(json!({"metadata": {"labels": {"team": "shop"}}})),
        )
        .await
        .expect("an ordinary label");
        for key in [
            "shard.platform.example.com/appservice-operator",
            "drain.shard.platform.example.com/canary",
        ] {
            let set = apps
                .patch(
                    &user,
                    &PatchParams::default(),
                    &merge(json!({"metadata": {"labels": {key: "shard-x"}}})),
                )
                .await;
            shard_label_refused(set, &format!("{user} set {key}"));
            let created = Api::<Secret>::namespaced(client.clone(), own)
                .create(
                    &post,
                    &serde_json::from_value(json!({
                        "metadata": {"name": format!("{user}-labelled"), "labels": {key: "shard-x"}}
                    }))
                    .unwrap(),
                )
                .await;
            shard_label_refused(created, &format!("{user} created a Secret with {key}"));
        }
        // Set by someone allowed (cluster-admin here), a tenant may not remove it either.
        let admins_apps: Api<AppService> = Api::namespaced(admin.clone(), own);
        let ring_label = json!({"metadata": {"labels": {"shard.platform.example.com/appservice-operator": "shard-0"}}});
        admins_apps
            .patch(&user, &PatchParams::default(), &merge(ring_label))
            .await
            .expect("cluster-admin sets the shard label");
        let removed = apps
            .patch(
                &user,
                &PatchParams::default(),
                &merge(json!({"metadata": {"labels": {"shard.platform.example.com/appservice-operator": null}}})),
            )
            .await;
        shard_label_refused(removed, &format!("{user} removed the shard label"));
        // Edits that leave the label as it is go through.
        apps.patch(
            &user,
            &PatchParams::default(),
            &merge(json!({"spec": {"replicas": 1}, "metadata": {"labels": {"team": "shop-2"}}})),
        )
        .await
        .expect("an edit keeping the shard label");

        // Nothing of another namespace, nothing cluster-scoped of ours.
        let theirs: Api<AppService> = Api::namespaced(client.clone(), other);
        assert!(
            forbidden(theirs.get("theirs").await),
            "{user} reads another namespace"
        );
        assert!(forbidden(theirs.list(&ListParams::default()).await));
        assert!(forbidden(
            theirs
                .patch(
                    "theirs",
                    &PatchParams::default(),
                    &merge(json!({"spec": {"replicas": 0}}))
                )
                .await
        ));
        assert!(forbidden(
            Api::<Secret>::namespaced(client.clone(), other)
                .get("theirs-database")
                .await
        ));
        assert!(forbidden(
            Api::<AppService>::all(client.clone())
                .list(&ListParams::default())
                .await
        ));
        assert!(forbidden(
            Api::<common::DatabaseClass>::all(client.clone())
                .list(&ListParams::default())
                .await
        ));

        apps.delete(&user, &DeleteParams::default())
            .await
            .expect("delete own AppService");
    }

    // Whoever holds the verb `shard` on appservices in the namespace (as the sharding
    // controller's role grants it) may write the labels.
    {
        use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
        let role = Role {
            metadata: ObjectMeta {
                name: Some("ring-writer".into()),
                ..Default::default()
            },
            rules: Some(vec![PolicyRule {
                api_groups: Some(vec!["platform.example.com".into()]),
                resources: Some(vec!["appservices".into()]),
                verbs: vec![
                    "get".into(),
                    "create".into(),
                    "patch".into(),
                    "shard".into(),
                ],
                ..Default::default()
            }]),
        };
        Api::<Role>::namespaced(admin.clone(), own)
            .create(&post, &role)
            .await
            .expect("Role");
        let binding = RoleBinding {
            metadata: ObjectMeta {
                name: Some("ring-writer".into()),
                ..Default::default()
            },
            role_ref: RoleRef {
                api_group: Some("rbac.authorization.k8s.io".into()),
                kind: "Role".into(),
                name: "ring-writer".into(),
            },
            subjects: Some(vec![Subject {
                kind: "User".into(),
                api_group: Some("rbac.authorization.k8s.io".into()),
                name: "ring-writer".into(),
                ..Default::default()
            }]),
        };
        Api::<RoleBinding>::namespaced(admin.clone(), own)
            .create(&post, &binding)
            .await
            .expect("RoleBinding");
        let writer: Api<AppService> = Api::namespaced(impersonating(cp, "ring-writer"), own);
        let mut labelled = tenant_app("ring-labelled");
        labelled.metadata.labels = Some(BTreeMap::from([(
            "shard.platform.example.com/appservice-operator".to_owned(),
            "shard-0".to_owned(),
        )]));
        writer
            .create(&post, &labelled)
            .await
            .expect("created with the shard label by a holder of `shard`");
        writer
            .patch(
                "ring-labelled",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {
                    "shard.platform.example.com/appservice-operator": "shard-1",
                    "drain.shard.platform.example.com/appservice-operator": "true",
                }}})),
            )
            .await
            .expect("moved by a holder of `shard`");
    }

    // `view`: reads AppServices and their scale, writes nothing, reads no Secret.
    let viewer = impersonating(cp, "tenant-view");
    let apps: Api<AppService> = Api::namespaced(viewer.clone(), own);
    Api::<AppService>::namespaced(admin.clone(), own)
        .create(&post, &tenant_app("shown"))
        .await
        .expect("an AppService to view");
    eventually(
        "the viewer reads AppServices",
        Duration::from_secs(60),
        || {
            let apps = apps.clone();
            async move { apps.get("shown").await.ok() }
        },
    )
    .await
    .unwrap();
    apps.get_scale("shown").await.expect("read the scale");
    assert!(forbidden(
        apps.create(&post, &tenant_app("viewer-made")).await
    ));
    assert!(forbidden(
        apps.patch_scale(
            "shown",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 0}}))
        )
        .await
    ));
    assert!(forbidden(
        apps.delete("shown", &DeleteParams::default()).await
    ));
    assert!(forbidden(
        Api::<Secret>::namespaced(viewer.clone(), own)
            .list(&ListParams::default())
            .await
    ));
    assert!(forbidden(
        Api::<AppService>::namespaced(viewer, other)
            .get("theirs")
            .await
    ));
}

/// A write the controller's identity made, refused by the chart's admission policy (not
/// by RBAC, which allows the verb): 403 naming the policy, and `expected` in its message.
fn refused_by_policy<T: std::fmt::Debug>(result: Result<T, kube::Error>, expected: &str) {
    match result {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 403, "{status:?}");
            assert!(
                status
                    .message
                    .contains(&format!("ValidatingAdmissionPolicy '{OWNED_POLICY}'")),
                "not refused by the policy: {}",
                status.message
            );
            assert!(
                status.message.contains(expected),
                "expected {expected:?} in: {}",
                status.message
            );
        }
        other => panic!("expected the policy to refuse this write ({expected}), got {other:?}"),
    }
}

/// Objects for the policy tests, as the given owner (an AppService) and labels say.
fn object<T: serde::de::DeserializeOwned>(
    kind: &str,
    name: &str,
    owner: Option<&AppService>,
    labelled: bool,
) -> T {
    let mut meta = json!({"name": name});
    if labelled {
        meta["labels"] = json!({common::names::LABEL_MANAGED_BY: common::names::MANAGED_BY});
    }
    if let Some(app) = owner {
        meta["ownerReferences"] = json!([{
            "apiVersion": "platform.example.com/v1alpha1", "kind": "AppService",
            "name": app.metadata.name, "uid": app.metadata.uid, "controller": true,
        }]);
    }
    let body = match kind {
        "Deployment" => json!({
            "metadata": meta,
            "spec": {
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": "c", "image": "registry.example.com/x:v1"}]}
                }
            }
        }),
        "Service" => json!({"metadata": meta, "spec": {"ports": [{"port": 80}]}}),
        "Secret" => json!({"metadata": meta, "stringData": {"k": "v"}}),
        other => panic!("no template for {other}"),
    };
    serde_json::from_value(body).expect("object")
}

/// A client that acts as `user` (the admin impersonating them), as a tenant's kubectl would.
fn impersonating(cp: &harness::ControlPlane, user: &str) -> Client {
    let mut config = cp.admin_config();
    config.auth_info.impersonate = Some(user.to_owned());
    Client::try_from(config).expect("impersonating client")
}

/// `result` is the shard-labels policy's refusal (403, its name and its reason).
fn shard_label_refused<T: std::fmt::Debug>(result: Result<T, kube::Error>, what: &str) {
    match result {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 403, "{what}: {status:?}");
            assert!(
                status.message.contains(&format!(
                    "ValidatingAdmissionPolicy '{CONTROLLER}-shard-labels'"
                )) && status
                    .message
                    .contains("they decide which controller shard writes it"),
                "{what}: not refused by the shard-labels policy: {}",
                status.message
            );
        }
        other => panic!("{what}: expected the shard-labels policy to refuse it, got {other:?}"),
    }
}

/// Whether `result` is the API server's 403.
fn forbidden<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> bool {
    matches!(result, Err(kube::Error::Api(ref s)) if s.code == 403)
}

fn tenant_app(name: &str) -> AppService {
    serde_json::from_value(json!({
        "apiVersion": "platform.example.com/v1beta1", "kind": "AppService",
        "metadata": {"name": name},
        "spec": {"image": "registry.example.com/hello:v1.0.0", "replicas": 1}
    }))
    .unwrap()
}
