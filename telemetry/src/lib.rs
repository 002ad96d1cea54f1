//! What both binaries share to be operated at 3 a.m.:
//!
//! | module | holds |
//! | --- | --- |
//! | [`labels`] | metric label values as enums ([`label_values!`]) |
//! | [`logs`] | the log subscriber (JSON or text), OpenTelemetry traces over OTLP when an endpoint is configured, trace ids in JSON logs |
//! | [`ops`] | the operations router (`/healthz`, `/readyz`, `/metrics`, profiles), its server, and the shutdown signal |
//! | [`process`] | the `process_*` metrics (memory, CPU, file descriptors, start time) and the file-descriptor limit |
//! | [`profiling`] | CPU and heap profiles on demand (`/debug/pprof/*` on the ops port, loopback only unless told otherwise) |
//!
//! Nothing here costs anything unless it is switched on: without an OTLP endpoint no
//! exporter or OpenTelemetry layer exists, and without `--profiling` the profile routes
//! answer 404 and jemalloc does not sample.

pub mod labels;
pub mod logs;
pub mod ops;
pub mod process;
pub mod profiling;
#[cfg(test)]
mod test_support;

pub use logs::{LogFormat, LogOptions, Telemetry};
pub use ops::shutdown_signal;
pub use profiling::Profiling;
