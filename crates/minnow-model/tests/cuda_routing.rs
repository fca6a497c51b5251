//! Where the GPU's expert choices part from the official code's (ignored: needs a GPU;
//! `cargo test -p minnow-model --test cuda_routing -- --ignored --nocapture`).
//!
//! The GPU forward is BF16 with the router in F32 (like the official code's `router_dtype:
//! fp32`), so its expert sets must equal the F32 reference's wherever the reference was not
//! close to a tie. The fixtures' goldens give, per MoE layer and token, the chosen experts of the
//! F32 run and of the BF16 run and the routing margin (how far the choice was from a tie, in
//! biased-score units). The test asserts that every token whose margin in that layer exceeds
//! 0.01 (the threshold the fixtures' README gives for BF16 engines) gets the F32 reference's set,
//! and prints, per fixture, how many (token, layer) choices differ from each reference: the
//! evidence for where the GPU's top-1 disagreements with the goldens come from.

use std::collections::BTreeSet;
use std::path::PathBuf;

use minnow_model::batch::{Segment, Want};
use minnow_model::cuda::CudaRunner;
use minnow_model::ModelRunner;
use safetensors::SafeTensors;

fn fixture(name: &str) -> PathBuf {
    // As in cuda_fixtures.rs: the build path, else the working directory (a GPU machine).
    let built =
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures")).join(name);
    if built.is_dir() {
        built
    } else {
        std::env::current_dir()
            .unwrap()
            .join("tests/fixtures")
            .join(name)
    }
}

fn ints(st: &SafeTensors, name: &str) -> Option<Vec<i64>> {
    let t = st.tensor(name).ok()?;
    Some(
        t.data()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
    )
}

fn floats(st: &SafeTensors, name: &str) -> Vec<f32> {
    st.tensor(name)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn sets<T: Copy + Into<i64>>(ids: &[T], k: usize) -> Vec<BTreeSet<i64>> {
    ids.chunks(k)
        .map(|c| c.iter().map(|&e| e.into()).collect())
        .collect()
}

#[test]
#[ignore]
fn gpu_expert_choices_match_the_f32_reference_away_from_ties() {
    for name in ["llada2-tiny-v20", "llada2-tiny-v21", "llada2-tiny-v22"] {
        let dir = fixture(name);
        let bytes = std::fs::read(dir.join("golden.safetensors")).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let ids: Vec<u32> = ints(&st, "input_ids")
            .unwrap()
            .iter()
            .map(|&i| i as u32)
            .collect();
        let mut runner = CudaRunner::load(&dir, 0).expect("load the fixture onto the GPU");
        let c = runner.config().clone();
        let k = c.num_experts_per_tok;
        let pages: Vec<_> = (0..ids.len().div_ceil(c.block_size) as u32).collect();
        let segment = Segment {
            pages: &pages,
            start: 0,
            ids: &ids,
            want: Want::Nothing,
        };
        let gpu = runner.routing(&[segment]).unwrap();
        let moe_layers: Vec<usize> = (0..c.num_hidden_layers)
            .filter(|i| st.tensor(&format!("router.layer{i}.topk_ids")).is_ok())
            .collect();
        assert_eq!(
            gpu.len(),
            moe_layers.len(),
            "{name}: one routing per MoE layer"
        );
        let (mut vs_f32, mut vs_bf16, mut clear_wrong, mut choices) = (0, 0, 0, 0);
        for (layer, got) in moe_layers.iter().zip(&gpu) {
            let got = sets(got, k);
            let f32_ref = sets(
                &ints(&st, &format!("router.layer{layer}.topk_ids")).unwrap(),
                k,
            );
            let bf16_ref =
                ints(&st, &format!("router.layer{layer}.topk_ids_bf16")).map(|v| sets(&v, k));
            let margin = floats(&st, &format!("router.layer{layer}.margin"));
            for t in 0..ids.len() {
                choices += 1;
                if got[t] != f32_ref[t] {
                    vs_f32 += 1;
                    println!(
                        "{name} layer {layer} token {t}: GPU {:?} vs F32 reference {:?} (margin {:.4})",
                        got[t], f32_ref[t], margin[t]
                    );
                    if margin[t] > 0.01 {
                        clear_wrong += 1;
                    }
                }
                if bf16_ref.as_ref().is_some_and(|r| got[t] != r[t]) {
                    vs_bf16 += 1;
                }
            }
        }
        println!(
            "{name}: GPU expert sets differ from the F32 reference on {vs_f32} and from the BF16 \
             reference on {vs_bf16} of {choices} (token, layer) choices; {clear_wrong} of those \
             against F32 have margin > 0.01"
        );
        assert_eq!(
            clear_wrong, 0,
            "{name}: the GPU routed a token away from a clear F32 choice"
        );
    }
}
