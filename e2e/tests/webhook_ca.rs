//! The webhook's runtime CA (chart default, `certificates.mode=selfSigned`) on a real
//! kube-apiserver: the chart installed with `helm install`, the real webhook in-process
//! with the settings the chart renders and the identity of the chart's ServiceAccount
//! (its RBAC and its admission policy), and the API server calling it over TLS with the
//! caBundle the webhook keeps.
//!
//! No webhook Pod serves on this control plane, so the test points the chart's webhook
//! configurations and the CRD's conversion at the in-process webhook by URL (as an
//! admin, leaving caBundle alone); everything else is the chart's.
//!
//! * several replicas starting on the empty Secret agree on one CA, inject it into both
//!   configurations and the CRD, and the API server's reviews and conversions pass;
//! * a restart with the CA Secret present serves from the same CA and writes nothing;
//!   an emptied Secret is restored from a running replica's memory;
//! * a rotation (a CA seeded near its end) during continuous admission and conversion
//!   traffic: no review fails, and the replica ends up serving from the new CA.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::AppService;
use harness::{ControlPlane, Options, eventually};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::sync::{Mutex, OnceCell};

const RELEASE: &str = "aso";
const NAMESPACE: &str = "appservice-system";
const WEBHOOK: &str = "aso-appservice-operator-webhook";
const CA_SECRET: &str = "aso-appservice-operator-webhook-ca";
const CRD_NAME: &str = "appservices.platform.example.com";

/// The tests share one install and its CA Secret: one at a time.
static SERIAL: Mutex<()> = Mutex::const_new(());

fn init() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

fn chart_dir() -> PathBuf {
    harness::assets::workspace_root().join("charts/appservice-operator")
}

fn helm(args: &[&str]) -> (bool, String, String) {
    let helm = harness::assets::bin_dir()
        .expect("asset binaries (cargo xtask assets)")
        .join("helm");
    let home = std::env::temp_dir().join("aso-helm-ca");
    let out = Command::new(helm)
        .args(args)
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .expect("running helm");
    harness::process::outcome(&out)
}

/// What the chart's webhook Deployment is told (env by name).
fn rendered_env() -> BTreeMap<String, String> {
    let chart = chart_dir();
    let (ok, stdout, stderr) = helm(&[
        "template",
        RELEASE,
        chart.to_str().unwrap(),
        "--namespace",
        NAMESPACE,
    ]);
    assert!(ok, "helm template: {stderr}");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&stdout).unwrap();
    let deploy = docs
        .iter()
        .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == WEBHOOK)
        .expect("the webhook Deployment");
    deploy["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| {
            Some((
                e["name"].as_str()?.to_owned(),
                e["value"].as_str()?.to_owned(),
            ))
        })
        .collect()
}

struct Installed {
    cp: ControlPlane,
    /// The port the in-process webhooks serve on (the configurations point at it).
    port: u16,
}

