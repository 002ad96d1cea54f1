//! `cargo xtask demo`: everything running locally, the way a cluster runs it.
//!
//! A full control plane (kube-apiserver, etcd, kube-controller-manager, kube-scheduler)
//! with a real node (containerd, the kubelet, kube-proxy: the Pods' containers run), the
//! webhook over TLS registered with a caBundle, and the controller with leader election,
//! each as its real binary, and a PostgreSQL server offered as the DatabaseClass
//! `production-postgresql` (examples/appservice.yaml asks for a database on it). The
//! examples' images (`registry.example.com/hello`, `.../checkout`) are the harness's
//! `hello` program, built here and served from the node's registry under those names.
//! The `demo` namespace enforces Pod Security `restricted`, as many platforms' namespaces
//! do: the AppServices' Pods are admitted under it. Then the examples are applied with
//! kubectl, an invalid one is shown being rejected, the AppServices are watched until
//! Ready, and each application is called through its Service: checkout says whether it
//! reaches its database with what its Pod got.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use harness::real_node::ImageSpec;
use k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use tokio::process::{Child, Command};

use common::{AppService, DatabaseClass};

use crate::Doing as _;

const NAMESPACE: &str = "demo";
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// The class examples/appservice.yaml asks for.
const DATABASE_CLASS: &str = "production-postgresql";
/// Where the controller reads admin Secrets: its lease namespace in the demo.
const CONTROLLER_NAMESPACE: &str = "default";
/// The registry the examples name.
const EXAMPLE_REGISTRY: &str = "registry.example.com";
/// An image's environment: (name, value).
type Env = &'static [(&'static str, &'static str)];
/// The examples' images (repository, tag, environment of the image), each the `hello`
/// program answering with its version; checkout listens on both of its ports.
const EXAMPLE_IMAGES: &[(&str, &str, Env)] = &[
    ("hello", "v1.0.0", &[("APP_VERSION", "v1.0.0")]),
    (
        "checkout",
        "v3.4.0",
        &[("APP_VERSION", "v3.4.0"), ("HELLO_PORTS", "8080,9090")],
    ),
];
/// How long an application may take to answer through its Service once Ready (kube-proxy
/// programs the Service a moment after the EndpointSlice changes).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

pub fn run(root: &Path, exit_when_ready: bool) -> Result<()> {
    let (bin, binaries) = build(root)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .doing("starting the tokio runtime")?;
    runtime.block_on(demo(root, &bin, &binaries, exit_when_ready))
}

struct Binaries {
    webhook: PathBuf,
    controller: PathBuf,
}

/// What the demo runs, built side by side where it is missing: the control plane's
/// binaries from their Go modules (`crate::control_plane_assets`, nothing the tests alone
/// need), PostgreSQL from Debian's package, and the webhook and the controller. Says what
/// is built and how long it should take; returns the asset directory and the binaries.
fn build(root: &Path) -> Result<(PathBuf, Binaries)> {
    let started = std::time::Instant::now();
    println!(
        "the demo runs a control plane ({}), PostgreSQL, and appservice-webhook and \
         appservice-controller; building what is missing, the Go binaries beside the Rust ones",
        crate::control_plane_assets().join(", ")
    );
    let assets = std::thread::spawn(|| crate::assets_only(false, &crate::control_plane_assets()));
    let packages = std::thread::spawn(crate::ensure_packages);
    let binaries = timed_cargo_build(root);
    let bin = crate::joined(assets, "the asset build")?;
    crate::joined(packages, "the package install")?;
    let binaries = binaries?;
    println!(
        "everything the demo runs is built ({:.0?})",
        started.elapsed()
    );
    Ok((bin, binaries))
}

/// The seconds the demo's cargo build took from an empty target directory on the 2-core
/// reference machine: the estimate until a build here measured its own.
const CARGO_BUILD_REFERENCE_SECS: u64 = 300;

/// Where the last cargo build's duration is kept.
fn cargo_seconds_file() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .map(|h| PathBuf::from(h).join(".cache/appservice-operator/.seconds-demo-binaries"))
}

