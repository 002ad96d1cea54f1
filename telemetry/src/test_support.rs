//! What the unit tests of the routes share.

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use tower::ServiceExt;

/// The status, headers and body of `GET uri` on `app`.
pub async fn get(app: Router, uri: &str) -> (StatusCode, HeaderMap, Vec<u8>) {
    let response = app
        .oneshot(
            axum::http::Request::get(uri)
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let (parts, body) = response.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    (parts.status, parts.headers, body.to_vec())
}
