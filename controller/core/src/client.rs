//! The Kubernetes client: a User-Agent naming the binary and its version, a client-side
//! rate limit (QPS and burst) on every request, watches included, as client-go's token
//! bucket does, a pause when the API server answers 429 with `Retry-After`, and the
//! `appservice_controller_api_requests` metrics by verb and code.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use kube::client::ClientBuilder;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

use crate::config::RateLimit;
use crate::metrics::ApiMetrics;

/// The User-Agent of `binary` at this version, as client-go writes its own:
/// `appservice-controller/0.1.0 (linux/x86_64)`. The API server's audit log and its
/// `apiserver_request_total` tell the project's requests from any other client's by it.
pub fn user_agent(binary: &str) -> String {
    format!(
        "{binary}/{} ({}/{})",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS,
        std::env::consts::ARCH
    )
}

/// Sets the User-Agent of every request made with `config` to [`user_agent`]`(binary)`.
pub fn with_user_agent(mut config: kube::Config, binary: &str) -> kube::Config {
    if let Ok(value) = http::HeaderValue::from_str(&user_agent(binary)) {
        config
            .headers
            .retain(|(name, _)| name != http::header::USER_AGENT);
        config.headers.push((http::header::USER_AGENT, value));
    }
    config
}

/// The client configuration from `path`, or in-cluster configuration or `$KUBECONFIG`
/// when unset.
pub async fn kube_config(path: Option<&std::path::Path>) -> Result<kube::Config, kube::Error> {
    match path {
        Some(path) => {
            let kubeconfig =
                kube::config::Kubeconfig::read_from(path).map_err(kube::Error::InferKubeconfig)?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .map_err(kube::Error::InferKubeconfig)
        }
        None => kube::Config::infer()
            .await
            .map_err(kube::Error::InferConfig),
    }
}

/// Builds a client from `config` whose requests pass through a token bucket.
pub fn build_client(config: kube::Config, limit: RateLimit) -> Result<kube::Client, kube::Error> {
    build_client_with_metrics(config, limit, ApiMetrics::default())
}

/// Like [`build_client`], counting every request in `metrics` (by verb and code, with its
/// latency to the response's headers) and pausing every request while the API server's
/// last `429 Too Many Requests` asks to (`Retry-After`, at most [`MAX_RETRY_AFTER`]).
pub fn build_client_with_metrics(
    config: kube::Config,
    limit: RateLimit,
    metrics: ApiMetrics,
) -> Result<kube::Client, kube::Error> {
    build_client_as(config, limit, metrics, None, None)
}

/// The User-Agent of a shard: [`user_agent`] followed by `shard/<identity>`, so the API
/// server's audit log tells which shard made each request.
pub fn shard_user_agent(binary: &str, identity: &str) -> String {
    format!("{} shard/{identity}", user_agent(binary))
}

/// Like [`build_client_with_metrics`]; with `shard` (`--sharding`), the User-Agent names
/// the shard's identity too ([`shard_user_agent`]), and with `fence` every write is
/// checked against it below the rate limit, as it leaves for the wire
/// ([`crate::fence::FenceLayer`]).
pub fn build_client_as(
    config: kube::Config,
    limit: RateLimit,
    metrics: ApiMetrics,
    shard: Option<&str>,
    fence: Option<crate::fence::Fence>,
) -> Result<kube::Client, kube::Error> {
    let mut config = with_user_agent(config, "appservice-controller");
    if let Some(identity) = shard
        && let Ok(value) =
            http::HeaderValue::from_str(&shard_user_agent("appservice-controller", identity))
    {
        config
            .headers
            .retain(|(name, _)| name != http::header::USER_AGENT);
        config.headers.push((http::header::USER_AGENT, value));
    }
    // Fenced: the connections themselves refuse to write once the fence lapsed
    // (`fence/wire.rs`), and each write is checked once more as it leaves the rate limit.
    let builder = match &fence {
        Some(fence) => crate::fence::fenced_builder(&config, fence.clone())?,
        None => ClientBuilder::try_from(config)?,
    };
    let pause = RetryAfter::default();
    Ok(builder
        .with_layer(&tower::util::option_layer(
            fence.map(crate::fence::FenceLayer),
        ))
        .with_layer(&RateLimitLayer::new(limit).pausing_on(pause.clone()))
        .with_layer(&ObserveLayer { metrics, pause })
        .build())
}

