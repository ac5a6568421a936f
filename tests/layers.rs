//! The shape of `src/`, checked: every arrow between the top-level modules runs down the
//! layers `lib.rs` describes, and no two files import each other, directly or round a
//! loop. An arrow back up or a circle makes a change in one file ripple into files that
//! should not care; this test names the offending import the day it is written.
//!
//! The import graph is read from the source text: every `crate::`, `super::` and `self::`
//! path (groups in braces expanded) is resolved to the longest prefix that is a module
//! file. A module using its own submodules is not an edge (it declares them), and unit
//! tests (`tests.rs`, `#[cfg(test)] mod tests { … }`) are left out: they look inside.
//! Comments are dropped first, so a path in prose is no arrow.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

use regex::Regex;

type Module = Vec<String>;

/// Top-level modules, innermost first: each may use only those of a lower rank.
const LAYERS: &[(&str, u8)] = &[
    ("domain", 0),
    ("settings", 1),
    ("telemetry", 2),
    ("embedded", 2),
    ("server", 3),
    ("store", 3),
    ("migrate", 4),
    ("issuing", 4),
    ("webhooks", 5),
    ("http", 6),
    ("healthcheck", 6),
    ("startup", 7),
    ("cli", 8),
];

fn rank(top: &str) -> u8 {
    LAYERS
        .iter()
        .find(|(name, _)| *name == top)
        .unwrap_or_else(|| panic!("top-level module `{top}` has no layer in this test"))
        .1
}

/// Every module file of `src/` (but `lib.rs`, `main.rs` and unit-test files), by its
/// module path, with its text minus comments and inline test modules.
fn modules(src: &Path) -> BTreeMap<Module, String> {
    fn walk(dir: &Path, src: &Path, out: &mut BTreeMap<Module, String>) {
        let comments = Regex::new(r"//[^\n]*").unwrap();
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, src, out);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path.strip_prefix(src).unwrap().with_extension("");
            let mut module: Module = relative
                .iter()
                .map(|part| part.to_string_lossy().into_owned())
                .collect();
            if module.last().is_some_and(|last| last == "mod") {
                module.pop();
            }
            if module == ["lib"] || module == ["main"] || module.last().unwrap() == "tests" {
                continue;
            }
            let text = fs::read_to_string(&path).unwrap();
            let text = comments.replace_all(&text, "");
            out.insert(module, without_inline_tests(&text));
        }
    }
    let mut out = BTreeMap::new();
    walk(src, src, &mut out);
    out
}

/// `text` without its `#[cfg(test)] mod tests { … }` block (braces counted, so what
/// follows the block is kept).
fn without_inline_tests(text: &str) -> String {
    let start = Regex::new(r"#\[cfg\(test\)\]\s*mod tests\s*\{").unwrap();
    let Some(found) = start.find(text) else {
        return text.to_owned();
    };
    let mut depth = 1;
    let after = text[found.end()..]
        .char_indices()
        .find_map(|(i, c)| {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                _ => {}
            }
            (depth == 0).then_some(found.end() + i + 1)
        })
        .unwrap_or(text.len());
    format!("{}{}", &text[..found.start()], &text[after..])
}