/// A private control plane with the chart installed (the CRD too, adopted from the
/// harness as docs/operators/upgrading.md says), its configurations pointed at
/// `127.0.0.1:<port>`.
async fn installed() -> &'static Installed {
    static INSTALLED: OnceCell<Installed> = OnceCell::const_new();
    INSTALLED
        .get_or_init(|| async {
            init();
            let cp = ControlPlane::start(Options::plain()).await.expect("control plane");
            let admin = cp.client();
            let ns: Namespace =
                serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).unwrap();
            Api::<Namespace>::all(admin.clone())
                .create(&PostParams::default(), &ns)
                .await
                .expect("release namespace");
            // Let the release adopt the CRD the harness installed.
            let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
            crds.patch(
                CRD_NAME,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {
                    "labels": {"app.kubernetes.io/managed-by": "Helm"},
                    "annotations": {"meta.helm.sh/release-name": RELEASE, "meta.helm.sh/release-namespace": NAMESPACE},
                }})),
            )
            .await
            .expect("adopting the CRD");
            let chart = chart_dir();
            let kubeconfig = cp.kubeconfig_path().to_str().unwrap().to_owned();
            let (ok, stdout, stderr) = helm(&[
                "install",
                RELEASE,
                chart.to_str().unwrap(),
                "--namespace",
                NAMESPACE,
                "--kubeconfig",
                &kubeconfig,
            ]);
            assert!(ok, "helm install failed:\n{stdout}\n{stderr}");

            let port = harness::process::free_port().expect("a free port");
            let base = format!("https://127.0.0.1:{port}");
            for (kind, path) in [("mutating", "/mutate"), ("validating", "/validate")] {
                // JSON patch: the service reference becomes a URL; caBundle stays.
                let patch: json_patch::Patch = serde_json::from_value(json!([
                    {"op": "remove", "path": "/webhooks/0/clientConfig/service"},
                    {"op": "add", "path": "/webhooks/0/clientConfig/url", "value": format!("{base}{path}")},
                ]))
                .unwrap();
                let params = PatchParams::default();
                if kind == "mutating" {
                    Api::<MutatingWebhookConfiguration>::all(admin.clone())
                        .patch(WEBHOOK, &params, &Patch::<()>::Json(patch))
                        .await
                        .expect("pointing the mutating webhook at the test");
                } else {
                    Api::<ValidatingWebhookConfiguration>::all(admin.clone())
                        .patch(WEBHOOK, &params, &Patch::<()>::Json(patch))
                        .await
                        .expect("pointing the validating webhook at the test");
                }
            }
            crds.patch(
                CRD_NAME,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"conversion": {"webhook": {"clientConfig": {
                    "service": null, "url": format!("{base}/convert"),
                }}}}})),
            )
            .await
            .expect("pointing the conversion webhook at the test");
            // The API server loads new admission policies a moment after they are
            // written: installed means the chart's policies are in effect, here the one
            // that limits the webhook's Secret writes (a dry run writes nothing).
            let probe: Secret =
                serde_json::from_value(json!({"metadata": {"name": "policy-probe"}})).unwrap();
            let dry_run = PostParams {
                dry_run: true,
                ..PostParams::default()
            };
            let as_webhook = Api::<Secret>::namespaced(webhook_identity(&cp), NAMESPACE);
            eventually("the chart's admission policies in effect", Duration::from_secs(30), || {
                let (as_webhook, probe, dry_run) = (&as_webhook, &probe, &dry_run);
                async move {
                    matches!(
                        as_webhook.create(dry_run, probe).await,
                        Err(kube::Error::Api(s)) if s.code == 403
                            && s.message.contains("may only write its CA Secret")
                    )
                    .then_some(())
                }
            })
            .await
            .expect("the webhook's Secret policy takes effect");
            Installed { cp, port }
        })
        .await
}

/// The chart's webhook ServiceAccount, impersonated.
fn webhook_identity(cp: &ControlPlane) -> Client {
    let namespace_group = format!("system:serviceaccounts:{NAMESPACE}");
    cp.impersonating_client(
        &format!("system:serviceaccount:{NAMESPACE}:{WEBHOOK}"),
        &[
            "system:serviceaccounts",
            &namespace_group,
            "system:authenticated",
        ],
    )
    .expect("impersonating client")
}

/// A webhook replica as the chart runs it: its env, its identity, on `port` (0: any).
async fn replica(cp: &ControlPlane, port: u16) -> webhook::Server {
    let env = rendered_env();
    let mut config = webhook::config::Config::local(
        PathBuf::from("/nonexistent/tls.crt"),
        PathBuf::from("/nonexistent/tls.key"),
        None,
    );
    config.listen = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    config.ca_secret = Some(env["WEBHOOK_CA_SECRET"].clone());
    config.ca_secret_namespace = NAMESPACE.to_owned();
    // The chart's names, and the address the API server calls here.
    config.tls_sans = env["WEBHOOK_TLS_SANS"]
        .split(',')
        .map(str::to_owned)
        .collect();
    config.tls_sans.push("127.0.0.1".to_owned());
    config.ca_bundle_targets = env["WEBHOOK_CA_BUNDLE_TARGETS"]
        .split(',')
        .map(|t| t.parse().expect("target"))
        .collect();
    config.ca_validity_days = env["WEBHOOK_CA_VALIDITY_DAYS"].parse().unwrap();
    assert_eq!(
        config.ca_bundle_targets.len(),
        3,
        "both configurations and the CRD"
    );
    webhook::server::start_with_client(&config, Some(webhook_identity(cp)))
        .await
        .expect("webhook starts")
}

