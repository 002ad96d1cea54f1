//! Starting and stopping a control plane: etcd + kube-apiserver, and in full mode
//! kube-controller-manager, kube-scheduler and kwok with one simulated Node.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};

use crate::assets;
use crate::error::{Error, Result, io, kube as kube_err};
use crate::process::{Component, Spec, free_port};
use crate::real_node::{NodeStart, RealNode};

/// How long the API server may take to become ready (cold start on 2 busy cores).
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How often a wait polls.
pub(crate) const POLL: Duration = Duration::from_millis(100);

/// kube-controller-manager's `--controllers`: all that are on by default.
const KCM_CONTROLLERS: &str = "*";
/// kube-controller-manager's `--horizontal-pod-autoscaler-downscale-stabilization` with a
/// real node (the cluster's default is 5 minutes).
pub const HPA_DOWNSCALE_STABILIZATION: &str = "20s";
/// The simulated node's Lease duration (a kubelet's default `nodeLeaseDurationSeconds`).
const NODE_LEASE_SECONDS: u32 = 40;

/// Name of the simulated node in full mode.
pub const NODE_NAME: &str = "kwok-node-0";
/// Annotation that makes kwok manage a node.
pub const KWOK_NODE_ANNOTATION: (&str, &str) = ("kwok.x-k8s.io/node", "fake");

/// What to start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Options {
    /// Also start kube-controller-manager, kube-scheduler and kwok with one simulated
    /// Node, so that Deployments get ready Pods, namespaces are finalized and owned
    /// objects are garbage-collected.
    pub full: bool,
    /// Also write the API server's audit log ([`AUDIT_POLICY`]: every write to
    /// AppServices, Deployments, Services and Secrets, with request and answer, JSON lines),
    /// read with [`ControlPlane::audit_events`].
    pub audit_log: bool,
    /// Turn on the alpha feature gate `ShardedListAndWatch` (lists and watches filtered by
    /// a hash range, `shardSelector`). With the audit log, it also records every Lease
    /// write with its request body (the claims of `--sharded-watch` are in the Leases).
    pub sharded_watch: bool,
    /// With `full`: a real node ([`RealNode`]: containerd, the kubelet, kube-proxy) runs
    /// the Pods instead of kwok's simulated one. One per machine (see [`crate::real_node`]).
    pub real_node: bool,
}

impl Options {
    /// etcd + kube-apiserver only.
    pub fn plain() -> Self {
        Self {
            full: false,
            audit_log: false,
            sharded_watch: false,
            real_node: false,
        }
    }

    /// With controllers, scheduler and a simulated node.
    pub fn full() -> Self {
        Self {
            full: true,
            audit_log: false,
            sharded_watch: false,
            real_node: false,
        }
    }

    /// With controllers, scheduler and a real node that runs the containers.
    pub fn real_node() -> Self {
        Self {
            real_node: true,
            ..Self::full()
        }
    }

    /// These options with the gate `ShardedListAndWatch` on.
    pub fn with_sharded_watch(self) -> Self {
        Self {
            sharded_watch: true,
            ..self
        }
    }

    /// These options with the audit log on.
    pub fn with_audit_log(self) -> Self {
        Self {
            audit_log: true,
            ..self
        }
    }
}

/// The audit policy of [`Options::audit_log`]: writes only (the response is what
/// matters, so one event per request, at ResponseComplete), of the objects the
/// controller writes, with their request and answer (`RequestResponse`): the answer's
/// `metadata.resourceVersion` is the revision the write was stored at, which orders the
/// writes of one object as storage did. The log's own order is the order the answers
/// were completed, and a write can be stored, seen by a watcher and answered by another
/// write before its own answer is complete.
pub const AUDIT_POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
- level: RequestResponse
  verbs: ["create", "update", "patch", "delete", "deletecollection"]
  resources:
  - group: "platform.example.com"
    resources: ["appservices", "appservices/status"]
  - group: "apps"
    resources: ["deployments"]
  - group: ""
    resources: ["services", "secrets"]
  - group: "policy"
    resources: ["poddisruptionbudgets"]
  - group: "autoscaling"
    resources: ["horizontalpodautoscalers"]
- level: None
"#;

