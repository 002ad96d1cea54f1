//! The upgrade from the release with only `v1alpha1` to this one, and back, on a real
//! control plane with live AppServices (issue 16, docs/operators/upgrading.md):
//!
//! 1. **Previous release**: the old CRD (`e2e/fixtures/upgrade/appservices-v1alpha1-crd.yaml`,
//!    `v1alpha1` only) with AppServices stored in `v1alpha1` and the children the previous
//!    controller made for them. The previous controller is emulated, not run: its
//!    builders and hash are copied in `upgrade/previous.rs` and checked against what its
//!    own code produced (a golden fixture). Its writes are exactly those: a create of each
//!    child with field manager `appservice-controller`, and the finalizer.
//! 2. **Upgrade**: the new CRD (both versions, `v1beta1` stored) with the conversion
//!    webhook (`/convert` of the real TLS webhook server), then the new controller.
//! 3. **Storage migration** while the controller runs and a user keeps writing, twice.
//! 4. Throughout: each child is written once, and never again. A Service, to re-point its
//!    owner reference at the storage version (same generation, same hash). A Deployment,
//!    because its Pod template gains the security contexts of Pod Security `restricted`:
//!    one apply that also re-points it, a new generation and hash, one rollout (which
//!    the upgrade notes, docs/operators/upgrading.md, announce). Every object reads in both versions, and what
//!    one version cannot express survives a read-edit-write in the other.
//! 5. **Rollback**: the previous controller's view, read in `v1alpha1` through
//!    `/convert`, of objects written in `v1beta1`: it builds the same Services where the
//!    object is expressible in `v1alpha1` and Deployments without the security contexts
//!    (it would write each back once), its writes (children, status) are accepted, and
//!    they do not lose what only `v1beta1` holds.
//! 6. **Forward again and unserve `v1alpha1`**: the new controller re-points what the
//!    previous one wrote; with `v1alpha1` no longer served, AppServices deleted in
//!    background and in foreground take their children with them (the garbage
//!    collector of kube-controller-manager).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "upgrade/previous.rs"]
mod previous;

use controller::subject::Subject;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{v1alpha1, v1beta1};
use harness::{ControlPlane, Options, eventually};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceConversion, CustomResourceDefinition, WebhookClientConfig, WebhookConversion,
};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

const GROUP: &str = "platform.example.com";
const CRD_NAME: &str = "appservices.platform.example.com";

fn init() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

/// What the controllers wrote of every child, by `kind/name`: its generation, its
/// desired hash, the version its owner reference names and when each field manager of
/// ours last wrote it. (Not the resourceVersion: the Deployment controller writes the
/// status of every Deployment as its Pods come and go.)
async fn children(client: &Client, ns: &str) -> BTreeMap<String, Child> {
    let mut all = BTreeMap::new();
    for d in Api::<Deployment>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
    {
        all.insert(format!("deployment/{}", d.name_any()), Child::of(&d));
    }
    for s in Api::<Service>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
    {
        all.insert(format!("service/{}", s.name_any()), Child::of(&s));
    }
    all
}

#[derive(Clone, Debug, PartialEq)]
struct Child {
    generation: Option<i64>,
    hash: Option<String>,
    owner_api_version: Option<String>,
    written: Vec<String>,
}

impl Child {
    fn of<K: kube::Resource>(obj: &K) -> Child {
        let meta = obj.meta();
        Child {
            generation: meta.generation,
            hash: meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(previous::HASH).cloned()),
            owner_api_version: meta
                .owner_references
                .iter()
                .flatten()
                .find(|r| r.controller == Some(true))
                .map(|r| r.api_version.clone()),
            written: meta
                .managed_fields
                .iter()
                .flatten()
                .filter(|m| m.manager.as_deref() == Some(previous::FIELD_MANAGER))
                .map(|m| format!("{:?} {:?}", m.operation, m.time))
                .collect(),
        }
    }
}

/// The `apiVersion` an AppService is stored in, read from etcd.
async fn stored_version(cp: &ControlPlane, ns: &str, name: &str) -> String {
    let stored = cp
        .stored_object(GROUP, "appservices", ns, name)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{ns}/{name} is not in etcd"));
    stored["apiVersion"].as_str().unwrap_or_default().to_owned()
}

async fn stored_versions(client: &Client) -> Vec<String> {
    Api::<CustomResourceDefinition>::all(client.clone())
        .get_status(CRD_NAME)
        .await
        .unwrap()
        .status
        .and_then(|s| s.stored_versions)
        .unwrap_or_default()
}