async fn ready(server: &webhook::Server) {
    let state = server.state().clone();
    eventually("the replica ready", Duration::from_secs(60), || {
        let state = state.clone();
        async move {
            state
                .readiness()
                .map(Some)
                .map_err(|e| -> Box<dyn std::error::Error + Send + Sync> { e.into() })
        }
    })
    .await
    .unwrap();
}

/// The caBundles of the three configurations, as PEM text.
async fn bundles(admin: &Client) -> [String; 3] {
    let text =
        |b: Option<ByteString>| String::from_utf8(b.map(|b| b.0).unwrap_or_default()).unwrap();
    let m = Api::<MutatingWebhookConfiguration>::all(admin.clone())
        .get(WEBHOOK)
        .await
        .unwrap();
    let v = Api::<ValidatingWebhookConfiguration>::all(admin.clone())
        .get(WEBHOOK)
        .await
        .unwrap();
    let c = Api::<CustomResourceDefinition>::all(admin.clone())
        .get(CRD_NAME)
        .await
        .unwrap();
    [
        text(m.webhooks.unwrap()[0].client_config.ca_bundle.clone()),
        text(v.webhooks.unwrap()[0].client_config.ca_bundle.clone()),
        text(
            c.spec
                .conversion
                .unwrap()
                .webhook
                .unwrap()
                .client_config
                .unwrap()
                .ca_bundle,
        ),
    ]
}

async fn ca_secret(admin: &Client) -> Secret {
    Api::<Secret>::namespaced(admin.clone(), NAMESPACE)
        .get(CA_SECRET)
        .await
        .unwrap()
}

fn data(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()?
        .get(key)
        .map(|v| String::from_utf8(v.0.clone()).unwrap())
}

fn der(pem: &str) -> Vec<Vec<u8>> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .map(|c| c.unwrap().to_vec())
        .collect()
}

/// Whether `addr` serves a certificate that `ca_pem` (alone) vouches for as the
/// webhook Service's name: what the API server checks.
async fn served_from(addr: std::net::SocketAddr, ca_pem: &str) -> bool {
    served_as(addr, ca_pem, &format!("{WEBHOOK}.{NAMESPACE}.svc")).await
}

/// [`served_from`] for the Service name `name`.
async fn served_as(addr: std::net::SocketAddr, ca_pem: &str, name: &str) -> bool {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let Ok(tcp) = tokio::net::TcpStream::connect(addr).await else {
        return false;
    };
    let name = ServerName::try_from(name.to_owned()).unwrap();
    connector.connect(name, tcp).await.is_ok()
}

/// As after `helm install`: the CA Secret empty, no caBundle anywhere.
async fn fresh_install(admin: &Client) {
    set_secret_data(admin, BTreeMap::new()).await;
    for (kind, entry) in [
        ("mutating", "mutate.appservices.platform.example.com"),
        ("validating", "validate.appservices.platform.example.com"),
    ] {
        let patch = json!({"webhooks": [{"name": entry, "clientConfig": {"caBundle": null}}]});
        if kind == "mutating" {
            Api::<MutatingWebhookConfiguration>::all(admin.clone())
                .patch(WEBHOOK, &PatchParams::default(), &Patch::Strategic(&patch))
                .await
                .unwrap();
        } else {
            Api::<ValidatingWebhookConfiguration>::all(admin.clone())
                .patch(WEBHOOK, &PatchParams::default(), &Patch::Strategic(&patch))
                .await
                .unwrap();
        }
    }
    Api::<CustomResourceDefinition>::all(admin.clone())
        .patch(
            CRD_NAME,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"conversion": {"webhook": {"clientConfig": {"caBundle": null}}}}}),
            ),
        )
        .await
        .unwrap();
}

