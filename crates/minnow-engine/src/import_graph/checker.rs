// The import-graph checker, shared by the crates' tests: minnow-engine's `import_graph` test
// module declares it as a child module, minnow-runtime's, minnow-format's and minnow-server's
// include this file with `include!` (so
// no `//!` comments and no `crate::`/`super::` paths here). It builds the graph of which module
// uses which from the `crate::`, `super::` and `self::` paths and child-module paths of every
// source file of a crate (test code left out) and names the modules of any circle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use regex::Regex;

/// Module path ("" for the crate root, "engine::core", ...) → its source file.
fn modules(src: &Path) -> BTreeMap<String, PathBuf> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(src).unwrap().with_extension("");
                let mut parts: Vec<String> = relative
                    .iter()
                    .map(|part| part.to_string_lossy().into_owned())
                    .collect();
                if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
                    parts.pop();
                }
                found.insert(parts.join("::"), path);
            }
        }
    }
    found
}

/// The source without comments and without test code (`#[cfg(test)]` items: a test module may
/// use anything of its parent).
fn production_code(text: &str) -> String {
    let no_comments = Regex::new(r"//[^\n]*").unwrap().replace_all(text, "");
    let declaration = Regex::new(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*;").unwrap();
    let code = declaration.replace_all(&no_comments, "");
    // Inline test modules come last in this crate's files.
    let inline = Regex::new(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{").unwrap();
    match inline.find(&code) {
        Some(m) => code[..m.start()].to_string(),
        None => code.into_owned(),
    }
}

/// The modules that exist only in tests: declared `#[cfg(test)] mod name;`, and their children.
fn test_only(files: &BTreeMap<String, PathBuf>) -> BTreeSet<String> {
    let declaration =
        Regex::new(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+(\w+)\s*;").unwrap();
    let mut found = BTreeSet::new();
    for (module, file) in files {
        let text = std::fs::read_to_string(file).unwrap();
        for caps in declaration.captures_iter(&text) {
            found.insert(match module.as_str() {
                "" => caps[3].to_string(),
                parent => format!("{parent}::{}", &caps[3]),
            });
        }
    }
    let children: Vec<String> = files
        .keys()
        .filter(|module| {
            found
                .iter()
                .any(|test| module.starts_with(&format!("{test}::")))
        })
        .cloned()
        .collect();
    found.extend(children);
    found
}

/// The longest module that `segments` starts with.
fn resolve(names: &BTreeSet<String>, segments: &[String]) -> Option<String> {
    (1..=segments.len())
        .rev()
        .map(|n| segments[..n].join("::"))
        .find(|name| names.contains(name))
}

/// Module → the modules it uses.
pub fn import_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let files = modules(src);
    let names: BTreeSet<String> = files.keys().cloned().collect();
    // `crate::a::b`, `super::super::a`, `self::a`, optionally ending in a `{...}` group.
    // (`pub(crate)` and `pub(super)` name no module: a path needs at least one more segment.)
    let path_re = Regex::new(r"\b(crate|super|self)((?:::\w+)*)(::\{[^;]*?\}|::\*)?").unwrap();
    let mut graph = BTreeMap::new();
    let tests = test_only(&files);
    for (module, file) in &files {
        if tests.contains(module) {
            continue;
        }
        let code = production_code(&std::fs::read_to_string(file).unwrap());
        let here: Vec<String> = if module.is_empty() {
            Vec::new()
        } else {
            module.split("::").map(String::from).collect()
        };
        let mut uses = BTreeSet::new();
        let mut add = |segments: Vec<String>| {
            if let Some(target) = resolve(&names, &segments) {
                if target != *module && !target.is_empty() {
                    uses.insert(target);
                }
            }
        };
        for caps in path_re.captures_iter(&code) {
            if caps[2].is_empty() && caps.get(3).is_none() {
                continue;
            }
            let mut base: Vec<String> = match &caps[1] {
                "crate" => Vec::new(),
                "super" => here[..here.len().saturating_sub(1)].to_vec(),
                _ => here.clone(),
            };
            let mut rest: Vec<String> = caps[2]
                .split("::")
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect();
            while rest.first().map(String::as_str) == Some("super") {
                base.pop();
                rest.remove(0);
            }
            base.extend(rest);
            match caps.get(3).filter(|g| g.as_str() != "::*") {
                Some(group) => {
                    let inner = &group.as_str()[3..group.as_str().len() - 1];
                    for item in inner.split(',') {
                        let first: Vec<String> = item
                            .trim()
                            .trim_start_matches('{')
                            .split("::")
                            .map(|s| s.split_whitespace().next().unwrap_or("").to_string())
                            .filter(|s| !s.is_empty() && s != "self" && !s.starts_with('{'))
                            .collect();
                        let mut path = base.clone();
                        path.extend(first);
                        add(path);
                    }
                }
                None => add(base),
            }
        }
        // A child module named by a relative path (`worker::Queue`, `use block::X`).
        let depth = here.len();
        for child in names.iter().filter(|n| {
            let parts: Vec<&str> = n.split("::").collect();
            parts.len() == depth + 1 && (depth == 0 || n.starts_with(&format!("{module}::")))
        }) {
            let last = child.rsplit("::").next().unwrap();
            let declaration =
                Regex::new(&format!(r"(pub(\([^)]*\))?\s+)?mod\s+{last}\s*;")).unwrap();
            let body = declaration.replace_all(&code, "");
            let relative = Regex::new(&format!(r"(?m)(^|[^\w:]){last}::")).unwrap();
            if relative.is_match(&body) && !module.is_empty() {
                uses.insert(child.clone());
            }
        }
        graph.insert(module.clone(), uses);
    }
    graph
}

/// The strongly connected components of more than one module (Tarjan).
pub fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.found.push(component);
            }
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !state.index.contains_key(v.as_str()) {
            visit(&mut state, v);
        }
    }
    state.found
}

