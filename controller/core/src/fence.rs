//! The fence: with sharding on, every write of this process (to anything but a Lease)
//! passes one check, right before it is sent: was the shard's membership Lease renewed
//! less than the renew deadline ago, measured on this process's monotonic clock from the
//! moment the successful renewal was *sent*? Another replica may take this shard's
//! objects only once the Lease record has not changed for the lease duration on *its*
//! clock, counted from when it saw the record change, which is after the renewal was
//! sent; so with `lease duration > renew deadline + the longest a request takes`, a write
//! let through here reaches the API server before anyone else may write that object.
//!
//! A fence that lapsed never opens again: the shard's caches and queue are from before
//! the lapse (a SIGSTOP, an outage), and its objects may have been moved meanwhile, so the
//! process stops and a fresh one joins the ring as a new member.

mod wire;

pub use wire::{WireService, fenced_builder};

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http::{Method, Request};
use kube::client::Body;
use tokio::time::Instant;

#[derive(Debug, Default)]
struct State {
    /// Writes are allowed before this instant.
    valid_until: Option<Instant>,
    /// The fence was seen closed after having been open: it stays closed.
    lapsed: bool,
}

/// Shared between the membership Lease's renewals and the client's write path.
#[derive(Clone, Debug, Default)]
pub struct Fence {
    state: Arc<Mutex<State>>,
}

impl Fence {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A renewal sent at `sent` succeeded: writes may go on until `sent + deadline`,
    /// unless the fence had already lapsed (then it stays shut).
    pub fn renewed(&self, sent: Instant, deadline: Duration, now: Instant) {
        let mut s = self.lock();
        if s.lapsed || s.valid_until.is_some_and(|t| now >= t) {
            s.lapsed = true;
            return;
        }
        s.valid_until = Some(sent + deadline);
    }

    /// Whether a write may be sent at `now`.
    pub fn allows(&self, now: Instant) -> bool {
        let mut s = self.lock();
        match s.valid_until {
            Some(t) if !s.lapsed && now < t => true,
            Some(_) => {
                s.lapsed = true;
                false
            }
            None => false,
        }
    }

    /// Whether the fence, open once, has closed for good at `now` (marking it lapsed):
    /// what a connection checks before each write to its socket. A fence never opened
    /// is not expired (reads and Lease requests go out before the first renewal).
    pub fn expired(&self, now: Instant) -> bool {
        let mut s = self.lock();
        if !s.lapsed && s.valid_until.is_some_and(|t| now >= t) {
            s.lapsed = true;
        }
        s.lapsed
    }

    /// Whether the fence was open once and has closed for good.
    pub fn lapsed(&self) -> bool {
        let s = self.lock();
        s.lapsed || s.valid_until.is_some_and(|t| Instant::now() >= t)
    }
}

/// Whether `req` is a write the fence guards: every method but reads, on anything but
/// `coordination.k8s.io` (the Leases that keep the fence open must get through).
pub fn guarded<B>(req: &Request<B>) -> bool {
    let read = matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    !read && !req.uri().path().starts_with("/apis/coordination.k8s.io/")
}

/// Why a write was not sent.
#[derive(Debug, thiserror::Error)]
#[error(
    "shard fence closed: the membership Lease was not renewed within the renew deadline; write not sent"
)]
pub struct Fenced;

/// The fence as a layer of the client's own stack, below its rate limit: a write is
/// checked when it leaves the rate limit's queue, right before it goes on the wire, not
/// when it joins the queue (a write that waited there, or whose process was frozen while
/// it waited, is checked again on its way out). [`fenced`] around a client built without
/// it checks at the top of the stack.
#[derive(Clone, Debug)]
pub struct FenceLayer(pub Fence);

impl<S> tower::Layer<S> for FenceLayer {
    type Service = FenceService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        FenceService {
            inner,
            fence: self.0.clone(),
        }
    }
}

/// See [`FenceLayer`].
#[derive(Clone, Debug)]
pub struct FenceService<S> {
    inner: S,
    fence: Fence,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<S, B> tower::Service<Request<B>> for FenceService<S>
where
    S: tower::Service<Request<B>>,
    S::Response: Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = futures::future::BoxFuture<'static, Result<S::Response, BoxError>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        if guarded(&req) && !self.fence.allows(Instant::now()) {
            return Box::pin(std::future::ready(Err(Box::new(Fenced) as BoxError)));
        }
        let sent = self.inner.call(req);
        Box::pin(async move { sent.await.map_err(Into::into) })
    }
}

