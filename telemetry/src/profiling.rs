//! CPU and heap profiles of a live process, in pprof's format, on the ops port:
//!
//! * `GET /debug/pprof/profile?seconds=N`: CPU, sampled at 99 Hz for N seconds (default
//!   10, at most [`MAX_CPU_SECONDS`]), as pprof protobuf (pprof-rs);
//! * `GET /debug/pprof/heap`: memory in use, sampled by jemalloc every 512 KiB on
//!   average, as gzipped pprof protobuf with symbols (jemalloc_pprof).
//!
//! Off unless the binary starts with `--profiling` (the routes then answer 404). On, they
//! answer only connections from the loopback address, which is where
//! `kubectl port-forward` connects from inside the Pod, unless remote access was asked
//! for; the rest of the ops port (probes, metrics) is unaffected. One profile is taken at
//! a time; a second request gets 409.
//!
//! jemalloc samples only when it starts with profiling configured, which is read from
//! the environment before `main`: [`enable_heap_profiling`] restarts the binary with that
//! setting (`exec`, same process id) when `--profiling` is given without it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::connect_info::MockConnectInfo;
use axum::extract::{ConnectInfo, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use tokio::sync::Mutex;

/// Longest CPU profile one request may take.
pub const MAX_CPU_SECONDS: u64 = 60;
/// CPU profile length when the request does not say.
pub const DEFAULT_CPU_SECONDS: u64 = 10;
/// Sampling frequency of CPU profiles (not 100, so samples do not align with timers).
const CPU_FREQUENCY: i32 = 99;

/// jemalloc's configuration variable (the allocator's symbols carry the `_rjem_` prefix).
pub const JEMALLOC_CONF_ENV: &str = "_RJEM_MALLOC_CONF";
/// Profiling on from the start, one sample per 2^19 bytes (512 KiB) allocated on
/// average; background threads purge freed pages as without profiling.
pub const JEMALLOC_PROFILING_CONF: &str =
    "background_thread:true,prof:true,prof_active:true,lg_prof_sample:19";

/// Whether and to whom profiles are served.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Profiling {
    pub enabled: bool,
    /// Serve other addresses than loopback too.
    pub allow_remote: bool,
}

/// When `--profiling` is on and jemalloc was not started with profiling, replaces this
/// process by the same binary, arguments and environment plus [`JEMALLOC_CONF_ENV`].
/// Returns only when nothing needed to be done, or with the error of `exec`. Call it
/// first in `main`, before threads or files are opened.
pub fn enable_heap_profiling(profiling: Profiling) -> std::io::Result<()> {
    use std::os::unix::process::CommandExt;
    if !profiling.enabled || std::env::var_os(JEMALLOC_CONF_ENV).is_some() {
        return Ok(());
    }
    let exe = std::env::current_exe()?;
    Err(std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env(JEMALLOC_CONF_ENV, JEMALLOC_PROFILING_CONF)
        .exec())
}

/// The profile routes, to merge into an ops router served with
/// `into_make_service_with_connect_info::<SocketAddr>()`.
pub fn router<S: Clone + Send + Sync + 'static>(profiling: Profiling) -> Router<S> {
    if !profiling.enabled {
        return Router::new();
    }
    let state = Arc::new(Profiler {
        busy: Mutex::new(()),
    });
    Router::new()
        .route("/debug/pprof/profile", get(cpu))
        .route("/debug/pprof/heap", get(heap))
        .layer(middleware::from_fn_with_state(profiling, loopback_only))
        .with_state(state)
}

struct Profiler {
    /// Held while a profile is taken: one at a time.
    busy: Mutex<()>,
}

/// Whether a peer may fetch profiles.
pub fn peer_allowed(peer: Option<SocketAddr>, profiling: Profiling) -> bool {
    profiling.allow_remote || peer.is_some_and(|p| p.ip().is_loopback())
}

async fn loopback_only(
    State(profiling): State<Profiling>,
    request: Request,
    next: Next,
) -> Response {
    let extensions = request.extensions();
    let peer = extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(addr)| *addr)
        // What `ConnectInfo` falls back to in router tests.
        .or_else(|| extensions.get::<MockConnectInfo<SocketAddr>>().map(|m| m.0));
    if peer_allowed(peer, profiling) {
        next.run(request).await
    } else {
        (
            StatusCode::FORBIDDEN,
            "profiles are served to loopback connections only: use kubectl port-forward\n",
        )
            .into_response()
    }
}

#[derive(Debug, Deserialize)]
struct CpuQuery {
    seconds: Option<u64>,
}

async fn cpu(State(profiler): State<Arc<Profiler>>, Query(query): Query<CpuQuery>) -> Response {
    let seconds = query.seconds.unwrap_or(DEFAULT_CPU_SECONDS);
    if !(1..=MAX_CPU_SECONDS).contains(&seconds) {
        return (
            StatusCode::BAD_REQUEST,
            format!("seconds must be between 1 and {MAX_CPU_SECONDS}\n"),
        )
            .into_response();
    }
    let Ok(_busy) = profiler.busy.try_lock() else {
        return busy();
    };
    tracing::info!(seconds, "taking a CPU profile");
    let guard = match pprof::ProfilerGuardBuilder::default()
        .frequency(CPU_FREQUENCY)
        .blocklist(&["libc", "libgcc", "pthread", "vdso"])
        .build()
    {
        Ok(guard) => guard,
        Err(error) => return failed("starting the CPU profiler", &error),
    };
    // A client that goes away drops this future, and the guard stops the profiler.
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let profile = guard.report().build().and_then(|report| report.pprof());
    drop(guard);
    match profile {
        Ok(profile) => {
            let body = pprof::protos::Message::encode_to_vec(&profile);
            protobuf(body, "profile.pb")
        }
        Err(error) => failed("building the CPU profile", &error),
    }
}

