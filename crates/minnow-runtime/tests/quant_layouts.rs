//! Every quantized encoding against a scalar reference written from docs/model-format.md: the
//! reference quantizes each value by the documented rules and places each code and scale at the
//! byte its documented position formula names; the library's packed bytes must be identical,
//! and its dequantization must agree with the reference's reading of the same bytes.

use half::f16;
use minnow_runtime::cpu::{linear, linear_quant, Par};
use minnow_runtime::quant::fp8::{e4m3_to_f32, f32_to_e4m3};
use minnow_runtime::quant::nvfp4::e2m1_to_f32;
use minnow_runtime::quant::{quantize, QuantEncoding, QuantMat};
use minnow_runtime::MatRef;
use rand::{Rng, SeedableRng};

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            // Roughly normal, with an occasional outlier and exact zeros, like real weights.
            let v: f32 = (0..4).map(|_| rng.gen_range(-1.0f32..1.0)).sum::<f32>() * 0.02;
            match i % 97 {
                0 => v * 20.0,
                1 => 0.0,
                _ => v,
            }
        })
        .collect()
}

/// One code's place: byte index and, for 4-bit codes, which nibble (0 low, 1 high).
struct Place {
    byte: usize,
    nibble: Option<usize>,
}

fn nibble_place(index: usize) -> Place {
    Place {
        byte: index / 2,
        nibble: Some(index % 2),
    }
}

/// Where the doc puts code (n, k) of a `[_, kk]` matrix.
fn code_place(enc: QuantEncoding, n: usize, k: usize, kk: usize) -> Place {
    match enc {
        QuantEncoding::I8Sym | QuantEncoding::Fp8Block => Place {
            byte: n * kk + k,
            nibble: None,
        },
        QuantEncoding::I4Sym => nibble_place(n * kk + k),
        QuantEncoding::I8Mma | QuantEncoding::I4Mma => {
            let tile = (n / 8) * (kk / 16) + k / 16;
            let (r, c) = (n % 8, k % 16);
            let lane = r * 4 + (c % 8) / 2;
            let within = (c / 8) * 2 + c % 2;
            let slot = tile * 128 + lane * 4 + within;
            if enc == QuantEncoding::I8Mma {
                Place {
                    byte: slot,
                    nibble: None,
                }
            } else {
                nibble_place(slot)
            }
        }
        QuantEncoding::Nvfp4 => {
            let chunk = (n / 8) * (kk / 64) + k / 64;
            let (r, c) = (n % 8, k % 64);
            let (reg, cc) = (c / 32, c % 32);
            let lane = r * 4 + cc / 8;
            let word = (chunk * 2 + reg) * 32 + lane;
            nibble_place(word * 8 + cc % 8)
        }
    }
}

/// Where the doc puts the scale of (n, k), in units of scales.
fn scale_place(enc: QuantEncoding, n: usize, k: usize, kk: usize, g: usize) -> usize {
    match enc {
        QuantEncoding::I8Sym | QuantEncoding::I4Sym => n * (kk / g) + k / g,
        QuantEncoding::I8Mma | QuantEncoding::I4Mma => ((n / 8) * (kk / g) + k / g) * 8 + n % 8,
        QuantEncoding::Nvfp4 => ((n / 8) * (kk / 64) + k / 64) * 32 + (n % 8) * 4 + (k % 64) / 16,
        QuantEncoding::Fp8Block => (n / 128) * kk.div_ceil(128) + k / 128,
    }
}

fn put(bytes: &mut [u8], p: &Place, code: u8) {
    match p.nibble {
        None => bytes[p.byte] = code,
        Some(h) => bytes[p.byte] |= (code & 0xF) << (4 * h),
    }
}

fn get(bytes: &[u8], p: &Place) -> u8 {
    match p.nibble {
        None => bytes[p.byte],
        Some(h) => (bytes[p.byte] >> (4 * h)) & 0xF,
    }
}

/// E2M1 by the doc's rule, written out as thresholds: nearest magnitude of 0, 0.5, 1, 1.5, 2,
/// 3, 4, 6 with ties to the even code, and the sign bit of the input kept even when the
/// magnitude rounds to zero.
fn reference_e2m1(x: f32) -> u8 {
    let a = x.abs();
    let magnitude = match a {
        a if a <= 0.25 => 0,
        a if a < 0.75 => 1,
        a if a <= 1.25 => 2,
        a if a < 1.75 => 3,
        a if a <= 2.5 => 4,
        a if a < 3.5 => 5,
        a if a <= 5.0 => 6,
        _ => 7,
    };
    magnitude | if x.is_sign_negative() { 8 } else { 0 }
}