/// The AppServices of the previous release, as their users wrote them in `v1alpha1`.
fn previous_apps() -> Vec<v1alpha1::AppService> {
    [
        json!({"metadata": {"name": "minimal"},
               "spec": {"image": "registry.example.com/minimal:v1"}}),
        json!({"metadata": {"name": "checkout", "labels": {"team": "payments"}},
               "spec": {"image": "registry.example.com/checkout:v3.4.0", "replicas": 3, "port": 9090,
                        "env": [{"name": "LOG_LEVEL", "value": "info"},
                                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "checkout", "key": "token"}}}],
                        "resources": {"requests": {"cpu": "100m"}, "limits": {"memory": "256Mi"}}}}),
        // A class without a database: meaningless in v1alpha1, not expressible in v1beta1
        // (kept in an annotation there).
        json!({"metadata": {"name": "legacy"},
               "spec": {"image": "registry.example.com/legacy:v0.9", "port": 80,
                        "database": {"enabled": false, "class": "standard"}}}),
    ]
    .into_iter()
    .map(|mut v| {
        v["apiVersion"] = json!("platform.example.com/v1alpha1");
        v["kind"] = json!("AppService");
        serde_json::from_value(v).unwrap()
    })
    .collect()
}

/// What the previous controller did for a stored AppService: the finalizer, then a
/// create of each child.
async fn previous_controller_converges(client: &Client, ns: &str, app: &v1alpha1::AppService) {
    let apps: Api<v1alpha1::AppService> = Api::namespaced(client.clone(), ns);
    let name = app.name_any();
    let app = apps
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["platform.example.com/cleanup"]}})),
        )
        .await
        .unwrap();
    let params = PostParams {
        field_manager: Some(previous::FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    };
    Api::<Deployment>::namespaced(client.clone(), ns)
        .create(&params, &previous::deployment(&app))
        .await
        .unwrap();
    Api::<Service>::namespaced(client.clone(), ns)
        .create(&params, &previous::service(&app))
        .await
        .unwrap();
}

/// A client's read-edit-write of one object in the version of `api`, retried on a
/// conflict (the controller writes status and the finalizer meanwhile).
async fn edit<K, F>(api: &Api<K>, name: &str, mut change: F) -> K
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
    F: FnMut(&mut K),
{
    for _ in 0..20 {
        let mut object = api.get(name).await.unwrap();
        change(&mut object);
        match api.replace(name, &PostParams::default(), &object).await {
            Ok(written) => return written,
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => panic!("writing {name}: {e}"),
        }
    }
    panic!("{name}: conflicts on every attempt");
}

/// Runs the kubectl of the test assets against `cp` (without blocking the runtime that
/// serves the webhook): `(success, stdout, stderr)`.
async fn try_kubectl(cp: &ControlPlane, args: &[&str]) -> (bool, String, String) {
    let output = cp
        .command(cp.bin_dir().unwrap().join("kubectl"))
        .args(args)
        .output()
        .await
        .unwrap();
    harness::process::outcome(&output)
}

/// kubectl's stdout, failing on a non-zero exit.
async fn kubectl(cp: &ControlPlane, args: &[&str]) -> String {
    let (ok, stdout, stderr) = try_kubectl(cp, args).await;
    assert!(ok, "kubectl {args:?}: {stderr}");
    stdout
}

