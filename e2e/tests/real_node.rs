//! The harness's real node on its own: containerd, runc, the CNI bridge, the kubelet and
//! kube-proxy run a Deployment's containers from an image built here, in a namespace
//! that enforces Pod Security `restricted`; a ClusterIP answers from this machine;
//! `kubectl logs` and `exec` reach the container through the API server.
//!
//! One real node per machine: this binary shares one with its tests.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use harness::eventually;
use harness::real_node::{self, NODE_NAME, POD_CIDR};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const WAIT: Duration = Duration::from_secs(90);

fn restricted_deployment(name: &str, image: &str, replicas: i32) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "app",
                        "image": image,
                        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                        "ports": [{"name": "http", "containerPort": 8080}],
                        "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
                        "securityContext": {"allowPrivilegeEscalation": false,
                                            "capabilities": {"drop": ["ALL"]},
                                            "readOnlyRootFilesystem": true},
                    }],
                },
            },
        },
    }))
    .unwrap()
}

#[tokio::test]
async fn a_restricted_deployment_runs_and_answers_through_its_cluster_ip() -> TestResult {
    let cp = harness::shared_real_node().await?;
    let node = cp.node().expect("a real node");
    let ns = cp.namespace().await?;
    let deployments: Api<Deployment> = Api::namespaced(cp.client(), &ns);
    let services: Api<Service> = Api::namespaced(cp.client(), &ns);
    let pods: Api<Pod> = Api::namespaced(cp.client(), &ns);
    let image = &node.images().hello_v1;
    deployments
        .create(
            &PostParams::default(),
            &restricted_deployment("web", &image.reference, 2),
        )
        .await?;
    let service: Service = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }))?;
    let service = services.create(&PostParams::default(), &service).await?;
    let cluster_ip = service.spec.unwrap().cluster_ip.unwrap();

    eventually("2 ready replicas", WAIT, || async {
        let status = deployments.get("web").await.ok()?.status?;
        (status.ready_replicas == Some(2)).then_some(())
    })
    .await?;
    let listed = pods.list(&ListParams::default().labels("app=web")).await?;
    let mut names = Vec::new();
    for pod in &listed.items {
        assert_eq!(
            pod.spec.as_ref().unwrap().node_name.as_deref(),
            Some(NODE_NAME)
        );
        let status = pod.status.as_ref().unwrap();
        let ip = status.pod_ip.as_deref().unwrap();
        assert!(ip.starts_with("10.245.0."), "{ip} is not in {POD_CIDR}");
        // The kubelet reports the digest containerd resolved the tag to.
        let image_id = &status.container_statuses.as_ref().unwrap()[0].image_id;
        assert!(image_id.ends_with(&image.digest), "{image_id}");
        names.push(pod.metadata.name.clone().unwrap());
    }

    // Through kube-proxy: both Pods answer, as the non-root image user, read-only root.
    let seen = std::sync::Mutex::new(std::collections::BTreeSet::new());
    let addr = format!("{cluster_ip}:80");
    eventually(
        "both Pods to answer through the ClusterIP",
        WAIT,
        || async {
            let (status, body) = real_node::get(&addr, "/").await.ok()?;
            assert_eq!(status, 200, "{body}");
            let answer: Value = serde_json::from_str(&body).unwrap();
            assert_eq!(answer["version"], "v1");
            assert_eq!(answer["uid"], 65532);
            assert_eq!(answer["readOnlyRoot"], true);
            let mut seen = seen.lock().unwrap();
            seen.insert(answer["pod"].as_str().unwrap().to_owned());
            (seen.len() == 2).then_some(())
        },
    )
    .await?;
    let seen = seen.into_inner().unwrap();
    names.sort();
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), names);

    // `kubectl logs` and `exec`, through the API server to the kubelet.
    let logs = cp
        .command(cp.bin_dir()?.join("kubectl"))
        .args(["-n", &ns, "logs", &names[0]])
        .output()
        .await?;
    let text = String::from_utf8_lossy(&logs.stdout);
    assert!(
        logs.status.success() && text.contains("listening on [8080]"),
        "kubectl logs: {text} {}",
        String::from_utf8_lossy(&logs.stderr)
    );
    let exec = cp
        .command(cp.bin_dir()?.join("kubectl"))
        .args(["-n", &ns, "exec", &names[0], "--"])
        .args(["/hello", "get", "http://127.0.0.1:8080/"])
        .output()
        .await?;
    let said = String::from_utf8_lossy(&exec.stdout);
    assert!(
        exec.status.success() && said.contains(&format!("\"pod\":\"{}\"", names[0])),
        "kubectl exec: {said} {}",
        String::from_utf8_lossy(&exec.stderr)
    );
    Ok(())
}
