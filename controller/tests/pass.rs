//! Whole passes of `reconcile` against a scripted API server in process (no control
//! plane), in milliseconds: for each situation a pass can meet (a new AppService, a
//! finalizer another writer removed, a conflict, status fields others left, a provider
//! that fails, a deletion whose cleanup fails or succeeds, the shard gate, an excluded
//! namespace, a second pass before the caches show the first's writes), the exact
//! requests it sends, in order, and what it returns to the error
//! policy. The real-server suites (reconcile.rs, perturb.rs, database.rs, shards.rs)
//! show the same behaviours end to end; these pin down the request sequence.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod scripted;

use std::sync::{Arc, Mutex};

use common::AppService;
use common::conditions::{DATABASE_READY, DEGRADED, FALSE, READY};
use common::names::{FINALIZER, drain_label, shard_label};
use controller::error::{Error, ErrorReason, Retry};
use controller::external::{ConditionReport, External, Readiness, Report, Step};
use controller::reconcile::reconcile;
use controller::subject::Subject;
use controller::{Config, Hooks};
use futures::future::BoxFuture;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use scripted::{Answer, Log, Seen, client, context_of, lines};
use serde_json::{Value, json};

const APP: &str = "/apis/platform.example.com/v1beta1/namespaces/shop/appservices/web";
const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/shop/deployments";
const SERVICES: &str = "/api/v1/namespaces/shop/services";
const BUDGETS: &str = "/apis/policy/v1/namespaces/shop/poddisruptionbudgets";
const MERGE: &str = "application/merge-patch+json";
const APPLY: &str = "application/apply-patch+yaml";

/// An AppService as the API server stores it, at resourceVersion 7: one Pod, so no
/// disruption budget (its place in a pass is a test of its own).
fn app() -> AppService {
    let mut app = common::testing::app("web", "registry.example.com/web:v1")
        .replicas(1)
        .port(8080)
        .namespace("shop")
        .uid("0f3c2a1b-9d8e-4f7a-b6c5-d4e3f2a1b0c9")
        .generation(1)
        .build();
    app.metadata.resource_version = Some("7".into());
    app
}

/// The same with our finalizer (and `others` before it).
fn with_finalizer(others: &[&str]) -> AppService {
    let mut app = app();
    let mut finalizers: Vec<String> = others.iter().map(|f| (*f).to_owned()).collect();
    finalizers.push(FINALIZER.to_owned());
    app.metadata.finalizers = Some(finalizers);
    app
}

/// Being deleted, with our finalizer after `others`.
fn deleted(others: &[&str]) -> AppService {
    let mut app = with_finalizer(others);
    app.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    app
}

fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
           "reason": reason, "code": code, "message": reason})
}

/// A small API server holding one AppService, `start`: a merge patch of it (or of its
/// status) returns it as patched, an apply of its status returns it with that status
/// (plus `kept`, status fields another writer set that an apply of ours does not own),
/// creates return what was sent, Events are accepted; `first` answers a request before
/// all that when it returns something. Anything else is a 404, so a request the pass
/// should not send shows up as an error as well as in the log.
fn server(
    start: &AppService,
    kept: Value,
    first: impl Fn(&Seen) -> Option<(u16, Value)> + Send + Sync + 'static,
) -> Arc<Answer> {
    let live = Mutex::new(serde_json::to_value(start).unwrap());
    Arc::new(move |r: &Seen, n| {
        if let Some(answer) = first(r) {
            return answer;
        }
        let mut live = live.lock().unwrap();
        let version = json!((100 + n).to_string());
        match (r.method.as_str(), r.path.as_str(), r.content_type.as_str()) {
            ("PATCH", path, MERGE) if path == APP || path == format!("{APP}/status") => {
                let mut patch = r.body.clone();
                if let Some(meta) = patch.get_mut("metadata").and_then(Value::as_object_mut) {
                    meta.remove("resourceVersion");
                }
                json_patch::merge(&mut live, &patch);
                live["metadata"]["resourceVersion"] = version;
                (200, live.clone())
            }
            ("PATCH", path, APPLY) if path == format!("{APP}/status") => {
                let mut status = r.body["status"].clone();
                json_patch::merge(&mut status, &kept);
                live["status"] = status;
                live["metadata"]["resourceVersion"] = version;
                (200, live.clone())
            }
            ("POST", path, _) if path == DEPLOYMENTS || path == SERVICES || path == BUDGETS => {
                let mut created = r.body.clone();
                created["metadata"]["uid"] = json!(format!("child-{n}"));
                created["metadata"]["resourceVersion"] = version;
                (201, created)
            }
            ("POST", path, _) if path.contains("/events") => (201, r.body.clone()),
            _ => (404, status(404, "NotFound")),
        }
    })
}

