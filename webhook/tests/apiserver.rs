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
        Env::in_namespace(policies, namespace_labels, "test").await
    }

    /// A webhook at the chart's settings (the AppService watch on, so `/scale` is
    /// judged) for a new namespace `<prefix>-<random>`.
    async fn in_namespace(policies: &str, namespace_labels: bool, prefix: &str) -> Env {
        support::install_provider();
        let cp = harness::shared().await.expect("control plane");
        let ns = cp.namespace_with_prefix(prefix).await.expect("namespace");
        let certs = TestCerts::new();
        let policies_path = certs.write_policies(policies);
        let mut config = certs.config(Some(policies_path.clone()));
        config.namespace_labels = namespace_labels;
        config.watch_appservices = true;
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

fn api_error<T: std::fmt::Debug>(result: kube::Result<T>) -> kube::core::Status {
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

// ---------------------------------------------------------------------------------------
// One set of rules on every write path: each shipped policy through every way a client
// writes an AppService, in both versions, as the users the policies name.

use kube::api::DynamicObject;
use kube::core::{ApiResource, GroupVersionKind};

const VERSIONS: [&str; 2] = ["v1alpha1", "v1beta1"];

/// The ways a client changes a stored AppService.
#[derive(Clone, Copy, Debug)]
enum WritePath {
    /// GET, change, PUT (`kubectl replace`), in this version.
    Replace(&'static str),
    /// JSON merge patch (`kubectl patch --type merge`).
    MergePatch(&'static str),
    /// JSON patch (`kubectl patch --type json`).
    JsonPatch(&'static str),
    /// Server-side apply with its own field manager (`kubectl apply --server-side`).
    Apply(&'static str),
    /// `kubectl edit` of the resource in this version.
    KubectlEdit(&'static str),
    /// A patch of the scale subresource in this version, as an HPA writes it.
    ScalePatch(&'static str),
    /// `kubectl scale`.
    KubectlScale,
}

/// Every path that can make `change`: the scale paths only change replicas.
fn paths_for(change: &Change) -> Vec<WritePath> {
    let mut paths = Vec::new();
    for v in VERSIONS {
        paths.extend([
            WritePath::Replace(v),
            WritePath::MergePatch(v),
            WritePath::JsonPatch(v),
            WritePath::Apply(v),
            WritePath::KubectlEdit(v),
        ]);
    }
    if change.replicas.is_some() {
        paths.extend([
            WritePath::ScalePatch("v1alpha1"),
            WritePath::ScalePatch("v1beta1"),
            WritePath::KubectlScale,
        ]);
    }
    paths
}

/// A change of top-level spec fields, written as each version spells them.
#[derive(Clone, Debug)]
struct Change {
    alpha: serde_json::Value,
    beta: serde_json::Value,
    replicas: Option<i32>,
}

impl Change {
    /// The same fields in both versions.
    fn spec(fields: serde_json::Value) -> Change {
        let replicas = fields["replicas"].as_i64().map(|r| r as i32);
        Change {
            alpha: fields.clone(),
            beta: fields,
            replicas,
        }
    }

    fn replicas(n: i32) -> Change {
        Change::spec(json!({"replicas": n}))
    }

    fn fields(&self, version: &str) -> &serde_json::Value {
        if version == "v1alpha1" {
            &self.alpha
        } else {
            &self.beta
        }
    }
}

/// Who writes: a user name and groups, impersonated by the admin's client.
#[derive(Clone, Copy, Debug)]
struct Writer {
    user: &'static str,
    groups: &'static [&'static str],
}

const DEV: Writer = Writer {
    user: "dev",
    groups: &["developers"],
};
const SRE: Writer = Writer {
    user: "oncall",
    groups: &["sre"],
};
const DB_USER: Writer = Writer {
    user: "db-owner",
    groups: &["platform-db-users"],
};
/// The identity of kube-controller-manager's HPA controller: it may only touch `/scale`.
const HPA: Writer = Writer {
    user: "system:serviceaccount:kube-system:horizontal-pod-autoscaler",
    groups: &[
        "system:serviceaccounts",
        "system:serviceaccounts:kube-system",
    ],
};

fn resource(version: &str) -> ApiResource {
    let gvk = GroupVersionKind::gvk("platform.example.com", version, "AppService");
    ApiResource::from_gvk_with_plural(&gvk, "appservices")
}

impl Env {
    fn dynamic(&self, client: kube::Client, version: &str) -> Api<DynamicObject> {
        Api::namespaced_with(client, &self.ns, &resource(version))
    }

    fn client_as(&self, writer: Writer) -> kube::Client {
        self.cp
            .impersonating_client(writer.user, writer.groups)
            .unwrap()
    }

    /// Lets the test users edit AppServices in this namespace (the HPA only their
    /// scale), as the `edit` role and the HPA's role do.
    async fn grant_writers(&self) {
        use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
        let roles: Api<Role> = Api::namespaced(self.cp.client(), &self.ns);
        let bindings: Api<RoleBinding> = Api::namespaced(self.cp.client(), &self.ns);
        let all = [
            "get", "list", "watch", "create", "update", "patch", "delete",
        ];
        for (name, resources, subjects) in [
            (
                "appservice-editors",
                json!(["appservices", "appservices/scale"]),
                json!([
                    {"kind": "User", "name": DEV.user},
                    {"kind": "Group", "name": "sre"},
                    {"kind": "Group", "name": "platform-db-users"}
                ]),
            ),
            (
                "appservice-scalers",
                json!(["appservices/scale"]),
                json!([{"kind": "User", "name": HPA.user}]),
            ),
        ] {
            let role: Role = serde_json::from_value(json!({
                "metadata": {"name": name},
                "rules": [{"apiGroups": ["platform.example.com"], "resources": resources, "verbs": all}]
            }))
            .unwrap();
            roles.create(&PostParams::default(), &role).await.unwrap();
            let binding: RoleBinding = serde_json::from_value(json!({
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                "subjects": subjects
            }))
            .unwrap();
            bindings
                .create(&PostParams::default(), &binding)
                .await
                .unwrap();
        }
    }

    /// Creates `name` as the admin (v1beta1) with `spec`; returns its resourceVersion.
    async fn seed(&self, name: &str, spec: serde_json::Value) -> String {
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "platform.example.com/v1beta1", "kind": "AppService",
            "metadata": {"name": name}, "spec": spec
        }))
        .unwrap();
        let created = self
            .dynamic(self.cp.client(), "v1beta1")
            .create(&PostParams::default(), &object)
            .await
            .unwrap();
        created.metadata.resource_version.unwrap()
    }

    async fn stored(&self, name: &str) -> DynamicObject {
        self.dynamic(self.cp.client(), "v1beta1")
            .get(name)
            .await
            .unwrap()
    }

    /// `kubectl` as `writer`, with extra environment; the output, success or not.
    async fn kubectl_as(&self, writer: Writer, args: &[&str], env: &[(&str, &str)]) -> Output {
        let bin = self.cp.bin_dir().unwrap().join("kubectl");
        let mut command = tokio::process::Command::new(bin);
        command
            .arg("--kubeconfig")
            .arg(self.cp.kubeconfig_path())
            .arg("--namespace")
            .arg(&*self.ns)
            .arg(format!("--as={}", writer.user));
        for group in writer.groups {
            command.arg(format!("--as-group={group}"));
        }
        command.args(args).stdin(std::process::Stdio::null());
        for (key, value) in env {
            command.env(key, value);
        }
        command.output().await.unwrap()
    }

    /// Writes `change` to `name` by `path` as `writer`: Ok, or the refusal's message.
    async fn write(
        &self,
        path: WritePath,
        writer: Writer,
        name: &str,
        change: &Change,
    ) -> Result<(), String> {
        let client = self.client_as(writer);
        let api_error = |e: kube::Error| match e {
            kube::Error::Api(status) => status.message,
            other => other.to_string(),
        };
        let kubectl = |out: Output| {
            if out.status.success() {
                Ok(())
            } else {
                Err(String::from_utf8_lossy(&out.stderr).into_owned())
            }
        };
        let fields = |v: &str| change.fields(v).as_object().cloned().unwrap_or_default();
        match path {
            WritePath::Replace(v) => {
                let api = self.dynamic(client, v);
                let mut object = api.get(name).await.map_err(api_error)?;
                for (key, value) in fields(v) {
                    object.data["spec"][key] = value;
                }
                api.replace(name, &PostParams::default(), &object)
                    .await
                    .map(drop)
                    .map_err(api_error)
            }
            WritePath::MergePatch(v) => self
                .dynamic(client, v)
                .patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": change.fields(v)})),
                )
                .await
                .map(drop)
                .map_err(api_error),
            WritePath::JsonPatch(v) => {
                let ops: Vec<serde_json::Value> = fields(v)
                    .into_iter()
                    .map(|(key, value)| json!({"op": "add", "path": format!("/spec/{key}"), "value": value}))
                    .collect();
                let patch: json_patch::Patch = serde_json::from_value(json!(ops)).unwrap();
                self.dynamic(client, v)
                    .patch(name, &PatchParams::default(), &Patch::<()>::Json(patch))
                    .await
                    .map(drop)
                    .map_err(api_error)
            }
            WritePath::Apply(v) => {
                let object = json!({
                    "apiVersion": format!("platform.example.com/{v}"), "kind": "AppService",
                    "metadata": {"name": name}, "spec": change.fields(v)
                });
                self.dynamic(client, v)
                    .patch(
                        name,
                        &PatchParams::apply("write-path-test").force(),
                        &Patch::Apply(&object),
                    )
                    .await
                    .map(drop)
                    .map_err(api_error)
            }
            WritePath::KubectlEdit(v) => {
                // The editor replaces the file with the object as read and changed: kubectl
                // then computes its patch and sends it, as after a hand edit.
                let mut object = self.dynamic(client, v).get(name).await.map_err(api_error)?;
                for (key, value) in fields(v) {
                    object.data["spec"][key] = value;
                }
                // kubectl edit does not show managedFields.
                object.metadata.managed_fields = None;
                // A refused edit is reopened with the API server's answer in the file's
                // header; the editor keeps what it was shown, so the answer can be read.
                let dir = tempfile::tempdir().unwrap();
                let (edited, shown) = (dir.path().join("edited.json"), dir.path().join("shown"));
                std::fs::write(&edited, serde_json::to_vec(&object).unwrap()).unwrap();
                let editor = dir.path().join("editor.sh");
                std::fs::write(
                    &editor,
                    format!(
                        "#!/bin/sh\ncat \"$1\" >> '{}'\ncp '{}' \"$1\"\n",
                        shown.display(),
                        edited.display()
                    ),
                )
                .unwrap();
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&editor, std::fs::Permissions::from_mode(0o755)).unwrap();
                let resource = format!("appservices.{v}.platform.example.com/{name}");
                let out = self
                    .kubectl_as(
                        writer,
                        &["edit", &resource],
                        &[("KUBE_EDITOR", &editor.display().to_string())],
                    )
                    .await;
                kubectl(out).map_err(|stderr| {
                    format!(
                        "{stderr}\n{}",
                        std::fs::read_to_string(&shown).unwrap_or_default()
                    )
                })
            }
            WritePath::ScalePatch(v) => {
                let replicas = change.replicas.expect("a replicas change");
                let api: Api<DynamicObject> = self.dynamic(client, v);
                api.patch_scale(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"replicas": replicas}})),
                )
                .await
                .map(drop)
                .map_err(api_error)
            }
            WritePath::KubectlScale => {
                let replicas =
                    format!("--replicas={}", change.replicas.expect("a replicas change"));
                kubectl(
                    self.kubectl_as(
                        writer,
                        &["scale", &format!("appservices/{name}"), &replicas],
                        &[],
                    )
                    .await,
                )
            }
        }
    }

    /// `change` is refused on every path by `policy`, and `name` stays as it was.
    async fn refused_everywhere(&self, writer: Writer, name: &str, change: &Change, policy: &str) {
        let before = self.stored(name).await.metadata.resource_version;
        for path in paths_for(change) {
            let result = self.write(path, writer, name, change).await;
            let message = result.expect_err(&format!("{path:?} as {writer:?} admitted {change:?}"));
            assert!(
                message.contains(&format!("policy \"{policy}\"")),
                "{path:?} as {writer:?}: {message}"
            );
            assert_eq!(
                self.stored(name).await.metadata.resource_version,
                before,
                "{path:?} changed {name}"
            );
        }
    }

    /// `change` is admitted on every path, each on its own copy of `spec`.
    async fn admitted_everywhere(
        &self,
        writer: Writer,
        prefix: &str,
        spec: &serde_json::Value,
        change: &Change,
    ) {
        for (i, path) in paths_for(change).into_iter().enumerate() {
            let name = format!("{prefix}-{i}");
            self.seed(&name, spec.clone()).await;
            self.write(path, writer, &name, change)
                .await
                .unwrap_or_else(|e| panic!("{path:?} as {writer:?} refused {change:?}: {e}"));
            let stored = self.stored(&name).await;
            for (key, value) in change.beta.as_object().unwrap() {
                // Stored with its defaults (a port's protocol): what was written is in it.
                assert!(
                    contains(&stored.data["spec"][key], value),
                    "{path:?}: spec.{key} is {}, wrote {value}",
                    stored.data["spec"][key]
                );
            }
        }
    }

    /// Creating `spec` is refused by `policy` in both versions, by create and by
    /// server-side apply, as `writer`.
    async fn create_refused(&self, writer: Writer, name: &str, spec: &Change, policy: &str) {
        for v in VERSIONS {
            let object = json!({
                "apiVersion": format!("platform.example.com/{v}"), "kind": "AppService",
                "metadata": {"name": name}, "spec": spec.fields(v)
            });
            let api = self.dynamic(self.client_as(writer), v);
            let created = api
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(object.clone()).unwrap(),
                )
                .await;
            let applied = api
                .patch(
                    name,
                    &PatchParams::apply("write-path-test"),
                    &Patch::Apply(&object),
                )
                .await;
            for (how, result) in [("create", created), ("apply", applied)] {
                match result {
                    Err(kube::Error::Api(status)) => assert!(
                        status.message.contains(&format!("policy \"{policy}\"")),
                        "{how} {v}: {}",
                        status.message
                    ),
                    other => panic!("{how} {v} of {spec:?} was not refused: {other:?}"),
                }
            }
        }
    }
}

