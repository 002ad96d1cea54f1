//! Full mode: kube-controller-manager, kube-scheduler and kwok's simulated node make a
//! Deployment's Pods ready, the garbage collector follows ownerReferences, and the
//! namespace controller finalizes deleted namespaces.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use harness::eventually;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[tokio::test]
async fn a_deployment_gets_two_ready_pods_on_the_simulated_node() -> TestResult {
    let cp = harness::shared_full().await?;
    let ns = cp.namespace().await?;
    let deployments: Api<Deployment> = Api::namespaced(cp.client(), &ns);
    let deployment: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "registry.example.com/web:v1"}]},
            },
        },
    }))?;
    let started = Instant::now();
    deployments
        .create(&PostParams::default(), &deployment)
        .await?;
    let ready = eventually("2 ready replicas", Duration::from_secs(60), || async {
        let d = deployments.get("web").await.ok()?;
        let status = d.status?;
        (status.ready_replicas == Some(2)).then_some(status)
    })
    .await
    .unwrap();
    eprintln!("deployment ready in {:?}", started.elapsed());
    assert_eq!(ready.available_replicas, Some(2));

    let pods: Api<Pod> = Api::namespaced(cp.client(), &ns);
    let pods = pods.list(&ListParams::default().labels("app=web")).await?;
    assert_eq!(pods.items.len(), 2);
    for pod in &pods.items {
        let spec = pod.spec.as_ref().expect("pod spec");
        assert_eq!(spec.node_name.as_deref(), Some(harness::NODE_NAME));
        let status = pod.status.as_ref().expect("pod status");
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert!(status.pod_ip.is_some(), "kwok assigns a pod IP");
    }
    Ok(())
}

#[tokio::test]
async fn the_garbage_collector_deletes_dependents_of_a_deleted_owner() -> TestResult {
    let cp = harness::shared_full().await?;
    let ns = cp.namespace().await?;
    let maps: Api<ConfigMap> = Api::namespaced(cp.client(), &ns);
    let owner = maps
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "owner"}}))?,
        )
        .await?;
    let owner_ref = owner.controller_owner_ref(&()).expect("owner reference");
    let mut dependent: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "dependent"}}))?;
    dependent.owner_references_mut().push(owner_ref);
    maps.create(&PostParams::default(), &dependent).await?;

    maps.delete("owner", &DeleteParams::background()).await?;
    eventually(
        "the dependent to be collected",
        Duration::from_secs(60),
        || async { matches!(maps.get_opt("dependent").await, Ok(None)).then_some(()) },
    )
    .await
    .unwrap();
    Ok(())
}

#[tokio::test]
async fn deleted_namespaces_are_finalized() -> TestResult {
    let cp = harness::shared_full().await?;
    let ns = cp.namespace_with_prefix("gone").await?;
    let name = ns.name().to_owned();
    let maps: Api<ConfigMap> = Api::namespaced(cp.client(), &name);
    maps.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "content"}}))?,
    )
    .await?;
    ns.cleanup().await?;
    let namespaces: Api<Namespace> = Api::all(cp.client());
    eventually(
        "the namespace to disappear",
        Duration::from_secs(60),
        || async { matches!(namespaces.get_opt(&name).await, Ok(None)).then_some(()) },
    )
    .await
    .unwrap();
    Ok(())
}
