//! The crate has no import circles and names no item through the crate root's re-exports: the
//! engine's checker (`minnow-engine/src/import_graph/`, included here from its source) builds
//! the graph of which module uses which and fails naming the modules of any circle (a `mod.rs`
//! holding items its children use counts as one).

include!("../../minnow-engine/src/import_graph/checker.rs");

/// No circle and no path through the crate root; the required edges (the CPU products read
/// quantized codes) show the graph saw the crate's imports.
#[test]
fn no_module_imports_form_a_circle_or_pass_through_the_root() {
    check_crate_imports(
        env!("CARGO_MANIFEST_DIR"),
        &[("cpu::quant_linear", "quant")],
    );
}
