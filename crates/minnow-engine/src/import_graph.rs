//! The crate has no import circles: a test builds the graph of which module uses which (from the
//! `crate::`, `super::` and `self::` paths and child-module paths of every source file, test
//! code left out) and fails naming the modules of any circle. A module that re-exports or uses
//! a child's items is an edge to the child like any other, so `mod.rs` files that hold items
//! their children use count as circles too (ARCHITECTURE.md says so). No module may name an item
//! through the crate root's re-exports, which would hide its edge.

mod checker;

use std::collections::{BTreeMap, BTreeSet};

use checker::{check_crate_imports, circles};

/// No circle (the facade uses the core, the core its pages: edges the graph must see), and
/// inside the crate items are named by the module that defines them, never through the
/// facade's re-exports (`crate::EngineError`), which would hide a module edge.
#[test]
fn no_module_imports_form_a_circle_or_pass_through_the_root() {
    check_crate_imports(
        env!("CARGO_MANIFEST_DIR"),
        &[("engine", "engine::worker"), ("engine::core", "kv_cache")],
    );
}

#[test]
fn a_circle_is_found() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(m, uses)| (m.to_string(), uses.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(circles(&graph), vec![vec!["a", "b", "c"]]);
}
