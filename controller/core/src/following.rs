//! Watches that follow a replica's share ([`crate::share`]): one watch per scope, replaced
//! by a fresh list when the scope changes, so a reflector's store holds exactly what the
//! new scope selects. The API server selects (`Select::Server`, a `shardSelector` on each
//! list and watch) or the watch keeps the namespaces the scope names.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::{Stream, StreamExt};
use http::{Method, Request};
use kube::client::Body;
use kube::runtime::watcher;

use crate::share::{Scope, Select, Share};

/// One scope's watch.
pub(crate) type Current<K> =
    futures::stream::BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>;

/// The scope of nothing: an empty list, then nothing.
fn nothing<K: Send + 'static>() -> Current<K> {
    futures::stream::iter([Ok(watcher::Event::Init), Ok(watcher::Event::InitDone)])
        .chain(futures::stream::pending())
        .boxed()
}

/// A scope's watch: `make(client)` with the client the scope needs, keeping what it
/// selects.
pub(crate) fn per_scope<K, S, F>(
    client: kube::Client,
    make: F,
) -> impl Fn(Scope) -> Current<K> + Send + 'static
where
    K: kube::Resource + Send + 'static,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    F: Fn(kube::Client) -> S + Send + 'static,
{
    move |scope: Scope| -> Current<K> {
        match scope.select {
            Select::Nothing => nothing(),
            Select::Everything => make(client.clone()).boxed(),
            Select::Server(selector) => make(selecting(client.clone(), &selector)).boxed(),
            // Every event is still received and decoded; the caches and the triggers get
            // only the scope's objects.
            Select::Namespaces(keep) => make(client.clone())
                .filter(move |event| {
                    let kept = match event {
                        Ok(
                            watcher::Event::Apply(o)
                            | watcher::Event::InitApply(o)
                            | watcher::Event::Delete(o),
                        ) => keep(o.meta().namespace.as_deref().unwrap_or("")),
                        _ => true,
                    };
                    std::future::ready(kept)
                })
                .boxed(),
        }
    }
}

/// `client` with `shardSelector` added to every list and watch: the API server sends
/// only the objects it selects.
pub fn selecting(client: kube::Client, selector: &str) -> kube::Client {
    let namespace = client.default_namespace().to_owned();
    let encoded: String = form_urlencoded::byte_serialize(selector.as_bytes()).collect();
    let service = tower::service_fn(move |mut req: Request<Body>| {
        let client = client.clone();
        if req.method() == Method::GET
            && let Some(uri) = with_selector(req.uri(), &encoded)
        {
            *req.uri_mut() = uri;
        }
        async move { client.send(req).await }
    });
    kube::Client::new(service, namespace)
}

fn with_selector(uri: &http::Uri, encoded: &str) -> Option<http::Uri> {
    let joined = match uri.query() {
        Some(q) => format!("{}?{q}&shardSelector={encoded}", uri.path()),
        None => format!("{}?shardSelector={encoded}", uri.path()),
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = joined.parse().ok();
    http::Uri::from_parts(parts).ok()
}

/// A watch that follows `share`'s scope: `start` is started for each scope and replaced
/// when it changes. `listed` receives each scope's generation just before its `InitDone`
/// goes out.
pub(crate) fn following<K, F>(
    share: Arc<dyn Share>,
    start: F,
    listed: Arc<AtomicU64>,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send
where
    K: Send + 'static,
    F: Fn(Scope) -> Current<K> + Send + 'static,
{
    let rx = share.scope();
    // The state holds the share, so the sender of `rx` outlives the stream.
    let state = (rx, None::<(u64, Current<K>)>, start, (listed, share));
    futures::stream::unfold(
        state,
        |(mut rx, mut current, start, (listed, share))| async move {
            loop {
                let (number, stream) = match current.as_mut() {
                    Some((n, s)) => (*n, s),
                    None => {
                        let scope = rx.borrow_and_update().clone();
                        let stream = current.insert((scope.generation, start(scope)));
                        (stream.0, &mut stream.1)
                    }
                };
                tokio::select! {
                    item = stream.next() => {
                        let item = item?;
                        if let Ok(watcher::Event::InitDone) = item {
                            listed.store(number, Ordering::Release);
                        }
                        return Some((item, (rx, current, start, (listed, share))));
                    }
                    changed = rx.changed() => {
                        if changed.is_ok() {
                            current = None;
                        }
                    }
                }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_selector_joins_the_query() {
        let uri: http::Uri = "/apis/apps/v1/deployments?watch=true&labelSelector=a%3Db"
            .parse()
            .unwrap();
        let got = with_selector(&uri, "x%27").unwrap();
        assert_eq!(
            got.to_string(),
            "/apis/apps/v1/deployments?watch=true&labelSelector=a%3Db&shardSelector=x%27"
        );
        let bare: http::Uri = "/api/v1/secrets".parse().unwrap();
        assert_eq!(
            with_selector(&bare, "y").unwrap().to_string(),
            "/api/v1/secrets?shardSelector=y"
        );
    }
}
