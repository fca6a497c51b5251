//! Quantized weight encodings: how a matrix `[N, K]` (N output rows, K the input dimension) is
//! stored as codes plus scales, how it is quantized from F32 and dequantized back to F32.
//! docs/model-format.md specifies every bit layout; the submodules implement them:
//!
//! - [`int`]: symmetric INT8/INT4 with FP16 group scales, row-major (`i8_sym`, `i4_sym`) or in
//!   the tensor-core fragment order (`i8_mma`, `i4_mma`);
//! - [`nvfp4`]: E2M1 codes with E4M3 block scales and an F32 global scale, fragment order;
//! - [`fp8`]: the E4M3 number format, and our own block-scaled FP8 encoding (`fp8_e4m3_b128`).
//!
//! The encodings, the matrix types and their checks are `encoding`'s (re-exported here); this
//! file dispatches to the submodules, which import from `encoding` and each other, never from
//! here (no import circles: `src/import_graph.rs`).
//!
//! Every function here is deterministic and independent of threads, so a converter produces the
//! same bytes whatever its worker count.

mod encoding;
pub mod fp8;
pub mod int;
pub mod nvfp4;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use encoding::{
    Encoding, QuantEncoding, QuantMat, Quantized, DEFAULT_INT_GROUP, FP8_BLOCK, INT_GROUP_SIZES,
    NVFP4_GROUP,
};

impl<'a> QuantMat<'a> {
    /// The whole matrix in F32, row-major (`dst.len() == rows * cols`).
    pub fn dequantize(&self, dst: &mut [f32]) {
        self.dequantize_rows(0, self.rows, dst);
    }

    /// Rows `r0..r1` in F32, row-major (`dst.len() == (r1 - r0) * cols`), decoded straight from
    /// their codes and scales (nothing else of the matrix is read). Each value depends only on
    /// its own code and scale, so a row's values are the same whatever range it is read in.
    pub fn dequantize_rows(&self, r0: usize, r1: usize, dst: &mut [f32]) {
        assert!(
            r0 <= r1 && r1 <= self.rows,
            "dequantize_rows: rows {r0}..{r1}"
        );
        assert_eq!(
            dst.len(),
            (r1 - r0) * self.cols,
            "dequantize_rows: output size"
        );
        match self.encoding {
            QuantEncoding::I8Sym
            | QuantEncoding::I4Sym
            | QuantEncoding::I8Mma
            | QuantEncoding::I4Mma => int::dequantize_rows(self, r0, r1, dst),
            QuantEncoding::Nvfp4 => nvfp4::dequantize_rows(self, r0, r1, dst),
            QuantEncoding::Fp8Block => fp8::dequantize_block_rows(self, r0, r1, dst),
        }
    }

    /// The first scale that is not positive and finite, as (index, value), if any.
    pub fn find_bad_scale(&self) -> Option<(usize, f32)> {
        let bad = |v: f32| !(v.is_finite() && v > 0.0);
        match self.encoding {
            QuantEncoding::Nvfp4 => self
                .scales
                .iter()
                .map(|&b| fp8::e4m3_to_f32(b))
                .enumerate()
                .find(|(_, v)| bad(*v)),
            QuantEncoding::Fp8Block => self
                .scales
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .enumerate()
                .find(|(_, v)| bad(*v)),
            _ => self
                .scales
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .enumerate()
                .find(|(_, v)| bad(*v)),
        }
    }
}

/// Quantizes a row-major F32 matrix `[rows, cols]`. Values must be finite.
pub fn quantize(
    encoding: QuantEncoding,
    rows: usize,
    cols: usize,
    group: usize,
    values: &[f32],
) -> Result<Quantized, String> {
    quantize_rows(encoding, rows, cols, group, values, None)
}

/// The NVFP4 global scale of a matrix whose largest magnitude is `max_abs` (1 for the other
/// encodings, which have none).
pub fn global_scale_for(encoding: QuantEncoding, max_abs: f32) -> f32 {
    match encoding {
        QuantEncoding::Nvfp4 => nvfp4::global_scale(max_abs),
        _ => 1.0,
    }
}

/// Rows that a converter may quantize as one piece of a larger matrix: every layout stores a
/// run of whole 128-row bands contiguously (8-row tiles, 128-row FP8 blocks).
pub const ROW_BAND: usize = 128;

/// [`quantize`] for a band of rows of a larger matrix: `rows` must be a multiple of
/// [`ROW_BAND`] unless the band ends the matrix, and NVFP4 takes the whole matrix's global scale
/// (`None` computes it from these rows). The bytes of consecutive bands concatenate to the
/// bytes of the whole matrix.
pub fn quantize_rows(
    encoding: QuantEncoding,
    rows: usize,
    cols: usize,
    group: usize,
    values: &[f32],
    global_scale: Option<f32>,
) -> Result<Quantized, String> {
    let group = encoding.manifest_group(group);
    encoding.check_shape(rows, cols, group)?;
    if values.len() != rows * cols {
        return Err(format!(
            "quantize: {} values for a [{rows}, {cols}] matrix",
            values.len()
        ));
    }
    // A branch-free pass first (it vectorizes), the position only when there is one to name.
    let all_finite = values.iter().fold(true, |ok, v| ok & v.is_finite());
    if let Some(i) = (!all_finite)
        .then(|| values.iter().position(|v| !v.is_finite()))
        .flatten()
    {
        return Err(format!(
            "value {} at row {}, column {} is not finite and cannot be quantized",
            values[i],
            i / cols.max(1),
            i % cols.max(1)
        ));
    }
    Ok(match encoding {
        QuantEncoding::I8Sym
        | QuantEncoding::I4Sym
        | QuantEncoding::I8Mma
        | QuantEncoding::I4Mma => int::quantize(encoding, rows, cols, group, values),
        QuantEncoding::Nvfp4 => nvfp4::quantize(rows, cols, values, global_scale),
        QuantEncoding::Fp8Block => fp8::quantize_block(rows, cols, values),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    #[test]
    fn names_round_trip() {
        for e in QuantEncoding::ALL {
            assert_eq!(QuantEncoding::parse(e.name()), Some(e));
            assert_eq!(Encoding::parse(e.name()), Some(Encoding::Quant(e)));
        }
        for d in [DType::BF16, DType::F16, DType::F32] {
            assert_eq!(
                Encoding::parse(Encoding::Float(d).name()),
                Some(Encoding::Float(d))
            );
        }
        assert_eq!(Encoding::parse("q4_k"), None);
    }

    #[test]
    fn shape_rules() {
        assert!(QuantEncoding::I8Mma.check_shape(8, 128, 128).is_ok());
        assert!(QuantEncoding::I8Mma.check_shape(12, 128, 128).is_err());
        assert!(QuantEncoding::I4Sym.check_shape(3, 64, 128).is_err());
        assert!(QuantEncoding::I4Sym.check_shape(3, 64, 48).is_err());
        assert!(QuantEncoding::Nvfp4.check_shape(8, 96, 16).is_err());
        assert!(QuantEncoding::Nvfp4.check_shape(8, 128, 16).is_ok());
        assert!(QuantEncoding::Fp8Block.check_shape(5, 7, 128).is_ok());
    }

    #[test]
    fn quantize_refuses_non_finite_values() {
        let mut v = vec![0.5f32; 8 * 16];
        v[17] = f32::NAN;
        let err = quantize(QuantEncoding::I8Mma, 8, 16, 16, &v).unwrap_err();
        assert!(err.contains("row 1, column 1"), "{err}");
    }
}
