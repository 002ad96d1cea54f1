//! The Kubernetes client, with a client-side rate limit (QPS and burst) on every request,
//! watches included, as client-go's token bucket does.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use kube::client::ClientBuilder;
use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

use crate::config::RateLimit;

/// Builds a client from `config` whose requests pass through a token bucket.
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

pub fn build_client(config: kube::Config, limit: RateLimit) -> Result<kube::Client, kube::Error> {
    let builder = ClientBuilder::try_from(config)?;
    Ok(builder.with_layer(&RateLimitLayer::new(limit)).build())
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

#[derive(Clone, Copy, Debug)]
pub struct RateLimitLayer {
    limit: RateLimit,
}

impl RateLimitLayer {
    pub fn new(limit: RateLimit) -> Self {
        RateLimitLayer { limit }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimitService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService {
            inner,
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
}