/// Sets the CA Secret's data as an admin (an emptied or seeded Secret).
async fn set_secret_data(admin: &Client, data: BTreeMap<String, ByteString>) {
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), NAMESPACE);
    let mut secret = secrets.get(CA_SECRET).await.unwrap();
    secret.data = Some(data);
    secrets
        .replace(CA_SECRET, &PostParams::default(), &secret)
        .await
        .unwrap();
}

async fn test_namespace(cp: &ControlPlane) -> harness::TestNamespace {
    cp.namespace().await.expect("namespace")
}

fn app(name: &str) -> AppService {
    common::testing::app(name, "registry.example.com/hello:v1.0.0").build()
}

/// The API server's view, through our webhook: a create is defaulted by /mutate and
/// admitted by /validate; a v1alpha1 read is converted by /convert.
async fn admission_works(admin: &Client, ns: &str, name: &str) {
    let apps: Api<AppService> = Api::namespaced(admin.clone(), ns);
    let mut created = apps
        .create(&PostParams::default(), &app(name))
        .await
        .expect("create through the webhook");
    // /mutate adds the app.kubernetes.io/name label (the schema does not).
    let labels = created.metadata.labels.take().unwrap_or_default();
    assert_eq!(
        labels.get("app.kubernetes.io/name").map(String::as_str),
        Some(name),
        "mutated by the webhook"
    );
    let gvk = GroupVersionKind::gvk("platform.example.com", "v1alpha1", "AppService");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "appservices");
    let old: Api<DynamicObject> = Api::namespaced_with(admin.clone(), ns, &resource);
    let read = old
        .get(name)
        .await
        .expect("read in v1alpha1 through /convert");
    assert_eq!(read.data["spec"]["port"], 8080, "{:?}", read.data);
}

