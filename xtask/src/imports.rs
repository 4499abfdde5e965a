//! The import graph between the files of a crate (`crate::a::b` and `super::x` paths, `use`
//! lists, and names re-exported by a `mod.rs`), its cycles, and the imports that reach a name
//! through a re-export instead of the module that defines it: `cargo xtask imports` prints
//! both, and a test keeps burn-ddp and burn-vision free of them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// A crate's modules (`nn::conv`, `""` for the root) → the modules each one names.
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// Reads every `.rs` file under `src` (tests inside `#[cfg(test)] mod tests` left out).
pub fn graph(src: &Path) -> std::io::Result<Graph> {
    let krate = Crate::read(src)?;
    let (modules, reexports) = (&krate.modules, &krate.reexports);
    let mut graph = Graph::new();
    for (module, code) in krate.code() {
        let mut edges = BTreeSet::new();
        for path in paths(code) {
            if let Some(target) = resolve(module, &path, modules, reexports)
                && target != *module
                && !module.starts_with(&format!("{target}::"))
                && !target.starts_with(&format!("{module}::"))
            {
                edges.insert(target);
            }
        }
        graph.insert(module.to_string(), edges);
    }
    Ok(graph)
}

/// A crate's files by module, its modules, and its re-exports.
struct Crate {
    files: BTreeMap<String, String>,
    modules: BTreeSet<String>,
    reexports: BTreeMap<(String, String), String>,
}

impl Crate {
    fn read(src: &Path) -> std::io::Result<Self> {
        let mut files = BTreeMap::new();
        collect(src, src, &mut files)?;
        let modules: BTreeSet<String> = files.keys().cloned().collect();
        let reexports = reexports(&files, &modules);
        Ok(Self { files, modules, reexports })
    }

    /// Each module's code, its `#[cfg(test)] mod tests` left out.
    fn code(&self) -> impl Iterator<Item = (&str, &str)> {
        self.files.iter().map(|(module, text)| {
            (module.as_str(), text.find("#[cfg(test)]\nmod tests").map_or(text.as_str(), |i| &text[..i]))
        })
    }
}

fn collect(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect(root, &path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path.strip_prefix(root).expect("under root").with_extension("");
            let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
            if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                parts.pop();
            }
            out.insert(parts.join("::"), std::fs::read_to_string(&path)?);
        }
    }
    Ok(())
}

