//! A Gateway API implementation on the real node: Traefik (built on first use) as a host
//! process, the controller of the GatewayClass [`CLASS`], serving the Gateway
//! [`NAMESPACE`]`/`[`NAME`] on two entryPoints bound on 127.0.0.1 at ports chosen at
//! start: `web` (the Gateway's listener [`HTTP_LISTENER`]) and `websecure` (the port of
//! the HTTPS listeners tests add). Traefik maps a listener to the entryPoint of the same
//! port, and forwards to the ready addresses of a Service's EndpointSlices: the node's Pod
//! addresses, which this machine reaches on the bridge. Only loopback traffic: Traefik
//! neither checks for new versions nor reports usage, and no proxy is set.
//!
//! It reads the cluster as the user [`USER`] (a client certificate in its kubeconfig,
//! given through `KUBECONFIG`, the one way Traefik's Gateway provider takes a certificate)
//! bound to the ClusterRole Traefik documents for its Gateway provider.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::Api;
use kube::api::{DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};

use super::{RealNode, which};
use crate::assets::tool;
use crate::error::{Error, Result, kube as kube_err};
use crate::gateway_api;

/// The Gateway's namespace.
pub const NAMESPACE: &str = "appservice-gateway";
/// The Gateway's name.
pub const NAME: &str = "public";
/// The GatewayClass Traefik serves.
pub const CLASS: &str = "traefik";
/// Traefik's controller name (what a GatewayClass names to be served by it).
pub const CONTROLLER_NAME: &str = "traefik.io/gateway-controller";
/// The Gateway's plain HTTP listener, open to routes of every namespace.
pub const HTTP_LISTENER: &str = "http";
/// The user Traefik reads and writes the cluster as.
pub(super) const USER: &str = "traefik";
/// The field manager of what the harness applies here.
const MANAGER: &str = "appservice-harness";
/// The ClusterRole Traefik's documentation gives its Gateway provider.
const ROLE: &str = "appservice-harness:traefik";
/// Attempts at binding two free ports (another process may take one meanwhile).
const PORT_ATTEMPTS: usize = 3;
/// How long one request of a [`Gateway`] client may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The node's Gateway, Programmed by Traefik.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gateway {
    /// [`NAMESPACE`].
    pub namespace: String,
    /// [`NAME`].
    pub name: String,
    /// Where the listener [`HTTP_LISTENER`] answers (Traefik's `web` entryPoint; the IP
    /// is the Gateway's status address).
    pub http: SocketAddr,
    /// Traefik's `websecure` entryPoint: an HTTPS listener added to the Gateway names its
    /// port ([`Gateway::https_port`]) and answers here.
    pub https: SocketAddr,
}

impl Gateway {
    /// The port of the `websecure` entryPoint, for an HTTPS listener.
    pub fn https_port(&self) -> u16 {
        self.https.port()
    }

    /// The port of the `web` entryPoint (the listener [`HTTP_LISTENER`]'s).
    pub fn http_port(&self) -> u16 {
        self.http.port()
    }

    /// A route's `parentRefs` entry for this Gateway's listener `section`.
    pub fn parent_ref(&self, section: &str) -> Value {
        json!({
            "group": gateway_api::GROUP,
            "kind": "Gateway",
            "namespace": self.namespace,
            "name": self.name,
            "sectionName": section,
        })
    }

    /// A client that sends `http://<host>/…` to the listener [`HTTP_LISTENER`] (host
    /// name resolved to [`Gateway::http`]: the request carries `Host: <host>`).
    pub fn http_client(&self, host: &str) -> Result<reqwest::Client> {
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Node(format!("a TLS configuration: {e}")))?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        client(host, self.http, tls)
    }

    /// A client that sends `https://<host>/…` to the `websecure` entryPoint (host name
    /// resolved to [`Gateway::https`]): SNI `<host>`, the certificate verified against
    /// `ca_pem` alone.
    pub fn https_client(&self, host: &str, ca_pem: &str) -> Result<reqwest::Client> {
        let tls = crate::registry::tls_client(ca_pem)
            .map_err(|e| Error::Node(format!("a TLS configuration trusting the CA: {e}")))?;
        client(host, self.https, tls)
    }
}

