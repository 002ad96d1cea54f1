//! The configuration files of the real node's daemons: containerd (with the CRI plugin's
//! one setting these machines need), the CNI network, the kubelet and kube-proxy. Pure
//! text from [`Layout`], so that a test can read what the node runs with.

use std::path::{Path, PathBuf};

/// Where the node keeps its files and what addresses it uses. One node per machine: the
/// paths and names are fixed, so that a run can clear what a killed run left behind.
#[derive(Debug, Clone)]
pub struct Layout {
    /// Persistent state: containerd's content and snapshots, the kubelet's root.
    pub root: PathBuf,
    /// Runtime state: sockets, configuration, containerd's state, network namespaces.
    pub run: PathBuf,
}

/// The node's name, as registered with the API server.
pub const NODE_NAME: &str = "appservice-node";
/// The node's address: a /32 on `lo` (the kubelet refuses a loopback `--node-ip`), so it
/// is reachable from this machine only. The kubelet serves on it.
pub const NODE_IP: &str = "10.245.1.1";
/// The Pods' addresses: the bridge's /24, clear of kwok's 10.244.0.0/16.
pub const POD_CIDR: &str = "10.245.0.0/24";
/// The bridge's address: the Pods' gateway, and the host's address as Pods see it (a
/// server the Pods must reach, such as the harness's PostgreSQL, listens on it).
pub const NODE_GATEWAY: &str = "10.245.0.1";
/// The API server's `--service-cluster-ip-range`: routed into the bridge while the node
/// runs, so that no Service address can leave the machine.
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
/// The bridge the CNI plugin attaches Pods to.
pub const BRIDGE: &str = "appsvc0";
/// The kubelet's `cgroupRoot`: every Pod's processes live under it.
pub const CGROUP: &str = "appservice-node";
/// Where Debian's containernetworking-plugins puts the CNI plugins.
pub const CNI_BIN: &str = "/usr/lib/cni";
/// The CNI network's name (also the prefix of its results under /var/lib/cni/results).
pub const CNI_NETWORK: &str = "appservice-node";
/// kube-proxy's health endpoint (200 once its first sync is done).
pub const KUBE_PROXY_HEALTHZ_PORT: u16 = 10256;

impl Layout {
    /// The fixed layout of the one node of this machine.
    pub fn fixed() -> Self {
        Self {
            root: PathBuf::from("/var/lib/appservice-node"),
            run: PathBuf::from("/run/appservice-node"),
        }
    }

    pub fn containerd_config(&self) -> PathBuf {
        self.run.join("containerd.toml")
    }
    pub fn containerd_socket(&self) -> PathBuf {
        self.run.join("containerd.sock")
    }
    pub fn certs_d(&self) -> PathBuf {
        self.run.join("certs.d")
    }
    pub fn cni_conf_dir(&self) -> PathBuf {
        self.run.join("cni")
    }
    pub fn pki(&self) -> PathBuf {
        self.run.join("pki")
    }
    pub fn kubelet_config(&self) -> PathBuf {
        self.run.join("kubelet-config.yaml")
    }
    pub fn kubelet_kubeconfig(&self) -> PathBuf {
        self.run.join("kubelet.kubeconfig")
    }
    pub fn kube_proxy_config(&self) -> PathBuf {
        self.run.join("kube-proxy-config.yaml")
    }
    pub fn kube_proxy_kubeconfig(&self) -> PathBuf {
        self.run.join("kube-proxy.kubeconfig")
    }
    pub fn metrics_server_kubeconfig(&self) -> PathBuf {
        self.run.join("metrics-server.kubeconfig")
    }
    pub fn traefik_kubeconfig(&self) -> PathBuf {
        self.run.join("traefik.kubeconfig")
    }
    pub fn resolv_conf(&self) -> PathBuf {
        self.run.join("resolv.conf")
    }
    pub fn kubelet_root(&self) -> PathBuf {
        self.root.join("kubelet")
    }

