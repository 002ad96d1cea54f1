//! The files in examples/ are what the README points users at: the valid ones pass
//! validation, and each invalid one fails with exactly the errors it declares in its
//! `# expect-error:` comment lines.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code

use std::path::{Path, PathBuf};

use common::conversion::Version;
use common::validation::{FieldErrors, Warnings, validate, validate_v1alpha1};
use common::{AppService, v1alpha1};

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

/// An example in either version, as the hub (for its fields) and with its version's
/// validation result.
struct Example {
    hub: AppService,
    validation: Result<Warnings, FieldErrors>,
}

fn load(path: &Path) -> (String, Example) {
    let text = std::fs::read_to_string(path).expect("example readable");
    let value: serde_json::Value =
        serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let version = Version::from_api_version(value["apiVersion"].as_str().unwrap_or_default())
        .unwrap_or_else(|| panic!("{}: unknown apiVersion", path.display()));
    let example = match version {
        Version::V1alpha1 => {
            let app: v1alpha1::AppService = serde_json::from_value(value).expect("v1alpha1");
            Example {
                validation: validate_v1alpha1(&app, None),
                hub: common::conversion::to_v1beta1(&app),
            }
        }
        Version::V1beta1 => {
            let app: AppService = serde_json::from_value(value).expect("v1beta1");
            Example {
                validation: validate(&app, None),
                hub: app,
            }
        }
    };
    (text, example)
}

#[test]
fn valid_examples_pass() {
    let files = yaml_files(&examples_dir());
    assert!(
        files.len() >= 2,
        "expected the valid examples, found {files:?}"
    );
    for path in files {
        let (_, example) = load(&path);
        assert_eq!(example.validation, Ok(vec![]), "{}", path.display());
    }
}

#[test]
fn minimal_example_relies_on_defaults() {
    let (_, example) = load(&examples_dir().join("minimal.yaml"));
    let app = example.hub;
    assert_eq!(app.spec.replicas, None);
    assert_eq!(app.spec.ports, vec![]);
    assert_eq!((app.spec.replicas(), app.spec.port()), (1, 8080));
}

#[test]
fn invalid_examples_fail_with_declared_errors() {
    let files = yaml_files(&examples_dir().join("invalid"));
    assert!(
        files.len() >= 3,
        "expected invalid examples, found {files:?}"
    );
    for path in files {
        let (text, example) = load(&path);
        let expected: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# expect-error: "))
            .collect();
        assert!(
            !expected.is_empty(),
            "{} declares no expect-error line",
            path.display()
        );
        let errors = example
            .validation
            .expect_err(&format!("{} must be invalid", path.display()));
        let actual: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(
            actual.len(),
            expected.len(),
            "{}: {actual:#?}",
            path.display()
        );
        for (want, got) in expected.iter().zip(&actual) {
            assert!(
                got.starts_with(want),
                "{}: expected {want:?}, got {got:?}",
                path.display()
            );
        }
    }
}
