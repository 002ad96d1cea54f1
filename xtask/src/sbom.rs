//! `cargo xtask sbom`: a CycloneDX 1.5 JSON bill of materials of the workspace, from
//! `Cargo.lock` (every package it pins, with its checksum and dependencies) and `cargo
//! metadata` (each package's license). The output is deterministic: the same lock gives
//! the same bytes (no timestamp; the serial number is derived from the lock's hash).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use anyhow::{Result, bail};
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::Doing;

/// The one registry the lock may name (cargo-deny's `sources` check enforces it).
const CRATES_IO: &str = "registry+https://github.com/rust-lang/crates.io-index";

/// One `[[package]]` of Cargo.lock.
#[derive(Debug)]
pub struct LockedPackage {
    pub name: String,
    pub version: String,
    pub source: Option<String>,
    pub checksum: Option<String>,
    pub dependencies: Vec<String>,
}

/// The packages Cargo.lock pins, in its order.
pub fn read_lock(text: &str) -> Result<Vec<LockedPackage>> {
    let doc = toml_edit::Document::parse(text).doing("parsing Cargo.lock")?;
    let Some(packages) = doc.get("package").and_then(|p| p.as_array_of_tables()) else {
        bail!("Cargo.lock has no [[package]]");
    };
    let string =
        |t: &toml_edit::Table, key: &str| t.get(key).and_then(|v| v.as_str()).map(str::to_owned);
    packages
        .iter()
        .map(|t| {
            let (Some(name), Some(version)) = (string(t, "name"), string(t, "version")) else {
                bail!("Cargo.lock: a [[package]] without name or version");
            };
            let dependencies = t
                .get("dependencies")
                .and_then(|d| d.as_array())
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            Ok(LockedPackage {
                source: string(t, "source"),
                checksum: string(t, "checksum"),
                name,
                version,
                dependencies,
            })
        })
        .collect()
}

/// What `cargo metadata` says of a package that the lock does not.
#[derive(Debug, Deserialize)]
struct MetadataPackage {
    id: String,
    name: String,
    version: String,
    license: Option<String>,
    license_file: Option<String>,
    description: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Metadata {
    packages: Vec<MetadataPackage>,
    workspace_members: Vec<String>,
}

/// cargo's old `MIT/Apache-2.0` form is not an SPDX expression: `/` meant OR.
fn spdx(license: &str) -> String {
    license
        .split('/')
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" OR ")
}

/// `pkg:cargo/<name>@<version>` (package-url's cargo type).
pub fn purl(name: &str, version: &str) -> String {
    format!("pkg:cargo/{name}@{version}")
}

fn bom_ref(name: &str, version: &str) -> String {
    format!("{name}@{version}")
}