/// [`server`] for `start` with nothing kept and no answer before the usual ones.
fn plain(start: &AppService) -> Arc<Answer> {
    server(start, json!({}), |_| None)
}

/// A provider whose `ensure` and `cleanup` answer as set.
#[derive(Default)]
struct Provider {
    ensure_fails: bool,
    cleanup_fails: bool,
}

impl External for Provider {
    fn ensure<'a>(
        &'a self,
        _app: &'a Subject<'a>,
    ) -> BoxFuture<'a, controller::error::Result<Report>> {
        Box::pin(async move {
            if !self.ensure_fails {
                return Ok(Report::done());
            }
            Ok(Report {
                outcome: Readiness::Failed(Error::External {
                    reason: ErrorReason::Database,
                    message: "database: the server is unreachable".into(),
                }),
                conditions: vec![ConditionReport {
                    type_: DATABASE_READY,
                    status: FALSE,
                    reason: "DatabaseServerUnreachable",
                    message: "the server is unreachable; retrying with backoff".into(),
                }],
                absent: vec![],
                pod: Default::default(),
                images: None,
            })
        })
    }

    fn cleanup<'a>(
        &'a self,
        _app: &'a Subject<'a>,
    ) -> BoxFuture<'a, controller::error::Result<Step>> {
        Box::pin(async move {
            if self.cleanup_fails {
                Err(Error::External {
                    reason: ErrorReason::Cleanup,
                    message: "database cleanup: the server is unreachable".into(),
                })
            } else {
                Ok(Step::Done)
            }
        })
    }
}

/// One pass over `app` with `config` and `provider`, against `answer`: its result and
/// the requests it sent, Events left out (they are best-effort and asynchronous).
async fn pass(
    app: &AppService,
    config: Config,
    provider: Provider,
    answer: Arc<Answer>,
) -> (
    controller::error::Result<controller::queue::Next>,
    Vec<Seen>,
) {
    let (client, seen) = client(answer);
    let hooks = Hooks {
        external: Arc::new(provider),
        ..Hooks::default()
    };
    let (ctx, _lead) = context_of(client, config, hooks);
    let result = reconcile(Arc::new(app.clone()), Arc::new(ctx)).await;
    (result, writes(&seen))
}

fn writes(seen: &Log) -> Vec<Seen> {
    seen.lock()
        .unwrap()
        .iter()
        .filter(|s| !s.path.contains("/events"))
        .cloned()
        .collect()
}

fn lines_of(seen: &[Seen]) -> Vec<String> {
    seen.iter().map(Seen::line).collect()
}

fn config() -> Config {
    Config::for_namespace("shop")
}

/// The condition `type_` of a status body sent by the pass.
fn condition<'a>(body: &'a Value, type_: &str) -> &'a Value {
    body["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
        .unwrap_or_else(|| panic!("no {type_} condition in {body}"))
}

