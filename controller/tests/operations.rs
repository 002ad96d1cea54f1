//! Operating the `appservice-controller` binary against a real kube-apiserver: a
//! reconcile exported to an OTLP receiver as a span tree (the pass, the reconcile, its
//! API calls as client spans) with its trace id in the JSON logs; CPU and heap profiles
//! on demand, absent by default; the chart's alerts and dashboard query only metrics
//! the binaries export.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use common::AppService;
use harness::OtlpReceiver;
use kube::Api;
use serde_json::Value;
use support::{app, create};
use tokio::process::Command;

/// The controller binary for one namespace, logging JSON.
struct Controller {
    binary: harness::Binary,
    ops: SocketAddr,
}

impl Controller {
    async fn start(
        cp: &harness::ControlPlane,
        ns: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let ops_port = harness::process::free_port().unwrap();
        Self::start_on(cp, ns, ops_port, args, env).await
    }

    /// [`Controller::start`] with its ops server on `ops_port`.
    async fn start_on(
        cp: &harness::ControlPlane,
        ns: &str,
        ops_port: u16,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_appservice-controller"));
        command
            .arg("--kubeconfig")
            .arg(cp.kubeconfig_path())
            .args(["--watch-namespace", ns, "--leader-election", "false"])
            .args(["--ops-addr", &format!("127.0.0.1:{ops_port}")])
            .args(["--log-format", "json"])
            .args(args)
            .env("RUST_LOG", "info")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT");
        for (k, v) in env {
            command.env(k, v);
        }
        let mut controller = Controller {
            binary: harness::Binary::spawn(command).unwrap(),
            ops: SocketAddr::from(([127, 0, 0, 1], ops_port)),
        };
        controller
            .wait_log(|l| l["message"] == "caches synced")
            .await;
        controller
    }

    async fn wait_log(&mut self, matches: impl FnMut(&Value) -> bool) -> Value {
        self.binary
            .wait_log("a log line", Duration::from_secs(30), matches)
            .await
            .unwrap()
    }
}

/// GET on the ops port: status and body.
async fn get(addr: SocketAddr, path: &str) -> (u16, Vec<u8>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP response");
    let head = String::from_utf8_lossy(&response[..split]);
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status code");
    (status, response[split + 4..].to_vec())
}

