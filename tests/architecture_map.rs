//! docs/architecture.md is the map of the code: every item it names in backticks as
//! `Type::function` or `module::item` must exist in `src/`. A rename that forgets the map
//! fails here instead of leaving a reader to hunt for a function that is gone.

use std::fs;
use std::path::Path;

/// Every `.rs` file under `dir`, as (path, text).
fn sources(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = fs::read_to_string(&path).unwrap();
            out.push((path.display().to_string(), text));
        }
    }
    out
}

/// The backticked `a::b` (or `a::b::c`) paths of the document, without call parentheses.
fn named_paths(doc: &str) -> Vec<String> {
    let mut paths: Vec<String> = doc
        .split('`')
        .skip(1)
        .step_by(2)
        .map(|span| span.trim_end_matches("()"))
        .filter(|span| {
            span.contains("::")
                && span
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        })
        .map(str::to_owned)
        .collect();
    paths.sort();
    paths.dedup();
    paths
}

/// Whether `text` declares `name` as a variant of `enum owner` (a line of its own,
/// indented as rustfmt indents variants).
fn declares_variant(text: &str, owner: &str, name: &str) -> bool {
    text.contains(&format!("enum {owner} "))
        && text.lines().any(|line| {
            line.strip_prefix("    ").is_some_and(|rest| {
                rest.strip_prefix(name).is_some_and(|after| {
                    after.is_empty() || after.starts_with([',', '(', ' ', '{'])
                })
            })
        })
}

/// Whether `name` is defined (a function, type, trait, constant or module) in `text`.
fn defines(text: &str, name: &str) -> bool {
    [
        "fn", "struct", "enum", "trait", "type", "const", "static", "mod",
    ]
    .iter()
    .any(|keyword| {
        text.match_indices(&format!("{keyword} {name}"))
            .any(|(at, found)| {
                let next = text[at + found.len()..].chars().next();
                !next.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
            })
    })
}

#[test]
fn every_item_the_architecture_map_names_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let files = sources(&root.join("src"));
    let paths = named_paths(&doc);
    assert!(
        paths.len() >= 10,
        "the map names only {paths:?}: parsing broke"
    );

    let missing: Vec<&String> = paths
        .iter()
        .filter(|path| {
            let parts: Vec<&str> = path.split("::").collect();
            let (item, owners) = parts.split_last().unwrap();
            // The item itself, in a file that also defines (or is) each named owner:
            // `Store::balances` needs `fn balances` beside `impl Store`; `batch::Committer`
            // a `Committer` under a `batch` module.
            !files.iter().any(|(file, text)| {
                let owner = owners.last().unwrap();
                (defines(text, item) || declares_variant(text, owner, item))
                    && owners.iter().all(|owner| {
                        file.contains(&format!("/{owner}"))
                            || text.contains(&format!("impl {owner}"))
                            || text.contains(&format!("impl<'_> {owner}"))
                            || defines(text, owner)
                    })
            })
        })
        .collect();
    assert!(
        missing.is_empty(),
        "docs/architecture.md names items that src/ does not define: {missing:?}"
    );
}