/// The paths of each module (outside its tests) that name an item through another module's
/// re-export (`use crate::ReduceOp` for `crate::process_group::ReduceOp`), as
/// `(module, path)`. A module using its own re-exports is not counted.
pub fn through_reexports(src: &Path) -> std::io::Result<Vec<(String, String)>> {
    let krate = Crate::read(src)?;
    let mut out = Vec::new();
    for (module, code) in krate.code() {
        for path in paths(code) {
            if let Some(via) = reexporter(module, &path, &krate.modules, &krate.reexports)
                && via != module
            {
                out.push((module.to_string(), path.join("::")));
            }
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// The module whose re-export `path` (seen from `module`) goes through, if any.
fn reexporter(
    module: &str,
    path: &[String],
    modules: &BTreeSet<String>,
    reexports: &BTreeMap<(String, String), String>,
) -> Option<String> {
    let (prefix, child) = locate(module, path, modules, reexports)?;
    child.map(|_| prefix)
}

/// The longest prefix of `path` (seen from `module`) that is a module, and the child module
/// when the name after that prefix is re-exported there.
fn locate(
    module: &str,
    path: &[String],
    modules: &BTreeSet<String>,
    reexports: &BTreeMap<(String, String), String>,
) -> Option<(String, Option<String>)> {
    let absolute = absolute(module, path)?;
    let k = (0..=absolute.len()).rev().find(|&k| modules.contains(&absolute[..k].join("::")))?;
    let prefix = absolute[..k].join("::");
    let child = absolute.get(k).and_then(|name| reexports.get(&(prefix.clone(), name.clone()))).cloned();
    Some((prefix, child))
}

/// `path` from `module` as a path from the crate root (`None` for other crates' paths).
fn absolute(module: &str, path: &[String]) -> Option<Vec<String>> {
    let mut absolute: Vec<String> = Vec::new();
    let mut rest = path;
    match path.first().map(String::as_str) {
        Some("crate") => rest = &path[1..],
        Some("super") => {
            absolute = module.split("::").filter(|s| !s.is_empty()).map(str::to_string).collect();
            while rest.first().map(String::as_str) == Some("super") {
                absolute.pop();
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    absolute.extend(rest.iter().cloned());
    Some(absolute)
}

/// Every `crate::…` / `super::…` path in `code`, with `use x::{a, b::c}` lists expanded.
fn paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    for start in ["crate::", "super::"].iter().flat_map(|k| code.match_indices(k).map(|(i, _)| i)) {
        if start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_') {
            continue;
        }
        let rest = &code[start..];
        let head: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
        let base: Vec<String> = head.split("::").filter(|s| !s.is_empty()).map(str::to_string).collect();
        match rest[head.len()..].strip_prefix('{') {
            Some(list) => {
                let list = &list[..list.find('}').unwrap_or(list.len())];
                for item in list.split(',') {
                    let item: Vec<String> = item
                        .split_whitespace()
                        .next()
                        .unwrap_or("")
                        .split("::")
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                        .collect();
                    out.push(base.iter().cloned().chain(item).collect());
                }
            }
            None => out.push(base),
        }
    }
    out
}

/// `(module, name) → child module` for each `pub use child::{name, …}` of a module.
fn reexports(files: &BTreeMap<String, String>, modules: &BTreeSet<String>) -> BTreeMap<(String, String), String> {
    let mut out = BTreeMap::new();
    for (module, text) in files {
        for line in text.lines().map(str::trim).filter(|l| {
            l.starts_with("pub use ") || l.starts_with("pub(crate) use ") || l.starts_with("pub(super) use ")
        }) {
            let spec = line.split_once(" use ").map(|(_, s)| s.trim_end_matches(';')).unwrap_or("");
            let Some((child, names)) = spec.split_once("::") else { continue };
            let child = if module.is_empty() { child.to_string() } else { format!("{module}::{child}") };
            if !modules.contains(&child) {
                continue;
            }
            for name in names.trim_matches(|c| c == '{' || c == '}').split(',') {
                let words: Vec<&str> = name.split_whitespace().collect();
                if let Some(alias) = words.last() {
                    out.insert((module.clone(), alias.to_string()), child.clone());
                }
            }
        }
    }
    out
}

/// The module a path names from `module`: its longest prefix that is a module, or the child a
/// name re-exported there comes from.
fn resolve(
    module: &str,
    path: &[String],
    modules: &BTreeSet<String>,
    reexports: &BTreeMap<(String, String), String>,
) -> Option<String> {
    let (prefix, child) = locate(module, path, modules, reexports)?;
    Some(child.unwrap_or(prefix))
}

/// Every cycle (strongly connected set of two or more modules), each sorted.
pub fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    // Kosaraju: finishing order on the graph, then components on the reversed graph.
    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    for start in graph.keys() {
        visit(start, graph, &mut seen, &mut order);
    }
    let mut reversed: Graph = graph.keys().map(|k| (k.clone(), BTreeSet::new())).collect();
    for (from, tos) in graph {
        for to in tos {
            reversed.entry(to.clone()).or_default().insert(from.clone());
        }
    }
    let mut assigned = BTreeSet::new();
    let mut out = Vec::new();
    for start in order.iter().rev() {
        let mut component = Vec::new();
        visit(start, &reversed, &mut assigned, &mut component);
        if component.len() > 1 {
            component.sort();
            out.push(component);
        }
    }
    out
}

/// Depth-first post-order from `start` (iterative: deep graphs do not overflow the stack).
fn visit(start: &str, graph: &Graph, seen: &mut BTreeSet<String>, order: &mut Vec<String>) {
    if !seen.insert(start.to_string()) {
        return;
    }
    let mut stack: Vec<(String, Vec<String>)> =
        vec![(start.to_string(), graph.get(start).map(|s| s.iter().cloned().collect()).unwrap_or_default())];
    while let Some((node, next)) = stack.last_mut() {
        match next.pop() {
            Some(n) if seen.insert(n.clone()) => {
                let children = graph.get(&n).map(|s| s.iter().cloned().collect()).unwrap_or_default();
                stack.push((n, children));
            }
            Some(_) => {}
            None => {
                order.push(node.clone());
                stack.pop();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, files: &[(&str, &str)]) {
        for (name, text) in files {
            let path = dir.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
    }

    #[test]
    fn finds_a_cycle_through_a_reexport_and_ignores_tests() {
        let dir = std::env::temp_dir().join(format!("xtask-imports-{}", std::process::id()));
        write(
            &dir,
            &[
                ("lib.rs", "pub mod nn;\n"),
                ("nn/mod.rs", "mod a;\nmod b;\nmod c;\npub use a::helper;\n"),
                ("nn/a.rs", "use super::b::thing;\npub fn helper() {}\n"),
                ("nn/b.rs", "pub fn thing() { super::helper() }\n"),
                ("nn/c.rs", "use super::{a, b::thing};\n#[cfg(test)]\nmod tests { use crate::nn::c; }\n"),
            ],
        );
        let g = graph(&dir).unwrap();
        assert_eq!(g["nn::c"], ["nn::a", "nn::b"].into_iter().map(String::from).collect());
        assert_eq!(cycles(&g), vec![vec!["nn::a".to_string(), "nn::b".to_string()]]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_workspace_crates_have_no_import_cycles() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        for krate in ["burn-ddp", "burn-vision"] {
            let found = cycles(&graph(&root.join(krate).join("src")).unwrap());
            assert!(found.is_empty(), "{krate}: import cycles between files: {found:?}");
        }
    }

    #[test]
    fn finds_names_imported_through_a_reexport() {
        let dir = std::env::temp_dir().join(format!("xtask-reexports-{}", std::process::id()));
        write(
            &dir,
            &[
                (
                    "lib.rs",
                    "pub mod nn;
pub mod top;
pub use top::Thing;
",
                ),
                (
                    "top.rs",
                    "pub struct Thing;
",
                ),
                (
                    "nn/mod.rs",
                    "mod a;
mod b;
pub use a::helper;
fn own() { helper() }
",
                ),
                (
                    "nn/a.rs",
                    "use crate::Thing;
pub fn helper() {}
",
                ),
                (
                    "nn/b.rs",
                    "use super::helper;
use super::a::helper as direct;
use crate::top::Thing;
",
                ),
            ],
        );
        let found = through_reexports(&dir).unwrap();
        let expected = [("nn::a", "crate::Thing"), ("nn::b", "super::helper")];
        assert_eq!(found, expected.map(|(m, p)| (m.to_string(), p.to_string())));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_workspace_crates_import_names_from_where_they_live() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        for krate in ["burn-ddp", "burn-vision"] {
            let found = through_reexports(&root.join(krate).join("src")).unwrap();
            assert!(found.is_empty(), "{krate}: {} import(s) through a re-export: {found:?}", found.len());
        }
    }
}