#[tokio::test]
async fn a_reconcile_is_a_span_tree_with_its_api_calls() {
    support::init();
    let receiver = OtlpReceiver::start().await.unwrap();
    let cp = harness::shared().await.unwrap();
    let ns = cp.namespace().await.unwrap();
    let mut ctl = Controller::start(
        cp,
        &ns,
        &["--otlp-endpoint", &receiver.endpoint()],
        &[("OTEL_BSP_SCHEDULE_DELAY", "100")],
    )
    .await;
    let apps: Api<AppService> = Api::namespaced(cp.client(), &ns);
    create(&apps, &app("traced", "registry.example.com/traced:v1", 1))
        .await
        .unwrap();

    // The Deployment is created inside a reconcile: its log line carries the trace id.
    let created = ctl
        .wait_log(|l| l["message"] == "created" && l["kind"] == "Deployment")
        .await;
    let trace_id = created["trace_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no trace_id in {created}"))
        .to_owned();

    // kube's ObjectRef display: `AppService.v1alpha1.platform.example.com/traced.<ns>`.
    let object = format!("/traced.{}", ns.name());
    let spans = receiver
        .wait_for(Duration::from_secs(20), |spans| {
            let trace: Vec<_> = spans
                .iter()
                .filter(|s| s.trace_id == trace_id)
                .cloned()
                .collect();
            let creates = trace
                .iter()
                .filter(|s| s.name == "create" && s.kind == 3)
                .count();
            // Spans are exported as they end: the reconcile and the controller's pass
            // around it end after their API calls, possibly in a later batch.
            let whole = trace.iter().any(|s| {
                s.name == "reconcile" && trace.iter().any(|p| p.span_id == s.parent_span_id)
            });
            (creates >= 2 && whole).then_some(trace)
        })
        .await
        .unwrap_or_else(|| {
            panic!(
                "no complete trace {trace_id}; received {:#?}",
                receiver.spans()
            )
        });
    let by_id = |id: &str| spans.iter().find(|s| s.span_id == id);

    // The pass of kube-runtime's controller is the root; the reconcile is its child.
    let reconcile = spans
        .iter()
        .find(|s| s.name == "reconcile")
        .unwrap_or_else(|| panic!("no reconcile span in {spans:#?}"));
    assert_eq!(reconcile.service, "appservice-controller");
    assert!(
        reconcile
            .attribute("object")
            .is_some_and(|o| o.contains(&object)),
        "{reconcile:?}"
    );
    let root = by_id(&reconcile.parent_span_id).expect("the reconcile's parent is exported");
    assert_eq!(root.name, "reconciling object");
    assert!(root.parent_span_id.is_empty());

    // The API calls are client spans under the reconcile, with method, URL and status.
    let calls: Vec<_> = spans.iter().filter(|s| s.kind == 3).collect();
    assert!(calls.len() >= 2, "{spans:#?}");
    for call in &calls {
        assert_eq!(call.parent_span_id, reconcile.span_id, "{call:?}");
        assert!(call.attribute("http.method").is_some(), "{call:?}");
        assert!(call.attribute("http.status_code").is_some(), "{call:?}");
    }
    let urls: Vec<_> = calls
        .iter()
        .filter_map(|c| c.attribute("http.url"))
        .collect();
    assert!(urls.iter().any(|u| u.contains("/deployments")), "{urls:?}");
    assert!(urls.iter().any(|u| u.contains("/services")), "{urls:?}");

    // Watches and other background requests are not traces of their own. Spans are
    // exported in the order they end: once the root of a later reconcile (after a poke)
    // has arrived, every background request that ended before it has too.
    let roots = |spans: &[harness::ReceivedSpan]| {
        spans
            .iter()
            .filter(|s| s.name == "reconciling object")
            .count()
    };
    let before = roots(&receiver.spans());
    apps.patch(
        "traced",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!({"metadata": {"labels": {"poked": "1"}}})),
    )
    .await
    .unwrap();
    let later = receiver
        .wait_for(Duration::from_secs(20), |spans| {
            (roots(spans) > before).then(|| spans.to_vec())
        })
        .await
        .unwrap_or_else(|| {
            panic!(
                "no reconcile after the poke; received {:#?}",
                receiver.spans()
            )
        });
    let orphans: Vec<_> = later
        .into_iter()
        .filter(|s| s.kind == 3 && s.parent_span_id.is_empty())
        .collect();
    assert!(orphans.is_empty(), "{orphans:#?}");
}

#[tokio::test]
async fn profiles_on_demand_and_absent_by_default() {
    support::init();
    let cp = harness::shared().await.unwrap();
    let ns = cp.namespace().await.unwrap();

    let plain = Controller::start(cp, &ns, &[], &[]).await;
    assert_eq!(get(plain.ops, "/debug/pprof/heap").await.0, 404);
    assert_eq!(
        get(plain.ops, "/debug/pprof/profile?seconds=1").await.0,
        404
    );
    assert_eq!(get(plain.ops, "/metrics").await.0, 200);
    drop(plain);

    let ns2 = cp.namespace().await.unwrap();
    let profiled = Controller::start(cp, &ns2, &["--profiling"], &[]).await;
    let apps: Api<AppService> = Api::namespaced(cp.client(), &ns2);
    for i in 0..5 {
        create(
            &apps,
            &app(&format!("p{i}"), "registry.example.com/p:v1", 1),
        )
        .await
        .unwrap();
    }
    let (status, body) = get(profiled.ops, "/debug/pprof/profile?seconds=1").await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    harness::pprof::check_cpu(&body).unwrap();

    let (status, body) = get(profiled.ops, "/debug/pprof/heap").await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    // Symbolized: Rust paths, not addresses. (Which allocations are sampled is up to
    // jemalloc's sampling, one per 512 KiB on average: the caches of five AppServices
    // are far smaller than that, so no particular function can be expected.)
    harness::pprof::check_heap(&body, "::").unwrap();
}