/// The rule added before the others: Lease writes with their request body (the bucket
/// claims of a sharded ring).
pub const AUDIT_LEASES_RULE: &str = r#"- level: Request
  verbs: ["create", "update", "patch"]
  resources:
  - group: "coordination.k8s.io"
    resources: ["leases"]
"#;

/// Files of one control plane.
#[derive(Debug)]
struct Paths {
    root: PathBuf,
    logs: PathBuf,
    pki: PathBuf,
    etcd_data: PathBuf,
    kubeconfig: PathBuf,
    ca_cert: PathBuf,
    admin_cert: PathBuf,
    admin_key: PathBuf,
}

/// A running control plane. Dropping it stops every component (apiserver before etcd)
/// and removes its temporary files except the component logs (see `Drop`).
///
/// The process is built so that nothing outlives the test process even when this value
/// is never dropped (a `static`) or the process is killed: see [`crate::process`].
pub struct ControlPlane {
    options: Options,
    paths: Paths,
    server_url: String,
    ca: certs::Ca,
    admin_config: kube::Config,
    components: Mutex<Vec<Component>>,
    startup_time: Duration,
    /// `APPSERVICE_KEEP_LOGS` set: keep every file (certificates, kubeconfig, etcd data).
    keep_all: bool,
    /// kube-apiserver's index in `components` and its flags, for [`Self::restart_apiserver`].
    apiserver: (usize, Vec<String>),
    /// How often kube-apiserver was restarted (names the new log file).
    restarts: std::sync::atomic::AtomicUsize,
    /// etcd's client port (plain HTTP on 127.0.0.1), for [`Self::stored_object`].
    etcd_port: u16,
    /// The real node of [`Options::real_node`], stopped before the other components.
    node: Option<RealNode>,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("options", &self.options)
            .field("server_url", &self.server_url)
            .field("root", &self.paths.root)
            .finish_non_exhaustive()
    }
}

