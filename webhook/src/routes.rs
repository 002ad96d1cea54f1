//! HTTP routes: the admission endpoints served over TLS, and the operations endpoints
//! (`/healthz`, `/readyz`, `/metrics`) served on a separate plain-HTTP port. Handlers only
//! read the body, call [`crate::admission`], record metrics and log the decision.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request, State as AxumState};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tower_http::timeout::TimeoutLayer;
use tracing::{Span, instrument};

use crate::State;
use crate::admission::{self, decode_review, operation_label};
use crate::metrics::{Decision, Endpoint, Operation};

/// The admission router: `POST /mutate` and `POST /validate`, with the body limit (413
/// beyond it) and the per-request timeout (408).
pub fn router(state: Arc<State>) -> Router {
    let limits = state.limits;
    Router::new()
        .route("/mutate", post(mutate))
        .route("/validate", post(validate))
        .layer(DefaultBodyLimit::max(limits.max_body_bytes))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_in_flight,
        ))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            limits.request_timeout,
        ))
        .with_state(state)
}

/// The operations router.
pub fn ops_router(state: Arc<State>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

/// Runs from the moment the headers are read, before the body, so a slow upload counts.
async fn count_in_flight(
    AxumState(state): AxumState<Arc<State>>,
    request: Request,
    next: Next,
) -> Response {
    let _guard = state.metrics.in_flight();
    next.run(request).await
}

#[instrument(name = "admission", skip_all, fields(endpoint = "mutate", uid))]
async fn mutate(AxumState(state): AxumState<Arc<State>>, body: Bytes) -> Response {
    review(&state, Endpoint::Mutate, &body)
}

#[instrument(name = "admission", skip_all, fields(endpoint = "validate", uid))]
async fn validate(AxumState(state): AxumState<Arc<State>>, body: Bytes) -> Response {
    review(&state, Endpoint::Validate, &body)
}

fn review(state: &State, endpoint: Endpoint, body: &[u8]) -> Response {
    let started = Instant::now();
    let span = Span::current();
    let request = match decode_review(body) {
        Ok(request) => request,
        Err(error) => {
            tracing::warn!(%error, decision = Decision::BadRequest.as_str(), "malformed admission request");
            state.metrics.observe_request(
                endpoint,
                Operation::Unknown,
                Decision::BadRequest,
                started.elapsed(),
            );
            return (StatusCode::BAD_REQUEST, error.to_string()).into_response();
        }
    };
    span.record("uid", request.uid.as_str());
    let operation = operation_label(&request.operation);

    let response = match endpoint {
        Endpoint::Mutate => admission::mutate(&request),
        Endpoint::Validate => admission::validate(
            &request,
            &state.policies.current(),
            state.namespace_object(request.namespace.as_deref()),
        ),
    };
    let decision = admission::decision(&response);
    // One line per review with everything needed to find it again; these fields sit on
    // the event, not the span, so JSON keys never collide with the span's own `name`.
    let namespace = request.namespace.as_deref().unwrap_or_default();
    if response.allowed {
        tracing::info!(
            uid = %request.uid,
            namespace,
            name = %request.name,
            operation = operation.as_str(),
            decision = decision.as_str(),
            patched = response.patch.is_some(),
            warnings = response.warnings.as_ref().map_or(0, Vec::len),
            dry_run = request.dry_run,
            "admission allowed"
        );
    } else {
        tracing::info!(
            uid = %request.uid,
            namespace,
            name = %request.name,
            operation = operation.as_str(),
            decision = decision.as_str(),
            code = response.result.code,
            reason = %response.result.message,
            dry_run = request.dry_run,
            "admission denied"
        );
    }
    let body = serde_json::to_vec(&response.into_review());
    state
        .metrics
        .observe_request(endpoint, operation, decision, started.elapsed());
    match body {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(error) => {
            tracing::error!(%error, "cannot serialize the AdmissionReview");
            (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response()
        }
    }
}

/// Ready only when a valid certificate is loaded and the TLS listener is accepting, and
/// not while draining.
async fn readyz(AxumState(state): AxumState<Arc<State>>) -> Response {
    match state.readiness() {
        Ok(()) => (StatusCode::OK, "ready").into_response(),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, reason).into_response(),
    }
}

async fn metrics(AxumState(state): AxumState<Arc<State>>) -> Response {
    match state.metrics.encode() {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}