/// Sockets of local `port` in TIME-WAIT (`/proc/net/tcp`, `tcp6`: state 06).
fn time_wait(port: u16) -> usize {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .map(|table| {
            table
                .lines()
                .skip(1)
                .filter(|line| {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    let local = fields
                        .get(1)
                        .and_then(|a| a.rsplit(':').next())
                        .and_then(|p| u16::from_str_radix(p, 16).ok());
                    local == Some(port) && fields.get(3) == Some(&"06")
                })
                .count()
        })
        .sum()
}

/// A controller killed (SIGKILL) while its ops port has connections in TIME-WAIT (closed
/// by the server after each answer, as the kubelet's probes leave them) is started again
/// at once on the same port and serves.
#[tokio::test]
async fn a_killed_controller_rebinds_its_ops_port_at_once() {
    support::init();
    let cp = harness::shared().await.unwrap();
    let ns = cp.namespace().await.unwrap();
    let port = harness::process::free_port().unwrap();
    let mut first = Controller::start_on(cp, &ns, port, &[], &[]).await;
    for _ in 0..5 {
        assert_eq!(get(first.ops, "/healthz").await.0, 200);
    }
    let open = tokio::net::TcpStream::connect(first.ops).await.unwrap();
    harness::process::signal(first.binary.pid, "KILL").unwrap();
    first.binary.child.wait().await.unwrap();
    drop(open);
    let waiting = harness::eventually(
        "TIME-WAIT on the ops port",
        Duration::from_secs(30),
        || async { Some(time_wait(port)).filter(|&n| n > 0) },
    )
    .await
    .unwrap();
    println!("TIME-WAIT on the ops port at the restart: {waiting}");
    let second = Controller::start_on(cp, &ns, port, &[], &[]).await;
    assert_eq!(get(second.ops, "/healthz").await.0, 200);
    assert_eq!(get(second.ops, "/readyz").await.0, 200);
}

/// Every metric name a PromQL expression selects.
fn metric_names(expr: &promql_parser::parser::Expr, names: &mut Vec<String>) {
    use promql_parser::parser::Expr;
    match expr {
        Expr::Aggregate(a) => {
            metric_names(&a.expr, names);
            if let Some(p) = &a.param {
                metric_names(p, names);
            }
        }
        Expr::Unary(u) => metric_names(&u.expr, names),
        Expr::Binary(b) => {
            metric_names(&b.lhs, names);
            metric_names(&b.rhs, names);
        }
        Expr::Paren(p) => metric_names(&p.expr, names),
        Expr::Subquery(s) => metric_names(&s.expr, names),
        Expr::VectorSelector(v) => names.extend(v.name.clone()),
        Expr::MatrixSelector(m) => names.extend(m.vs.name.clone()),
        Expr::Call(c) => c.args.args.iter().for_each(|a| metric_names(a, names)),
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => {}
    }
}

/// The metric names of a Prometheus text exposition (histograms as their `_bucket`,
/// `_sum` and `_count` series, counters with `_total`).
fn exported_names(scrape: &str) -> std::collections::BTreeSet<String> {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

/// The chart rendered with the PrometheusRule and the dashboard.
fn render_monitoring(namespace: &str) -> Vec<Value> {
    let root = harness::assets::workspace_root();
    let helm = harness::assets::bin_dir().unwrap().join("helm");
    let home = std::env::temp_dir().join("aso-helm-ops");
    let out = std::process::Command::new(&helm)
        .args(["template", "aso"])
        .arg(root.join("charts/appservice-operator"))
        .args(["--namespace", namespace])
        .args(["--set", "metrics.prometheusRule.enabled=true"])
        .args(["--set", "metrics.grafanaDashboard.enabled=true"])
        // The sharding alerts render only with sharding on.
        .args(["--set", "controller.sharding.enabled=true"])
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "running {}: {e} (the test assets are built by `cargo xtask assets`)",
                helm.display()
            )
        });
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&String::from_utf8_lossy(&out.stdout)).unwrap();
    docs.into_iter().filter(Value::is_object).collect()
}