/// Two replicas on the empty Secret agree on one CA and inject it everywhere; the API
/// server's reviews and conversions pass; a restart keeps the CA and writes nothing; an
/// emptied Secret is restored from memory.
#[tokio::test]
async fn replicas_agree_on_one_ca_and_a_restart_keeps_it() {
    let _one = SERIAL.lock().await;
    let inst = installed().await;
    let cp = &inst.cp;
    let _logs = cp.log_guard();
    let admin = cp.client();
    fresh_install(&admin).await;

    // One replica on the configured port, one elsewhere (as two Pods): both at once.
    let (a, b) = tokio::join!(replica(cp, inst.port), replica(cp, 0));
    ready(&a).await;
    ready(&b).await;
    let secret = ca_secret(&admin).await;
    let ca = data(&secret, "ca.crt").expect("a CA in the Secret");
    assert_eq!(der(&ca).len(), 1);
    assert!(data(&secret, "next.crt").is_none());
    for bundle in bundles(&admin).await {
        assert_eq!(der(&bundle), der(&ca), "every caBundle is exactly the CA");
    }
    assert!(served_from(a.tls_addr(), &ca).await);
    assert!(served_from(b.tls_addr(), &ca).await);
    let ns = test_namespace(cp).await;
    admission_works(&admin, &ns, "first").await;

    // A restart with the Secret present: same CA, nothing written.
    let secret_version = ca_secret(&admin).await.metadata.resource_version;
    let mwc = Api::<MutatingWebhookConfiguration>::all(admin.clone());
    let mwc_version = mwc.get(WEBHOOK).await.unwrap().metadata.resource_version;
    a.shutdown().await.unwrap();
    let a = replica(cp, inst.port).await;
    ready(&a).await;
    assert!(
        served_from(a.tls_addr(), &ca).await,
        "the restarted replica serves from the same CA"
    );
    assert_eq!(
        ca_secret(&admin).await.metadata.resource_version,
        secret_version
    );
    assert_eq!(
        mwc.get(WEBHOOK).await.unwrap().metadata.resource_version,
        mwc_version
    );
    admission_works(&admin, &ns, "after-restart").await;

    // The Secret emptied (a GitOps tool replacing it with the chart's empty one): a
    // replica puts the same CA back.
    set_secret_data(&admin, BTreeMap::new()).await;
    eventually("the CA restored", Duration::from_secs(30), || {
        let (admin, ca) = (admin.clone(), ca.clone());
        async move { (data(&ca_secret(&admin).await, "ca.crt")? == ca).then_some(()) }
    })
    .await
    .unwrap();
    admission_works(&admin, &ns, "after-restore").await;

    // The Secret deleted: a replica creates it again (the one name its admission policy
    // lets it create), with the same CA.
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), NAMESPACE);
    secrets
        .delete(CA_SECRET, &kube::api::DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the CA Secret created again",
        Duration::from_secs(30),
        || {
            let (secrets, ca) = (secrets.clone(), ca.clone());
            async move {
                let secret = secrets.get_opt(CA_SECRET).await.ok()??;
                (data(&secret, "ca.crt")? == ca).then_some(())
            }
        },
    )
    .await
    .unwrap();
    // Any other Secret write of the webhook's identity is refused by that policy.
    let other: Secret = serde_json::from_value(
        json!({"metadata": {"name": "not-the-ca"}, "stringData": {"k": "v"}}),
    )
    .unwrap();
    let refused = Api::<Secret>::namespaced(webhook_identity(cp), NAMESPACE)
        .create(&PostParams::default(), &other)
        .await
        .expect_err("the webhook creates another Secret");
    assert!(
        matches!(&refused, kube::Error::Api(s) if s.code == 403
            && s.message.contains("ValidatingAdmissionPolicy 'aso-appservice-operator-webhook-ca-secret'")
            && s.message.contains("may only write its CA Secret")),
        "{refused}"
    );
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
    ns.cleanup().await.unwrap();
}

/// Continuous traffic through the API server: creates (dry-run: /mutate and /validate)
/// and reads in v1alpha1 (/convert), counted.
struct Traffic {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failures: Arc<std::sync::Mutex<Vec<String>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Traffic {
    fn start(admin: &Client, ns: &str) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for worker in 0..2 {
            let (stop, ok, failures) = (stop.clone(), ok.clone(), failures.clone());
            let apps: Api<AppService> = Api::namespaced(admin.clone(), ns);
            let gvk = GroupVersionKind::gvk("platform.example.com", "v1alpha1", "AppService");
            let resource = ApiResource::from_gvk_with_plural(&gvk, "appservices");
            let old: Api<DynamicObject> = Api::namespaced_with(admin.clone(), ns, &resource);
            tasks.push(tokio::spawn(async move {
                let dry = PostParams {
                    dry_run: true,
                    ..PostParams::default()
                };
                let mut n = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    n += 1;
                    let result = if n.is_multiple_of(2) {
                        apps.create(&dry, &app(&format!("t{worker}-{n}")))
                            .await
                            .map(|_| ())
                    } else {
                        old.list(&ListParams::default()).await.map(|_| ())
                    };
                    match result {
                        Ok(()) => drop(ok.fetch_add(1, Ordering::SeqCst)),
                        Err(e) => failures.lock().unwrap().push(e.to_string()),
                    }
                }
            }));
        }
        Traffic {
            stop,
            ok,
            failures,
            tasks,
        }
    }

    async fn stop(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::SeqCst);
        for task in self.tasks {
            task.await.unwrap();
        }
        let failures = self.failures.lock().unwrap().clone();
        (self.ok.load(Ordering::SeqCst), failures)
    }
}

