//! `cargo xtask cycles`: the module import graph of every crate of the workspace, and the
//! cycles in it.
//!
//! A file is a node; an arrow goes from a file to the file of each module it names by a
//! path through the crate (`crate::…`, `super::…`, `self::…`, in a `use` or anywhere in
//! the code), test modules (`#[cfg(test)]`) left out. A cycle is a strongly connected
//! set of more than one file. Comments are not read (the files are parsed), so a doc link
//! is no arrow.
//!
//! The check is a ratchet: `xtask/known-cycles.txt` lists the files that were in a cycle
//! when the check came in (the controller's one cycle). It fails when a cycle holds a
//! file not listed there, and when a listed file is no longer in any cycle (so the list
//! only shrinks). Each failure names the cycle and the arrows that make it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use syn::visit::Visit;

use crate::Doing;

/// The crates whose modules are checked: the workspace's members (`Cargo.toml`), each
/// with the module trees of its `src/lib.rs` and `src/main.rs`.
fn members(root: &Path) -> Result<Vec<String>> {
    let path = root.join("Cargo.toml");
    let text = std::fs::read_to_string(&path).doing(format!("reading {}", path.display()))?;
    let manifest = toml_edit::Document::parse(text).doing(format!("parsing {}", path.display()))?;
    let members = manifest
        .get("workspace")
        .and_then(|w| w.get("members"))
        .and_then(|m| m.as_array())
        .with_context(|| format!("{}: no workspace.members list", path.display()))?;
    members
        .iter()
        .map(|m| {
            m.as_str()
                .map(str::to_owned)
                .with_context(|| format!("{}: a workspace member is not a string", path.display()))
        })
        .collect()
}

/// Where the files in a cycle today are listed, relative to the repository.
const KNOWN: &str = "xtask/known-cycles.txt";

pub fn run(root: &Path) -> Result<()> {
    let mut cycles = Vec::new();
    for name in members(root)? {
        let dir = root.join(name);
        if dir.join("src").is_dir() {
            let graph = Graph::of_crate(root, &dir)?;
            cycles.extend(graph.cycles());
        }
    }
    let known = read_known(&root.join(KNOWN))?;
    let verdict = judge(&cycles, &known);
    for cycle in &cycles {
        println!("{}", cycle.describe());
    }
    match verdict {
        Ok(0) => {
            println!("no module import cycle");
            Ok(())
        }
        Ok(debt) => {
            println!(
                "no new module import cycle ({debt} file(s) of the known cycles in {KNOWN} remain)"
            );
            Ok(())
        }
        Err(problems) => bail!("{}", problems.join("\n")),
    }
}

/// The files listed in the known-cycles file (one path a line, `#` comments).
fn read_known(path: &Path) -> Result<BTreeSet<String>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => bail!("reading {}: {e}", path.display()),
    };
    Ok(text
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect())
}