/// Whether `actual` holds everything of `expected` (maps: a subset; lists: the same
/// length, each element contained).
fn contains(actual: &serde_json::Value, expected: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (actual, expected) {
        (Value::Object(a), Value::Object(e)) => e
            .iter()
            .all(|(k, v)| a.get(k).is_some_and(|av| contains(av, v))),
        (Value::Array(a), Value::Array(e)) => {
            a.len() == e.len() && a.iter().zip(e).all(|(av, ev)| contains(av, ev))
        }
        _ => actual == expected,
    }
}

const NO_LATEST: &str = include_str!("../../examples/policies/no-latest-in-production.yaml");
const POLICIES: &str = include_str!("../../examples/policies/policies.yaml");

#[tokio::test]
async fn no_latest_in_production_holds_on_every_write_path() {
    let env = Env::in_namespace(NO_LATEST, false, "prod").await;
    env.grant_writers().await;
    let good = json!({"image": "registry.example.com/web:v1.2.3", "replicas": 2});
    env.seed("web", good.clone()).await;

    // production-replicas-by-name: below 2, by anyone, on every path (/scale included).
    for writer in [DEV, SRE] {
        env.refused_everywhere(
            writer,
            "web",
            &Change::replicas(1),
            "production-replicas-by-name",
        )
        .await;
    }
    // An HPA that may only write /scale is judged the same.
    let hpa = env
        .write(
            WritePath::ScalePatch("v1beta1"),
            HPA,
            "web",
            &Change::replicas(1),
        )
        .await
        .expect_err("the HPA scaled below the production minimum");
    assert!(hpa.contains("production-replicas-by-name"), "{hpa}");
    // pinned-images-in-production: latest, or no tag, on every path that writes images.
    for image in [
        "registry.example.com/web:latest",
        "registry.example.com/web",
    ] {
        env.refused_everywhere(
            DEV,
            "web",
            &Change::spec(json!({"image": image})),
            "pinned-images-in-production",
        )
        .await;
    }
    env.create_refused(
        DEV,
        "fresh",
        &Change::spec(json!({"image": "nginx:latest", "replicas": 2})),
        "pinned-images-in-production",
    )
    .await;
    env.create_refused(
        DEV,
        "fresh",
        &Change::spec(json!({"image": "nginx:1.27", "replicas": 1})),
        "production-replicas-by-name",
    )
    .await;

    // What the policies allow goes through on every path.
    env.admitted_everywhere(DEV, "up", &good, &Change::replicas(3))
        .await;
    env.admitted_everywhere(
        DEV,
        "pin",
        &good,
        &Change::spec(
            json!({"image": format!("registry.example.com/web@sha256:{}", "a".repeat(64))}),
        ),
    )
    .await;
    let hpa = env
        .write(
            WritePath::ScalePatch("v1beta1"),
            HPA,
            "web",
            &Change::replicas(4),
        )
        .await;
    assert_eq!(hpa, Ok(()));
    assert_eq!(env.stored("web").await.data["spec"]["replicas"], 4);

    // Strategic merge patch is not a write path of a custom resource: the API server
    // refuses it before admission.
    let strategic = env
        .dynamic(env.client_as(DEV), "v1beta1")
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"replicas": 0}})),
        )
        .await;
    match strategic {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 415, "{status:?}"),
        other => panic!("a strategic merge patch of a custom resource: {other:?}"),
    }
    env.finish().await;
}

