//! The files in examples/ are what the README points users at: the valid ones pass
//! validation, and each invalid one fails with exactly the errors it declares in its
//! `# expect-error:` comment lines.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code

use std::path::{Path, PathBuf};

use common::AppService;
use common::validation::validate;

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

fn load(path: &Path) -> (String, AppService) {
    let text = std::fs::read_to_string(path).expect("example readable");
    let app = serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (text, app)
}

#[test]
fn valid_examples_pass() {
    let files = yaml_files(&examples_dir());
    assert!(
        files.len() >= 2,
        "expected the valid examples, found {files:?}"
    );
    for path in files {
        let (_, app) = load(&path);
        assert_eq!(validate(&app, None), Ok(vec![]), "{}", path.display());
    }
}

#[test]
fn minimal_example_relies_on_defaults() {
    let (_, app) = load(&examples_dir().join("minimal.yaml"));
    assert_eq!(app.spec.replicas, None);
    assert_eq!(app.spec.port, None);
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
        let (text, app) = load(&path);
        let expected: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# expect-error: "))
            .collect();
        assert!(
            !expected.is_empty(),
            "{} declares no expect-error line",
            path.display()
        );
        let errors =
            validate(&app, None).expect_err(&format!("{} must be invalid", path.display()));
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