#[tokio::test]
async fn a_new_app_gets_the_finalizer_first_then_its_children_then_one_status_write() {
    let app = app();
    let (result, seen) = pass(&app, config(), Provider::default(), plain(&app)).await;
    result.expect("the pass succeeds");
    let lines = lines_of(&seen);
    assert_eq!(lines.len(), 4, "{lines:#?}");
    assert_eq!(lines[0], format!("PATCH {APP} {MERGE}"));
    // A new Service first, alone; then the Deployment.
    assert_eq!(
        lines[1..3],
        [
            format!("POST {SERVICES} application/json"),
            format!("POST {DEPLOYMENTS} application/json"),
        ]
    );
    assert_eq!(lines[3], format!("PATCH {APP}/status {APPLY}"));
    // The finalizer patch is guarded by the version the pass read.
    assert_eq!(
        seen[0].body,
        json!({"metadata": {"resourceVersion": "7", "finalizers": [FINALIZER]}})
    );
    // The status says what is true: nothing is available yet.
    let ready = condition(&seen[3].body, READY);
    assert_eq!(ready["status"], FALSE, "{ready}");
    assert_eq!(seen[3].body["status"]["observedGeneration"], 1);
}

/// Two Pods: the budget is created beside the Deployment, after the Service, in the same
/// pass; a name someone took for it is refused and nothing created is undone.
#[tokio::test]
async fn an_app_of_two_pods_gets_its_budget_beside_its_deployment() {
    let mut app = app();
    app.spec.replicas = Some(2);
    let (result, seen) = pass(&app, config(), Provider::default(), plain(&app)).await;
    result.expect("the pass succeeds");
    let lines = lines_of(&seen);
    assert_eq!(lines.len(), 5, "{lines:#?}");
    assert_eq!(lines[1], format!("POST {SERVICES} application/json"));
    let mut children = lines[2..4].to_vec();
    children.sort();
    assert_eq!(
        children,
        [
            format!("POST {DEPLOYMENTS} application/json"),
            format!("POST {BUDGETS} application/json"),
        ]
    );
    assert_eq!(lines[4], format!("PATCH {APP}/status {APPLY}"));
    let budget = seen
        .iter()
        .find(|s| s.path == BUDGETS)
        .expect("the budget's create");
    assert_eq!(budget.body["spec"]["maxUnavailable"], 1);
    assert_eq!(
        budget.body["metadata"]["ownerReferences"][0]["uid"],
        "0f3c2a1b-9d8e-4f7a-b6c5-d4e3f2a1b0c9"
    );

    let answer = server(&app, json!({}), move |r| {
        (r.method == "POST" && r.path == BUDGETS).then(|| (409, status(409, "AlreadyExists")))
    });
    let (result, seen) = pass(&app, config(), Provider::default(), answer).await;
    let error = result.expect_err("a refused create fails the pass");
    assert_eq!(error.retry(), Retry::Conflict, "{error}");
    let mut lines = lines_of(&seen);
    lines.sort();
    assert_eq!(
        lines,
        [
            format!("PATCH {APP} {MERGE}"),
            format!("POST {SERVICES} application/json"),
            format!("POST {DEPLOYMENTS} application/json"),
            format!("POST {BUDGETS} application/json"),
        ]
        .into_iter()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect::<Vec<_>>()
    );
}

/// A name someone took after the caches last heard: the create of that child is refused
/// (409 AlreadyExists). Nothing the pass created is undone, and the order of creates
/// decides what stays: a taken Service name stops the pass before any Deployment (no Pod
/// starts), a taken Deployment name leaves only the Service. The pass fails with the
/// 409, retried soon, and writes no status (the next pass, asking the API server for
/// the name, reports the conflict).
#[tokio::test]
async fn a_create_refused_because_the_name_was_taken_is_never_undone() {
    for (taken, sent) in [
        (SERVICES, vec![format!("POST {SERVICES} application/json")]),
        (
            DEPLOYMENTS,
            vec![
                format!("POST {SERVICES} application/json"),
                format!("POST {DEPLOYMENTS} application/json"),
            ],
        ),
    ] {
        let app = with_finalizer(&[]);
        let answer = server(&app, json!({}), move |r| {
            (r.method == "POST" && r.path == taken).then(|| (409, status(409, "AlreadyExists")))
        });
        let (result, seen) = pass(&app, config(), Provider::default(), answer).await;
        let error = result.expect_err("a refused create fails the pass");
        assert_eq!(error.retry(), Retry::Conflict, "{taken}: {error}");
        assert_eq!(lines_of(&seen), sent, "{taken}");
    }
}

