//! The feed-forward half of a decoder layer: the dense SwiGLU MLP (model doc §7.5) and the MoE
//! layer with its router, routed experts and shared expert (§7.6–7.8).

use rayon::prelude::*;

use minnow_runtime::cpu::{linear, sigmoid, silu, Par};
use minnow_runtime::MatRef;

use crate::config::Config;
use crate::router::{route_blocks, route_grouped, Routing};
use crate::trace::RouterTrace;
use crate::weights::{Mlp, Moe};

/// `down(silu(gate(x)) ⊙ up(x))` for `n` rows of `x`.
/// Each projection reads its weight as stored; a quantized one (a routed expert of a quantized
/// `.mnw`) is dequantized for its own product only.
pub fn mlp(w: &Mlp, x: &[f32], n: usize, par: Par) -> Vec<f32> {
    let width = w.gate.rows();
    let mut gate = vec![0.0f32; n * width];
    let mut up = vec![0.0f32; n * width];
    w.gate.linear(x, n, &mut gate, par);
    w.up.linear(x, n, &mut up, par);
    for (g, u) in gate.iter_mut().zip(&up) {
        *g = silu(*g) * u;
    }
    let mut out = vec![0.0f32; n * w.down.rows()];
    w.down.linear(&gate, n, &mut out, par);
    out
}

/// The MoE layer for `n` rows of `m` (post-attention-normed). With block routing, `blocks` are
/// the row ranges of the routing blocks (each starts at a block boundary of its own sequence, so
/// a block of one request never shares an admission pool with another's); token-level routing
/// ignores them. Fills `trace` when given.
pub fn moe(
    c: &Config,
    w: &Moe,
    m: &[f32],
    n: usize,
    blocks: &[std::ops::Range<usize>],
    trace: Option<&mut RouterTrace>,
) -> Vec<f32> {
    let (e, k, dm) = (c.num_experts, c.num_experts_per_tok, c.hidden_size);

    // Router in F32: logits, sigmoid scores, biased selection scores.
    let mut logits = vec![0.0f32; n * e];
    linear(
        m,
        n,
        MatRef::from_f32(e, dm, &w.router),
        &mut logits,
        Par::Rayon,
    );
    let scores: Vec<f32> = logits.iter().map(|&l| sigmoid(l)).collect();
    let biased: Vec<f32> = scores
        .chunks_exact(e)
        .flat_map(|row| row.iter().zip(&w.expert_bias).map(|(s, b)| s + b))
        .collect();
    let routing: Routing = match c.expert_capacity {
        Some(capacity) => {
            let mut all = Routing {
                admitted: Some(Vec::new()),
                ..Routing::default()
            };
            for rows in blocks {
                let part = route_blocks(
                    &scores[rows.start * e..rows.end * e],
                    &biased[rows.start * e..rows.end * e],
                    e,
                    k,
                    capacity,
                    c.block_size,
                    c.routed_scaling_factor,
                );
                all.ids.extend(part.ids);
                all.weights.extend(part.weights);
                if let (Some(a), Some(p)) = (all.admitted.as_mut(), part.admitted) {
                    a.extend(p);
                }
            }
            debug_assert_eq!(all.ids.len(), n * k, "routing blocks must cover every row");
            all
        }
        None => route_grouped(
            &scores,
            &biased,
            e,
            k,
            c.n_group.expect("grouped routing config"),
            c.topk_group.expect("grouped routing config"),
            c.routed_scaling_factor,
        ),
    };

    // Rows per expert, as (row, slot) with slot = row · k + j.
    let mut assigned: Vec<Vec<usize>> = vec![Vec::new(); e];
    for (slot, &id) in routing.ids.iter().enumerate() {
        assigned[id as usize].push(slot);
    }
    let active: Vec<usize> = (0..e).filter(|&x| !assigned[x].is_empty()).collect();
    // Each active expert runs its rows sequentially; experts run in parallel.
    let outputs: Vec<Vec<f32>> = active
        .par_iter()
        .map(|&x| {
            let slots = &assigned[x];
            let mut rows = Vec::with_capacity(slots.len() * dm);
            for &slot in slots {
                let r = slot / k;
                rows.extend_from_slice(&m[r * dm..(r + 1) * dm]);
            }
            mlp(&w.experts[x], &rows, slots.len(), Par::Seq)
        })
        .collect();
    let mut by_slot = vec![0.0f32; n * k * dm];
    for (&x, out) in active.iter().zip(&outputs) {
        for (&slot, y) in assigned[x].iter().zip(out.chunks_exact(dm)) {
            by_slot[slot * dm..(slot + 1) * dm].copy_from_slice(y);
        }
    }

    // routed[t] = Σ_j w[t, j] · y[t, j] in F32, in slot order; then the shared expert is added.
    let mut out = match &w.shared {
        Some(shared) => mlp(shared, m, n, Par::Rayon),
        None => vec![0.0f32; n * dm],
    };
    out.par_chunks_mut(dm).enumerate().for_each(|(t, o)| {
        let mut routed = vec![0.0f32; dm];
        for j in 0..k {
            let wt = routing.weights[t * k + j];
            let y = &by_slot[(t * k + j) * dm..(t * k + j + 1) * dm];
            for (acc, v) in routed.iter_mut().zip(y) {
                *acc += wt * v;
            }
        }
        for (o, r) in o.iter_mut().zip(&routed) {
            *o += r;
        }
    });

    if let Some(t) = trace {
        t.logits = logits;
        t.topk_ids = routing.ids;
        t.topk_weights = routing.weights;
        t.block_admitted = routing.admitted;
    }
    out
}
