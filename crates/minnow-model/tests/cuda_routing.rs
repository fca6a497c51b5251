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

mod common;

use std::collections::BTreeSet;

use common::{fixture, Golden, ALL};
use minnow_model::batch::{Segment, Want};
use minnow_model::cuda::CudaRunner;
use minnow_model::ModelRunner;

fn sets<T: Copy + Into<i64>>(ids: &[T], k: usize) -> Vec<BTreeSet<i64>> {
    ids.chunks(k)
        .map(|c| c.iter().map(|&e| e.into()).collect())
        .collect()
}

#[test]
#[ignore]
fn gpu_expert_choices_match_the_f32_reference_away_from_ties() {
    for name in ALL {
        let golden = Golden::load(name);
        let ids = golden.input_ids();
        let mut runner =
            CudaRunner::load(&fixture(name), 0).expect("load the fixture onto the GPU");
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
            .filter(|i| golden.has(&format!("router.layer{i}.topk_ids")))
            .collect();
        assert_eq!(
            gpu.len(),
            moe_layers.len(),
            "{name}: one routing per MoE layer"
        );
        let (mut vs_f32, mut vs_bf16, mut clear_wrong, mut choices) = (0, 0, 0, 0);
        for (layer, got) in moe_layers.iter().zip(&gpu) {
            let got = sets(got, k);
            let f32_ref = sets(&golden.i64(&format!("router.layer{layer}.topk_ids")), k);
            let bf16_key = format!("router.layer{layer}.topk_ids_bf16");
            let bf16_ref = golden
                .has(&bf16_key)
                .then(|| sets(&golden.i64(&bf16_key), k));
            let margin = golden.f32(&format!("router.layer{layer}.margin"));
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