#[tokio::test]
async fn only_sre_scales_to_zero_on_any_write_path() {
    let env = Env::in_namespace(NO_LATEST, false, "test").await;
    env.grant_writers().await;
    let one = json!({"image": "registry.example.com/web:latest", "replicas": 1});
    env.seed("web", one.clone()).await;
    // Outside production latest is fine; to zero is not, except for the sre group.
    env.refused_everywhere(
        DEV,
        "web",
        &Change::replicas(0),
        "no-scale-to-zero-by-others",
    )
    .await;
    let hpa = env
        .write(
            WritePath::ScalePatch("v1beta1"),
            HPA,
            "web",
            &Change::replicas(0),
        )
        .await
        .expect_err("the HPA scaled to zero");
    assert!(hpa.contains("no-scale-to-zero-by-others"), "{hpa}");
    env.admitted_everywhere(SRE, "zero", &one, &Change::replicas(0))
        .await;
    // From zero, anyone scales up, by /scale too.
    env.write(WritePath::KubectlScale, DEV, "zero-0", &Change::replicas(2))
        .await
        .unwrap();
    env.write(
        WritePath::ScalePatch("v1beta1"),
        HPA,
        "zero-1",
        &Change::replicas(2),
    )
    .await
    .unwrap();
    env.finish().await;
}