async fn heap(State(profiler): State<Arc<Profiler>>) -> Response {
    let Ok(_busy) = profiler.busy.try_lock() else {
        return busy();
    };
    let Some(ctl) = jemalloc_pprof::PROF_CTL.as_ref() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "jemalloc was started without profiling: start the binary with --profiling (or {JEMALLOC_CONF_ENV}={JEMALLOC_PROFILING_CONF})\n"
            ),
        )
            .into_response();
    };
    let mut ctl = ctl.clone().lock_owned().await;
    if !ctl.activated() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "jemalloc heap sampling is not active\n",
        )
            .into_response();
    }
    tracing::info!("taking a heap profile");
    // Writing the dump and symbolizing it reads files: off the async workers.
    match tokio::task::spawn_blocking(move || ctl.dump_pprof()).await {
        Ok(Ok(body)) => protobuf(body, "heap.pb.gz"),
        Ok(Err(error)) => failed("dumping the heap profile", &*error),
        Err(error) => failed("dumping the heap profile", &error),
    }
}

fn protobuf(body: Vec<u8>, file: &str) -> Response {
    (
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{file}\""),
            ),
        ],
        body,
    )
        .into_response()
}

fn busy() -> Response {
    (
        StatusCode::CONFLICT,
        "another profile is being taken; try again when it is done\n",
    )
        .into_response()
}

fn failed(what: &str, error: &dyn std::fmt::Display) -> Response {
    tracing::error!(%error, "{what}");
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("{what}: {error}\n"),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_unless_remote_is_allowed() {
        let on = Profiling {
            enabled: true,
            allow_remote: false,
        };
        let local: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let local6: SocketAddr = "[::1]:40000".parse().unwrap();
        let pod: SocketAddr = "10.1.2.3:40000".parse().unwrap();
        assert!(peer_allowed(Some(local), on));
        assert!(peer_allowed(Some(local6), on));
        assert!(!peer_allowed(Some(pod), on));
        assert!(!peer_allowed(None, on));
        let remote = Profiling {
            allow_remote: true,
            ..on
        };
        assert!(peer_allowed(Some(pod), remote));
    }

    async fn status_from(
        profiling: Profiling,
        peer: &str,
        uri: &str,
    ) -> (axum::http::StatusCode, Vec<u8>) {
        let peer: SocketAddr = peer.parse().unwrap();
        let app = router::<()>(profiling).layer(MockConnectInfo(peer));
        let (status, _, body) = crate::test_support::get(app, uri).await;
        (status, body)
    }

    #[tokio::test]
    async fn routes_are_absent_when_off_and_refuse_remote_peers() {
        let off = Profiling::default();
        for uri in ["/debug/pprof/heap", "/debug/pprof/profile?seconds=1"] {
            assert_eq!(status_from(off, "127.0.0.1:1", uri).await.0, 404);
        }
        let on = Profiling {
            enabled: true,
            allow_remote: false,
        };
        let (status, body) = status_from(on, "10.0.0.7:5000", "/debug/pprof/heap").await;
        assert_eq!(status, 403);
        assert!(String::from_utf8_lossy(&body).contains("port-forward"));
        for bad in ["0", "61", "x"] {
            let uri = format!("/debug/pprof/profile?seconds={bad}");
            assert_eq!(status_from(on, "127.0.0.1:1", &uri).await.0, 400, "{uri}");
        }
    }

    #[tokio::test]
    async fn a_cpu_profile_is_pprof_protobuf() {
        use pprof::protos::Message;
        let on = Profiling {
            enabled: true,
            allow_remote: false,
        };
        // Something to sample.
        let busy = std::thread::spawn(|| {
            let deadline = std::time::Instant::now() + Duration::from_millis(1500);
            let mut x = 0u64;
            // Mostly arithmetic: samples taken inside the vDSO's clock are skipped.
            while std::time::Instant::now() < deadline {
                for _ in 0..1_000_000 {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            }
            x
        });
        let (status, body) = status_from(on, "127.0.0.1:1", "/debug/pprof/profile?seconds=1").await;
        let _ = busy.join();
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        let profile = pprof::protos::Profile::decode(body.as_slice()).unwrap();
        let types: Vec<&str> = profile
            .sample_type
            .iter()
            .filter_map(|t| profile.string_table.get(usize::try_from(t.ty).ok()?))
            .map(String::as_str)
            .collect();
        assert!(types.contains(&"cpu"), "{types:?}");
        // The number of samples is not asserted: a one-second profile sometimes comes
        // back with none (seen with pprof-rs 0.15 on this machine, cause not found).
    }
}
