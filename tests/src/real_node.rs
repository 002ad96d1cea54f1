//! A real node: containerd (Debian's 1.6) + runc + the CNI plugins + the kubelet and
//! kube-proxy of the control plane's release, on this machine, registered as the Node
//! [`NODE_NAME`]. Its Pods really run: images are pulled from the harness's registry
//! ([`NodeImages`], built here), processes start as the image's user under the Pod's
//! security context, readiness probes gate Service endpoints, and kube-proxy routes a
//! ClusterIP from this machine to them.
//!
//! One node per machine: the kubelet's port, the node's address on `lo`, iptables and a
//! few host paths are host-wide. A janitor process holds a lock on [`LOCK`] for the
//! node's life (a second node waits for it), clears what a killed run left before the
//! node starts, and takes the node down when its pipe closes: when the node is stopped,
//! dropped, or the test process ends in any way (statics are never dropped). Nothing is
//! routed off the machine: the Service range goes to the node's bridge, Pods get no
//! masquerade and no forwarding, and resolve nothing.
//!
//! A start failure names what is missing (a package, a kernel feature, a cgroup) and
//! how to get it; there is no fallback to kwok.

mod config;
mod gateway;
mod images;
mod metrics;

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub use config::{
    BRIDGE, CGROUP, Layout, NODE_GATEWAY, NODE_IP, NODE_NAME, POD_CIDR, SERVICE_CIDR,
};
pub use gateway::{Gateway, HTTP_LISTENER};
pub use images::{Image, ImageSpec, NONROOT, NodeImages};

use crate::assets::tool;
use crate::error::{Error, Result, io, kube as kube_err};
use crate::process::{Component, Spec, tail};
use crate::registry::{Registry, RegistryOptions};

/// The host-wide lock of the one real node of a machine.
pub const LOCK: &str = "/run/lock/appservice-real-node.lock";
/// How long a second node waits for the first to go.
const LOCK_WAIT: Duration = Duration::from_secs(900);
/// How long each daemon may take to be ready (2 busy cores).
const READY_TIMEOUT: Duration = Duration::from_secs(120);
const POLL: Duration = Duration::from_millis(100);
/// How long one request of [`get`] may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

const SETUP: &str = include_str!("real_node/setup.sh");
const TEARDOWN: &str = include_str!("real_node/teardown.sh");
/// The janitor: clears leftovers, says `locked`, waits for its stdin to close, then
/// takes the node down (under `flock`, so the lock is held until it is down).
const JANITOR: &str = r#"set -u
bash -c "$NODE_TEARDOWN" >&2
echo locked
read -r _ || true
exec bash -c "$NODE_TEARDOWN" >&2
"#;

/// What the control plane gives its node.
pub(crate) struct NodeStart<'a> {
    pub ca: &'a certs::Ca,
    pub server_url: &'a str,
    pub log_dir: &'a Path,
    pub client: kube::Client,
}

/// The running node. Dropping it (or [`RealNode::stop`]) takes it down.
pub struct RealNode {
    // Dropped in this order: the daemons, then the janitor's teardown, then the registry.
    daemons: Mutex<Daemons>,
    janitor: Mutex<Option<Janitor>>,
    registry: Registry,
    images: NodeImages,
    layout: Layout,
    log_dir: PathBuf,
    /// metrics-server started ([`RealNode::metrics_server`]).
    metrics: tokio::sync::OnceCell<()>,
    /// Traefik started and its Gateway Programmed ([`RealNode::gateway`]).
    gateway: tokio::sync::OnceCell<Gateway>,
}

impl std::fmt::Debug for RealNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealNode")
            .field("name", &NODE_NAME)
            .field("registry", &self.registry.host())
            .finish_non_exhaustive()
    }
}

struct Daemons {
    containerd: Option<Component>,
    kubelet: Option<Component>,
    kube_proxy: Option<Component>,
    metrics_server: Option<Component>,
    traefik: Option<Component>,
    kubelet_program: PathBuf,
    kubelet_args: Vec<String>,
    kubelet_starts: usize,
}