#[tokio::test]
async fn policies_yaml_holds_on_every_write_path() {
    let env = Env::in_namespace(POLICIES, true, "test").await;
    env.grant_writers().await;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(env.cp.client());
    namespaces
        .patch(
            &env.ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"environment": "production"}}})),
        )
        .await
        .unwrap();
    let good = json!({"image": "registry.example.com/shop:v1", "replicas": 2});
    env.seed("shop", good.clone()).await;
    // The label reaches the webhook's namespace cache (a watch): wait until it judges.
    let dry_run = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    harness::eventually(
        "the production label in the webhook",
        Duration::from_secs(30),
        || async {
            env.dynamic(env.cp.client(), "v1beta1")
                .patch(
                    "shop",
                    &dry_run,
                    &Patch::Merge(json!({"spec": {"replicas": 1}})),
                )
                .await
                .is_err()
                .then_some(())
        },
    )
    .await
    .unwrap();

    env.refused_everywhere(DEV, "shop", &Change::replicas(1), "production-replicas")
        .await;
    env.refused_everywhere(
        DEV,
        "shop",
        &Change::spec(json!({"image": "docker.io/library/shop:v1"})),
        "allowed-registry",
    )
    .await;
    env.refused_everywhere(
        DEV,
        "shop",
        &Change::spec(json!({"resources": {"limits": {"memory": "16Gi"}}})),
        "memory-limit-cap",
    )
    .await;
    // A canary cannot bring in an image the registry rule refuses: not in v1beta1, and
    // not through v1alpha1's annotation for it, which conversion turns into the canary.
    let foreign_canary = env
        .dynamic(env.cp.client(), "v1beta1")
        .patch(
            "shop",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"canary": {"image": "docker.io/evil/shop:v1"}}})),
        )
        .await
        .expect_err("a canary from another registry");
    assert!(
        foreign_canary.to_string().contains("allowed-registry"),
        "{foreign_canary}"
    );
    let annotation = env
        .dynamic(env.cp.client(), "v1alpha1")
        .patch(
            "shop",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                common::names::ANNOTATION_V1BETA1_CANARY: r#"{"image":"docker.io/evil/shop:v1","replicas":1}"#,
            }}})),
        )
        .await
        .expect_err("a canary from another registry through v1alpha1");
    assert!(
        annotation.to_string().contains("allowed-registry"),
        "{annotation}"
    );
    env.dynamic(env.cp.client(), "v1beta1")
        .patch(
            "shop",
            &PatchParams {
                dry_run: true,
                ..PatchParams::default()
            },
            &Patch::Merge(json!({"spec": {"canary": {"image": "ghcr.io/example/shop:v2"}}})),
        )
        .await
        .expect("a canary from an allowed registry");
    // A database is spelled differently in each version; only the platform team may
    // enable one.
    let database = Change {
        alpha: json!({"database": {"enabled": true, "class": "small"}}),
        beta: json!({"database": {"class": "small"}}),
        replicas: None,
    };
    env.refused_everywhere(DEV, "shop", &database, "database-only-for-platform-team")
        .await;
    env.admitted_everywhere(DB_USER, "db", &good, &database)
        .await;
    env.admitted_everywhere(
        DEV,
        "mem",
        &good,
        &Change::spec(json!({"resources": {"limits": {"memory": "4Gi"}}})),
    )
    .await;
    env.finish().await;
}