#[tokio::test]
async fn alerts_and_dashboard_query_only_exported_metrics() {
    support::init();
    let docs = render_monitoring("ops");
    let rule = docs
        .iter()
        .find(|d| d["kind"] == "PrometheusRule")
        .expect("a PrometheusRule");
    let runbooks =
        std::fs::read_to_string(harness::assets::workspace_root().join("docs/runbooks.md"))
            .unwrap();

    // (where, expression) of every query.
    let mut queries = Vec::new();
    let mut alerts = Vec::new();
    for group in rule["spec"]["groups"].as_array().unwrap() {
        for r in group["rules"].as_array().unwrap() {
            let alert = r["alert"].as_str().unwrap().to_owned();
            assert!(r["for"].is_string(), "{alert}: no `for`");
            assert!(
                ["warning", "critical"].contains(&r["labels"]["severity"].as_str().unwrap()),
                "{alert}"
            );
            assert!(
                r["annotations"]["summary"]
                    .as_str()
                    .is_some_and(|s| !s.is_empty()),
                "{alert}"
            );
            let url = r["annotations"]["runbook_url"].as_str().unwrap();
            let anchor = url.rsplit_once('#').map(|(_, a)| a).unwrap_or_default();
            assert_eq!(anchor, alert.to_lowercase(), "{alert}: {url}");
            assert!(
                runbooks.lines().any(|l| l == format!("## {alert}")),
                "{alert} has no runbook paragraph in docs/runbooks.md"
            );
            queries.push((alert.clone(), r["expr"].as_str().unwrap().to_owned()));
            alerts.push(alert);
        }
    }
    for required in [
        "AppServiceReconcileErrors",
        "AppServiceQueueDepth",
        "AppServiceQueueWait",
        "AppServiceControllerNoLeader",
        "AppServiceControllerShardsMissing",
        "AppServiceShardForeignObjects",
        "AppServiceCleanupFailing",
        "AppServiceWebhookErrors",
        "AppServiceWebhookLatency",
        "AppServiceWebhookCertificateExpiry",
    ] {
        assert!(alerts.iter().any(|a| a == required), "{required} missing");
    }

    let dashboard_map = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["labels"]["grafana_dashboard"] == "1")
        .expect("a dashboard ConfigMap with the sidecar label");
    let dashboard: Value = serde_json::from_str(
        dashboard_map["data"]["appservice-operator.json"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let mut panels = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", "1m")
                .replace("$namespace", "ops");
            queries.push((format!("panel {}", panel["title"]), expr));
            panels += 1;
        }
    }
    assert!(panels >= 20, "{panels} dashboard queries");

    // A scrape of both binaries: the controller binary on the control plane, the
    // webhook as its binary runs it (`webhook::start`).
    let cp = harness::shared().await.unwrap();
    let ns = cp.namespace().await.unwrap();
    let controller = Controller::start(cp, &ns, &[], &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let (_ca, serving) = harness::webhook_tls().unwrap();
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    serving.write(&cert, &key).unwrap();
    let webhook = webhook::start(&webhook::Config::local(cert, key, None))
        .await
        .unwrap();
    let mut exported = std::collections::BTreeSet::new();
    for (what, ops) in [
        ("controller", controller.ops),
        ("webhook", webhook.ops_addr()),
    ] {
        let (status, body) = get(ops, "/metrics").await;
        assert_eq!(status, 200, "{what}");
        let names = exported_names(&String::from_utf8_lossy(&body));
        assert!(names.len() > 10, "{what}: {names:?}");
        exported.extend(names);
    }

    // Series that exist only once there is something to count (one per DatabaseClass,
    // from the first orphan scan): named as the controller's own registry encodes them.
    let probe = controller::metrics::Metrics::default();
    probe
        .families::<controller::database::metrics::DatabaseMetrics>()
        .set_orphans("probe", 0, 0);
    // The shard families, which the binary registers whatever `--sharding` says (this
    // controller runs in process, without the binary's wiring).
    let _ = probe.families::<controller::sharding::ShardMetrics>();
    let per_class = exported_names(&probe.encode().unwrap());
    assert!(
        per_class.contains("appservice_controller_database_orphans"),
        "{per_class:?}"
    );
    exported.extend(per_class);

    for (place, expr) in &queries {
        let parsed = promql_parser::parser::parse(expr)
            .unwrap_or_else(|e| panic!("{place}: not PromQL ({e}): {expr}"));
        let mut names = Vec::new();
        metric_names(&parsed, &mut names);
        assert!(!names.is_empty(), "{place}: selects nothing: {expr}");
        for name in names {
            assert!(
                exported.contains(&name),
                "{place} queries {name}, which neither binary exports: {expr}"
            );
        }
    }
}

