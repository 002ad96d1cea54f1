//! HTTP routes: the admission endpoints served over TLS, and the operations endpoints
//! (`/healthz`, `/readyz`, `/metrics`, from [`telemetry::ops`]) served on a separate
//! plain-HTTP port. Handlers only read the body, decode it once ([`admission::decode_review`]),
//! call [`crate::admission`] with the decoded review, record metrics and log the decision.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State as AxumState};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::BytesMut;
use http_body_util::BodyExt;
use tokio::sync::OwnedSemaphorePermit;
use tower_http::timeout::TimeoutLayer;
use tracing::{Span, instrument};

use crate::State;
use crate::admission::{self, Judge, Review, decode_review, operation_label};
use crate::metrics::{ConversionResult, Decision, Endpoint, Operation, Path};
use crate::policy::INLINE_COST_LIMIT;

/// The admission router: `POST /mutate`, `POST /validate` and `POST /convert` (CRD
/// conversion), with the body limit (413
/// beyond it), the in-flight body budget, and the per-request timeout (408). Every
/// answer, including 404 and 405, is counted by path and status code.
pub fn router(state: Arc<State>) -> Router {
    let limits = state.limits;
    Router::new()
        .route("/mutate", post(mutate))
        .route("/validate", post(validate))
        .route("/convert", post(convert))
        // Explicit, so the layers below apply to it too.
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                "not found: use /mutate, /validate or /convert",
            )
        })
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            limits.request_timeout,
        ))
        .layer(middleware::from_fn_with_state(state.clone(), observe))
        .with_state(state)
}

/// The operations router (shared with the controller: [`telemetry::ops::router`]).
pub fn ops_router(state: Arc<State>) -> Router {
    let profiling = state.profiling;
    telemetry::ops::router(state, profiling)
}

/// Ready only when a valid certificate is loaded and the TLS listener is accepting, and
/// not while draining ([`State::readiness`]).
impl telemetry::ops::Probes for State {
    fn readiness(&self) -> Result<(), &'static str> {
        State::readiness(self)
    }

    fn encode_metrics(&self) -> Result<String, std::fmt::Error> {
        self.metrics.encode()
    }
}

/// Runs from the moment the headers are read, before the body, so a slow upload counts
/// in flight and in the latency.
async fn observe(
    AxumState(state): AxumState<Arc<State>>,
    request: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    let path = Path::of(request.uri().path());
    let _guard = state.metrics.in_flight();
    let response = next.run(request).await;
    state
        .metrics
        .observe_response(path, response.status().as_u16(), started.elapsed());
    response
}

/// With `--client-ca`, an admission request on a connection without a client
/// certificate is refused (403) before its body is read.
fn unauthenticated(state: &State, request: &Request) -> Option<Response> {
    let presented = request
        .extensions()
        .get::<crate::listener::ClientCertificate>()
        .is_some_and(|c| c.0);
    (state.limits.require_client_certificate && !presented).then(|| {
        tracing::debug!("admission request without a client certificate refused");
        (
            StatusCode::FORBIDDEN,
            "a client certificate signed by the webhook's --client-ca is required",
        )
            .into_response()
    })
}

#[instrument(name = "admission", skip_all, fields(endpoint = "mutate", uid))]
async fn mutate(AxumState(state): AxumState<Arc<State>>, request: Request) -> Response {
    if let Some(refused) = unauthenticated(&state, &request) {
        return refused;
    }
    let (body, _permit) = match read_body(&state, request, state.limits.max_body_bytes).await {
        Ok(read) => read,
        Err(response) => return response,
    };
    match decode(&state, Endpoint::Mutate, &body) {
        Ok(review) => answer(
            &state,
            Endpoint::Mutate,
            &review,
            admission::mutate(&review),
        ),
        Err(response) => *response,
    }
}

