//! The request sequence of one converge of a child, against a scripted API server in
//! process (no control plane): which requests `children::converge` sends for each state
//! of the live child, in which order, with which content type and field manager. The
//! real-apiserver tests (reconcile.rs, perturb.rs, canary.rs) show that the objects come
//! out right; these show that they come out right with the fewest requests, including the
//! one retry after a rejected apply.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod scripted;

use controller::subject::Subject;
use std::sync::Arc;

use common::AppService;
use common::names::ANNOTATION_DESIRED_HASH;
use controller::children::converge;
use controller::desired::desired_deployment;
use controller::view::DeploymentView;
use k8s_openapi::api::apps::v1::Deployment;
use kube::runtime::reflector::ObjectRef;
use scripted::{Seen, context};
use serde_json::{Value, json};

fn app() -> AppService {
    common::testing::app("web", "registry.example.com/web:v1")
        .replicas(2)
        .stored()
        .build()
}

/// The Deployment as the server stores it after a write of `body`: a new
/// resourceVersion, what was sent kept.
fn stored(body: &Value, version: usize) -> Value {
    let mut obj = body.clone();
    obj["metadata"]["resourceVersion"] = json!(version.to_string());
    obj["metadata"]["uid"] = json!("d-uid");
    obj
}

/// What the cache would hold of a Deployment `body`.
fn view(body: &Value) -> DeploymentView {
    serde_json::from_value(stored(body, 1)).unwrap()
}

/// The desired Deployment of `app()` with its desired-hash annotation, as converge would
/// send it.
fn desired() -> Deployment {
    desired_deployment(
        &Subject::of(&app()).expect("the AppService has its identity"),
        &controller::external::PodAdditions::default(),
    )
}

/// The desired Deployment with our hash, as the live child after an earlier apply.
async fn applied_once() -> Value {
    let (ctx, seen) = context(Arc::new(|r: &Seen, _| (201, stored(&r.body, 1))));
    converge(&ctx, &owner(), "Deployment", desired(), None)
        .await
        .unwrap();
    seen.lock().unwrap()[0].body.clone()
}

/// The live child as an earlier spec left it: our child, with another desired hash.
async fn from_an_older_spec() -> Value {
    let mut old = applied_once().await;
    old["metadata"]["annotations"][ANNOTATION_DESIRED_HASH] = json!("0".repeat(32));
    old
}

fn owner() -> ObjectRef<AppService> {
    ObjectRef::from_obj(&app())
}

const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/shop/deployments";

#[tokio::test]
async fn a_missing_child_is_created_once_never_applied() {
    let (ctx, seen) = context(Arc::new(|r: &Seen, _| (201, stored(&r.body, 1))));
    let out = converge(&ctx, &owner(), "Deployment", desired(), None)
        .await
        .unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen.iter().map(Seen::line).collect::<Vec<_>>(),
        [format!("POST {DEPLOYMENTS} application/json")]
    );
    assert!(
        seen[0].query.contains("fieldManager=appservice-controller"),
        "{}",
        seen[0].query
    );
    let hash = &seen[0].body["metadata"]["annotations"][ANNOTATION_DESIRED_HASH];
    assert!(hash.as_str().is_some_and(|h| h.len() == 32), "{hash}");
    assert_eq!(out.metadata.resource_version.as_deref(), Some("1"));
}