fn client(host: &str, addr: SocketAddr, tls: rustls::ClientConfig) -> Result<reqwest::Client> {
    reqwest::Client::builder()
        .resolve(host, addr)
        .tls_backend_preconfigured(tls)
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(REQUEST_TIMEOUT)
        .timeout(REQUEST_TIMEOUT)
        .build()
        .map_err(|e| Error::Node(format!("building an HTTP client for {host} at {addr}: {e}")))
}

impl RealNode {
    /// Starts Traefik once (built on first use) with the Gateway API CRDs, the
    /// GatewayClass [`CLASS`] and the Gateway [`NAMESPACE`]`/`[`NAME`] with the one
    /// listener [`HTTP_LISTENER`]; returns once the Gateway is Programmed with its address.
    pub async fn gateway(&self, client: &kube::Client) -> Result<Gateway> {
        self.gateway
            .get_or_try_init(|| self.start_gateway(client))
            .await
            .cloned()
    }

    async fn start_gateway(&self, client: &kube::Client) -> Result<Gateway> {
        let began = std::time::Instant::now();
        let traefik = tool("traefik")?;
        let env = which("env")
            .ok_or_else(|| Error::Node("`env` (coreutils) is not on PATH".to_owned()))?;
        gateway_api::install_crds(client).await?;
        authorize(client).await?;
        apply_class(client).await?;
        let gateways: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), NAMESPACE, &gateway_api::gateway());
        let mut attempt = 0;
        loop {
            attempt += 1;
            let web = crate::process::free_port()?;
            let websecure = loop {
                let port = crate::process::free_port()?;
                if port != web {
                    break port;
                }
            };
            apply_gateway(&gateways, web).await?;
            // Through env(1): Traefik takes a client certificate only from $KUBECONFIG,
            // and would prefer an in-cluster configuration if the tests ran in a Pod.
            let mut args = vec![
                "-u".to_owned(),
                "KUBERNETES_SERVICE_HOST".to_owned(),
                "-u".to_owned(),
                "KUBERNETES_SERVICE_PORT".to_owned(),
                format!("KUBECONFIG={}", self.layout.traefik_kubeconfig().display()),
                traefik.display().to_string(),
            ];
            args.extend(traefik_args(web, websecure));
            let name = match attempt {
                1 => "traefik".to_owned(),
                n => format!("traefik-{n}"),
            };
            let component = self.spawn(&name, &env, args)?;
            self.daemons().traefik = Some(component);
            let gateways_ref = &gateways;
            let ready = self
                .wait_for(
                    &name,
                    "its entryPoints to listen and the Gateway to be Programmed",
                    move || async move {
                        listening(web).await
                            && listening(websecure).await
                            && programmed(gateways_ref).await.is_some()
                    },
                )
                .await;
            match ready {
                Ok(()) => {
                    let ip = programmed(&gateways).await.ok_or_else(|| {
                        Error::Node("the Gateway is no longer Programmed".to_owned())
                    })?;
                    let gateway = Gateway {
                        namespace: NAMESPACE.to_owned(),
                        name: NAME.to_owned(),
                        http: SocketAddr::new(ip, web),
                        https: SocketAddr::new(ip, websecure),
                    };
                    eprintln!(
                        "harness: Traefik up in {:.1?}: Gateway {NAMESPACE}/{NAME} Programmed, `{HTTP_LISTENER}` on {}, HTTPS listeners on port {}",
                        began.elapsed(),
                        gateway.http,
                        gateway.https_port()
                    );
                    return Ok(gateway);
                }
                Err(Error::Startup { tail, .. })
                    if crate::process::lost_the_port(&tail) && attempt < PORT_ATTEMPTS =>
                {
                    eprintln!("harness: Traefik lost a port to another process; again");
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// Traefik's flags: no call home, the two entryPoints on loopback, the Gateway provider
/// reporting 127.0.0.1 as the Gateway's address.
fn traefik_args(web: u16, websecure: u16) -> Vec<String> {
    vec![
        "--global.checkNewVersion=false".into(),
        "--global.sendAnonymousUsage=false".into(),
        "--log.level=INFO".into(),
        "--log.noColor=true".into(),
        format!("--entryPoints.web.address=127.0.0.1:{web}"),
        format!("--entryPoints.websecure.address=127.0.0.1:{websecure}"),
        "--providers.kubernetesGateway=true".into(),
        "--providers.kubernetesGateway.statusAddress.ip=127.0.0.1".into(),
    ]
}

async fn listening(port: u16) -> bool {
    tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port))
        .await
        .is_ok()
}

/// The Gateway's status address once it is Programmed for its current generation.
async fn programmed(gateways: &Api<DynamicObject>) -> Option<IpAddr> {
    let gateway = gateways.get(NAME).await.ok()?;
    let condition = gateway_api::condition(&gateway, "Programmed")?;
    if condition.status != "True" || condition.observed_generation != gateway.metadata.generation {
        return None;
    }
    gateway.data["status"]["addresses"]
        .as_array()?
        .iter()
        .find_map(|a| a["value"].as_str()?.parse().ok())
}

/// The ClusterRole of Traefik's documentation (`kubernetes-gateway-rbac.yml`, without
/// `pods get`, which only its OpenTelemetry attributes need) bound to [`USER`].
async fn authorize(client: &kube::Client) -> Result<()> {
    let params = PatchParams::apply(MANAGER).force();
    let gateway_kinds = [
        "gatewayclasses",
        "gateways",
        "httproutes",
        "grpcroutes",
        "tcproutes",
        "tlsroutes",
        "referencegrants",
        "backendtlspolicies",
    ];
    let statuses: Vec<String> = gateway_kinds
        .iter()
        .map(|k| format!("{k}/status"))
        .collect();
    let role: ClusterRole = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": ROLE},
        "rules": [
            {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
            {"apiGroups": [""], "resources": ["services", "secrets", "configmaps"],
             "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
             "verbs": ["list", "watch"]},
            {"apiGroups": [gateway_api::GROUP], "resources": gateway_kinds,
             "verbs": ["get", "list", "watch"]},
            {"apiGroups": [gateway_api::GROUP], "resources": statuses, "verbs": ["update"]},
        ],
    }))
    .map_err(|e| Error::Config(format!("Traefik's ClusterRole: {e}")))?;
    Api::<ClusterRole>::all(client.clone())
        .patch(ROLE, &params, &Patch::Apply(&role))
        .await
        .map_err(kube_err("applying Traefik's ClusterRole"))?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": ROLE},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ROLE},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
    }))
    .map_err(|e| Error::Config(format!("Traefik's ClusterRoleBinding: {e}")))?;
    Api::<ClusterRoleBinding>::all(client.clone())
        .patch(ROLE, &params, &Patch::Apply(&binding))
        .await
        .map_err(kube_err("binding Traefik's ClusterRole"))?;
    Ok(())
}

