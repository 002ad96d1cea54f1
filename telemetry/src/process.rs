//! The process's own resources, for the `process_*` metrics Prometheus' Go and Python
//! clients export (prometheus-client for Rust has no process collector): resident and
//! virtual memory, CPU seconds, open and maximum file descriptors, start time. Read
//! from Linux's `/proc/self`; elsewhere every value is absent.
//!
//! Also the file-descriptor limit at start: the soft limit is raised to the hard one,
//! and the connection cap is kept below it so the operations port always has
//! descriptors left.

use std::sync::OnceLock;
use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use rustix::process::{Resource, getrlimit, setrlimit};

/// Descriptors kept free for the operations port, files being reloaded, the watcher and
/// the API-server client.
pub const FD_HEADROOM: u64 = 64;

/// One reading of the process's resources; `None` where the system does not say.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sample {
    pub resident_memory_bytes: Option<u64>,
    pub virtual_memory_bytes: Option<u64>,
    pub cpu_seconds: Option<f64>,
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
    pub start_time_seconds: Option<f64>,
}

/// Reads `/proc/self`.
pub fn sample() -> Sample {
    let page = rustix::param::page_size() as u64;
    let ticks = rustix::param::clock_ticks_per_second() as f64;
    let mut s = Sample::default();
    if let Ok(statm) = std::fs::read_to_string("/proc/self/statm") {
        let mut fields = statm.split_whitespace().map(|f| f.parse::<u64>().ok());
        s.virtual_memory_bytes = fields.next().flatten().map(|p| p * page);
        s.resident_memory_bytes = fields.next().flatten().map(|p| p * page);
    }
    if let Ok(stat) = std::fs::read_to_string("/proc/self/stat")
        && let Some(stat) = Stat::of(&stat)
    {
        s.cpu_seconds = stat.cpu_seconds(ticks);
        if let (Some(start), Some(boot)) = (stat.field(22), boot_time()) {
            s.start_time_seconds = Some(boot as f64 + start as f64 / ticks);
        }
    }
    if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
        // The directory handle itself is one of the entries.
        s.open_fds = Some((dir.count() as u64).saturating_sub(1));
    }
    s.max_fds = getrlimit(Resource::Nofile).current;
    s
}

/// CPU seconds (user and system) process `pid` has used so far, from `/proc/<pid>/stat`;
/// `None` once it is gone (or off Linux).
pub fn cpu_seconds_of(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Stat::of(&stat)?.cpu_seconds(rustix::param::clock_ticks_per_second() as f64)
}

/// The fields of a `/proc/<pid>/stat` line after the command name (field 2), which may
/// hold spaces: they are counted from after its last ')'.
struct Stat<'a>(Vec<&'a str>);

impl<'a> Stat<'a> {
    fn of(stat: &'a str) -> Option<Self> {
        let (_, rest) = stat.rsplit_once(')')?;
        Some(Stat(rest.split_whitespace().collect()))
    }

    /// Field `n` as proc(5) numbers them (the first after the name is field 3).
    fn field(&self, n: usize) -> Option<u64> {
        self.0.get(n.checked_sub(3)?).and_then(|f| f.parse().ok())
    }

    /// utime (field 14) and stime (15), in seconds.
    fn cpu_seconds(&self, ticks: f64) -> Option<f64> {
        Some((self.field(14)? + self.field(15)?) as f64 / ticks)
    }
}

/// `btime` of `/proc/stat`: boot time as a Unix timestamp. Read once.
fn boot_time() -> Option<u64> {
    static BOOT: OnceLock<Option<u64>> = OnceLock::new();
    *BOOT.get_or_init(|| {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        stat.lines()
            .find_map(|line| line.strip_prefix("btime "))
            .and_then(|v| v.trim().parse().ok())
    })
}

/// Raises the soft file-descriptor limit to the hard limit and returns the resulting
/// soft limit (`None`: unlimited or unknown).
pub fn raise_fd_limit() -> Option<u64> {
    let limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if let Err(error) = setrlimit(Resource::Nofile, raised) {
            tracing::warn!(%error, "cannot raise the file-descriptor limit");
        }
    }
    getrlimit(Resource::Nofile).current
}

