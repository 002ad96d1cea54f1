//! Log setup: JSON lines (with the admission span's uid, namespace, name, operation and
//! decision, and its trace id when traces are exported) or readable text; the level
//! comes from `RUST_LOG`, `info` by default. With an OTLP endpoint each admission review
//! is exported as a span ([`telemetry::logs`]).

use crate::config::LogFormat;

/// Installs the global subscriber and, with `otlp_endpoint`, the trace exporter (inside
/// a Tokio runtime).
pub fn init(
    format: LogFormat,
    otlp_endpoint: Option<String>,
) -> Result<telemetry::Telemetry, telemetry::logs::Error> {
    telemetry::logs::init(&telemetry::LogOptions {
        json: format == LogFormat::Json,
        flatten_json: true,
        service_name: "appservice-webhook",
        otlp_endpoint,
    })
}