/// The paths spelled at `text[at..]` (`a::b::C`, or `a::{b, c::D}` expanded).
fn paths_at(text: &str, at: usize) -> Vec<Vec<String>> {
    let rest = &text[at..];
    let lead = Regex::new(r"^((?:[A-Za-z_][A-Za-z0-9_]*::)*)(\{|[A-Za-z_][A-Za-z0-9_]*)?").unwrap();
    let found = lead.captures(rest).unwrap();
    let mut segments: Vec<String> = found[1]
        .split("::")
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    match found.get(2).map(|m| m.as_str()) {
        Some("{") => {
            let open = found[1].len();
            let (mut depth, mut start, mut out) = (0, open + 1, Vec::new());
            for (i, c) in rest[open..].char_indices().map(|(i, c)| (i + open, c)) {
                match c {
                    '{' => depth += 1,
                    '}' | ',' if depth == 1 => {
                        let part = rest[start..i].trim();
                        if !part.is_empty() {
                            for tail in paths_at(part, 0) {
                                out.push([segments.clone(), tail].concat());
                            }
                        }
                        start = i + 1;
                        if c == '}' {
                            break;
                        }
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            out
        }
        Some(last) => {
            segments.push(last.to_owned());
            vec![segments]
        }
        None => vec![segments],
    }
}

/// Which module files each module file uses.
fn imports(modules: &BTreeMap<Module, String>) -> BTreeMap<Module, BTreeSet<Module>> {
    let anchor = Regex::new(r"\b(crate|self|super(?:::super)*)::").unwrap();
    let resolve = |path: &[String]| {
        (1..=path.len())
            .rev()
            .map(|n| path[..n].to_vec())
            .find(|prefix| modules.contains_key(prefix))
    };
    let mut edges = BTreeMap::new();
    for (module, text) in modules {
        let mut uses = BTreeSet::new();
        for found in anchor.captures_iter(text) {
            let base: Module = match &found[1] {
                "crate" => Vec::new(),
                "self" => module.clone(),
                supers => {
                    let up = supers.matches("super").count();
                    module[..module.len().saturating_sub(up)].to_vec()
                }
            };
            for path in paths_at(text, found.get(0).unwrap().end()) {
                if let Some(target) = resolve(&[base.clone(), path].concat())
                    && !target.starts_with(module)
                {
                    uses.insert(target);
                }
            }
        }
        edges.insert(module.clone(), uses);
    }
    edges
}

/// The groups of two or more files that reach one another (Tarjan's strongly connected
/// components).
fn circles(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a Module) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            for w in &self.edges[v] {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    self.low.insert(v, self.low[v].min(self.low[w]));
                } else if self.stack.contains(&w) {
                    self.low.insert(v, self.low[v].min(self.index[w]));
                }
            }
            if self.low[v] == self.index[v] {
                let at = self.stack.iter().position(|m| *m == v).unwrap();
                let group: Vec<String> = self.stack.drain(at..).map(|m| m.join("/")).collect();
                if group.len() > 1 {
                    self.found.push(group);
                }
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    walk.found
}

fn graph() -> BTreeMap<Module, BTreeSet<Module>> {
    imports(&modules(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src")))
}

#[test]
fn every_arrow_between_top_level_modules_runs_down_the_layers() {
    let edges = graph();
    assert!(edges.len() > 50, "only {} module files found", edges.len());
    let upward: Vec<String> = edges
        .iter()
        .flat_map(|(from, uses)| uses.iter().map(move |to| (from, to)))
        .filter(|(from, to)| from[0] != to[0] && rank(&from[0]) <= rank(&to[0]))
        .map(|(from, to)| format!("{} -> {}", from.join("/"), to.join("/")))
        .collect();
    assert!(upward.is_empty(), "imports against the layers: {upward:#?}");
}

#[test]
fn no_two_files_import_each_other() {
    let found = circles(&graph());
    assert!(found.is_empty(), "files that reach each other: {found:#?}");
}

#[test]
fn the_reader_sees_braced_groups_and_relative_paths() {
    // The parser is what the two checks above rest on: a group it failed to expand would
    // hide an arrow.
    let text = "crate::a::{b::C, d, e::{f, g::H}}";
    let found = paths_at(text, "crate::".len());
    let expected: Vec<Vec<String>> = [
        vec!["a", "b", "C"],
        vec!["a", "d"],
        vec!["a", "e", "f"],
        vec!["a", "e", "g", "H"],
    ]
    .iter()
    .map(|p| p.iter().map(|s| s.to_string()).collect())
    .collect();
    assert_eq!(found, expected);
    // Two arrows that exist, each spelled as a braced `super::` import.
    let edges = graph();
    for (from, to) in [
        ("store/filters", "store/documents"),
        ("http/error", "http/rate_limit"),
    ] {
        let module = |path: &str| path.split('/').map(str::to_owned).collect::<Module>();
        assert!(
            edges[&module(from)].contains(&module(to)),
            "the arrow {from} -> {to} was not seen: the graph is misread"
        );
    }
}