/// The reference encoder: (codes, scales, global scale), scales as raw bytes.
fn reference_quantize(
    enc: QuantEncoding,
    nn: usize,
    kk: usize,
    g: usize,
    w: &[f32],
) -> (Vec<u8>, Vec<u8>, f32) {
    let code_bytes = if matches!(
        enc,
        QuantEncoding::I8Sym | QuantEncoding::I8Mma | QuantEncoding::Fp8Block
    ) {
        nn * kk
    } else {
        nn * kk / 2
    };
    let mut codes = vec![0u8; code_bytes];
    match enc {
        QuantEncoding::I8Sym
        | QuantEncoding::I8Mma
        | QuantEncoding::I4Sym
        | QuantEncoding::I4Mma => {
            let q = if matches!(enc, QuantEncoding::I8Sym | QuantEncoding::I8Mma) {
                127.0f32
            } else {
                7.0
            };
            let mut scales = vec![0u8; nn * (kk / g) * 2];
            for n in 0..nn {
                for k0 in (0..kk).step_by(g) {
                    let group = &w[n * kk + k0..n * kk + k0 + g];
                    let max_abs = group.iter().map(|v| v.abs()).fold(0.0, f32::max);
                    let scale = if max_abs == 0.0 {
                        f16::ONE
                    } else {
                        f16::from_f32((max_abs / q).max(f16::from_bits(1).to_f32()))
                    };
                    let sp = scale_place(enc, n, k0, kk, g);
                    scales[2 * sp..2 * sp + 2].copy_from_slice(&scale.to_le_bytes());
                    for k in k0..k0 + g {
                        let c = (w[n * kk + k] / scale.to_f32())
                            .round_ties_even()
                            .clamp(-q, q) as i8;
                        let c = if q == 7.0 { (c as u8) & 0xF } else { c as u8 };
                        put(&mut codes, &code_place(enc, n, k, kk), c);
                    }
                }
            }
            (codes, scales, 1.0)
        }
        QuantEncoding::Nvfp4 => {
            let max_abs = w.iter().map(|v| v.abs()).fold(0.0, f32::max);
            let global = if max_abs == 0.0 {
                1.0
            } else {
                (max_abs / (6.0 * 448.0)).max(f32::MIN_POSITIVE)
            };
            let mut scales = vec![0u8; nn * kk / 16];
            for n in 0..nn {
                for k0 in (0..kk).step_by(16) {
                    let block = &w[n * kk + k0..n * kk + k0 + 16];
                    let bmax = block.iter().map(|v| v.abs()).fold(0.0, f32::max);
                    // An all-zero block's scale is the code of 1.0.
                    let s = if bmax == 0.0 {
                        0x38
                    } else {
                        f32_to_e4m3((bmax / 6.0) / global).max(1)
                    };
                    scales[scale_place(enc, n, k0, kk, 16)] = s;
                    for k in k0..k0 + 16 {
                        let c = reference_e2m1(w[n * kk + k] / (e4m3_to_f32(s) * global));
                        put(&mut codes, &code_place(enc, n, k, kk), c);
                    }
                }
            }
            (codes, scales, global)
        }
        QuantEncoding::Fp8Block => {
            let (bn, bk) = (nn.div_ceil(128), kk.div_ceil(128));
            let mut scales = vec![0u8; bn * bk * 4];
            for n in 0..nn {
                for k in 0..kk {
                    let (b0, c0) = ((n / 128) * 128, (k / 128) * 128);
                    let mut bmax = 0.0f32;
                    for r in b0..(b0 + 128).min(nn) {
                        for c in c0..(c0 + 128).min(kk) {
                            bmax = bmax.max(w[r * kk + c].abs());
                        }
                    }
                    let s = if bmax == 0.0 {
                        1.0
                    } else {
                        (bmax / 448.0).max(f32::MIN_POSITIVE)
                    };
                    let sp = scale_place(enc, n, k, kk, 128);
                    scales[4 * sp..4 * sp + 4].copy_from_slice(&s.to_le_bytes());
                    put(
                        &mut codes,
                        &code_place(enc, n, k, kk),
                        f32_to_e4m3(w[n * kk + k] / s),
                    );
                }
            }
            (codes, scales, 1.0)
        }
    }
}

