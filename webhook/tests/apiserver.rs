//! The webhook behind a real kube-apiserver (the harness's etcd + kube-apiserver): the API
//! server calls it over TLS with a caBundle, for one random namespace per test.
//!
//! Note the API server's own work around the webhook: it applies the CRD schema's
//! defaults before mutating admission and validates the schema (and its CEL rules) before
//! validating admission. So the tests below use rules only the webhook knows (image
//! references, env names, requests vs limits, the name label, policies) to prove that
//! the webhook, not the schema, answered.
//!
//! The tests write `v1alpha1`, the version the admission tests were first written for;
//! the API server stores `v1beta1` and converts through the webhook's `/convert` (one
//! server for the whole binary, since the CRD's conversion is cluster-wide), so every
//! write and read here also goes through conversion. `objects_survive_read_edit_write_across_versions`
//! mixes the versions on purpose.
// Test helpers outside #[test] functions unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use common::v1alpha1::AppService;
use harness::{ControlPlane, TestNamespace, Webhooks};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::TestCerts;
use tokio::sync::OnceCell;
use webhook::Server;

struct Env {
    cp: &'static ControlPlane,
    ns: TestNamespace,
    server: Server,
    webhooks: Webhooks,
    certs: TestCerts,
    policies: PathBuf,
}

impl Env {
    async fn new(policies: &str) -> Env {
        Env::with_options(policies, false).await
    }

    async fn with_options(policies: &str, namespace_labels: bool) -> Env {
        support::install_provider();
        let cp = harness::shared().await.expect("control plane");
        let ns = cp.namespace().await.expect("namespace");
        let certs = TestCerts::new();
        let policies_path = certs.write_policies(policies);
        let mut config = certs.config(Some(policies_path.clone()));
        config.namespace_labels = namespace_labels;
        let server = webhook::start_with_client(&config, Some(cp.client()))
            .await
            .unwrap();
        converter(cp, &ns).await;
        let webhooks = cp
            .register_webhooks(
                &ns,
                &format!("https://{}", server.tls_addr()),
                certs.ca.cert_pem(),
            )
            .await
            .expect("webhooks in effect");
        Env {
            cp,
            ns,
            server,
            webhooks,
            certs,
            policies: policies_path,
        }
    }

    fn api(&self) -> Api<AppService> {
        Api::namespaced(self.cp.client(), &self.ns)
    }

    fn metric(&self, prefix: &str) -> u64 {
        let text = self.server.state().metrics.encode().unwrap();
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    async fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let bin = self.cp.bin_dir().unwrap().join("kubectl");
        let mut command = tokio::process::Command::new(bin);
        command
            .arg("--kubeconfig")
            .arg(self.cp.kubeconfig_path())
            .arg("--namespace")
            .arg(&*self.ns)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = command.spawn().unwrap();
        if let Some(input) = stdin {
            use tokio::io::AsyncWriteExt;
            let mut pipe = child.stdin.take().unwrap();
            pipe.write_all(input.as_bytes()).await.unwrap();
        } else {
            drop(child.stdin.take());
        }
        child.wait_with_output().await.unwrap()
    }

    /// `kubectl` that must succeed.
    async fn kubectl_ok(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let out = self.kubectl(args, stdin).await;
        assert!(
            out.status.success(),
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    async fn finish(self) {
        self.webhooks.remove(self.cp.client()).await.unwrap();
        self.server.shutdown().await.unwrap();
        self.ns.cleanup().await.unwrap();
        drop(self.certs);
    }
}

/// The conversion webhook every test of this binary shares, set on the CRD once. Each
/// `#[tokio::test]` has its own runtime, so the server runs on a runtime of its own
/// thread and lives as long as the binary.
async fn converter(cp: &'static ControlPlane, ns: &str) {
    static CONVERTER: OnceCell<()> = OnceCell::const_new();
    CONVERTER
        .get_or_init(|| async {
            let (tx, rx) = tokio::sync::oneshot::channel();
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Runtime::new().unwrap();
                runtime.block_on(async move {
                    let certs = TestCerts::new();
                    let server = webhook::start(&certs.config(None)).await.unwrap();
                    let _ = tx.send((server.tls_addr(), certs.ca.cert_pem().to_owned()));
                    // Keep the server and its certificate files for the whole binary.
                    let _keep = (server, certs);
                    std::future::pending::<()>().await;
                });
            });
            let (addr, ca) = rx.await.unwrap();
            cp.use_conversion_webhook(&format!("https://{addr}"), &ca, ns)
                .await
                .expect("conversion webhook in effect");
        })
        .await;
}