const PORTS_POLICY: &str = "policies:\n  - name: no-port-9999\n    expression: \"object.spec.ports.all(p, p.port != 9999)\"\n    message: port 9999 is reserved\n";

#[tokio::test]
async fn a_policy_over_ports_judges_both_versions_alike() {
    let env = Env::new(PORTS_POLICY).await;
    env.grant_writers().await;
    // `port` in v1alpha1 is the first of `ports` in the hub the policy is written for.
    let port = Change {
        alpha: json!({"port": 9999}),
        beta: json!({"ports": [{"name": "http", "port": 9999}]}),
        replicas: None,
    };
    env.create_refused(DEV, "fresh", &Change {
        alpha: json!({"image": "registry.example.com/a:v1", "port": 9999}),
        beta: json!({"image": "registry.example.com/a:v1", "ports": [{"name": "http", "port": 9999}]}),
        replicas: None,
    }, "no-port-9999")
    .await;
    let good =
        json!({"image": "registry.example.com/a:v1", "ports": [{"name": "http", "port": 8080}]});
    env.seed("api", good.clone()).await;
    env.refused_everywhere(DEV, "api", &port, "no-port-9999")
        .await;
    // A second port of 9999 that v1alpha1 cannot even show is judged too.
    let extra = Change::spec(
        json!({"ports": [{"name": "http", "port": 8080}, {"name": "debug", "port": 9999}]}),
    );
    let refused = env
        .write(WritePath::MergePatch("v1beta1"), DEV, "api", &extra)
        .await
        .expect_err("a second port 9999");
    assert!(refused.contains("no-port-9999"), "{refused}");
    let other = Change {
        alpha: json!({"port": 9090}),
        beta: json!({"ports": [{"name": "http", "port": 9090}]}),
        replicas: None,
    };
    env.admitted_everywhere(DEV, "ok", &good, &other).await;
    env.finish().await;
}

