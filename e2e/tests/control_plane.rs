//! The harness against a real etcd + kube-apiserver: the CRD is served and its schema
//! defaults and CEL rules are enforced by the API server itself; server-side apply,
//! the status and scale subresources, clients for other users, webhook registration,
//! and that components do not outlive their control plane.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use common::testing::{spec, written};
use common::{AppPort, AppService, DatabaseSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The message of an API error, failing the test if the call succeeded.
fn rejection<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.message),
        other => panic!("expected the API server to reject the request, got {other:?}"),
    }
}

#[tokio::test]
async fn crd_is_established_and_served_with_its_subresources() -> TestResult {
    let cp = harness::shared().await?;
    let _logs = cp.log_guard();
    let crds: Api<CustomResourceDefinition> = Api::all(cp.client());
    let crd = crds.get("appservices.platform.example.com").await?;
    let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
    assert!(
        conditions
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True"),
        "{conditions:?}"
    );

    // Discovery, as kubectl sees it.
    let discovery = kube::Discovery::new(cp.client()).run().await?;
    let (resource, caps) = discovery
        .groups()
        .find(|g| g.name() == "platform.example.com")
        .and_then(|g| g.recommended_kind("AppService"))
        .expect("AppService is discoverable");
    assert_eq!(resource.plural, "appservices");
    // The preferred (and stored) version; v1alpha1 is still served.
    assert_eq!(resource.version, "v1beta1");
    let subresources: Vec<_> = caps
        .subresources
        .iter()
        .map(|(r, _)| r.plural.clone())
        .collect();
    assert!(
        subresources.iter().any(|s| s == "status") && subresources.iter().any(|s| s == "scale"),
        "{subresources:?}"
    );
    Ok(())
}

#[tokio::test]
async fn an_appservice_is_created_read_back_and_defaulted_by_the_schema() -> TestResult {
    let cp = harness::shared().await?;
    let ns = cp.namespace().await?;
    let api: Api<AppService> = Api::namespaced(cp.client(), &ns);
    api.create(
        &PostParams::default(),
        &written("checkout", spec("registry.example.com/checkout:v3.4.0")),
    )
    .await?;
    let read = api.get("checkout").await?;
    assert_eq!(read.spec.image, "registry.example.com/checkout:v3.4.0");
    // Defaults come from the CRD's structural schema, applied by the API server.
    assert_eq!(read.spec.replicas, Some(1));
    assert_eq!(read.spec.ports, vec![AppPort::http(8080)]);
    assert_eq!(read.metadata.generation, Some(1));

    let listed = api.list(&ListParams::default()).await?;
    assert_eq!(listed.items.len(), 1);
    Ok(())
}

#[tokio::test]
async fn a_database_without_class_is_rejected() -> TestResult {
    let cp = harness::shared().await?;
    let ns = cp.namespace().await?;
    let api: Api<AppService> = Api::namespaced(cp.client(), &ns);
    let mut bad = spec("registry.example.com/db:v1");
    bad.database = Some(DatabaseSpec {
        class: String::new(),
    });
    let (code, message) = rejection(
        api.create(&PostParams::default(), &written("db", bad))
            .await,
    );
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains("spec.database.class"),
        "field path: {message}"
    );
    Ok(())
}

#[tokio::test]
async fn schema_bounds_are_enforced() -> TestResult {
    let cp = harness::shared().await?;
    let ns = cp.namespace().await?;
    let api: Api<AppService> = Api::namespaced(cp.client(), &ns);
    let mut bad = spec("registry.example.com/app:v1");
    bad.ports = vec![AppPort::http(70000)];
    bad.replicas = Some(-1);
    let (code, message) = rejection(
        api.create(&PostParams::default(), &written("bounds", bad))
            .await,
    );
    assert_eq!(code, 422, "{message}");
    assert!(message.contains("spec.ports[0].port"), "{message}");
    assert!(message.contains("spec.replicas"), "{message}");
    Ok(())
}

#[tokio::test]
async fn a_name_with_a_dot_is_rejected() -> TestResult {
    let cp = harness::shared().await?;
    let ns = cp.namespace().await?;
    let api: Api<AppService> = Api::namespaced(cp.client(), &ns);
    let (code, message) = rejection(
        api.create(
            &PostParams::default(),
            &written("web.v2", spec("registry.example.com/web:v2")),
        )
        .await,
    );
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains("metadata.name must be a DNS-1035 label"),
        "{message}"
    );
    Ok(())
}

