//! Operating the `appservice-controller` binary against a real kube-apiserver: a
//! reconcile exported to an OTLP receiver as a span tree (the pass, the reconcile, its
//! API calls as client spans) with its trace id in the JSON logs; CPU and heap profiles
//! on demand, absent by default.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use common::AppService;
use harness::OtlpReceiver;
use kube::Api;
use serde_json::Value;
use support::{app, create};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

/// The controller binary for one namespace; its JSON log lines arrive on `logs`.
struct Controller {
    _child: Child,
    ops: SocketAddr,
    logs: mpsc::UnboundedReceiver<Value>,
}

impl Controller {
    async fn start(
        cp: &harness::ControlPlane,
        ns: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let ops_port = harness::process::free_port().unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_appservice-controller"));
        command
            .arg("--kubeconfig")
            .arg(cp.kubeconfig_path())
            .args(["--watch-namespace", ns, "--leader-election", "false"])
            .args(["--ops-addr", &format!("127.0.0.1:{ops_port}")])
            .args(["--log-format", "json", "--rollout-requeue", "1s"])
            .args(args)
            .env("RUST_LOG", "info")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT");
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let (tx, logs) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                match serde_json::from_str::<Value>(&line) {
                    Ok(value) => {
                        let _ = tx.send(value);
                    }
                    Err(e) => panic!("controller log line is not JSON ({e}): {line}"),
                }
            }
        });
        let mut controller = Controller {
            _child: child,
            ops: SocketAddr::from(([127, 0, 0, 1], ops_port)),
            logs,
        };
        controller
            .wait_log(|l| l["fields"]["message"] == "caches synced")
            .await;
        controller
    }

    async fn wait_log(&mut self, mut matches: impl FnMut(&Value) -> bool) -> Value {
        let read = async {
            while let Some(line) = self.logs.recv().await {
                if matches(&line) {
                    return line;
                }
            }
            panic!("the controller exited");
        };
        tokio::time::timeout(Duration::from_secs(30), read)
            .await
            .expect("log line within 30 s")
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
        .wait_log(|l| l["fields"]["message"] == "created" && l["fields"]["kind"] == "Deployment")
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
            (creates >= 2).then_some(trace)
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

    // Watches and other background requests are not traces of their own.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let orphans: Vec<_> = receiver
        .spans()
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
    let cpu = harness::pprof::decode(&body).unwrap();
    assert!(cpu.sample_types.iter().any(|(t, _)| t == "cpu"), "{cpu:?}");

    let (status, body) = get(profiled.ops, "/debug/pprof/heap").await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let heap = harness::pprof::decode(&body).unwrap();
    assert_eq!(
        heap.sample_types,
        vec![("inuse_space".to_owned(), "bytes".to_owned())]
    );
    assert!(heap.samples > 0, "{heap:?}");
    assert!(
        heap.functions.iter().any(|f| f.contains("kube")),
        "the watch caches hold memory: {:?}",
        &heap.functions[..heap.functions.len().min(30)]
    );
}
