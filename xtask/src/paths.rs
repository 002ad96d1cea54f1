//! `cargo xtask paths`: every path the documentation and the code's comments name exists,
//! and every relative Markdown link reaches a file (and its heading, when it names one).
//!
//! What counts as a path: in a Markdown file, any run of `[A-Za-z0-9_./-]` with a `/` in
//! it whose first component is a top-level directory of the repository (`controller/…`,
//! `docs/…`); in a source file (`.rs`, `.go`, `.toml`, `.yaml`, `.sh`, `Dockerfile`), the
//! same inside its comments (after `//` or `#`). A run followed by `*`, `{` or `<` is a
//! pattern, not a path. A path resolves from the repository's root, from the crate of the
//! file that names it (`tests/supply_chain.rs` in `xtask/src/main.rs`), or from the file's own
//! directory.
//!
//! Shorter paths (`shard/ring.rs` in a section about the controller) are not checked: the
//! reader has the context, this check does not.
//!
//! A path that names history on purpose (a file of an earlier release, say) is listed
//! in `xtask/historical-paths.txt` as `<file> <path>`; an entry that no longer matches
//! anything fails the check too, so the list only shrinks.

use std::collections::{BTreeSet, HashSet};
use std::path::Path;
use std::process::Command;

use anyhow::{Result, bail};

use crate::Doing;

const HISTORICAL: &str = "xtask/historical-paths.txt";

/// One reference that does not resolve.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Broken {
    file: String,
    line: usize,
    target: String,
    why: &'static str,
}

pub fn run(root: &Path) -> Result<()> {
    let files = tracked(root)?;
    let tree = Tree::of(&files);
    let allowed = historical(root)?;
    let mut broken = Vec::new();
    for file in &files {
        let Some(kind) = Kind::of(file) else { continue };
        let path = root.join(file);
        // A file git lists but the work tree lacks (deleted, not yet committed) has
        // nothing to check.
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        broken.extend(check(file, &text, kind, &tree, root));
    }
    let mut used = BTreeSet::new();
    broken.retain(|b| {
        let key = (b.file.clone(), b.target.clone());
        if allowed.contains(&key) {
            used.insert(key);
            false
        } else {
            true
        }
    });
    let stale: Vec<_> = allowed.difference(&used).collect();
    if broken.is_empty() && stale.is_empty() {
        println!(
            "every path named in {} files exists",
            files.iter().filter(|f| Kind::of(f).is_some()).count()
        );
        return Ok(());
    }
    broken.sort();
    for b in &broken {
        eprintln!("{}:{}: {} `{}`", b.file, b.line, b.why, b.target);
    }
    for (file, path) in &stale {
        eprintln!("{HISTORICAL}: `{file} {path}` matches nothing any more: remove it");
    }
    bail!(
        "{} broken reference(s) in the docs and comments, {} stale entr(ies) in {HISTORICAL}",
        broken.len(),
        stale.len()
    )
}

/// The files git tracks, and those it would (untracked, not ignored).
fn tracked(root: &Path) -> Result<Vec<String>> {
    let out = Command::new("git")
        .current_dir(root)
        .args(["ls-files", "--cached", "--others", "--exclude-standard"])
        .output()
        .doing("running git ls-files")?;
    if !out.status.success() {
        bail!(
            "git ls-files failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect())
}

/// `xtask/historical-paths.txt`: `(file, path)` pairs, `#` comments.
fn historical(root: &Path) -> Result<BTreeSet<(String, String)>> {
    let path = root.join(HISTORICAL);
    let text = std::fs::read_to_string(&path).doing(format!("reading {}", path.display()))?;
    let mut entries = BTreeSet::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut words = line.split_whitespace();
        match (words.next(), words.next(), words.next()) {
            (Some(file), Some(target), None) => {
                entries.insert((file.to_owned(), target.to_owned()));
            }
            _ => bail!("{HISTORICAL}:{}: expected `<file> <path>`", n + 1),
        }
    }
    Ok(entries)
}

/// Which part of a file is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Markdown,
    /// Comments after `//`.
    Slashes,
    /// Comments after `#`.
    Hash,
}

impl Kind {
    fn of(file: &str) -> Option<Kind> {
        let name = file.rsplit('/').next().unwrap_or(file);
        let ext = name.rsplit_once('.').map(|(_, e)| e);
        match ext {
            Some("md") => Some(Kind::Markdown),
            Some("rs" | "go") => Some(Kind::Slashes),
            Some("toml" | "yaml" | "yml" | "sh") => Some(Kind::Hash),
            _ if name == "Dockerfile" || file.starts_with(".ci/") => Some(Kind::Hash),
            _ => None,
        }
    }

    /// The part of `line` that is prose.
    fn prose(self, line: &str) -> Option<&str> {
        match self {
            Kind::Markdown => Some(line),
            Kind::Slashes => comment_start(line).map(|i| &line[i..]),
            Kind::Hash => line.find('#').map(|i| &line[i..]),
        }
    }
}