/// The value of the series `name{labels}` (labels as printed, in order) in a scrape.
fn series(scrape: &str, name_and_labels: &str) -> Option<f64> {
    scrape.lines().find_map(|l| {
        l.strip_prefix(name_and_labels)
            .and_then(|rest| rest.trim().parse().ok())
    })
}

/// The API server sees the binary by name (its User-Agent: the field manager it derives
/// for a write that names none, here the finalizer's patch), and the binary's scrape
/// counts its requests by verb and code, with their latency.
#[tokio::test]
async fn requests_carry_the_binarys_name_and_are_counted_by_verb_and_code() {
    support::init();
    let cp = harness::shared().await.unwrap();
    let ns = cp.namespace().await.unwrap();
    let ctl = Controller::start(cp, &ns, &[], &[]).await;
    let apps: Api<AppService> = Api::namespaced(cp.client(), &ns);
    // A database requested (of a class that does not exist): the finalizer goes on first.
    let mut agent = app("agent", "registry.example.com/agent:v1", 1);
    agent.spec.database = Some(common::DatabaseSpec {
        class: "absent".into(),
    });
    create(&apps, &agent).await.unwrap();

    let managers_of = |app: AppService| -> Vec<(String, String)> {
        app.metadata
            .managed_fields
            .unwrap_or_default()
            .into_iter()
            .map(|m| {
                (
                    m.manager.unwrap_or_default(),
                    m.operation.unwrap_or_default(),
                )
            })
            .collect()
    };
    let ours = ("appservice-controller".to_owned(), "Update".to_owned());
    let found = harness::eventually("the finalizer's patch", Duration::from_secs(30), || async {
        let managers = managers_of(apps.get("agent").await.ok()?);
        managers.contains(&ours).then_some(())
    })
    .await;
    assert!(
        found.is_ok(),
        "the finalizer's patch names no field manager: the API server derives it from the \
         User-Agent; managers: {:?}",
        managers_of(apps.get("agent").await.unwrap())
    );

    // The client counts a request once its response is in, which may come just after
    // the API server's write is visible.
    let patched = r#"appservice_controller_api_requests_total{verb="patch",code="200"}"#;
    let scrape = harness::eventually("the patch counted", Duration::from_secs(10), || async {
        let (status, body) = get(ctl.ops, "/metrics").await;
        assert_eq!(status, 200);
        let scrape = String::from_utf8(body).ok()?;
        series(&scrape, patched)
            .is_some_and(|n| n >= 1.0)
            .then_some(scrape)
    })
    .await
    .unwrap();
    let count = |labels: &str| {
        series(
            &scrape,
            &format!("appservice_controller_api_requests_total{{{labels}}}"),
        )
        .unwrap_or(0.0)
    };
    assert!(count(r#"verb="watch",code="200""#) >= 1.0, "{scrape}");
    assert!(count(r#"verb="get",code="200""#) >= 1.0, "lists: {scrape}");
    assert!(count(r#"verb="patch",code="200""#) >= 1.0, "{scrape}");
    assert!(
        series(
            &scrape,
            r#"appservice_controller_api_request_duration_seconds_count{verb="patch"}"#
        )
        .is_some_and(|n| n >= 1.0),
        "{scrape}"
    );
    // Without leader election this replica leads from its start: one transition, no more.
    assert_eq!(
        series(&scrape, "appservice_controller_leader_transitions_total"),
        Some(1.0),
        "{scrape}"
    );
}
