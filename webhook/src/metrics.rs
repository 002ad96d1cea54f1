//! Prometheus metrics of the webhook, with small fixed label sets (endpoint, operation,
//! decision, result), served as text on the operations port.

use std::time::Duration;

use std::fmt::Write as _;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Which admission endpoint answered.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Endpoint {
    Mutate,
    Validate,
}

impl Endpoint {
    pub fn as_str(self) -> &'static str {
        match self {
            Endpoint::Mutate => "mutate",
            Endpoint::Validate => "validate",
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
label_value_from_as_str!(Endpoint, Operation, Decision, ReloadResult);

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

/// Every metric the webhook exports, registered in one registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    duration: Family<EndpointLabels, Histogram>,
    cert_expiry: Gauge<i64>,
    cert_reloads: Family<ReloadLabels, Counter>,
    policy_reloads: Family<ReloadLabels, Counter>,
    policies: Gauge<i64>,
    in_flight: Gauge<i64>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("appservice_webhook");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "admission_requests",
            "Admission requests by endpoint, operation and decision",
            requests.clone(),
        );
        // 50 µs .. ~0.8 s: answers are CPU-bound and usually well below a millisecond.
        let duration = Family::<EndpointLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.00005, 2.0, 15))
        });
        registry.register(
            "admission_duration_seconds",
            "Time to answer an admission request, from body read to response",
            duration.clone(),
        );
        let cert_expiry = Gauge::<i64>::default();
        registry.register(
            "certificate_expiry_timestamp_seconds",
            "notAfter of the serving certificate, as a Unix timestamp",
            cert_expiry.clone(),
        );
        let cert_reloads = Family::<ReloadLabels, Counter>::default();
        registry.register(
            "certificate_reloads",
            "Attempts to load a changed serving certificate, by result",
            cert_reloads.clone(),
        );
        let policy_reloads = Family::<ReloadLabels, Counter>::default();
        registry.register(
            "policy_reloads",
            "Attempts to load a changed policy file, by result",
            policy_reloads.clone(),
        );
        let policies = Gauge::<i64>::default();
        registry.register(
            "policies",
            "Number of CEL policies currently active",
            policies.clone(),
        );
        let in_flight = Gauge::<i64>::default();
        registry.register(
            "admission_in_flight",
            "Admission requests being received or answered right now",
            in_flight.clone(),
        );
        Metrics {
            in_flight,
            registry,
            requests,
            duration,
            cert_expiry,
            cert_reloads,
            policy_reloads,
            policies,
        }
    }

    pub fn observe_request(
        &self,
        endpoint: Endpoint,
        operation: Operation,
        decision: Decision,
        elapsed: Duration,
    ) {
        self.requests
            .get_or_create(&RequestLabels {
                endpoint,
                operation,
                decision,
            })
            .inc();
        self.duration
            .get_or_create(&EndpointLabels { endpoint })
            .observe(elapsed.as_secs_f64());
    }

    pub fn certificate_loaded(&self, not_after_unix: i64) {
        self.cert_expiry.set(not_after_unix);
    }

    pub fn certificate_reload(&self, result: ReloadResult) {
        self.cert_reloads
            .get_or_create(&ReloadLabels { result })
            .inc();
    }

    pub fn policy_reload(&self, result: ReloadResult, active: usize) {
        self.policy_reloads
            .get_or_create(&ReloadLabels { result })
            .inc();
        self.policies.set(i64::try_from(active).unwrap_or(i64::MAX));
    }

    /// Counts a request as in flight until the guard is dropped.
    pub fn in_flight(&self) -> InFlight {
        self.in_flight.inc();
        InFlight(self.in_flight.clone())
    }

    /// The registry in Prometheus' text format.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// Decrements the in-flight gauge when dropped (also when the request is cancelled).
#[derive(Debug)]
pub struct InFlight(Gauge<i64>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_observed_values() {
        let metrics = Metrics::new();
        metrics.observe_request(
            Endpoint::Validate,
            Operation::Create,
            Decision::Denied,
            Duration::from_millis(1),
        );
        metrics.certificate_loaded(1_900_000_000);
        metrics.policy_reload(ReloadResult::Failure, 2);
        let text = metrics.encode().unwrap();
        assert!(text.contains(
            r#"appservice_webhook_admission_requests_total{endpoint="validate",operation="CREATE",decision="denied"} 1"#
        ), "{text}");
        assert!(
            text.contains("appservice_webhook_certificate_expiry_timestamp_seconds 1900000000")
        );
        assert!(text.contains(r#"appservice_webhook_policy_reloads_total{result="failure"} 1"#));
        assert!(text.contains("appservice_webhook_policies 2"));
        assert!(text.contains(
            "appservice_webhook_admission_duration_seconds_count{endpoint=\"validate\"} 1"
        ));
    }
}