/// The longest pause a `Retry-After` can ask for: a server (or something in front of it)
/// that asks for hours is not obeyed beyond this.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// Until when the API server asked us to send nothing (its last 429's `Retry-After`),
/// shared by the layer that sees responses and the one that lets requests out.
#[derive(Clone, Debug, Default)]
pub struct RetryAfter(Arc<Mutex<Option<Instant>>>);

impl RetryAfter {
    /// Records a `Retry-After` of `value` (delta-seconds; an HTTP date or garbage is
    /// read as 1 s, as client-go does) received at `now`.
    pub fn asked(&self, value: Option<&str>, now: Instant) {
        let seconds = value
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(1);
        let until = now + Duration::from_secs(seconds).min(MAX_RETRY_AFTER);
        let mut slot = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none_or(|t| t < until) {
            *slot = Some(until);
        }
    }

    /// How long to wait at `now` before the next request, if at all.
    pub fn wait(&self, now: Instant) -> Option<Duration> {
        let slot = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        slot.filter(|&t| t > now).map(|t| t - now)
    }
}

/// A token bucket: `burst` tokens, refilled at `qps` per second.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    pub fn new(limit: RateLimit, now: Instant) -> Self {
        let burst = f64::from(limit.burst.max(1));
        TokenBucket {
            qps: limit.qps.max(0.001),
            burst,
            tokens: burst,
            last: now,
        }
    }

    /// Takes a token, or says how long until one is available.
    pub fn try_take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.qps))
        }
    }
}

#[derive(Clone, Debug)]
pub struct RateLimitLayer {
    limit: RateLimit,
    pause: RetryAfter,
}

impl RateLimitLayer {
    pub fn new(limit: RateLimit) -> Self {
        RateLimitLayer {
            limit,
            pause: RetryAfter::default(),
        }
    }

    /// Also holds every request while `pause` says the API server asked for quiet.
    pub fn pausing_on(mut self, pause: RetryAfter) -> Self {
        self.pause = pause;
        self
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimitService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService {
            inner,
            pause: self.pause.clone(),
            bucket: TokenBucket::new(self.limit, Instant::now()),
            sleep: None,
            has_token: false,
        }
    }
}

/// Waits in `poll_ready` until a token is available. kube's `Client` puts a buffer in
/// front of the stack, so one instance serves every request of the client in order.
pub struct RateLimitService<S> {
    inner: S,
    pause: RetryAfter,
    bucket: TokenBucket,
    sleep: Option<Pin<Box<Sleep>>>,
    has_token: bool,
}

impl<S, Req> Service<Req> for RateLimitService<S>
where
    S: Service<Req>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        while !self.has_token {
            if let Some(sleep) = self.sleep.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.sleep = None;
            }
            if let Some(wait) = self.pause.wait(Instant::now()) {
                self.sleep = Some(Box::pin(tokio::time::sleep(wait)));
                continue;
            }
            match self.bucket.try_take(Instant::now()) {
                Ok(()) => self.has_token = true,
                Err(wait) => self.sleep = Some(Box::pin(tokio::time::sleep(wait))),
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        self.has_token = false;
        self.inner.call(req)
    }
}

/// Counts each request and its latency, and hands a 429's `Retry-After` to the pause.
#[derive(Clone)]
struct ObserveLayer {
    metrics: ApiMetrics,
    pause: RetryAfter,
}

impl<S> Layer<S> for ObserveLayer {
    type Service = ObserveService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        ObserveService {
            inner,
            metrics: self.metrics.clone(),
            pause: self.pause.clone(),
        }
    }
}