impl RealNode {
    /// Starts the node against the control plane `start` describes; returns once the
    /// Node is Ready and kube-proxy has synced.
    pub(crate) async fn start(start: NodeStart<'_>) -> Result<RealNode> {
        let began = Instant::now();
        let layout = Layout::fixed();
        let programs = Programs::find()?;
        let janitor = Janitor::lock(&layout, &programs.kube_proxy, start.log_dir).await?;
        run_script("setup", SETUP, &layout, &programs.kube_proxy)?;

        // Detached: the node is shared by the tests of a binary, and the test that
        // started it ends (with its runtime) before the others.
        let registry = Registry::start(RegistryOptions {
            detached: true,
            ..RegistryOptions::default()
        })
        .await?;
        let images = NodeImages::push(&registry).await?;
        let node = RealNode {
            daemons: Mutex::new(Daemons {
                containerd: None,
                kubelet: None,
                kube_proxy: None,
                metrics_server: None,
                traefik: None,
                kubelet_program: programs.kubelet.clone(),
                kubelet_args: Vec::new(),
                kubelet_starts: 0,
            }),
            janitor: Mutex::new(Some(janitor)),
            registry,
            images,
            layout,
            log_dir: start.log_dir.to_owned(),
            metrics: tokio::sync::OnceCell::new(),
            gateway: tokio::sync::OnceCell::new(),
        };
        node.write_files(&start)?;
        node.trust_registry(&node.registry.host(), node.registry.ca_pem().as_bytes())?;

        // containerd.
        let containerd = node.spawn(
            "containerd",
            &programs.containerd,
            vec![
                "--config".into(),
                node.layout.containerd_config().display().to_string(),
            ],
        )?;
        node.daemons().containerd = Some(containerd);
        node.wait_for(
            "containerd",
            "containerd to answer `ctr version`",
            || async { node.ctr(&["version"]).await.is_ok() },
        )
        .await?;

        // The kubelet, as system:node:<name> bound to the system:node ClusterRole (the
        // harness authorizes by RBAC alone; a cluster adds the Node authorizer).
        bind_node_role(&start.client).await?;
        let kubelet_args = vec![
            format!("--config={}", node.layout.kubelet_config().display()),
            format!(
                "--kubeconfig={}",
                node.layout.kubelet_kubeconfig().display()
            ),
            format!("--root-dir={}", node.layout.kubelet_root().display()),
            format!("--cert-dir={}", node.layout.pki().join("kubelet").display()),
            format!("--hostname-override={NODE_NAME}"),
            format!("--node-ip={NODE_IP}"),
            "--node-labels=appservice.example.com/node=real".into(),
        ];
        node.daemons().kubelet_args = kubelet_args;
        node.start_kubelet()?;
        let nodes: Api<Node> = Api::all(start.client.clone());
        let nodes_ref = &nodes;
        node.wait_for("kubelet", "the Node to be Ready", move || async move {
            nodes_ref
                .get_opt(NODE_NAME)
                .await
                .ok()
                .flatten()
                .and_then(|n| n.status)
                .and_then(|s| s.conditions)
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .await?;
        // TaintNodesByCondition gave the new Node `not-ready:NoSchedule`; the node
        // lifecycle controller lifts it on its next pass, the harness at once.
        nodes
            .patch(
                NODE_NAME,
                &PatchParams::default(),
                &Patch::Merge(&serde_json::json!({ "spec": { "taints": null } })),
            )
            .await
            .map_err(kube_err("removing the not-ready taint of the real node"))?;

        // kube-proxy, as system:kube-proxy (the built-in system:node-proxier binding).
        let kube_proxy = node.spawn(
            "kube-proxy",
            &programs.kube_proxy,
            vec![format!(
                "--config={}",
                node.layout.kube_proxy_config().display()
            )],
        )?;
        node.daemons().kube_proxy = Some(kube_proxy);
        node.wait_for(
            "kube-proxy",
            "kube-proxy's first sync (healthz)",
            || async {
                crate::process::http_get(config::KUBE_PROXY_HEALTHZ_PORT, "/healthz")
                    .await
                    .is_ok_and(|answer| answer.split_whitespace().nth(1) == Some("200"))
            },
        )
        .await?;
        eprintln!(
            "harness: real node {NODE_NAME} up in {:.1?} (Pods on {POD_CIDR}, images in {})",
            began.elapsed(),
            node.registry.host()
        );
        Ok(node)
    }

    /// Starts metrics-server once (built on first use), serving the resource metrics API
    /// (`metrics.k8s.io`, what a HorizontalPodAutoscaler reads) from this node's kubelet
    /// through the API server's aggregation layer; returns once the API server serves
    /// it and it reports the node's use.
    pub async fn metrics_server(&self, client: &kube::Client) -> Result<()> {
        self.metrics
            .get_or_try_init(|| async {
                let program = tool("metrics-server")?;
                let port = crate::process::free_port()?;
                let kubeconfig = self.layout.metrics_server_kubeconfig();
                let kubeconfig = kubeconfig.display();
                let args = vec![
                    format!("--kubeconfig={kubeconfig}"),
                    format!("--authentication-kubeconfig={kubeconfig}"),
                    format!("--authorization-kubeconfig={kubeconfig}"),
                    format!("--bind-address={NODE_IP}"),
                    format!("--secure-port={port}"),
                    format!(
                        "--cert-dir={}",
                        self.layout.pki().join("metrics-server").display()
                    ),
                    // The kubelet's serving certificate is self-signed.
                    "--kubelet-insecure-tls".into(),
                    "--kubelet-preferred-address-types=InternalIP".into(),
                    "--kubelet-use-node-status-port".into(),
                    "--metric-resolution=15s".into(),
                ];
                let component = self.spawn("metrics-server", &program, args)?;
                self.daemons().metrics_server = Some(component);
                metrics::register(client, port).await?;
                let api = client.clone();
                self.wait_for(
                    "metrics-server",
                    "the API server to serve metrics.k8s.io with the node's use",
                    move || {
                        let api = api.clone();
                        async move { metrics::node_use(&api).await.is_some() }
                    },
                )
                .await
            })
            .await
            .copied()
    }

    /// The images in the node's registry.
    pub fn images(&self) -> &NodeImages {
        &self.images
    }

    /// The node's registry (TLS; containerd trusts it).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Builds an image from an asset program and pushes it to the node's registry.
    pub async fn push_image(&self, spec: ImageSpec<'_>) -> Result<Image> {
        images::push(&self.registry, spec).await
    }

    /// Lets containerd pull from the TLS registry at `host` whose CA is `ca_pem`
    /// (containerd reads `certs.d` at each pull: no restart).
    pub fn trust_registry(&self, host: &str, ca_pem: &[u8]) -> Result<()> {
        let dir = self.layout.certs_d().join(host);
        std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
        let ca = dir.join("ca.crt");
        std::fs::write(&ca, ca_pem).map_err(io(format!("writing {}", ca.display())))?;
        write(&dir.join("hosts.toml"), &Layout::hosts_toml(host, &ca))
    }

    /// Makes containerd pull images named `<name>/…` (such as `registry.example.com`, the
    /// examples' registry) from the node's registry: an image pushed there as
    /// `<repo>:<tag>` runs under the name `<name>/<repo>:<tag>`, unchanged.
    pub fn mirror(&self, name: &str) -> Result<()> {
        let dir = self.layout.certs_d().join(name);
        std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
        let ca = dir.join("ca.crt");
        std::fs::write(&ca, self.registry.ca_pem())
            .map_err(io(format!("writing {}", ca.display())))?;
        write(
            &dir.join("hosts.toml"),
            &Layout::mirror_toml(name, &self.registry.host(), &ca),
        )
    }

    /// Runs `ctr` against the node's containerd in the CRI's namespace (`k8s.io`) and
    /// returns its stdout: the runtime's own record of images, containers and tasks.
    pub async fn ctr(&self, args: &[&str]) -> Result<String> {
        let socket = self.layout.containerd_socket();
        let mut cmd = tokio::process::Command::new("ctr");
        cmd.arg("--address")
            .arg(&socket)
            .args(["--namespace", "k8s.io"])
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let what = format!("ctr {}", args.join(" "));
        let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
            .await
            .map_err(|_| Error::Node(format!("{what} did not finish within 30 s")))?
            .map_err(io(format!("running {what}")))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(Error::Node(format!(
                "{what} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        }
    }

    /// The digests of the images containerd has pulled, by reference (`ctr images ls`).
    pub async fn pulled_images(&self) -> Result<Vec<(String, String)>> {
        let listing = self.ctr(&["images", "ls"]).await?;
        Ok(parse_images(&listing))
    }

    /// Stops the kubelet (SIGKILL: what a crash does) and starts it again; returns once
    /// it answers its health check. Its containers keep running meanwhile.
    pub async fn restart_kubelet(&self) -> Result<()> {
        let old = self.daemons().kubelet.take();
        if let Some(mut old) = old {
            old.stop(Duration::from_secs(10));
        }
        self.start_kubelet()?;
        self.wait_for("kubelet", "the restarted kubelet's healthz", || async {
            crate::process::http_get(10248, "/healthz")
                .await
                .is_ok_and(|answer| answer.split_whitespace().nth(1) == Some("200"))
        })
        .await
    }

    /// Takes the node down: its daemons, then every Pod process, mount, address, route,
    /// bridge and iptables chain it made (the janitor's teardown). Idempotent.
    pub fn stop(&self) {
        {
            let mut daemons = self.daemons();
            for daemon in [
                daemons.traefik.take(),
                daemons.metrics_server.take(),
                daemons.kubelet.take(),
                daemons.kube_proxy.take(),
                daemons.containerd.take(),
            ]
            .into_iter()
            .flatten()
            {
                let mut daemon = daemon;
                daemon.stop(Duration::from_secs(10));
            }
        }
        let janitor = self
            .janitor
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(mut janitor) = janitor {
            janitor.release();
        }
    }

    fn daemons(&self) -> std::sync::MutexGuard<'_, Daemons> {
        self.daemons
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn start_kubelet(&self) -> Result<()> {
        let mut daemons = self.daemons();
        daemons.kubelet_starts += 1;
        let name = match daemons.kubelet_starts {
            1 => "kubelet".to_owned(),
            n => format!("kubelet-{n}"),
        };
        let component = Component::spawn(Spec {
            name: &name,
            program: &daemons.kubelet_program,
            args: daemons.kubelet_args.clone(),
            log_dir: &self.log_dir,
            remove_after_exit: None,
        })?;
        daemons.kubelet = Some(component);
        Ok(())
    }

    fn spawn(&self, name: &str, program: &Path, args: Vec<String>) -> Result<Component> {
        Component::spawn(Spec {
            name,
            program,
            args,
            log_dir: &self.log_dir,
            remove_after_exit: None,
        })
    }

    /// Polls `ready` until it is true; fails early with the daemon's log when it exits.
    async fn wait_for<F, Fut>(&self, daemon: &str, what: &str, ready: F) -> Result<()>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            {
                let mut daemons = self.daemons();
                let component = match daemon {
                    "containerd" => daemons.containerd.as_mut(),
                    "kubelet" => daemons.kubelet.as_mut(),
                    "metrics-server" => daemons.metrics_server.as_mut(),
                    traefik if traefik.starts_with("traefik") => daemons.traefik.as_mut(),
                    _ => daemons.kube_proxy.as_mut(),
                };
                if let Some(c) = component
                    && let Some(status) = c.exited()
                {
                    return Err(c.startup_error(format!("exited with {status}"), &self.log_dir));
                }
            }
            if ready().await {
                return Ok(());
            }
            if Instant::now() > deadline {
                let log = self.log_dir.join(format!("{daemon}.log"));
                return Err(Error::Startup {
                    component: daemon.to_owned(),
                    reason: format!("not ready after {READY_TIMEOUT:?} waiting for {what}"),
                    tail: tail(&log, 40),
                    log,
                    log_dir: self.log_dir.clone(),
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The daemons' configuration files, certificates and kubeconfigs.
    fn write_files(&self, start: &NodeStart<'_>) -> Result<()> {
        let layout = &self.layout;
        let pki = layout.pki();
        for dir in [&pki, &layout.cni_conf_dir(), &layout.certs_d()] {
            std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
        }
        let ca = pki.join("ca.crt");
        write(&ca, start.ca.cert_pem())?;
        for (user, groups, file) in [
            (
                format!("system:node:{NODE_NAME}"),
                vec!["system:nodes"],
                "kubelet",
            ),
            ("system:kube-proxy".to_owned(), vec![], "kube-proxy"),
            // Reads Nodes and Pods, the kubelet's resource metrics, and delegates
            // authentication and authorization to the API server: a cluster binds it
            // `system:metrics-server` and `system:auth-delegator`.
            (
                "metrics-server".to_owned(),
                vec!["system:masters"],
                "metrics-server",
            ),
            // Traefik's Gateway provider, bound to the ClusterRole Traefik documents
            // (`real_node/gateway.rs`).
            (gateway::USER.to_owned(), vec![], "traefik"),
        ] {
            let (cert, key) = (
                pki.join(format!("{file}-client.crt")),
                pki.join(format!("{file}-client.key")),
            );
            start.ca.client_cert(&user, &groups)?.write(&cert, &key)?;
            let path = match file {
                "kubelet" => layout.kubelet_kubeconfig(),
                "metrics-server" => layout.metrics_server_kubeconfig(),
                "traefik" => layout.traefik_kubeconfig(),
                _ => layout.kube_proxy_kubeconfig(),
            };
            write(
                &path,
                &config::kubeconfig(start.server_url, &ca, &cert, &key),
            )?;
        }
        write(
            &layout.containerd_config(),
            &layout.containerd_toml(&self.images.pause.reference),
        )?;
        write(
            &layout.cni_conf_dir().join("10-appservice-node.conflist"),
            &layout.cni_conflist(),
        )?;
        // Pods resolve nothing: no cluster DNS runs, and nothing may leave the machine.
        write(&layout.resolv_conf(), "nameserver 127.0.0.1\n")?;
        write(&layout.kubelet_config(), &layout.kubelet_config_text())?;
        write(
            &layout.kube_proxy_config(),
            &layout.kube_proxy_config_text(),
        )
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The binaries the node runs: the kubelet and kube-proxy from the assets, containerd
/// from the distribution.
struct Programs {
    kubelet: PathBuf,
    kube_proxy: PathBuf,
    containerd: PathBuf,
}

impl Programs {
    fn find() -> Result<Self> {
        let containerd = which("containerd").ok_or_else(|| {
            Error::Node(
                "`containerd` is not on PATH: `cargo xtask test` installs it, or run `apt-get install containerd runc containernetworking-plugins iptables conntrack`".to_owned(),
            )
        })?;
        Ok(Self {
            kubelet: tool("kubelet")?,
            kube_proxy: tool("kube-proxy")?,
            containerd,
        })
    }
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|path| path.is_file())
    })
}

/// The process holding the node's lock; see [`JANITOR`].
struct Janitor {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Janitor {
    /// Takes the lock (waiting for another node to go) and clears what a killed run left.
    async fn lock(layout: &Layout, kube_proxy: &Path, log_dir: &Path) -> Result<Self> {
        let log = log_dir.join("real-node-janitor.log");
        let stderr =
            std::fs::File::create(&log).map_err(io(format!("creating {}", log.display())))?;
        let wait = LOCK_WAIT.as_secs().to_string();
        let mut child = Command::new("flock")
            .args(["-w", &wait, LOCK, "bash", "-c", JANITOR])
            .envs(layout.script_env(kube_proxy))
            .env("NODE_TEARDOWN", TEARDOWN)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            // Its own process group: a Ctrl-C reaches the test, which then stops the node;
            // the janitor must live to take it down.
            .process_group(0)
            .spawn()
            .map_err(io(
                "starting the real node's janitor (flock, from util-linux)",
            ))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| Error::Node("the janitor has no stdout".to_owned()))?;
        let mut said = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            line
        });
        let line = match tokio::time::timeout(Duration::from_secs(5), &mut said).await {
            Ok(line) => line,
            Err(_) => {
                eprintln!(
                    "harness: another real node holds {LOCK}; waiting up to {LOCK_WAIT:?} for it to go"
                );
                said.await
            }
        }
        .map_err(|e| Error::Node(format!("waiting for the janitor: {e}")))?;
        if line.trim() != "locked" {
            let status = child.wait().map_err(io("waiting for the janitor"))?;
            return Err(Error::Node(format!(
                "could not take {LOCK} within {LOCK_WAIT:?} (another real node runs on this machine) or clear the last node's leftovers: the janitor exited with {status}; its log {}:\n{}",
                log.display(),
                tail(&log, 20)
            )));
        }
        let stdin = child.stdin.take();
        Ok(Self { child, stdin })
    }

    /// Closes the pipe (the janitor takes the node down) and waits for it.
    fn release(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_)) | Err(_)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!("harness: the real node's teardown did not finish within 120 s");
    }
}

impl Drop for Janitor {
    fn drop(&mut self) {
        self.release();
    }
}

fn run_script(name: &str, script: &str, layout: &Layout, kube_proxy: &Path) -> Result<()> {
    let out = Command::new("bash")
        .args(["-c", script, name])
        .envs(layout.script_env(kube_proxy))
        .stdin(Stdio::null())
        .output()
        .map_err(io(format!("running the real node's {name} script")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::Node(format!(
            "{name} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// The ClusterRoleBinding that gives the node's user the `system:node` role.
async fn bind_node_role(client: &kube::Client) -> Result<()> {
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": { "name": "appservice-harness:node" },
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "system:node",
        },
        "subjects": [{
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "User",
            "name": format!("system:node:{NODE_NAME}"),
        }],
    }))
    .map_err(|e| Error::Config(format!("node ClusterRoleBinding: {e}")))?;
    match bindings.create(&PostParams::default(), &binding).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(e) => Err(kube_err("binding the real node's user to system:node")(e)),
    }
}

fn write(path: &Path, contents: &str) -> Result<()> {
    std::fs::write(path, contents).map_err(io(format!("writing {}", path.display())))
}

/// `(reference, digest)` of each image in `ctr images ls` output (columns REF, TYPE,
/// DIGEST, ...; the header skipped).
fn parse_images(listing: &str) -> Vec<(String, String)> {
    listing
        .lines()
        .skip(1)
        .filter_map(|line| {
            let mut columns = line.split_whitespace();
            let reference = columns.next()?;
            let _media_type = columns.next()?;
            let digest = columns.next()?;
            digest
                .starts_with("sha256:")
                .then(|| (reference.to_owned(), digest.to_owned()))
        })
        .collect()
}

/// `GET path` over plain HTTP/1.0 to `addr` (`ip:port`: a ClusterIP from this machine,
/// through kube-proxy, or a Pod address on the node's bridge), one connection, bounded by
/// [`REQUEST_TIMEOUT`]. Returns the status and the body.
pub async fn get(addr: &str, path: &str) -> Result<(u16, String)> {
    let what = format!("GET http://{addr}{path}");
    let request = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        let head = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        stream.write_all(head.as_bytes()).await?;
        let mut answer = Vec::new();
        (&mut stream).take(1 << 20).read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    let answer = tokio::time::timeout(REQUEST_TIMEOUT, request)
        .await
        .map_err(|_| Error::Node(format!("{what}: no answer within {REQUEST_TIMEOUT:?}")))?
        .map_err(io(what.clone()))?;
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| Error::Node(format!("{what}: no HTTP head in {text:?}")))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| Error::Node(format!("{what}: no status in {head:?}")))?;
    Ok((status, body.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ctr_images_ls_gives_each_reference_its_digest() {
        let listing = "REF TYPE DIGEST SIZE PLATFORMS LABELS\n\
            127.0.0.1:5000/hello:v1 application/vnd.oci.image.manifest.v1+json sha256:aa 5.0 MiB linux/amd64 io.cri-containerd.image=managed\n\
            sha256:bb application/vnd.oci.image.manifest.v1+json sha256:aa 5.0 MiB linux/amd64 -\n";
        assert_eq!(
            parse_images(listing),
            vec![
                ("127.0.0.1:5000/hello:v1".to_owned(), "sha256:aa".to_owned()),
                ("sha256:bb".to_owned(), "sha256:aa".to_owned()),
            ]
        );
    }
}
