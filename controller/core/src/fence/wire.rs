//! The fence at the wire: the sharded client's connections refuse to write once the fence
//! has lapsed. The check of [`super::FenceLayer`] runs when a write leaves the rate
//! limit's queue; between it and the bytes reaching the socket lie the connection pool's
//! checkout (a new connection's TCP and TLS handshakes) and the scheduling of the task.
//! A process frozen there (SIGSTOP, a stalled VM) would send that write when it resumes,
//! after another member took its objects. Each connection of this client checks the
//! fence on every write to its socket instead: a lapsed fence never opens again, so
//! whatever was in flight when the process stopped goes nowhere when it resumes, its
//! Lease renewal included (the process then stops, as for any lapse).
//!
//! The client is built as `kube::Client::try_from` builds one, over this connector:
//! rustls on the kubeconfig's TLS settings, the kubeconfig's timeouts, its base URI,
//! authentication, headers and retries.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioExecutor;
use kube::client::{Body, ClientBuilder, ConfigExt, DynBody};
use tokio::time::Instant;
use tower::util::BoxService;
use tower::{BoxError, ServiceBuilder, ServiceExt as _};

use super::{Fence, Fenced};

/// The service a [`ClientBuilder`] starts from, as `ClientBuilder::try_from` makes it.
pub type WireService = BoxService<http::Request<Body>, http::Response<Box<DynBody>>, BoxError>;

/// A client builder like `ClientBuilder::try_from(config)` whose connections write only
/// while `fence` has not lapsed.
pub fn fenced_builder(
    config: &kube::Config,
    fence: Fence,
) -> Result<ClientBuilder<WireService>, kube::Error> {
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Installed in between by someone else: the same default either way.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    }
    let tls =
        config.rustls_https_connector_with_connector(FencedConnector { inner: tcp, fence })?;
    let mut timed = hyper_timeout::TimeoutConnector::new(tls);
    timed.set_connect_timeout(config.connect_timeout);
    timed.set_read_timeout(config.read_timeout);
    timed.set_write_timeout(config.write_timeout);
    let hyper: hyper_util::client::legacy::Client<_, Body> =
        hyper_util::client::legacy::Builder::new(TokioExecutor::new()).build(timed);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.default_retry.then(|| {
            tower::retry::RetryLayer::new(kube::client::retry::RetryPolicy::server_retry())
        }))
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(hyper)
        .map_response(|response: http::Response<hyper::body::Incoming>| {
            response.map(|body| {
                Box::new(http_body_util::BodyExt::map_err(body, BoxError::from)) as Box<DynBody>
            })
        })
        .boxed();
    Ok(ClientBuilder::new(
        service,
        config.default_namespace.clone(),
    ))
}

/// A TCP connector whose connections check `fence` on every write.
#[derive(Clone, Debug)]
struct FencedConnector {
    inner: HttpConnector,
    fence: Fence,
}

type Tcp = <HttpConnector as tower::Service<Uri>>::Response;

impl tower::Service<Uri> for FencedConnector {
    type Response = FencedIo<Tcp>;
    type Error = <HttpConnector as tower::Service<Uri>>::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.inner.call(uri);
        let fence = self.fence.clone();
        Box::pin(async move {
            Ok(FencedIo {
                inner: connecting.await?,
                fence,
            })
        })
    }
}

/// A connection that writes only while its fence has not lapsed.
#[derive(Debug)]
struct FencedIo<T> {
    inner: T,
    fence: Fence,
}

impl<T> FencedIo<T> {
    fn refuse(&self) -> Option<io::Error> {
        self.fence
            .expired(Instant::now())
            .then(|| io::Error::other(Fenced))
    }
}

impl<T: hyper::rt::Read + Unpin> hyper::rt::Read for FencedIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: hyper::rt::Write + Unpin> hyper::rt::Write for FencedIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Some(refused) = self.refuse() {
            return Poll::Ready(Err(refused));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let Some(refused) = self.refuse() {
            return Poll::Ready(Err(refused));
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<T: Connection> Connection for FencedIo<T> {
    fn connected(&self) -> Connected {
        self.inner.connected()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use hyper::rt::Write as _;
    use hyper_util::rt::TokioIo;
    use tokio::io::AsyncReadExt;

    use super::*;

    async fn write<T: hyper::rt::Write + Unpin>(
        io: &mut FencedIo<T>,
        bytes: &[u8],
    ) -> io::Result<usize> {
        std::future::poll_fn(|cx| Pin::new(&mut *io).poll_write(cx, bytes)).await
    }

    /// A connection to a local listener writes while the fence is open (and before it
    /// was ever opened: reads and Lease requests go out then), and refuses once it has
    /// lapsed: the bytes never reach the peer.
    #[tokio::test]
    async fn a_connection_refuses_to_write_once_its_fence_lapsed() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let fence = Fence::default();
        let mut connector = FencedConnector {
            inner: HttpConnector::new(),
            fence: fence.clone(),
        };
        let uri: Uri = format!("http://{addr}").parse().unwrap();
        let mut io: FencedIo<TokioIo<tokio::net::TcpStream>> =
            tower::Service::call(&mut connector, uri).await.unwrap();
        let (mut peer, _) = listener.accept().await.unwrap();
        write(&mut io, b"before").await.unwrap();
        let now = Instant::now();
        fence.renewed(now, Duration::from_millis(50), now);
        write(&mut io, b"-open").await.unwrap();
        let mut got = [0u8; 11];
        peer.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"before-open");

        tokio::time::sleep(Duration::from_millis(60)).await;
        let refused = write(&mut io, b"after").await.unwrap_err();
        assert!(
            refused.to_string().contains("shard fence closed"),
            "{refused}"
        );
        assert!(fence.lapsed());
        drop(io);
        let mut rest = Vec::new();
        peer.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "{rest:?}");
    }
}