#[tokio::test]
async fn a_finalizer_another_writer_removed_comes_back_beside_theirs_before_anything_else() {
    let mut app = app();
    app.metadata.finalizers = Some(vec!["example.com/backup".into()]);
    let (result, seen) = pass(&app, config(), Provider::default(), plain(&app)).await;
    result.expect("the pass succeeds");
    assert_eq!(seen[0].line(), format!("PATCH {APP} {MERGE}"));
    assert_eq!(
        seen[0].body["metadata"]["finalizers"],
        json!(["example.com/backup", FINALIZER])
    );
}

#[tokio::test]
async fn a_conflict_on_the_finalizer_writes_nothing_else_and_is_retried_soon() {
    let app = app();
    let answer = server(&app, json!({}), |r| {
        (r.method == "PATCH" && r.path == APP).then(|| (409, status(409, "Conflict")))
    });
    let (result, seen) = pass(&app, config(), Provider::default(), answer).await;
    let error = result.expect_err("a conflict fails the pass");
    assert_eq!(error.retry(), Retry::Conflict, "{error}");
    assert_eq!(lines_of(&seen), [format!("PATCH {APP} {MERGE}")]);
}

/// Status fields another writer set that the pass could not see (they came after its
/// read): the apply returns them, and a second write removes them, on the version the
/// apply returned.
#[tokio::test]
async fn status_fields_another_writer_set_are_removed_in_the_same_pass_and_guarded() {
    let app = with_finalizer(&[]);
    let kept = json!({"canary": {"image": "evil:1", "replicas": 1, "readyReplicas": 1}});
    let (result, seen) = pass(
        &app,
        config(),
        Provider::default(),
        server(&app, kept, |_| None),
    )
    .await;
    result.expect("the pass succeeds");
    let lines = lines_of(&seen);
    assert_eq!(
        lines[lines.len() - 2..],
        [
            format!("PATCH {APP}/status {APPLY}"),
            format!("PATCH {APP}/status {MERGE}"),
        ],
        "{lines:#?}"
    );
    let clear = &seen[seen.len() - 1].body;
    assert_eq!(clear["status"]["canary"], Value::Null, "{clear}");
    assert_eq!(
        clear["status"]["observedGeneration"], 1,
        "ours stays: {clear}"
    );
    // Only on the object the apply returned: another write in between is a conflict.
    assert!(clear["metadata"]["resourceVersion"].is_string(), "{clear}");
}

/// The same fields already in the AppService the pass read: one status write, a merge
/// patch setting ours and removing theirs, on the version the pass read.
#[tokio::test]
async fn status_fields_another_writer_set_that_the_pass_sees_go_in_its_one_status_write() {
    let mut app = with_finalizer(&[]);
    app.status = serde_json::from_value(json!({
        "canary": {"image": "evil:1", "replicas": 1, "readyReplicas": 1},
        "endpoint": "evil.example.com:80",
    }))
    .unwrap();
    let (result, seen) = pass(&app, config(), Provider::default(), plain(&app)).await;
    result.expect("the pass succeeds");
    let lines = lines_of(&seen);
    let status_writes: Vec<_> = lines.iter().filter(|l| l.contains("/status")).collect();
    assert_eq!(
        status_writes,
        [&format!("PATCH {APP}/status {MERGE}")],
        "{lines:#?}"
    );
    let write = &seen.last().unwrap().body;
    assert_eq!(write["metadata"]["resourceVersion"], "7", "{write}");
    assert_eq!(write["status"]["canary"], Value::Null, "{write}");
    assert_ne!(
        write["status"]["endpoint"], "evil.example.com:80",
        "ours replaces theirs: {write}"
    );
    assert_eq!(write["status"]["observedGeneration"], 1, "{write}");
}