/// The Gateway's namespace and the GatewayClass [`CLASS`].
async fn apply_class(client: &kube::Client) -> Result<()> {
    let params = PatchParams::apply(MANAGER).force();
    let namespace: Namespace = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE},
    }))
    .map_err(|e| Error::Config(format!("the Gateway's namespace: {e}")))?;
    Api::<Namespace>::all(client.clone())
        .patch(NAMESPACE, &params, &Patch::Apply(&namespace))
        .await
        .map_err(kube_err("applying the Gateway's namespace"))?;
    let class = json!({
        "apiVersion": format!("{}/v1", gateway_api::GROUP),
        "kind": "GatewayClass",
        "metadata": {"name": CLASS},
        "spec": {"controllerName": CONTROLLER_NAME},
    });
    Api::<DynamicObject>::all_with(client.clone(), &gateway_api::gateway_class())
        .patch(CLASS, &params, &Patch::Apply(&class))
        .await
        .map_err(kube_err("applying the GatewayClass"))?;
    Ok(())
}

/// The Gateway with its one listener [`HTTP_LISTENER`] on `port` (the `web`
/// entryPoint's), open to routes of every namespace. Listeners that other field managers
/// applied are theirs and stay.
async fn apply_gateway(gateways: &Api<DynamicObject>, port: u16) -> Result<()> {
    let gateway = json!({
        "apiVersion": format!("{}/v1", gateway_api::GROUP),
        "kind": "Gateway",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {
            "gatewayClassName": CLASS,
            "listeners": [{
                "name": HTTP_LISTENER,
                "protocol": "HTTP",
                "port": port,
                "allowedRoutes": {"namespaces": {"from": "All"}},
            }],
        },
    });
    gateways
        .patch(
            NAME,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&gateway),
        )
        .await
        .map_err(kube_err("applying the Gateway"))?;
    Ok(())
}
