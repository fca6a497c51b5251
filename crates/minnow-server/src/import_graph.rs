//! The binary has no import circles: the engine's checker (`minnow-engine/src/import_graph/`,
//! included here from its source) builds the graph of which module uses which and fails naming
//! the modules of any circle (a `mod.rs` holding items its children use counts as one), and no
//! module names an item through the crate root.

include!("../../minnow-engine/src/import_graph/checker.rs");

/// No circle and no path through the crate root; the required edges (the routes parse through
/// `openai`, the Responses API's streams reuse the chat streams' `sse`) show the graph saw the
/// crate's imports.
#[test]
fn no_module_imports_form_a_circle_or_pass_through_the_root() {
    check_crate_imports(
        env!("CARGO_MANIFEST_DIR"),
        &[
            ("server::routes", "server::openai"),
            ("server::responses_api::stream", "server::sse"),
        ],
    );
}