#[tokio::test]
async fn a_failing_provider_holds_the_children_reports_why_and_backs_off() {
    let app = with_finalizer(&[]);
    let provider = Provider {
        ensure_fails: true,
        ..Provider::default()
    };
    let (result, seen) = pass(&app, config(), provider, plain(&app)).await;
    let error = result.expect_err("the provider's failure is the pass's");
    assert_eq!(error.retry(), Retry::Transient, "{error}");
    assert_eq!(error.metric_label(), ErrorReason::Database);
    // No child is made before the provider is ready; the status says why.
    assert_eq!(lines_of(&seen), [format!("PATCH {APP}/status {APPLY}")]);
    let database = condition(&seen[0].body, DATABASE_READY);
    assert_eq!(database["status"], FALSE);
    assert_eq!(database["reason"], "DatabaseServerUnreachable");
    assert_eq!(condition(&seen[0].body, READY)["status"], FALSE);
}

#[tokio::test]
async fn a_failed_cleanup_keeps_the_finalizer_and_says_why() {
    let app = deleted(&[]);
    let provider = Provider {
        cleanup_fails: true,
        ..Provider::default()
    };
    let (result, seen) = pass(&app, config(), provider, plain(&app)).await;
    let error = result.expect_err("the cleanup's failure is the pass's");
    assert_eq!(error.metric_label(), ErrorReason::Cleanup);
    assert_eq!(error.retry(), Retry::Transient);
    // Only the status: the finalizer stays.
    assert_eq!(lines_of(&seen), [format!("PATCH {APP}/status {APPLY}")]);
    let degraded = condition(&seen[0].body, DEGRADED);
    assert!(
        degraded["message"]
            .as_str()
            .is_some_and(|m| m.contains("the server is unreachable")),
        "{degraded}"
    );
}

#[tokio::test]
async fn a_done_cleanup_releases_only_our_finalizer_and_writes_no_status() {
    let app = deleted(&["example.com/backup"]);
    let (result, seen) = pass(&app, config(), Provider::default(), plain(&app)).await;
    result.expect("the pass succeeds");
    assert_eq!(lines_of(&seen), [format!("PATCH {APP} {MERGE}")]);
    assert_eq!(
        seen[0].body,
        json!({"metadata": {"resourceVersion": "7", "finalizers": ["example.com/backup"]}})
    );
}

/// One member or many, the gate is what this member serves: a pass runs only for a
/// namespace whose bucket it claimed and every cache has listed, and that the rings
/// admitted (its ring's selector matches, no other live ring's does), whatever ring
/// labels the object carries (a tenant's, an older release's: none strands it).
#[tokio::test]
async fn the_shard_gate_passes_only_what_this_member_serves() {
    use controller::sharding::Served;
    use controller::sharding::buckets::{Buckets, bucket};
    let sharded = || Config {
        sharding: true,
        identity: Some("member-a".into()),
        ..config()
    };
    let ring = sharded().shard_ring;
    let label_states: [&[(String, &str)]; 4] = [
        &[],
        &[(shard_label(&ring), "member-b")],
        &[(drain_label(&ring), "true")],
        &[
            (shard_label("other-ring"), "x"),
            (drain_label("other-ring"), "true"),
        ],
    ];
    let serving = |buckets: Buckets, listed: bool, admitted: bool| {
        let served = Arc::new(Served::default());
        served.register("apps");
        served.acquire(buckets);
        if listed {
            served.synced("apps", 1);
        }
        if admitted {
            served.admit(&["shop".to_owned()].into());
        }
        served
    };
    let shop = Buckets::NONE.with(bucket("shop"));
    let other = Buckets::NONE.with((bucket("shop") + 1) % 64);
    for labels in label_states {
        for (served, goes, what) in [
            (serving(shop, true, true), true, "its bucket, listed"),
            (
                serving(shop, false, true),
                false,
                "its bucket, not listed yet",
            ),
            (serving(other, true, true), false, "another bucket"),
            (serving(Buckets::NONE, true, true), false, "no bucket"),
            (
                serving(Buckets::ALL, true, true),
                true,
                "alone: every bucket",
            ),
            (
                serving(Buckets::ALL, true, false),
                false,
                "every bucket, but the rings did not admit the namespace",
            ),
        ] {
            let mut app = with_finalizer(&[]);
            app.metadata.labels = Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.clone(), (*v).to_owned()))
                    .collect(),
            );
            let (client, seen) = client(plain(&app));
            let (ctx, _lead) = context_of(client, sharded(), Hooks::default());
            let ctx = Arc::new(ctx.with_share(Some(served as Arc<dyn controller::share::Share>)));
            reconcile(Arc::new(app), ctx)
                .await
                .expect("the pass succeeds");
            let seen = writes(&seen);
            assert_eq!(
                !seen.is_empty(),
                goes,
                "{what}, labels {labels:?}: {:#?}",
                lines_of(&seen)
            );
            // Ours: the status apply is guarded by the version the pass read, so a
            // status prepared from an older read never lands over a newer object.
            if let Some(status) = seen.iter().find(|s| s.path.ends_with("/status")) {
                assert_eq!(status.body["metadata"]["resourceVersion"], "7");
            }
        }
    }
}