#[instrument(name = "conversion", skip_all, fields(endpoint = "convert"))]
async fn convert(AxumState(state): AxumState<Arc<State>>, request: Request) -> Response {
    let max = state.limits.max_convert_body_bytes;
    let (body, _permit) = match read_body(&state, request, max).await {
        Ok(read) => read,
        Err(response) => return response,
    };
    let converted = crate::conversion::convert(&body);
    // The answer holds no reference to the body: free it before the answer is written.
    drop(body);
    match converted {
        Ok(answer) => {
            let result = if answer.succeeded() {
                tracing::debug!(
                    uid = %answer.response.uid,
                    objects = answer.response.converted_count,
                    "converted"
                );
                ConversionResult::Success
            } else {
                tracing::warn!(
                    uid = %answer.response.uid,
                    reason = %answer.response.result.message,
                    "conversion failed"
                );
                ConversionResult::Failure
            };
            state.metrics.observe_conversion(result);
            match answer.to_json() {
                Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
                Err(error) => {
                    tracing::error!(%error, "cannot serialize the ConversionReview");
                    (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response()
                }
            }
        }
        Err(error) => {
            tracing::warn!(%error, "malformed conversion request");
            state
                .metrics
                .observe_conversion(ConversionResult::BadRequest);
            (StatusCode::BAD_REQUEST, error.to_string()).into_response()
        }
    }
}

#[instrument(name = "admission", skip_all, fields(endpoint = "validate", uid))]
async fn validate(AxumState(state): AxumState<Arc<State>>, request: Request) -> Response {
    if let Some(refused) = unauthenticated(&state, &request) {
        return refused;
    }
    let (body, _permit) = match read_body(&state, request, state.limits.max_body_bytes).await {
        Ok(read) => read,
        Err(response) => return response,
    };
    let review = match decode(&state, Endpoint::Validate, &body) {
        Ok(review) => review,
        Err(response) => return *response,
    };
    // A scale review is judged on the cached AppService: let the cache catch up with the
    // write it is about first (bounded; answered from memory either way).
    if let (Some(appservices), Some(target)) = (state.appservices(), review.scale_target()) {
        appservices.settle(&target).await;
    }
    let policies = state.policies.current();
    let namespace_object = state.namespace_object(review.request.namespace.as_deref());
    if policies.cost() <= INLINE_COST_LIMIT {
        let judge = Judge {
            policies: &policies,
            namespace_object,
            appservices: state.appservices(),
            metrics: Some(&state.metrics),
        };
        let response = admission::validate(&review, &judge);
        return answer(&state, Endpoint::Validate, &review, response);
    }
    // Costlier policies run on a blocking thread, a bounded number at once, within their
    // time budget (waiting for a free slot included): they never stall the workers
    // serving other reviews and the probes.
    let span = Span::current();
    let review = Arc::new(review);
    let work = {
        let (state, review) = (state.clone(), review.clone());
        async move {
            let slot = state.policy_slots.clone().acquire_owned().await.ok();
            tokio::task::spawn_blocking(move || {
                let _slot = slot;
                span.in_scope(|| {
                    let judge = Judge {
                        policies: &policies,
                        namespace_object,
                        appservices: state.appservices(),
                        metrics: Some(&state.metrics),
                    };
                    let response = admission::validate(&review, &judge);
                    answer(&state, Endpoint::Validate, &review, response)
                })
            })
            .await
        }
    };
    let budget = state.limits.policy_timeout;
    match tokio::time::timeout(budget, work).await {
        Ok(Ok(response)) => response,
        Ok(Err(error)) => {
            tracing::error!(%error, "policy evaluation failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "policy evaluation failed",
            )
                .into_response()
        }
        Err(_) => {
            let message =
                format!("the policies did not finish within their time budget of {budget:?}");
            tracing::warn!(%message, "admission denied");
            review_body(review.denied(&message))
        }
    }
}

/// The HTTP answer carrying an AdmissionReview response.
fn review_body(response: kube::core::admission::AdmissionResponse) -> Response {
    match serde_json::to_vec(&response.into_review()) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(error) => {
            tracing::error!(%error, "cannot serialize the AdmissionReview");
            (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response()
        }
    }
}

/// Reads the body, taking in-flight budget for each piece as it arrives: a client that
/// declares a large body and sends nothing holds nothing. A declared or actual size
/// over `max` is 413 before more is read; a client that has not delivered its whole
/// body within [`crate::Limits::body_timeout`] (time spent waiting for budget not
/// counted: that is not the client's doing) gets 408, and what it held is freed.
async fn read_body(
    state: &State,
    request: Request,
    max: usize,
) -> Result<(Bytes, Option<OwnedSemaphorePermit>), Response> {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > max) {
        return Err(too_large(max));
    }
    receive(state, request, max, declared).await
}

fn too_large(max: usize) -> Response {
    (
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("request body is larger than the limit of {max} bytes"),
    )
        .into_response()
}