/// The reference decoder: value (n, k) read through the position formulas.
fn reference_value(enc: QuantEncoding, q: &QuantMat<'_>, n: usize, k: usize) -> f32 {
    let (kk, g) = (q.cols, q.group_size);
    let code = get(q.codes, &code_place(enc, n, k, kk));
    let sp = scale_place(enc, n, k, kk, g);
    match enc {
        QuantEncoding::I8Sym | QuantEncoding::I8Mma => {
            code as i8 as f32
                * f16::from_le_bytes([q.scales[2 * sp], q.scales[2 * sp + 1]]).to_f32()
        }
        QuantEncoding::I4Sym | QuantEncoding::I4Mma => {
            (((code << 4) as i8) >> 4) as f32
                * f16::from_le_bytes([q.scales[2 * sp], q.scales[2 * sp + 1]]).to_f32()
        }
        QuantEncoding::Nvfp4 => e2m1_to_f32(code) * e4m3_to_f32(q.scales[sp]) * q.global_scale,
        QuantEncoding::Fp8Block => {
            let s = &q.scales[4 * sp..4 * sp + 4];
            e4m3_to_f32(code) * f32::from_le_bytes([s[0], s[1], s[2], s[3]])
        }
    }
}

/// Shapes with several tiles in each direction (and fp8 blocks with ragged edges).
fn shape_of(enc: QuantEncoding) -> (usize, usize, usize) {
    match enc {
        QuantEncoding::Nvfp4 => (24, 192, 16),
        QuantEncoding::Fp8Block => (136, 200, 128),
        _ => (24, 96, 32),
    }
}

#[test]
fn packing_matches_the_documented_layout_byte_for_byte() {
    for enc in QuantEncoding::ALL {
        let (nn, kk, g) = shape_of(enc);
        let w = random(nn * kk, 7);
        let got = quantize(enc, nn, kk, g, &w).unwrap();
        let (codes, scales, global) = reference_quantize(enc, nn, kk, g, &w);
        assert_eq!(got.global_scale, global, "{enc}: global scale");
        assert!(
            got.codes == codes,
            "{enc}: code bytes differ from the documented layout"
        );
        assert!(
            got.scales == scales,
            "{enc}: scale bytes differ from the documented layout"
        );

        let q = got.view(enc, nn, kk, g);
        let q =
            QuantMat::new(enc, nn, kk, q.group_size, q.codes, q.scales, q.global_scale).unwrap();
        let mut deq = vec![0.0f32; nn * kk];
        q.dequantize(&mut deq);
        for n in 0..nn {
            for k in 0..kk {
                assert_eq!(
                    deq[n * kk + k],
                    reference_value(enc, &q, n, k),
                    "{enc} ({n}, {k})"
                );
            }
        }
        assert!(q.find_bad_scale().is_none(), "{enc}");
    }
}

/// Decoding arbitrary bytes (every code, including INT8 -128 and INT4 -8) agrees with the
/// reference reading, so files written by another encoder decode the same way.
#[test]
fn dequantization_of_arbitrary_codes_matches_the_reference() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    for enc in QuantEncoding::ALL {
        let (nn, kk, g) = shape_of(enc);
        let codes: Vec<u8> = (0..enc.codes_bytes(nn, kk).unwrap())
            .map(|_| {
                let b: u8 = rng.gen();
                // No E4M3 NaN codes in the FP8 encoding's values.
                if enc == QuantEncoding::Fp8Block && b & 0x7F == 0x7F {
                    0x7E
                } else {
                    b
                }
            })
            .collect();
        let scales = quantize(enc, nn, kk, g, &random(nn * kk, 9))
            .unwrap()
            .scales;
        let q = QuantMat::new(enc, nn, kk, g, &codes, &scales, 0.37).unwrap();
        let mut deq = vec![0.0f32; nn * kk];
        q.dequantize(&mut deq);
        for n in 0..nn {
            for k in 0..kk {
                assert_eq!(
                    deq[n * kk + k],
                    reference_value(enc, &q, n, k),
                    "{enc} ({n}, {k})"
                );
            }
        }
    }
}