/// A CA near the end of its life, rotated while the API server keeps sending reviews and
/// conversions: none fails, and the replica ends up serving from the new CA while the old
/// one is still trusted.
#[tokio::test]
async fn rotation_during_admission_traffic_fails_no_review() {
    let _one = SERIAL.lock().await;
    let inst = installed().await;
    let cp = &inst.cp;
    let _logs = cp.log_guard();
    let admin = cp.client();

    // A CA made ten days ago that expires in an hour (past two thirds of its life), in
    // the Secret and in every caBundle, as a previous replica left it.
    let now = jiff::Timestamp::now().as_second();
    let old = certs::Ca::with_period(
        "expiring webhook CA",
        certs::Validity {
            not_before: now - 10 * 24 * 3600,
            not_after: now + 3600,
        },
    )
    .unwrap();
    set_secret_data(
        &admin,
        BTreeMap::from([
            (
                "ca.crt".to_owned(),
                ByteString(old.cert_pem().as_bytes().to_vec()),
            ),
            (
                "ca.key".to_owned(),
                ByteString(old.key_pem().as_bytes().to_vec()),
            ),
        ]),
    )
    .await;
    let encoded = serde_json::to_value(ByteString(old.cert_pem().as_bytes().to_vec())).unwrap();
    for api in ["mutating", "validating"] {
        let patch = json!({"webhooks": [{"name": if api == "mutating" { "mutate.appservices.platform.example.com" } else { "validate.appservices.platform.example.com" }, "clientConfig": {"caBundle": encoded}}]});
        if api == "mutating" {
            Api::<MutatingWebhookConfiguration>::all(admin.clone())
                .patch(WEBHOOK, &PatchParams::default(), &Patch::Strategic(&patch))
                .await
                .unwrap();
        } else {
            Api::<ValidatingWebhookConfiguration>::all(admin.clone())
                .patch(WEBHOOK, &PatchParams::default(), &Patch::Strategic(&patch))
                .await
                .unwrap();
        }
    }
    Api::<CustomResourceDefinition>::all(admin.clone())
        .patch(
            CRD_NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"conversion": {"webhook": {"clientConfig": {"caBundle": encoded}}}}})),
        )
        .await
        .unwrap();

    let ns = test_namespace(cp).await;
    let apps: Api<AppService> = Api::namespaced(admin.clone(), &ns);
    let server = replica(cp, inst.port).await;
    ready(&server).await;
    // Something for the v1alpha1 lists to convert.
    for name in ["one", "two"] {
        apps.create(&PostParams::default(), &app(name))
            .await
            .unwrap();
    }
    let traffic = Traffic::start(&admin, &ns);

    // The rotation: a next CA joins every bundle, then signs once the bundles carried it
    // for the propagation delay; the replica switches its serving certificate.
    let old_pem = old.cert_pem().to_owned();
    let new_ca = eventually("the CA rotated", Duration::from_secs(180), || {
        let admin = admin.clone();
        let old_pem = old_pem.clone();
        async move {
            let active = data(&ca_secret(&admin).await, "ca.crt")?;
            (der(&active) != der(&old_pem)).then_some(active)
        }
    })
    .await
    .unwrap();
    let addr = server.tls_addr();
    eventually(
        "the replica serving from the new CA",
        Duration::from_secs(30),
        || {
            let new_ca = new_ca.clone();
            async move { served_from(addr, &new_ca).await.then_some(()) }
        },
    )
    .await
    .unwrap();
    // A few more reviews under the new certificate.
    let ok_before = traffic.ok.load(Ordering::SeqCst);
    eventually(
        "more reviews after the switch",
        Duration::from_secs(60),
        || {
            let ok = traffic.ok.clone();
            async move { (ok.load(Ordering::SeqCst) >= ok_before + 20).then_some(()) }
        },
    )
    .await
    .unwrap();
    let (ok, failures) = traffic.stop().await;
    assert!(
        failures.is_empty(),
        "{} of {} requests failed: {:?}",
        failures.len(),
        ok as usize + failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert!(ok >= 50, "only {ok} requests");
    eprintln!("rotation: {ok} requests through the webhook, none failed");

    // The old CA is still trusted (retired), next to the new one, everywhere.
    let secret = ca_secret(&admin).await;
    assert_eq!(der(&data(&secret, "retired.crt").unwrap()), der(&old_pem));
    for bundle in bundles(&admin).await {
        let certs = der(&bundle);
        assert!(
            certs.contains(&der(&new_ca)[0]) && certs.contains(&der(&old_pem)[0]),
            "{bundle}"
        );
    }
    assert!(
        !served_from(addr, &old_pem).await,
        "no longer serving from the old CA"
    );
    server.shutdown().await.unwrap();
    ns.cleanup().await.unwrap();
}

