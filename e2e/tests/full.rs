//! Full mode: kube-controller-manager, kube-scheduler and kwok's simulated node make a
//! Deployment's Pods ready, the garbage collector follows ownerReferences, the namespace
//! controller finalizes deleted namespaces, the resource quota controller counts usage;
//! and every test namespace enforces Pod Security `restricted` unless the test opts out.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use harness::{PodSecurityLevel, eventually};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, ResourceQuota, ServiceAccount};
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
                // What Pod Security `restricted`, the test namespace's level, requires.
                "spec": {
                    "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{"name": "web", "image": "registry.example.com/web:v1",
                        "securityContext": {"allowPrivilegeEscalation": false,
                                            "capabilities": {"drop": ["ALL"]}}}]
                },
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

/// A Pod of `image` with the given security contexts.
fn pod(name: &str, pod_context: serde_json::Value, container_context: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "securityContext": pod_context,
            "containers": [{"name": "app", "image": "registry.example.com/app:v1",
                            "securityContext": container_context}]
        }
    }))
    .unwrap()
}

/// Creates `pod`, as a dry run, and returns the API server's refusal if there is one.
async fn refusal(pods: &Api<Pod>, pod: &Pod) -> Option<String> {
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    match pods.create(&params, pod).await {
        Ok(_) => None,
        Err(kube::Error::Api(status)) => Some(format!("{} {}", status.code, status.message)),
        Err(e) => panic!("creating {}: {e}", pod.name_any()),
    }
}

#[tokio::test]
async fn test_namespaces_enforce_restricted_unless_a_test_opts_out() -> TestResult {
    let cp = harness::shared_full().await?;
    let plain = || pod("plain", json!({}), json!({}));
    let privileged = || pod("privileged", json!({}), json!({"privileged": true}));
    let restricted = || {
        pod(
            "restricted",
            json!({"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}}),
            json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}),
        )
    };
    let default = cp.namespace().await?;
    let baseline = cp
        .namespace_with("baseline", PodSecurityLevel::Baseline)
        .await?;
    let open = cp
        .namespace_with("privileged", PodSecurityLevel::Privileged)
        .await?;
    assert_eq!(default.pod_security(), PodSecurityLevel::Restricted);
    for ns in [&default, &baseline, &open] {
        // The ServiceAccount admission plugin refuses Pods until the default one exists.
        let sas: Api<ServiceAccount> = Api::namespaced(cp.client(), ns);
        eventually(
            "the default ServiceAccount",
            Duration::from_secs(60),
            || async { sas.get_opt("default").await.ok().flatten() },
        )
        .await
        .unwrap();
        let labels = Api::<Namespace>::all(cp.client())
            .get(ns)
            .await?
            .metadata
            .labels
            .unwrap_or_default();
        assert_eq!(
            labels
                .get(harness::POD_SECURITY_ENFORCE_LABEL)
                .map(String::as_str),
            Some(ns.pod_security().as_str())
        );
    }

    let pods: Api<Pod> = Api::namespaced(cp.client(), &default);
    assert_eq!(refusal(&pods, &restricted()).await, None);
    let refused = refusal(&pods, &plain()).await.expect("a plain Pod refused");
    assert!(
        refused.starts_with("403 ")
            && refused.contains("violates PodSecurity \"restricted:latest\""),
        "{refused}"
    );

    let pods: Api<Pod> = Api::namespaced(cp.client(), &baseline);
    assert_eq!(refusal(&pods, &plain()).await, None);
    let refused = refusal(&pods, &privileged())
        .await
        .expect("a privileged Pod refused");
    assert!(
        refused.contains("violates PodSecurity \"baseline:latest\": privileged"),
        "{refused}"
    );

    let pods: Api<Pod> = Api::namespaced(cp.client(), &open);
    assert_eq!(refusal(&pods, &privileged()).await, None);

    // Relabelled as an admin would: the level changes for Pods created from then on.
    let mut default = default;
    default.enforce(PodSecurityLevel::Baseline).await?;
    let pods: Api<Pod> = Api::namespaced(cp.client(), &default);
    assert_eq!(refusal(&pods, &plain()).await, None);
    Ok(())
}

#[tokio::test]
async fn the_resource_quota_controller_counts_usage() -> TestResult {
    let cp = harness::shared_full().await?;
    let ns = cp.namespace().await?;
    let quotas: Api<ResourceQuota> = Api::namespaced(cp.client(), &ns);
    quotas
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "counted"},
                "spec": {"hard": {"pods": "5", "configmaps": "10"}}
            }))?,
        )
        .await?;
    // Quota admission refuses what a quota limits until its controller has filled in
    // `status`: without the controller no Pod would ever be created in this namespace.
    let used = eventually("the quota's usage", Duration::from_secs(60), || async {
        let q = quotas.get("counted").await.ok()?;
        let status = q.status?;
        (status.hard?.len() == 2).then_some(status.used?)
    })
    .await
    .unwrap();
    assert_eq!(used["pods"].0, "0");
    Ok(())
}
