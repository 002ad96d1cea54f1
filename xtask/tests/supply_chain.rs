//! The project's supply-chain files, checked from their consumers' side: the SBOM that
//! `cargo xtask sbom` writes (every package of Cargo.lock, with version, license and
//! purl), the Docker build context that `.dockerignore` admits (read with Docker's
//! rules: an allow-list that keeps untracked keys out), and the Dockerfile's base images
//! (pinned by digest).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// `(name, version) -> source` of every `[[package]]` of Cargo.lock.
fn locked() -> BTreeMap<(String, String), Option<String>> {
    let text = std::fs::read_to_string(root().join("Cargo.lock")).unwrap();
    let doc = toml_edit::Document::parse(text).unwrap();
    doc["package"]
        .as_array_of_tables()
        .unwrap()
        .iter()
        .map(|t| {
            let s = |k: &str| t.get(k).and_then(|v| v.as_str()).map(str::to_owned);
            ((s("name").unwrap(), s("version").unwrap()), s("source"))
        })
        .collect()
}

#[test]
fn the_sbom_lists_every_locked_package_with_version_license_and_purl() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sbom.json");
    let run = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .current_dir(root())
        .arg("sbom")
        .arg("--output")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let bom: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(bom["bomFormat"], "CycloneDX");
    assert_eq!(bom["specVersion"], "1.5");
    assert!(
        bom["serialNumber"]
            .as_str()
            .unwrap()
            .starts_with("urn:uuid:")
    );

    let lock = locked();
    let components = bom["components"].as_array().unwrap();
    let mut seen = BTreeSet::new();
    for c in components {
        let name = c["name"].as_str().unwrap().to_owned();
        let version = c["version"].as_str().unwrap().to_owned();
        let key = (name.clone(), version.clone());
        assert!(
            lock.contains_key(&key),
            "{name} {version} is not in Cargo.lock"
        );
        assert!(seen.insert(key.clone()), "{name} {version} listed twice");
        assert_eq!(c["purl"], format!("pkg:cargo/{name}@{version}"));
        let license = &c["licenses"][0];
        let text = license["expression"]
            .as_str()
            .or(license["license"]["name"].as_str())
            .unwrap_or_default();
        assert!(!text.is_empty(), "{name} {version}: no license");
        assert!(
            !text.contains('/'),
            "{name}: {text:?} is not an SPDX expression"
        );
        match &lock[&key] {
            Some(_) => {
                assert_eq!(c["type"], "library", "{name}");
                assert_eq!(c["hashes"][0]["alg"], "SHA-256", "{name}");
                assert_eq!(c["hashes"][0]["content"].as_str().unwrap().len(), 64);
            }
            None => assert_eq!(c["type"], "application", "{name} is a workspace member"),
        }
    }
    assert_eq!(
        seen.len(),
        lock.len(),
        "every locked package is in the SBOM"
    );
    assert!(lock.len() > 400, "{} packages: the real lock", lock.len());

    // The dependency graph names only components (and the root).
    let refs: BTreeSet<&str> = components
        .iter()
        .map(|c| c["bom-ref"].as_str().unwrap())
        .chain([bom["metadata"]["component"]["bom-ref"].as_str().unwrap()])
        .collect();
    for dep in bom["dependencies"].as_array().unwrap() {
        assert!(refs.contains(dep["ref"].as_str().unwrap()));
        for on in dep["dependsOn"].as_array().unwrap() {
            assert!(refs.contains(on.as_str().unwrap()), "{on}");
        }
    }
    let root_deps = bom["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["ref"] == bom["metadata"]["component"]["bom-ref"])
        .unwrap();
    assert!(
        root_deps["dependsOn"]
            .as_array()
            .unwrap()
            .contains(&Value::from("appservice-webhook@0.1.0"))
    );
    // The same lock gives the same bytes.
    let again = dir.path().join("again.json");
    let rerun = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .current_dir(root())
        .args(["sbom", "--output"])
        .arg(&again)
        .output()
        .unwrap();
    assert!(rerun.status.success());
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&again).unwrap());
}

/// Docker's `.dockerignore` rules for the patterns this file may use: a path is left
/// out when the last pattern matching it or one of its parent directories is not a `!`
/// pattern. Patterns are `*`, a literal path, or `**/` followed by a literal or `*.ext`.
struct DockerIgnore(Vec<(bool, String)>);

