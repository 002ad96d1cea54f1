//! `cargo xtask test`'s runner: every test executable of the workspace built once by one
//! `cargo test --no-run`, then run side by side, a few at a time.
//!
//! Most suites spend their time waiting on a control plane (an informer's first list, a
//! Lease that expires, the API server's answer), not on a core, so on 2 cores several run
//! in about the time one took. `cargo test` runs them one after another. Each executable
//! runs as `cargo test` would run it (in its package's directory, with
//! `CARGO_MANIFEST_DIR`), its output kept in a file of its own and printed whole when it
//! ends, so outputs never interleave: a suite that passed shows its `test result:` line,
//! one that failed shows everything it printed. Every suite runs even after one fails; the
//! command fails at the end, naming the suites that failed.
//!
//! The longest suites start first, by the durations the last run here recorded
//! (`~/.cache/appservice-operator/test-seconds`; unknown suites count as the longest), so
//! the last to finish is a short one. A suite still running after [`SUITE_LIMIT`] is
//! killed and fails: a hang costs one suite, not CI's whole budget.

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use crate::Doing;

/// How long one suite may run before it is killed and fails. The longest suite takes
/// about 5 minutes on 2 busy cores.
pub const SUITE_LIMIT: Duration = Duration::from_secs(25 * 60);

/// How many suites run at once unless `--jobs` says otherwise: more than the 2 cores of
/// the reference machine, because most of a suite's time is waiting.
pub const DEFAULT_JOBS: usize = 4;

/// Suites whose tests each wait out the shipped intervals (a hold's one-minute recheck,
/// a tag's resolve interval) with a controller and a registry of their own, so that
/// libtest's one test per core leaves the cores idle: this many of their tests run at
/// once (`RUST_TEST_THREADS`), unless `--test-threads` is given.
const WAITING_SUITES: &[(&str, usize)] = &[("controller/tests/images.rs", 8)];

/// How often the runner says what is still running.
const PROGRESS_EVERY: Duration = Duration::from_secs(60);

/// One test executable cargo built.
#[derive(Debug, Clone, PartialEq)]
pub struct Suite {
    /// The source file of its crate root, relative to the workspace: `controller/tests/shards.rs`,
    /// `controller/core/src/lib.rs`.
    pub name: String,
    pub executable: PathBuf,
    pub manifest_dir: PathBuf,
}

/// The test executables in `cargo test --no-run --message-format=json` output: the
/// artifacts built with the test profile that have an executable, once each.
pub fn suites_in(messages: &str, root: &Path) -> Vec<Suite> {
    let mut seen = HashSet::new();
    let mut suites = Vec::new();
    for line in messages.lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" || msg["profile"]["test"] != true {
            continue;
        }
        let (Some(executable), Some(src), Some(manifest)) = (
            msg["executable"].as_str(),
            msg["target"]["src_path"].as_str(),
            msg["manifest_path"].as_str(),
        ) else {
            continue;
        };
        if !seen.insert(executable.to_owned()) {
            continue;
        }
        let src = Path::new(src);
        let name = src.strip_prefix(root).unwrap_or(src).display().to_string();
        let manifest_dir = Path::new(manifest)
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| root.to_path_buf());
        suites.push(Suite {
            name,
            executable: PathBuf::from(executable),
            manifest_dir,
        });
    }
    suites
}