#[tokio::test]
async fn an_excluded_namespace_gets_no_request_at_all() {
    let app = with_finalizer(&[]);
    let config = Config {
        exclude_namespaces: vec!["shop".into()],
        ..config()
    };
    let answer = plain(&app);
    let (client, seen) = client(answer);
    let (ctx, _lead) = context_of(client, config, Hooks::default());
    let ctx = Arc::new(ctx);
    reconcile(Arc::new(app), ctx.clone())
        .await
        .expect("the pass succeeds");
    assert!(lines(&seen).is_empty(), "{:#?}", lines(&seen));
    assert_eq!(ctx.metrics().excluded_count(), 1);
}

/// The caches lag the pass's own writes: a second pass over the very object the first
/// read (the same resourceVersion, the children not in the caches yet) decides on what
/// the first wrote (`controller/core/src/own_writes.rs`). It asks only for the children
/// it created, and writes nothing: no second create (a 409), no second status.
#[tokio::test]
async fn a_second_pass_before_the_caches_catch_up_writes_nothing() {
    let app = with_finalizer(&[]);
    // The server keeps the children it created and answers a GET of them.
    let created: Arc<Mutex<Vec<(String, Value)>>> = Arc::default();
    let store = created.clone();
    let answer = server(&app, json!({}), move |r| {
        let mut created = store.lock().unwrap();
        match r.method.as_str() {
            "POST" if r.path == DEPLOYMENTS || r.path == SERVICES => {
                let name = r.body["metadata"]["name"].as_str().unwrap_or_default();
                let mut body = r.body.clone();
                body["metadata"]["uid"] = json!(format!("child-{}", created.len()));
                body["metadata"]["resourceVersion"] = json!(format!("{}", 50 + created.len()));
                created.push((format!("{}/{name}", r.path), body.clone()));
                Some((201, body))
            }
            "GET" => created
                .iter()
                .find(|(path, _)| *path == r.path)
                .map(|(_, body)| (200, body.clone())),
            _ => None,
        }
    });
    let (client, seen) = client(answer);
    let hooks = Hooks {
        external: Arc::new(Provider::default()),
        ..Hooks::default()
    };
    let (ctx, _lead) = context_of(client, config(), hooks);
    let ctx = Arc::new(ctx);
    reconcile(Arc::new(app.clone()), ctx.clone())
        .await
        .expect("the first pass succeeds");
    let first = writes(&seen).len();
    assert_eq!(first, 3, "{:#?}", lines_of(&writes(&seen)));
    assert_eq!(created.lock().unwrap().len(), 2, "both children created");

    reconcile(Arc::new(app), ctx)
        .await
        .expect("the second pass succeeds");
    let mut asked = lines_of(&writes(&seen)[first..]);
    asked.sort();
    assert_eq!(
        asked,
        [
            format!("GET {SERVICES}/web "),
            format!("GET {DEPLOYMENTS}/web "),
        ],
        "only the children it created are asked for, and nothing is written"
    );
}
