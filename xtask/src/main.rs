//! Developer commands. `cargo xtask --help` lists them.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context as _, Result, anyhow, bail};
use clap::{Parser, Subcommand};

mod book;
mod cycles;
mod demo;
mod deny;
mod paths;
mod sbom;
mod test_run;
mod tools;

/// What was being done when an error happened, with the error's own message in the same
/// line: the one line printed has the cause once, and no error chain is walked.
pub(crate) trait Doing<T> {
    fn doing(self, what: impl std::fmt::Display) -> Result<T>;
}

impl<T, E: std::fmt::Display> Doing<T> for std::result::Result<T, E> {
    fn doing(self, what: impl std::fmt::Display) -> Result<T> {
        self.map_err(|e| anyhow!("{what}: {e}"))
    }
}

#[derive(Parser)]
#[command(about = "Developer commands for appservice-operator")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Write the CRDs generated from common (AppService, DatabaseClass) into the Helm chart.
    Crd {
        /// Only check that the committed file is current; exit non-zero if not.
        #[arg(long)]
        check: bool,
    },
    /// Build (or reuse from the cache) kube-apiserver, etcd, kwok, kubectl, helm, argocd-health,
    /// kstatus, and the registry, crane and cosign of the image tests.
    Assets {
        /// Rebuild even when the cache is current.
        #[arg(long)]
        force: bool,
    },
    /// Start a local control plane (etcd + kube-apiserver, CRDs installed) in the
    /// foreground and print how to reach it; Ctrl-C stops it.
    Up {
        /// Also run kube-controller-manager, kube-scheduler and a real node (containerd,
        /// the kubelet, kube-proxy) that runs the Pods.
        #[arg(long)]
        full: bool,
    },
    /// Run the whole thing locally: a full control plane, the webhook and the controller,
    /// then apply examples/ and show the AppServices becoming Ready; Ctrl-C stops it.
    Demo {
        /// Exit once every example is Ready instead of waiting for Ctrl-C.
        #[arg(long)]
        exit_when_ready: bool,
    },
    /// Build the controller-runtime baseline controller (bench/controller-runtime, Go) for
    /// the scale benchmark's `--controller-bin`, and print the binary's path.
    BuildCrBaseline,
    /// Supply-chain checks with cargo-deny (installed when missing): licenses, bans,
    /// sources, and advisories when the advisory database is reachable.
    Deny,
    /// Every supply-chain check, CI's own step: `deny`, then the checks of the SBOM,
    /// the Docker build context and the base images' pins (xtask/tests/supply_chain.rs).
    SupplyChain,
    /// The module import graph of every crate: fails on a cycle that holds a file not
    /// listed in xtask/known-cycles.txt, or when a listed file is in no cycle any more.
    Cycles,
    /// Every path the docs and the code's comments name exists, and every relative
    /// Markdown link reaches its file and heading (xtask/historical-paths.txt lists the
    /// paths of earlier releases named on purpose).
    Paths,
    /// Build the documentation (the mdBook of docs/, book.toml at the root) into
    /// target/book with mdbook (installed when missing); fails on any mdbook error or warning.
    Book,
    /// Write a CycloneDX 1.5 JSON SBOM of every package in Cargo.lock.
    Sbom {
        /// Where to write it (default: target/sbom/appservice-operator.cdx.json).
        #[arg(long)]
        output: Option<PathBuf>,
    },
    /// Build the test assets and install PostgreSQL if needed, then build every test of
    /// the workspace and run the suites side by side (the supply-chain checks are
    /// `supply-chain`, CI's own step).
    Test {
        /// How many test executables run at once.
        #[arg(long, default_value_t = test_run::DEFAULT_JOBS)]
        jobs: usize,
        /// Only this package's tests (repeatable), as `cargo test -p`.
        #[arg(short = 'p', long = "package")]
        packages: Vec<String>,
        /// Only this integration-test target (repeatable), as `cargo test --test`.
        #[arg(long = "test")]
        tests: Vec<String>,
        /// After `--`, arguments for every test executable: a test name filter,
        /// `--nocapture`.
        #[arg(last = true)]
        test_args: Vec<String>,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Cmd::Crd { check } => crd(check),
        Cmd::Assets { force } => assets(force).map(|bin| println!("{}", bin.display())),
        Cmd::Test {
            jobs,
            packages,
            tests,
            test_args,
        } => {
            let cargo_args: Vec<String> = (packages.iter().map(|p| ("-p", p)))
                .chain(tests.iter().map(|t| ("--test", t)))
                .flat_map(|(flag, v)| [flag.to_owned(), v.clone()])
                .collect();
            test(jobs, &cargo_args, &test_args)
        }
        Cmd::Deny => deny::run(&repo_root()?),
        Cmd::SupplyChain => supply_chain(),
        Cmd::Cycles => cycles::run(&repo_root()?),
        Cmd::Paths => paths::run(&repo_root()?),
        Cmd::Book => book::run(&repo_root()?),
        Cmd::Sbom { output } => sbom::run(&repo_root()?, output.as_deref()),
        Cmd::Up { full } => up(full),
        Cmd::Demo { exit_when_ready } => demo::run(&repo_root()?, exit_when_ready),
        Cmd::BuildCrBaseline => build_cr_baseline().map(|bin| println!("{}", bin.display())),
    }
}