    /// The environment of `setup.sh` and `teardown.sh`.
    pub fn script_env(&self, kube_proxy: &Path) -> Vec<(&'static str, String)> {
        vec![
            ("NODE_ROOT", self.root.display().to_string()),
            ("NODE_RUN", self.run.display().to_string()),
            ("NODE_CGROUP", CGROUP.to_owned()),
            ("NODE_BRIDGE", BRIDGE.to_owned()),
            ("NODE_IP", NODE_IP.to_owned()),
            ("NODE_GATEWAY", NODE_GATEWAY.to_owned()),
            ("SERVICE_CIDR", SERVICE_CIDR.to_owned()),
            ("CNI_BIN", CNI_BIN.to_owned()),
            ("KUBE_PROXY", kube_proxy.display().to_string()),
        ]
    }

    /// containerd's configuration: its own root, state and socket; the CRI plugin with
    /// `sandbox_image` from the harness's registry, registries read from `certs.d` at each
    /// pull, network namespaces under its state directory, and
    /// `restrict_oom_score_adj`: these machines lack CAP_SYS_RESOURCE, without which
    /// every sandbox fails to start (`runc create failed: ... can't get final child's PID
    /// from pipe: EOF`).
    pub fn containerd_toml(&self, sandbox_image: &str) -> String {
        let q = |p: PathBuf| toml_string(&p.display().to_string());
        format!(
            r#"version = 2
root = {root}
state = {state}
oom_score = 0

[grpc]
  address = {socket}

[ttrpc]
  address = {ttrpc}

[debug]
  level = "info"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = {opt}

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = {sandbox}
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = {runc_root}
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = {cni_bin}
    conf_dir = {cni_conf}
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = {certs_d}
"#,
            root = q(self.root.join("containerd")),
            state = q(self.run.join("containerd")),
            socket = q(self.containerd_socket()),
            ttrpc = q(self.run.join("containerd.sock.ttrpc")),
            opt = q(self.root.join("containerd-opt")),
            runc_root = q(self.run.join("runc")),
            sandbox = toml_string(sandbox_image),
            cni_bin = toml_string(CNI_BIN),
            cni_conf = q(self.cni_conf_dir()),
            certs_d = q(self.certs_d()),
        )
    }

    /// The CNI network: a bridge with host-local addresses on [`POD_CIDR`] (the bridge is
    /// the gateway, no masquerade: Pods reach this machine and each other, nothing else),
    /// portmap for hostPorts.
    pub fn cni_conflist(&self) -> String {
        serde_json::json!({
            "cniVersion": "0.4.0",
            "name": CNI_NETWORK,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": true,
                    "ipMasq": false,
                    "hairpinMode": true,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{ "subnet": POD_CIDR, "gateway": NODE_GATEWAY }]],
                        "dataDir": self.run.join("cni-ipam").display().to_string(),
                    },
                },
                { "type": "portmap", "capabilities": { "portMappings": true } },
            ],
        })
        .to_string()
    }

    /// The kubelet's configuration: cgroup v1 allowed (`failCgroupV1: false`, these
    /// machines mount v1), cgroupfs under [`CGROUP`], serving on [`NODE_IP`] with client
    /// certificates of the cluster CA and webhook authorization (what a cluster runs, so
    /// that `kubectl logs` and `exec` go through the API server's kubelet client
    /// certificate), no read-only port, eviction thresholds low enough for a busy disk,
    /// no image garbage collection, its own resolv.conf (Pods resolve nothing).
    pub fn kubelet_config_text(&self) -> String {
        let socket = format!("unix://{}", self.containerd_socket().display());
        serde_json::json!({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": false,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": format!("/{CGROUP}"),
            "containerRuntimeEndpoint": socket,
            "imageServiceEndpoint": socket,
            "address": NODE_IP,
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": 10248,
            "failSwapOn": false,
            "oomScoreAdj": 0,
            "resolvConf": self.resolv_conf().display().to_string(),
            "clusterDomain": "cluster.local",
            "staticPodPath": "",
            "serializeImagePulls": false,
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "50Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
            },
            "authentication": {
                "anonymous": { "enabled": false },
                "webhook": { "enabled": true },
                "x509": { "clientCAFile": self.pki().join("ca.crt").display().to_string() },
            },
            "authorization": { "mode": "Webhook" },
        })
        .to_string()
    }

    /// kube-proxy's configuration: iptables mode, node ports only on [`NODE_IP`], and the
    /// host's conntrack settings left alone.
    pub fn kube_proxy_config_text(&self) -> String {
        serde_json::json!({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "iptables",
            "clientConnection": {
                "kubeconfig": self.kube_proxy_kubeconfig().display().to_string(),
            },
            "hostnameOverride": NODE_NAME,
            "clusterCIDR": POD_CIDR,
            "nodePortAddresses": [format!("{NODE_IP}/32")],
            "healthzBindAddress": format!("127.0.0.1:{KUBE_PROXY_HEALTHZ_PORT}"),
            "metricsBindAddress": "127.0.0.1:10249",
            "oomScoreAdj": 0,
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
        })
        .to_string()
    }

    /// containerd's `certs.d/<host>/hosts.toml` for a TLS registry at `host` whose CA is
    /// the file `ca`: read at each pull, so a registry can be added while the node runs.
    pub fn hosts_toml(host: &str, ca: &Path) -> String {
        let server = toml_string(&format!("https://{host}"));
        format!(
            "server = {server}\n\n[host.{server}]\n  capabilities = [\"pull\", \"resolve\"]\n  ca = {ca}\n",
            ca = toml_string(&ca.display().to_string()),
        )
    }

    /// containerd's `certs.d/<name>/hosts.toml` that serves the images named
    /// `<name>/…` from the TLS registry at `host` (CA file `ca`).
    pub fn mirror_toml(name: &str, host: &str, ca: &Path) -> String {
        format!(
            "server = {server}\n\n[host.{host}]\n  capabilities = [\"pull\", \"resolve\"]\n  ca = {ca}\n",
            server = toml_string(&format!("https://{name}")),
            host = toml_string(&format!("https://{host}")),
            ca = toml_string(&ca.display().to_string()),
        )
    }
}

