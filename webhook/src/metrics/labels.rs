//! The labels of the webhook's metrics: one enum per label, so a series can only be
//! recorded with a value that exists from the start. Each value is the lower-case wire
//! name, not the Rust variant name (`telemetry::label_values!`).

use prometheus_client::encoding::EncodeLabelSet;

telemetry::label_values! {
    /// Which endpoint answered.
    pub enum Endpoint {
        Mutate => "mutate",
        Validate => "validate",
        /// `/convert`: CRD version conversion (counted in `conversions`, not `requests`).
        Convert => "convert",
    }

    /// The admission operation of a review; `Unknown` when the body could not be read.
    pub enum Operation {
        Create => "CREATE",
        Update => "UPDATE",
        Delete => "DELETE",
        Connect => "CONNECT",
        Unknown => "unknown",
    }

    /// How a request ended.
    pub enum Decision {
        /// Allowed unchanged (possibly with warnings).
        Allowed => "allowed",
        /// Allowed with a JSON patch (`/mutate` filled in defaults).
        Patched => "patched",
        /// Denied: field errors, a policy, or an object that is not an AppService.
        Denied => "denied",
        /// The body was not an AdmissionReview: HTTP 400.
        BadRequest => "bad_request",
    }

    /// How a ConversionReview ended.
    pub enum ConversionResult {
        /// Every object converted.
        Success => "success",
        /// Answered with `result.status: Failure` (an object could not be converted, or
        /// an unsupported version was asked for).
        Failure => "failure",
        /// The body was not a ConversionReview: HTTP 400.
        BadRequest => "bad_request",
    }

    /// The path an HTTP answer on the admission port was for.
    pub enum Path {
        Mutate => "/mutate",
        Validate => "/validate",
        Convert => "/convert",
        /// Anything else (answered 404 or 405).
        Other => "other",
    }

    /// HTTP status classes the admission port answers with, one series each.
    pub enum Code {
        Ok => "200",
        BadRequest => "400",
        NotFound => "404",
        MethodNotAllowed => "405",
        RequestTimeout => "408",
        PayloadTooLarge => "413",
        InternalError => "500",
        Unavailable => "503",
        Other => "other",
    }

    /// Why a TLS connection ended before HTTP.
    pub enum HandshakeFailure { Error => "error", Timeout => "timeout" }

    /// Outcome of reloading a file.
    pub enum ReloadResult { Success => "success", Failure => "failure" }
}

impl Endpoint {
    /// The admission endpoints, counted by operation and decision (every endpoint has a
    /// latency histogram, in `as usize` order).
    pub(super) const ADMISSION: [Endpoint; 2] = [Endpoint::Mutate, Endpoint::Validate];
}

impl Path {
    pub fn of(path: &str) -> Path {
        match path {
            "/mutate" => Path::Mutate,
            "/validate" => Path::Validate,
            "/convert" => Path::Convert,
            _ => Path::Other,
        }
    }
}

impl Code {
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
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConversionLabels {
    pub result: ConversionResult,
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    pub result: ReloadResult,
}