/// The repository this command works on, found at run time: the workspace above the
/// package `cargo run` runs (the `cargo xtask` alias sets `CARGO_MANIFEST_DIR` in its
/// environment), else above the current directory, else where `cargo locate-project`
/// says. Not the path xtask was compiled in: with a target directory shared by several
/// clones, as in CI, a binary built in one clone would work on another.
fn repo_root() -> Result<PathBuf> {
    let starts = [
        std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from),
        std::env::current_dir().ok(),
    ];
    if let Some(root) = starts
        .into_iter()
        .flatten()
        .find_map(|dir| harness::assets::find_workspace_root(&dir))
    {
        return Ok(root);
    }
    let out = Command::new(tools::cargo())
        .args(["locate-project", "--workspace", "--message-format", "plain"])
        .output()
        .doing("running `cargo locate-project --workspace`")?;
    let manifest = String::from_utf8(out.stdout).doing("cargo's answer is not UTF-8")?;
    match Path::new(manifest.trim()).parent() {
        Some(root) if out.status.success() && !manifest.trim().is_empty() => Ok(root.to_owned()),
        _ => bail!("no workspace found above the current directory; run xtask in the repository"),
    }
}

fn crd(check: bool) -> Result<()> {
    let root = repo_root()?;
    for (rel, yaml, source) in common::crd::generated().doing("serializing the CRDs")? {
        let path = root.join(rel);
        if check {
            let committed =
                std::fs::read_to_string(&path).doing(format!("reading {}", path.display()))?;
            if committed != yaml {
                bail!(
                    "{} is out of date with {source}: run `cargo xtask crd`",
                    path.display()
                );
            }
            println!("{} is current", path.display());
            continue;
        }
        std::fs::write(&path, yaml).doing(format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// Builds bench/controller-runtime with `go build` into
/// `$HOME/.cache/appservice-operator/cr-baseline/` and returns the binary's path.
fn build_cr_baseline() -> Result<PathBuf> {
    let src = repo_root()?.join("bench/controller-runtime");
    let home = std::env::var_os("HOME").context("HOME is not set")?;
    let dir = PathBuf::from(home).join(".cache/appservice-operator/cr-baseline");
    std::fs::create_dir_all(&dir).doing(format!("creating {}", dir.display()))?;
    let bin = dir.join("appservice-cr-baseline");
    let status = Command::new("go")
        .current_dir(&src)
        .arg("build")
        .arg("-o")
        .arg(&bin)
        .arg(".")
        .status()
        .doing("running `go build` (is Go installed?)")?;
    if !status.success() {
        bail!("go build in {} failed ({status})", src.display());
    }
    Ok(bin)
}

/// Runs the asset build script and returns the directory holding the binaries.
pub(crate) fn assets(force: bool) -> Result<PathBuf> {
    assets_only(force, &[])
}

/// The binaries a control plane with a real node needs (`cargo xtask up --full` and
/// `demo`), as the harness names them: no chart, signing or health tools.
pub(crate) fn control_plane_assets() -> Vec<&'static str> {
    use harness::assets::{FULL_BINARIES, NODE_BINARIES, PLAIN_BINARIES};
    [PLAIN_BINARIES, FULL_BINARIES, NODE_BINARIES].concat()
}

/// [`assets`], building only `only` (every asset when empty).
pub(crate) fn assets_only(force: bool, only: &[&str]) -> Result<PathBuf> {
    let script = repo_root()?.join("tests/envtest/assets/build.sh");
    let mut cmd = Command::new("bash");
    cmd.arg(&script);
    if force {
        cmd.arg("--force");
    }
    if !only.is_empty() {
        cmd.args(["--only", &only.join(",")]);
    }
    let out = cmd
        .stderr(std::process::Stdio::inherit())
        .output()
        .doing(format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "building the test assets failed ({}); see the messages above",
            out.status
        );
    }
    let bin = String::from_utf8(out.stdout).doing("asset directory is not UTF-8")?;
    let bin = bin.lines().last().unwrap_or_default().trim();
    if bin.is_empty() {
        bail!("{} printed no asset directory", script.display());
    }
    Ok(PathBuf::from(bin))
}

/// The distribution's packages the tests and the demo run, with what shows each is
/// installed: PostgreSQL (the harness runs `/usr/lib/postgresql/<version>/bin/postgres`
/// itself) and the real node's container runtime (containerd, runc, the CNI plugins,
/// iptables, conntrack).
const PACKAGES: &[(&str, Installed)] = &[
    ("postgresql", Installed::Postgres),
    ("containerd", Installed::Program("containerd")),
    ("runc", Installed::Program("runc")),
    (
        "containernetworking-plugins",
        Installed::File("/usr/lib/cni/bridge"),
    ),
    ("iptables", Installed::Program("iptables")),
    ("conntrack", Installed::Program("conntrack")),
];

#[derive(Clone, Copy)]
enum Installed {
    Postgres,
    Program(&'static str),
    File(&'static str),
}

impl Installed {
    fn holds(self) -> bool {
        match self {
            Installed::Postgres => {
                std::env::var_os("APPSERVICE_PG_BIN").is_some() || postgres_installed()
            }
            Installed::Program(name) => std::env::var_os("PATH").is_some_and(|paths| {
                std::env::split_paths(&paths).any(|dir| dir.join(name).is_file())
            }),
            Installed::File(path) => Path::new(path).is_file(),
        }
    }
}

/// Installs the [`PACKAGES`] that are missing (Debian's apt-get, as root), without
/// starting any service they bring (a policy-rc.d refuses service starts during the
/// install: the harness runs PostgreSQL and containerd itself).
pub(crate) fn ensure_packages() -> Result<()> {
    let missing: Vec<&str> = PACKAGES
        .iter()
        .filter(|(_, installed)| !installed.holds())
        .map(|(name, _)| *name)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let list = missing.join(" ");
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    if !root {
        bail!(
            "{list} not installed and this is not root: run `sudo apt-get update && sudo apt-get install -y {list}` (PostgreSQL: or set APPSERVICE_PG_BIN to a directory holding initdb, postgres and pg_ctl)"
        );
    }
    eprintln!(
        "xtask: installing {list} (apt-get install) for the database tests and the real node"
    );
    let policy = Path::new("/usr/sbin/policy-rc.d");
    let own_policy = !policy.exists();
    if own_policy {
        std::fs::write(
            policy,
            "#!/bin/sh\n# written by cargo xtask while installing packages\nexit 101\n",
        )
        .doing("writing /usr/sbin/policy-rc.d")?;
        let _ = Command::new("chmod")
            .args(["755", "/usr/sbin/policy-rc.d"])
            .status();
    }
    let status = Command::new("sh")
        .args([
            "-c",
            &format!("apt-get update -q && apt-get install -y -q --no-install-recommends {list}"),
        ])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .doing("running apt-get");
    if own_policy {
        let _ = std::fs::remove_file(policy);
    }
    let still: Vec<&str> = PACKAGES
        .iter()
        .filter(|(_, installed)| !installed.holds())
        .map(|(name, _)| *name)
        .collect();
    if !status?.success() || !still.is_empty() {
        bail!(
            "installing {list} failed; run `apt-get update && apt-get install -y {list}` by hand"
        );
    }
    Ok(())
}

fn postgres_installed() -> bool {
    std::fs::read_dir("/usr/lib/postgresql")
        .map(|entries| {
            entries
                .flatten()
                .any(|e| e.path().join("bin/postgres").is_file())
        })
        .unwrap_or(false)
}

/// cargo-deny, then the supply-chain tests (a test target that `cargo test` leaves out
/// by default: `test = false` in xtask/Cargo.toml).
fn supply_chain() -> Result<()> {
    let root = repo_root()?;
    deny::run(&root)?;
    let status = Command::new(tools::cargo())
        .current_dir(&root)
        .args(["test", "-p", "xtask", "--test", "supply_chain"])
        .status()
        .doing("running the supply-chain tests")?;
    if !status.success() {
        bail!("supply-chain checks failed ({status})");
    }
    Ok(())
}

/// Builds the test assets, installs the packages and builds the tests side by side (the
/// Go builds and cargo share the cores; each waits on downloads the other fills), then
/// runs the suites.
fn test(jobs: usize, cargo_args: &[String], test_args: &[String]) -> Result<()> {
    let root = repo_root()?;
    let assets = std::thread::spawn(|| assets(false));
    let packages = std::thread::spawn(ensure_packages);
    let suites = test_run::build(&root, cargo_args);
    let bin = joined(assets, "the asset build")?;
    joined(packages, "the package install")?;
    let suites = suites?;
    test_run::run(
        suites,
        test_args,
        &[(
            "APPSERVICE_ASSETS_BIN".to_owned(),
            bin.display().to_string(),
        )],
        jobs,
        &target_dir(&root).join("test-logs"),
    )
}

/// The result of work done on another thread; a panic there is an error naming `what`.
pub(crate) fn joined<T>(handle: std::thread::JoinHandle<Result<T>>, what: &str) -> Result<T> {
    handle.join().map_err(|_| anyhow!("{what} panicked"))?
}

/// cargo's target directory: `CARGO_TARGET_DIR` when set, else `target/` in the workspace.
pub(crate) fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from)
}

/// Runs the harness's control plane until Ctrl-C or SIGTERM. Every component is killed
/// when this process exits, however it exits (see the harness's `process` module).
fn up(full: bool) -> Result<()> {
    let bin = assets_only(false, &control_plane_assets())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .doing("starting the tokio runtime")?;
    runtime.block_on(async move {
        let cp = harness::ControlPlane::start(harness::Options {
            full,
            audit_log: false,
            sharded_watch: false,
            real_node: full,
        })
        .await
        .doing("starting the control plane")?;
        let kubeconfig = cp.kubeconfig_path().display().to_string();
        let kubectl = bin.join("kubectl");
        println!(
            "control plane ({}) up in {:.1?}: {}",
            if full {
                "full, with a real node"
            } else {
                "etcd + kube-apiserver"
            },
            cp.startup_time(),
            cp.server_url()
        );
        println!("kubeconfig: {kubeconfig}");
        println!("logs:       {}", cp.log_dir().display());
        println!();
        println!(
            "  {} --kubeconfig {kubeconfig} get appservices -A",
            kubectl.display()
        );
        println!("or");
        println!(
            "  export KUBECONFIG={kubeconfig} PATH={}:$PATH",
            bin.display()
        );
        println!();
        println!(
            "Ctrl-C stops it (its logs stay in {}).",
            cp.log_dir().display()
        );
        stop_signal().await?;
        println!("stopping");
        drop(cp);
        Ok(())
    })
}

/// Waits for Ctrl-C or SIGTERM.
pub(crate) async fn stop_signal() -> Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .doing("installing the SIGTERM handler")?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result.doing("waiting for Ctrl-C")?,
        _ = term.recv() => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// The jobs, packages, test targets and suite arguments `argv` asks for.
    type TestArgs = (usize, Vec<String>, Vec<String>, Vec<String>);

    fn test_args(argv: &[&str]) -> TestArgs {
        match Cli::try_parse_from(argv).unwrap().command {
            Cmd::Test {
                jobs,
                packages,
                tests,
                test_args,
            } => (jobs, packages, tests, test_args),
            _ => panic!("not the test command"),
        }
    }

    fn strings(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn test_arguments_before_the_separator_are_cargos_and_after_it_the_suites() {
        let jobs = test_run::DEFAULT_JOBS;
        assert_eq!(
            test_args(&["xtask", "test", "-p", "webhook", "--", "--nocapture"]),
            (
                jobs,
                strings(&["webhook"]),
                vec![],
                strings(&["--nocapture"])
            )
        );
        assert_eq!(
            test_args(&["xtask", "test", "--jobs", "1", "--", "shards"]),
            (1, vec![], vec![], strings(&["shards"]))
        );
        assert_eq!(
            test_args(&["xtask", "test", "--test", "routes"]),
            (jobs, vec![], strings(&["routes"]), vec![])
        );
        assert_eq!(
            test_args(&["xtask", "test"]),
            (jobs, vec![], vec![], vec![])
        );
    }
}