/// The connection cap that leaves [`FD_HEADROOM`] descriptors free under `fd_limit`.
pub fn connection_cap(requested: usize, fd_limit: Option<u64>) -> usize {
    match fd_limit {
        Some(limit) => {
            let fit = usize::try_from(limit.saturating_sub(FD_HEADROOM)).unwrap_or(usize::MAX);
            requested.min(fit).max(1)
        }
        None => requested.max(1),
    }
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// `process_*`, refreshed from `/proc` when scraped.
#[derive(Debug, Default)]
pub struct ProcessMetrics {
    resident_memory: Gauge<i64>,
    virtual_memory: Gauge<i64>,
    cpu_seconds: Counter<f64, AtomicU64>,
    open_fds: Gauge<i64>,
    max_fds: Gauge<i64>,
    start_time: FloatGauge,
}

impl ProcessMetrics {
    /// Registers the `process_*` metrics (unprefixed, as other clients name them).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
            self.resident_memory.clone(),
        );
        registry.register(
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes",
            self.virtual_memory.clone(),
        );
        registry.register(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            self.cpu_seconds.clone(),
        );
        registry.register(
            "process_open_fds",
            "Number of open file descriptors",
            self.open_fds.clone(),
        );
        registry.register(
            "process_max_fds",
            "Maximum number of open file descriptors",
            self.max_fds.clone(),
        );
        registry.register(
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch in seconds",
            self.start_time.clone(),
        );
    }

    /// Reads the values from `/proc` (call it before encoding).
    pub fn refresh(&self) {
        let s = sample();
        let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        if let Some(v) = s.resident_memory_bytes {
            self.resident_memory.set(int(v));
        }
        if let Some(v) = s.virtual_memory_bytes {
            self.virtual_memory.set(int(v));
        }
        if let Some(v) = s.cpu_seconds {
            // A counter only goes up: add what was used since the last scrape.
            let seen = self.cpu_seconds.get();
            if v > seen {
                self.cpu_seconds.inc_by(v - seen);
            }
        }
        if let Some(v) = s.open_fds {
            self.open_fds.set(int(v));
        }
        self.max_fds.set(s.max_fds.map_or(-1, int));
        if let Some(v) = s.start_time_seconds {
            self.start_time.set(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let s = sample();
        assert!(s.resident_memory_bytes.unwrap() > 0);
        assert!(s.virtual_memory_bytes.unwrap() >= s.resident_memory_bytes.unwrap());
        assert!(s.open_fds.unwrap() >= 3);
        assert!(s.max_fds.unwrap() >= s.open_fds.unwrap());
        assert!(s.cpu_seconds.unwrap() >= 0.0);
        let now = jiff::Timestamp::now().as_second() as f64;
        let start = s.start_time_seconds.unwrap();
        assert!(
            start <= now + 1.0 && start > now - 86_400.0 * 365.0,
            "{start}"
        );
    }

    #[test]
    fn another_process_cpu_is_read_by_pid() {
        let ours = cpu_seconds_of(std::process::id()).unwrap();
        assert!(ours >= 0.0);
        assert!(cpu_seconds_of(u32::MAX).is_none(), "no such process");
        // A command name with spaces and a ')' does not shift the fields.
        let line = "42 (a b) c) S 1 2 3 4 5 6 7 8 9 10 250 150 0 0 20 0 1 0 77";
        let stat = Stat::of(line).unwrap();
        assert_eq!(stat.cpu_seconds(100.0), Some(4.0));
        assert_eq!(stat.field(22), Some(77));
        assert_eq!(stat.field(2), None);
    }

    #[test]
    fn connection_cap_keeps_headroom() {
        assert_eq!(connection_cap(1024, Some(1024)), 960);
        assert_eq!(connection_cap(100, Some(1024)), 100);
        assert_eq!(connection_cap(100, Some(10)), 1);
        assert_eq!(connection_cap(100, None), 100);
    }
}