impl ControlPlane {
    /// Starts a control plane and installs the CRDs of `charts/appservice-operator/crds/`.
    /// Builds the binaries first if they are missing (see [`crate::assets`]).
    ///
    /// Retries up to three times when a component lost the race for a free port.
    pub async fn start(options: Options) -> Result<ControlPlane> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Self::start_once(options).await {
                Err(Error::Startup { tail, .. })
                    if attempt < 3 && crate::process::lost_the_port(&tail) =>
                {
                    eprintln!("harness: a port was taken meanwhile; starting again");
                }
                other => return other,
            }
        }
    }

    async fn start_once(options: Options) -> Result<ControlPlane> {
        let started = Instant::now();
        let bin = assets::bin_dir()?;
        let mut required: Vec<&str> = assets::PLAIN_BINARIES.to_vec();
        if options.full {
            required.extend(assets::FULL_BINARIES);
        }
        let paths = make_dirs()?;

        let ca = certs::Ca::new("appservice-envtest CA")?;
        let serving = ca.serving_cert(&[
            "localhost",
            "127.0.0.1",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            "10.96.0.1", // the kubernetes Service: first address of the service range
        ])?;
        let admin = ca.client_cert("envtest-admin", &["system:masters"])?;
        let sa = certs::SigningKeyPair::generate()?;
        ca.write(&paths.ca_cert, &paths.pki.join("ca.key"))?;
        serving.write(
            &paths.pki.join("apiserver.crt"),
            &paths.pki.join("apiserver.key"),
        )?;
        admin.write(&paths.admin_cert, &paths.admin_key)?;
        // The API server's identity towards kubelets (logs, exec, port-forward), as
        // kubeadm's `apiserver-kubelet-client`.
        ca.client_cert("kube-apiserver-kubelet-client", &["system:masters"])?
            .write(
                &paths.pki.join("apiserver-kubelet-client.crt"),
                &paths.pki.join("apiserver-kubelet-client.key"),
            )?;
        // The API server's identity towards aggregated API servers (metrics-server), as
        // kubeadm's `front-proxy-client`.
        ca.client_cert("front-proxy-client", &[] as &[&str])?
            .write(
                &paths.pki.join("front-proxy-client.crt"),
                &paths.pki.join("front-proxy-client.key"),
            )?;
        write(&paths.pki.join("sa.pub"), &sa.public_pem)?;
        write(&paths.pki.join("sa.key"), &sa.private_pem)?;

        let etcd_port = free_port()?;
        let etcd_peer_port = free_port()?;
        let api_port = free_port()?;
        let server_url = format!("https://127.0.0.1:{api_port}");
        let admin_config = client_config(&server_url, &ca, &paths.admin_cert, &paths.admin_key)?;

        let mut cp = ControlPlane {
            options,
            server_url,
            ca,
            admin_config,
            components: Mutex::new(Vec::new()),
            node: None,
            startup_time: Duration::ZERO,
            keep_all: std::env::var_os("APPSERVICE_KEEP_LOGS").is_some(),
            paths,
            apiserver: (0, Vec::new()),
            restarts: std::sync::atomic::AtomicUsize::new(0),
            etcd_port,
        };
        write(&cp.paths.kubeconfig, &cp.kubeconfig_yaml())?;

        // etcd.
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer_port}");
        let etcd = cp.spawn(
            "etcd",
            &bin,
            vec![
                "--name=default".into(),
                format!("--data-dir={}", cp.paths.etcd_data.display()),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=default={peer_url}"),
                "--unsafe-no-fsync".into(),
                "--log-level=warn".into(),
                // Tests produce little data; keep the WAL/snapshots small.
                "--quota-backend-bytes=1073741824".into(),
            ],
            Some(cp.paths.etcd_data.clone()),
        )?;
        cp.wait_for(etcd, "etcd /health", || {
            let ok = http_get_local(etcd_port, "/health")
                .map(|body| body.contains("\"health\":\"true\""))
                .unwrap_or(false);
            async move { ok }
        })
        .await?;

        // kube-apiserver, secure serving only.
        let pki = cp.paths.pki.clone();
        let file = |name: &str| pki.join(name).display().to_string();
        let apiserver_args: Vec<String> = vec![
            format!("--etcd-servers={etcd_url}"),
            format!("--secure-port={api_port}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--cert-dir={}", cp.paths.pki.display()),
            format!("--tls-cert-file={}", file("apiserver.crt")),
            format!("--tls-private-key-file={}", file("apiserver.key")),
            format!("--client-ca-file={}", file("ca.crt")),
            format!("--service-account-key-file={}", file("sa.pub")),
            format!("--service-account-signing-key-file={}", file("sa.key")),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            "--authorization-mode=RBAC".into(),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            "--allow-privileged=true".into(),
            // One apiserver, no aggregated APIs: fewer goroutines on small machines.
            "--enable-priority-and-fairness=false".into(),
            "--endpoint-reconciler-type=none".into(),
            // `APPSERVICE_APISERVER_PROFILING` set: /debug/pprof on, to profile the API
            // server during a benchmark (`kubectl get --raw /debug/pprof/profile`).
            format!(
                "--profiling={}",
                std::env::var_os("APPSERVICE_APISERVER_PROFILING").is_some()
            ),
        ];
        let mut apiserver_args = apiserver_args;
        if options.audit_log {
            let policy = cp.paths.root.join("audit-policy.yaml");
            let text =
                AUDIT_POLICY.replacen("rules:\n", &format!("rules:\n{AUDIT_LEASES_RULE}"), 1);
            write(&policy, &text)?;
            apiserver_args.extend([
                format!("--audit-policy-file={}", policy.display()),
                format!("--audit-log-path={}", cp.audit_log_path().display()),
                "--audit-log-format=json".into(),
                // Each request's event is written before its response goes out.
                "--audit-log-mode=blocking".into(),
                "--audit-log-maxsize=0".into(),
            ]);
        }
        if options.sharded_watch {
            apiserver_args.push("--feature-gates=ShardedListAndWatch=true".into());
        }
        if options.real_node {
            // The aggregation layer, for metrics-server (`RealNode::metrics_server`): the
            // API server proxies `metrics.k8s.io` to it as `front-proxy-client`, straight
            // to its endpoint (no Service routing from the host).
            apiserver_args.extend([
                format!("--requestheader-client-ca-file={}", file("ca.crt")),
                "--requestheader-allowed-names=front-proxy-client".into(),
                "--requestheader-username-headers=X-Remote-User".into(),
                "--requestheader-group-headers=X-Remote-Group".into(),
                "--requestheader-extra-headers-prefix=X-Remote-Extra-".into(),
                format!(
                    "--proxy-client-cert-file={}",
                    file("front-proxy-client.crt")
                ),
                format!("--proxy-client-key-file={}", file("front-proxy-client.key")),
                "--enable-aggregator-routing=true".into(),
            ]);
            // The node is reached at its InternalIP (its hostname resolves nowhere).
            apiserver_args.extend([
                "--kubelet-preferred-address-types=InternalIP".into(),
                format!(
                    "--kubelet-client-certificate={}",
                    file("apiserver-kubelet-client.crt")
                ),
                format!(
                    "--kubelet-client-key={}",
                    file("apiserver-kubelet-client.key")
                ),
            ]);
        }
        let apiserver = cp.spawn("kube-apiserver", &bin, apiserver_args.clone(), None)?;
        cp.apiserver = (apiserver, apiserver_args);
        cp.wait_for_apiserver().await?;

        if options.full {
            cp.start_full(&bin).await?;
        }
        cp.install_crds().await?;
        cp.startup_time = started.elapsed();
        Ok(cp)
    }

    /// Waits until kube-apiserver answers `/readyz` with `ok`.
    async fn wait_for_apiserver(&self) -> Result<()> {
        let readyz_client = self.try_client()?;
        self.wait_for(self.apiserver.0, "kube-apiserver /readyz", || {
            let client = readyz_client.clone();
            async move {
                let req = http::Request::get("/readyz").body(Vec::new());
                match req {
                    Ok(req) => client
                        .request_text(req)
                        .await
                        .map(|body| body.trim() == "ok")
                        .unwrap_or(false),
                    Err(_) => false,
                }
            }
        })
        .await
    }

    /// Kills kube-apiserver and starts it again with the same flags (etcd keeps its
    /// data), returning once it is ready: what clients live through when an API server
    /// restarts. Every watch is cut; kube-controller-manager and kwok reconnect too.
    pub async fn restart_apiserver(&self) -> Result<()> {
        let bin = assets::bin_dir()?;
        let (index, args) = self.apiserver.clone();
        let n = self
            .restarts
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        let name = format!("kube-apiserver-restart-{n}");
        {
            let mut components = self.lock();
            if let Some(c) = components.get_mut(index) {
                c.stop(Duration::from_secs(10));
            }
            let program = bin.join("kube-apiserver");
            let restarted = Component::spawn(Spec {
                name: &name,
                program: &program,
                args,
                log_dir: &self.paths.logs,
                remove_after_exit: None,
            })?;
            if let Some(slot) = components.get_mut(index) {
                *slot = restarted;
            }
        }
        self.wait_for_apiserver().await
    }

    async fn start_full(&mut self, bin: &Path) -> Result<()> {
        let kubeconfig = format!("--kubeconfig={}", self.paths.kubeconfig.display());
        let pki = self.paths.pki.clone();
        // Every controller a real cluster runs by default (`*`): among them those that
        // act on what the operator writes besides the Deployment and ReplicaSet
        // controllers: resource quotas (their usage, without which quota admission
        // refuses every Pod), HorizontalPodAutoscalers on the AppService's scale
        // subresource, the garbage collector, the node lifecycle (it reads kwok's node
        // leases) and taint eviction. Controllers whose prerequisites a cluster lacks
        // here (node CIDR allocation, cloud routes) stand by as they do there.
        let mut kcm_args = vec![
            kubeconfig.clone(),
            "--leader-elect=false".into(),
            "--secure-port=0".into(),
            "--use-service-account-credentials=false".into(),
            format!(
                "--service-account-private-key-file={}",
                pki.join("sa.key").display()
            ),
            format!("--root-ca-file={}", pki.join("ca.crt").display()),
            // CertificateSigningRequests are signed by the cluster CA, as kubeadm does.
            format!(
                "--cluster-signing-cert-file={}",
                pki.join("ca.crt").display()
            ),
            format!(
                "--cluster-signing-key-file={}",
                pki.join("ca.key").display()
            ),
            format!("--controllers={KCM_CONTROLLERS}"),
        ];
        if self.options.real_node {
            // The autoscaler waits 5 minutes of lower use before it scales down; a test
            // that watches it come back down waits this long instead. A setting of the
            // cluster's autoscaler, never of the operator.
            kcm_args.push(format!(
                "--horizontal-pod-autoscaler-downscale-stabilization={HPA_DOWNSCALE_STABILIZATION}"
            ));
        }
        let kcm = self.spawn("kube-controller-manager", bin, kcm_args, None)?;
        let scheduler = self.spawn(
            "kube-scheduler",
            bin,
            vec![
                kubeconfig.clone(),
                "--leader-elect=false".into(),
                "--secure-port=0".into(),
            ],
            None,
        )?;
        if self.options.real_node {
            let node = RealNode::start(NodeStart {
                ca: &self.ca,
                server_url: &self.server_url,
                log_dir: &self.paths.logs,
                client: self.try_client()?,
            })
            .await?;
            self.node = Some(node);
        } else {
            self.start_kwok(bin, &kubeconfig).await?;
        }
        let client = self.try_client()?;
        let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
        let sas_ref = &sas;
        self.wait_for(
            kcm,
            "the default ServiceAccount (kube-controller-manager)",
            move || async move { sas_ref.get_opt("default").await.ok().flatten().is_some() },
        )
        .await?;
        // The scheduler has no cheap readiness probe without serving; check it is alive.
        self.check_alive(scheduler)?;
        Ok(())
    }

    /// kwok and its one simulated Node, Ready and schedulable.
    async fn start_kwok(&self, bin: &Path, kubeconfig: &str) -> Result<()> {
        // Built on first use (`assets::FULL_BINARIES` leaves it out): into `bin`.
        assets::tool("kwok")?;
        let stages = self.paths.root.join("kwok-stages.yaml");
        write(&stages, KWOK_STAGES)?;
        let kwok = self.spawn(
            "kwok",
            bin,
            vec![
                kubeconfig.to_owned(),
                format!("--config={}", stages.display()),
                "--manage-all-nodes=false".into(),
                format!(
                    "--manage-nodes-with-annotation-selector={}={}",
                    KWOK_NODE_ANNOTATION.0, KWOK_NODE_ANNOTATION.1
                ),
                "--node-ip=10.244.0.1".into(),
                "--cidr=10.244.0.0/16".into(),
                // A node Lease renewed as a kubelet renews it (every 10 s of 40): the
                // node lifecycle controller reads it as the heartbeat, so the node
                // stays Ready however late a status heartbeat comes on a busy machine.
                format!("--node-lease-duration-seconds={NODE_LEASE_SECONDS}"),
            ],
            None,
        )?;

        let client = self.try_client()?;
        let nodes: Api<Node> = Api::all(client.clone());
        let node: Node = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": NODE_NAME,
                "annotations": {
                    KWOK_NODE_ANNOTATION.0: KWOK_NODE_ANNOTATION.1,
                    "node.alpha.kubernetes.io/ttl": "0",
                },
                "labels": {
                    "kubernetes.io/hostname": NODE_NAME,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "type": "kwok",
                },
            },
        }))
        .map_err(|e| Error::Config(format!("node object: {e}")))?;
        match nodes.create(&PostParams::default(), &node).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(e) => return Err(kube_err("creating the simulated node")(e)),
        }
        let nodes_ref = &nodes;
        self.wait_for(
            kwok,
            "the simulated node to be Ready (kwok)",
            move || async move {
                nodes_ref
                    .get(NODE_NAME)
                    .await
                    .ok()
                    .and_then(|n| n.status)
                    .and_then(|s| s.conditions)
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            },
        )
        .await?;
        // The TaintNodesByCondition admission plugin gives every new node the
        // `node.kubernetes.io/not-ready:NoSchedule` taint; the node lifecycle controller
        // lifts it on its next pass over a Ready node, and the harness lifts it at once
        // so that the first test need not wait for that pass.
        let untaint = serde_json::json!({ "spec": { "taints": null } });
        nodes
            .patch(NODE_NAME, &PatchParams::default(), &Patch::Merge(&untaint))
            .await
            .map_err(kube_err(
                "removing the not-ready taint of the simulated node",
            ))?;
        Ok(())
    }

    /// Starts a component and records it; returns its index for [`Self::wait_for`].
    fn spawn(
        &self,
        name: &str,
        bin: &Path,
        args: Vec<String>,
        remove_after_exit: Option<PathBuf>,
    ) -> Result<usize> {
        let program = bin.join(name);
        let component = Component::spawn(Spec {
            name,
            program: &program,
            args,
            log_dir: &self.paths.logs,
            remove_after_exit: remove_after_exit.as_deref(),
        })?;
        let mut components = self.lock();
        components.push(component);
        Ok(components.len() - 1)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Component>> {
        // A panic while holding the lock leaves the list intact; keep using it.
        self.components
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn check_alive(&self, index: usize) -> Result<()> {
        let mut components = self.lock();
        if let Some(c) = components.get_mut(index)
            && let Some(status) = c.exited()
        {
            return Err(c.startup_error(format!("exited with {status}"), &self.paths.logs));
        }
        Ok(())
    }

    /// Polls `ready` until it is true, failing early with the component's log when the
    /// component exits and after [`READY_TIMEOUT`].
    async fn wait_for<F, Fut>(&self, index: usize, what: &str, ready: F) -> Result<()>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            self.check_alive(index)?;
            if ready().await {
                return Ok(());
            }
            if Instant::now() > deadline {
                let components = self.lock();
                return Err(match components.get(index) {
                    Some(c) => c.startup_error(
                        format!("not ready after {READY_TIMEOUT:?} waiting for {what}"),
                        &self.paths.logs,
                    ),
                    None => Error::Timeout {
                        what: what.to_owned(),
                        timeout: READY_TIMEOUT,
                        log_dir: self.paths.logs.clone(),
                    },
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// A custom resource as kube-apiserver stored it in etcd (the JSON of its key
    /// `/registry/<group>/<plural>/<namespace>/<name>`), or `None` when there is no such
    /// key. Its `apiVersion` is the version it is stored in: what a storage migration
    /// changes and no API call shows.
    pub async fn stored_object(
        &self,
        group: &str,
        plural: &str,
        namespace: &str,
        name: &str,
    ) -> Result<Option<serde_json::Value>> {
        let key = format!("/registry/{group}/{plural}/{namespace}/{name}");
        let what = format!("reading {key} from etcd");
        // etcd's gRPC gateway speaks JSON with base64 keys and values.
        let request =
            serde_json::json!({ "key": k8s_openapi::ByteString(key.clone().into_bytes()) });
        let port = self.etcd_port;
        let io_error = |what: &str, error: std::io::Error| Error::Io {
            what: what.to_owned(),
            error,
        };
        let body = tokio::task::spawn_blocking(move || {
            http_post_local(port, "/v3/kv/range", &request.to_string())
        })
        .await
        .map_err(|e| io_error(&what, std::io::Error::other(e)))?
        .map_err(|e| io_error(&what, e))?;
        let json = body
            .split_once("\r\n\r\n")
            .map(|(_, json)| json)
            .unwrap_or_default();
        let invalid = |reason: String| io_error(&what, std::io::Error::other(reason));
        let answer: serde_json::Value = serde_json::from_str(json)
            .map_err(|e| invalid(format!("{e} in the answer {body:?}")))?;
        let Some(value) = answer.pointer("/kvs/0/value") else {
            return Ok(None);
        };
        let bytes: k8s_openapi::ByteString = serde_json::from_value(value.clone())
            .map_err(|e| invalid(format!("value of {key}: {e}")))?;
        serde_json::from_slice(&bytes.0)
            .map(Some)
            .map_err(|e| invalid(format!("{key} is not stored as JSON: {e}")))
    }

    /// Where the audit log is written (with [`Options::audit_log`]).
    pub fn audit_log_path(&self) -> PathBuf {
        self.paths.logs.join("audit.log")
    }

    /// Every event of the audit log so far, as JSON, in the order written (with
    /// [`Options::audit_log`]; empty without). A line cut off by a write in progress is
    /// skipped.
    pub fn audit_events(&self) -> Result<Vec<serde_json::Value>> {
        let path = self.audit_log_path();
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(format!("reading {}", path.display()))(e)),
        };
        Ok(text
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect())
    }

    /// Which components were started.
    pub fn options(&self) -> Options {
        self.options
    }

    /// How long [`ControlPlane::start`] took (including the CRD installation).
    pub fn startup_time(&self) -> Duration {
        self.startup_time
    }

    /// `https://127.0.0.1:<port>`.
    pub fn server_url(&self) -> &str {
        &self.server_url
    }

    /// The cluster CA certificate (PEM): it signed the API server's serving certificate
    /// and is the client CA.
    pub fn ca_pem(&self) -> &str {
        self.ca.cert_pem()
    }

    /// The cluster CA, to issue more client certificates.
    pub fn ca(&self) -> &certs::Ca {
        &self.ca
    }

    /// The admin kubeconfig (user `envtest-admin` in `system:masters`); certificates are
    /// referenced by path, so `kubectl --kubeconfig <this>` works as is.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.paths.kubeconfig
    }

    /// A command that runs `program --kubeconfig <this control plane's> ...` (kubectl,
    /// a binary under test); add the arguments, then run it, e.g. with
    /// [`crate::process::outcome`] of its output.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(program);
        command.arg("--kubeconfig").arg(&self.paths.kubeconfig);
        command
    }

    /// Directory holding one `<component>.log` per component.
    pub fn log_dir(&self) -> &Path {
        &self.paths.logs
    }

    /// Directory holding the kubectl and other asset binaries.
    pub fn bin_dir(&self) -> Result<PathBuf> {
        assets::bin_dir()
    }

    /// The admin client configuration (cluster-admin through `system:masters`).
    pub fn admin_config(&self) -> kube::Config {
        self.admin_config.clone()
    }

    /// A new admin client. A client belongs to the tokio runtime it was made in, and
    /// every `#[tokio::test]` has its own runtime: make one per test, never share one.
    ///
    /// # Panics
    /// If called outside a tokio runtime, or if the client cannot be built, which
    /// [`ControlPlane::start`] already checked with the same configuration.
    #[allow(
        clippy::expect_used,
        reason = "the same config built a client in start()"
    )]
    pub fn client(&self) -> kube::Client {
        self.try_client()
            .expect("the admin client configuration was validated at startup")
    }

    /// Like [`ControlPlane::client`], returning the error.
    pub fn try_client(&self) -> Result<kube::Client> {
        kube::Client::try_from(self.admin_config.clone())
            .map_err(|e| Error::Config(format!("building the admin client: {e}")))
    }

    /// A client authenticated by a new client certificate with common name `user` and
    /// organisations `groups`: subject to RBAC like any user.
    pub fn client_for_user(&self, user: &str, groups: &[&str]) -> Result<kube::Client> {
        let cert = self.ca.client_cert(user, groups)?;
        let stem = user_file_stem(user);
        let cert_path = self.paths.pki.join(format!("user-{stem}.crt"));
        let key_path = self.paths.pki.join(format!("user-{stem}.key"));
        cert.write(&cert_path, &key_path)?;
        let config = client_config(&self.server_url, &self.ca, &cert_path, &key_path)?;
        kube::Client::try_from(config)
            .map_err(|e| Error::Config(format!("building a client for {user}: {e}")))
    }

    /// An admin client that impersonates `user` with `groups` (requests are authorized
    /// as that user; the admin is allowed to impersonate anyone).
    pub fn impersonating_client(&self, user: &str, groups: &[&str]) -> Result<kube::Client> {
        let mut config = self.admin_config.clone();
        config.auth_info.impersonate = Some(user.to_owned());
        config.auth_info.impersonate_groups = if groups.is_empty() {
            None
        } else {
            Some(groups.iter().map(|g| (*g).to_owned()).collect())
        };
        kube::Client::try_from(config)
            .map_err(|e| Error::Config(format!("building an impersonating client: {e}")))
    }

    /// A guard that prints the log directory if the test panics while it is alive:
    /// `let _logs = cp.log_guard();` at the top of a test.
    pub fn log_guard(&self) -> LogGuard {
        LogGuard {
            log_dir: self.paths.logs.clone(),
            context: String::new(),
        }
    }

    /// The real node of [`Options::real_node`].
    pub fn node(&self) -> Option<&RealNode> {
        self.node.as_ref()
    }

    /// Stops every component, newest first (so the apiserver stops before etcd), the
    /// real node's first.
    pub fn stop(&self) {
        if let Some(node) = &self.node {
            node.stop();
        }
        let mut components = self.lock();
        while let Some(mut c) = components.pop() {
            c.stop(Duration::from_secs(10));
        }
    }

    fn kubeconfig_yaml(&self) -> String {
        // JSON strings are YAML strings: quoting paths this way is always valid.
        let q = |p: &Path| serde_json::Value::String(p.display().to_string()).to_string();
        format!(
            "apiVersion: v1
kind: Config
clusters:
- name: appservice-envtest
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: envtest-admin
  user:
    client-certificate: {cert}
    client-key: {key}
contexts:
- name: appservice-envtest
  context:
    cluster: appservice-envtest
    user: envtest-admin
    namespace: default
current-context: appservice-envtest
",
            server = self.server_url,
            ca = q(&self.paths.ca_cert),
            cert = q(&self.paths.admin_cert),
            key = q(&self.paths.admin_key),
        )
    }
}