/// `Ok(n)`: every cycle is within the known files, every known file still in one (`n`
/// of them); `Err`: what is wrong, one line each.
fn judge(cycles: &[Cycle], known: &BTreeSet<String>) -> std::result::Result<usize, Vec<String>> {
    let mut problems = Vec::new();
    let mut in_cycles = BTreeSet::new();
    for cycle in cycles {
        let new: Vec<&String> = cycle.files.iter().filter(|f| !known.contains(*f)).collect();
        if !new.is_empty() {
            problems.push(format!(
                "a module import cycle holds {} file(s) not in {KNOWN}: {}; break it (see the arrows above)",
                new.len(),
                new.iter()
                    .map(|f| f.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        in_cycles.extend(cycle.files.iter().cloned());
    }
    let gone: Vec<&String> = known.difference(&in_cycles).collect();
    if !gone.is_empty() {
        problems.push(format!(
            "{} file(s) listed in {KNOWN} are in no cycle any more: remove them from the list: {}",
            gone.len(),
            gone.iter()
                .map(|f| f.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if problems.is_empty() {
        Ok(known.len())
    } else {
        Err(problems)
    }
}

/// One crate's files and the arrows between them, with the names each arrow carries.
#[derive(Default)]
struct Graph {
    /// Module path (`["shard", "ring"]`) → file, relative to the repository.
    modules: BTreeMap<Vec<String>, String>,
    /// file → file → the paths named.
    arrows: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
}

/// A set of files that import each other in a loop, and the arrows among them.
#[derive(Debug)]
struct Cycle {
    files: BTreeSet<String>,
    arrows: Vec<(String, String, BTreeSet<String>)>,
}

impl Cycle {
    fn describe(&self) -> String {
        let mut out = format!("module import cycle of {} files:\n", self.files.len());
        for (from, to, names) in &self.arrows {
            let names: Vec<&str> = names.iter().map(String::as_str).take(4).collect();
            out.push_str(&format!("  {from} -> {to}: {}\n", names.join(", ")));
        }
        out
    }
}

/// A module file found from a `mod` declaration: its path in the crate and where it is.
struct Found {
    module: Vec<String>,
    file: PathBuf,
}

impl Graph {
    fn of_crate(root: &Path, dir: &Path) -> Result<Graph> {
        let mut graph = Graph::default();
        let src = dir.join("src");
        let mut roots = vec![];
        for name in ["lib.rs", "main.rs"] {
            if src.join(name).is_file() {
                roots.push(src.join(name));
            }
        }
        // A crate with both a library and a binary has two module trees; the binary's
        // `crate::` is its own. Each is read as its own graph below, merged by file.
        let mut parsed = Vec::new();
        for file in roots {
            let mut tree = Graph::default();
            let mut pending = vec![Found {
                module: vec![],
                file,
            }];
            while let Some(found) = pending.pop() {
                let text = std::fs::read_to_string(&found.file)
                    .doing(format!("reading {}", found.file.display()))?;
                let ast =
                    syn::parse_file(&text).doing(format!("parsing {}", found.file.display()))?;
                let rel = relative(root, &found.file);
                let base = module_dir(&found.file);
                declare(
                    &mut tree,
                    &ast.items,
                    &found.module,
                    &base,
                    &rel,
                    &mut pending,
                );
                parsed.push((found.module, rel, ast));
            }
            graph.modules.extend(tree.modules);
        }
        for (module, rel, ast) in &parsed {
            let mut names = Names {
                module: module.clone(),
                found: vec![],
            };
            names.visit_file(ast);
            for (at, path) in names.found {
                let Some(target) = graph.resolve(&at, &path) else {
                    continue;
                };
                if &target != rel {
                    graph
                        .arrows
                        .entry(rel.clone())
                        .or_default()
                        .entry(target)
                        .or_default()
                        .insert(path.join("::"));
                }
            }
        }
        Ok(graph)
    }

    /// The file of the module `path` names from inside `at`: the longest prefix of the
    /// absolute path that is a module of the crate.
    fn resolve(&self, at: &[String], path: &[String]) -> Option<String> {
        let mut absolute: Vec<String> = Vec::new();
        let mut rest = path;
        match path.first().map(String::as_str) {
            Some("crate") => rest = &path[1..],
            Some("super") => {
                absolute.extend_from_slice(at);
                while rest.first().map(String::as_str) == Some("super") {
                    absolute.pop()?;
                    rest = &rest[1..];
                }
            }
            Some("self") => {
                absolute.extend_from_slice(at);
                rest = &path[1..];
            }
            _ => return None,
        }
        absolute.extend(rest.iter().cloned());
        (0..=absolute.len())
            .rev()
            .find_map(|n| self.modules.get(&absolute[..n]).cloned())
    }

    /// The cycles (strongly connected sets of more than one file), Tarjan's algorithm.
    fn cycles(&self) -> Vec<Cycle> {
        let files: Vec<&String> = self
            .modules
            .values()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let index_of: BTreeMap<&String, usize> =
            files.iter().enumerate().map(|(i, f)| (*f, i)).collect();
        let edges: Vec<Vec<usize>> = files
            .iter()
            .map(|f| {
                self.arrows
                    .get(*f)
                    .map(|to| to.keys().filter_map(|t| index_of.get(t).copied()).collect())
                    .unwrap_or_default()
            })
            .collect();
        strongly_connected(&edges)
            .into_iter()
            .filter(|set| set.len() > 1)
            .map(|set| {
                let members: BTreeSet<String> = set.iter().map(|&i| files[i].clone()).collect();
                let mut arrows = Vec::new();
                for from in &members {
                    for (to, names) in self.arrows.get(from).into_iter().flatten() {
                        if members.contains(to) {
                            arrows.push((from.clone(), to.clone(), names.clone()));
                        }
                    }
                }
                Cycle {
                    files: members,
                    arrows,
                }
            })
            .collect()
    }
}

/// Records the modules `items` declare (inside module `module`, whose children's files
/// are under `base`), and queues the files of the out-of-line ones.
fn declare(
    graph: &mut Graph,
    items: &[syn::Item],
    module: &[String],
    base: &Path,
    rel: &str,
    pending: &mut Vec<Found>,
) {
    graph.modules.insert(module.to_vec(), rel.to_owned());
    for item in items {
        let syn::Item::Mod(m) = item else { continue };
        if is_test(&m.attrs) {
            continue;
        }
        let mut child = module.to_vec();
        child.push(m.ident.to_string());
        match &m.content {
            Some((_, inner)) => {
                declare(
                    graph,
                    inner,
                    &child,
                    &base.join(m.ident.to_string()),
                    rel,
                    pending,
                );
            }
            None => {
                let name = m.ident.to_string();
                let candidates = [
                    base.join(format!("{name}.rs")),
                    base.join(&name).join("mod.rs"),
                ];
                if let Some(file) = candidates.into_iter().find(|c| c.is_file()) {
                    pending.push(Found {
                        module: child,
                        file,
                    });
                }
            }
        }
    }
}

/// Whether an item is only compiled for tests (`#[cfg(test)]`).
fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Ident>()
                .is_ok_and(|ident| ident == "test")
    })
}

/// The directory of the files of a module's children: next to `lib.rs`, `main.rs` and
/// `mod.rs`, else in a directory named after the file.
fn module_dir(file: &Path) -> PathBuf {
    let parent = file.parent().unwrap_or(Path::new("")).to_owned();
    match file.file_name().and_then(|n| n.to_str()) {
        Some("lib.rs" | "main.rs" | "mod.rs") => parent,
        _ => parent.join(file.file_stem().unwrap_or_default()),
    }
}

fn relative(root: &Path, file: &Path) -> String {
    file.strip_prefix(root)
        .unwrap_or(file)
        .to_string_lossy()
        .into_owned()
}

/// Every path through the crate a file names, with the module it is named in.
struct Names {
    module: Vec<String>,
    found: Vec<(Vec<String>, Vec<String>)>,
}

impl Names {
    fn record(&mut self, path: Vec<String>) {
        if matches!(
            path.first().map(String::as_str),
            Some("crate" | "super" | "self")
        ) {
            self.found.push((self.module.clone(), path));
        }
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut path = prefix.clone();
                if n.ident != "self" {
                    path.push(n.ident.to_string());
                }
                self.record(path);
            }
            syn::UseTree::Rename(r) => {
                let mut path = prefix.clone();
                if r.ident != "self" {
                    path.push(r.ident.to_string());
                }
                self.record(path);
            }
            syn::UseTree::Glob(_) => self.record(prefix.clone()),
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for Names {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if is_test(&m.attrs) {
            return;
        }
        if let Some((_, items)) = &m.content {
            self.module.push(m.ident.to_string());
            for item in items {
                self.visit_item(item);
            }
            self.module.pop();
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &u.tree);
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if !is_test(&f.attrs) {
            syn::visit::visit_item_fn(self, f);
        }
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        if !is_test(&i.attrs) {
            syn::visit::visit_item_impl(self, i);
        }
    }

    /// `pub(super)`, `pub(in crate::x)`: who may see an item, not an import.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_path(&mut self, p: &'ast syn::Path) {
        self.record(p.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, p);
    }
}

/// Tarjan's strongly connected components of a graph given as adjacency lists.
fn strongly_connected(edges: &[Vec<usize>]) -> Vec<Vec<usize>> {
    struct State<'a> {
        edges: &'a [Vec<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn connect(s: &mut State<'_>, v: usize) {
        s.index[v] = Some(s.next);
        s.low[v] = s.next;
        s.next += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        for &w in &s.edges[v] {
            match s.index[w] {
                None => {
                    connect(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on_stack[w] => s.low[v] = s.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut set = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack[w] = false;
                set.push(w);
                if w == v {
                    break;
                }
            }
            s.out.push(set);
        }
    }
    let n = edges.len();
    let mut s = State {
        edges,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if s.index[v].is_none() {
            connect(&mut s, v);
        }
    }
    s.out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A crate in a temporary directory from `(path, text)` pairs.
    fn crate_of(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("a temporary directory");
        for (path, text) in files {
            let path = dir.path().join("k").join(path);
            std::fs::create_dir_all(path.parent().expect("a parent")).expect("directories");
            std::fs::write(path, text).expect("a file");
        }
        dir
    }

    fn cycles_of(files: &[(&str, &str)]) -> Vec<Cycle> {
        let dir = crate_of(files);
        Graph::of_crate(dir.path(), &dir.path().join("k"))
            .expect("the crate is read")
            .cycles()
    }

    #[test]
    fn a_loop_through_use_super_and_a_path_in_code_is_one_cycle_named_by_its_arrows() {
        let cycles = cycles_of(&[
            ("src/lib.rs", "mod a;\nmod b;\npub mod c;\n"),
            ("src/a.rs", "use crate::b::Thing;\n"),
            (
                "src/b.rs",
                "pub struct Thing;\nfn f() { super::c::inner::g(); }\n",
            ),
            ("src/c/mod.rs", "pub mod inner;\n"),
            ("src/c/inner.rs", "pub fn g() { let _ = crate::a::X; }\n"),
        ]);
        assert_eq!(cycles.len(), 1, "{cycles:?}");
        let files: Vec<&str> = cycles[0].files.iter().map(String::as_str).collect();
        assert_eq!(files, ["k/src/a.rs", "k/src/b.rs", "k/src/c/inner.rs"]);
        let text = cycles[0].describe();
        assert!(
            text.contains("k/src/a.rs -> k/src/b.rs: crate::b::Thing"),
            "{text}"
        );
        assert!(
            text.contains("k/src/b.rs -> k/src/c/inner.rs: super::c::inner::g"),
            "{text}"
        );
    }

    #[test]
    fn comments_tests_and_one_way_imports_make_no_cycle() {
        let cycles = cycles_of(&[
            ("src/lib.rs", "mod a;\nmod b;\n#[cfg(test)]\nmod tests;\n"),
            // A doc link back to b is no import.
            (
                "src/a.rs",
                "//! See [`crate::b`].\npub(super) struct A;\npub(in crate::b) struct B;\n",
            ),
            (
                "src/b.rs",
                "use crate::a::A;\n#[cfg(test)]\nmod t { use crate::tests::T; }\n",
            ),
            ("src/tests.rs", "pub struct T; use crate::b;\n"),
        ]);
        assert!(cycles.is_empty(), "{cycles:?}");
    }

    #[test]
    fn the_ratchet_fails_on_a_new_file_in_a_cycle_and_on_a_known_file_out_of_one() {
        let cycle = Cycle {
            files: ["x.rs", "y.rs"].map(str::to_owned).into(),
            arrows: vec![],
        };
        let known: BTreeSet<String> = ["x.rs", "y.rs"].map(str::to_owned).into();
        assert_eq!(judge(std::slice::from_ref(&cycle), &known), Ok(2));
        let fewer: BTreeSet<String> = ["x.rs".to_owned()].into();
        let problems = judge(std::slice::from_ref(&cycle), &fewer).expect_err("y.rs is new");
        assert!(problems[0].contains("y.rs"), "{problems:?}");
        let more: BTreeSet<String> = ["x.rs", "y.rs", "z.rs"].map(str::to_owned).into();
        let problems = judge(std::slice::from_ref(&cycle), &more).expect_err("z.rs is out");
        assert!(problems[0].contains("z.rs"), "{problems:?}");
        assert_eq!(judge(&[], &BTreeSet::new()), Ok(0));
    }
}