/// Panics naming every circle of `graph`, with the edges that close it.
pub fn assert_no_circles(graph: &BTreeMap<String, BTreeSet<String>>) {
    let found = circles(graph);
    let report: Vec<String> = found
        .iter()
        .map(|circle| {
            let edges: Vec<String> = circle
                .iter()
                .map(|m| {
                    let inside: Vec<&str> = graph[m]
                        .iter()
                        .filter(|t| circle.contains(t))
                        .map(String::as_str)
                        .collect();
                    format!("{m} -> {inside:?}")
                })
                .collect();
            edges.join("; ")
        })
        .collect();
    assert!(found.is_empty(), "import circles: {report:#?}");
}

/// Panics naming every path through the crate root's items (`crate::EngineError`) in the
/// production code under `src`: inside a crate, items are named by the module that defines
/// them, as a path through the root would hide a module edge from the graph. A
/// `#[macro_export]` macro lives at the root whatever module defines it, so `crate::name!` of
/// one is allowed.
pub fn assert_no_paths_through_the_root(src: &Path) {
    let files = modules(src);
    let exported = Regex::new(r"#\[macro_export\]\s*macro_rules!\s*(\w+)").unwrap();
    let macros: BTreeSet<String> = files
        .values()
        .flat_map(|file| {
            let text = std::fs::read_to_string(file).unwrap();
            exported
                .captures_iter(&text)
                .map(|caps| caps[1].to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    let top: BTreeSet<&str> = files
        .keys()
        .filter(|m| !m.is_empty())
        .map(|m| m.split("::").next().unwrap())
        .chain(macros.iter().map(String::as_str))
        .collect();
    let root_path = Regex::new(r"\bcrate::(\{|\w+)").unwrap();
    let tests = test_only(&files);
    let mut through_root = Vec::new();
    for (module, file) in files.iter().filter(|(m, _)| !tests.contains(*m)) {
        let code = production_code(&std::fs::read_to_string(file).unwrap());
        for caps in root_path.captures_iter(&code) {
            if !top.contains(&caps[1]) {
                through_root.push(format!("{module}: crate::{}", &caps[1]));
            }
        }
    }
    assert!(through_root.is_empty(), "{through_root:#?}");
}

/// The import checks of the crate at `manifest_dir`: its graph has the `required` edges (proof
/// that the graph saw the crate's imports), no circle, and no path through the crate root.
pub fn check_crate_imports(manifest_dir: &str, required: &[(&str, &str)]) {
    let src = Path::new(manifest_dir).join("src");
    let graph = import_graph(&src);
    for (from, to) in required {
        assert!(
            graph.get(*from).is_some_and(|uses| uses.contains(*to)),
            "the import graph misses {from} -> {to}: {graph:?}"
        );
    }
    assert_no_circles(&graph);
    assert_no_paths_through_the_root(&src);
}
