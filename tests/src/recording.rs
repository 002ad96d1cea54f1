//! A client that records the writes sent through it: `METHOD path` of every request but
//! GET (so creates, applies, merge and JSON patches, deletes), in the order sent, for
//! tests that assert which requests a controller made rather than how many.

use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http::{Method, Request, Response};
use kube::Client;
use kube::client::Body;

/// Writes kept at most; later ones are counted in [`Requests::dropped`] only, so a
/// long test cannot grow this without bound.
pub const MAX_RECORDED: usize = 100_000;

/// The writes a [`recording`] client sent.
#[derive(Clone, Debug, Default)]
pub struct Requests {
    inner: Arc<Mutex<Recorded>>,
}

#[derive(Debug, Default)]
struct Recorded {
    writes: Vec<String>,
    dropped: u64,
}

impl Requests {
    /// Every write so far as `METHOD path` (no query), in the order sent.
    pub fn writes(&self) -> Vec<String> {
        self.lock().writes.clone()
    }

    /// The writes whose path contains `/<resource>/` or ends in `/<resource>` (a
    /// resource's plural, e.g. `deployments`; `appservices/x/status` counts as
    /// `status`, not as `appservices`, when asked for `status`).
    pub fn writes_to(&self, resource: &str) -> Vec<String> {
        let inner = format!("/{resource}/");
        let last = format!("/{resource}");
        self.writes()
            .into_iter()
            .filter(|w| w.contains(&inner) || w.ends_with(&last))
            .collect()
    }

    /// Writes not kept because [`MAX_RECORDED`] were.
    pub fn dropped(&self) -> u64 {
        self.lock().dropped
    }

    fn record(&self, line: String) {
        let mut inner = self.lock();
        if inner.writes.len() < MAX_RECORDED {
            inner.writes.push(line);
        } else {
            inner.dropped += 1;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Recorded> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The service behind a recording client: records, then sends through `client`.
#[derive(Clone)]
struct Recorder {
    client: Client,
    requests: Requests,
}

impl tower::Service<Request<Body>> for Recorder {
    type Response = Response<Body>;
    type Error = kube::Error;
    type Future = BoxFuture<'static, Result<Response<Body>, kube::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), kube::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        if request.method() != Method::GET {
            self.requests
                .record(format!("{} {}", request.method(), request.uri().path()));
        }
        let client = self.client.clone();
        Box::pin(async move { client.send(request).await })
    }
}

/// A client that sends through `client` and records its writes, for `default_namespace`.
pub fn recording(client: Client, default_namespace: &str) -> (Client, Requests) {
    let requests = Requests::default();
    let recorder = Recorder {
        client,
        requests: requests.clone(),
    };
    (Client::new(recorder, default_namespace), requests)
}

/// Which requests a [`holding`] client holds back.
pub type HoldIf = fn(&Request<Body>) -> bool;

/// The requests a [`holding`] client held, and the switch that lets them go.
#[derive(Clone, Debug)]
pub struct Hold {
    released: Arc<tokio::sync::watch::Sender<bool>>,
    held: Arc<Mutex<Vec<String>>>,
}

impl Hold {
    /// Lets every held request (and every later one) go.
    pub fn release(&self) {
        self.released.send_replace(true);
    }

    /// Holds the matching requests again from now on (a hold starts armed).
    pub fn arm(&self) {
        self.released.send_replace(false);
    }

    /// `METHOD path?query` of each request held so far (released ones included), at
    /// most [`MAX_RECORDED`].
    pub fn held(&self) -> Vec<String> {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

#[derive(Clone)]
struct Holder {
    client: Client,
    hold_if: HoldIf,
    hold: Hold,
}

impl tower::Service<Request<Body>> for Holder {
    type Response = Response<Body>;
    type Error = kube::Error;
    type Future = BoxFuture<'static, Result<Response<Body>, kube::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), kube::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let client = self.client.clone();
        let mut released = (!*self.hold.released.borrow() && (self.hold_if)(&request)).then(|| {
            let mut held = self
                .hold
                .held
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if held.len() < MAX_RECORDED {
                held.push(format!("{} {}", request.method(), request.uri()));
            }
            self.hold.released.subscribe()
        });
        Box::pin(async move {
            if let Some(released) = released.as_mut() {
                // The sender lives in the `Hold`; dropped, nothing can release: send.
                let _ = released.wait_for(|r| *r).await;
            }
            client.send(request).await
        })
    }
}

/// A client that sends through `client`, except that requests for which `hold_if` is
/// true wait until [`Hold::release`]: to make the world slow in one exact place (a
/// watch that does not deliver yet, a write that arrives late) without timing.
pub fn holding(client: Client, default_namespace: &str, hold_if: HoldIf) -> (Client, Hold) {
    let (released, _) = tokio::sync::watch::channel(false);
    let hold = Hold {
        released: Arc::new(released),
        held: Arc::default(),
    };
    let holder = Holder {
        client,
        hold_if,
        hold: hold.clone(),
    };
    (Client::new(holder, default_namespace), hold)
}
