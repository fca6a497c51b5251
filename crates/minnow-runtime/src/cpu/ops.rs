//! Row-wise operators: RMSNorm, SiLU, sigmoid, softmax and rotate-half RoPE, all in F32.

/// RMSNorm of one vector: `out = w ⊙ (x / sqrt(mean(x²) + eps))`.
///
/// The reference rounds to the activation dtype between the normalization and the weight
/// product; in F32 that rounding is the identity, so this is the reference order.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    debug_assert_eq!(x.len(), weight.len());
    let ms = sum_squares(x) / x.len() as f32;
    let inv = 1.0 / (ms + eps).sqrt();
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = w * (v * inv);
    }
}

/// [`rms_norm`] over every row of a row-major `[rows, weight.len()]` buffer, in place.
pub fn rms_norm_rows(x: &mut [f32], weight: &[f32], eps: f32) {
    let n = weight.len();
    let mut tmp = vec![0.0f32; n];
    for row in x.chunks_exact_mut(n) {
        rms_norm(row, weight, eps, &mut tmp);
        row.copy_from_slice(&tmp);
    }
}

/// Σ x², with 16 independent partial sums so the loop vectorizes (the order is fixed, so the
/// result does not depend on threads).
fn sum_squares(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let chunks = x.chunks_exact(16);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..16 {
            acc[i] += c[i] * c[i];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for v in tail {
        s += v * v;
    }
    s
}

/// `x · sigmoid(x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `1 / (1 + e^-x)`.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Softmax of `scale · row` in place, for rows of finite values (attention scores): a
/// vectorized exp on AVX-512 machines, else [`softmax_in_place`].
pub fn scaled_softmax(row: &mut [f32], scale: f32) {
    #[cfg(target_arch = "x86_64")]
    if !row.is_empty() && super::x86::has_avx512() && row.iter().all(|v| v.is_finite()) {
        // SAFETY: AVX-512F checked; the row is non-empty and finite.
        unsafe { super::x86::scaled_softmax(row, scale) };
        return;
    }
    for v in row.iter_mut() {
        *v *= scale;
    }
    softmax_in_place(row);
}

/// Softmax of one row in place; `-inf` entries get probability 0. A row of only `-inf` is left
/// as all zeros instead of NaN.
pub fn softmax_in_place(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        row.fill(0.0);
        return;
    }
    let mut sum = 0.0f32;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in row.iter_mut() {
        *v *= inv;
    }
}

/// NeoX "rotate half" RoPE on the first `cos.len() * 2` values of `head`; the rest of the head
/// passes through. `cos`/`sin` hold the `r/2` distinct angles of one position:
/// `y[j] = x[j]·c_j − x[j+r/2]·s_j`, `y[j+r/2] = x[j+r/2]·c_j + x[j]·s_j`.
pub fn rope_rotate_half(head: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    let (lo, hi) = head.split_at_mut(half);
    for j in 0..half {
        let (x1, x2) = (lo[j], hi[j]);
        lo[j] = x1 * cos[j] - x2 * sin[j];
        hi[j] = x2 * cos[j] + x1 * sin[j];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_unit_rms() {
        let x = [3.0f32, -4.0, 0.0, 0.0];
        let w = [1.0f32, 2.0, 1.0, 1.0];
        let mut out = [0.0f32; 4];
        rms_norm(&x, &w, 0.0, &mut out);
        // rms = sqrt(25/4) = 2.5
        assert_eq!(out, [1.2, -3.2, 0.0, 0.0]);
    }

    #[test]
    fn softmax_handles_masked_entries() {
        let mut row = [0.0f32, f32::NEG_INFINITY, 0.0];
        softmax_in_place(&mut row);
        assert_eq!(row, [0.5, 0.0, 0.5]);
        let mut dead = [f32::NEG_INFINITY; 2];
        softmax_in_place(&mut dead);
        assert_eq!(dead, [0.0, 0.0]);
    }

    #[test]
    fn scaled_softmax_matches_the_scalar_one() {
        for n in [1usize, 5, 16, 37, 300] {
            let row: Vec<f32> = (0..n)
                .map(|i| ((i * 7919) % 97) as f32 * 0.9 - 40.0)
                .collect();
            let mut fast = row.clone();
            scaled_softmax(&mut fast, 0.7);
            let mut slow: Vec<f32> = row.iter().map(|v| v * 0.7).collect();
            softmax_in_place(&mut slow);
            for (a, b) in fast.iter().zip(&slow) {
                assert!((a - b).abs() <= 2e-7 + 2e-6 * b, "n {n}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn rope_rotates_pairs_half_apart_and_passes_the_rest() {
        // r = 4 of d = 6: pairs (0,2) and (1,3); dims 4, 5 untouched.
        let mut head = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let a = 0.3f32;
        let b = 1.1f32;
        rope_rotate_half(&mut head, &[a.cos(), b.cos()], &[a.sin(), b.sin()]);
        let want = [
            1.0 * a.cos() - 3.0 * a.sin(),
            2.0 * b.cos() - 4.0 * b.sin(),
            3.0 * a.cos() + 1.0 * a.sin(),
            4.0 * b.cos() + 2.0 * b.sin(),
            5.0,
            6.0,
        ];
        for (g, w) in head.iter().zip(want) {
            assert!((g - w).abs() < 1e-6);
        }
    }

    #[test]
    fn silu_and_sigmoid() {
        assert_eq!(sigmoid(0.0), 0.5);
        assert!((silu(2.0) - 2.0 / (1.0 + (-2.0f32).exp())).abs() < 1e-7);
    }
}
