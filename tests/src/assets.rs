//! Where the control-plane binaries are, building them when they are missing.
//!
//! Order: `APPSERVICE_ASSETS_BIN` if set (must hold every binary; nothing is built then),
//! else the versioned cache directory that `tests/envtest/assets/build.sh` fills
//! (`$APPSERVICE_ASSETS_DIR` or `~/.cache/appservice-operator/k8s-<version>`, `/bin`).
//! When a binary is missing there, the build script runs (file-locked and idempotent,
//! so parallel test binaries wait for one build) and its progress goes to stderr.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// Kubernetes version of the assets, as in the cache directory's name.
pub const K8S_VERSION: &str = "1.37.2";

/// Binaries every control plane needs.
pub const PLAIN_BINARIES: &[&str] = &["etcd", "kube-apiserver", "kubectl"];
/// Binaries the full mode adds (kwok, for the simulated node, is built on first use:
/// a control plane with a real node runs without it).
pub const FULL_BINARIES: &[&str] = &["kube-controller-manager", "kube-scheduler"];

/// Binaries the real node adds ([`crate::RealNode`]): the kubelet, kube-proxy, the
/// programs of its images (hello, pause), and the registry and crane that serve and push
/// them. (metrics-server, for autoscalers, and Traefik, for Gateways, are built on first
/// use: [`crate::RealNode::metrics_server`], [`crate::RealNode::gateway`].)
pub const NODE_BINARIES: &[&str] = &[
    "kubelet",
    "kube-proxy",
    "hello",
    "pause",
    "registry",
    "crane",
];

/// Test tools built by the same script but not needed by every control plane: the Argo CD
/// health-script evaluator, the kstatus evaluator, and for the image tests the CNCF
/// distribution registry, crane (pushes images) and cosign (signs them).
/// [`tool`] builds one on first use.
pub const TOOL_BINARIES: &[&str] = &["argocd-health", "kstatus", "registry", "crane", "cosign"];

/// The path of a tool from [`TOOL_BINARIES`] (or any binary the build script makes),
/// running the build script first when it is missing from [`bin_dir`].
pub fn tool(name: &str) -> Result<PathBuf> {
    let dir = bin_dir()?;
    let path = dir.join(name);
    if path.is_file() {
        return Ok(path);
    }
    if std::env::var_os("APPSERVICE_ASSETS_BIN").is_some() {
        return Err(Error::Assets(format!(
            "APPSERVICE_ASSETS_BIN={} lacks {name}; unset it to use the cache, or run `cargo xtask assets`",
            dir.display()
        )));
    }
    let built = build(&dir, &[name])?;
    let path = built.join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::Assets(format!(
            "{} ran but {} still lacks {name}",
            build_script().display(),
            built.display()
        )))
    }
}

/// The directory of the Gateway API CRDs (`gateway.networking.k8s.io_*.yaml`), which the
/// build script copies next to the binaries (`<bin>/../gateway-api`) when it builds
/// Traefik: built on first use like a [`tool`], an error naming the command that makes
/// them when `APPSERVICE_ASSETS_BIN` is set and they are missing.
pub fn gateway_api_dir() -> Result<PathBuf> {
    let bin = bin_dir()?;
    let dir = gateway_api_dir_of(&bin);
    if holds_gateway_api_crds(&dir) {
        return Ok(dir);
    }
    let how = format!(
        "run `APPSERVICE_ASSETS_DIR={} tests/envtest/assets/build.sh --only traefik`",
        bin.parent().unwrap_or(&bin).display()
    );
    if std::env::var_os("APPSERVICE_ASSETS_BIN").is_some() {
        return Err(Error::Assets(format!(
            "APPSERVICE_ASSETS_BIN={} has no Gateway API CRDs in {}: {how}",
            bin.display(),
            dir.display()
        )));
    }
    let built = gateway_api_dir_of(&build(&bin, &["traefik"])?);
    if holds_gateway_api_crds(&built) {
        Ok(built)
    } else {
        Err(Error::Assets(format!(
            "{} ran but {} still has no Gateway API CRDs: {how}",
            build_script().display(),
            built.display()
        )))
    }
}

/// The directory of cert-manager's CRDs (`cert-manager.io_*.yaml`), copied next to the
/// binaries (`<bin>/../cert-manager`) with the Gateway API's when Traefik is built.
pub fn cert_manager_dir() -> Result<PathBuf> {
    // Both come from the same step of the build script: built, the Gateway API's are there.
    let bin = gateway_api_dir()?;
    let dir = bin.parent().unwrap_or(&bin).join("cert-manager");
    if dir.join("cert-manager.io_certificates.yaml").is_file() {
        Ok(dir)
    } else {
        Err(Error::Assets(format!(
            "{} has no cert-manager CRDs: run `tests/envtest/assets/build.sh --only traefik`",
            dir.display()
        )))
    }
}