/// Builds every test executable (`cargo_args` select packages or targets, as for `cargo
/// test`) and returns them.
pub fn build(root: &Path, cargo_args: &[String]) -> Result<Vec<Suite>> {
    let out = Command::new(crate::tools::cargo())
        .current_dir(root)
        .args([
            "test",
            "--workspace",
            "--lib",
            "--bins",
            "--tests",
            // Examples are compiled (they must build), not run: their profile is not
            // the test profile, so `suites_in` leaves them out.
            "--examples",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .args(cargo_args)
        .stderr(Stdio::inherit())
        .output()
        .doing("running cargo test --no-run")?;
    if !out.status.success() {
        bail!("building the tests failed ({})", out.status);
    }
    Ok(suites_in(&String::from_utf8_lossy(&out.stdout), root))
}

/// The durations the last runs recorded, by suite name.
fn timings_file() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .map(|h| PathBuf::from(h).join(".cache/appservice-operator/test-seconds"))
}

/// `seconds<TAB>name` lines; anything else is skipped.
pub fn parse_timings(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter_map(|line| {
            let (secs, name) = line.split_once('\t')?;
            Some((name.to_owned(), secs.parse().ok()?))
        })
        .collect()
}

fn format_timings(timings: &BTreeMap<String, f64>) -> String {
    timings
        .iter()
        .map(|(name, secs)| format!("{secs:.1}\t{name}\n"))
        .collect()
}

/// The order suites start in: the longest first by `timings`, unknown ones before all
/// (they may be long), ties by name.
pub fn schedule(mut suites: Vec<Suite>, timings: &BTreeMap<String, f64>) -> Vec<Suite> {
    let expected = |s: &Suite| timings.get(&s.name).copied().unwrap_or(f64::INFINITY);
    suites.sort_by(|a, b| {
        expected(b)
            .total_cmp(&expected(a))
            .then_with(|| a.name.cmp(&b.name))
    });
    suites
}

/// The counts of libtest's `test result:` lines in `output`, summed: passed, failed,
/// ignored.
pub fn counts(output: &str) -> (u64, u64, u64) {
    let mut sum = (0, 0, 0);
    for line in output.lines().filter(|l| l.starts_with("test result:")) {
        for part in line.split([';', '.']) {
            let mut words = part.split_whitespace().rev();
            let (Some(what), Some(n)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(n) = n.parse::<u64>() else { continue };
            match what {
                "passed" => sum.0 += n,
                "failed" => sum.1 += n,
                "ignored" => sum.2 += n,
                _ => {}
            }
        }
    }
    sum
}

struct Running {
    suite: Suite,
    child: Child,
    started: Instant,
    log: PathBuf,
}

/// How one suite ended.
struct Outcome {
    name: String,
    passed: bool,
    seconds: f64,
    counts: (u64, u64, u64),
}

fn start(
    suite: Suite,
    test_args: &[String],
    env: &[(String, String)],
    logs: &Path,
) -> Result<Running> {
    let log = logs.join(format!("{}.log", suite.name.replace('/', "__")));
    let out = File::create(&log).doing(format!("creating {}", log.display()))?;
    let err = out
        .try_clone()
        .doing(format!("opening {} twice", log.display()))?;
    let mut command = Command::new(&suite.executable);
    if let Some((_, threads)) = WAITING_SUITES.iter().find(|(name, _)| *name == suite.name)
        && !test_args.iter().any(|a| a.starts_with("--test-threads"))
    {
        command.env("RUST_TEST_THREADS", threads.to_string());
    }
    let child = command
        .args(test_args)
        .current_dir(&suite.manifest_dir)
        .env("CARGO_MANIFEST_DIR", &suite.manifest_dir)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .doing(format!("starting {}", suite.executable.display()))?;
    Ok(Running {
        suite,
        child,
        started: Instant::now(),
        log,
    })
}

/// Prints what a suite that ended printed (whole when it failed, its result lines when
/// it passed) and returns how it ended.
fn finish(run: Running, status: Option<std::process::ExitStatus>) -> Outcome {
    let seconds = run.started.elapsed().as_secs_f64();
    let output = std::fs::read_to_string(&run.log).unwrap_or_else(|e| {
        format!(
            "(its output in {} could not be read: {e})",
            run.log.display()
        )
    });
    let passed = status.is_some_and(|s| s.success());
    let counts = counts(&output);
    if passed {
        for line in output.lines().filter(|l| l.starts_with("test result:")) {
            println!("{line}");
        }
        println!("ok   {} ({seconds:.1} s)", run.suite.name);
    } else {
        println!("---- {} printed ----", run.suite.name);
        println!("{output}");
        let why = match status {
            Some(s) => format!("{s}"),
            None => format!("killed after {} s", SUITE_LIMIT.as_secs()),
        };
        println!("FAILED {} ({why}, {seconds:.1} s)", run.suite.name);
    }
    Outcome {
        name: run.suite.name,
        passed,
        seconds,
        counts,
    }
}

/// Runs `suites`, `jobs` at a time, each with `test_args` and `env`; fails naming every
/// suite that failed.
pub fn run(
    suites: Vec<Suite>,
    test_args: &[String],
    env: &[(String, String)],
    jobs: usize,
    logs: &Path,
) -> Result<()> {
    std::fs::create_dir_all(logs).doing(format!("creating {}", logs.display()))?;
    let file = timings_file();
    let mut timings = file
        .as_ref()
        .and_then(|f| std::fs::read_to_string(f).ok())
        .map(|t| parse_timings(&t))
        .unwrap_or_default();
    let total = suites.len();
    let mut pending = schedule(suites, &timings).into_iter();
    let jobs = jobs.max(1);
    println!(
        "running {total} test suites, {jobs} at a time; each one's output is in {}",
        logs.display()
    );
    let started = Instant::now();
    let mut last_progress = Instant::now();
    let mut running: Vec<Running> = Vec::new();
    let mut outcomes: Vec<Outcome> = Vec::new();
    loop {
        while running.len() < jobs {
            let Some(suite) = pending.next() else { break };
            running.push(start(suite, test_args, env, logs)?);
        }
        if running.is_empty() {
            break;
        }
        let mut i = 0;
        while i < running.len() {
            let status = running[i]
                .child
                .try_wait()
                .doing(format!("waiting for {}", running[i].suite.name))?;
            let over = running[i].started.elapsed() > SUITE_LIMIT;
            if status.is_none() && !over {
                i += 1;
                continue;
            }
            let mut run = running.swap_remove(i);
            if status.is_none() {
                // The harness's components die with the suite's process however it dies.
                let _ = run.child.kill();
                let _ = run.child.wait();
            }
            outcomes.push(finish(run, status));
        }
        if last_progress.elapsed() >= PROGRESS_EVERY && !running.is_empty() {
            last_progress = Instant::now();
            let now: Vec<String> = running
                .iter()
                .map(|r| format!("{} ({} s)", r.suite.name, r.started.elapsed().as_secs()))
                .collect();
            println!(
                "[{} s] {} of {total} suites ended; running: {}",
                started.elapsed().as_secs(),
                outcomes.len(),
                now.join(", ")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    for o in &outcomes {
        timings.insert(o.name.clone(), o.seconds);
    }
    if let Some(f) = file {
        let _ = std::fs::write(f, format_timings(&timings));
    }
    let sum = outcomes.iter().fold((0, 0, 0), |a, o| {
        (a.0 + o.counts.0, a.1 + o.counts.1, a.2 + o.counts.2)
    });
    let busy: f64 = outcomes.iter().map(|o| o.seconds).sum();
    println!(
        "\n{total} test suites: {} passed, {} failed, {} ignored tests; {busy:.0} s of suites in {:.0} s",
        sum.0,
        sum.1,
        sum.2,
        started.elapsed().as_secs_f64()
    );
    let failed: Vec<&str> = outcomes
        .iter()
        .filter(|o| !o.passed)
        .map(|o| o.name.as_str())
        .collect();
    if !failed.is_empty() {
        bail!(
            "{} test suite(s) failed: {}",
            failed.len(),
            failed.join(", ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn suite(name: &str) -> Suite {
        Suite {
            name: name.into(),
            executable: PathBuf::from(format!("/t/{name}")),
            manifest_dir: PathBuf::from("/w"),
        }
    }

    #[test]
    fn only_test_profile_artifacts_with_an_executable_are_suites() {
        let messages = [
            r#"{"reason":"compiler-artifact","manifest_path":"/w/controller/Cargo.toml","target":{"src_path":"/w/controller/tests/shards.rs"},"profile":{"test":true},"executable":"/t/shards-1"}"#,
            // The same executable again (cargo reports fresh artifacts too).
            r#"{"reason":"compiler-artifact","manifest_path":"/w/controller/Cargo.toml","target":{"src_path":"/w/controller/tests/shards.rs"},"profile":{"test":true},"executable":"/t/shards-1"}"#,
            // A library built for a test, not a test.
            r#"{"reason":"compiler-artifact","manifest_path":"/w/common/Cargo.toml","target":{"src_path":"/w/common/src/lib.rs"},"profile":{"test":false},"executable":null}"#,
            // An example: compiled, not run.
            r#"{"reason":"compiler-artifact","manifest_path":"/w/webhook/Cargo.toml","target":{"src_path":"/w/webhook/examples/x.rs"},"profile":{"test":false},"executable":"/t/x"}"#,
            r#"{"reason":"build-finished","success":true}"#,
            "not json",
        ]
        .join("\n");
        let suites = suites_in(&messages, Path::new("/w"));
        assert_eq!(
            suites,
            vec![Suite {
                name: "controller/tests/shards.rs".into(),
                executable: PathBuf::from("/t/shards-1"),
                manifest_dir: PathBuf::from("/w/controller"),
            }]
        );
    }

    #[test]
    fn the_longest_and_the_unknown_start_first() {
        let timings = parse_timings("10.0\ta\n300.5\tb\nnonsense\n2\tc\n");
        assert_eq!(timings.len(), 3);
        let order: Vec<String> = schedule(
            vec![suite("a"), suite("b"), suite("c"), suite("new")],
            &timings,
        )
        .into_iter()
        .map(|s| s.name)
        .collect();
        assert_eq!(order, ["new", "b", "a", "c"]);
        assert_eq!(parse_timings(&format_timings(&timings)), timings);
    }

    #[test]
    fn every_waiting_suite_exists() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for (name, _) in WAITING_SUITES {
            assert!(root.join(name).is_file(), "{name} names no test file");
        }
    }

    #[test]
    fn result_lines_are_summed() {
        let output = "running 3 tests\n\
            test result: ok. 13 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 173.65s\n\
            noise passed\n\
            test result: FAILED. 2 passed; 3 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.00s\n";
        assert_eq!(counts(output), (15, 3, 1));
        assert_eq!(counts("no result at all"), (0, 0, 0));
    }
}