/// `cargo build` of the webhook and the controller, announced with how long it should
/// take; returns where cargo put them. A build that had something to compile records its
/// time for the next estimate.
fn timed_cargo_build(root: &Path) -> Result<Binaries> {
    let file = cargo_seconds_file();
    let (estimate, measured) = match file
        .as_ref()
        .and_then(|f| std::fs::read_to_string(f).ok())
        .and_then(|s| s.trim().parse::<u64>().ok())
    {
        Some(secs) => (secs, "as measured here last time"),
        None => (
            CARGO_BUILD_REFERENCE_SECS,
            "from an empty target directory on 2 cores",
        ),
    };
    println!(
        "building appservice-webhook and appservice-controller with cargo: up to about {} min ({measured}), far less when they are built already",
        estimate.div_ceil(60)
    );
    let started = std::time::Instant::now();
    // Cargo's progress goes to stderr as usual; its JSON messages on stdout say where the
    // executables are.
    let out = std::process::Command::new(crate::tools::cargo())
        .current_dir(root)
        .args(["build", "--message-format=json-render-diagnostics"])
        .args(["-p", "appservice-webhook", "--bin", "appservice-webhook"])
        .args([
            "-p",
            "appservice-controller",
            "--bin",
            "appservice-controller",
        ])
        .stderr(Stdio::inherit())
        .output()
        .doing("running cargo build")?;
    if !out.status.success() {
        bail!("building the binaries failed ({})", out.status);
    }
    let secs = started.elapsed().as_secs();
    // Only a build that compiled something says how long one takes.
    if secs > 30
        && let Some(f) = file
    {
        let _ = std::fs::write(f, secs.to_string());
    }
    let mut webhook = None;
    let mut controller = None;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let exe = msg["executable"].as_str().map(PathBuf::from);
        match msg["target"]["name"].as_str() {
            Some("appservice-webhook") => webhook = exe.or(webhook),
            Some("appservice-controller") => controller = exe.or(controller),
            _ => {}
        }
    }
    Ok(Binaries {
        webhook: webhook.context("cargo reported no appservice-webhook executable")?,
        controller: controller.context("cargo reported no appservice-controller executable")?,
    })
}