#[derive(Clone)]
struct ObserveService<S> {
    inner: S,
    metrics: ApiMetrics,
    pause: RetryAfter,
}

/// The verb of a request, as the metric labels it: the HTTP method, and `watch` for a
/// GET that watches.
pub fn verb_of<B>(req: &http::Request<B>) -> crate::metrics::ApiVerb {
    use crate::metrics::ApiVerb;
    let watches = req
        .uri()
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    match *req.method() {
        http::Method::GET if watches => ApiVerb::Watch,
        http::Method::GET => ApiVerb::Get,
        http::Method::POST => ApiVerb::Post,
        http::Method::PUT => ApiVerb::Put,
        http::Method::PATCH => ApiVerb::Patch,
        http::Method::DELETE => ApiVerb::Delete,
        _ => ApiVerb::Other,
    }
}

impl<S, B, RB> Service<http::Request<B>> for ObserveService<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    RB: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let verb = verb_of(&req);
        let started = Instant::now();
        let metrics = self.metrics.clone();
        let pause = self.pause.clone();
        let response = self.inner.call(req);
        Box::pin(async move {
            let result = response.await;
            let code = match &result {
                Ok(response) => {
                    let status = response.status();
                    if status == http::StatusCode::TOO_MANY_REQUESTS {
                        let value = response
                            .headers()
                            .get(http::header::RETRY_AFTER)
                            .and_then(|v| v.to_str().ok());
                        pause.asked(value, Instant::now());
                    }
                    Some(status.as_u16())
                }
                Err(_) => None,
            };
            metrics.observe(verb, code, started.elapsed());
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_allows_burst_then_qps() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(
            RateLimit {
                qps: 10.0,
                burst: 3,
            },
            t0,
        );
        assert!(b.try_take(t0).is_ok());
        assert!(b.try_take(t0).is_ok());
        assert!(b.try_take(t0).is_ok());
        let wait = b.try_take(t0).unwrap_err();
        assert!(wait > Duration::from_millis(90) && wait <= Duration::from_millis(100));
        assert!(b.try_take(t0 + Duration::from_millis(100)).is_ok());
        assert!(b.try_take(t0 + Duration::from_millis(100)).is_err());
        // Refill never exceeds the burst.
        let later = t0 + Duration::from_secs(60);
        for _ in 0..3 {
            assert!(b.try_take(later).is_ok());
        }
        assert!(b.try_take(later).is_err());
    }

    #[test]
    fn retry_after_pauses_for_what_the_server_asked_within_a_bound() {
        let t0 = Instant::now();
        let pause = RetryAfter::default();
        assert_eq!(pause.wait(t0), None);
        pause.asked(Some("3"), t0);
        assert_eq!(pause.wait(t0), Some(Duration::from_secs(3)));
        // A shorter ask later does not shorten the pause; it ends when it ends.
        pause.asked(Some("1"), t0);
        assert_eq!(
            pause.wait(t0 + Duration::from_secs(2)),
            Some(Duration::from_secs(1))
        );
        assert_eq!(pause.wait(t0 + Duration::from_secs(3)), None);
        // Garbage or an HTTP date: one second. Hours: the bound.
        let t1 = t0 + Duration::from_secs(10);
        pause.asked(Some("Wed, 21 Oct 2026 07:28:00 GMT"), t1);
        assert_eq!(pause.wait(t1), Some(Duration::from_secs(1)));
        pause.asked(Some("86400"), t1);
        assert_eq!(pause.wait(t1), Some(MAX_RETRY_AFTER));
        pause.asked(None, t1 + MAX_RETRY_AFTER);
        assert_eq!(
            pause.wait(t1 + MAX_RETRY_AFTER),
            Some(Duration::from_secs(1))
        );
    }

    /// An API server that answers each request with the next code of its script (a 429
    /// with `Retry-After: 2`), and notes when each request arrived.
    struct Scripted {
        codes: std::collections::VecDeque<u16>,
        arrivals: Arc<Mutex<Vec<Instant>>>,
    }

    impl Service<http::Request<()>> for Scripted {
        type Response = http::Response<()>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Request<()>) -> Self::Future {
            self.arrivals.lock().unwrap().push(Instant::now());
            let code = self.codes.pop_front().unwrap_or(200);
            let mut response = http::Response::builder().status(code);
            if code == 429 {
                response = response.header(http::header::RETRY_AFTER, "2");
            }
            std::future::ready(Ok(response.body(()).unwrap()))
        }
    }

    /// The client's stack as `build_client_with_metrics` puts it together, over a
    /// scripted server: a 429 holds every later request for its `Retry-After`, and each
    /// answer is counted by verb and code. Virtual time: nothing here waits for real.
    #[tokio::test(start_paused = true)]
    async fn a_429_holds_the_next_requests_for_its_retry_after_and_is_counted() {
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let server = Scripted {
            codes: [200, 429, 200, 200].into(),
            arrivals: arrivals.clone(),
        };
        let metrics = ApiMetrics::default();
        let pause = RetryAfter::default();
        let limit = RateLimit {
            qps: 1000.0,
            burst: 100,
        };
        let mut client = ObserveLayer {
            metrics: metrics.clone(),
            pause: pause.clone(),
        }
        .layer(RateLimitLayer::new(limit).pausing_on(pause).layer(server));
        for _ in 0..4 {
            std::future::poll_fn(|cx| client.poll_ready(cx))
                .await
                .unwrap();
            let request = http::Request::get("/api/v1/namespaces/a/configmaps")
                .body(())
                .unwrap();
            client.call(request).await.unwrap();
        }
        let arrivals = arrivals.lock().unwrap().clone();
        let gaps: Vec<Duration> = arrivals.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps[0] < Duration::from_millis(10), "{gaps:?}");
        assert!(
            gaps[1] >= Duration::from_secs(2),
            "held for Retry-After: {gaps:?}"
        );
        assert!(gaps[2] < Duration::from_millis(10), "{gaps:?}");
        use crate::metrics::ApiVerb;
        assert_eq!(metrics.count(ApiVerb::Get, "200"), 3);
        assert_eq!(metrics.count(ApiVerb::Get, "429"), 1);
    }

    #[test]
    fn verbs_are_methods_and_watch() {
        use crate::metrics::ApiVerb;
        let req = |method: http::Method, uri: &str| {
            http::Request::builder()
                .method(method)
                .uri(uri)
                .body(())
                .unwrap()
        };
        let list = "/apis/apps/v1/namespaces/a/deployments?labelSelector=x";
        assert_eq!(verb_of(&req(http::Method::GET, list)), ApiVerb::Get);
        let watch = "/apis/apps/v1/deployments?watch=true&resourceVersion=1";
        assert_eq!(verb_of(&req(http::Method::GET, watch)), ApiVerb::Watch);
        assert_eq!(
            verb_of(&req(http::Method::GET, "/x?nowatch=true")),
            ApiVerb::Get
        );
        assert_eq!(verb_of(&req(http::Method::PATCH, list)), ApiVerb::Patch);
        assert_eq!(verb_of(&req(http::Method::OPTIONS, "/")), ApiVerb::Other);
    }

    #[test]
    fn the_user_agent_names_the_binary_and_version() {
        let ua = user_agent("appservice-controller");
        assert!(
            ua.starts_with(&format!(
                "appservice-controller/{} (",
                env!("CARGO_PKG_VERSION")
            )),
            "{ua}"
        );
        let config = with_user_agent(
            kube::Config::new("https://127.0.0.1:6443".parse().unwrap()),
            "appservice-controller",
        );
        let set: Vec<_> = config
            .headers
            .iter()
            .filter(|(n, _)| n == http::header::USER_AGENT)
            .collect();
        assert_eq!(set.len(), 1);
        assert_eq!(set[0].1.to_str().unwrap(), ua);
    }
}
