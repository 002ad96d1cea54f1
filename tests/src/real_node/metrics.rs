//! metrics-server behind the API server's aggregation layer: the objects that make the
//! API server proxy `metrics.k8s.io` to it, and a look at what it serves.

use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use super::{NODE_IP, NODE_NAME};
use crate::error::{Result, kube as kube_err};

const NAMESPACE: &str = "kube-system";
const NAME: &str = "metrics-server";
const MANAGER: &str = "appservice-harness";

/// The Service `kube-system/metrics-server` (no selector) with an endpoint at the node's
/// address and `port`, and the APIService `v1beta1.metrics.k8s.io` pointing at it (its
/// serving certificate is self-signed, as metrics-server makes one by default).
pub(super) async fn register(client: &kube::Client, port: u16) -> Result<()> {
    let params = PatchParams::apply(MANAGER).force();
    let service: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port}]},
    }))
    .map_err(|e| crate::error::Error::Node(format!("the metrics-server Service: {e}")))?;
    Api::<Service>::namespaced(client.clone(), NAMESPACE)
        .patch(NAME, &params, &Patch::Apply(&service))
        .await
        .map_err(kube_err("applying the metrics-server Service"))?;
    let endpoints: Endpoints = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "subsets": [{
            "addresses": [{"ip": NODE_IP}],
            "ports": [{"name": "https", "port": port}],
        }],
    }))
    .map_err(|e| crate::error::Error::Node(format!("the metrics-server Endpoints: {e}")))?;
    Api::<Endpoints>::namespaced(client.clone(), NAMESPACE)
        .patch(NAME, &params, &Patch::Apply(&endpoints))
        .await
        .map_err(kube_err("applying the metrics-server Endpoints"))?;
    let api_service: APIService = serde_json::from_value(json!({
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": "v1beta1.metrics.k8s.io"},
        "spec": {
            "service": {"namespace": NAMESPACE, "name": NAME, "port": 443},
            "group": "metrics.k8s.io", "version": "v1beta1",
            "insecureSkipTLSVerify": true,
            "groupPriorityMinimum": 100, "versionPriority": 100,
        },
    }))
    .map_err(|e| crate::error::Error::Node(format!("the metrics APIService: {e}")))?;
    Api::<APIService>::all(client.clone())
        .patch(
            "v1beta1.metrics.k8s.io",
            &params,
            &Patch::Apply(&api_service),
        )
        .await
        .map_err(kube_err("applying the metrics.k8s.io APIService"))?;
    Ok(())
}

/// The node's CPU use as metrics-server reports it through the API server, once it does.
pub(super) async fn node_use(client: &kube::Client) -> Option<String> {
    let request = http::Request::get(format!("/apis/metrics.k8s.io/v1beta1/nodes/{NODE_NAME}"))
        .body(Vec::new())
        .ok()?;
    let answer: serde_json::Value = client.request(request).await.ok()?;
    answer["usage"]["cpu"].as_str().map(str::to_owned)
}