#[test]
fn previous_children_match_the_golden_fixture() {
    // Made by the previous release's own desired_deployment/desired_service/set_hash.
    let golden: Value =
        serde_json::from_str(include_str!("../fixtures/upgrade/previous-children.json")).unwrap();
    let cases = golden["cases"].as_array().unwrap();
    assert!(cases.len() >= 4);
    for case in cases {
        let app: v1alpha1::AppService = serde_json::from_value(case["appService"].clone()).unwrap();
        assert_eq!(
            serde_json::to_value(previous::deployment(&app)).unwrap(),
            case["deployment"],
            "{}",
            app.name_any()
        );
        assert_eq!(
            serde_json::to_value(previous::service(&app)).unwrap(),
            case["service"],
            "{}",
            app.name_any()
        );
        // And the current controller builds the very same children from the object
        // converted to v1beta1, but for the owner reference, which names the storage
        // version, and the Pod template's security contexts and spread over nodes, which
        // the previous release did not set: the upgrade re-points each Service with one patch (same hash) and
        // applies each Deployment once (another hash: a rollout).
        let hub = common::conversion::to_v1beta1(&app);
        let as_previous = |mut v: Value| {
            assert_eq!(
                v["metadata"]["ownerReferences"][0]["apiVersion"],
                "platform.example.com/v1beta1"
            );
            v["metadata"]["ownerReferences"][0]["apiVersion"] =
                json!("platform.example.com/v1alpha1");
            v
        };
        // What the previous release gave the Pods of an AppService with a database: the
        // URL from its Secret, nothing else (the database step adds more today).
        let added = controller::external::PodAdditions {
            env: hub
                .spec
                .database_class()
                .map(|_| {
                    serde_json::from_value(json!({"name": "DATABASE_URL", "valueFrom": {
                        "secretKeyRef": {"name": format!("{}-database", app.name_any()),
                                         "key": "DATABASE_URL", "optional": false}}}))
                    .unwrap()
                })
                .into_iter()
                .collect(),
            ..Default::default()
        };
        let d = controller::desired::desired_deployment(
            &Subject::of(&hub).expect("the AppService has its identity"),
            &added,
        );
        let mut current = as_previous(serde_json::to_value(&d).unwrap());
        let pod = &mut current["spec"]["template"]["spec"];
        assert_eq!(
            pod.as_object_mut().unwrap().remove("securityContext"),
            Some(json!({"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}}))
        );
        let spread = pod
            .as_object_mut()
            .unwrap()
            .remove("topologySpreadConstraints")
            .expect("the spread over nodes");
        assert_eq!(spread[0]["topologyKey"], "kubernetes.io/hostname");
        assert_eq!(spread[0]["whenUnsatisfiable"], "ScheduleAnyway");
        assert_eq!(
            pod["containers"][0]
                .as_object_mut()
                .unwrap()
                .remove("securityContext"),
            Some(json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}))
        );
        let mut previous = case["deployment"].clone();
        let previous_hash = previous["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("annotations");
        assert_eq!(current, previous, "{}", app.name_any());
        assert_ne!(
            previous_hash,
            Some(json!({previous::HASH: controller::drift::desired_hash(&d).unwrap()})),
            "the new template must be applied"
        );
        let mut s = controller::desired::desired_service(
            &Subject::of(&hub).expect("the AppService has its identity"),
        );
        let hash = controller::drift::desired_hash(&s).unwrap();
        controller::drift::set_hash(&mut s.metadata, hash);
        assert_eq!(
            as_previous(serde_json::to_value(&s).unwrap()),
            case["service"]
        );
    }
}

// The webhook server, the controller and the test share this runtime: several threads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_re_point_migrate_roll_back_and_unserve_v1alpha1() {
    init();
    let started = Instant::now();
    // Full: the garbage collector takes the children at the end.
    let cp = ControlPlane::start(Options::full()).await.unwrap();
    let _logs = cp.log_guard();
    let client = cp.client();
    let ns_guard = cp.namespace().await.unwrap();
    let ns = ns_guard.name().to_owned();

    // 1. The previous release: its CRD, its objects, its children.
    let old_crd = harness::load_crd(
        &harness::assets::workspace_root()
            .join("e2e/fixtures/upgrade/appservices-v1alpha1-crd.yaml"),
    )
    .unwrap();
    assert_eq!(old_crd.spec.versions.len(), 1);
    cp.replace_crd(&old_crd).await.unwrap();
    let alpha: Api<v1alpha1::AppService> = Api::namespaced(client.clone(), &ns);
    // The Secret `checkout` takes its token from: its Pods could not start without it.
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "checkout"}, "stringData": {"token": "t0k3n"},
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    for app in previous_apps() {
        let stored = alpha.create(&PostParams::default(), &app).await.unwrap();
        previous_controller_converges(&client, &ns, &stored).await;
    }
    for app in previous_apps() {
        assert_eq!(
            stored_version(&cp, &ns, &app.name_any()).await,
            "platform.example.com/v1alpha1"
        );
    }
    let before = children(&client, &ns).await;
    assert_eq!(before.len(), 6, "{before:?}");
    // The migration refuses to run against a CRD that does not store v1beta1.
    let refused = controller::migrate::run(client.clone()).await;
    assert!(
        matches!(
            refused,
            Err(controller::migrate::Error::WrongStorageVersion { .. })
        ),
        "{refused:?}"
    );

    // 2. Upgrade: the webhook first (it serves /convert), then the CRD with its
    //    conversion in the same write, then the controller.
    let dir = tempfile::tempdir().unwrap();
    let (ca, serving) = harness::webhook_tls().unwrap();
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    serving.write(&cert, &key).unwrap();
    // As the chart runs it: /scale writes are judged on its AppService watch.
    let mut webhook_config = webhook::config::Config::local(cert, key, None);
    webhook_config.watch_appservices = true;
    let webhook = webhook::server::start_with_client(&webhook_config, Some(cp.client()))
        .await
        .unwrap();
    let base = format!("https://{}", webhook.tls_addr());
    let mut new_crd = harness::load_crd(&harness::appservice_crd_path()).unwrap();
    new_crd.spec.conversion = Some(CustomResourceConversion {
        strategy: "Webhook".to_owned(),
        webhook: Some(WebhookConversion {
            client_config: Some(WebhookClientConfig {
                url: Some(format!("{base}/convert")),
                ca_bundle: Some(k8s_openapi::ByteString(ca.cert_pem().as_bytes().to_vec())),
                service: None,
            }),
            conversion_review_versions: vec!["v1".to_owned()],
        }),
    });
    cp.apply_crd(&new_crd).await.unwrap();
    cp.use_conversion_webhook(&base, ca.cert_pem(), &ns)
        .await
        .unwrap();
    let admission = cp
        .register_webhooks(&ns, &base, ca.cert_pem())
        .await
        .unwrap();

    let metrics = Arc::new(controller::metrics::Metrics::default());
    let config = controller::Config::for_namespace(&ns);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (recording, requests) = harness::recording(client.clone(), &ns);
    let running = tokio::spawn(controller::run_with(
        config,
        recording,
        controller::Hooks {
            metrics: metrics.clone(),
            ..controller::Hooks::default()
        },
        async move {
            let _ = stopped.await;
        },
    ));

    let beta: Api<v1beta1::AppService> = Api::namespaced(client.clone(), &ns);
    // Every object reconciled by the new controller (its status names this generation).
    eventually(
        "the new controller to reconcile every AppService",
        Duration::from_secs(30),
        || {
            let beta = beta.clone();
            async move {
                let list = beta.list(&ListParams::default()).await.ok()?;
                (list.items.len() == 3
                    && list.items.iter().all(|a| {
                        a.status.as_ref().and_then(|s| s.observed_generation)
                            == a.metadata.generation
                    }))
                .then_some(())
            }
        },
    )
    .await
    .unwrap();
    // Each child re-pointed at the storage version, which stays served: a Service with
    // one patch and nothing else (the same generation and hash), a Deployment with the
    // one apply that gives it the restricted Pod template (a new generation and hash).
    let repointed = eventually(
        "every child re-pointed at v1beta1",
        Duration::from_secs(30),
        || {
            let client = client.clone();
            let ns = ns.clone();
            async move {
                let now = children(&client, &ns).await;
                now.values()
                    .all(|c| c.owner_api_version.as_deref() == Some("platform.example.com/v1beta1"))
                    .then_some(now)
            }
        },
    )
    .await
    .unwrap();
    for (child, was) in &before {
        let now = &repointed[child];
        if child.starts_with("service/") {
            assert_eq!(now.generation, was.generation, "{child}: a new generation");
            assert_eq!(now.hash, was.hash, "{child}: another hash");
        } else {
            assert_eq!(
                now.generation,
                was.generation.map(|g| g + 1),
                "{child}: not one new generation"
            );
            assert_ne!(now.hash, was.hash, "{child}: the previous template");
        }
        assert_eq!(
            was.owner_api_version.as_deref(),
            Some("platform.example.com/v1alpha1")
        );
    }
    for d in Api::<Deployment>::namespaced(client.clone(), &ns)
        .list(&ListParams::default())
        .await
        .unwrap()
    {
        let name = d.name_any();
        let pod = d.spec.template.spec.unwrap();
        assert_eq!(
            pod.security_context.and_then(|c| c.run_as_non_root),
            Some(true),
            "{name}"
        );
    }
    // One apply of each child of the three AppServices: the new controller's own.
    let applies = |resource: &str| {
        let mut writes = requests.writes_to(resource);
        writes.sort();
        writes
    };
    let one_apply_each = |group: &str, resource: &str| {
        ["checkout", "legacy", "minimal"]
            .map(|name| format!("PATCH {group}/namespaces/{}/{resource}/{name}", &*ns))
            .to_vec()
    };
    assert_eq!(
        applies("deployments"),
        one_apply_each("/apis/apps/v1", "deployments")
    );
    assert_eq!(applies("services"), one_apply_each("/api/v1", "services"));
    let before = repointed;
    // The one rollout finished and reported: from here on the controller has nothing
    // to write, so every resourceVersion that moves below is the migration's or the
    // user's.
    eventually(
        "every AppService Ready after its rollout",
        Duration::from_secs(60),
        || {
            let beta = beta.clone();
            async move {
                let list = beta.list(&ListParams::default()).await.ok()?;
                list.items
                    .iter()
                    .all(|a| {
                        a.status.as_ref().is_some_and(|s| {
                            s.observed_generation == a.metadata.generation
                                && s.conditions
                                    .iter()
                                    .any(|c| c.type_ == "Ready" && c.status == "True")
                        })
                    })
                    .then_some(())
            }
        },
    )
    .await
    .unwrap();
    // The finalizer on every AppService, as the previous controller left it.
    for app in beta.list(&ListParams::default()).await.unwrap() {
        assert!(
            app.finalizers()
                .iter()
                .any(|f| f == common::names::FINALIZER),
            "{}: {:?}",
            app.name_any(),
            app.finalizers()
        );
    }

    // 3. Storage migration while the controller runs and a user keeps annotating every
    //    object in v1alpha1 (writes that conflict with the migration's).
    let user = {
        let alpha = alpha.clone();
        tokio::spawn(async move {
            for round in 0..10 {
                for app in ["minimal", "checkout", "legacy"] {
                    let patch = json!({"metadata": {"annotations": {"example.com/round": round.to_string()}}});
                    alpha
                        .patch(app, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .unwrap();
                }
            }
        })
    };
    let first = controller::migrate::run(client.clone()).await.unwrap();
    user.await.unwrap();
    assert_eq!(first.rewritten, 3, "{first:?}");
    assert_eq!(first.stored_versions, ["v1beta1"]);
    assert_eq!(stored_versions(&client).await, ["v1beta1"]);
    for app in ["minimal", "checkout", "legacy"] {
        assert_eq!(
            stored_version(&cp, &ns, app).await,
            "platform.example.com/v1beta1",
            "{app}"
        );
        let read = alpha.get(app).await.unwrap();
        assert_eq!(read.annotations()["example.com/round"], "9", "{app}");
    }
    // Safe to run twice: the second run writes nothing (no resourceVersion moves).
    let versions = |list: Vec<v1beta1::AppService>| {
        list.into_iter()
            .map(|a| (a.name_any(), a.resource_version()))
            .collect::<BTreeMap<_, _>>()
    };
    let settled = versions(beta.list(&ListParams::default()).await.unwrap().items);
    let second = controller::migrate::run(client.clone()).await.unwrap();
    assert_eq!(second.stored_versions, ["v1beta1"]);
    assert_eq!(
        versions(beta.list(&ListParams::default()).await.unwrap().items),
        settled,
        "a second migration wrote an object"
    );
    // The controller saw every rewrite and still wrote no child: one more event per
    // AppService, after all of the migration's, and the reconcile it causes.
    for app in ["minimal", "checkout", "legacy"] {
        let reconciled = metrics.reconcile_count();
        let patch = json!({"metadata": {"labels": {"example.com/after-migration": "true"}}});
        beta.patch(app, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        eventually(
            &format!("a reconcile of {app} after the migration"),
            Duration::from_secs(30),
            || async { (metrics.reconcile_count() > reconciled).then_some(()) },
        )
        .await
        .unwrap();
    }
    assert_eq!(
        children(&client, &ns).await,
        before,
        "the migration caused a child write"
    );
    assert_eq!(
        applies("deployments"),
        one_apply_each("/apis/apps/v1", "deployments"),
        "the migration caused a child write"
    );
    assert_eq!(applies("services"), one_apply_each("/api/v1", "services"));

    // 4. Both versions, both ways. What v1alpha1 cannot say survives a v1alpha1 edit...
    let mut two_ports: v1beta1::AppService = serde_json::from_value(json!({
        "apiVersion": "platform.example.com/v1beta1", "kind": "AppService",
        "metadata": {"name": "dns"},
        "spec": {"image": "registry.example.com/dns:v2", "ports": [
            {"name": "http", "port": 8053},
            {"name": "dns", "port": 53, "protocol": "UDP"}]}
    }))
    .unwrap();
    two_ports = beta
        .create(&PostParams::default(), &two_ports)
        .await
        .unwrap();
    edit(&alpha, "dns", |as_alpha| {
        assert_eq!(as_alpha.spec.port, Some(8053));
        as_alpha.spec.replicas = Some(2);
        as_alpha.spec.image = "registry.example.com/dns:v2.1".to_owned();
    })
    .await;
    let read = beta.get("dns").await.unwrap();
    assert_eq!(
        read.spec.ports, two_ports.spec.ports,
        "a v1alpha1 edit lost a port"
    );
    assert_eq!(read.spec.replicas, Some(2));
    assert_eq!(read.spec.image, "registry.example.com/dns:v2.1");
    assert_eq!(
        stored_version(&cp, &ns, "dns").await,
        "platform.example.com/v1beta1"
    );
    // ... and what v1beta1 cannot say survives a v1beta1 edit.
    edit(&beta, "legacy", |legacy| {
        assert_eq!(legacy.spec.database, None);
        legacy.spec.replicas = Some(2);
    })
    .await;
    let legacy_alpha = alpha.get("legacy").await.unwrap();
    assert_eq!(
        serde_json::to_value(&legacy_alpha.spec.database).unwrap(),
        json!({"enabled": false, "class": "standard"})
    );
    assert_eq!(legacy_alpha.spec.replicas, Some(2));
    // The controller applied those two edits, and wrote no other child.
    let dns_deployment = eventually(
        "the dns Deployment with both ports",
        Duration::from_secs(20),
        || {
            let api: Api<Deployment> = Api::namespaced(client.clone(), &ns);
            async move {
                let d = api.get_opt("dns").await.ok()??;
                let ports = d.spec.template.spec.as_ref()?.containers[0].ports.clone()?;
                (ports.len() == 2 && d.spec.replicas == Some(2)).then_some(d)
            }
        },
    )
    .await
    .unwrap();
    eventually("legacy scaled to 2", Duration::from_secs(20), || {
        let api: Api<Deployment> = Api::namespaced(client.clone(), &ns);
        async move { (api.get("legacy").await.ok()?.spec.replicas == Some(2)).then_some(()) }
    })
    .await
    .unwrap();
    let after = children(&client, &ns).await;
    for (child, version) in &before {
        if child != "deployment/legacy" {
            assert_eq!(after.get(child), Some(version), "{child} was written");
        }
    }

    // kubectl reads and explains both versions.
    let table = kubectl(&cp, &["get", "appsrv", "-n", &ns]).await;
    for expected in [
        "NAME", "READY", "REPLICAS", "ENDPOINT", "checkout", "dns", "legacy", "minimal",
    ] {
        assert!(table.contains(expected), "{expected} missing from\n{table}");
    }
    let old_port = kubectl(
        &cp,
        &[
            "get",
            &format!("appservices.v1alpha1.{GROUP}"),
            "dns",
            "-n",
            &ns,
            "-o",
            "jsonpath={.spec.port}",
        ],
    )
    .await;
    assert_eq!(old_port, "8053");
    let new_ports = kubectl(
        &cp,
        &[
            "get",
            &format!("appservices.v1beta1.{GROUP}"),
            "dns",
            "-n",
            &ns,
            "-o",
            "jsonpath={.spec.ports[*].name}",
        ],
    )
    .await;
    assert_eq!(new_ports, "http dns");
    for (version, field, expected) in [
        (
            "v1alpha1",
            "appservices.spec.port",
            "TCP port the container listens on",
        ),
        (
            "v1beta1",
            "appservices.spec.ports",
            "Ports the container listens on",
        ),
    ] {
        // The OpenAPI document of a changed CRD is published shortly after the change.
        let api_version = format!("--api-version={GROUP}/{version}");
        eventually(
            &format!("kubectl explain {field} in {version}"),
            Duration::from_secs(20),
            || {
                let api_version = api_version.clone();
                let cp = &cp;
                async move {
                    let (ok, text, _) = try_kubectl(cp, &["explain", field, &api_version]).await;
                    (ok && text.contains(expected)).then_some(())
                }
            },
        )
        .await
        .unwrap();
    }

    // 5. Rollback: the new controller stops; the previous one reads v1alpha1 through
    //    /convert. For every object v1alpha1 can express, it builds exactly the live
    //    Service (same hash), and a Deployment without the security contexts: it would
    //    write each Deployment once, back to the previous Pod template.
    stop.send(()).unwrap();
    running.await.unwrap().unwrap();
    let mut writes = Vec::new();
    for app in alpha.list(&ListParams::default()).await.unwrap() {
        let name = app.name_any();
        let live_d = Api::<Deployment>::namespaced(client.clone(), &ns)
            .get(&name)
            .await
            .unwrap();
        let live_s = Api::<Service>::namespaced(client.clone(), &ns)
            .get(&name)
            .await
            .unwrap();
        let want_d = previous::deployment(&app);
        let want_s = previous::service(&app);
        if live_d.annotations().get(previous::HASH) != want_d.annotations().get(previous::HASH) {
            writes.push(format!("deployment/{name}"));
        }
        if live_s.annotations().get(previous::HASH) != want_s.annotations().get(previous::HASH) {
            writes.push(format!("service/{name}"));
        }
    }
    // Every Deployment, and the Service of the one object with two ports, which v1alpha1
    // cannot express.
    assert_eq!(
        writes,
        [
            "deployment/checkout",
            "deployment/dns",
            "service/dns",
            "deployment/legacy",
            "deployment/minimal"
        ]
    );
    // The previous controller's writes for it: a server-side apply of each child (one
    // port), then, as its drift check finds the port it does not know kept by the merge,
    // its repair: a JSON patch replacing the whole port list it owns. Then a status in
    // v1alpha1. All accepted, and the object keeps both ports for when the new
    // controller is back.
    let dns = alpha.get("dns").await.unwrap();
    let apply = PatchParams::apply(previous::FIELD_MANAGER).force();
    let deployments = Api::<Deployment>::namespaced(client.clone(), &ns);
    let services = Api::<Service>::namespaced(client.clone(), &ns);
    let want_d = previous::deployment(&dns);
    let want_s = previous::service(&dns);
    deployments
        .patch("dns", &apply, &Patch::Apply(&want_d))
        .await
        .unwrap();
    services
        .patch("dns", &apply, &Patch::Apply(&want_s))
        .await
        .unwrap();
    let repair = |path: &str, value: Value| -> Patch<()> {
        Patch::Json(
            serde_json::from_value(json!([{"op": "replace", "path": path, "value": value}]))
                .unwrap(),
        )
    };
    deployments
        .patch(
            "dns",
            &PatchParams::default(),
            &repair(
                "/spec/template/spec/containers/0/ports",
                serde_json::to_value(
                    &want_d.spec.template.spec.as_ref().unwrap().containers[0].ports,
                )
                .unwrap(),
            ),
        )
        .await
        .unwrap();
    services
        .patch(
            "dns",
            &PatchParams::default(),
            &repair(
                "/spec/ports",
                serde_json::to_value(&want_s.spec.as_ref().unwrap().ports).unwrap(),
            ),
        )
        .await
        .unwrap();
    let status = json!({"status": {
        "observedGeneration": dns.metadata.generation, "readyReplicas": 0,
        "selector": "app.kubernetes.io/instance=dns,app.kubernetes.io/managed-by=appservice-operator",
        "endpoint": format!("http://dns.{ns}.svc:8053"),
        "conditions": [{"type": "Ready", "status": "False", "reason": "Progressing",
                        "message": "0/2 replicas ready", "observedGeneration": dns.metadata.generation,
                        "lastTransitionTime": "2026-11-30T12:00:00Z"}]}});
    alpha
        .patch_status("dns", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let read = beta.get("dns").await.unwrap();
    assert_eq!(read.spec.ports, two_ports.spec.ports);
    let read_status = read.status.unwrap();
    assert_eq!(
        read_status.endpoint.as_deref(),
        Some(&*format!("http://dns.{ns}.svc:8053"))
    );
    assert_eq!(read_status.observed_generation, dns.metadata.generation);
    // Its apply took effect: the Deployment is back to the one port it knows.
    let rolled_back = Api::<Deployment>::namespaced(client.clone(), &ns)
        .get("dns")
        .await
        .unwrap();
    assert_ne!(
        rolled_back.resource_version(),
        dns_deployment.resource_version()
    );
    let ports = rolled_back.spec.template.spec.unwrap().containers[0]
        .ports
        .clone()
        .unwrap();
    assert_eq!(ports.len(), 1, "{ports:?}");

    // 6. Forward again, then the last step of the migration: v1alpha1 no longer served.
    //    The new controller re-points what the previous one wrote (the dns children) and
    //    puts its second port and its security contexts back; once v1alpha1 is unserved, deleting AppServices (in
    //    background and in foreground) lets the garbage collector take every child.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(controller::run_with(
        controller::Config::for_namespace(&ns),
        client.clone(),
        controller::Hooks::default(),
        async move {
            let _ = stopped.await;
        },
    ));
    eventually(
        "every child on v1beta1, dns with both ports and restricted again",
        Duration::from_secs(30),
        || {
            let client = client.clone();
            let ns = ns.clone();
            async move {
                let all = children(&client, &ns).await;
                let pod = Api::<Deployment>::namespaced(client.clone(), &ns)
                    .get("dns")
                    .await
                    .ok()?
                    .spec
                    .template
                    .spec?;
                let ports = pod.containers[0].ports.clone()?.len();
                let restricted = pod.security_context.and_then(|c| c.run_as_non_root);
                (ports == 2
                    && restricted == Some(true)
                    && all.values().all(|c| {
                        c.owner_api_version.as_deref() == Some("platform.example.com/v1beta1")
                    }))
                .then_some(())
            }
        },
    )
    .await
    .unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut crd = crds.get(CRD_NAME).await.unwrap();
    for version in &mut crd.spec.versions {
        if version.name == "v1alpha1" {
            version.served = false;
        }
    }
    crds.replace(CRD_NAME, &PostParams::default(), &crd)
        .await
        .unwrap();
    eventually("v1alpha1 no longer served", Duration::from_secs(30), || {
        let alpha = alpha.clone();
        async move {
            matches!(alpha.list(&ListParams::default()).await, Err(kube::Error::Api(s)) if s.code == 404)
                .then_some(())
        }
    })
    .await
    .unwrap();
    collector_rediscovered(&cp, &client, &ns).await;
    for (app, policy) in [
        ("minimal", kube::api::PropagationPolicy::Background),
        ("checkout", kube::api::PropagationPolicy::Background),
        ("legacy", kube::api::PropagationPolicy::Foreground),
        ("dns", kube::api::PropagationPolicy::Foreground),
    ] {
        let params = kube::api::DeleteParams {
            propagation_policy: Some(policy),
            ..Default::default()
        };
        beta.delete(app, &params).await.unwrap();
    }
    eventually(
        "the AppServices gone and their children collected",
        Duration::from_secs(90),
        || {
            let client = client.clone();
            let ns = ns.clone();
            let beta = beta.clone();
            async move {
                let apps = beta.list(&ListParams::default()).await.ok()?;
                (apps.items.is_empty() && children(&client, &ns).await.is_empty()).then_some(())
            }
        },
    )
    .await
    .unwrap();
    stop.send(()).unwrap();
    running.await.unwrap().unwrap();

    admission.remove(cp.client()).await.unwrap();
    webhook.shutdown().await.unwrap();
    ns_guard.cleanup().await.unwrap();
    eprintln!("upgrade test took {:?}", started.elapsed());
}

/// Returns once kube-controller-manager's garbage collector has rediscovered the API
/// after the CRD changed (its discovery and monitors resync every 30 s; until then it
/// may still watch a version that is gone): a ConfigMap owned by an object of a CRD
/// created now is collected only once the collector knows that CRD's kind.
async fn collector_rediscovered(cp: &ControlPlane, client: &Client, ns: &str) {
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": "probes.gc-probe.example.com"},
        "spec": {
            "group": "gc-probe.example.com",
            "names": {"plural": "probes", "singular": "probe", "kind": "Probe", "listKind": "ProbeList"},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": true, "storage": true,
                          "schema": {"openAPIV3Schema": {"type": "object"}}}]
        }
    }))
    .unwrap();
    cp.apply_crd(&crd).await.unwrap();
    let dependent: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "gc-probe", "ownerReferences": [{
            "apiVersion": "gc-probe.example.com/v1", "kind": "Probe", "name": "gone",
            "uid": "00000000-0000-0000-0000-000000000000"
        }]}
    }))
    .unwrap();
    let configmaps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), ns);
    configmaps
        .create(&PostParams::default(), &dependent)
        .await
        .unwrap();
    eventually(
        "the garbage collector to know a new kind",
        Duration::from_secs(120),
        || {
            let configmaps = configmaps.clone();
            async move {
                configmaps
                    .get_opt("gc-probe")
                    .await
                    .ok()?
                    .is_none()
                    .then_some(())
            }
        },
    )
    .await
    .unwrap();
}
