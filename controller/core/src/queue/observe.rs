//! The queue observed around kube-runtime's `Controller`: its trigger streams, the
//! mapper of `watches_stream`, the reconcile function and the error policy, each wrapped
//! so that [`Queue`] sees what the scheduler does.

use std::sync::Arc;
use std::time::Instant;

use common::AppService;
use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};

use super::{Next, Queue};
use crate::context::Context;
use crate::error::Error;

/// Counts the AppServices of a watch stream as triggers.
pub fn observe_apps<S, E>(stream: S, queue: Arc<Queue>) -> impl Stream<Item = Result<AppService, E>>
where
    S: Stream<Item = Result<AppService, E>>,
{
    stream.inspect(move |item| {
        if let Ok(app) = item {
            queue.triggered(&ObjectRef::from_obj(app), Instant::now());
        }
    })
}

/// Counts every AppService in `store` as triggered each time `stream` yields (what
/// `reconcile_all_on` does with the same store).
pub fn observe_reconcile_all<S>(
    stream: S,
    store: Store<AppService>,
    queue: Arc<Queue>,
) -> impl Stream<Item = ()>
where
    S: Stream<Item = ()>,
{
    stream.inspect(move |()| {
        let now = Instant::now();
        for app in store.state() {
            queue.triggered(&ObjectRef::from_obj(&*app), now);
        }
    })
}

/// Wraps a mapper of `watches_stream`: the AppService it names is triggered.
pub fn observe_mapper<T>(
    queue: Arc<Queue>,
    mapper: impl Fn(T) -> Option<ObjectRef<AppService>>,
) -> impl Fn(T) -> Option<ObjectRef<AppService>> {
    move |obj| {
        let key = mapper(obj);
        if let Some(key) = &key {
            queue.triggered(key, Instant::now());
        }
        key
    }
}

/// [`observe_mapper`] for a mapper that wakes any number of AppServices.
pub fn observe_mapper_all<T>(
    queue: Arc<Queue>,
    mapper: impl Fn(T) -> Vec<ObjectRef<AppService>>,
) -> impl Fn(T) -> Vec<ObjectRef<AppService>> {
    move |obj| {
        let keys = mapper(obj);
        let now = Instant::now();
        for key in &keys {
            queue.triggered(key, now);
        }
        keys
    }
}

/// Wraps the reconcile function: the object leaves the queue when it starts, and its
/// duration and result are recorded when it ends.
pub fn observe_reconcile<F, Fut>(
    reconcile: F,
) -> impl FnMut(Arc<AppService>, Arc<Context>) -> BoxFuture<'static, Result<Action, Error>>
where
    F: Fn(Arc<AppService>, Arc<Context>) -> Fut,
    Fut: Future<Output = Result<Next, Error>> + Send + 'static,
{
    move |app, ctx| {
        let queue = ctx.metrics().queue().clone();
        let resync = ctx.config().resync_interval;
        let running = queue.start(ObjectRef::from_obj(&*app), Instant::now(), ctx.is_leader());
        let reconciling = reconcile(app, ctx);
        async move {
            let result = reconciling.await;
            running.finish(&result, Instant::now(), resync);
            result.map(Next::action)
        }
        .boxed()
    }
}

/// Wraps the error policy: a requeue after an error is a retry.
pub fn observe_error_policy<P>(
    policy: P,
) -> impl Fn(Arc<AppService>, &Error, Arc<Context>) -> Action
where
    P: Fn(Arc<AppService>, &Error, Arc<Context>) -> Next,
{
    move |app, error, ctx| {
        let key = ObjectRef::from_obj(&*app);
        let next = policy(app, error, ctx.clone());
        if ctx.is_leader() {
            ctx.metrics().queue().retried(&key, next, Instant::now());
        }
        next.action()
    }
}
