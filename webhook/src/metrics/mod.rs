//! Prometheus metrics of the webhook, with small fixed label sets (endpoint, operation,
//! decision, result, code), served as text on the operations port. Every series of a
//! fixed label set exists from the start at 0, so a rate or an alert on it works before
//! the first event; `process_*` metrics are read from `/proc` at each scrape. The label
//! values are typed ([`labels`]).

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

mod labels;

pub use labels::*;

/// Latency buckets from 100 µs to 30 s: answers are usually well below a millisecond,
/// but the API server waits up to its webhook timeout (at most 30 s), and a slow body
/// upload counts too.
const DURATION_BUCKETS: [f64; 18] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 15.0, 30.0,
];

/// Every metric the webhook exports, registered in one registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    conversions: Family<ConversionLabels, Counter>,
    duration: Family<EndpointLabels, Histogram>,
    cert_expiry: Gauge<i64>,
    cert_reloads: Family<ReloadLabels, Counter>,
    ca_expiry: Gauge<i64>,
    ca_rotations: Counter,
    ca_sync_failures: Counter,
    policy_reloads: Family<ReloadLabels, Counter>,
    policies: Gauge<i64>,
    in_flight: Gauge<i64>,
    responses: Family<ResponseLabels, Counter>,
    /// The fixed series above, looked up once: a request then updates its counters
    /// without hashing labels or taking the family's lock (index order of `ALL`).
    request_series: Vec<Counter>,
    response_series: Vec<Counter>,
    duration_series: Vec<Histogram>,
    handshake_failures: Family<HandshakeLabels, Counter>,
    connections: Gauge<i64>,
    peer_refusals: Counter,
    exposure_refusals: Counter,
    process: telemetry::process::ProcessMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut root = Registry::default();
        let process = telemetry::process::ProcessMetrics::default();
        process.register(&mut root);
        let registry = root.sub_registry_with_prefix("appservice_webhook");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "admission_requests",
            "Admission requests by endpoint, operation and decision",
            requests.clone(),
        );
        let conversions = Family::<ConversionLabels, Counter>::default();
        registry.register(
            "conversion_reviews",
            "ConversionReviews (CRD version conversion on /convert) by result",
            conversions.clone(),
        );
        let duration = Family::<EndpointLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(DURATION_BUCKETS)
        });
        registry.register(
            "admission_duration_seconds",
            "Time to answer an admission request, from the end of its headers (so including the body upload) to the response",
            duration.clone(),
        );
        let cert_expiry = Gauge::<i64>::default();
        registry.register(
            "certificate_expiry_timestamp_seconds",
            "notAfter of the serving certificate, as a Unix timestamp",
            cert_expiry.clone(),
        );
        let ca_expiry = Gauge::<i64>::default();
        registry.register(
            "ca_expiry_timestamp_seconds",
            "notAfter of the webhook CA that signs the serving certificate (--ca-secret), as a Unix timestamp",
            ca_expiry.clone(),
        );
        let ca_rotations = Counter::default();
        registry.register(
            "ca_rotations",
            "Times this replica promoted a next webhook CA to sign (--ca-secret)",
            ca_rotations.clone(),
        );
        let ca_sync_failures = Counter::default();
        registry.register(
            "ca_sync_failures",
            "Failed passes keeping the webhook CA Secret and the caBundles current (--ca-secret); retried with backoff",
            ca_sync_failures.clone(),
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
        let responses = Family::<ResponseLabels, Counter>::default();
        registry.register(
            "http_responses",
            "HTTP answers of the admission port by path and status code (413 too large, 408 timeout, 404/405 wrong path or method)",
            responses.clone(),
        );
        let handshake_failures = Family::<HandshakeLabels, Counter>::default();
        registry.register(
            "tls_handshake_failures",
            "TLS connections that ended before HTTP, by reason",
            handshake_failures.clone(),
        );
        let connections = Gauge::<i64>::default();
        registry.register(
            "tls_connections",
            "Open connections of the admission port",
            connections.clone(),
        );
        let peer_refusals = Counter::default();
        registry.register(
            "tls_connections_refused_per_peer",
            "Connections closed at once because their peer address already held --max-connections-per-peer",
            peer_refusals.clone(),
        );
        let exposure_refusals = Counter::default();
        registry.register(
            "exposure_refusals",
            "AppService writes refused because another AppService already exposes one of their host names (--watch-appservices)",
            exposure_refusals.clone(),
        );
        // Every fixed series from the start, at 0 (the requests, responses and durations
        // below, as their series are kept for the hot path).
        for &result in ConversionResult::ALL {
            drop(conversions.get_or_create(&ConversionLabels { result }));
        }
        for &result in ReloadResult::ALL {
            drop(cert_reloads.get_or_create(&ReloadLabels { result }));
            drop(policy_reloads.get_or_create(&ReloadLabels { result }));
        }
        for &reason in HandshakeFailure::ALL {
            drop(handshake_failures.get_or_create(&HandshakeLabels { reason }));
        }
        let mut request_series = Vec::new();
        let mut duration_series = Vec::new();
        for &endpoint in Endpoint::ALL {
            duration_series.push(duration.get_or_create(&EndpointLabels { endpoint }).clone());
        }
        for endpoint in Endpoint::ADMISSION {
            for &operation in Operation::ALL {
                for &decision in Decision::ALL {
                    request_series.push(
                        requests
                            .get_or_create(&RequestLabels {
                                endpoint,
                                operation,
                                decision,
                            })
                            .clone(),
                    );
                }
            }
        }
        let mut response_series = Vec::new();
        for &path in Path::ALL {
            for &code in Code::ALL {
                response_series.push(
                    responses
                        .get_or_create(&ResponseLabels { path, code })
                        .clone(),
                );
            }
        }
        Metrics {
            in_flight,
            registry: root,
            responses,
            request_series,
            response_series,
            duration_series,
            handshake_failures,
            connections,
            peer_refusals,
            exposure_refusals,
            process,
            requests,
            conversions,
            duration,
            cert_expiry,
            cert_reloads,
            ca_expiry,
            ca_rotations,
            ca_sync_failures,
            policy_reloads,
            policies,
        }
    }

    /// Counts a ConversionReview by how it ended.
    pub fn observe_conversion(&self, result: ConversionResult) {
        self.conversions
            .get_or_create(&ConversionLabels { result })
            .inc();
    }

    /// Counts a review by its decision.
    pub fn observe_request(&self, endpoint: Endpoint, operation: Operation, decision: Decision) {
        let index = (endpoint as usize * Operation::ALL.len() + operation as usize)
            * Decision::ALL.len()
            + decision as usize;
        match self.request_series.get(index) {
            Some(counter) => drop(counter.inc()),
            None => drop(
                self.requests
                    .get_or_create(&RequestLabels {
                        endpoint,
                        operation,
                        decision,
                    })
                    .inc(),
            ),
        }
    }

    /// Records an HTTP answer of the admission port; `elapsed` runs from the end of the
    /// headers, so it includes reading the body. Only admission paths get a latency.
    pub fn observe_response(&self, path: Path, status: u16, elapsed: Duration) {
        let code = Code::of(status);
        match self
            .response_series
            .get(path as usize * Code::ALL.len() + code as usize)
        {
            Some(counter) => drop(counter.inc()),
            None => drop(
                self.responses
                    .get_or_create(&ResponseLabels { path, code })
                    .inc(),
            ),
        }
        let endpoint = match path {
            Path::Mutate => Endpoint::Mutate,
            Path::Validate => Endpoint::Validate,
            Path::Convert => Endpoint::Convert,
            Path::Other => return,
        };
        match self.duration_series.get(endpoint as usize) {
            Some(histogram) => histogram.observe(elapsed.as_secs_f64()),
            None => self
                .duration
                .get_or_create(&EndpointLabels { endpoint })
                .observe(elapsed.as_secs_f64()),
        }
    }

    pub fn handshake_failed(&self, reason: HandshakeFailure) {
        self.handshake_failures
            .get_or_create(&HandshakeLabels { reason })
            .inc();
    }

    /// A connection closed because its peer held its share of the connections.
    pub fn peer_refused(&self) {
        self.peer_refusals.inc();
    }

    /// A write was refused for a host name another AppService exposes.
    pub fn exposure_refused(&self) {
        self.exposure_refusals.inc();
    }

    /// Counts an open connection until the guard is dropped.
    pub fn connection(&self) -> InFlight {
        self.connections.inc();
        InFlight(self.connections.clone())
    }

    /// The runtime CA signing now expires at `not_after_unix`.
    pub fn ca_loaded(&self, not_after_unix: i64) {
        self.ca_expiry.set(not_after_unix);
    }

    /// This replica promoted the next CA.
    pub fn ca_rotated(&self) {
        self.ca_rotations.inc();
    }

    /// A pass of the runtime CA failed.
    pub fn ca_sync_failed(&self) {
        self.ca_sync_failures.inc();
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

    /// The registry in Prometheus' text format, with fresh `process_*` values.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        self.process.refresh();
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
        metrics.observe_request(Endpoint::Validate, Operation::Create, Decision::Denied);
        metrics.observe_response(Path::Validate, 200, Duration::from_millis(1));
        metrics.observe_response(Path::Other, 404, Duration::from_millis(1));
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
        assert!(
            text.contains(r#"appservice_webhook_http_responses_total{path="other",code="404"} 1"#)
        );
        assert!(text.contains("le=\"30.0\""), "{text}");
        for line in [
            r#"appservice_webhook_admission_requests_total{endpoint="mutate",operation="UPDATE",decision="bad_request"} 0"#,
            r#"appservice_webhook_certificate_reloads_total{result="failure"} 0"#,
            r#"appservice_webhook_http_responses_total{path="/mutate",code="413"} 0"#,
            r#"appservice_webhook_tls_handshake_failures_total{reason="timeout"} 0"#,
            "appservice_webhook_exposure_refusals_total 0",
            "appservice_webhook_admission_duration_seconds_count{endpoint=\"mutate\"} 0",
        ] {
            assert!(text.contains(line), "{line} missing from {text}");
        }
        for name in [
            "process_resident_memory_bytes",
            "process_virtual_memory_bytes",
            "process_cpu_seconds_total",
            "process_open_fds",
            "process_max_fds",
            "process_start_time_seconds",
        ] {
            assert!(
                text.lines()
                    .any(|l| l.starts_with(name) && !l.ends_with(" 0")),
                "{name} missing or 0 in {text}"
            );
        }
    }
}