/// The upgrade from the chart that minted its CA with Helm (`e2e/fixtures/upgrade/
/// chart-helm-ca`, the previous release's certificate templates): `helm upgrade` keeps
/// the caBundle the old Pods' certificate needs, the first new replica adds its own CA
/// next to it before it is ready, both certificates verify against every bundle, and a
/// second `helm upgrade` changes no caBundle.
#[tokio::test]
async fn upgrade_from_the_helm_minted_ca_keeps_every_certificate_trusted() {
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

    let _one = SERIAL.lock().await;
    let inst = installed().await;
    let cp = &inst.cp;
    let _logs = cp.log_guard();
    let admin = cp.client();
    const LEGACY: &str = "legacy";
    const LEGACY_NS: &str = "legacy-system";
    let legacy_webhook = "legacy-appservice-operator-webhook";
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": LEGACY_NS}})).unwrap();
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let kubeconfig = cp.kubeconfig_path().to_str().unwrap().to_owned();
    let fixture = harness::assets::workspace_root().join("e2e/fixtures/upgrade/chart-helm-ca");
    // Its webhooks see no namespace the other tests use (no Pod of it serves here).
    let only_marked = [
        "--set",
        "webhook.namespaceSelectorExpressions[0].key=appservice-tests.example.com/legacy-only",
        "--set",
        "webhook.namespaceSelectorExpressions[0].operator=Exists",
    ];
    // The fixture holds only the certificate templates: no CRD (the harness has one).
    let mut install = vec![
        "install",
        LEGACY,
        fixture.to_str().unwrap(),
        "--namespace",
        LEGACY_NS,
        "--kubeconfig",
        &kubeconfig,
        "--set",
        "crd.install=false",
    ];
    install.extend(only_marked);
    let (ok, out, err) = helm(&install);
    assert!(ok, "installing the previous chart:\n{out}\n{err}");
    let old_tls = Api::<Secret>::namespaced(admin.clone(), LEGACY_NS)
        .get(&format!("{legacy_webhook}-tls"))
        .await
        .unwrap();
    let old_ca = data(&old_tls, "ca.crt").unwrap();
    let old_leaf = data(&old_tls, "tls.crt").unwrap();
    let mwc = Api::<MutatingWebhookConfiguration>::all(admin.clone());
    let vwc = Api::<ValidatingWebhookConfiguration>::all(admin.clone());
    let bundle_of = |b: Option<ByteString>| String::from_utf8(b.unwrap().0).unwrap();
    let live = || async {
        (
            bundle_of(
                mwc.get(legacy_webhook).await.unwrap().webhooks.unwrap()[0]
                    .client_config
                    .ca_bundle
                    .clone(),
            ),
            bundle_of(
                vwc.get(legacy_webhook).await.unwrap().webhooks.unwrap()[0]
                    .client_config
                    .ca_bundle
                    .clone(),
            ),
        )
    };
    assert_eq!(live().await, (old_ca.clone(), old_ca.clone()));

    // The upgrade itself: the old CA stays in both bundles (no moment without it).
    let chart = chart_dir();
    let upgrade = || {
        // As docs/operators/upgrading.md says to upgrade: the previous release's values, reused.
        let mut args = vec![
            "upgrade",
            LEGACY,
            chart.to_str().unwrap(),
            "--namespace",
            LEGACY_NS,
            "--kubeconfig",
            &kubeconfig,
            "--reuse-values",
            "--set",
            "crd.install=false",
        ];
        args.extend(only_marked);
        helm(&args)
    };
    let (ok, out, err) = upgrade();
    assert!(ok, "helm upgrade:\n{out}\n{err}");
    assert_eq!(
        live().await,
        (old_ca.clone(), old_ca.clone()),
        "the upgrade kept the caBundle"
    );
    assert!(
        Api::<Secret>::namespaced(admin.clone(), LEGACY_NS)
            .get_opt(&format!("{legacy_webhook}-tls"))
            .await
            .unwrap()
            .is_none(),
        "the Helm-made serving Secret is gone with the old templates"
    );

    // The first new replica (the release's identity and settings). Nothing needs the
    // API server to call it here: it must put its CA into the bundles before it is ready.
    let identity = cp
        .impersonating_client(
            &format!("system:serviceaccount:{LEGACY_NS}:{legacy_webhook}"),
            &["system:serviceaccounts", "system:authenticated"],
        )
        .unwrap();
    let mut config = webhook::config::Config::local(
        PathBuf::from("/nonexistent"),
        PathBuf::from("/nonexistent"),
        None,
    );
    config.ca_secret = Some(format!("{legacy_webhook}-ca"));
    config.ca_secret_namespace = LEGACY_NS.to_owned();
    config.tls_sans = vec![
        format!("{legacy_webhook}.{LEGACY_NS}.svc"),
        "127.0.0.1".to_owned(),
    ];
    config.ca_bundle_targets = vec![
        format!("mutating/{legacy_webhook}").parse().unwrap(),
        format!("validating/{legacy_webhook}").parse().unwrap(),
    ];
    let server = webhook::server::start_with_client(&config, Some(identity))
        .await
        .unwrap();
    ready(&server).await;
    let new_ca = data(
        &Api::<Secret>::namespaced(admin.clone(), LEGACY_NS)
            .get(&format!("{legacy_webhook}-ca"))
            .await
            .unwrap(),
        "ca.crt",
    )
    .unwrap();
    let (m, v) = live().await;
    assert_eq!(m, v);
    // Both the old Pods' certificate and the new replica's verify against the bundle.
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(m.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let verifier = rustls::client::WebPkiServerVerifier::builder(Arc::new(roots))
        .build()
        .unwrap();
    let name = ServerName::try_from(format!("{legacy_webhook}.{LEGACY_NS}.svc")).unwrap();
    let leaf = CertificateDer::from_pem_slice(old_leaf.as_bytes()).unwrap();
    verifier
        .verify_server_cert(&leaf, &[], &name, &[], UnixTime::now())
        .expect("the old Pods' certificate is still trusted");
    assert!(
        served_as(
            server.tls_addr(),
            &new_ca,
            &format!("{legacy_webhook}.{LEGACY_NS}.svc")
        )
        .await
    );
    let bundle = der(&m);
    assert!(bundle.contains(&der(&new_ca)[0]) && bundle.contains(&der(&old_ca)[0]));

    // Another helm upgrade renders the live bundle back: nothing changes.
    let before = live().await;
    let (ok, out, err) = upgrade();
    assert!(ok, "second helm upgrade:\n{out}\n{err}");
    assert_eq!(live().await, before, "helm upgrade changed no caBundle");
    server.shutdown().await.unwrap();
    let (ok, out, err) = helm(&[
        "uninstall",
        LEGACY,
        "--namespace",
        LEGACY_NS,
        "--kubeconfig",
        &kubeconfig,
    ]);
    assert!(ok, "helm uninstall:\n{out}\n{err}");
}
