//! Every CUDA kernel against a plain CPU reference on fresh random inputs (ignored: needs a GPU;
//! run with `cargo test -p minnow-runtime --test cuda_kernels -- --ignored`).
//!
//! BF16 outputs must be within a relative error (‖gpu − ref‖ / ‖ref‖) of 1e-2, F32 outputs within
//! 1e-5; discrete outputs (expert choices, argmax) must match exactly; NaN never passes. Outputs
//! are poisoned (NaN) before each launch so that unwritten elements fail.
//!
//! Each test draws a fresh seed and prints it (libtest shows a failing test's output);
//! `MINNOW_KERNEL_SEED=N` replays seed N. A test of a kernel this GPU cannot run fails, naming
//! what is missing, unless `MINNOW_ALLOW_SKIPS=1` (then it prints that it was skipped).

use half::bf16;
use minnow_runtime::cuda::ops::{self, AttentionShape, RouterShape};
use minnow_runtime::cuda::tma::{Bf16Rows, TensorMaps};
use minnow_runtime::cuda::{DeviceBuffer, Gpu, Graph};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

fn gpu() -> Gpu {
    Gpu::new(0).expect("these tests need a CUDA GPU")
}

/// Names the environment variable that replays a test's random inputs.
const SEED_VAR: &str = "MINNOW_KERNEL_SEED";

fn rng() -> StdRng {
    // Fresh inputs every run unless a seed is given; printed so a failure can be replayed.
    let seed: u64 = match std::env::var(SEED_VAR) {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{SEED_VAR}={text:?} is not an unsigned integer")),
        Err(_) => rand::random(),
    };
    println!("seed {seed} (replay with {SEED_VAR}={seed})");
    StdRng::seed_from_u64(seed)
}

/// A test that cannot run on this GPU: a failure naming the reason, or, with
/// `MINNOW_ALLOW_SKIPS=1`, a printed "SKIPPED" (libtest has no skipped state).
fn cannot_run(test: &str, reason: &str) {
    if std::env::var("MINNOW_ALLOW_SKIPS").as_deref() == Ok("1") {
        println!("SKIPPED {test}: {reason}");
        eprintln!("SKIPPED {test}: {reason}");
    } else {
        panic!("{test} did not run: {reason} (MINNOW_ALLOW_SKIPS=1 accepts the skip)");
    }
}

/// Whether the TMA grouped GEMM runs on this GPU (the sm_90 kernels and its shared memory);
/// when it does not, `test` reports it through [`cannot_run`].
fn grouped_tma_runs(g: &Gpu, test: &str) -> bool {
    let runs = ops::grouped_tma_supported(g, 16, 1024, 2048);
    if !runs {
        cannot_run(
            test,
            &format!(
                "the TMA grouped GEMM cannot run on {}: it needs the sm_90 kernels and its \
                 shared memory",
                g.name()
            ),
        );
    }
    runs
}

fn randn(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| (rng.gen::<f32>() * 2.0 - 1.0) * scale * 1.7)
        .collect()
}

fn to_bf16(x: &[f32]) -> Vec<bf16> {
    x.iter().map(|&v| bf16::from_f32(v)).collect()
}

fn r(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

fn rel_err(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    assert!(got.iter().all(|x| x.is_finite()), "non-finite GPU output");
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum();
    let den: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

fn check_bf16(name: &str, got: &[f32], want: &[f32]) {
    let e = rel_err(got, want);
    println!("{name}: rel err {e:.2e}");
    assert!(e <= 1e-2, "{name}: relative error {e} > 1e-2");
}

fn check_f32(name: &str, got: &[f32], want: &[f32]) {
    let e = rel_err(got, want);
    println!("{name}: rel err {e:.2e}");
    assert!(e <= 1e-5, "{name}: relative error {e} > 1e-5");
}

fn poisoned_bf16(g: &Gpu, n: usize) -> DeviceBuffer<bf16> {
    g.upload(&vec![bf16::NAN; n]).unwrap()
}

fn poisoned_f32(g: &Gpu, n: usize) -> DeviceBuffer<f32> {
    g.upload(&vec![f32::NAN; n]).unwrap()
}

fn read_bf16(g: &Gpu, b: &DeviceBuffer<bf16>) -> Vec<f32> {
    let mut v = vec![bf16::ZERO; b.len()];
    g.read(b, 0, &mut v).unwrap();
    v.iter().map(|x| x.to_f32()).collect()
}

fn read<T: Copy + Default>(g: &Gpu, b: &DeviceBuffer<T>) -> Vec<T> {
    let mut v = vec![T::default(); b.len()];
    g.read(b, 0, &mut v).unwrap();
    v
}

/// Row-major `x [m, k] . w [n, k]^T` in F64 over the given values.
fn matmul_t(x: &[f32], w: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    let mut y = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0f64;
            for p in 0..k {
                acc += x[i * k + p] as f64 * w[j * k + p] as f64;
            }
            y[i * n + j] = acc as f32;
        }
    }
    y
}