#[tokio::test]
async fn database_class_cannot_change_while_enabled() -> TestResult {
    let cp = harness::shared().await?;
    let ns = cp.namespace().await?;
    let api: Api<AppService> = Api::namespaced(cp.client(), &ns);
    let mut with_db = spec("registry.example.com/shop:v1");
    with_db.database = Some(DatabaseSpec {
        class: "small".into(),
    });
    api.create(&PostParams::default(), &written("shop", with_db))
        .await?;

    let change = json!({"spec": {"database": {"class": "large"}}});
    let (code, message) = rejection(
        api.patch("shop", &PatchParams::default(), &Patch::Merge(&change))
            .await,
    );
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains("database.class is immutable while a database is requested"),
        "{message}"
    );

    // Removing the database first, then requesting another class, is allowed.
    let remove = json!({"spec": {"database": null}});
    api.patch("shop", &PatchParams::default(), &Patch::Merge(&remove))
        .await?;
    assert_eq!(api.get("shop").await?.spec.database_class(), None);
    api.patch("shop", &PatchParams::default(), &Patch::Merge(&change))
        .await?;
    assert_eq!(api.get("shop").await?.spec.database_class(), Some("large"));
    Ok(())
}

#[tokio::test]
async fn server_side_apply_and_the_status_subresource_work() -> TestResult {
    let cp = harness::shared().await?;
    let ns = cp.namespace().await?;
    let api: Api<AppService> = Api::namespaced(cp.client(), &ns);
    let ssa = PatchParams::apply("appservice-tests-user").force();
    let desired = json!({
        "apiVersion": "platform.example.com/v1beta1",
        "kind": "AppService",
        "metadata": {"name": "web"},
        "spec": {"image": "registry.example.com/web:v1", "replicas": 3},
    });
    let created = api.patch("web", &ssa, &Patch::Apply(&desired)).await?;
    assert_eq!(created.spec.replicas, Some(3));
    let managers: Vec<_> = created
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert!(
        managers.iter().any(|m| m == "appservice-tests-user"),
        "{managers:?}"
    );

    // Re-applying the same intent is a no-op: the generation does not move.
    let again = api.patch("web", &ssa, &Patch::Apply(&desired)).await?;
    assert_eq!(again.metadata.generation, created.metadata.generation);

    // Status goes through the status subresource, with its own field manager...
    let status = json!({
        "apiVersion": "platform.example.com/v1beta1",
        "kind": "AppService",
        "status": {
            "observedGeneration": again.metadata.generation,
            "readyReplicas": 2,
            "selector": "app.kubernetes.io/instance=web",
            "conditions": [{
                "type": "Ready", "status": "False", "reason": "Progressing",
                "message": "2/3 replicas ready", "lastTransitionTime": "2026-01-01T00:00:00Z",
                "observedGeneration": again.metadata.generation,
            }],
        },
    });
    let with_status = api
        .patch_status(
            "web",
            &PatchParams::apply(common::names::FIELD_MANAGER).force(),
            &Patch::Apply(&status),
        )
        .await?;
    let observed = with_status.status.clone().unwrap_or_default();
    assert_eq!(observed.ready_replicas, Some(2));
    assert_eq!(observed.conditions.len(), 1);
    // ...and does not bump the generation or touch the spec.
    assert_eq!(with_status.metadata.generation, again.metadata.generation);
    assert_eq!(with_status.spec.replicas, Some(3));

    // Writing status through the main resource is ignored.
    let sneaky = json!({"status": {"readyReplicas": 99}});
    api.patch("web", &PatchParams::default(), &Patch::Merge(&sneaky))
        .await?;
    let read = api.get("web").await?;
    assert_eq!(read.status.and_then(|s| s.ready_replicas), Some(2));

    // The scale subresource reads spec.replicas and status.readyReplicas.
    let scale = api.get_scale("web").await?;
    assert_eq!(scale.spec.and_then(|s| s.replicas), Some(3));
    assert_eq!(scale.status.map(|s| s.replicas), Some(2));
    api.patch_scale(
        "web",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"replicas": 5}})),
    )
    .await?;
    assert_eq!(api.get("web").await?.spec.replicas, Some(5));
    Ok(())
}

async fn can_list_appservices(client: kube::Client, ns: &str) -> Result<bool, kube::Error> {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some("platform.example.com".into()),
                resource: Some("appservices".into()),
                verb: Some("list".into()),
                namespace: Some(ns.to_owned()),
                ..ResourceAttributes::default()
            }),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    };
    let api: Api<SelfSubjectAccessReview> = Api::all(client);
    let answer = api.create(&PostParams::default(), &review).await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