impl Drop for ControlPlane {
    /// Stops the components, then removes everything but the logs: a test that fails by
    /// returning `Err` is not panicking, and its logs must still be where its output
    /// said. Log directories older than a day are pruned by the next start.
    fn drop(&mut self) {
        self.stop();
        if self.keep_all {
            eprintln!(
                "harness: control plane files kept in {}",
                self.paths.root.display()
            );
            return;
        }
        for path in [&self.paths.pki, &self.paths.etcd_data] {
            let _ = fs::remove_dir_all(path);
        }
        let _ = fs::remove_file(&self.paths.kubeconfig);
        let _ = fs::remove_file(self.paths.root.join("kwok-stages.yaml"));
        if std::thread::panicking() {
            eprintln!("harness: control plane logs: {}", self.paths.logs.display());
        }
    }
}

/// Prints the control plane's log directory (and a context line) when dropped during a
/// panic, so a failing test says where to look.
#[derive(Debug)]
pub struct LogGuard {
    pub(crate) log_dir: PathBuf,
    pub(crate) context: String,
}

impl Drop for LogGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "harness: test failed{}; component logs: {}",
                self.context,
                self.log_dir.display()
            );
        }
    }
}

/// Prefix of every control plane's directory under the system temporary directory.
const DIR_PREFIX: &str = "appservice-envtest-";
fn make_dirs() -> Result<Paths> {
    crate::process::prune_old_dirs(DIR_PREFIX);
    let root = tempfile::Builder::new()
        .prefix(DIR_PREFIX)
        .tempdir()
        .map_err(io("creating the control plane's temporary directory"))?
        .keep();
    let paths = Paths {
        logs: root.join("logs"),
        pki: root.join("pki"),
        etcd_data: root.join("etcd"),
        kubeconfig: root.join("kubeconfig"),
        ca_cert: root.join("pki").join("ca.crt"),
        admin_cert: root.join("pki").join("admin.crt"),
        admin_key: root.join("pki").join("admin.key"),
        root,
    };
    for dir in [&paths.logs, &paths.pki, &paths.etcd_data] {
        fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    }
    Ok(paths)
}