fn gateway_api_dir_of(bin: &Path) -> PathBuf {
    bin.parent().unwrap_or(bin).join("gateway-api")
}

fn holds_gateway_api_crds(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("gateway.networking.k8s.io_") && name.ends_with(".yaml")
        })
    })
}

/// The workspace root, found at run time: the nearest directory holding a `Cargo.toml`
/// with a `[workspace]` table, above the package that cargo runs (`CARGO_MANIFEST_DIR` in
/// the environment of `cargo test`, `cargo run`, `cargo bench`), else above the current
/// directory. Never the path this crate was compiled in: with a target directory shared
/// by several clones (as in CI), a binary built in one clone would read another's files.
pub fn workspace_root() -> PathBuf {
    let start = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::current_dir().ok())
        .unwrap_or_default();
    find_workspace_root(&start).unwrap_or(start)
}

/// The nearest ancestor of `dir` (itself included) whose `Cargo.toml` has a
/// `[workspace]` table.
pub fn find_workspace_root(dir: &Path) -> Option<PathBuf> {
    dir.ancestors()
        .find(|d| {
            std::fs::read_to_string(d.join("Cargo.toml"))
                .is_ok_and(|manifest| manifest.lines().any(|l| l.trim() == "[workspace]"))
        })
        .map(Path::to_path_buf)
}

/// The asset build script.
pub fn build_script() -> PathBuf {
    workspace_root().join("tests/envtest/assets/build.sh")
}

fn default_bin_dir() -> Option<PathBuf> {
    let cache = match std::env::var_os("APPSERVICE_ASSETS_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let base = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
            base.join("appservice-operator")
                .join(format!("k8s-{K8S_VERSION}"))
        }
    };
    Some(cache.join("bin"))
}

fn missing_binaries(dir: &Path) -> Vec<&'static str> {
    PLAIN_BINARIES
        .iter()
        .chain(FULL_BINARIES)
        .copied()
        .filter(|name| !dir.join(name).is_file())
        .collect()
}

/// The directory holding kube-apiserver, etcd, kwok, ..., building them first if needed.
/// The answer (or the failure) is computed once per process.
pub fn bin_dir() -> Result<PathBuf> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| {
        locate().map_err(|e| match e {
            Error::Assets(message) => message,
            other => other.to_string(),
        })
    })
    .clone()
    .map_err(Error::Assets)
}

fn locate() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("APPSERVICE_ASSETS_BIN") {
        let dir = PathBuf::from(dir);
        let missing = missing_binaries(&dir);
        if !missing.is_empty() {
            return Err(Error::Assets(format!(
                "APPSERVICE_ASSETS_BIN={} lacks {}; unset it to use the cache, or run `cargo xtask assets`",
                dir.display(),
                missing.join(", ")
            )));
        }
        return Ok(dir);
    }
    let dir = default_bin_dir()
        .ok_or_else(|| Error::Assets("neither APPSERVICE_ASSETS_DIR nor HOME is set".to_owned()))?;
    let missing = missing_binaries(&dir);
    if missing.is_empty() {
        return Ok(dir);
    }
    build(&dir, &missing)
}

fn build(dir: &Path, missing: &[&str]) -> Result<PathBuf> {
    let script = build_script();
    let go_found = Command::new("go")
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !go_found {
        return Err(Error::Assets(format!(
            "{} missing from {} and `go` is not on PATH to build them. Install Go 1.26+ and run \
             `cargo xtask assets` (or set APPSERVICE_ASSETS_BIN to a directory holding them)",
            missing.join(", "),
            dir.display()
        )));
    }
    eprintln!(
        "harness: {} missing from {}; running {} (a cold build takes ~10 minutes)",
        missing.join(", "),
        dir.display(),
        script.display()
    );
    let out = Command::new("bash")
        .arg(&script)
        .arg("--only")
        .arg(missing.join(","))
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| Error::Assets(format!("running {}: {e}", script.display())))?;
    if !out.status.success() {
        return Err(Error::Assets(format!(
            "{} failed ({}); see its messages above, or run `cargo xtask assets`",
            script.display(),
            out.status
        )));
    }
    let printed = String::from_utf8_lossy(&out.stdout);
    let built = printed
        .lines()
        .last()
        .map(|l| PathBuf::from(l.trim()))
        .unwrap_or_else(|| dir.to_path_buf());
    let still = missing_binaries(&built);
    if !still.is_empty() {
        return Err(Error::Assets(format!(
            "{} ran but {} still lacks {}",
            script.display(),
            built.display(),
            still.join(", ")
        )));
    }
    Ok(built)
}