#[test]
fn element_errors_are_within_half_a_step() {
    for enc in [
        QuantEncoding::I8Sym,
        QuantEncoding::I4Mma,
        QuantEncoding::I8Mma,
    ] {
        let (nn, kk, g) = shape_of(enc);
        let w = random(nn * kk, 11);
        let qz = quantize(enc, nn, kk, g, &w).unwrap();
        let q = qz.view(enc, nn, kk, g);
        let mut deq = vec![0.0f32; nn * kk];
        q.dequantize(&mut deq);
        let qmax = if matches!(enc, QuantEncoding::I4Mma) {
            7.0
        } else {
            127.0
        };
        for n in 0..nn {
            for k0 in (0..kk).step_by(g) {
                let grp = &w[n * kk + k0..n * kk + k0 + g];
                let step = grp.iter().map(|v| v.abs()).fold(0.0, f32::max) / qmax;
                for k in k0..k0 + g {
                    let err = (deq[n * kk + k] - w[n * kk + k]).abs();
                    // Half a step plus the FP16 rounding of the scale, stretched over ±qmax.
                    assert!(
                        err <= 0.5 * step + qmax * step * 1e-3 + 1e-7,
                        "{enc} ({n},{k}): {err} vs step {step}"
                    );
                }
            }
        }
    }
}

/// The quantized product against the F32 product: relative Frobenius error of `x · Wᵀ` on
/// random matrices, with the bound each encoding is held to.
#[test]
fn quantized_products_are_within_their_error_bounds() {
    let (m, nn, kk) = (5, 64, 256);
    let x = random(m * kk, 21);
    let w = random(nn * kk, 22);
    let mut exact = vec![0.0f32; m * nn];
    linear(&x, m, MatRef::from_f32(nn, kk, &w), &mut exact, Par::Seq);
    let norm = exact.iter().map(|v| v * v).sum::<f32>().sqrt();
    for (enc, g, bound) in [
        // The weights carry a 20x outlier every 97 values, which sets the step of its group:
        // larger groups pay for it (measured 0.0145 / 0.0082 / 0.195 / 0.106 / 0.057 / 0.018).
        (QuantEncoding::I8Sym, 128, 0.02),
        (QuantEncoding::I8Mma, 32, 0.012),
        (QuantEncoding::I4Sym, 128, 0.25),
        (QuantEncoding::I4Mma, 32, 0.14),
        (QuantEncoding::Nvfp4, 16, 0.08),
        (QuantEncoding::Fp8Block, 128, 0.025),
    ] {
        let qz = quantize(enc, nn, kk, g, &w).unwrap();
        let q = qz.view(enc, nn, kk, g);
        let mut got = vec![0.0f32; m * nn];
        linear_quant(&x, m, &q, &mut got, Par::Rayon);
        let err = got
            .iter()
            .zip(&exact)
            .map(|(a, b)| (a - b) * (a - b))
            .sum::<f32>()
            .sqrt()
            / norm;
        eprintln!("{enc} group {g}: relative error {err:.4}");
        assert!(err < bound, "{enc}: relative error {err} over {bound}");
    }
}

#[test]
fn zero_matrices_use_unit_scales() {
    for enc in QuantEncoding::ALL {
        let (nn, kk, g) = shape_of(enc);
        let qz = quantize(enc, nn, kk, g, &vec![0.0; nn * kk]).unwrap();
        assert!(qz.codes.iter().all(|&b| b == 0), "{enc}");
        assert_eq!(qz.global_scale, 1.0);
        let q = qz.view(enc, nn, kk, g);
        assert!(q.find_bad_scale().is_none());
        let mut deq = vec![1.0f32; nn * kk];
        q.dequantize(&mut deq);
        assert!(deq.iter().all(|&v| v == 0.0), "{enc}");
    }
}

