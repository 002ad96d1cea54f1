//! The labels of the webhook's metrics: one enum per label, so a series can only be
//! recorded with a value that exists from the start.

use std::fmt::Write as _;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};

/// Which admission endpoint answered.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Endpoint {
    Mutate,
    Validate,
    /// `/convert`: CRD version conversion (counted in `conversions`, not `requests`).
    Convert,
}

impl Endpoint {
    pub fn as_str(self) -> &'static str {
        match self {
            Endpoint::Mutate => "mutate",
            Endpoint::Validate => "validate",
            Endpoint::Convert => "convert",
        }
    }
}

/// The admission operation of a review; `Unknown` when the body could not be read.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Delete,
    Connect,
    Unknown,
}

/// How a request ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Decision {
    /// Allowed unchanged (possibly with warnings).
    Allowed,
    /// Allowed with a JSON patch (`/mutate` filled in defaults).
    Patched,
    /// Denied: field errors, a policy, or an object that is not an AppService.
    Denied,
    /// The body was not an AdmissionReview: HTTP 400.
    BadRequest,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
            Operation::Unknown => "unknown",
        }
    }
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allowed => "allowed",
            Decision::Patched => "patched",
            Decision::Denied => "denied",
            Decision::BadRequest => "bad_request",
        }
    }
}

impl ReloadResult {
    pub fn as_str(self) -> &'static str {
        match self {
            ReloadResult::Success => "success",
            ReloadResult::Failure => "failure",
        }
    }
}

/// Label values are the lower-case wire names, not the Rust variant names.
macro_rules! label_value_from_as_str {
    ($($t:ty),*) => {$(
        impl EncodeLabelValue for $t {
            fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
                encoder.write_str(self.as_str())
            }
        }
    )*};
}
label_value_from_as_str!(
    Endpoint,
    ConversionResult,
    Operation,
    Decision,
    ReloadResult,
    Path,
    Code,
    HandshakeFailure
);

impl Endpoint {
    /// The admission endpoints, counted by operation and decision.
    pub(super) const ALL: [Endpoint; 2] = [Endpoint::Mutate, Endpoint::Validate];
    /// Every endpoint with a latency histogram, in `as usize` order.
    pub(super) const TIMED: [Endpoint; 3] =
        [Endpoint::Mutate, Endpoint::Validate, Endpoint::Convert];
}

/// How a ConversionReview ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum ConversionResult {
    /// Every object converted.
    Success,
    /// Answered with `result.status: Failure` (an object could not be converted, or an
    /// unsupported version was asked for).
    Failure,
    /// The body was not a ConversionReview: HTTP 400.
    BadRequest,
}

impl ConversionResult {
    pub(super) const ALL: [ConversionResult; 3] = [
        ConversionResult::Success,
        ConversionResult::Failure,
        ConversionResult::BadRequest,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ConversionResult::Success => "success",
            ConversionResult::Failure => "failure",
            ConversionResult::BadRequest => "bad_request",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConversionLabels {
    pub result: ConversionResult,
}

impl Operation {
    pub(super) const ALL: [Operation; 5] = [
        Operation::Create,
        Operation::Update,
        Operation::Delete,
        Operation::Connect,
        Operation::Unknown,
    ];
}

impl Decision {
    pub(super) const ALL: [Decision; 4] = [
        Decision::Allowed,
        Decision::Patched,
        Decision::Denied,
        Decision::BadRequest,
    ];
}

/// The path an HTTP answer on the admission port was for.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Path {
    Mutate,
    Validate,
    Convert,
    /// Anything else (answered 404 or 405).
    Other,
}

impl Path {
    pub(super) const ALL: [Path; 4] = [Path::Mutate, Path::Validate, Path::Convert, Path::Other];

    pub fn of(path: &str) -> Path {
        match path {
            "/mutate" => Path::Mutate,
            "/validate" => Path::Validate,
            "/convert" => Path::Convert,
            _ => Path::Other,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Path::Mutate => "/mutate",
            Path::Validate => "/validate",
            Path::Convert => "/convert",
            Path::Other => "other",
        }
    }
}

/// HTTP status classes the admission port answers with, one series each.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Code {
    Ok,
    BadRequest,
    NotFound,
    MethodNotAllowed,
    RequestTimeout,
    PayloadTooLarge,
    InternalError,
    Unavailable,
    Other,
}

impl Code {
    pub(super) const ALL: [Code; 9] = [
        Code::Ok,
        Code::BadRequest,
        Code::NotFound,
        Code::MethodNotAllowed,
        Code::RequestTimeout,
        Code::PayloadTooLarge,
        Code::InternalError,
        Code::Unavailable,
        Code::Other,
    ];

    pub fn of(status: u16) -> Code {
        match status {
            200 => Code::Ok,
            400 => Code::BadRequest,
            404 => Code::NotFound,
            405 => Code::MethodNotAllowed,
            408 => Code::RequestTimeout,
            413 => Code::PayloadTooLarge,
            500 => Code::InternalError,
            503 => Code::Unavailable,
            _ => Code::Other,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Code::Ok => "200",
            Code::BadRequest => "400",
            Code::NotFound => "404",
            Code::MethodNotAllowed => "405",
            Code::RequestTimeout => "408",
            Code::PayloadTooLarge => "413",
            Code::InternalError => "500",
            Code::Unavailable => "503",
            Code::Other => "other",
        }
    }
}

/// Why a TLS connection ended before HTTP.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum HandshakeFailure {
    Error,
    Timeout,
}

impl HandshakeFailure {
    pub fn as_str(self) -> &'static str {
        match self {
            HandshakeFailure::Error => "error",
            HandshakeFailure::Timeout => "timeout",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResponseLabels {
    pub path: Path,
    pub code: Code,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HandshakeLabels {
    pub reason: HandshakeFailure,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub endpoint: Endpoint,
    pub operation: Operation,
    pub decision: Decision,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabels {
    pub endpoint: Endpoint,
}

/// Outcome of reloading a file.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum ReloadResult {
    Success,
    Failure,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    pub result: ReloadResult,
}
