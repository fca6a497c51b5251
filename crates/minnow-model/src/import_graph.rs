//! The crate has no import circles and names no item through the crate root's re-exports: the
//! engine's checker (`minnow-engine/src/import_graph/`, included here from its source) builds
//! the graph of which module uses which and fails naming the modules of any circle.

include!("../../minnow-engine/src/import_graph/checker.rs");

/// No circle and no path through the crate root; the required edges (the CUDA loader builds the
/// routed experts) show the graph saw the crate's imports.
#[test]
fn no_module_imports_form_a_circle_or_pass_through_the_root() {
    check_crate_imports(
        env!("CARGO_MANIFEST_DIR"),
        &[("cuda::weights", "cuda::experts")],
    );
}