/// A kubeconfig for `user` with client certificate files.
pub fn kubeconfig(server: &str, ca: &Path, cert: &Path, key: &Path) -> String {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": "harness", "cluster": {
            "server": server,
            "certificate-authority": ca.display().to_string(),
        }}],
        "users": [{ "name": "node", "user": {
            "client-certificate": cert.display().to_string(),
            "client-key": key.display().to_string(),
        }}],
        "contexts": [{ "name": "harness", "context": { "cluster": "harness", "user": "node" } }],
        "current-context": "harness",
    })
    .to_string()
}

/// A TOML basic string (JSON string escapes are TOML's).
fn toml_string(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containerd_runs_without_cap_sys_resource_and_keeps_its_namespaces_in_its_state() {
        let toml = Layout::fixed().containerd_toml("127.0.0.1:5000/pause:1");
        assert!(toml.contains("restrict_oom_score_adj = true"), "{toml}");
        assert!(
            toml.contains("netns_mounts_under_state_dir = true"),
            "{toml}"
        );
        assert!(
            toml.contains(r#"sandbox_image = "127.0.0.1:5000/pause:1""#),
            "{toml}"
        );
        assert!(
            toml.contains(r#"config_path = "/run/appservice-node/certs.d""#),
            "{toml}"
        );
    }

    #[test]
    fn the_kubelet_allows_cgroup_v1_and_serves_only_on_the_node_address() {
        let config: serde_json::Value =
            serde_json::from_str(&Layout::fixed().kubelet_config_text()).unwrap();
        assert_eq!(config["failCgroupV1"], false);
        assert_eq!(config["address"], NODE_IP);
        assert_eq!(config["readOnlyPort"], 0);
        assert_eq!(config["authentication"]["anonymous"]["enabled"], false);
        assert_eq!(config["authorization"]["mode"], "Webhook");
    }

    #[test]
    fn hosts_toml_names_the_registry_and_its_ca() {
        let toml = Layout::hosts_toml("127.0.0.1:5000", Path::new("/tmp/ca.crt"));
        assert_eq!(
            toml,
            "server = \"https://127.0.0.1:5000\"\n\n[host.\"https://127.0.0.1:5000\"]\n  capabilities = [\"pull\", \"resolve\"]\n  ca = \"/tmp/ca.crt\"\n"
        );
    }
}