/// Where the `//` comment of a line of code starts: the first `//` outside a string
/// literal on that line (a URL in a string is no comment). A line inside a string that
/// spans lines is taken as code.
fn comment_start(line: &str) -> Option<usize> {
    let bytes = line.as_bytes();
    let (mut quoted, mut i) = (false, 0);
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if quoted => i += 1,
            b'"' => quoted = !quoted,
            b'/' if !quoted && bytes.get(i + 1) == Some(&b'/') => return Some(i),
            _ => {}
        }
        i += 1;
    }
    None
}

/// The repository's files and directories.
struct Tree {
    files: HashSet<String>,
    dirs: HashSet<String>,
    tops: HashSet<String>,
    /// Directories holding a `Cargo.toml` (crates), longest first.
    crates: Vec<String>,
}

impl Tree {
    fn of(files: &[String]) -> Tree {
        let mut dirs = HashSet::new();
        for file in files {
            let mut at = 0;
            while let Some(i) = file[at..].find('/') {
                dirs.insert(file[..at + i].to_owned());
                at += i + 1;
            }
        }
        let tops = dirs.iter().filter(|d| !d.contains('/')).cloned().collect();
        let mut crates: Vec<String> = files
            .iter()
            .filter_map(|f| f.strip_suffix("/Cargo.toml").map(str::to_owned))
            .collect();
        crates.sort_by_key(|c| std::cmp::Reverse(c.len()));
        Tree {
            files: files.iter().cloned().collect(),
            dirs,
            tops,
            crates,
        }
    }

    fn has(&self, path: &str) -> bool {
        let path = path.trim_end_matches('/');
        path.is_empty() || self.files.contains(path) || self.dirs.contains(path)
    }

    /// Whether `path`, named in `file`, resolves: from the root, from `file`'s crate,
    /// or from `file`'s directory.
    fn resolves(&self, file: &str, path: &str) -> bool {
        let dir = file.rsplit_once('/').map_or("", |(d, _)| d);
        let krate = self
            .crates
            .iter()
            .find(|c| file.starts_with(&format!("{c}/")))
            .map_or("", String::as_str);
        [String::new(), krate.to_owned(), dir.to_owned()]
            .iter()
            .filter_map(|base| normalize(base, path))
            .any(|p| self.has(&p))
    }
}

/// `base/path` with `.` and `..` resolved; None when it climbs above the root.
fn normalize(base: &str, path: &str) -> Option<String> {
    let mut parts: Vec<&str> = base.split('/').filter(|p| !p.is_empty()).collect();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            p => parts.push(p),
        }
    }
    Some(parts.join("/"))
}

/// The path-like runs of `prose` (see the module): each with what follows it.
fn runs(prose: &str) -> impl Iterator<Item = (&str, Option<char>)> {
    let is_path = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-');
    let mut rest = prose;
    std::iter::from_fn(move || {
        let start = rest.find(is_path)?;
        let tail = &rest[start..];
        let len = tail.find(|c: char| !is_path(c)).unwrap_or(tail.len());
        let run = &tail[..len];
        rest = &tail[len..];
        Some((run, rest.chars().next()))
    })
}

fn check(file: &str, text: &str, kind: Kind, tree: &Tree, root: &Path) -> Vec<Broken> {
    let mut broken = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let Some(prose) = kind.prose(line) else {
            continue;
        };
        for (run, next) in runs(prose) {
            if matches!(next, Some('*' | '{' | '<')) {
                continue;
            }
            let path = run.trim_end_matches(['.', '-']);
            let Some((first, _)) = path.split_once('/') else {
                continue;
            };
            if !tree.tops.contains(first) || tree.resolves(file, path) {
                continue;
            }
            broken.push(Broken {
                file: file.to_owned(),
                line: n + 1,
                target: path.to_owned(),
                why: "no such file or directory",
            });
        }
        if kind == Kind::Markdown {
            for target in links(line) {
                // A link whose file is missing was reported as a path already.
                let path = target.split('#').next().unwrap_or(target);
                if broken
                    .last()
                    .is_some_and(|b: &Broken| b.line == n + 1 && b.target == path)
                {
                    continue;
                }
                if let Some(why) = link_broken(file, target, tree, root) {
                    broken.push(Broken {
                        file: file.to_owned(),
                        line: n + 1,
                        target: target.to_owned(),
                        why,
                    });
                }
            }
        }
    }
    broken
}

/// The targets of the Markdown links `[text](target)` on `line`.
fn links(line: &str) -> impl Iterator<Item = &str> {
    line.match_indices("](").filter_map(move |(i, _)| {
        let rest = &line[i + 2..];
        let end = rest.find(')')?;
        let target = rest[..end].split_whitespace().next()?;
        Some(target)
    })
}