impl DockerIgnore {
    fn read(path: &Path) -> Self {
        let text = std::fs::read_to_string(path).unwrap();
        let patterns = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| {
                let (negated, p) = match l.strip_prefix('!') {
                    Some(p) => (true, p),
                    None => (false, l),
                };
                let p = p.trim_end_matches('/').to_owned();
                let supported = p == "*"
                    || !p.contains('*')
                    || p.strip_prefix("**/").is_some_and(|rest| {
                        !rest.contains('/')
                            && (!rest.contains('*')
                                || rest.strip_prefix("*.").is_some_and(|e| !e.contains('*')))
                    });
                assert!(supported, "pattern {l:?}: this test does not model it");
                (negated, p)
            })
            .collect();
        DockerIgnore(patterns)
    }

    fn matches(pattern: &str, path: &str) -> bool {
        if pattern == "*" {
            return !path.contains('/');
        }
        if let Some(rest) = pattern.strip_prefix("**/") {
            let last = path.rsplit('/').next().unwrap_or(path);
            return match rest.strip_prefix("*.") {
                Some(ext) => last.ends_with(&format!(".{ext}")),
                None => last == rest,
            };
        }
        pattern == path
    }

    fn admits(&self, path: &str) -> bool {
        let mut candidates = vec![path.to_owned()];
        let mut dir = path;
        while let Some((parent, _)) = dir.rsplit_once('/') {
            candidates.push(parent.to_owned());
            dir = parent;
        }
        let mut excluded = false;
        for (negated, pattern) in &self.0 {
            if candidates.iter().any(|c| Self::matches(pattern, c)) {
                excluded = !negated;
            }
        }
        !excluded
    }
}

#[test]
fn the_docker_build_context_is_an_allow_list() {
    let ignore = DockerIgnore::read(&root().join(".dockerignore"));
    assert_eq!(
        ignore.0.first(),
        Some(&(false, "*".to_owned())),
        "starts by leaving everything out"
    );

    // What a build needs: the workspace manifests, the lock, and every member's files.
    let out = Command::new("git")
        .current_dir(root())
        .args(["ls-files"])
        .output()
        .expect("git ls-files");
    let tracked: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert!(!tracked.is_empty());
    let text = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let manifest = toml_edit::Document::parse(text).unwrap();
    let members: Vec<String> = manifest["workspace"]["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap().to_owned())
        .collect();
    for needed in ["Cargo.toml", "Cargo.lock", ".cargo/config.toml"] {
        assert!(ignore.admits(needed), "{needed} is needed by the build");
    }
    for path in &tracked {
        let member = members.iter().any(|m| path.starts_with(&format!("{m}/")));
        if member {
            assert!(ignore.admits(path), "{path} belongs to a workspace member");
        }
    }
    // What it does not need stays out, tracked or not.
    for path in [
        "README.md",
        "docs/runbooks.md",
        "charts/appservice-operator/values.yaml",
        "examples/appservice.yaml",
        ".ci/run",
        ".git/config",
        "Dockerfile",
    ] {
        assert!(!ignore.admits(path), "{path} is not needed by the build");
    }
    // Untracked keys and build output, wherever they are.
    for path in [
        "certs-dev/ca.key",
        "certs-dev/tls.crt",
        "certs-dev",
        "target/release/appservice-webhook",
        "webhook/target/debug/x",
        "webhook/dev.key",
        "controller/tests/client.pem",
        "some-secret.env",
        ".env",
    ] {
        assert!(
            !ignore.admits(path),
            "{path} must stay out of the build context"
        );
    }
}

#[test]
fn base_images_are_pinned_by_digest() {
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    let froms: Vec<&str> = dockerfile
        .lines()
        .filter(|l| l.trim_start().to_ascii_uppercase().starts_with("FROM "))
        .collect();
    assert_eq!(froms.len(), 2, "{froms:?}");
    for line in froms {
        let image = line.split_whitespace().nth(1).unwrap();
        let (_, digest) = image
            .split_once("@sha256:")
            .unwrap_or_else(|| panic!("{line}: not pinned by digest"));
        assert!(
            digest.len() == 64
                && digest
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()),
            "{line}: a digest is 64 lowercase hex digits"
        );
    }
}