fn rmsnorm_ref(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(v, w)| r(w * r(v * inv))).collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn embed_rows_gathers() {
    let g = gpu();
    let mut rng = rng();
    let (v, d, t) = (300, 64, 37);
    let table = to_bf16(&randn(&mut rng, v * d, 1.0));
    let ids: Vec<u32> = (0..t).map(|_| rng.gen_range(0..v as u32)).collect();
    let (dt, di, out) = (
        g.upload(&table).unwrap(),
        g.upload(&ids).unwrap(),
        poisoned_bf16(&g, t * d),
    );
    ops::embed_rows(&g, di.ptr(), dt.ptr(), out.ptr(), t, d).unwrap();
    let got = read_bf16(&g, &out);
    // The residual stream's F32 rows: the same values, widened.
    let wide = poisoned_f32(&g, t * d);
    ops::embed_rows_f32(&g, di.ptr(), dt.ptr(), wide.ptr(), t, d).unwrap();
    let got_wide = read(&g, &wide);
    for (i, &id) in ids.iter().enumerate() {
        for j in 0..d {
            assert_eq!(got[i * d + j], table[id as usize * d + j].to_f32());
            assert_eq!(got_wide[i * d + j], table[id as usize * d + j].to_f32());
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn add_rmsnorm_matches_reference() {
    let g = gpu();
    let mut rng = rng();
    for &(t, d) in &[(5usize, 64usize), (33, 2048), (3, 4096)] {
        // An F32 stream with bits below BF16's precision: they must survive the add.
        let h = randn(&mut rng, t * d, 2.0);
        let delta = to_bf16(&randn(&mut rng, t * d, 1.0));
        let w = to_bf16(&randn(&mut rng, d, 1.0));
        let (dh, dd, dw, out) = (
            g.upload(&h).unwrap(),
            g.upload(&delta).unwrap(),
            g.upload(&w).unwrap(),
            poisoned_bf16(&g, t * d),
        );
        ops::add_rmsnorm(&g, dh.ptr(), dd.ptr(), dw.ptr(), out.ptr(), t, d, 1e-6).unwrap();
        let (mut want_h, mut want) = (vec![], vec![]);
        let wf: Vec<f32> = w.iter().map(|x| x.to_f32()).collect();
        for i in 0..t {
            let row: Vec<f32> = (0..d)
                .map(|j| h[i * d + j] + delta[i * d + j].to_f32())
                .collect();
            want.extend(rmsnorm_ref(&row, &wf, 1e-6));
            want_h.extend(row);
        }
        // The residual add is one F32 addition: exact against the host's.
        assert!(
            read(&g, &dh) == want_h,
            "add_rmsnorm: h is not h + delta in F32"
        );
        check_bf16("add_rmsnorm out", &read_bf16(&g, &out), &want);
        // Without a delta the stream is left alone.
        ops::add_rmsnorm(&g, dh.ptr(), 0, dw.ptr(), out.ptr(), t, d, 1e-6).unwrap();
        assert!(read(&g, &dh) == want_h, "rmsnorm without a delta changed h");
        check_bf16("rmsnorm out", &read_bf16(&g, &out), &want);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn silu_mul_matches_reference() {
    let g = gpu();
    let mut rng = rng();
    let (rows, w) = (19, 512);
    let gu = to_bf16(&randn(&mut rng, rows * 2 * w, 4.0));
    let (dgu, out) = (g.upload(&gu).unwrap(), poisoned_bf16(&g, rows * w));
    ops::silu_mul(&g, dgu.ptr(), out.ptr(), rows, w).unwrap();
    let mut want = vec![];
    for i in 0..rows {
        for j in 0..w {
            let x = gu[i * 2 * w + j].to_f32();
            want.push(r(r(x / (1.0 + (-x).exp())) * gu[i * 2 * w + w + j].to_f32()));
        }
    }
    let all = read_bf16(&g, &out);
    check_bf16("silu_mul", &all, &want);
    // Groups of rows (the pooled experts' layout): rows 0..5 and 7..12 only, the same values.
    let grouped = poisoned_bf16(&g, rows * w);
    ops::silu_mul_groups(&g, dgu.ptr(), grouped.ptr(), 2, 5, 7, w).unwrap();
    let got = read_bf16(&g, &grouped);
    for i in 0..rows {
        let row = &got[i * w..(i + 1) * w];
        if i < 5 || (7..12).contains(&i) {
            assert!(row == &all[i * w..(i + 1) * w], "grouped silu row {i}");
        } else {
            assert!(
                row.iter().all(|v| v.is_nan()),
                "row {i} outside the groups written"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cublas_gemms_match_reference() {
    let g = gpu();
    let mut rng = rng();
    let (m, n, k) = (45, 192, 320);
    let x = to_bf16(&randn(&mut rng, m * k, 1.0));
    let w = to_bf16(&randn(&mut rng, n * k, 1.0));
    let (dx, dw, dy) = (
        g.upload(&x).unwrap(),
        g.upload(&w).unwrap(),
        poisoned_bf16(&g, m * n),
    );
    g.blas()
        .gemm_bf16(dx.ptr(), dw.ptr(), dy.ptr(), m, n, k, n)
        .unwrap();
    let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
    let wf: Vec<f32> = w.iter().map(|v| v.to_f32()).collect();
    check_bf16(
        "gemm_bf16",
        &read_bf16(&g, &dy),
        &matmul_t(&xf, &wf, m, n, k),
    );
    let xs = randn(&mut rng, m * k, 1.0);
    let ws = randn(&mut rng, n * k, 1.0);
    let (dx, dw, dy) = (
        g.upload(&xs).unwrap(),
        g.upload(&ws).unwrap(),
        poisoned_f32(&g, m * n),
    );
    g.blas()
        .gemm_f32(dx.ptr(), dw.ptr(), dy.ptr(), m, n, k)
        .unwrap();
    check_f32("gemm_f32", &read(&g, &dy), &matmul_t(&xs, &ws, m, n, k));
    // BF16 operands with an F32 result (the router): F32-exact products, F32 sums.
    let dy = poisoned_f32(&g, m * n);
    let (dx, dw) = (g.upload(&x).unwrap(), g.upload(&w).unwrap());
    g.blas()
        .gemm_bf16_f32out(dx.ptr(), dw.ptr(), dy.ptr(), m, n, k)
        .unwrap();
    check_f32(
        "gemm_bf16_f32out",
        &read(&g, &dy),
        &matmul_t(&xf, &wf, m, n, k),
    );
}

/// CPU reference of qk_norm_rope (the BF16 order of docs/model.md §7.4).
#[allow(clippy::too_many_arguments)]
fn rope_ref(x: &[f32], w: &[f32], pos: usize, rot: usize, theta: f32) -> Vec<f32> {
    let n = rmsnorm_ref(x, w, 1e-6);
    let half = rot / 2;
    let mut y = n.clone();
    for j in 0..half {
        let inv = 1.0 / theta.powf((2 * j) as f32 / rot as f32);
        let a = pos as f32 * inv;
        let (c, s) = (r(a.cos()), r(a.sin()));
        y[j] = r(r(n[j] * c) - r(n[j + half] * s));
        y[j + half] = r(r(n[j + half] * c) + r(n[j] * s));
    }
    y
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn qk_norm_rope_matches_reference() {
    let g = gpu();
    let mut rng = rng();
    for &(heads, kv, d, rot, pos0, t) in &[
        (16usize, 4usize, 128usize, 64usize, 4000usize, 9usize),
        (4, 2, 16, 8, 3, 5),
        // Flash's 40 heads (32 + 2 x 4: five CTAs of eight warps per token), the two-element
        // lanes of d 64 and the eight of d 256.
        (32, 4, 128, 64, 100, 3),
        (8, 2, 64, 32, 7, 4),
        (4, 2, 256, 128, 50, 3),
        // A prefill chunk's worth of rows at mini's shape and at head dim 64.
        (16, 4, 128, 64, 900, 259),
        (8, 2, 64, 32, 7, 258),
    ] {
        let shape = AttentionShape {
            heads,
            kv_heads: kv,
            head_dim: d,
            rotary_dim: rot,
            block: 32,
        };
        let width = (heads + 2 * kv) * d;
        let qkv = to_bf16(&randn(&mut rng, t * width, 1.0));
        let qw = to_bf16(&randn(&mut rng, d, 1.0));
        let kw = to_bf16(&randn(&mut rng, d, 1.0));
        // The sequence's pages in a pool of twice as many, in scrambled order.
        let n_pages = (pos0 + t).div_ceil(32);
        let table = page_table(n_pages, 2 * n_pages);
        let cap = 2 * n_pages * 32;
        let slot = |pos: usize| table[pos / 32] as usize * 32 + pos % 32;
        let (dqkv, dqw, dkw) = (
            g.upload(&qkv).unwrap(),
            g.upload(&qw).unwrap(),
            g.upload(&kw).unwrap(),
        );
        let (q, kc, vc) = (
            poisoned_bf16(&g, t * heads * d),
            poisoned_bf16(&g, cap * kv * d),
            poisoned_bf16(&g, cap * kv * d),
        );
        let dpos = g
            .upload(&(pos0..pos0 + t).map(|p| p as i32).collect::<Vec<_>>())
            .unwrap();
        let dslot = g
            .upload(&(pos0..pos0 + t).map(|p| slot(p) as i32).collect::<Vec<_>>())
            .unwrap();
        let theta = 600000.0;
        let cos_sin = g.alloc::<u32>(ops::rope_cos_sin_len(&shape, t)).unwrap();
        ops::rope_cos_sin(&g, &shape, dpos.ptr(), cos_sin.ptr(), t, theta).unwrap();
        ops::qk_norm_rope(
            &g,
            &shape,
            dqkv.ptr(),
            dqw.ptr(),
            dkw.ptr(),
            q.ptr(),
            kc.ptr(),
            vc.ptr(),
            cos_sin.ptr(),
            dslot.ptr(),
            t,
            1e-6,
        )
        .unwrap();
        let (gq, gk, gv) = (read_bf16(&g, &q), read_bf16(&g, &kc), read_bf16(&g, &vc));
        let qwf: Vec<f32> = qw.iter().map(|v| v.to_f32()).collect();
        let kwf: Vec<f32> = kw.iter().map(|v| v.to_f32()).collect();
        let (mut wq, mut gotq, mut wk, mut gotk, mut wv, mut gotv) =
            (vec![], vec![], vec![], vec![], vec![], vec![]);
        for i in 0..t {
            let row: Vec<f32> = qkv[i * width..(i + 1) * width]
                .iter()
                .map(|v| v.to_f32())
                .collect();
            for h in 0..heads {
                wq.extend(rope_ref(
                    &row[h * d..(h + 1) * d],
                    &qwf,
                    pos0 + i,
                    rot,
                    theta,
                ));
                gotq.extend_from_slice(&gq[(i * heads + h) * d..(i * heads + h + 1) * d]);
            }
            for h in 0..kv {
                let kr = &row[(heads + h) * d..(heads + h + 1) * d];
                wk.extend(rope_ref(kr, &kwf, pos0 + i, rot, theta));
                let off = (slot(pos0 + i) * kv + h) * d;
                gotk.extend_from_slice(&gk[off..off + d]);
                wv.extend_from_slice(&row[(heads + kv + h) * d..(heads + kv + h + 1) * d]);
                gotv.extend_from_slice(&gv[off..off + d]);
            }
        }
        check_bf16("rope q", &gotq, &wq);
        check_bf16("rope k", &gotk, &wk);
        assert_eq!(gotv, wv, "V must be cached unchanged");
    }
}

/// Block-causal attention reference in F64: out[t, h] over keys 0..limit(pos0 + t).
#[allow(clippy::too_many_arguments)]
fn attention_ref(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    t: usize,
    pos0: usize,
    heads: usize,
    kv: usize,
    d: usize,
    block: usize,
) -> Vec<f32> {
    let group = heads / kv;
    let mut out = vec![0f32; t * heads * d];
    let end = pos0 + t;
    for i in 0..t {
        let lim = (((pos0 + i) / block + 1) * block).min(end);
        for h in 0..heads {
            let g = h / group;
            let qr = &q[(i * heads + h) * d..(i * heads + h + 1) * d];
            let s: Vec<f64> = (0..lim)
                .map(|j| {
                    let kr = &k[(j * kv + g) * d..(j * kv + g + 1) * d];
                    qr.iter()
                        .zip(kr)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
                        / (d as f64).sqrt()
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let p: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let sum: f64 = p.iter().sum();
            for c in 0..d {
                let acc: f64 = (0..lim)
                    .map(|j| p[j] * v[(j * kv + g) * d + c] as f64)
                    .sum();
                out[(i * heads + h) * d + c] = (acc / sum) as f32;
            }
        }
    }
    out
}

/// A block table of `n` pages drawn from a pool of `pool` pages, in a scrambled order.
fn page_table(n: usize, pool: usize) -> Vec<u32> {
    let mut pages: Vec<u32> = (0..pool as u32).collect();
    let mut rng = rng();
    pages.shuffle(&mut rng);
    pages.truncate(n);
    pages
}

/// One batched attention launch per entry of `splits` over `segments` (prefix, tokens), each
/// with its own scrambled block table into one shared pool, against the per-segment reference;
/// the outputs (BF16 values widened), one per entry, all from the same inputs.
fn check_attention_batch(
    g: &Gpu,
    shape: &AttentionShape,
    segments: &[(usize, usize)],
    splits: &[ops::AttentionSplits],
) -> Vec<Vec<f32>> {
    let mut rng = rng();
    let (heads, kv, d) = (shape.heads, shape.kv_heads, shape.head_dim);
    let page = shape.block;
    let pages: Vec<usize> = segments
        .iter()
        .map(|&(p, t)| (p + t).div_ceil(page))
        .collect();
    let pool_pages: usize = pages.iter().sum::<usize>() + 3;
    let all = page_table(pool_pages, pool_pages);
    let t_total: usize = segments.iter().map(|s| s.1).sum();
    let q = to_bf16(&randn(&mut rng, t_total * heads * d, 2.0));
    // The pool starts poisoned with NaN-free garbage; each segment's keys go to its pages.
    let mut kpool = to_bf16(&randn(&mut rng, pool_pages * page * kv * d, 50.0));
    let mut vpool = to_bf16(&randn(&mut rng, pool_pages * page * kv * d, 50.0));
    let (mut segs, mut tables, mut logical) = (vec![], vec![], vec![]);
    let (mut row0, mut used) = (0usize, 0usize);
    for (si, &(pos0, t)) in segments.iter().enumerate() {
        let end = pos0 + t;
        let table: Vec<u32> = all[used..used + pages[si]].to_vec();
        used += pages[si];
        let k = to_bf16(&randn(&mut rng, end * kv * d, 2.0));
        let v = to_bf16(&randn(&mut rng, end * kv * d, 1.0));
        for pos in 0..end {
            let slot = table[pos / page] as usize * page + pos % page;
            kpool[slot * kv * d..(slot + 1) * kv * d]
                .copy_from_slice(&k[pos * kv * d..(pos + 1) * kv * d]);
            vpool[slot * kv * d..(slot + 1) * kv * d]
                .copy_from_slice(&v[pos * kv * d..(pos + 1) * kv * d]);
        }
        segs.push([row0 as i32, t as i32, pos0 as i32, tables.len() as i32]);
        tables.extend(table.iter().map(|&p| p as i32));
        logical.push((k, v));
        row0 += t;
    }
    let lens: Vec<usize> = segments.iter().map(|s| s.1).collect();
    let tiles = ops::attention_tiles(shape, &lens);
    let wide_tiles = ops::attention_wide_tiles(shape, &lens);
    let flat = |x: &[[i32; 4]]| x.iter().flatten().copied().collect::<Vec<i32>>();
    let flat2 = |x: &[[i32; 2]]| x.iter().flatten().copied().collect::<Vec<i32>>();
    let (dsegs, dtiles, dwide, dtables) = (
        g.upload(&flat(&segs)).unwrap(),
        g.upload(&flat2(&tiles)).unwrap(),
        g.upload(&flat2(&wide_tiles)).unwrap(),
        g.upload(&tables).unwrap(),
    );
    let (dq, dk, dv) = (
        g.upload(&q).unwrap(),
        g.upload(&kpool).unwrap(),
        g.upload(&vpool).unwrap(),
    );
    let batch = ops::AttentionBatch {
        segs: dsegs.ptr(),
        tiles: dtiles.ptr(),
        tables: dtables.ptr(),
        tiles_count: tiles.len(),
        wide_tiles: dwide.ptr(),
        wide_tiles_count: wide_tiles.len(),
    };
    let f = |x: &[bf16]| x.iter().map(|v| v.to_f32()).collect::<Vec<f32>>();
    let mut outputs = Vec::new();
    for &splits in splits {
        let (po, pml) = ops::attention_scratch_len(shape, t_total, splits.count());
        let (dpo, dpml, out) = (
            poisoned_f32(g, po),
            poisoned_f32(g, pml),
            poisoned_bf16(g, t_total * heads * d),
        );
        ops::attention(
            g,
            shape,
            dq.ptr(),
            dk.ptr(),
            dv.ptr(),
            dpo.ptr(),
            dpml.ptr(),
            out.ptr(),
            &batch,
            t_total,
            splits,
        )
        .unwrap();
        let got = read_bf16(g, &out);
        let mut row0 = 0;
        for (&(pos0, t), (k, v)) in segments.iter().zip(&logical) {
            let qs = &q[row0 * heads * d..(row0 + t) * heads * d];
            let want = attention_ref(&f(qs), &f(k), &f(v), t, pos0, heads, kv, d, page);
            check_bf16(
                &format!("attention h{heads} g{kv} d{d} prefix {pos0} t {t} splits {splits:?} in a batch of {}", segments.len()),
                &got[row0 * heads * d..(row0 + t) * heads * d],
                &want,
            );
            row0 += t;
        }
        outputs.push(got);
    }
    outputs
}

/// The attention shape of a test case: half the head dim rotated, blocks (and pages) of 32.
fn test_attention_shape(heads: usize, kv_heads: usize, head_dim: usize) -> AttentionShape {
    AttentionShape {
        heads,
        kv_heads,
        head_dim,
        rotary_dim: head_dim / 2,
        block: 32,
    }
}

/// (heads, kv heads, head dim, segments (prefix, tokens)).
type AttentionShapeCase = (usize, usize, usize, Vec<(usize, usize)>);

/// (heads, kv heads, head dim, segments (prefix, tokens), key splits).
type AttentionCase = (usize, usize, usize, Vec<(usize, usize)>, usize);

#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_matches_reference() {
    let g = gpu();
    // (heads, kv, d, segments (prefix, tokens), splits): prefill-like, decode-like with splits,
    // tiny shapes, a prefix that is not block aligned, a forward that straddles blocks, GQA
    // groups that do not divide 64, and batches of segments of different lengths and prefixes.
    let cases: Vec<AttentionCase> = vec![
        (16, 4, 128, vec![(0, 96)], 1),
        (16, 4, 128, vec![(1024, 32)], 33),
        (16, 4, 128, vec![(70, 45)], 3),
        (4, 2, 16, vec![(32, 64)], 1),
        (4, 2, 16, vec![(13, 40)], 5),
        (8, 8, 64, vec![(200, 20)], 2),
        (
            16,
            4,
            128,
            vec![(1024, 32), (0, 45), (64, 32), (13, 7), (96, 32)],
            4,
        ),
        (4, 2, 16, vec![(32, 64), (13, 40), (0, 1)], 1),
        (6, 2, 64, vec![(0, 96), (40, 30)], 2),
        (6, 2, 32, vec![(64, 32)], 1),
        (48, 2, 128, vec![(32, 33)], 3),
    ];
    for (heads, kv, d, segments, splits) in cases {
        let shape = test_attention_shape(heads, kv, d);
        check_attention_batch(&g, &shape, &segments, &[ops::AttentionSplits::Even(splits)]);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_in_one_cta_per_tile_gives_the_bits_of_a_cta_per_chunk() {
    let g = gpu();
    // Prefill-like forwards over several 256-key chunks, chunks cut inside a tile's keys, a
    // prefix that ends inside a chunk, batches of segments of different lengths, GQA groups that
    // do not divide 64 (2 tokens per tile for 24 heads per KV head).
    let cases: Vec<AttentionShapeCase> = vec![
        (16, 4, 128, vec![(0, 700)]),
        (16, 4, 128, vec![(1000, 300)]),
        (
            16,
            4,
            128,
            vec![(1024, 32), (0, 600), (300, 45), (13, 7), (2000, 64)],
        ),
        (8, 8, 64, vec![(200, 333)]),
        (6, 2, 64, vec![(0, 96), (40, 530)]),
        (48, 2, 128, vec![(250, 40)]),
    ];
    // On compute capability 9.0, head dim 128 runs the wgmma kernel (unless MINNOW_ATTN_WGMMA=0):
    // the comparison must not silently stop covering it.
    let mut on_wgmma = 0;
    for (heads, kv, d, segments) in cases {
        let shape = test_attention_shape(heads, kv, d);
        on_wgmma += usize::from(ops::attention_wgmma_supported(&g, &shape));
        let chunks = segments
            .iter()
            .map(|&(p, t)| (p + t).div_ceil(ops::attention_chunk_keys()))
            .max()
            .unwrap();
        let outputs = check_attention_batch(
            &g,
            &shape,
            &segments,
            &[
                ops::AttentionSplits::FixedChunks(chunks),
                ops::AttentionSplits::FixedChunksInOneCta,
            ],
        );
        let differ = outputs[0]
            .iter()
            .zip(&outputs[1])
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(
            differ,
            0,
            "h{heads} g{kv} d{d} {segments:?}: {differ} of {} outputs differ between a CTA per \
             chunk and one CTA per tile",
            outputs[0].len()
        );
    }
    eprintln!("{on_wgmma} cases on the wgmma kernel");
    if g.uses_sm90a_ptx() && minnow_runtime::cuda::tuning::tuning().attention_wgmma {
        assert!(
            on_wgmma >= 4,
            "only {on_wgmma} cases ran the wgmma attention kernel"
        );
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Top-k of `vals` over candidates (None = excluded), larger first, lower index on ties.
fn topk(vals: &[Option<f32>], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..vals.len()).filter(|&j| vals[j].is_some()).collect();
    idx.sort_by(|&a, &b| {
        vals[b]
            .unwrap()
            .partial_cmp(&vals[a].unwrap())
            .unwrap()
            .then(a.cmp(&b))
    });
    idx.truncate(k);
    idx
}

fn router_ref(logits: &[f32], bias: &[f32], t: usize, s: &RouterShape) -> (Vec<usize>, Vec<f32>) {
    let e = s.experts;
    let mut ids = vec![];
    let mut ws = vec![];
    let biased = |i: usize, j: usize| sigmoid(logits[i * e + j]) + bias[j];
    for i in 0..t {
        let cand: Vec<Option<f32>> = if let Some(c) = s.capacity {
            let b0 = i / s.block * s.block;
            let b1 = (b0 + s.block).min(t);
            let gmax: Vec<Option<f32>> = (0..e)
                .map(|j| {
                    Some(
                        (b0..b1)
                            .map(|r| biased(r, j))
                            .fold(f32::NEG_INFINITY, f32::max),
                    )
                })
                .collect();
            let pool = topk(&gmax, c);
            (0..e)
                .map(|j| pool.contains(&j).then(|| biased(i, j)))
                .collect()
        } else {
            let (ng, kg) = s.groups.unwrap();
            let gs = e / ng;
            let scores: Vec<Option<f32>> = (0..ng)
                .map(|gi| {
                    let mut v: Vec<f32> = (gi * gs..(gi + 1) * gs).map(|j| biased(i, j)).collect();
                    v.sort_by(|a, b| b.partial_cmp(a).unwrap());
                    Some(v[0] + v[1])
                })
                .collect();
            let keep = topk(&scores, kg);
            (0..e)
                .map(|j| keep.contains(&(j / gs)).then(|| biased(i, j)))
                .collect()
        };
        let chosen = topk(&cand, s.top_k);
        let sum: f32 = chosen.iter().map(|&j| sigmoid(logits[i * e + j])).sum();
        for &j in &chosen {
            ids.push(j);
            ws.push(sigmoid(logits[i * e + j]) / (sum + 1e-20) * s.scale);
        }
    }
    (ids, ws)
}

/// 2.2 block routing over 32-token blocks: top-`k` of `experts`, `capacity` admitted per block.
fn block_routing(experts: usize, top_k: usize, capacity: usize) -> RouterShape {
    RouterShape {
        experts,
        top_k,
        groups: None,
        capacity: Some(capacity),
        block: 32,
        scale: 2.5,
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn router_matches_reference() {
    let g = gpu();
    let mut rng = rng();
    let shapes = [
        RouterShape {
            experts: 256,
            top_k: 8,
            groups: Some((8, 4)),
            capacity: None,
            block: 32,
            scale: 2.5,
        },
        block_routing(256, 8, 48),
        RouterShape {
            experts: 16,
            top_k: 4,
            groups: Some((4, 2)),
            capacity: None,
            block: 32,
            scale: 2.5,
        },
        block_routing(16, 4, 6),
    ];
    // 77 tokens: two full routing blocks and a partial one, one token per route_block CTA;
    // 2,100 tokens: eight tokens per CTA and a partial last block.
    for (s, t) in shapes.iter().flat_map(|s| [(s, 77), (s, 2100)]) {
        let logits = randn(&mut rng, t * s.experts, 3.0);
        let bias = randn(&mut rng, s.experts, 0.1);
        let (dl, db) = (g.upload(&logits).unwrap(), g.upload(&bias).unwrap());
        let idx = g.upload(&vec![-1i32; t * s.top_k]).unwrap();
        let w = poisoned_f32(&g, t * s.top_k);
        ops::route(
            &g,
            s,
            dl.ptr(),
            db.ptr(),
            idx.ptr(),
            w.ptr(),
            t,
            ops::RoutingBlocks::Uniform,
        )
        .unwrap();
        let (want_ids, want_w) = router_ref(&logits, &bias, t, s);
        let got_ids: Vec<usize> = read(&g, &idx).iter().map(|&x| x as usize).collect();
        assert_eq!(
            got_ids, want_ids,
            "expert choice differs for {s:?} ({t} tokens)"
        );
        check_f32(
            &format!("router weights {s:?} ({t} tokens)"),
            &read(&g, &w),
            &want_w,
        );
    }
    // A batch's routing blocks as listed (row, rows) pairs: segments of 37 (a block and a
    // partial one), 20 and 64 rows, each cut at its own block boundaries, each block admitted on
    // its own rows only.
    for s in shapes.iter().filter(|s| s.capacity.is_some()) {
        let blocks: Vec<[i32; 2]> = vec![[0, 32], [32, 5], [37, 20], [57, 32], [89, 32]];
        let t = 121;
        let logits = randn(&mut rng, t * s.experts, 3.0);
        let bias = randn(&mut rng, s.experts, 0.1);
        let (dl, db) = (g.upload(&logits).unwrap(), g.upload(&bias).unwrap());
        let dblocks = g
            .upload(&blocks.iter().flatten().copied().collect::<Vec<i32>>())
            .unwrap();
        let idx = g.upload(&vec![-1i32; t * s.top_k]).unwrap();
        let w = poisoned_f32(&g, t * s.top_k);
        let listed = ops::RoutingBlocks::Listed {
            ptr: dblocks.ptr(),
            count: blocks.len(),
        };
        ops::route(&g, s, dl.ptr(), db.ptr(), idx.ptr(), w.ptr(), t, listed).unwrap();
        let (got_ids, got_w) = (read(&g, &idx), read(&g, &w));
        let k = s.top_k;
        for &[r0, n] in &blocks {
            let (r0, n) = (r0 as usize, n as usize);
            let rows = &logits[r0 * s.experts..(r0 + n) * s.experts];
            let (want_ids, want_w) = router_ref(rows, &bias, n, s);
            let got: Vec<usize> = got_ids[r0 * k..(r0 + n) * k]
                .iter()
                .map(|&x| x as usize)
                .collect();
            assert_eq!(got, want_ids, "listed block at row {r0} of {s:?}");
            check_f32(
                &format!("listed block at row {r0}"),
                &got_w[r0 * k..(r0 + n) * k],
                &want_w,
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn routing_that_dispatches_in_the_same_launch_gives_what_two_launches_give() {
    let g = gpu();
    let mut rng = rng();
    let (wide, narrow) = (block_routing(256, 8, 48), block_routing(16, 4, 6));
    // (shape, tokens, listed blocks (first row, rows), tile rows, packed shared expert): a
    // denoising step; a partial last block (CTAs with no token of their own still arrive); a
    // batch of 16 blocks at 32 tokens a CTA; few experts. Each runs three times on one counter,
    // the cases one after another, so a counter left anywhere but 0 would show.
    let x16: Vec<[i32; 2]> = (0..16).map(|b| [32 * b, 32]).collect();
    type Case = (RouterShape, usize, Option<Vec<[i32; 2]>>, usize, bool);
    let cases: Vec<Case> = vec![
        (wide, 32, None, 16, true),
        (wide, 32, None, 16, false),
        (wide, 77, None, 16, true),
        (wide, 512, Some(x16), 16, true),
        (narrow, 45, Some(vec![[0, 32], [32, 13]]), 64, false),
    ];
    let arrivals = g.upload(&[0i32]).unwrap();
    for round in 0..3 {
        for (s, t, listed, tile_rows, packed) in &cases {
            let (s, t, tile_rows, packed) = (*s, *t, *tile_rows, *packed);
            let (e, k) = (s.experts, s.top_k);
            let slots = e + usize::from(packed);
            let shared = packed.then_some(e);
            let logits = randn(&mut rng, t * e, 3.0);
            let bias = randn(&mut rng, e, 0.1);
            let (dl, db) = (g.upload(&logits).unwrap(), g.upload(&bias).unwrap());
            let dblocks = listed.as_ref().map(|b| {
                g.upload(&b.iter().flatten().copied().collect::<Vec<i32>>())
                    .unwrap()
            });
            let blocks = match (&dblocks, listed) {
                (Some(d), Some(b)) => ops::RoutingBlocks::Listed {
                    ptr: d.ptr(),
                    count: b.len(),
                },
                _ => ops::RoutingBlocks::Uniform,
            };
            // Two launches: route, then moe_dispatch.
            let (idx2, w2) = (
                g.upload(&vec![-1i32; t * k]).unwrap(),
                poisoned_f32(&g, t * k),
            );
            ops::route(&g, &s, dl.ptr(), db.ptr(), idx2.ptr(), w2.ptr(), t, blocks).unwrap();
            let two = Dispatched::new(&g, &idx2, t, k, slots, tile_rows, shared);
            // One launch.
            let a = t * k + shared.map_or(0, |_| t);
            let one = Dispatched {
                slot: g.upload(&vec![-1i32; a]).unwrap(),
                row_token: g.upload(&vec![-1i32; a]).unwrap(),
                tiles: g.alloc::<i32>(4 * two.max_tiles).unwrap(),
                num_tiles: g.upload(&[-1i32]).unwrap(),
                scratch: g
                    .alloc::<i32>(ops::moe_dispatch_scratch_len(slots))
                    .unwrap(),
                max_tiles: two.max_tiles,
                tile_rows,
            };
            let (idx1, w1) = (
                g.upload(&vec![-1i32; t * k]).unwrap(),
                poisoned_f32(&g, t * k),
            );
            let after = ops::DispatchAfter {
                experts: slots,
                tile_rows,
                shared_expert: shared,
                slot_pos: one.slot.ptr(),
                row_token: one.row_token.ptr(),
                tiles: one.tiles.ptr(),
                num_tiles: one.num_tiles.ptr(),
                arrivals: arrivals.ptr(),
            };
            ops::route_and_dispatch_in_one_launch(
                &g,
                &s,
                dl.ptr(),
                db.ptr(),
                idx1.ptr(),
                w1.ptr(),
                t,
                blocks,
                &after,
            )
            .unwrap();
            let what = format!("round {round}: {t} tokens of {s:?}, packed {packed}");
            assert_eq!(read(&g, &idx1), read(&g, &idx2), "choices: {what}");
            let bits =
                |b: &DeviceBuffer<f32>| read(&g, b).iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&w1), bits(&w2), "weights: {what}");
            let n = read(&g, &two.num_tiles)[0] as usize;
            assert_eq!(
                read(&g, &one.num_tiles)[0] as usize,
                n,
                "tile count: {what}"
            );
            let tiles = read(&g, &two.tiles)[..4 * n].to_vec();
            assert_eq!(read(&g, &one.tiles)[..4 * n], tiles[..], "tiles: {what}");
            // Rows within an expert are in no particular order: every assignment has a row of its
            // expert's range that reads its token, and no row is taken twice.
            let (idx, slot, row_token) = (
                read(&g, &idx1),
                read(&g, &one.slot),
                read(&g, &one.row_token),
            );
            let mut taken = vec![false; a];
            for (i, &p) in slot.iter().enumerate() {
                let (expert, token) = if i < t * k {
                    (idx[i], i / k)
                } else {
                    (e as i32, i - t * k)
                };
                let p = usize::try_from(p)
                    .unwrap_or_else(|_| panic!("assignment {i} has no row: {what}"));
                assert!(p < a && !taken[p], "row {p} of assignment {i}: {what}");
                taken[p] = true;
                assert_eq!(row_token[p] as usize, token, "row {p}'s token: {what}");
                let tile = tiles.chunks(4).find(|c| (c[1]..c[2]).contains(&(p as i32)));
                assert_eq!(tile.map(|c| c[0]), Some(expert), "row {p}'s expert: {what}");
            }
        }
    }
    assert_eq!(
        read(&g, &arrivals),
        vec![0],
        "the counter is 0 between launches"
    );
}

/// One `moe_dispatch` over the device routing `idx` (t tokens x k picks among e experts, and
/// one more assignment per token to the packed expert `shared` when given): each assignment's
/// row, each row's token and the tiles of at most `tile_rows` rows.
struct Dispatched {
    slot: DeviceBuffer<i32>,
    row_token: DeviceBuffer<i32>,
    tiles: DeviceBuffer<i32>,
    num_tiles: DeviceBuffer<i32>,
    /// The dispatch's scratch, kept alive as long as the outputs (the kernels read it).
    scratch: DeviceBuffer<i32>,
    max_tiles: usize,
    tile_rows: usize,
}

impl Dispatched {
    #[allow(clippy::too_many_arguments)]
    fn new(
        g: &Gpu,
        idx: &DeviceBuffer<i32>,
        t: usize,
        k: usize,
        e: usize,
        tile_rows: usize,
        shared: Option<usize>,
    ) -> Self {
        let a = t * k + shared.map_or(0, |_| t);
        let max_tiles = ops::moe_max_tiles(a, e, tile_rows);
        let d = Self {
            slot: g.alloc::<i32>(a).unwrap(),
            row_token: g.alloc::<i32>(a).unwrap(),
            tiles: g.alloc::<i32>(4 * max_tiles).unwrap(),
            num_tiles: g.alloc::<i32>(1).unwrap(),
            scratch: g.alloc::<i32>(ops::moe_dispatch_scratch_len(e)).unwrap(),
            max_tiles,
            tile_rows,
        };
        ops::moe_dispatch(
            g,
            idx.ptr(),
            t,
            k,
            e,
            tile_rows,
            shared,
            d.slot.ptr(),
            d.row_token.ptr(),
            d.tiles.ptr(),
            d.num_tiles.ptr(),
            d.scratch.ptr(),
        )
        .unwrap();
        d
    }

    fn expert_tiles(&self) -> ops::ExpertTiles {
        ops::ExpertTiles {
            tiles: self.tiles.ptr(),
            num_tiles: self.num_tiles.ptr(),
            max_tiles: self.max_tiles,
            rows: self.tile_rows,
            settled: false,
        }
    }

    /// The same rows (same order: the dispatch's atomics ran once) cut into tiles of at most
    /// `rows`: the tile list of another kernel over this dispatch. Returns the tile and count
    /// buffers, which the [`ops::ExpertTiles`] borrows by address.
    fn recut(
        &self,
        g: &Gpu,
        rows: usize,
    ) -> (DeviceBuffer<i32>, DeviceBuffer<i32>, ops::ExpertTiles) {
        let count = read(g, &self.num_tiles)[0] as usize;
        let tiles = read(g, &self.tiles);
        let mut cut = Vec::new();
        for t in tiles[..4 * count].chunks(4) {
            let (e, mut p, end) = (t[0], t[1], t[2]);
            while p < end {
                let q = end.min(p + rows as i32);
                cut.extend_from_slice(&[e, p, q, 0]);
                p = q;
            }
        }
        let n = cut.len() / 4;
        let (tiles, num) = (g.upload(&cut).unwrap(), g.upload(&[n as i32]).unwrap());
        let expert_tiles = ops::ExpertTiles {
            tiles: tiles.ptr(),
            num_tiles: num.ptr(),
            max_tiles: n,
            rows,
            settled: false,
        };
        (tiles, num, expert_tiles)
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_dispatch_grouped_gemm_and_combine_match_reference() {
    let g = gpu();
    let mut rng = rng();
    // (tokens, k, experts incl. a packed shared one, n, k dim, tile rows, packed shared expert)
    let cases = [
        (
            32usize, 8usize, 257usize, 1024usize, 2048usize, 16usize, true,
        ),
        (32, 8, 256, 2048, 512, 16, false),
        (300, 4, 17, 64, 64, 64, true),
        (300, 4, 16, 64, 32, 16, false),
        (5, 2, 4, 128, 96, 64, false),
        // Rows wider than one pass of the fused combine + norm (8 columns x 256 threads).
        (7, 3, 5, 4608, 64, 16, true),
        // 24-wide experts: the general kernel (gate/up 48 x 64, down 64 x 24).
        (7, 2, 5, 48, 64, 16, true),
        (40, 2, 3, 64, 24, 64, false),
        // 8,800 routed assignments: the multi-CTA dispatch (five CTAs, the last one short).
        (1100, 8, 257, 64, 64, 64, true),
    ];
    for &(t, k, e, n, kd, tile_rows, packed) in &cases {
        let routed = if packed { e - 1 } else { e };
        let x = to_bf16(&randn(&mut rng, t * kd, 1.0));
        let w = to_bf16(&randn(&mut rng, e * n * kd, 0.05));
        // Distinct routed experts per token, skewed so that some experts get more than one tile.
        let idx = skewed_routing(&mut rng, t, k, routed, 0.5);
        // With a packed shared expert every token has one more assignment, to expert e - 1.
        let a = if packed { t * (k + 1) } else { t * k };
        let expert_of = |i: usize| if i < t * k { idx[i] as usize } else { e - 1 };
        let token_of = |i: usize| if i < t * k { i / k } else { i - t * k };
        let (dx, dw, didx) = (
            g.upload(&x).unwrap(),
            g.upload(&w).unwrap(),
            g.upload(&idx).unwrap(),
        );
        let dispatched = Dispatched::new(&g, &didx, t, k, e, tile_rows, packed.then_some(e - 1));
        let (slot, row_token) = (&dispatched.slot, &dispatched.row_token);
        let y = poisoned_bf16(&g, a * n);
        ops::grouped_gemm(
            &g,
            dx.ptr(),
            row_token.ptr(),
            dw.ptr(),
            y.ptr(),
            &dispatched.expert_tiles(),
            n,
            kd,
        )
        .unwrap();
        let gy = read_bf16(&g, &y);
        let slots = read(&g, slot);
        let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
        let wf: Vec<f32> = w.iter().map(|v| v.to_f32()).collect();
        let (mut got, mut want) = (vec![], vec![]);
        for (i, &p) in slots.iter().enumerate() {
            let (ex, ti, p) = (expert_of(i), token_of(i), p as usize);
            got.extend_from_slice(&gy[p * n..(p + 1) * n]);
            want.extend(matmul_t(
                &xf[ti * kd..(ti + 1) * kd],
                &wf[ex * n * kd..(ex + 1) * n * kd],
                1,
                n,
                kd,
            ));
        }
        check_bf16(
            &format!("grouped gemm t{t} k{k} e{e} n{n} k{kd} tiles of {tile_rows} packed {packed}"),
            &got,
            &want,
        );
        // The tile list covers every row exactly once, in tiles of at most tile_rows rows.
        let ntiles = read(&g, &dispatched.num_tiles)[0] as usize;
        let tl = read(&g, &dispatched.tiles);
        let covered: usize = (0..ntiles)
            .map(|i| (tl[4 * i + 2] - tl[4 * i + 1]) as usize)
            .sum();
        assert_eq!(covered, a);
        assert!((0..ntiles).all(|i| (tl[4 * i + 2] - tl[4 * i + 1]) as usize <= tile_rows));
        // Combine with F32 weights and a shared-expert term: its rows from the grouped output when
        // packed, else a separate dense input.
        let wts = randn(&mut rng, t * k, 1.0);
        let shared = to_bf16(&randn(&mut rng, t * n, 1.0));
        let (dwts, dsh, out) = (
            g.upload(&wts).unwrap(),
            g.upload(&shared).unwrap(),
            poisoned_bf16(&g, t * n),
        );
        let (sh, sh_rows) = if packed {
            (0, slot.ptr_at(t * k))
        } else {
            (dsh.ptr(), 0)
        };
        ops::moe_combine(
            &g,
            y.ptr(),
            slot.ptr(),
            dwts.ptr(),
            sh,
            sh_rows,
            out.ptr(),
            t,
            k,
            n,
        )
        .unwrap();
        let mut want = vec![];
        for ti in 0..t {
            for c in 0..n {
                let acc: f32 = (0..k)
                    .map(|j| wts[ti * k + j] * gy[slots[ti * k + j] as usize * n + c])
                    .sum();
                let sv = if packed {
                    gy[slots[t * k + ti] as usize * n + c]
                } else {
                    shared[ti * n + c].to_f32()
                };
                want.push(r(r(acc) + sv));
            }
        }
        check_bf16(
            &format!("moe_combine packed {packed}"),
            &read_bf16(&g, &out),
            &want,
        );
        // The combine fused with the next residual add + RMSNorm: bit-identical to moe_combine
        // followed by add_rmsnorm, and near the reference.
        let h = randn(&mut rng, t * n, 2.0);
        let norm_w = to_bf16(&randn(&mut rng, n, 1.0));
        let (h_two, h_fused, dnw) = (
            g.upload(&h).unwrap(),
            g.upload(&h).unwrap(),
            g.upload(&norm_w).unwrap(),
        );
        let (out_two, out_fused) = (poisoned_bf16(&g, t * n), poisoned_bf16(&g, t * n));
        ops::add_rmsnorm(
            &g,
            h_two.ptr(),
            out.ptr(),
            dnw.ptr(),
            out_two.ptr(),
            t,
            n,
            1e-6,
        )
        .unwrap();
        let norm = ops::ResidualNorm {
            h: h_fused.ptr(),
            weight: dnw.ptr(),
            out: out_fused.ptr(),
            eps: 1e-6,
        };
        ops::moe_combine_add_rmsnorm(
            &g,
            y.ptr(),
            slot.ptr(),
            dwts.ptr(),
            sh,
            sh_rows,
            &norm,
            t,
            k,
            n,
        )
        .unwrap();
        let (got_h, got_out) = (read(&g, &h_fused), read_bf16(&g, &out_fused));
        // Poison (NaN) left anywhere fails these comparisons too.
        assert!(
            got_h == read(&g, &h_two),
            "fused combine + norm: h differs from combine then add_rmsnorm (packed {packed})"
        );
        assert!(
            got_out == read_bf16(&g, &out_two),
            "fused combine + norm: output differs from combine then add_rmsnorm (packed {packed})"
        );
        let nwf: Vec<f32> = norm_w.iter().map(|v| v.to_f32()).collect();
        let (mut want_h, mut want_out) = (vec![], vec![]);
        for ti in 0..t {
            let row: Vec<f32> = (0..n).map(|c| h[ti * n + c] + want[ti * n + c]).collect();
            want_out.extend(rmsnorm_ref(&row, &nwf, 1e-6));
            want_h.extend(row);
        }
        // Near the reference (its mix sums in another order, so a BF16 delta may be an ulp off).
        check_bf16(
            &format!("moe_combine_add_rmsnorm h packed {packed}"),
            &got_h,
            &want_h,
        );
        check_bf16(
            &format!("moe_combine_add_rmsnorm out packed {packed}"),
            &got_out,
            &want_out,
        );
    }
}

/// The grouped GEMM over `*_mma` codes against the CPU's decoding of the same codes: uneven
/// expert segments, both tile heights, K not a multiple of the 128-column stage, more than 8
/// rows in a 16-row tile, shapes for the general kernel, every group size, and (tiled shapes) a
/// packed BF16 shared expert as the last slot. The reference multiplies code x scale in F32; the
/// rows of one expert must also be bit-identical when the same tokens are dispatched alone, and
/// between 16- and 64-row tiles.
#[test]
#[ignore = "needs a CUDA GPU"]
fn grouped_gemm_over_codes_matches_reference() {
    use minnow_runtime::quant::{self, QuantEncoding};
    let g = gpu();
    let mut rng = rng();
    // (tokens, k, experts, n, k dim, tile rows, group)
    let cases = [
        (
            32usize, 8usize, 64usize, 1024usize, 2048usize, 16usize, 128usize,
        ),
        (300, 4, 17, 128, 192, 64, 64),
        (40, 2, 5, 64, 96, 16, 32),
        (9, 3, 4, 64, 32, 64, 16),
        // A partial last stage (K = 2,064; not for 4-bit codes, whose K is whole pairs of
        // steps) and tokens past the first 8 of a 16-row tile.
        (24, 6, 8, 128, 2064, 16, 16),
        // A CTA's last 128 columns cut short (n = 80: five of its eight warps).
        (20, 3, 6, 80, 128, 16, 32),
        // The general kernel: n not a multiple of 64.
        (7, 2, 5, 40, 64, 16, 16),
        // NVFP4's shapes (K % 64 == 0) with a partial last stage (K = 2,112).
        (24, 6, 8, 128, 2112, 64, 16),
        // FP8's blocks: three 128-row blocks of scales per expert, three 128-column groups
        // (the cases above give it blocks cut short, with groups of 64 and 16).
        (50, 4, 6, 384, 384, 64, 128),
    ];
    // `MINNOW_TEST_ENCODING=NAME` keeps one encoding (e.g. under compute-sanitizer, which is slow).
    let only = std::env::var("MINNOW_TEST_ENCODING").ok();
    let mut wgmma_cases = 0;
    // A tile height no kernel has: `run_as` takes it for 128-row tiles on the kernel that
    // decodes the codes into shared memory (`grouped_gemm_codes_ss`).
    const SS_ROWS: usize = ops::GROUPED_WGMMA_ROWS + 1;
    let mut ss_cases = 0;
    for encoding in [
        QuantEncoding::I8Mma,
        QuantEncoding::I4Mma,
        QuantEncoding::Nvfp4,
        QuantEncoding::Fp8Block,
    ] {
        if only.as_deref().is_some_and(|name| name != encoding.name()) {
            continue;
        }
        let kind = match encoding {
            QuantEncoding::I8Mma => ops::CodeKind::Int8,
            QuantEncoding::I4Mma => ops::CodeKind::Int4,
            QuantEncoding::Fp8Block => ops::CodeKind::E4m3,
            _ => ops::CodeKind::E2m1,
        };
        for &(t, k, e, n, kd, tile_rows, group) in &cases {
            // NVFP4 and FP8 run on the tiled kernels only (the loader widens other shapes), with
            // their blocks of 16 and 128.
            let nvfp4 = encoding == QuantEncoding::Nvfp4;
            let fp8 = encoding == QuantEncoding::Fp8Block;
            if (nvfp4 || fp8) && ops::repacked_bytes(encoding, n, kd).is_none() {
                continue;
            }
            // 4-bit codes take whole pairs of 16-column steps (the loader widens others).
            let four_bit = matches!(kind, ops::CodeKind::Int4 | ops::CodeKind::E2m1);
            if four_bit && !ops::codes4_cols_ok(kd) {
                continue;
            }
            // (FP8: the file's blocks are 128 x 128; the kernel's groups, `fp8_group`, lie
            // inside them.)
            let quant_group = match encoding {
                QuantEncoding::Nvfp4 => 16,
                QuantEncoding::Fp8Block => 128,
                _ => group,
            };
            let group = if fp8 {
                ops::fp8_group(kd).unwrap()
            } else {
                quant_group
            };
            let x = to_bf16(&randn(&mut rng, t * kd, 1.0));
            let mut codes = vec![];
            let mut scales = vec![];
            let mut band_scale = vec![];
            let mut wf = vec![0.0f32; e * n * kd];
            for ex in 0..e {
                // Expert 1 of NVFP4 with all-zero blocks and values that round to -0; of FP8,
                // a row of E4M3 subnormals (one value sets the block's scale) and -0.
                let mut values = randn(&mut rng, n * kd, 0.05);
                if nvfp4 && ex == 1 {
                    values[..32].iter_mut().for_each(|v| *v = 0.0);
                    values[kd..kd + 16].iter_mut().for_each(|v| *v = -1e-9);
                }
                if fp8 && ex == 1 {
                    values[..kd].iter_mut().for_each(|v| *v *= 1e-3);
                }
                let mut q = quant::quantize(encoding, n, kd, quant_group, &values).unwrap();
                if fp8 && ex == 1 {
                    q.codes[kd] = 0x80; // our quantizer writes no -0; another writer may
                }
                let out = &mut wf[ex * n * kd..(ex + 1) * n * kd];
                // The kernels multiply the exact codes and scale each group's F32 sum (NVFP4:
                // the exact E2M1 x E4M3 products, then the global scale): the reference weight
                // is the stored value, unrounded.
                q.view(encoding, n, kd, quant_group).dequantize(out);
                if nvfp4 {
                    let (c, s) = ops::nvfp4_fragment_order(n, kd, &q.codes, &q.scales);
                    codes.extend_from_slice(&c);
                    scales.extend_from_slice(&s);
                    band_scale.extend(std::iter::repeat_n(q.global_scale, n / 8));
                } else if fp8 {
                    let (c, s) = ops::fp8_fragment_order(n, kd, &q.codes, &q.scales);
                    codes.extend_from_slice(&c);
                    scales.extend_from_slice(&s);
                } else {
                    codes.extend_from_slice(&q.codes);
                    scales.extend_from_slice(&q.scales);
                }
            }
            let mut idx = vec![];
            for _ in 0..t {
                let mut chosen: Vec<i32> = vec![];
                while chosen.len() < k {
                    let c = if rng.gen::<f32>() < 0.5 {
                        rng.gen_range(0..e.min(3))
                    } else {
                        rng.gen_range(0..e)
                    } as i32;
                    if !chosen.contains(&c) {
                        chosen.push(c);
                    }
                }
                idx.extend(chosen);
            }
            let (dcodes, dscales) = (g.upload(&codes).unwrap(), g.upload(&scales).unwrap());
            if four_bit {
                // As the loader does: the files' order, then the kernels' word order.
                ops::codes4_word_order(&g, dcodes.ptr(), e, n, kd).unwrap();
            }
            // (Integer codes have no band scales: one unused value keeps the upload non-empty.)
            band_scale.push(1.0);
            let dband = g.upload(&band_scale).unwrap();
            // Where the tiled kernels run, the last expert is a packed shared expert: BF16
            // weights in the codes' fragment order, read instead of its codes.
            let shared_slot = ops::codes_tiled(n, group).then_some(e - 1);
            let shared_rows = to_bf16(&randn(&mut rng, n * kd, 0.05));
            let dshared = g
                .upload(&ops::bf16_fragment_order(n, kd, &shared_rows))
                .unwrap();
            if let Some(slot) = shared_slot {
                for (w, v) in wf[slot * n * kd..(slot + 1) * n * kd]
                    .iter_mut()
                    .zip(&shared_rows)
                {
                    *w = v.to_f32();
                }
            }
            let w = ops::CodeMatrices {
                kind,
                group,
                codes: dcodes.ptr(),
                scales: dscales.ptr(),
                band_scale: if nvfp4 { dband.ptr() } else { 0 },
                shared: shared_slot.map(|slot| (dshared.ptr(), slot)),
            };
            // The same codes with the last slot's own codes instead of the packed shared expert:
            // what the shared-memory kernel takes (its picks of that slot are not compared).
            let w_codes = ops::CodeMatrices { shared: None, ..w };
            let is_shared_pick = |i: usize| shared_slot == Some(idx[i] as usize);
            // FP8 also as W8A8 (E4M3 activations on FP8 tensor cores) where the GPU has them.
            let modes: &[bool] = if fp8 { &[false, true] } else { &[false] };
            for &w8a8 in modes {
                if w8a8 && !ops::w8a8_supported(&g, &w, n, kd) {
                    continue;
                }
                // `x`'s rows quantized to E4M3 on the device (the W8A8 kernels' activations):
                // the codes and scales, and the launch's view of them.
                let quantize_on_device = |dx: &DeviceBuffer<bf16>, t: usize| {
                    let codes = g.alloc::<u8>(t * kd).unwrap();
                    let scales = g.alloc::<f32>(t * kd / group).unwrap();
                    let rows = ops::E4m3Rows {
                        codes: codes.ptr(),
                        scales: scales.ptr(),
                    };
                    ops::quantize_rows_e4m3(&g, dx.ptr(), t, kd, group, &rows).unwrap();
                    (codes, scales, rows)
                };
                // `gated`: the tile's gate/up form (each expert's first n / 2 rows the gate, the
                // rest the up rows), silu_mul's n / 2 columns per row.
                // `settled`: the tiles read before the launch waits for the kernel before it (a
                // down projection's), after a synchronize so that the dispatch is done.
                let run_as = |idx: &[i32],
                              t: usize,
                              x: &[bf16],
                              tile_rows: usize,
                              gated: bool,
                              settled: bool|
                 -> (Vec<f32>, Vec<i32>) {
                    let (dx, didx) = (g.upload(x).unwrap(), g.upload(idx).unwrap());
                    let dispatch_rows = if tile_rows == SS_ROWS {
                        ops::GROUPED_WGMMA_ROWS
                    } else {
                        tile_rows
                    };
                    let dispatched = Dispatched::new(&g, &didx, t, k, e, dispatch_rows, None);
                    let y = poisoned_bf16(&g, t * k * n);
                    // W8A8: the rows quantized on the device (checked against the CPU below).
                    let xq_buffers = w8a8.then(|| quantize_on_device(&dx, t));
                    if tile_rows == SS_ROWS {
                        ops::grouped_gemm_codes_ss(
                            &g,
                            dx.ptr(),
                            dispatched.row_token.ptr(),
                            &w_codes,
                            y.ptr(),
                            &dispatched.expert_tiles(),
                            n,
                            kd,
                            gated,
                        )
                        .unwrap();
                        return (read_bf16(&g, &y), read(&g, &dispatched.slot));
                    }
                    if tile_rows == ops::GROUPED_WGMMA_ROWS {
                        ops::grouped_gemm_codes_wgmma(
                            &g,
                            dx.ptr(),
                            dispatched.row_token.ptr(),
                            &w,
                            y.ptr(),
                            &dispatched.expert_tiles(),
                            n,
                            kd,
                            gated,
                        )
                    } else {
                        if settled {
                            g.synchronize().unwrap();
                        }
                        ops::grouped_gemm_codes(
                            &g,
                            dx.ptr(),
                            xq_buffers.as_ref().map(|(_, _, rows)| rows),
                            dispatched.row_token.ptr(),
                            &w,
                            y.ptr(),
                            &ops::ExpertTiles {
                                settled,
                                ..dispatched.expert_tiles()
                            },
                            n,
                            kd,
                            gated,
                        )
                    }
                    .unwrap();
                    (read_bf16(&g, &y), read(&g, &dispatched.slot))
                };
                let run = |idx: &[i32], t: usize, x: &[bf16], tile_rows: usize| {
                    run_as(idx, t, x, tile_rows, false, false)
                };
                let (gy, slots) = run(&idx, t, &x, tile_rows);
                let x_bf16: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
                let mut xf = x_bf16.clone();
                if w8a8 {
                    // The device's E4M3 rows are the CPU quantizer's, byte for byte; the reference
                    // multiplies their values (code x scale) by the stored weights.
                    let (codes, scales) = quant::fp8::quantize_rows(t, kd, group, &xf);
                    let (dq, ds, _) = quantize_on_device(&g.upload(&x).unwrap(), t);
                    assert!(
                        read(&g, &dq) == ops::e4m3_rows_order(t, kd, &codes),
                        "t{t} k{kd} group {group}: E4M3 activation codes differ from the CPU's"
                    );
                    let got_scales: Vec<u32> = read(&g, &ds).iter().map(|v| v.to_bits()).collect();
                    let want_scales: Vec<u32> = scales.iter().map(|v| v.to_bits()).collect();
                    assert!(
                        got_scales == want_scales,
                        "t{t} k{kd} group {group}: E4M3 activation scales differ from the CPU's"
                    );
                    let table = quant::fp8::e4m3_table();
                    for (i, v) in xf.iter_mut().enumerate() {
                        *v = table[codes[i] as usize] * scales[i / group];
                    }
                }
                let (mut got, mut want) = (vec![], vec![]);
                for (i, &p) in slots.iter().enumerate() {
                    let (ex, ti, p) = (idx[i] as usize, i / k, p as usize);
                    got.extend_from_slice(&gy[p * n..(p + 1) * n]);
                    // (A packed shared expert's BF16 tiles read the BF16 rows.)
                    let rows = if Some(ex) == shared_slot {
                        &x_bf16
                    } else {
                        &xf
                    };
                    want.extend(matmul_t(
                        &rows[ti * kd..(ti + 1) * kd],
                        &wf[ex * n * kd..(ex + 1) * n * kd],
                        1,
                        n,
                        kd,
                    ));
                }
                let name = format!(
                    "{encoding}{} grouped gemm t{t} k{k} e{e} n{n} k{kd} tiles of {tile_rows} group {group} shared {shared_slot:?}",
                    if w8a8 { " (W8A8)" } else { "" }
                );
                check_bf16(&name, &got, &want);
                // Token 0 alone: its rows are bit-identical to the ones it got in the full batch.
                let (alone, alone_slots) = run(&idx[..k], 1, &x[..kd], tile_rows);
                for j in 0..k {
                    let (p_all, p_alone) = (slots[j] as usize, alone_slots[j] as usize);
                    assert!(
                        gy[p_all * n..(p_all + 1) * n] == alone[p_alone * n..(p_alone + 1) * n],
                        "{name}: token 0's expert {} output differs alone vs in the batch",
                        idx[j]
                    );
                }
                // The other tile heights (a batch's size picks one; 32-row tiles not with W8A8):
                // every pick's row bit-identical.
                for other_rows in [16, 32, 64] {
                    if other_rows == tile_rows || (other_rows == 32 && w8a8) {
                        continue;
                    }
                    let (other, other_slots) = run(&idx, t, &x, other_rows);
                    for (i, (&p, &q)) in slots.iter().zip(&other_slots).enumerate() {
                        let (p, q) = (p as usize, q as usize);
                        assert!(
                            gy[p * n..(p + 1) * n] == other[q * n..(q + 1) * n],
                            "{name}: pick {i} differs between tiles of {tile_rows} and {other_rows} rows"
                        );
                    }
                }
                // Tiles read before the wait (a down projection's settled list): the same bits
                // on every height.
                for rows in [16, 32, 64] {
                    if rows == 32 && w8a8 {
                        continue;
                    }
                    let (early, early_slots) = run_as(&idx, t, &x, rows, false, true);
                    for (i, (&p, &q)) in slots.iter().zip(&early_slots).enumerate() {
                        let (p, q) = (p as usize, q as usize);
                        assert!(
                            gy[p * n..(p + 1) * n] == early[q * n..(q + 1) * n],
                            "{name}: pick {i} differs with its tiles read before the wait ({rows} rows)"
                        );
                    }
                }
                // Tiles of 128 rows on the wgmma kernels (Hopper, BF16 activations), where they
                // take the shape: every pick's row bit-identical to the mma.sync tiles'.
                if !w8a8 && ops::codes_wgmma_supported(&g, &w, n, kd) {
                    let (wide, wide_slots) = run(&idx, t, &x, ops::GROUPED_WGMMA_ROWS);
                    for (i, (&p, &q)) in slots.iter().zip(&wide_slots).enumerate() {
                        let (p, q) = (p as usize, q as usize);
                        assert!(
                            gy[p * n..(p + 1) * n] == wide[q * n..(q + 1) * n],
                            "{name}: pick {i} differs between the wgmma kernel and tiles of {tile_rows} rows"
                        );
                    }
                    wgmma_cases += 1;
                }
                // INT4, INT8 and E4M3 on the kernel that decodes into shared memory (128-row
                // tiles): the same.
                if !w8a8 && ops::codes_ss_supported(&g, &w_codes, n, kd) {
                    let (wide, wide_slots) = run(&idx, t, &x, SS_ROWS);
                    for (i, (&p, &q)) in slots.iter().zip(&wide_slots).enumerate() {
                        if is_shared_pick(i) {
                            continue;
                        }
                        let (p, q) = (p as usize, q as usize);
                        assert!(
                            gy[p * n..(p + 1) * n] == wide[q * n..(q + 1) * n],
                            "{name}: pick {i} differs between the shared-memory wgmma kernel and tiles of {tile_rows} rows"
                        );
                    }
                    ss_cases += 1;
                }
                // Gated: every pick's row is silu_mul of its two launches' row, bit for bit, on
                // each tile height and on the wgmma kernel where it takes the shape.
                if !w8a8 && ops::codes_tiled(n, group) {
                    let half = n / 2;
                    let plain: Vec<bf16> = gy.iter().map(|&v| bf16::from_f32(v)).collect();
                    let dplain = g.upload(&plain).unwrap();
                    let dsilu = poisoned_bf16(&g, t * k * half);
                    ops::silu_mul(&g, dplain.ptr(), dsilu.ptr(), t * k, half).unwrap();
                    let silu = read_bf16(&g, &dsilu);
                    let mut heights = vec![16, 32, 64];
                    if ops::codes_wgmma_supported(&g, &w, n, kd) {
                        heights.push(ops::GROUPED_WGMMA_ROWS);
                    }
                    if ops::codes_ss_supported(&g, &w_codes, n, kd) {
                        heights.push(SS_ROWS);
                    }
                    for rows in heights {
                        let (gated, gated_slots) = run_as(&idx, t, &x, rows, true, false);
                        for (i, (&p, &q)) in slots.iter().zip(&gated_slots).enumerate() {
                            if rows == SS_ROWS && is_shared_pick(i) {
                                continue;
                            }
                            let (p, q) = (p as usize, q as usize);
                            assert!(
                                silu[p * half..(p + 1) * half] == gated[q * half..(q + 1) * half],
                                "{name}: pick {i} gated in tiles of {rows} rows differs from the \
                                 products then silu_mul"
                            );
                        }
                    }
                }
            }
        }
    }
    // On compute capability 9.0 the wgmma kernels must have been compared (every encoding has
    // cases of their shapes); elsewhere they are not loaded.
    if g.uses_sm90a_ptx() && only.is_none() {
        assert!(
            wgmma_cases >= 8,
            "only {wgmma_cases} cases ran on the wgmma kernels"
        );
    }
    eprintln!(
        "codes: {wgmma_cases} cases compared with the wgmma kernels, {ss_cases} with the \
         shared-memory ones"
    );
    if g.uses_sm90a_ptx() && only.is_none() {
        assert!(
            ss_cases >= 6,
            "only {ss_cases} cases ran on the shared-memory kernels"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn top1_softmax_and_conversion() {
    let g = gpu();
    let mut rng = rng();
    // Mini's vocabulary (16-byte rows: vector loads in rounds) and one that is not a multiple of
    // 8 (the one-by-one path).
    for (rows, v) in [(7, 157184), (3, 40_001)] {
        let mut x = randn(&mut rng, rows * v, 8.0);
        // A tie at the maximum in row 0: the lower index must win.
        x[10] = 40.0;
        x[20] = 40.0;
        // ... and in row 1 across two slices of the row.
        x[v + 3] = 40.0;
        x[v + 30_000] = 40.0;
        // ... and in row 2 inside one thread's round (vectors 256 apart) and across its rounds,
        // beside -inf logits (which add nothing to the sum).
        x[2 * v + 5 + 2048] = 40.0;
        x[2 * v + 5 + 4 * 2048] = 40.0;
        x[2 * v + 5 + 8 * 2048] = 40.0;
        x[2 * v..2 * v + 64].fill(f32::NEG_INFINITY);
        if rows > 3 {
            // Row 3 rises round after round.
            for (i, c) in (0..v).step_by(997).enumerate() {
                x[3 * v + c] = 10.0 + i as f32 * 0.25;
            }
        }
        let xb = to_bf16(&x);
        let (dx, tok, conf, f) = (
            g.upload(&xb).unwrap(),
            g.alloc::<u32>(rows).unwrap(),
            poisoned_f32(&g, rows),
            poisoned_f32(&g, rows * v),
        );
        let scratch = poisoned_f32(&g, rows * ops::TOP1_SLICES * 3);
        ops::top1_softmax(&g, dx.ptr(), scratch.ptr(), tok.ptr(), conf.ptr(), rows, v).unwrap();
        ops::bf16_to_f32(&g, dx.ptr(), f.ptr(), rows * v).unwrap();
        let xf: Vec<f32> = xb.iter().map(|b| b.to_f32()).collect();
        assert_eq!(read(&g, &f), xf);
        let (gt, gc) = (read(&g, &tok), read(&g, &conf));
        let mut want_c = vec![];
        for i in 0..rows {
            let row = &xf[i * v..(i + 1) * v];
            let (mut bi, mut bv) = (0, f32::NEG_INFINITY);
            for (j, &val) in row.iter().enumerate() {
                if val > bv {
                    bv = val;
                    bi = j;
                }
            }
            assert_eq!(gt[i] as usize, bi, "argmax of row {i} (vocab {v})");
            let s: f64 = row.iter().map(|&val| ((val - bv) as f64).exp()).sum();
            want_c.push((1.0 / s) as f32);
        }
        check_f32("top1 confidence", &gc, &want_c);
        assert_eq!(gt[0], 10);
        assert_eq!(gt[1], 3);
        assert_eq!(gt[2], 5 + 2048);
    }
}

/// The first `k` ids of a row in `topk_rows`' order, computed independently: values compared as
/// numbers (NaN below every number, so -0 and +0 tie), then lower id first.
fn topk_reference(row: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut ids: Vec<usize> = (0..row.len()).collect();
    ids.sort_by(|&a, &b| {
        let (x, y) = (row[a], row[b]);
        let by_value = match (x.is_nan(), y.is_nan()) {
            (true, true) => std::cmp::Ordering::Equal,
            (true, false) => std::cmp::Ordering::Greater,
            (false, true) => std::cmp::Ordering::Less,
            (false, false) => y.partial_cmp(&x).unwrap(),
        };
        by_value.then(a.cmp(&b))
    });
    ids[..k].iter().map(|&i| (i as u32, row[i])).collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn topk_rows_match_a_sorted_row() {
    let g = gpu();
    let mut rng = rng();
    for (v, k) in [
        (157184, ops::TOPK_MAX),
        (157184, 5),
        (100, ops::TOPK_MAX),
        (64, 64),
        (1, 1),
    ] {
        let rows = 6;
        // Narrow values: BF16 rounding makes long runs of equal values, so the k-th value has
        // many ties that only the lower id may break.
        let mut x = randn(&mut rng, rows * v, 2.0);
        if v > 100 {
            // Row 1: specials at the top and in the middle.
            x[v + 7] = f32::INFINITY;
            x[v + 9] = f32::NAN;
            x[v + 11] = f32::NEG_INFINITY;
            x[v + 13] = 10.0;
            x[v + 150_000] = 10.0;
            // Row 2: -0 and +0 above everything else, -0 first.
            for j in 0..v {
                x[2 * v + j] = -(j as f32 % 7.0) - 1.0;
            }
            x[2 * v + 40_000] = -0.0;
            x[2 * v + 50] = 0.0;
            x[2 * v + 100_000] = -0.0;
        }
        // Row 3: one value everywhere (the lowest ids win); row 4: all NaN but one.
        x[3 * v..4 * v].fill(1.5);
        x[4 * v..5 * v].fill(f32::NAN);
        x[4 * v + v / 2] = -3.0;
        let xb = to_bf16(&x);
        let xf: Vec<f32> = xb.iter().map(|b| b.to_f32()).collect();
        let dx = g.upload(&xb).unwrap();
        let ids = g.upload(&vec![u32::MAX; rows * k]).unwrap();
        let values = poisoned_f32(&g, rows * k);
        ops::topk_rows(&g, dx.ptr(), ids.ptr(), values.ptr(), rows, v, k).unwrap();
        let (got_ids, got_values) = (read(&g, &ids), read(&g, &values));
        for i in 0..rows {
            let want = topk_reference(&xf[i * v..(i + 1) * v], k);
            let got: Vec<(u32, f32)> = (0..k)
                .map(|j| (got_ids[i * k + j], got_values[i * k + j]))
                .collect();
            let same = got.iter().zip(&want).all(|(a, b)| {
                a.0 == b.0 && (a.1.to_bits() == b.1.to_bits() || (a.1.is_nan() && b.1.is_nan()))
            });
            assert!(
                same,
                "vocab {v}, k {k}, row {i}: got {got:?}, want {want:?}"
            );
        }
    }
    assert!(
        ops::topk_rows(&g, 0, 0, 0, 1, 10, 11).is_err(),
        "k above the vocabulary"
    );
    assert!(ops::topk_rows(&g, 0, 0, 0, 1, 1000, ops::TOPK_MAX + 1).is_err());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn graph_replay_reads_new_inputs() {
    let g = gpu();
    let mut rng = rng();
    let (v, d, t) = (50, 64, 8);
    let table = to_bf16(&randn(&mut rng, v * d, 1.0));
    let w = to_bf16(&randn(&mut rng, d, 1.0));
    let (dt, dw) = (g.upload(&table).unwrap(), g.upload(&w).unwrap());
    let ids = g.alloc::<u32>(t).unwrap();
    let (h, out) = (
        g.alloc::<f32>(t * d).unwrap(),
        g.alloc::<bf16>(t * d).unwrap(),
    );
    let graph = Graph::capture(&g, || {
        ops::embed_rows_f32(&g, ids.ptr(), dt.ptr(), h.ptr(), t, d)?;
        ops::add_rmsnorm(&g, h.ptr(), 0, dw.ptr(), out.ptr(), t, d, 1e-6)
    })
    .unwrap();
    let wf: Vec<f32> = w.iter().map(|x| x.to_f32()).collect();
    for _ in 0..3 {
        let host: Vec<u32> = (0..t).map(|_| rng.gen_range(0..v as u32)).collect();
        g.write(&ids, 0, &host).unwrap();
        graph.launch(&g).unwrap();
        let mut want = vec![];
        for &id in &host {
            let row: Vec<f32> = table[id as usize * d..(id as usize + 1) * d]
                .iter()
                .map(|x| x.to_f32())
                .collect();
            want.extend(rmsnorm_ref(&row, &wf, 1e-6));
        }
        check_bf16("graph replay", &read_bf16(&g, &out), &want);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn pooled_experts_route_and_batched_gemms_match_reference() {
    let g = gpu();
    let mut rng = rng();
    // (experts, top-k, capacity, tokens, d, expert width): mini's 2.2 step, a partial block and
    // a tiny model.
    for &(e, k, cap, t, d, iw) in &[
        (256usize, 8usize, 48usize, 32usize, 256usize, 64usize),
        (256, 8, 48, 5, 128, 64),
        (16, 4, 6, 32, 64, 32),
    ] {
        let shape = RouterShape {
            experts: e,
            top_k: k,
            groups: None,
            capacity: Some(cap),
            block: 32,
            scale: 2.5,
        };
        assert!(ops::pooled_experts_supported(&shape, t));
        let logits = randn(&mut rng, t * e, 3.0);
        let bias = randn(&mut rng, e, 0.1);
        // Packed experts (E + 1, the last one shared): gate/up [2I, d], down [d, I].
        let wgu = to_bf16(&randn(&mut rng, (e + 1) * 2 * iw * d, 0.05));
        let wd = to_bf16(&randn(&mut rng, (e + 1) * d * iw, 0.05));
        let (dl, db, dwgu, dwd) = (
            g.upload(&logits).unwrap(),
            g.upload(&bias).unwrap(),
            g.upload(&wgu).unwrap(),
            g.upload(&wd).unwrap(),
        );
        let idx = g.upload(&vec![-1i32; t * k]).unwrap();
        let tw = poisoned_f32(&g, t * k);
        let slot = g.upload(&vec![-1i32; t * k + t]).unwrap();
        let (pgu, pd) = (
            g.upload(&vec![0u64; cap + 1]).unwrap(),
            g.upload(&vec![0u64; cap + 1]).unwrap(),
        );
        let pool = ops::ExpertPool {
            gate_up: dwgu.ptr(),
            gate_up_stride: 2 * iw * d,
            down: dwd.ptr(),
            down_stride: d * iw,
            gate_up_ptrs: pgu.ptr(),
            down_ptrs: pd.ptr(),
            slot_pos: slot.ptr(),
            row_stride: 32,
        };
        ops::route_pooled(
            &g,
            &shape,
            dl.ptr(),
            db.ptr(),
            idx.ptr(),
            tw.ptr(),
            t,
            &pool,
        )
        .unwrap();
        let (want_ids, want_w) = router_ref(&logits, &bias, t, &shape);
        let got_ids: Vec<usize> = read(&g, &idx).iter().map(|&x| x as usize).collect();
        assert_eq!(got_ids, want_ids, "pooled router choices (e{e} t{t})");
        check_f32("pooled router weights", &read(&g, &tw), &want_w);
        // Pool entry q holds expert pool[q]; each assignment's row is q * 32 + token.
        let (gu_ptrs, d_ptrs, slots) = (read(&g, &pgu), read(&g, &pd), read(&g, &slot));
        let entry_expert =
            |q: usize| ((gu_ptrs[q] - dwgu.ptr()) / (2 * 2 * iw * d) as u64) as usize;
        for (q, &down) in d_ptrs.iter().enumerate() {
            let ex = entry_expert(q);
            assert!(ex <= e);
            assert_eq!((down - dwd.ptr()) as usize, ex * 2 * d * iw);
        }
        assert_eq!(
            entry_expert(cap),
            e,
            "the last pool entry is the shared expert"
        );
        for i in 0..t * k {
            let (q, tok) = (slots[i] as usize / 32, slots[i] as usize % 32);
            assert_eq!(tok, i / k);
            assert_eq!(entry_expert(q), want_ids[i], "row of assignment {i}");
        }
        for ti in 0..t {
            assert_eq!(slots[t * k + ti] as usize, cap * 32 + ti);
        }
        // Batched gate/up over the pool: every entry multiplies all tokens.
        let x = to_bf16(&randn(&mut rng, t * d, 1.0));
        let dx = g.upload(&x).unwrap();
        let out = poisoned_bf16(&g, (cap + 1) * 32 * 2 * iw);
        let xs = g.upload(&vec![dx.ptr(); cap + 1]).unwrap();
        let outs: Vec<u64> = (0..=cap)
            .map(|q| out.ptr() + (q * 32 * 2 * iw * 2) as u64)
            .collect();
        let douts = g.upload(&outs).unwrap();
        g.blas()
            .gemm_bf16_batched(xs.ptr(), pgu.ptr(), douts.ptr(), t, 2 * iw, d, cap + 1)
            .unwrap();
        let got = read_bf16(&g, &out);
        let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
        let (mut gv, mut wv) = (vec![], vec![]);
        for q in 0..=cap {
            let ex = entry_expert(q);
            let wf: Vec<f32> = wgu[ex * 2 * iw * d..(ex + 1) * 2 * iw * d]
                .iter()
                .map(|v| v.to_f32())
                .collect();
            wv.extend(matmul_t(&xf, &wf, t, 2 * iw, d));
            gv.extend_from_slice(&got[q * 32 * 2 * iw..(q * 32 + t) * 2 * iw]);
        }
        check_bf16(&format!("batched pool gate/up e{e} t{t}"), &gv, &wv);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn pool_gemm_matches_reference() {
    let g = gpu();
    if !ops::pool_gemm_supported(&g, 32, 128, 128) {
        cannot_run(
            "pool_gemm_matches_reference",
            &format!(
                "the TMA pool GEMM is off on {}: it needs the sm_90 kernels (Hopper, not forced \
                 off by MINNOW_PTX=sm80), its shared memory, and MINNOW_POOL_GEMM not 0",
                g.name()
            ),
        );
        return;
    }
    let mut rng = rng();
    // (entries, tokens, n, k, gated): mini's gate/up (+ SiLU) and down shapes, partial blocks.
    for &(b, t, n, k, gated) in &[
        (7usize, 32usize, 1024usize, 2048usize, true),
        (7, 32, 1024, 2048, false),
        (5, 32, 2048, 512, false),
        (3, 5, 256, 384, true),
        (3, 5, 256, 384, false),
        (1, 1, 128, 128, false),
    ] {
        // Entry q uses weight matrix (2q + 1) % experts of a packed array, X_q its own rows.
        let experts = 2 * b + 1;
        let w = to_bf16(&randn(&mut rng, experts * n * k, 0.05));
        let x = to_bf16(&randn(&mut rng, b * 32 * k, 1.0));
        let (dw, dx) = (g.upload(&w).unwrap(), g.upload(&x).unwrap());
        let width = if gated { n / 2 } else { n };
        let out = poisoned_bf16(&g, b * 32 * width);
        let pick = |q: usize| (2 * q + 1) % experts;
        let ws: Vec<u64> = (0..b)
            .map(|q| dw.ptr() + (pick(q) * n * k * 2) as u64)
            .collect();
        let xs: Vec<u64> = (0..b).map(|q| dx.ptr() + (q * 32 * k * 2) as u64).collect();
        let ys: Vec<u64> = (0..b)
            .map(|q| out.ptr() + (q * 32 * width * 2) as u64)
            .collect();
        let (dws, dxs, dys) = (
            g.upload(&ws).unwrap(),
            g.upload(&xs).unwrap(),
            g.upload(&ys).unwrap(),
        );
        let maps = TensorMaps::new(
            &g,
            &[
                Bf16Rows {
                    base: dx.ptr(),
                    cols: k,
                    rows: b * 32,
                    box_rows: ops::POOL_GEMM_TOKEN_ROWS,
                },
                Bf16Rows {
                    base: dw.ptr(),
                    cols: k,
                    rows: experts * n,
                    box_rows: ops::POOL_GEMM_WEIGHT_ROWS,
                },
            ],
        )
        .unwrap();
        ops::pool_gemm(
            &g,
            maps.get(0),
            maps.get(1),
            dxs.ptr(),
            dws.ptr(),
            dys.ptr(),
            t,
            n,
            k,
            b,
            gated,
            !gated,
        )
        .unwrap();
        let got = read_bf16(&g, &out);
        let (mut gv, mut wv) = (vec![], vec![]);
        for q in 0..b {
            let xf: Vec<f32> = x[q * 32 * k..(q * 32 + t) * k]
                .iter()
                .map(|v| v.to_f32())
                .collect();
            let e = pick(q);
            let wf: Vec<f32> = w[e * n * k..(e + 1) * n * k]
                .iter()
                .map(|v| v.to_f32())
                .collect();
            let y = matmul_t(&xf, &wf, t, n, k);
            if gated {
                // silu_mul on the BF16 gate/up outputs.
                for row in y.chunks(n) {
                    for c in 0..width {
                        let gate = r(row[c]);
                        wv.push(r(r(gate / (1.0 + (-gate).exp())) * r(row[width + c])));
                    }
                }
            } else {
                wv.extend(y);
            }
            gv.extend_from_slice(&got[q * 32 * width..(q * 32 + t) * width]);
            assert!(
                got[(q * 32 + t) * width..(q + 1) * 32 * width]
                    .iter()
                    .all(|v| v.is_nan()),
                "rows past the tokens written (entry {q}, {t} tokens)"
            );
        }
        check_bf16(
            &format!("pool gemm b{b} t{t} n{n} k{k} gated {gated}"),
            &gv,
            &wv,
        );
    }
}

/// Router logits: the wide kernel (many rows) and the narrow one (a few) give every output the
/// same bits, and both match an F64 reference; so does the tensor-core kernel of BF16 weights
/// (every row count, K % 16 == 0; 8 experts per CTA for few rows, 32 for many). Shapes: mini's router (256 experts over 2,048), a
/// 16-expert router (fewer experts than one wide CTA covers), K = 72 (columns past the last whole
/// 256-column group take the scalar path; BF16 weights take the F32 kernels), 40 experts over
/// 64 columns (experts past the last whole 32 of a CTA; four column steps for eight warps, as
/// for the fixtures' hidden size) and flash's 4,096 columns. The many rows take the cluster
/// kernel on Hopper (`router_cluster_rows`); run again with `MINNOW_ROUTER_CLUSTER_ROWS=100000`
/// for the one-CTA tiled kernel.
#[test]
#[ignore]
fn router_logits_are_the_same_bits_for_few_and_many_rows() {
    let g = gpu();
    let mut rng = rng();
    let tuning = minnow_runtime::cuda::tuning::tuning();
    // Past both thresholds: all rows take the wide F32 kernel or the tiled tensor-core one, and
    // the last 64-row tile is partial.
    let t = tuning
        .router_wide_rows
        .max(tuning.router_tiled_rows)
        .max(16)
        + 44;
    // K = 1040: 65 column steps, so the 8 summation ranges are uneven and end inside the tiled
    // kernel's 32-column slices, the last slice half past K; K = 64: some ranges are empty.
    for (e, k) in [
        (256, 2048),
        (16, 2048),
        (256, 72),
        (40, 64),
        (256, 4096),
        (24, 1040),
    ] {
        let x = to_bf16(&randn(&mut rng, t * k, 1.0));
        let w32 = randn(&mut rng, e * k, 0.05);
        let w16 = to_bf16(&w32);
        let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
        let dx = g.upload(&x).unwrap();
        for f32_weights in [true, false] {
            let wf: Vec<f32> = if f32_weights {
                w32.clone()
            } else {
                w16.iter().map(|v| v.to_f32()).collect()
            };
            // Both uploads live to the end of the iteration (the kernels read them).
            let (dw32, dw16) = (g.upload(&w32).unwrap(), g.upload(&w16).unwrap());
            let dw = if f32_weights { dw32.ptr() } else { dw16.ptr() };
            let all = poisoned_f32(&g, t * e);
            ops::router_logits(&g, dx.ptr(), dw, f32_weights, all.ptr(), t, e, k).unwrap();
            let all_v = read(&g, &all);
            check_f32(
                &format!("router logits {t}x{e}x{k} f32w={f32_weights}"),
                &all_v,
                &matmul_t(&xf, &wf, t, e, k),
            );
            // The first and the last 16 rows again, alone (the narrow kernel), and 3 and 37
            // rows (the narrow kernel with 4 rows per warp where `router_few_rows` allows).
            for (r0, n) in [(0, 16), (t - 16, 16), (5, 3), (7, 37)] {
                let few = poisoned_f32(&g, n * e);
                let x_at = dx.ptr() + (r0 * k * 2) as u64;
                ops::router_logits(&g, x_at, dw, f32_weights, few.ptr(), n, e, k).unwrap();
                let few_v = read(&g, &few);
                let same = few_v
                    .iter()
                    .zip(&all_v[r0 * e..(r0 + n) * e])
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "rows {r0}..+{n} of {e}x{k}: the kernels for few and many rows differ"
                );
            }
        }
    }
}

/// Distinct experts for each of `t` tokens, `k` each among `routed`, skewed: with probability
/// `hot` a pick goes to one of the first three experts, so they get rows of many tokens (several
/// tiles each).
fn skewed_routing(rng: &mut StdRng, t: usize, k: usize, routed: usize, hot: f32) -> Vec<i32> {
    let mut idx = vec![];
    for _ in 0..t {
        let mut chosen: Vec<i32> = vec![];
        while chosen.len() < k {
            let c = if rng.gen::<f32>() < hot {
                rng.gen_range(0..routed.min(3))
            } else {
                rng.gen_range(0..routed)
            } as i32;
            if !chosen.contains(&c) {
                chosen.push(c);
            }
        }
        idx.extend(chosen);
    }
    idx
}

/// One shape of the TMA grouped GEMM's tests: (tokens, k, experts incl. a packed shared one,
/// n, k dim, tile rows, packed, gated).
type TmaCase = (usize, usize, usize, usize, usize, usize, bool, bool);

/// A TMA grouped GEMM case on the device: random activations and experts, skewed routing
/// dispatched into tiles, and the weights' tensor map.
struct DispatchedCase {
    case: TmaCase,
    /// Assignment rows (with the packed shared expert's).
    a: usize,
    x: DeviceBuffer<bf16>,
    w: DeviceBuffer<bf16>,
    dispatched: Dispatched,
    maps: TensorMaps,
}

impl DispatchedCase {
    fn new(g: &Gpu, rng: &mut StdRng, case: TmaCase) -> Self {
        let (t, k, e, n, kd, tile_rows, packed, _) = case;
        let routed = if packed { e - 1 } else { e };
        let x = g.upload(&to_bf16(&randn(rng, t * kd, 1.0))).unwrap();
        let w = g.upload(&to_bf16(&randn(rng, e * n * kd, 0.05))).unwrap();
        let idx = g.upload(&skewed_routing(rng, t, k, routed, 0.3)).unwrap();
        let a = if packed { t * (k + 1) } else { t * k };
        let dispatched = Dispatched::new(g, &idx, t, k, e, tile_rows, packed.then_some(e - 1));
        let maps = TensorMaps::new(
            g,
            &[Bf16Rows {
                base: w.ptr(),
                cols: kd,
                rows: e * n,
                box_rows: ops::POOL_GEMM_WEIGHT_ROWS,
            }],
        )
        .unwrap();
        Self {
            case,
            a,
            x,
            w,
            dispatched,
            maps,
        }
    }

    /// Output columns per row: I = n / 2 when gated.
    fn width(&self) -> usize {
        let (_, _, _, n, _, _, _, gated) = self.case;
        if gated {
            n / 2
        } else {
            n
        }
    }

    fn name(&self) -> String {
        let (t, k, e, n, kd, tile_rows, packed, gated) = self.case;
        format!("t{t} k{k} e{e} n{n} k{kd} tiles of {tile_rows} packed {packed} gated {gated}")
    }

    /// The TMA kernel into `y`: the wgmma kernel for tiles of 128 rows.
    fn tma(&self, g: &Gpu, y: &DeviceBuffer<bf16>) {
        let (_, _, _, n, kd, tile_rows, _, gated) = self.case;
        let kernel = if tile_rows == ops::GROUPED_WGMMA_ROWS {
            ops::grouped_gemm_wgmma
        } else {
            ops::grouped_gemm_tma
        };
        kernel(
            g,
            self.maps.get(0),
            self.w.ptr(),
            self.x.ptr(),
            self.dispatched.row_token.ptr(),
            y.ptr(),
            &self.dispatched.expert_tiles(),
            n,
            kd,
            gated,
        )
        .unwrap();
    }

    /// Three launches of the streamed kernel ([`Self::tma`]) give exactly `want` (a race between
    /// the copies and the tensor cores would show as a difference between them), and rows outside
    /// the tiles stay unwritten.
    fn check_launches(&self, g: &Gpu, want: &[f32], kernel: &str) {
        let (outputs, name) = (self.a * self.width(), self.name());
        for launch in 0..3 {
            let y = poisoned_bf16(g, outputs + self.width());
            self.tma(g, &y);
            let got = read_bf16(g, &y);
            let differ = got[..outputs]
                .iter()
                .zip(want)
                .filter(|(p, q)| p.to_bits() != q.to_bits())
                .count();
            if differ > 0 {
                let width = self.width();
                let wrong: Vec<usize> = (0..outputs)
                    .filter(|&i| got[i].to_bits() != want[i].to_bits())
                    .collect();
                let first = wrong[0];
                let mut rows: Vec<usize> = wrong.iter().map(|i| i / width).collect();
                rows.dedup();
                let (lo, hi) = wrong.iter().fold((width, 0), |(lo, hi), i| {
                    (lo.min(i % width), hi.max(i % width))
                });
                // Which side moved: the reference recomputed, and the kernel launched again.
                let reference_again = self.four_warp(g) == want;
                let y2 = poisoned_bf16(g, outputs + width);
                self.tma(g, &y2);
                let again = read_bf16(g, &y2);
                let repeats = wrong
                    .iter()
                    .filter(|&&i| again[i].to_bits() == got[i].to_bits())
                    .count();
                panic!(
                    "{kernel} {name}, launch {launch}: {differ} of {outputs} outputs differ in bits (first: row {}, \
                     column {}: {} vs {}); rows {:?} (of {}), columns {lo}..={hi}; the reference recomputed is \
                     {}; a further launch repeats {repeats} of the {differ} wrong values",
                    first / width,
                    first % width,
                    got[first],
                    want[first],
                    &rows[..rows.len().min(12)],
                    rows.len(),
                    if reference_again { "the same" } else { "different" },
                );
            }
            assert!(
                got[outputs..].iter().all(|v| v.is_nan()),
                "{kernel} {name}: a row past the tiles was written"
            );
            println!("{kernel} {name}, launch {launch}: {outputs} outputs bit-identical");
        }
    }

    /// The reference: the 4-warp grouped kernels, then `silu_mul` when gated.
    fn four_warp(&self, g: &Gpu) -> Vec<f32> {
        self.four_warp_in(g, self.case.5.min(64))
    }

    /// The 4-warp grouped kernels (then `silu_mul` when gated) over the same rows cut into tiles
    /// of `rows` (16 or 64).
    fn four_warp_in(&self, g: &Gpu, rows: usize) -> Vec<f32> {
        let (_, _, _, n, kd, tile_rows, _, gated) = self.case;
        let y = poisoned_bf16(g, self.a * n);
        let (_cut, _count, tiles) = if tile_rows != rows {
            let (t, c, tiles) = self.dispatched.recut(g, rows);
            (Some(t), Some(c), tiles)
        } else {
            (None, None, self.dispatched.expert_tiles())
        };
        ops::grouped_gemm(
            g,
            self.x.ptr(),
            self.dispatched.row_token.ptr(),
            self.w.ptr(),
            y.ptr(),
            &tiles,
            n,
            kd,
        )
        .unwrap();
        if !gated {
            return read_bf16(g, &y);
        }
        let act = poisoned_bf16(g, self.a * self.width());
        ops::silu_mul(g, y.ptr(), act.ptr(), self.a, self.width()).unwrap();
        read_bf16(g, &act)
    }
}

/// The TMA grouped expert GEMM gives exactly the bits of the 4-warp grouped kernels it replaces
/// (and, gated, of those kernels followed by `silu_mul`), at mini's shapes, both tile heights,
/// with a packed shared expert and experts whose rows span several tiles; rows outside the tiles
/// stay unwritten.
#[test]
#[ignore = "needs a CUDA GPU"]
fn grouped_gemm_tma_gives_the_grouped_kernels_bits() {
    let g = gpu();
    if !grouped_tma_runs(&g, "grouped_gemm_tma_gives_the_grouped_kernels_bits") {
        return;
    }
    let mut rng = rng();
    let cases: [TmaCase; 9] = [
        (32, 8, 257, 1024, 2048, 16, true, true),
        (32, 8, 257, 2048, 512, 16, true, false),
        (300, 8, 256, 1024, 2048, 64, false, true),
        (300, 8, 256, 2048, 512, 64, false, false),
        (70, 4, 9, 256, 384, 16, false, true),
        (70, 4, 9, 256, 384, 64, false, false),
        // A batched step of 16 and of 64 blocks (the bench's x16 and x64).
        (512, 8, 256, 1024, 2048, 64, false, true),
        (512, 8, 256, 2048, 512, 64, false, false),
        (2048, 8, 256, 1024, 2048, 64, false, true),
    ];
    // MINNOW_TMA_CASES=8,8,8 replays chosen cases (indices, repeats allowed) with fresh inputs.
    let chosen: Vec<usize> = match std::env::var("MINNOW_TMA_CASES") {
        Ok(list) => list
            .split(',')
            .map(|i| i.trim().parse().expect("MINNOW_TMA_CASES: case indices"))
            .collect(),
        Err(_) => (0..cases.len()).collect(),
    };
    for i in chosen {
        let d = DispatchedCase::new(&g, &mut rng, cases[i]);
        d.check_launches(&g, &d.four_warp(&g), "TMA grouped GEMM");
    }
}

/// A tensor map re-pointed in place between launches is read afresh: the launches alternate
/// between two weight tensors through one map address, and each gives the 4-warp kernels' bits
/// over the tensor the map names now (a copy engine still holding the map it cached at that
/// address would copy the other tensor's weights).
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_tensor_map_rewritten_in_place_is_read_afresh() {
    let g = gpu();
    if !grouped_tma_runs(&g, "a_tensor_map_rewritten_in_place_is_read_afresh") {
        return;
    }
    let mut rng = rng();
    let case: TmaCase = (32, 8, 257, 2048, 512, 16, true, false);
    let (_, _, e, n, kd, _, _, _) = case;
    let mut d = DispatchedCase::new(&g, &mut rng, case);
    let mut other = g
        .upload(&to_bf16(&randn(&mut rng, e * n * kd, 0.05)))
        .unwrap();
    let mut want = vec![d.four_warp(&g)];
    std::mem::swap(&mut d.w, &mut other);
    want.push(d.four_warp(&g));
    for round in 0..6 {
        // Even rounds: the first tensor (the map's own until round 1); odd rounds: the other.
        std::mem::swap(&mut d.w, &mut other);
        let tensor = Bf16Rows {
            base: d.w.ptr(),
            cols: kd,
            rows: e * n,
            box_rows: ops::POOL_GEMM_WEIGHT_ROWS,
        };
        d.maps.set(&g, 0, &tensor).unwrap();
        let name = format!("TMA grouped GEMM, map rewritten (round {round})");
        d.check_launches(&g, &want[round % 2], &name);
    }
}

/// The TMA kernel's gate/up + down launch gives exactly the bits of its two launches (gate/up
/// gated, then down over that output), launch after launch, and leaves its counters zeroed for
/// the next one: a refinement-sized batch with the packed shared expert, a prefill-sized one in
/// 64-row tiles, and a small model whose items do not fill the GPU.
#[test]
#[ignore = "needs a CUDA GPU"]
fn grouped_tma_pair_gives_the_bits_of_two_launches() {
    let g = gpu();
    if !grouped_tma_runs(&g, "grouped_tma_pair_gives_the_bits_of_two_launches") {
        return;
    }
    let mut rng = rng();
    // (tokens, top-k, experts with the packed one, hidden, intermediate, tile rows, packed)
    let cases = [
        (32, 8, 257, 2048, 512, 16, true),
        (300, 8, 256, 2048, 512, 64, false),
        (7, 4, 9, 256, 128, 16, false),
    ];
    for (t, k, e, d, iw, tile_rows, packed) in cases {
        let name = format!("t{t} k{k} e{e} d{d} i{iw} tiles of {tile_rows} packed {packed}");
        let routed = if packed { e - 1 } else { e };
        let x = g.upload(&to_bf16(&randn(&mut rng, t * d, 1.0))).unwrap();
        let gate_up = g
            .upload(&to_bf16(&randn(&mut rng, e * 2 * iw * d, 0.05)))
            .unwrap();
        let down = g
            .upload(&to_bf16(&randn(&mut rng, e * d * iw, 0.05)))
            .unwrap();
        let idx = g
            .upload(&skewed_routing(&mut rng, t, k, routed, 0.3))
            .unwrap();
        let a = if packed { t * (k + 1) } else { t * k };
        let dispatched = Dispatched::new(&g, &idx, t, k, e, tile_rows, packed.then_some(e - 1));
        let box_rows = ops::POOL_GEMM_WEIGHT_ROWS;
        let maps = TensorMaps::new(
            &g,
            &[
                Bf16Rows {
                    base: gate_up.ptr(),
                    cols: d,
                    rows: e * 2 * iw,
                    box_rows,
                },
                Bf16Rows {
                    base: down.ptr(),
                    cols: iw,
                    rows: e * d,
                    box_rows,
                },
            ],
        )
        .unwrap();
        let tiles = dispatched.expert_tiles();
        let row_token = dispatched.row_token.ptr();
        let (act_two, out_two) = (poisoned_bf16(&g, a * iw), poisoned_bf16(&g, a * d));
        ops::grouped_gemm_tma(
            &g,
            maps.get(0),
            gate_up.ptr(),
            x.ptr(),
            row_token,
            act_two.ptr(),
            &tiles,
            2 * iw,
            d,
            true,
        )
        .unwrap();
        ops::grouped_gemm_tma(
            &g,
            maps.get(1),
            down.ptr(),
            act_two.ptr(),
            0,
            out_two.ptr(),
            &tiles,
            d,
            iw,
            false,
        )
        .unwrap();
        let (want_act, want_out) = (read_bf16(&g, &act_two), read_bf16(&g, &out_two));
        assert!(
            want_out.iter().all(|v| !v.is_nan()),
            "{name}: the two launches left outputs unwritten"
        );
        let ready = g
            .upload(&vec![0i32; ops::grouped_tma_ready_len(tiles.max_tiles)])
            .unwrap();
        for launch in 0..3 {
            let (act, out) = (poisoned_bf16(&g, a * iw), poisoned_bf16(&g, a * d));
            let projection = ops::DownProjection {
                w: maps.get(1),
                w_ptr: down.ptr(),
                y: out.ptr(),
                n: d,
                ready: ready.ptr(),
            };
            ops::grouped_gemm_tma_pair(
                &g,
                maps.get(0),
                gate_up.ptr(),
                x.ptr(),
                row_token,
                act.ptr(),
                &tiles,
                2 * iw,
                d,
                &projection,
            )
            .unwrap();
            for (what, got, want) in [
                ("gate/up", read_bf16(&g, &act), &want_act),
                ("down", read_bf16(&g, &out), &want_out),
            ] {
                let differ = got
                    .iter()
                    .zip(want.iter())
                    .filter(|(p, q)| p.to_bits() != q.to_bits())
                    .count();
                assert_eq!(
                    differ,
                    0,
                    "{name}, launch {launch}: {differ} of {} {what} outputs differ from two launches",
                    got.len()
                );
            }
            assert!(
                read(&g, &ready).iter().all(|&c| c == 0),
                "{name}, launch {launch}: the counters were not left zeroed"
            );
            println!("TMA gate/up + down {name}, launch {launch}: bit-identical to two launches");
        }
    }
}

/// The wgmma grouped expert GEMM (tiles of up to 128 rows) gives exactly the bits of the 4-warp
/// mma.sync kernels over the same rows (cut at 64), and of the 16-row tiles a lone request's
/// rows take: so a row's bits do not depend on which kernel its forward picks. Mini's shapes,
/// gated and not, tiles of 1-128 rows (skewed routing), a refinement-sized, an x16-, x64- and a
/// prefill-sized batch, three launches each; rows outside the tiles stay unwritten.
#[test]
#[ignore = "needs a CUDA GPU"]
fn grouped_gemm_wgmma_gives_the_grouped_kernels_bits() {
    let g = gpu();
    if !ops::grouped_wgmma_supported(&g, 1024, 2048) {
        cannot_run(
            "grouped_gemm_wgmma_gives_the_grouped_kernels_bits",
            &format!(
                "the wgmma grouped GEMM cannot run on {}: it needs compute capability 9.0",
                g.name()
            ),
        );
        return;
    }
    let mut rng = rng();
    let rows = ops::GROUPED_WGMMA_ROWS;
    let cases: [TmaCase; 8] = [
        (32, 8, 256, 1024, 2048, rows, false, true),
        (32, 8, 256, 2048, 512, rows, false, false),
        (300, 8, 256, 1024, 2048, rows, false, true),
        (512, 8, 256, 2048, 512, rows, false, false),
        (2048, 8, 256, 1024, 2048, rows, false, true),
        (2048, 8, 256, 2048, 512, rows, false, false),
        (4096, 8, 256, 1024, 2048, rows, false, true),
        (70, 4, 9, 256, 384, rows, false, false),
    ];
    // MINNOW_WGMMA_CASES=n runs the first n (the small ones, e.g. under compute-sanitizer).
    let take = std::env::var("MINNOW_WGMMA_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases.len());
    for case in cases.into_iter().take(take) {
        let d = DispatchedCase::new(&g, &mut rng, case);
        let (want, name) = (d.four_warp(&g), d.name());
        // The 16-row tiles too (a lone request's): same bits.
        let want16 = d.four_warp_in(&g, 16);
        let same16 = want16
            .iter()
            .zip(&want)
            .all(|(p, q)| p.to_bits() == q.to_bits());
        assert!(same16, "{name}: the 16- and 64-row tiles differ");
        d.check_launches(&g, &want, "wgmma grouped GEMM");
    }
}

/// Many launches of the wgmma grouped GEMM back to back, each tile at most 64 rows (so the second
/// consumer warpgroup has no rows in any item and only passes the stages on), all finish and give
/// the reference's bits. Such launches once hung about once in 10^4-10^5 (a warp of that
/// warpgroup fell a stage behind and missed the barrier's phase; docs/performance.md, session
/// thirty-one): a watchdog turns a hang into a failure. `MINNOW_WGMMA_STRESS_LAUNCHES` (default
/// 30,000).
#[test]
#[ignore = "needs a CUDA GPU"]
fn grouped_gemm_wgmma_finishes_every_launch() {
    let g = gpu();
    if !ops::grouped_wgmma_supported(&g, 1024, 2048) {
        cannot_run(
            "grouped_gemm_wgmma_finishes_every_launch",
            &format!(
                "the wgmma grouped GEMM cannot run on {}: it needs compute capability 9.0",
                g.name()
            ),
        );
        return;
    }
    let launches: usize = std::env::var("MINNOW_WGMMA_STRESS_LAUNCHES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30_000);
    let mut rng = rng();
    // 128 tokens x top-8 over 64 experts: ~16 rows per expert, gate/up at mini's shape.
    let case: TmaCase = (128, 8, 64, 1024, 2048, ops::GROUPED_WGMMA_ROWS, false, true);
    let d = DispatchedCase::new(&g, &mut rng, case);
    let want = d.four_warp(&g);
    let y = poisoned_bf16(&g, d.a * d.width() + d.width());
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if finished
            .recv_timeout(std::time::Duration::from_secs(180))
            .is_err()
        {
            eprintln!("grouped_gemm_wgmma_finishes_every_launch: {launches} launches did not finish in 180 s: a launch hung");
            std::process::abort();
        }
    });
    for _ in 0..launches {
        d.tma(&g, &y);
    }
    g.synchronize().unwrap();
    done.send(()).unwrap();
    watchdog.join().unwrap();
    let got = read_bf16(&g, &y);
    let outputs = d.a * d.width();
    let differ = got[..outputs]
        .iter()
        .zip(&want)
        .filter(|(p, q)| p.to_bits() != q.to_bits())
        .count();
    assert_eq!(
        differ,
        0,
        "{}: the last of {launches} launches differs in bits",
        d.name()
    );
    println!(
        "wgmma grouped GEMM {}: {launches} launches finished, the last bit-identical",
        d.name()
    );
}

/// Many launches of the TMA grouped GEMM on the same inputs give the same bits every time (whole
/// forwards with it once decoded differently from run to run, until its barrier initialisation
/// was fenced for the async proxy; `MINNOW_TMA_STRESS_LAUNCHES`, default 300 per shape).
#[test]
#[ignore = "needs a CUDA GPU"]
fn grouped_gemm_tma_is_deterministic_over_many_launches() {
    let g = gpu();
    if !grouped_tma_runs(&g, "grouped_gemm_tma_is_deterministic_over_many_launches") {
        return;
    }
    let launches: usize = std::env::var("MINNOW_TMA_STRESS_LAUNCHES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let mut rng = rng();
    let cases: [TmaCase; 4] = [
        (32, 8, 257, 1024, 2048, 16, true, true),
        (32, 8, 257, 2048, 512, 16, true, false),
        (512, 8, 256, 1024, 2048, 64, false, true),
        (512, 8, 256, 2048, 512, 64, false, false),
    ];
    for case in cases {
        let d = DispatchedCase::new(&g, &mut rng, case);
        let y = poisoned_bf16(&g, d.a * d.width());
        let mut first: Option<Vec<u16>> = None;
        let mut bad = 0;
        for _ in 0..launches {
            d.tma(&g, &y);
            let bits: Vec<u16> = read(&g, &y).iter().map(|v: &bf16| v.to_bits()).collect();
            match &first {
                None => first = Some(bits),
                Some(f) if *f != bits => bad += 1,
                Some(_) => {}
            }
        }
        println!(
            "TMA grouped GEMM {}: {bad} of {launches} launches differ from the first",
            d.name()
        );
        assert_eq!(bad, 0, "the TMA grouped GEMM is not deterministic");
    }
}

/// `Gpu::beside`: work queued on the side stream starts after the main stream's work before it,
/// the main stream's work after the join waits for it, and both hold under graph capture (the
/// capture ends only when the side stream has joined) and across replays.
#[test]
#[ignore = "needs a CUDA GPU"]
fn side_stream_work_is_ordered_between_its_fork_and_its_join() {
    let g = gpu();
    let mut rng = rng();
    let (rows, w) = (512, 4096);
    let x = g
        .upload(&to_bf16(&randn(&mut rng, rows * 2 * w, 4.0)))
        .unwrap();
    // What each output must hold: the same launches on the main stream alone.
    let expected = {
        let a = poisoned_bf16(&g, rows * w);
        let b = poisoned_f32(&g, rows * w);
        ops::silu_mul(&g, x.ptr(), a.ptr(), rows, w).unwrap();
        ops::bf16_to_f32(&g, a.ptr(), b.ptr(), rows * w).unwrap();
        read(&g, &b)
    };
    let a = poisoned_bf16(&g, rows * w);
    let c = poisoned_bf16(&g, rows * w);
    let b = poisoned_f32(&g, rows * w);
    let d = poisoned_f32(&g, rows * w);
    // main: a = silu_mul(x); side: b = f32(a); main meanwhile: c = silu_mul(x); join; d = f32(c).
    let queue = || -> minnow_runtime::cuda::CudaResult<()> {
        ops::silu_mul(&g, x.ptr(), a.ptr(), rows, w)?;
        let side = g.beside(|| ops::bf16_to_f32(&g, a.ptr(), b.ptr(), rows * w))?;
        ops::silu_mul(&g, x.ptr(), c.ptr(), rows, w)?;
        side.join()?;
        ops::bf16_to_f32(&g, c.ptr(), d.ptr(), rows * w)
    };
    let check = |what: &str| {
        let (gb, gd) = (read(&g, &b), read(&g, &d));
        assert!(
            gb.iter()
                .zip(&expected)
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "{what}: the side stream's output differs"
        );
        assert!(
            gd.iter()
                .zip(&expected)
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "{what}: the main stream's output after the join differs"
        );
    };
    queue().unwrap();
    g.synchronize().unwrap();
    check("eager");
    let graph = Graph::capture(&g, queue).unwrap();
    for replay in 0..2 {
        for buf in [&a, &c] {
            g.write(buf, 0, &vec![bf16::NAN; rows * w]).unwrap();
        }
        for buf in [&b, &d] {
            g.write(buf, 0, &vec![f32::NAN; rows * w]).unwrap();
        }
        graph.launch(&g).unwrap();
        g.synchronize().unwrap();
        check(&format!("graph replay {replay}"));
    }
    // An error inside the region still joins it: the stream stays usable.
    let failed = g.beside(|| {
        Err(minnow_runtime::cuda::CudaError::Unsupported(
            "a failing body".into(),
        ))
    });
    assert!(failed.is_err());
    queue().unwrap();
    g.synchronize().unwrap();
    check("after a failed region");
}