/// The refusal of a host name another AppService holds, as the API server relays it.
const HELD_ELSEWHERE: &str = r#"spec.expose.hostnames[0]: Invalid value: "shop.example.test": is already exposed by another AppService"#;

/// An AppService `name` (v1beta1) exposing `shop.example.test`.
fn exposing(name: &str, image: &str) -> common::AppService {
    serde_json::from_value(json!({
        "apiVersion": "platform.example.com/v1beta1", "kind": "AppService",
        "metadata": {"name": name},
        "spec": {"image": image, "expose": {"hostnames": ["shop.example.test"]}}
    }))
    .unwrap()
}

/// A host name belongs to one AppService in the cluster: `a` in `team-a` exposes
/// `shop.example.test`; `b` in `team-b` claiming it is refused in both versions, without
/// learning who holds it; `a` edits its own spec and keeps it; once `a` is deleted, `b`
/// gets it, and `a` is then the one refused.
#[tokio::test]
async fn a_host_name_belongs_to_one_appservice_in_the_cluster() {
    let env = Env::in_namespace("policies: []\n", false, "team-a").await;
    let team_b = env
        .cp
        .namespace_with_prefix("team-b")
        .await
        .expect("namespace");
    let webhooks_b = env
        .cp
        .register_webhooks(
            &team_b,
            &format!("https://{}", env.server.tls_addr()),
            env.certs.ca.cert_pem(),
        )
        .await
        .expect("webhooks in effect");
    let (team_a, host) = (env.ns.name().to_owned(), "shop.example.test");
    let a_api = beta_api(&env);
    let b_api: Api<common::AppService> = Api::namespaced(env.cp.client(), &team_b);
    let b_alpha: Api<AppService> = Api::namespaced(env.cp.client(), &team_b);
    let cache = env
        .server
        .state()
        .appservices()
        .expect("the AppService watch");
    let holder = |namespace: &str, name: &str| Some((namespace.to_owned(), name.to_owned()));
    let refusals = "appservice_webhook_exposure_refusals_total";

    a_api
        .create(
            &PostParams::default(),
            &exposing("a", "registry.example.com/shop:v1"),
        )
        .await
        .unwrap();
    // Refusing `b` needs the watch to have delivered `a` (two creates within its lag both
    // pass: the controller's ExposureConflict then tells the younger).
    harness::eventually("a holds the host name", Duration::from_secs(30), || async {
        cache.holder(host) == holder(&team_a, "a")
    })
    .await
    .unwrap();

    let refused = |status: kube::core::Status| {
        assert_eq!(status.code, 422, "{status:?}");
        assert!(
            status.message.contains(HELD_ELSEWHERE),
            "{}",
            status.message
        );
        assert!(!status.message.contains(&team_a), "{}", status.message);
    };
    let b = exposing("b", "registry.example.com/store:v1");
    refused(api_error(b_api.create(&PostParams::default(), &b).await));
    // v1alpha1 carries expose in its annotation; judged on the hub form.
    let mut b_old = app("b", json!({"image": "registry.example.com/store:v1"}));
    b_old.metadata.annotations = Some(
        [(
            common::names::ANNOTATION_V1BETA1_EXPOSE.to_owned(),
            json!({"hostnames": [host]}).to_string(),
        )]
        .into(),
    );
    refused(api_error(
        b_alpha.create(&PostParams::default(), &b_old).await,
    ));
    assert_eq!(env.metric(refusals), 2);
    assert!(matches!(b_api.get_opt("b").await, Ok(None)));

    // The holder's own edit keeps its host name, and still nobody else gets it.
    let edited = a_api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"image": "registry.example.com/shop:v2", "replicas": 2}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(
        edited.spec.expose.map(|e| e.hostnames),
        Some(vec![host.to_owned()])
    );
    refused(api_error(b_api.create(&PostParams::default(), &b).await));

    // Deleted: the host name is free as soon as the watch delivers the deletion.
    a_api.delete("a", &DeleteParams::default()).await.unwrap();
    harness::eventually(
        "b admitted once a is gone",
        Duration::from_secs(30),
        || async {
            match b_api.create(&PostParams::default(), &b).await {
                Ok(created) => Ok(Some(created)),
                Err(kube::Error::Api(status)) if status.message.contains(HELD_ELSEWHERE) => {
                    Ok(None)
                }
                Err(error) => Err(harness::poll::Failure::from(error)),
            }
        },
    )
    .await
    .unwrap();
    harness::eventually("b holds the host name", Duration::from_secs(30), || async {
        cache.holder(host) == holder(&team_b, "b")
    })
    .await
    .unwrap();
    refused(api_error(
        a_api
            .create(
                &PostParams::default(),
                &exposing("a", "registry.example.com/shop:v2"),
            )
            .await,
    ));
    b_api
        .patch(
            "b",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"image": "registry.example.com/store:v2"}})),
        )
        .await
        .unwrap();

    webhooks_b.remove(env.cp.client()).await.unwrap();
    team_b.cleanup().await.unwrap();
    env.finish().await;
}
