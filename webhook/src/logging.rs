//! Log setup, as the controller's: JSON lines (each review's line carries its endpoint,
//! uid, namespace, name, operation and decision, and the trace id when traces are
//! exported) or readable text; the level comes from `RUST_LOG`, `info` by default. With
//! an OTLP endpoint each admission review is exported as a span ([`telemetry::logs`]).

use crate::config::LogFormat;

/// Installs the global subscriber and, with `otlp_endpoint`, the trace exporter (inside
/// a Tokio runtime).
pub fn init(
    format: Option<LogFormat>,
    otlp_endpoint: Option<String>,
) -> Result<telemetry::Telemetry, telemetry::logs::Error> {
    telemetry::logs::init(&telemetry::LogOptions {
        format: LogFormat::or_detect(format),
        service_name: "appservice-webhook",
        otlp_endpoint,
    })
}