/// Why a link from `file` to `target` is broken, if it is: a relative file that does
/// not exist, or a heading (`#anchor`) that the Markdown file it names does not have.
/// Links with a scheme (`https:`, `mailto:`) are not followed.
fn link_broken(file: &str, target: &str, tree: &Tree, root: &Path) -> Option<&'static str> {
    if target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (path, anchor) = match target.split_once('#') {
        Some((p, a)) => (p, Some(a)),
        None => (target, None),
    };
    let dir = file.rsplit_once('/').map_or("", |(d, _)| d);
    let resolved = if path.is_empty() {
        file.to_owned()
    } else {
        match normalize(dir, path) {
            Some(p) if tree.has(&p) => p,
            _ => return Some("link to no such file"),
        }
    };
    let anchor = anchor?;
    if !resolved.ends_with(".md") {
        return None;
    }
    let text = std::fs::read_to_string(root.join(&resolved)).ok()?;
    (!headings(&text).contains(anchor)).then_some("link to no such heading")
}

/// The anchors of a Markdown file's headings, as GitHub makes them: lower case, spaces
/// to `-`, punctuation but `-` and `_` dropped, `-1`, `-2`… for repeats. Fenced code is
/// skipped.
fn headings(text: &str) -> HashSet<String> {
    let mut anchors = HashSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let Some(title) = line.strip_prefix('#') else {
            continue;
        };
        if fenced {
            continue;
        }
        let title = title.trim_start_matches('#').trim();
        let slug: String = title
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .flat_map(char::to_lowercase)
            .collect();
        let mut anchor = slug.clone();
        let mut n = 0;
        while !anchors.insert(anchor.clone()) {
            n += 1;
            anchor = format!("{slug}-{n}");
        }
    }
    anchors
}

#[cfg(test)]
mod tests {
    use super::{Kind, Tree, check, comment_start, headings, links, normalize, runs};
    use std::path::Path;

    fn tree() -> Tree {
        let files = [
            "README.md",
            "docs/architecture.md",
            "controller/Cargo.toml",
            "controller/core/Cargo.toml",
            "controller/core/src/lib.rs",
            "controller/core/src/shard/ring.rs",
            "controller/tests/cache_size.rs",
            "tests/README.md",
        ];
        Tree::of(&files.map(str::to_owned))
    }

    fn targets(file: &str, text: &str, kind: Kind) -> Vec<String> {
        check(file, text, kind, &tree(), Path::new("/nonexistent"))
            .into_iter()
            .map(|b| b.target)
            .collect()
    }

    #[test]
    fn a_path_under_a_top_directory_must_exist() {
        let text = "see `controller/core/src/lib.rs` and controller/src/desired.rs.";
        assert_eq!(
            targets("docs/architecture.md", text, Kind::Markdown),
            ["controller/src/desired.rs"]
        );
        // Directories count, and a trailing slash or full stop does not matter.
        assert!(
            targets(
                "README.md",
                "in controller/core/src/shard/.",
                Kind::Markdown
            )
            .is_empty()
        );
    }

    #[test]
    fn other_slashes_are_not_paths() {
        let text = "apps/v1, platform.example.com/cleanup, shard/ring.rs, ../shared/X.md";
        assert!(targets("README.md", text, Kind::Markdown).is_empty());
        // A pattern is not a path.
        assert!(targets("README.md", "controller/core/src/*.rs", Kind::Markdown).is_empty());
    }

    #[test]
    fn code_is_read_only_in_its_comments_and_from_its_crate_too() {
        let code = "let p = \"https://x/controller/nope.rs\"; // see tests/cache_size.rs\n// and controller/core/src/gone.rs";
        assert_eq!(
            targets("controller/benches/x.rs", code, Kind::Slashes),
            ["controller/core/src/gone.rs"]
        );
        // Resolved from the crate: the cache-size test is the controller crate's, not the core's.
        assert_eq!(
            targets(
                "controller/core/src/lib.rs",
                "// tests/cache_size.rs",
                Kind::Slashes
            ),
            ["tests/cache_size.rs"],
            "not in the core's crate, and tests/ is a top directory of its own"
        );
    }

    #[test]
    fn links_reach_files_and_headings() {
        assert_eq!(
            links("[a](docs/x.md#h) and [b](https://e.com) [c](#top)").collect::<Vec<_>>(),
            ["docs/x.md#h", "https://e.com", "#top"]
        );
        let got = targets(
            "README.md",
            "[ok](docs/architecture.md) [gone](docs/missing.md)",
            Kind::Markdown,
        );
        assert_eq!(got, ["docs/missing.md"]);
        let anchors = headings("# Title\n## The Pods, and what: tests\n```\n# not\n```\n## Title");
        assert!(anchors.contains("title"));
        assert!(anchors.contains("the-pods-and-what-tests"));
        assert!(anchors.contains("title-1"));
        assert!(!anchors.contains("not"));
    }

    #[test]
    fn relative_paths_resolve_and_stay_inside() {
        assert_eq!(
            normalize("e2e", "../docs/x.md").as_deref(),
            Some("docs/x.md")
        );
        assert_eq!(normalize("", "../x"), None);
        assert_eq!(comment_start(r#"let u = "https://x"; // c"#), Some(21));
        assert_eq!(comment_start(r#"let s = "a \" // b";"#), None);
        let found: Vec<_> = runs("a `b/c.rs`* d").collect();
        assert_eq!(
            found,
            [("a", Some(' ')), ("b/c.rs", Some('`')), ("d", None)]
        );
    }
}
