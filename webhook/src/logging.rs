//! Log setup: JSON lines (with the admission span's uid, namespace, name, operation and
//! decision) or readable text; the level comes from `RUST_LOG`, `info` by default.

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::FmtSpan;

use crate::config::LogFormat;

/// Installs the global subscriber. Returns false if one was already installed.
pub fn init(format: LogFormat) -> bool {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_span_events(FmtSpan::NONE)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .try_init()
            .is_ok(),
        LogFormat::Text => builder.try_init().is_ok(),
    }
}
