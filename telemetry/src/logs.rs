//! Logs and traces: one `tracing` subscriber with
//!
//! * the log output, JSON lines (for collectors) or text, filtered by `RUST_LOG`
//!   (`info` by default);
//! * when an OTLP endpoint is configured, an OpenTelemetry layer exporting spans in
//!   batches over OTLP/gRPC, with its own filter: spans at `info` and above, plus the kube
//!   client's per-request `HTTP` spans (at `debug`) when they run inside another span (a
//!   reconcile), so the API calls of a reconcile are its children while the watches and
//!   lease renewals of the background tasks are not exported as traces of their own.
//!   JSON log lines inside a traced span then carry `trace_id` and `span_id`.
//!
//! Without an endpoint neither the layer nor an exporter exists.

use std::fmt;
use std::sync::OnceLock;

use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::{SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::{Dispatch, Level, Subscriber};
use tracing_subscriber::filter::{self, EnvFilter};
use tracing_subscriber::fmt::format::{Format, Json, JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{Layer, Registry};

/// Log output format, as both binaries spell it on the command line: a value outside
/// these is refused at startup rather than read as "not JSON".
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line, for log collectors.
    Json,
    /// Human-readable lines, for a terminal.
    Text,
}

impl LogFormat {
    /// `format`, or when unset JSON unless stderr is a terminal (a Pod's never is).
    pub fn or_detect(format: Option<LogFormat>) -> LogFormat {
        use std::io::IsTerminal;
        format.unwrap_or(if std::io::stderr().is_terminal() {
            LogFormat::Text
        } else {
            LogFormat::Json
        })
    }
}

/// The environment variable OpenTelemetry SDKs read the OTLP endpoint from.
pub const OTLP_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

/// How to log and trace.
#[derive(Clone, Debug)]
pub struct LogOptions {
    /// JSON lines, each event's fields at the top level, or readable text.
    pub format: LogFormat,
    /// `service.name` of exported spans (`OTEL_SERVICE_NAME` wins when set).
    pub service_name: &'static str,
    /// OTLP/gRPC endpoint (`http://collector:4317`); `None` or empty: no tracing export.
    pub otlp_endpoint: Option<String>,
}

/// Errors of [`init`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("building the OTLP exporter for {endpoint}: {error}")]
    Exporter {
        endpoint: String,
        error: opentelemetry_otlp::ExporterBuildError,
    },
    #[error("a global tracing subscriber is already installed")]
    AlreadyInstalled,
}

/// Keeps the exporter of a traced process; [`Telemetry::shutdown`] sends what is left.
#[derive(Debug, Default)]
#[must_use = "without shutdown the last spans are lost"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans are exported.
    pub fn tracing(&self) -> bool {
        self.provider.is_some()
    }

    /// Exports the spans still queued and stops the exporter (at most a few seconds: the
    /// export has its own timeout).
    pub async fn shutdown(self) {
        if let Some(provider) = self.provider {
            // The batch processor's thread exports through the tonic client, which runs on
            // this runtime: wait for it off the runtime's workers.
            let _ = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        }
    }
}

/// The dispatcher installed by [`init`], for reading trace ids while formatting an
/// event (inside an event `tracing`'s own thread-local default is unavailable).
static DISPATCH: OnceLock<Dispatch> = OnceLock::new();

/// Installs the global subscriber. Must run inside a Tokio runtime when an OTLP endpoint
/// is set (the gRPC client runs on it).
pub fn init(options: &LogOptions) -> Result<Telemetry, Error> {
    let endpoint = options
        .otlp_endpoint
        .as_deref()
        .map(str::trim)
        .filter(|e| !e.is_empty());
    let log_filter =
        || EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let Some(endpoint) = endpoint else {
        let fmt = fmt_layer(options, false).with_filter(log_filter());
        let dispatch = Dispatch::new(Registry::default().with(fmt));
        return install(dispatch).map(|()| Telemetry::default());
    };

    let exporter = SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|error| Error::Exporter {
            endpoint: endpoint.to_owned(),
            error,
        })?;
    let mut resource = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(options.service_name);
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    let otel = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer(options.service_name))
        .with_filter(filter::dynamic_filter_fn(|meta, cx| {
            if meta.target().starts_with("kube_client") {
                // One span per API request, only as part of something larger.
                meta.is_span() && meta.name() == "HTTP" && cx.lookup_current().is_some()
            } else {
                *meta.level() <= Level::INFO
            }
        }));
    let fmt = fmt_layer(options, true).with_filter(log_filter());
    install(Dispatch::new(Registry::default().with(fmt).with(otel)))?;
    tracing::info!(endpoint, "exporting traces over OTLP");
    Ok(Telemetry {
        provider: Some(provider),
    })
}

fn install(dispatch: Dispatch) -> Result<(), Error> {
    let _ = DISPATCH.set(dispatch.clone());
    tracing::dispatcher::set_global_default(dispatch).map_err(|_| Error::AlreadyInstalled)
}

/// The log output layer: JSON (with trace ids when `traced`) or text, on stderr.
fn fmt_layer<S>(options: &LogOptions, traced: bool) -> Box<dyn Layer<S> + Send + Sync>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    if options.format == LogFormat::Text {
        return Box::new(layer);
    }
    let json = tracing_subscriber::fmt::format()
        .json()
        .flatten_event(true)
        .with_current_span(true)
        .with_span_list(false);
    let layer = layer.fmt_fields(JsonFields::new());
    if traced {
        Box::new(layer.event_format(WithTraceIds(json)))
    } else {
        Box::new(layer.event_format(json))
    }
}

/// JSON lines with `trace_id` and `span_id` first when the event is inside an exported
/// span.
struct WithTraceIds(Format<Json>);

impl<S> FormatEvent<S, JsonFields> for WithTraceIds
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> fmt::Result {
        // Only the id is kept: the span's extensions must not be borrowed while the
        // OpenTelemetry layer reads them.
        let current = ctx.lookup_current().map(|span| span.id());
        let ids = current
            .zip(DISPATCH.get())
            .and_then(|(id, dispatch)| tracing_opentelemetry::get_otel_context(&id, dispatch))
            .map(|cx| cx.span().span_context().clone())
            .filter(|sc| sc.is_valid());
        let Some(ids) = ids else {
            return self.0.format_event(ctx, writer, event);
        };
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        match line.strip_prefix('{') {
            Some(rest) => write!(
                writer,
                "{{\"trace_id\":\"{}\",\"span_id\":\"{}\",{rest}",
                ids.trace_id(),
                ids.span_id()
            ),
            None => writer.write_str(&line),
        }
    }
}

/// The trace id of the current span, when it is exported (for tests and messages).
pub fn current_trace_id() -> Option<String> {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let cx = tracing::Span::current().context();
    let span = cx.span();
    let sc = span.span_context();
    sc.is_valid().then(|| sc.trace_id().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_endpoint_means_no_export() {
        // A blank OTEL_EXPORTER_OTLP_ENDPOINT (a chart value left empty) exports nothing.
        let options = LogOptions {
            format: LogFormat::Json,
            service_name: "test",
            otlp_endpoint: Some("  ".into()),
        };
        let telemetry = init(&options).unwrap();
        assert!(!telemetry.tracing());
        assert!(current_trace_id().is_none());
    }
}