async fn demo(root: &Path, bin: &Path, binaries: &Binaries, exit_when_ready: bool) -> Result<()> {
    let cp = harness::ControlPlane::start(harness::Options::real_node())
        .await
        .doing("starting the control plane and its real node")?;
    let node = cp
        .node()
        .context("the control plane started without its real node")?;
    for (repo, tag, env) in EXAMPLE_IMAGES {
        node.push_image(ImageSpec {
            repo,
            tag,
            program: "hello",
            user: harness::real_node::NONROOT,
            env,
        })
        .await
        .doing(format!(
            "building the image {EXAMPLE_REGISTRY}/{repo}:{tag}"
        ))?;
    }
    node.mirror(EXAMPLE_REGISTRY)
        .doing("serving the examples' registry from the node's")?;
    let kubeconfig = cp.kubeconfig_path().to_owned();
    let logs = cp.log_dir().to_owned();
    println!(
        "control plane and real node {} up in {:.1?}; logs in {}",
        harness::real_node::NODE_NAME,
        cp.startup_time(),
        logs.display()
    );
    println!(
        "images {} built here (the `hello` program), served as {EXAMPLE_REGISTRY}/…",
        EXAMPLE_IMAGES
            .iter()
            .map(|(repo, tag, _)| format!("{repo}:{tag}"))
            .collect::<Vec<_>>()
            .join(", ")
    );

    let client = cp.try_client()?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(NAMESPACE.into()),
            labels: Some(
                [(
                    harness::POD_SECURITY_ENFORCE_LABEL.to_owned(),
                    harness::PodSecurityLevel::Restricted.as_str().to_owned(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        ..Default::default()
    };
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .doing("creating the demo namespace")?;
    println!(
        "namespace {NAMESPACE} enforces Pod Security {}",
        harness::PodSecurityLevel::Restricted.as_str()
    );

    // PostgreSQL for examples/appservice.yaml's database, offered as the DatabaseClass
    // `production-postgresql`; its admin Secret and CA live in the controller's namespace.
    // It listens on the node's gateway too: the address the Pods reach this machine at.
    let pg = harness::Postgres::start_also_on(
        harness::real_node::NODE_GATEWAY,
        harness::real_node::POD_CIDR,
    )
    .await
    .doing("starting PostgreSQL")?;
    database_class(&client, &pg).await?;
    println!(
        "PostgreSQL {} on {}:{} (TLS), offered as DatabaseClass {DATABASE_CLASS}",
        pg_version(&pg).await,
        harness::real_node::NODE_GATEWAY,
        pg.port()
    );

    // The webhook, over TLS with a certificate for 127.0.0.1 from a fresh CA.
    let (ca, serving) = harness::webhook_tls()?;
    let pki = logs.join("demo-pki");
    std::fs::create_dir_all(&pki).doing(format!("creating {}", pki.display()))?;
    let (cert, key) = (pki.join("tls.crt"), pki.join("tls.key"));
    serving.write(&cert, &key)?;
    let webhook_port = harness::process::free_port()?;
    let webhook_ops = harness::process::free_port()?;
    let policies = root.join("examples/policies/no-latest-in-production.yaml");
    let mut webhook = spawn(
        &binaries.webhook,
        &logs.join("webhook.log"),
        &kubeconfig,
        &[
            // As the chart runs it: /scale writes are judged on the watched AppServices.
            "--watch-appservices".into(),
            "--listen".into(),
            format!("127.0.0.1:{webhook_port}"),
            "--ops-listen".into(),
            format!("127.0.0.1:{webhook_ops}"),
            "--tls-cert".into(),
            cert.display().to_string(),
            "--tls-key".into(),
            key.display().to_string(),
            "--policies".into(),
            policies.display().to_string(),
            "--log-format".into(),
            "text".into(),
        ],
    )?;
    let webhooks = cp
        .register_webhooks(
            NAMESPACE,
            &format!("https://127.0.0.1:{webhook_port}"),
            ca.cert_pem(),
        )
        .await
        .doing("registering the webhooks")?;
    // The same server converts between v1alpha1 and v1beta1 (/convert), as the chart
    // wires it: `kubectl get appservices.v1alpha1.platform.example.com` reads losslessly.
    cp.use_conversion_webhook(
        &format!("https://127.0.0.1:{webhook_port}"),
        ca.cert_pem(),
        NAMESPACE,
    )
    .await
    .doing("setting the conversion webhook")?;
    println!(
        "webhook serving on https://127.0.0.1:{webhook_port} (ops http://127.0.0.1:{webhook_ops})"
    );

    // The controller, leader-elected, with the admin kubeconfig.
    let controller_ops = harness::process::free_port()?;
    let mut controller = spawn(
        &binaries.controller,
        &logs.join("controller.log"),
        &kubeconfig,
        &[
            "--kubeconfig".into(),
            kubeconfig.display().to_string(),
            "--lease-namespace".into(),
            "default".into(),
            "--identity".into(),
            "demo-controller".into(),
            "--ops-addr".into(),
            format!("127.0.0.1:{controller_ops}"),
            "--log-format".into(),
            "text".into(),
        ],
    )?;
    println!("controller running (ops http://127.0.0.1:{controller_ops})");

    let kubectl = |args: &[&str]| {
        let mut cmd = std::process::Command::new(bin.join("kubectl"));
        cmd.arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["-n", NAMESPACE])
            .args(args);
        cmd
    };
    let examples = root.join("examples");
    println!(
        "\n$ kubectl apply -f examples/appservice.yaml -f examples/minimal.yaml -f examples/appservice-v1alpha1.yaml"
    );
    let status = kubectl(&["apply", "-f"])
        .arg(examples.join("appservice.yaml"))
        .arg("-f")
        .arg(examples.join("minimal.yaml"))
        .arg("-f")
        .arg(examples.join("appservice-v1alpha1.yaml"))
        .status()
        .doing("running kubectl apply")?;
    if !status.success() {
        bail!("kubectl apply of the examples failed ({status})");
    }
    println!(
        "\n$ kubectl apply -f examples/invalid/webhook-rules.yaml   # every error in one answer"
    );
    let rejected = kubectl(&["apply", "-f"])
        .arg(examples.join("invalid/webhook-rules.yaml"))
        .status()
        .doing("running kubectl apply")?;
    if rejected.success() {
        bail!("the invalid example was accepted: is the webhook registered?");
    }

    println!("\nwaiting for the AppServices to become Ready …");
    let apps: Api<AppService> = Api::namespaced(client.clone(), NAMESPACE);
    let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
    loop {
        let list = apps
            .list(&Default::default())
            .await
            .doing("listing AppServices")?;
        let ready = list
            .items
            .iter()
            .filter(|a| {
                a.status.as_ref().is_some_and(|s| {
                    common::conditions::is_true(&s.conditions, common::conditions::READY)
                })
            })
            .count();
        if !list.items.is_empty() && ready == list.items.len() {
            break;
        }
        if let Some(code) = controller.try_wait().doing("checking the controller")? {
            bail!(
                "the controller exited ({code}); see {}",
                logs.join("controller.log").display()
            );
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "not every AppService became Ready within {READY_TIMEOUT:?}; see {}",
                logs.display()
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    println!("\n$ kubectl get appservices,deployments,services,secrets");
    kubectl(&["get", "appservices,deployments,services,secrets"])
        .status()
        .doing("running kubectl get")?;
    println!("\n$ kubectl get databaseclasses");
    kubectl(&["get", "databaseclasses"])
        .status()
        .doing("running kubectl get")?;
    let checkout = apps.get("checkout").await.doing("reading checkout")?;
    if let Some(c) = checkout
        .status
        .as_ref()
        .and_then(|s| common::conditions::find(&s.conditions, common::conditions::DATABASE_READY))
    {
        println!(
            "\ncheckout: DatabaseReady={} ({}): {}",
            c.status, c.reason, c.message
        );
    }

    // The applications answer, through their Services (kube-proxy, from this machine).
    let services: Api<Service> = Api::namespaced(client.clone(), NAMESPACE);
    for (app, path) in [("hello", "/"), ("checkout", "/"), ("checkout", "/db")] {
        let service = services
            .get(app)
            .await
            .doing(format!("reading Service {app}"))?;
        let spec = service.spec.unwrap_or_default();
        let addr = format!(
            "{}:{}",
            spec.cluster_ip.unwrap_or_default(),
            spec.ports.unwrap_or_default().first().map_or(0, |p| p.port)
        );
        println!("\n$ curl http://{addr}{path}   # {app}, through its Service");
        let answer = call(&addr, path).await?;
        println!("{answer}");
        if path == "/db" && !answer.contains("\"ok\":true") {
            bail!("{app} does not reach its database with what its Pod got: {answer}");
        }
    }

    if !exit_when_ready {
        println!("\nTry it yourself:\n");
        println!(
            "  export KUBECONFIG={} PATH={}:$PATH",
            kubeconfig.display(),
            bin.display()
        );
        println!("  kubectl -n {NAMESPACE} scale appservice/hello --replicas=3");
        println!("  kubectl -n {NAMESPACE} logs deploy/checkout");
        println!(
            "  kubectl -n {NAMESPACE} exec deploy/checkout -- /hello get http://127.0.0.1:8080/db"
        );
        println!("  kubectl -n {NAMESPACE} get appsrv -w");
        println!(
            "  kubectl -n {NAMESPACE} get appservices.v1alpha1.platform.example.com checkout -o yaml   # v1beta1 object, read in v1alpha1"
        );
        println!(
            "  kubectl -n {NAMESPACE} get secret checkout-database -o jsonpath='{{.data.DATABASE_URL}}' | base64 -d"
        );
        println!("\nLogs: {}. Ctrl-C stops everything.", logs.display());
        crate::stop_signal().await?;
    }
    println!("stopping");
    let _ = webhooks.remove(client).await;
    stop(&mut controller).await;
    stop(&mut webhook).await;
    drop(pg);
    drop(cp);
    Ok(())
}

/// Starts a binary with its output in `log`; killed when dropped.
/// Starts `exe` with `args`, its output in `log`, `KUBECONFIG` set to `kubeconfig` (the
/// webhook's watches read it from the environment).
fn spawn(exe: &Path, log: &Path, kubeconfig: &Path, args: &[String]) -> Result<Child> {
    let out = std::fs::File::create(log).doing(format!("creating {}", log.display()))?;
    let err = out.try_clone().doing("duplicating the log file handle")?;
    Command::new(exe)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .kill_on_drop(true)
        .spawn()
        .doing(format!("starting {}", exe.display()))
}

/// SIGTERM (so the controller releases its lease and the webhook drains), then SIGKILL.
async fn stop(child: &mut Child) {
    if let Some(pid) = child.id() {
        let _ = harness::process::signal(pid, "TERM");
        if tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .is_ok()
        {
            return;
        }
    }
    let _ = child.kill().await;
}

/// The admin Secret and CA of the demo's PostgreSQL, and the DatabaseClass naming it.
async fn database_class(client: &kube::Client, pg: &harness::Postgres) -> Result<()> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), CONTROLLER_NAMESPACE);
    for (name, data) in [
        (
            "postgres-admin",
            serde_json::json!({"username": harness::postgres::SUPERUSER, "password": pg.password()}),
        ),
        ("postgres-ca", serde_json::json!({"ca.crt": pg.ca_pem()})),
    ] {
        // The admin Secret opts in to being a DatabaseClass's login (without the label
        // the class is not usable).
        let labels = if name == "postgres-admin" {
            serde_json::json!({(common::database_class::ADMIN_SECRET_LABEL): "true"})
        } else {
            serde_json::json!({})
        };
        let secret: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": labels}, "stringData": data,
        }))
        .doing("building a Secret")?;
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .doing(format!("creating Secret {name}"))?;
    }
    let class: DatabaseClass = serde_json::from_value(serde_json::json!({
        "apiVersion": "platform.example.com/v1alpha1",
        "kind": "DatabaseClass",
        "metadata": {"name": DATABASE_CLASS},
        "spec": {
            // The host as the Pods see it (the node's gateway): the certificate names it.
            "host": harness::real_node::NODE_GATEWAY,
            "port": pg.port(),
            "tls": {"mode": "verify-full", "ca": {"secretRef": {"name": "postgres-ca"}}},
            "adminCredentials": {"secretName": "postgres-admin"},
            "deletionPolicy": "Delete",
        }
    }))
    .doing("building the DatabaseClass")?;
    Api::<DatabaseClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await
        .doing("creating the DatabaseClass")?;
    Ok(())
}

async fn pg_version(pg: &harness::Postgres) -> String {
    match pg.connect_admin().await {
        Ok(c) => c
            .query_one("SHOW server_version", &[])
            .await
            .ok()
            .and_then(|r| r.try_get::<_, String>(0).ok())
            .unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// The body of `GET path` through `addr` (a ClusterIP and port), once it answers.
async fn call(addr: &str, path: &str) -> Result<String> {
    let deadline = tokio::time::Instant::now() + ANSWER_TIMEOUT;
    loop {
        let last = match harness::real_node::get(addr, path).await {
            Ok((status, body)) if status < 500 || path == "/db" => {
                return Ok(body.trim().to_owned());
            }
            Ok((status, body)) => format!("HTTP {status}: {body}"),
            Err(e) => e.to_string(),
        };
        if tokio::time::Instant::now() > deadline {
            bail!("http://{addr}{path} did not answer within {ANSWER_TIMEOUT:?}: {last}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