#[tokio::test]
async fn users_from_client_certificates_and_impersonation_are_subject_to_rbac() -> TestResult {
    let cp = harness::shared().await?;
    let ns = cp.namespace().await?;
    let jane = cp.client_for_user("jane", &["developers"])?;
    let bob = cp.impersonating_client("bob", &["viewers"])?;
    let jane_api: Api<AppService> = Api::namespaced(jane.clone(), &ns);

    let (code, _) = rejection(jane_api.list(&ListParams::default()).await);
    assert_eq!(code, 403, "no RBAC yet");
    assert!(!can_list_appservices(bob.clone(), &ns).await?);

    let admin = cp.client();
    let role = Role {
        metadata: ObjectMeta {
            name: Some("appservice-reader".into()),
            ..ObjectMeta::default()
        },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["platform.example.com".into()]),
            resources: Some(vec!["appservices".into()]),
            verbs: vec!["get".into(), "list".into()],
            ..PolicyRule::default()
        }]),
    };
    Api::<Role>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &role)
        .await?;
    let binding = |name: &str, subject: Subject| RoleBinding {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: "appservice-reader".into(),
        },
        subjects: Some(vec![subject]),
    };
    let group = |name: &str| Subject {
        api_group: Some("rbac.authorization.k8s.io".into()),
        kind: "Group".into(),
        name: name.into(),
        namespace: None,
    };
    let bindings: Api<RoleBinding> = Api::namespaced(admin, &ns);
    // Groups come from the certificate's O and from the impersonation headers.
    bindings
        .create(
            &PostParams::default(),
            &binding("developers", group("developers")),
        )
        .await?;
    bindings
        .create(
            &PostParams::default(),
            &binding("viewers", group("viewers")),
        )
        .await?;

    // RBAC changes take effect through an informer: poll briefly.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !(can_list_appservices(jane.clone(), &ns).await?
        && can_list_appservices(bob.clone(), &ns).await?)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "RBAC never allowed the users"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        jane_api
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
    );
    let (code, _) = rejection(
        jane_api
            .create(
                &PostParams::default(),
                &written("nope", spec("registry.example.com/x:v1")),
            )
            .await,
    );
    assert_eq!(code, 403, "read-only role");
    Ok(())
}

#[tokio::test]
async fn registered_webhooks_take_effect_only_in_their_namespace() -> TestResult {
    let cp = harness::shared().await?;
    let ns = cp.namespace().await?;
    let other = cp.namespace().await?;
    let (ca, _serving) = harness::webhook_tls()?;
    // Nothing listens on this port: with failurePolicy Fail the API server must refuse
    // AppServices in `ns` because it cannot reach the (real, not probe) webhook.
    let port = harness::process::free_port()?;
    let hooks = cp
        .register_webhooks(&ns, &format!("https://127.0.0.1:{port}"), ca.cert_pem())
        .await?;
    assert_eq!(hooks.mutating, format!("appservice-tests-{}", ns.name()));

    let api: Api<AppService> = Api::namespaced(cp.client(), &ns);
    let (code, message) = rejection(
        api.create(
            &PostParams::default(),
            &written("hooked", spec("registry.example.com/h:v1")),
        )
        .await,
    );
    assert_eq!(code, 500, "{message}");
    assert!(
        message.contains("failed calling webhook \"mutate.appservices.platform.example.com\""),
        "{message}"
    );
    assert!(
        message.contains(&format!("127.0.0.1:{port}/mutate")),
        "{message}"
    );

    // Other namespaces are not affected.
    Api::<AppService>::namespaced(cp.client(), &other)
        .create(
            &PostParams::default(),
            &written("free", spec("registry.example.com/f:v1")),
        )
        .await?;

    hooks.remove(cp.client()).await?;
    Ok(())
}

#[tokio::test]
async fn the_kubeconfig_works_with_kubectl() -> TestResult {
    let cp = harness::shared().await?;
    let ns = cp.namespace().await?;
    let kubectl = cp.bin_dir()?.join("kubectl");
    let out = Command::new(&kubectl)
        .arg("--kubeconfig")
        .arg(cp.kubeconfig_path())
        .args(["get", "appsrv", "-n", ns.name(), "-o", "name"])
        .output()?;
    assert!(
        out.status.success(),
        "kubectl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&kubectl)
        .arg("--kubeconfig")
        .arg(cp.kubeconfig_path())
        .args([
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ])
        .output()?;
    assert_eq!(String::from_utf8_lossy(&out.stdout), "envtest-admin");
    Ok(())
}

#[tokio::test]
async fn a_private_control_plane_leaves_no_process_behind() -> TestResult {
    let cp = harness::ControlPlane::start(harness::Options::plain()).await?;
    let root = cp
        .kubeconfig_path()
        .parent()
        .expect("kubeconfig lives in the root")
        .to_owned();
    let running = || {
        // Every component's command line names a file under the root directory.
        let out = Command::new("pgrep")
            .args(["-f", &root.display().to_string()])
            .output()
            .expect("pgrep runs");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .count()
    };
    assert!(running() >= 2, "etcd and kube-apiserver run");
    let api: Api<AppService> = Api::namespaced(cp.client(), "default");
    assert!(api.list(&ListParams::default()).await?.items.is_empty());
    eprintln!("private control plane started in {:?}", cp.startup_time());
    drop(cp);
    assert_eq!(running(), 0, "nothing outlives the control plane");
    assert!(!root.join("etcd").exists(), "etcd data removed");
    assert!(!root.join("pki").exists(), "keys removed");
    assert!(
        root.join("logs").join("kube-apiserver.log").is_file(),
        "logs kept"
    );
    std::fs::remove_dir_all(&root)?;
    Ok(())
}