#[tokio::test]
async fn a_child_as_we_left_it_costs_no_request() {
    let live = view(&applied_once().await);
    let (ctx, seen) = context(Arc::new(|_: &Seen, _| (500, json!({}))));
    converge(&ctx, &owner(), "Deployment", desired(), Some(live))
        .await
        .unwrap();
    assert!(seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_child_edited_by_another_writer_gets_one_guarded_json_patch() {
    let mut edited = applied_once().await;
    edited["spec"]["replicas"] = json!(7);
    edited["spec"]["template"]["spec"]["containers"][0]["image"] = json!("evil:1");
    // The server answers with the object as the patch leaves it: ours again.
    let fixed = stored(&applied_once().await, 3);
    let (ctx, seen) = context(Arc::new(move |_: &Seen, _| (200, fixed.clone())));
    converge(&ctx, &owner(), "Deployment", desired(), Some(view(&edited)))
        .await
        .unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen.iter().map(Seen::line).collect::<Vec<_>>(),
        [format!(
            "PATCH {DEPLOYMENTS}/web application/json-patch+json"
        )]
    );
    let ops = seen[0].body.as_array().unwrap();
    let paths: Vec<(&str, &str)> = ops
        .iter()
        .map(|o| (o["op"].as_str().unwrap(), o["path"].as_str().unwrap()))
        .filter(|(op, _)| *op != "test")
        .collect();
    assert_eq!(
        paths,
        [
            ("add", "/spec/replicas"),
            ("add", "/spec/template/spec/containers/0/image")
        ]
    );
    // Guarded: the patch only applies to the object it was computed from.
    assert!(ops.iter().any(|o| o["op"] == "test"), "{ops:?}");
    assert!(seen[0].query.contains("fieldManager=appservice-controller"));
}

#[tokio::test]
async fn a_new_spec_is_one_forced_server_side_apply() {
    // The live child carries another hash: the AppService changed.
    let mut old = from_an_older_spec().await;
    old["spec"]["template"]["spec"]["containers"][0]["image"] =
        json!("registry.example.com/web:v0");
    let (ctx, seen) = context(Arc::new(|r: &Seen, _| (200, stored(&r.body, 4))));
    let out = converge(&ctx, &owner(), "Deployment", desired(), Some(view(&old)))
        .await
        .unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen.iter().map(Seen::line).collect::<Vec<_>>(),
        [format!(
            "PATCH {DEPLOYMENTS}/web application/apply-patch+yaml"
        )]
    );
    assert!(seen[0].query.contains("force=true"), "{}", seen[0].query);
    assert!(seen[0].query.contains("fieldManager=appservice-controller"));
    assert_eq!(out.metadata.resource_version.as_deref(), Some("4"));
}

#[tokio::test]
async fn an_apply_rejected_for_another_writers_fields_is_repaired_and_retried_once() {
    let mut old = from_an_older_spec().await;
    old["spec"]["replicas"] = json!(9);
    let fixed = stored(&applied_once().await, 5);
    let (ctx, seen) = context(Arc::new(move |r: &Seen, n| match n {
        // The first apply: 422, as for a re-keyed port another writer left behind.
        0 => (
            422,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                   "reason": "Invalid", "code": 422,
                   "message": "Deployment.apps \"web\" is invalid: spec.template.spec.containers[0].ports: Duplicate value"}),
        ),
        1 => (200, fixed.clone()),
        _ => (200, stored(&r.body, 6)),
    }));
    let out = converge(&ctx, &owner(), "Deployment", desired(), Some(view(&old)))
        .await
        .unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen.iter().map(Seen::line).collect::<Vec<_>>(),
        [
            format!("PATCH {DEPLOYMENTS}/web application/apply-patch+yaml"),
            format!("PATCH {DEPLOYMENTS}/web application/json-patch+json"),
            format!("PATCH {DEPLOYMENTS}/web application/apply-patch+yaml"),
        ]
    );
    assert_eq!(out.metadata.resource_version.as_deref(), Some("6"));
}

#[tokio::test]
async fn an_apply_rejected_with_nothing_to_repair_is_an_error_after_one_request() {
    let old = from_an_older_spec().await;
    let (ctx, seen) = context(Arc::new(|_: &Seen, _| {
        (
            422,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                   "reason": "Invalid", "code": 422, "message": "spec: Invalid value"}),
        )
    }));
    let err = converge(&ctx, &owner(), "Deployment", desired(), Some(view(&old)))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("Invalid value"), "{err}");
    assert_eq!(seen.lock().unwrap().len(), 1);
}
