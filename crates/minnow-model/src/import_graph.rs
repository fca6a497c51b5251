//! The crate has no import circles and names no item through the crate root's re-exports: the
//! engine's checker (`minnow-engine/src/import_graph/`, included here from its source) builds
//! the graph of which module uses which and fails naming the modules of any circle.

include!("../../minnow-engine/src/import_graph/checker.rs");

#[test]
fn no_module_imports_form_a_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = import_graph(&src);
    // The graph sees the edges it must: the CUDA loader builds the routed experts.
    assert!(
        graph["cuda::weights"].contains("cuda::experts"),
        "{graph:?}"
    );
    assert_no_circles(&graph);
}

#[test]
fn no_module_imports_through_the_crate_root() {
    assert_no_paths_through_the_root(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
}