/// `client` with every guarded write checked against `fence` right before it is sent.
/// Reads and watches pass untouched.
pub fn fenced(client: kube::Client, fence: Fence) -> kube::Client {
    let namespace = client.default_namespace().to_owned();
    let service = tower::service_fn(move |req: Request<Body>| {
        let client = client.clone();
        let fence = fence.clone();
        async move {
            if guarded(&req) && !fence.allows(Instant::now()) {
                return Err(kube::Error::Service(Box::new(Fenced)));
            }
            client.send(req).await
        }
    });
    kube::Client::new(service, namespace)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEADLINE: Duration = Duration::from_secs(10);

    #[test]
    fn closed_until_the_first_renewal_then_open_until_the_deadline_from_its_send() {
        let f = Fence::default();
        let t0 = Instant::now();
        assert!(!f.allows(t0), "not a member yet");
        assert!(!f.lapsed());
        f.renewed(t0, DEADLINE, t0 + Duration::from_secs(1));
        assert!(f.allows(t0 + Duration::from_secs(9)));
        // Counted from when the renewal was sent, not from its answer.
        assert!(!f.allows(t0 + DEADLINE));
    }

    #[test]
    fn a_lapsed_fence_never_opens_again() {
        let f = Fence::default();
        let t0 = Instant::now();
        f.renewed(t0, DEADLINE, t0);
        f.renewed(
            t0 + Duration::from_secs(2),
            DEADLINE,
            t0 + Duration::from_secs(3),
        );
        assert!(f.allows(t0 + Duration::from_secs(11)));
        // Frozen past the deadline, then a renewal that succeeds after resuming.
        let resumed = t0 + Duration::from_secs(40);
        f.renewed(resumed, DEADLINE, resumed + Duration::from_millis(5));
        assert!(!f.allows(resumed + Duration::from_secs(1)));
        assert!(f.lapsed());
    }

    #[test]
    fn only_writes_outside_coordination_are_guarded() {
        let req = |m: Method, p: &str| Request::builder().method(m).uri(p).body(()).unwrap();
        let app = "/apis/platform.example.com/v1beta1/namespaces/a/appservices/x";
        assert!(!guarded(&req(Method::GET, app)));
        assert!(guarded(&req(Method::PATCH, app)));
        assert!(guarded(&req(Method::POST, "/api/v1/namespaces/a/secrets")));
        assert!(guarded(&req(
            Method::DELETE,
            "/apis/apps/v1/namespaces/a/deployments/x"
        )));
        let lease = "/apis/coordination.k8s.io/v1/namespaces/a/leases/x";
        assert!(!guarded(&req(Method::PUT, lease)));
        assert!(!guarded(&req(Method::POST, lease)));
    }

    #[tokio::test]
    async fn the_layer_checks_a_write_when_it_is_called_not_before() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tower::{Layer, Service, ServiceExt};
        let sent = Arc::new(AtomicUsize::new(0));
        let inner = tower::service_fn({
            let sent = sent.clone();
            move |_: Request<()>| {
                sent.fetch_add(1, Ordering::Relaxed);
                async { Ok::<_, BoxError>(()) }
            }
        });
        let fence = Fence::default();
        let mut service = FenceLayer(fence.clone()).layer(inner);
        let req = |m: Method, p: &str| Request::builder().method(m).uri(p).body(()).unwrap();
        let write = || req(Method::PATCH, "/api/v1/namespaces/a/services/x");
        // Ready (its turn in the rate limit came) while the fence is open ...
        let now = Instant::now();
        fence.renewed(now, DEADLINE, now);
        let ready = service.ready().await.unwrap();
        assert!(ready.call(write()).await.is_ok());
        // ... and called once it has lapsed: refused, never sent.
        fence.renewed(now, Duration::ZERO, now);
        let ready = service.ready().await.unwrap();
        let refused = ready.call(write()).await.unwrap_err();
        assert!(refused.is::<Fenced>(), "{refused}");
        assert!(
            ready
                .call(req(Method::GET, "/api/v1/services"))
                .await
                .is_ok()
        );
        assert_eq!(
            sent.load(Ordering::Relaxed),
            2,
            "the write refused was not sent"
        );
    }
}
