//! A scripted API server in process: it records every request a client sends and answers
//! as the test's script says, so a test can run the controller's code with no control
//! plane and assert the exact requests, in milliseconds. What only a real API server
//! shows (admission, the garbage collector, watches) stays with the real-server suites.

#![allow(dead_code)]

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};

use controller::context::{CacheSync, Caches};
use controller::{Config, Context, Hooks};
use futures::future::BoxFuture;
use http::{Request, Response};
use kube::Client;
use kube::client::Body;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector;
use serde_json::Value;
use tower::Service;

/// One request as the scripted server saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: String,
    pub body: Value,
}

impl Seen {
    /// `METHOD path content-type`, the shape the assertions compare.
    pub fn line(&self) -> String {
        format!("{} {} {}", self.method, self.path, self.content_type)
    }
}

/// The script: the status and body answering a request, given how many came before it.
pub type Answer = dyn Fn(&Seen, usize) -> (u16, Value) + Send + Sync;

/// Every request the server has seen, in order.
pub type Log = Arc<Mutex<Vec<Seen>>>;

/// An API server that records every request and answers as `answer` says.
#[derive(Clone)]
pub struct Scripted {
    seen: Log,
    answer: Arc<Answer>,
}

impl Service<Request<Body>> for Scripted {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _: &mut TaskContext<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let (seen, answer) = (self.seen.clone(), self.answer.clone());
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let bytes = body.collect_bytes().await.unwrap_or_default();
            let request = Seen {
                method: parts.method.to_string(),
                path: parts.uri.path().to_owned(),
                query: parts.uri.query().unwrap_or_default().to_owned(),
                content_type: parts
                    .headers
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned(),
                body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            };
            let before = {
                let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                seen.push(request.clone());
                seen.len() - 1
            };
            let (status, reply) = answer(&request, before);
            let body = serde_json::to_vec(&reply).unwrap_or_default();
            let response = Response::builder()
                .status(status)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Body::from(body))
                .unwrap_or_else(|_| Response::new(Body::empty()));
            Ok(response)
        })
    }
}

/// A client of the namespace `shop` talking to `answer`, and the log of its requests.
pub fn client(answer: Arc<Answer>) -> (Client, Log) {
    let seen = Log::default();
    let client = Client::new(
        Scripted {
            seen: seen.clone(),
            answer,
        },
        "shop",
    );
    (client, seen)
}

/// A leading controller's context over `client`, with `config` and `hooks`, its caches
/// empty and listed; it leads while the returned sender lives (a pass stops with
/// `NotLeader` once leadership can no longer change).
pub fn context_of(
    client: Client,
    config: Config,
    hooks: Hooks,
) -> (Context, tokio::sync::watch::Sender<bool>) {
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "test".into(),
            instance: None,
        },
    );
    let synced = Arc::new(CacheSync::default());
    for listed in [
        &synced.appservices,
        &synced.deployments,
        &synced.services,
        &synced.budgets,
        &synced.autoscalers,
        &synced.other_deployments,
        &synced.other_services,
        &synced.other_budgets,
        &synced.other_autoscalers,
        &synced.routes,
        &synced.other_routes,
        &synced.grants,
        &synced.other_grants,
        &synced.gateway,
        &synced.certificates,
        &synced.other_certificates,
        &synced.ingresses,
        &synced.other_ingresses,
    ] {
        listed.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    let caches = Caches {
        deployments: reflector::store().0,
        services: reflector::store().0,
        budgets: reflector::store().0,
        autoscalers: reflector::store().0,
        other_deployments: reflector::store().0,
        other_services: reflector::store().0,
        other_budgets: reflector::store().0,
        other_autoscalers: reflector::store().0,
        routes: reflector::store().0,
        other_routes: reflector::store().0,
        grants: reflector::store().0,
        other_grants: reflector::store().0,
        gateway: reflector::store().0,
        certificates: reflector::store().0,
        other_certificates: reflector::store().0,
        ingresses: reflector::store().0,
        other_ingresses: reflector::store().0,
        appservices: reflector::store().0,
        synced,
    };
    let (lead, leading) = tokio::sync::watch::channel(true);
    let ctx = Context::new(client, config, recorder, hooks, caches, leading);
    (ctx, lead)
}

/// A context in the namespace `shop` whose client talks to `answer`: the defaults,
/// caches empty and listed.
pub fn context(answer: Arc<Answer>) -> (Context, Log) {
    let (client, seen) = client(answer);
    let (ctx, _lead) = context_of(client, Config::for_namespace("shop"), Hooks::default());
    (ctx, seen)
}

/// The request lines seen so far.
pub fn lines(seen: &Log) -> Vec<String> {
    seen.lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(Seen::line)
        .collect()
}