/// A UUID (version 5 layout) from the lock's hash: one lock, one serial number.
fn serial(lock: &[u8]) -> String {
    let hash = Sha256::digest(lock);
    let mut b = [0u8; 16];
    b.copy_from_slice(&hash[..16]);
    b[6] = (b[6] & 0x0f) | 0x50;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "urn:uuid:{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The SBOM of the workspace at `root`, as JSON.
pub fn generate(root: &Path) -> Result<Value> {
    let lock_path = root.join("Cargo.lock");
    let lock_text =
        std::fs::read_to_string(&lock_path).doing(format!("reading {}", lock_path.display()))?;
    let lock = read_lock(&lock_text)?;

    let out = Command::new(crate::tools::cargo())
        .current_dir(root)
        // Every feature and platform: the lock pins packages for all of them.
        .args([
            "metadata",
            "--format-version",
            "1",
            "--locked",
            "--all-features",
        ])
        .output()
        .doing("running cargo metadata")?;
    if !out.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let metadata: Metadata =
        serde_json::from_slice(&out.stdout).doing("parsing cargo metadata's output")?;
    let described: BTreeMap<(&str, &str), &MetadataPackage> = metadata
        .packages
        .iter()
        .map(|p| ((p.name.as_str(), p.version.as_str()), p))
        .collect();

    // A dependency entry is `name`, `name version` or `name version (source)`; a bare
    // name means the only locked package of that name.
    let versions: BTreeMap<&str, Vec<&str>> = lock.iter().fold(BTreeMap::new(), |mut m, p| {
        m.entry(p.name.as_str())
            .or_insert_with(Vec::new)
            .push(p.version.as_str());
        m
    });
    let resolve = |entry: &str| -> Result<String> {
        let mut parts = entry.split_whitespace();
        let name = parts.next().unwrap_or_default();
        let version = match parts.next() {
            Some(v) => v.to_owned(),
            None => match versions.get(name).map(Vec::as_slice) {
                Some([only]) => (*only).to_owned(),
                _ => bail!("Cargo.lock: dependency {entry:?} names no single package"),
            },
        };
        Ok(bom_ref(name, &version))
    };

    let mut components = Vec::new();
    let mut dependencies = Vec::new();
    for package in &lock {
        let info = described.get(&(package.name.as_str(), package.version.as_str()));
        let license = match info {
            Some(MetadataPackage {
                license: Some(l), ..
            }) => json!([{"expression": spdx(l)}]),
            Some(MetadataPackage {
                license_file: Some(f),
                ..
            }) => json!([{"license": {"name": format!("see {f}")}}]),
            _ => bail!(
                "{} {}: cargo metadata names no license (license or license-file)",
                package.name,
                package.version
            ),
        };
        let mut component = json!({
            "type": "library",
            "bom-ref": bom_ref(&package.name, &package.version),
            "name": package.name,
            "version": package.version,
            "purl": purl(&package.name, &package.version),
            "licenses": license,
        });
        if let Some(description) = info.and_then(|i| i.description.as_deref()) {
            component["description"] = json!(description.trim());
        }
        match package.source.as_deref() {
            Some(CRATES_IO) => {
                component["externalReferences"] = json!([{
                    "type": "distribution",
                    "url": format!("https://crates.io/api/v1/crates/{}/{}/download", package.name, package.version),
                }]);
            }
            Some(other) => bail!(
                "{} {} comes from {other}, not crates.io",
                package.name,
                package.version
            ),
            // A workspace member: built from this repository.
            None => component["type"] = json!("application"),
        }
        if let Some(checksum) = &package.checksum {
            component["hashes"] = json!([{"alg": "SHA-256", "content": checksum}]);
        }
        components.push(component);
        let depends_on = package
            .dependencies
            .iter()
            .map(|d| resolve(d))
            .collect::<Result<Vec<_>>>()?;
        dependencies.push(json!({
            "ref": bom_ref(&package.name, &package.version),
            "dependsOn": depends_on,
        }));
    }
    let members: Vec<String> = metadata
        .workspace_members
        .iter()
        .filter_map(|id| {
            metadata
                .packages
                .iter()
                .find(|p| &p.id == id)
                .map(|p| bom_ref(&p.name, &p.version))
        })
        .collect();
    let version = env!("CARGO_PKG_VERSION");
    dependencies.push(json!({
        "ref": bom_ref("appservice-operator", version),
        "dependsOn": members,
    }));
    Ok(json!({
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": serial(lock_text.as_bytes()),
        "version": 1,
        "metadata": {
            "tools": {"components": [{"type": "application", "name": "appservice-operator xtask sbom", "version": version}]},
            "component": {
                "type": "application",
                "bom-ref": bom_ref("appservice-operator", version),
                "name": "appservice-operator",
                "version": version,
                "licenses": [{"expression": "Apache-2.0"}],
            },
        },
        "components": components,
        "dependencies": dependencies,
    }))
}

/// `cargo xtask sbom [--output FILE]`: writes the SBOM (default
/// `target/sbom/appservice-operator.cdx.json` under the workspace) and says where.
pub fn run(root: &Path, output: Option<&Path>) -> Result<()> {
    let bom = generate(root)?;
    let path = output.map_or_else(
        || root.join("target/sbom/appservice-operator.cdx.json"),
        Path::to_path_buf,
    );
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).doing(format!("creating {}", dir.display()))?;
    }
    let text = serde_json::to_string_pretty(&bom).doing("serializing the SBOM")? + "\n";
    std::fs::write(&path, text).doing(format!("writing {}", path.display()))?;
    let count = bom["components"].as_array().map_or(0, Vec::len);
    println!("wrote {} (CycloneDX 1.5, {count} packages)", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn licenses_become_spdx_expressions() {
        assert_eq!(spdx("MIT/Apache-2.0"), "MIT OR Apache-2.0");
        assert_eq!(spdx("MIT OR Apache-2.0"), "MIT OR Apache-2.0");
    }

    #[test]
    fn the_serial_number_is_a_uuid_of_the_lock() {
        let a = serial(b"lock a");
        assert_eq!(a, serial(b"lock a"));
        assert_ne!(a, serial(b"lock b"));
        let uuid = a.strip_prefix("urn:uuid:").unwrap();
        let groups: Vec<usize> = uuid.split('-').map(str::len).collect();
        assert_eq!(groups, [8, 4, 4, 4, 12]);
        assert_eq!(&uuid[14..15], "5", "version 5 layout");
    }
}