/// The body of [`read_body`] after its headers were checked.
///
/// Each piece takes its size from the budget if that is free at once. If it is not, the
/// request gives back what it holds and waits for its whole body (the declared length,
/// or `max`) in one acquisition: a request never waits while holding budget, so partly
/// received bodies cannot block each other until all time out, and the semaphore's
/// queue is served in order.
async fn receive(
    state: &State,
    request: Request,
    max: usize,
    declared: Option<usize>,
) -> Result<(Bytes, Option<OwnedSemaphorePermit>), Response> {
    let shutting_down = || (StatusCode::SERVICE_UNAVAILABLE, "shutting down").into_response();
    let permits = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    let mut held: Option<OwnedSemaphorePermit> = None;
    // Set once the whole body is reserved: no more budget is taken piece by piece.
    let mut whole = false;
    let timeout = state.limits.body_timeout;
    let mut deadline = tokio::time::Instant::now() + timeout;
    let mut body = request.into_body();
    let mut buffer = BytesMut::new();
    loop {
        let Ok(frame) = tokio::time::timeout_at(deadline, body.frame()).await else {
            tracing::debug!(
                ?timeout,
                received = buffer.len(),
                "request body not received in time"
            );
            return Err((
                StatusCode::REQUEST_TIMEOUT,
                format!("the request body did not arrive within {timeout:?}"),
            )
                .into_response());
        };
        let Some(frame) = frame else {
            break;
        };
        let frame = frame.map_err(|error| {
            (
                StatusCode::BAD_REQUEST,
                format!("reading the request body: {error}"),
            )
                .into_response()
        })?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let received = buffer.len() + data.len();
        if received > max {
            return Err(too_large(max));
        }
        if !whole && !data.is_empty() {
            match state
                .body_budget
                .clone()
                .try_acquire_many_owned(permits(data.len()))
            {
                Ok(permit) => match &mut held {
                    Some(held) => held.merge(permit),
                    None => held = Some(permit),
                },
                Err(tokio::sync::TryAcquireError::Closed) => return Err(shutting_down()),
                Err(tokio::sync::TryAcquireError::NoPermits) => {
                    drop(held.take());
                    let size = declared.unwrap_or(max).max(received);
                    let waiting = tokio::time::Instant::now();
                    let permit = state
                        .body_budget
                        .clone()
                        .acquire_many_owned(permits(size))
                        .await
                        .map_err(|_| shutting_down())?;
                    // Bounded by the request timeout; the client's deadline waits too.
                    deadline += waiting.elapsed();
                    held = Some(permit);
                    whole = true;
                }
            }
        }
        if buffer.is_empty() {
            // Sized once the client has started sending, to what it said it would send.
            buffer.reserve(declared.unwrap_or(0).max(data.len()));
        }
        buffer.extend_from_slice(&data);
    }
    Ok((buffer.freeze(), held))
}

/// The one decode of an admission body (`/mutate` or `/validate`); a body that is not
/// an AdmissionReview is answered 400 here.
fn decode(state: &State, endpoint: Endpoint, body: &Bytes) -> Result<Review, Box<Response>> {
    match decode_review(body) {
        Ok(review) => {
            Span::current().record("uid", review.request.uid.as_str());
            Ok(review)
        }
        Err(error) => {
            tracing::warn!(%error, decision = Decision::BadRequest.as_str(), "malformed admission request");
            state
                .metrics
                .observe_request(endpoint, Operation::Unknown, Decision::BadRequest);
            Err(Box::new(
                (StatusCode::BAD_REQUEST, error.to_string()).into_response(),
            ))
        }
    }
}

/// Logs and counts the answer to `review`, and writes it.
fn answer(
    state: &State,
    endpoint: Endpoint,
    review: &Review,
    response: kube::core::admission::AdmissionResponse,
) -> Response {
    let request = &review.request;
    let operation = operation_label(&request.operation);
    let decision = admission::decision(&response);
    // One line per review with everything needed to find it again; these fields sit on
    // the event, not the span, so JSON keys never collide with the span's own `name`.
    let namespace = request.namespace.as_deref().unwrap_or_default();
    // Allowed: whether it was patched and how many warnings; denied: the code and why.
    let allowed = response.allowed;
    let denial = (!allowed).then_some(&response.result);
    tracing::info!(
        uid = %request.uid,
        namespace,
        name = %request.name,
        operation = operation.as_str(),
        decision = decision.as_str(),
        patched = allowed.then_some(response.patch.is_some()),
        warnings = allowed.then(|| response.warnings.as_ref().map_or(0, Vec::len)),
        code = denial.map(|status| status.code),
        reason = denial.map(|status| tracing::field::display(&status.message)),
        dry_run = request.dry_run,
        "admission {}",
        if allowed { "allowed" } else { "denied" }
    );
    state.metrics.observe_request(endpoint, operation, decision);
    review_body(response)
}