/// NVFP4 files must be byte-identical to the published converter's: hand-made blocks with the
/// codes and scales the format's rules give, written out literally. An [8, 128] matrix spans
/// two 64-column K tiles; one value of 2688 makes the global scale exactly 1.
#[test]
fn nvfp4_bytes_follow_the_published_rules() {
    let (nn, kk) = (8, 128);
    let mut w = vec![0.0f32; nn * kk];
    let mut want_codes = vec![0u8; nn * kk];
    let mut want_scales = vec![0x38u8; nn * kk / 16];
    let mut block = |row: usize, b: usize, values: &[f32], codes: &[u8], scale: u8| {
        for (i, (&v, &c)) in values.iter().zip(codes).enumerate() {
            w[row * kk + b * 16 + i] = v;
            want_codes[row * kk + b * 16 + i] = c;
        }
        want_scales[row * (kk / 16) + b] = scale;
    };
    // Row 0, block 0: all +0.0 (left at zero): scale 1.0 (code 56), codes 0.
    // Row 0, block 1: all -0.0: scale 56, and each code keeps the sign (nibble 8).
    block(0, 1, &[-0.0; 16], &[8; 16], 0x38);
    // Row 0, block 4 (second K tile): max 6 gives block scale 1.0; ties go to the even code,
    // and negative values that round to zero are -0 (nibble 8).
    block(
        0,
        4,
        &[
            6.0, -0.1, 0.1, -0.25, 0.25, 0.75, -1.25, 5.0, -6.0, 2.5, 3.5, -0.0, 1.75, -3.0, 0.5,
            4.0,
        ],
        &[7, 8, 0, 8, 0, 2, 10, 6, 15, 4, 6, 8, 4, 13, 1, 6],
        0x38,
    );
    // Row 3, block 2: a nonzero block too small for any scale gets the smallest code, 1.
    let mut tiny = [0.0f32; 16];
    tiny[0] = 1e-30;
    tiny[1] = -1e-30;
    let mut tiny_codes = [0u8; 16];
    tiny_codes[1] = 8;
    block(3, 2, &tiny, &tiny_codes, 1);
    // Row 7, block 7 (last of the second K tile): the matrix's largest value: scale 448
    // (code 126), code 6.0 (7).
    let mut top = [0.0f32; 16];
    top[15] = 2688.0;
    let mut top_codes = [0u8; 16];
    top_codes[15] = 7;
    block(7, 7, &top, &top_codes, 126);

    let got = quantize(QuantEncoding::Nvfp4, nn, kk, 16, &w).unwrap();
    assert_eq!(got.global_scale, 1.0);
    let mut codes = vec![0u8; nn * kk / 2];
    let mut scales = vec![0u8; nn * kk / 16];
    for n in 0..nn {
        for k in 0..kk {
            let enc = QuantEncoding::Nvfp4;
            put(
                &mut codes,
                &code_place(enc, n, k, kk),
                want_codes[n * kk + k],
            );
            scales[scale_place(enc, n, k, kk, 16)] = want_scales[n * (kk / 16) + k / 16];
        }
    }
    assert_eq!(got.scales, scales, "scale bytes");
    assert_eq!(got.codes, codes, "code bytes");
    // A negative zero decodes to zero.
    let mut deq = vec![1.0f32; nn * kk];
    got.view(QuantEncoding::Nvfp4, nn, kk, 16)
        .dequantize(&mut deq);
    assert_eq!(deq[16], 0.0);
    assert_eq!(deq[7 * kk + 127], 2688.0);
}

/// Any range of rows decodes to exactly those rows of the whole matrix (ranges that start and
/// end inside 8-row bands and 128-row FP8 blocks included), straight from the stored layout.
#[test]
fn row_ranges_decode_like_the_whole_matrix() {
    for enc in QuantEncoding::ALL {
        let (nn, kk, g) = shape_of(enc);
        let qz = quantize(enc, nn, kk, g, &random(nn * kk, 13)).unwrap();
        let q = qz.view(enc, nn, kk, g);
        let mut whole = vec![0.0f32; nn * kk];
        q.dequantize(&mut whole);
        for (r0, r1) in [(0, nn), (0, 1), (3, 11), (nn - 5, nn), (8, 16), (7, 7)] {
            let mut part = vec![f32::NAN; (r1 - r0) * kk];
            q.dequantize_rows(r0, r1, &mut part);
            let same = part
                .iter()
                .zip(&whole[r0 * kk..r1 * kk])
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{enc}: rows {r0}..{r1}");
        }
    }
}

/// A row's quantized product is bit-identical alone and inside any batch: the weight rows decode
/// the same in every block and the product's order does not depend on the number of rows.
#[test]
fn a_rows_quantized_product_does_not_depend_on_the_batch() {
    // 72 weight rows: a full 64-row block and a partial one; 70 input rows: two input blocks.
    let (m, nn, kk) = (70, 72, 256);
    let x = random(m * kk, 31);
    let w = random(nn * kk, 32);
    for enc in QuantEncoding::ALL {
        let g = match enc {
            QuantEncoding::Nvfp4 => 16,
            QuantEncoding::Fp8Block => 128,
            _ => 32,
        };
        let qz = quantize(enc, nn, kk, g, &w).unwrap();
        let q = qz.view(enc, nn, kk, g);
        let mut batch = vec![0.0f32; m * nn];
        linear_quant(&x, m, &q, &mut batch, Par::Rayon);
        for (t0, t1) in [(0, 1), (33, 34), (69, 70), (20, 37), (60, 70)] {
            let mut part = vec![0.0f32; (t1 - t0) * nn];
            linear_quant(&x[t0 * kk..t1 * kk], t1 - t0, &q, &mut part, Par::Seq);
            let same = part
                .iter()
                .zip(&batch[t0 * nn..t1 * nn])
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{enc}: rows {t0}..{t1} differ from the same rows in the batch"
            );
        }
    }
}