fn write(path: &Path, contents: &str) -> Result<()> {
    fs::write(path, contents).map_err(io(format!("writing {}", path.display())))
}

fn user_file_stem(user: &str) -> String {
    user.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

fn client_config(
    server_url: &str,
    ca: &certs::Ca,
    cert_path: &Path,
    key_path: &Path,
) -> Result<kube::Config> {
    let uri = server_url
        .parse()
        .map_err(|e| Error::Config(format!("server URL {server_url}: {e}")))?;
    let mut config = kube::Config::new(uri);
    config.root_cert = Some(vec![ca.cert_der().to_vec()]);
    config.auth_info.client_certificate = Some(cert_path.display().to_string());
    config.auth_info.client_key = Some(key_path.display().to_string());
    Ok(config)
}

/// A plain-HTTP GET to 127.0.0.1 without a runtime or a client library (etcd health).
fn http_get_local(port: u16, path: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )?;
    let mut body = String::new();
    stream.read_to_string(&mut body)?;
    Ok(body)
}

/// A plain-HTTP POST of a JSON body to 127.0.0.1 (etcd's gRPC gateway); the raw answer.
fn http_post_local(port: u16, path: &str, body: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "POST {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

/// kwok's stages: node-initialize, node-heartbeat and pod-ready/complete/delete, as
/// shipped in kwok v0.8.0's `kustomize/stage/{node,pod}/fast` (Apache-2.0).
const KWOK_STAGES: &str = include_str!("../envtest/kwok-stages.yaml");