fn app(name: &str, spec: serde_json::Value) -> AppService {
    serde_json::from_value(json!({
        "apiVersion": "platform.example.com/v1alpha1",
        "kind": "AppService",
        "metadata": {"name": name},
        "spec": spec
    }))
    .unwrap()
}

fn api_error(result: kube::Result<AppService>) -> kube::core::Status {
    match result {
        Err(kube::Error::Api(status)) => *status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

const MUTATE_PATCHED: &str = r#"appservice_webhook_admission_requests_total{endpoint="mutate",operation="CREATE",decision="patched"}"#;
const MUTATE_ALLOWED: &str = r#"appservice_webhook_admission_requests_total{endpoint="mutate",operation="CREATE",decision="allowed"}"#;

#[tokio::test]
async fn defaults_are_stored_and_a_defaulted_object_is_not_patched() {
    let env = Env::new("policies: []\n").await;
    let api = env.api();
    let created = api
        .create(
            &PostParams::default(),
            &app(
                "checkout",
                json!({"image": "registry.example.com/checkout:v3.4.0"}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(created.spec.replicas, Some(1));
    assert_eq!(created.spec.port, Some(8080));
    assert_eq!(created.metadata.annotations, None, "nothing to carry");
    // Only the webhook adds this label (the schema cannot).
    let labels = created.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("app.kubernetes.io/name").map(String::as_str),
        Some("checkout")
    );
    assert_eq!(env.metric(MUTATE_PATCHED), 1);

    // Already defaulted: the webhook is called and answers without a patch.
    let mut defaulted = app(
        "orders",
        json!({"image": "registry.example.com/orders:v1.0.0", "replicas": 2, "port": 9090}),
    );
    defaulted.metadata.labels =
        Some([("app.kubernetes.io/name".to_owned(), "orders".to_owned())].into());
    let stored = api
        .create(&PostParams::default(), &defaulted)
        .await
        .unwrap();
    assert_eq!(stored.spec, defaulted.spec);
    assert_eq!(stored.metadata.labels, defaulted.metadata.labels);
    assert_eq!(
        env.metric(MUTATE_PATCHED),
        1,
        "no patch for a defaulted object"
    );
    assert_eq!(env.metric(MUTATE_ALLOWED), 1);

    // A user's own name label is kept.
    let mut custom = app("custom", json!({"image": "registry.example.com/c:v1"}));
    custom.metadata.labels =
        Some([("app.kubernetes.io/name".to_owned(), "shop".to_owned())].into());
    let stored = api.create(&PostParams::default(), &custom).await.unwrap();
    assert_eq!(
        stored.metadata.labels.unwrap_or_default()["app.kubernetes.io/name"],
        "shop"
    );
    env.finish().await;
}

#[tokio::test]
async fn an_invalid_object_is_rejected_with_every_error() {
    let env = Env::new("policies: []\n").await;
    let invalid = app(
        "broken",
        json!({
            "image": "Not A Valid Image",
            "env": [{"name": "1BAD", "value": "x"}],
            "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}
        }),
    );
    let status = api_error(env.api().create(&PostParams::default(), &invalid).await);
    assert_eq!(status.code, 422, "{status:?}");
    let message = &status.message;
    assert!(
        message.contains(
            r#"admission webhook "validate.appservices.platform.example.com" denied the request"#
        ),
        "{message}"
    );
    for expected in [
        r#"spec.image: Invalid value: "Not A Valid Image""#,
        r#"spec.env[0].name: Invalid value: "1BAD""#,
        r#"spec.resources.requests[cpu]: Invalid value: "2": must be less than or equal to cpu limit of 1"#,
    ] {
        assert!(
            message.contains(expected),
            "{expected:?} missing from {message}"
        );
    }
    assert!(env.api().get_opt("broken").await.unwrap().is_none());
    env.finish().await;
}

#[tokio::test]
async fn changing_an_immutable_field_is_rejected() {
    let env = Env::new("policies: []\n").await;
    let api = env.api();
    api.create(
        &PostParams::default(),
        &app("orders", json!({"image": "registry.example.com/orders:v1", "database": {"enabled": true, "class": "small"}})),
    )
    .await
    .unwrap();
    let patch = json!({"spec": {"database": {"enabled": true, "class": "large"}}});
    let result = api
        .patch("orders", &PatchParams::default(), &Patch::Merge(&patch))
        .await;
    let status = api_error(result);
    assert_eq!(status.code, 422, "{status:?}");
    // The CRD's CEL transition rule and the webhook enforce the same rule; the API server
    // checks its schema first, so either message may be the one returned.
    assert!(
        status.message.contains("database.class"),
        "{}",
        status.message
    );
    assert!(status.message.contains("immutable"), "{}", status.message);
    assert_eq!(
        api.get("orders").await.unwrap().spec.database_class(),
        Some("small")
    );
    env.finish().await;
}

/// Images from one registry (and two replicas in a namespace named production, which
/// the test namespaces are not).
const REGISTRY_POLICY: &str = include_str!("fixtures/registry-policies.yaml");

#[tokio::test]
async fn a_policy_denial_reaches_the_client_and_policies_reload() {
    let env = Env::new(REGISTRY_POLICY).await;
    let api = env.api();
    let outside = app("web", json!({"image": "docker.io/library/nginx:1.27"}));
    let status = api_error(api.create(&PostParams::default(), &outside).await);
    assert!(
        status.message.contains(r#"policy "allowed-registry": image docker.io/library/nginx:1.27 is not from registry.example.com"#),
        "{}",
        status.message
    );
    api.create(
        &PostParams::default(),
        &app("inside", json!({"image": "registry.example.com/web:v1"})),
    )
    .await
    .unwrap();

    // Replace the policy file: the new set takes over without a restart.
    std::fs::write(
        &env.policies,
        "policies:\n  - name: two-replicas\n    expression: \"object.spec.replicas >= 2\"\n    message: at least 2 replicas\n",
    )
    .unwrap();
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let mut reloaded = false;
    for _ in 0..500 {
        match api.create(&dry_run, &outside).await {
            Err(kube::Error::Api(status)) if status.message.contains("at least 2 replicas") => {
                reloaded = true;
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    assert!(reloaded, "the reloaded policy never denied");
    let mut two = outside.clone();
    two.spec.replicas = Some(2);
    api.create(&PostParams::default(), &two).await.unwrap();
    env.finish().await;
}

const MANIFEST: &str = r#"
apiVersion: platform.example.com/v1alpha1
kind: AppService
metadata:
  name: shop
spec:
  image: registry.example.com/shop:v2.0.0
  env:
    - name: LOG_LEVEL
      value: info
"#;

#[tokio::test]
async fn kubectl_server_side_apply_dry_run_and_warnings() {
    let env = Env::new("policies: []\n").await;

    // --dry-run=server: admitted (and defaulted) but not stored.
    let out = env
        .kubectl_ok(
            &[
                "apply",
                "--server-side",
                "--dry-run=server",
                "-o",
                "json",
                "-f",
                "-",
            ],
            Some(MANIFEST),
        )
        .await;
    let dry: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(dry["metadata"]["labels"]["app.kubernetes.io/name"], "shop");
    assert_eq!(dry["spec"]["port"], 8080);
    assert!(
        env.api().get_opt("shop").await.unwrap().is_none(),
        "dry run stored nothing"
    );

    // Server-side apply, twice: the second apply changes nothing.
    env.kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(MANIFEST))
        .await;
    let first = env.api().get("shop").await.unwrap();
    assert_eq!(first.spec.replicas, Some(1));
    assert_eq!(
        first.metadata.labels.clone().unwrap_or_default()["app.kubernetes.io/name"],
        "shop"
    );
    env.kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(MANIFEST))
        .await;
    let second = env.api().get("shop").await.unwrap();
    assert_eq!(second.metadata.generation, first.metadata.generation);
    assert_eq!(
        second.metadata.resource_version, first.metadata.resource_version,
        "a no-op apply"
    );

    // Warnings reach kubectl, on success and on a dry run.
    let latest = MANIFEST.replace(
        "registry.example.com/shop:v2.0.0",
        "registry.example.com/shop:latest",
    );
    let out = env
        .kubectl_ok(
            &["apply", "--server-side", "--dry-run=server", "-f", "-"],
            Some(&latest),
        )
        .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Warning:") && stderr.contains(":latest tag"),
        "{stderr}"
    );

    // A denial through kubectl carries the message.
    let bad = MANIFEST.replace("LOG_LEVEL", "LOG-LEVEL");
    let out = env
        .kubectl(&["apply", "--server-side", "-f", "-"], Some(&bad))
        .await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(r#"spec.env[0].name: Invalid value: "LOG-LEVEL""#),
        "{stderr}"
    );

    env.api()
        .delete("shop", &DeleteParams::default())
        .await
        .unwrap();
    env.finish().await;
}

const NAMESPACE_POLICY: &str = r#"
policies:
  - name: production-replicas
    expression: "!('environment' in namespaceObject.metadata.labels) || namespaceObject.metadata.labels['environment'] != 'production' || object.spec.replicas >= 2"
    message: "AppServices in namespaces labelled environment=production need at least 2 replicas"
"#;

#[tokio::test]
async fn policies_see_namespace_labels() {
    let env = Env::with_options(NAMESPACE_POLICY, true).await;
    let (status, _) = support::get(env.server.ops_addr(), "/readyz").await;
    assert_eq!(
        status,
        http::StatusCode::OK,
        "ready once namespaces are cached"
    );
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(env.cp.client());
    // Labels the test namespace `environment=<value>`.
    let label = |value: &str| {
        let (namespaces, ns) = (namespaces.clone(), env.ns.name().to_owned());
        let patch = json!({"metadata": {"labels": {"environment": value}}});
        async move {
            namespaces
                .patch(&ns, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap();
        }
    };
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let single = app(
        "single",
        json!({"image": "registry.example.com/a:v1", "replicas": 1}),
    );

    // Unlabelled: allowed.
    env.api().create(&dry_run, &single).await.unwrap();

    label("production").await;
    let denied = single_replica_until(&env, &single, false)
        .await
        .expect("the label change never reached the policy");
    assert!(denied.contains("need at least 2 replicas"), "{denied}");
    let two = app(
        "double",
        json!({"image": "registry.example.com/a:v1", "replicas": 2}),
    );
    env.api()
        .create(&PostParams::default(), &two)
        .await
        .unwrap();

    // Relabelled to staging: allowed again.
    label("staging").await;
    assert_eq!(
        single_replica_until(&env, &single, true).await,
        None,
        "the relabelled namespace never allowed a single replica"
    );
    env.finish().await;
}

/// Dry-runs the creation of `app` until it is allowed (`want_allowed`) or denied for its
/// replicas, as a namespace label change reaches the webhook's cache; the denial's
/// message, if denied.
async fn single_replica_until(env: &Env, app: &AppService, want_allowed: bool) -> Option<String> {
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    for _ in 0..500 {
        let denial = match env.api().create(&dry_run, app).await {
            Ok(_) => None,
            Err(kube::Error::Api(status))
                if status.message.contains("need at least 2 replicas") =>
            {
                Some(status.message)
            }
            Err(e) => panic!("{e}"),
        };
        if denial.is_none() == want_allowed {
            return denial;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the webhook never answered allowed={want_allowed}");
}

fn beta_api(env: &Env) -> Api<common::AppService> {
    Api::namespaced(env.cp.client(), &env.ns)
}

#[tokio::test]
async fn objects_survive_read_edit_write_across_versions() {
    let env = Env::new("policies: []\n").await;
    let alpha = env.api();
    let beta = beta_api(&env);

    // Written in v1beta1 with what v1alpha1 cannot say: a v1alpha1 client edits it.
    let created: common::AppService = serde_json::from_value(json!({
        "apiVersion": "platform.example.com/v1beta1",
        "kind": "AppService",
        "metadata": {"name": "multi"},
        "spec": {"image": "registry.example.com/multi:v1", "ports": [
            {"name": "web", "port": 8080},
            {"name": "metrics", "port": 9090},
            {"name": "dns", "port": 5353, "protocol": "UDP"}
        ], "database": {"class": "small"}}
    }))
    .unwrap();
    beta.create(&PostParams::default(), &created).await.unwrap();
    let mut read = alpha.get("multi").await.unwrap();
    assert_eq!(read.spec.port, Some(8080));
    let db = read.spec.database.clone().unwrap();
    assert!(db.enabled && db.class.as_deref() == Some("small"));
    read.spec.port = Some(8081);
    read.spec.replicas = Some(3);
    alpha
        .replace("multi", &PostParams::default(), &read)
        .await
        .unwrap();
    let back = beta.get("multi").await.unwrap();
    let ports: Vec<(&str, i32, Option<common::Protocol>)> = back
        .spec
        .ports
        .iter()
        .map(|p| (p.name.as_str(), p.port, p.protocol))
        .collect();
    use common::Protocol::{Tcp, Udp};
    assert_eq!(
        ports,
        vec![
            ("web", 8081, Some(Tcp)),
            ("metrics", 9090, Some(Tcp)),
            ("dns", 5353, Some(Udp))
        ]
    );
    assert_eq!(back.spec.replicas, Some(3));
    assert_eq!(back.spec.database_class(), Some("small"));
    assert_eq!(
        back.metadata.annotations, None,
        "the carried ports are not stored"
    );

    // Written in v1alpha1 with what v1beta1 cannot say: a v1beta1 client edits it.
    alpha
        .create(
            &PostParams::default(),
            &app(
                "legacy",
                json!({"image": "registry.example.com/legacy:v1", "port": 9000,
                       "database": {"enabled": false, "class": "large"}}),
            ),
        )
        .await
        .unwrap();
    let mut read = beta.get("legacy").await.unwrap();
    assert_eq!(read.spec.ports, vec![common::AppPort::http(9000)]);
    assert_eq!(read.spec.database, None);
    read.spec.image = "registry.example.com/legacy:v2".into();
    beta.replace("legacy", &PostParams::default(), &read)
        .await
        .unwrap();
    let back = alpha.get("legacy").await.unwrap();
    assert_eq!(back.spec.image, "registry.example.com/legacy:v2");
    assert_eq!(back.spec.port, Some(9000));
    assert_eq!(
        back.spec.database,
        Some(common::v1alpha1::DatabaseSpec {
            enabled: false,
            class: Some("large".into())
        })
    );
    assert_eq!(back.metadata.annotations, None);

    // The webhook validates v1beta1 too: a port name only it checks.
    let mut bad = created.clone();
    bad.metadata.name = Some("badports".into());
    bad.spec.ports[1].name = "12345".into();
    let error = beta.create(&PostParams::default(), &bad).await.unwrap_err();
    assert!(error.to_string().contains("spec.ports[1].name"), "{error}");

    // kubectl lists and explains both versions.
    for resource in [
        "appservices.v1alpha1.platform.example.com",
        "appservices.v1beta1.platform.example.com",
    ] {
        let out = env.kubectl_ok(&["get", resource], None).await;
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.starts_with("NAME") && text.contains("READY") && text.contains("ENDPOINT"),
            "{text}"
        );
        assert!(text.contains("multi") && text.contains("legacy"), "{text}");
    }
    for (version, field) in [("v1alpha1", "port"), ("v1beta1", "ports")] {
        let out = env
            .kubectl_ok(
                &[
                    "explain",
                    "appservices.spec",
                    &format!("--api-version=platform.example.com/{version}"),
                ],
                None,
            )
            .await;
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(&format!("VERSION:    {version}")) || text.contains(version),
            "{text}"
        );
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with(&format!("{field}\t"))
                    || l.trim_start().starts_with(&format!("{field} "))),
            "{version}: {text}"
        );
    }
    env.finish().await;
}
