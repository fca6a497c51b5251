//! Quantized weight encodings: how a matrix `[N, K]` (N output rows, K the input dimension) is
//! stored as codes plus scales, how it is quantized from F32 and dequantized back to F32.
//! docs/model-format.md specifies every bit layout; the submodules implement them:
//!
//! - [`int`]: symmetric INT8/INT4 with FP16 group scales, row-major (`i8_sym`, `i4_sym`) or in
//!   the tensor-core fragment order (`i8_mma`, `i4_mma`);
//! - [`nvfp4`]: E2M1 codes with E4M3 block scales and an F32 global scale, fragment order;
//! - [`fp8`]: the E4M3 number format, and our own block-scaled FP8 encoding (`fp8_e4m3_b128`).
//!
//! Every function here is deterministic and independent of threads, so a converter produces the
//! same bytes whatever its worker count.

pub mod fp8;
pub mod int;
pub mod nvfp4;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::fmt;

use crate::dtype::DType;

/// A quantized encoding of a matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QuantEncoding {
    /// INT8 codes, row-major, FP16 scales `[N][K/group]`.
    I8Sym,
    /// INT4 codes (two per byte, low nibble first), row-major, FP16 scales `[N][K/group]`.
    I4Sym,
    /// INT8 codes in `mma.m16n8k16` B-fragment order, FP16 scales `[N/8][K/group][8]`.
    I8Mma,
    /// INT4 codes in `mma.m16n8k16` B-fragment order, FP16 scales `[N/8][K/group][8]`.
    I4Mma,
    /// E2M1 codes, E4M3 scale per 16 values, F32 global scale, fragment order.
    Nvfp4,
    /// Ours (the published format does not have it): E4M3 codes row-major, one F32 scale per
    /// 128 × 128 block.
    Fp8Block,
}

/// The group size of NVFP4's block scales (fixed by the format).
pub const NVFP4_GROUP: usize = 16;
/// The block edge of [`QuantEncoding::Fp8Block`].
pub const FP8_BLOCK: usize = 128;
/// Group sizes an integer encoding may use.
pub const INT_GROUP_SIZES: [usize; 4] = [16, 32, 64, 128];
/// The default group size of integer encodings.
pub const DEFAULT_INT_GROUP: usize = 128;

impl QuantEncoding {
    pub const ALL: [QuantEncoding; 6] = [
        QuantEncoding::I8Sym,
        QuantEncoding::I4Sym,
        QuantEncoding::I8Mma,
        QuantEncoding::I4Mma,
        QuantEncoding::Nvfp4,
        QuantEncoding::Fp8Block,
    ];

    /// The manifest spelling.
    pub fn name(self) -> &'static str {
        match self {
            QuantEncoding::I8Sym => "i8_sym",
            QuantEncoding::I4Sym => "i4_sym",
            QuantEncoding::I8Mma => "i8_mma",
            QuantEncoding::I4Mma => "i4_mma",
            QuantEncoding::Nvfp4 => "nvfp4",
            QuantEncoding::Fp8Block => "fp8_e4m3_b128",
        }
    }

    pub fn parse(name: &str) -> Option<QuantEncoding> {
        Self::ALL.into_iter().find(|e| e.name() == name)
    }

    /// Whether the published format defines this encoding (others are minnow's own).
    pub fn is_published(self) -> bool {
        self != QuantEncoding::Fp8Block
    }

    /// Bytes of the code region of an `[n, k]` matrix.
    pub fn codes_bytes(self, n: usize, k: usize) -> Option<usize> {
        let values = n.checked_mul(k)?;
        Some(match self {
            QuantEncoding::I8Sym | QuantEncoding::I8Mma | QuantEncoding::Fp8Block => values,
            QuantEncoding::I4Sym | QuantEncoding::I4Mma | QuantEncoding::Nvfp4 => {
                values.div_ceil(2)
            }
        })
    }

    /// Bytes of the scale region of an `[n, k]` matrix with `group` values per scale.
    pub fn scales_bytes(self, n: usize, k: usize, group: usize) -> Option<usize> {
        match self {
            QuantEncoding::Fp8Block => n
                .div_ceil(FP8_BLOCK)
                .checked_mul(k.div_ceil(FP8_BLOCK))?
                .checked_mul(4),
            QuantEncoding::Nvfp4 => n.checked_mul(k / NVFP4_GROUP),
            _ => n.checked_mul(k / group.max(1))?.checked_mul(2),
        }
    }

    /// Why an `[n, k]` matrix with this group size cannot be stored in this encoding, if it
    /// cannot. `group` is the manifest's `group_size`.
    pub fn check_shape(self, n: usize, k: usize, group: usize) -> Result<(), String> {
        let name = self.name();
        match self {
            QuantEncoding::I8Sym
            | QuantEncoding::I4Sym
            | QuantEncoding::I8Mma
            | QuantEncoding::I4Mma => {
                if !INT_GROUP_SIZES.contains(&group) {
                    return Err(format!(
                        "{name} needs a group size of 16, 32, 64 or 128, not {group}"
                    ));
                }
                if !k.is_multiple_of(group) {
                    return Err(format!(
                        "{name} with group size {group} needs K (here {k}) to be a multiple of it"
                    ));
                }
                if matches!(self, QuantEncoding::I8Mma | QuantEncoding::I4Mma)
                    && (!n.is_multiple_of(8) || !k.is_multiple_of(16))
                {
                    return Err(format!(
                        "{name} needs N % 8 == 0 and K % 16 == 0 (shape [{n}, {k}])"
                    ));
                }
            }
            QuantEncoding::Nvfp4 => {
                // The published files' value of group_size for NVFP4 is not stated; 16 (the
                // block length) is what we write, and 0 is accepted as well.
                if group != NVFP4_GROUP && group != 0 {
                    return Err(format!(
                        "nvfp4 has blocks of 16 values, not group size {group}"
                    ));
                }
                if !n.is_multiple_of(8) || !k.is_multiple_of(64) {
                    return Err(format!(
                        "nvfp4 needs N % 8 == 0 and K % 64 == 0 (shape [{n}, {k}])"
                    ));
                }
            }
            QuantEncoding::Fp8Block => {
                if group != FP8_BLOCK {
                    return Err(format!(
                        "{name} has 128 x 128 blocks, not group size {group}"
                    ));
                }
            }
        }
        Ok(())
    }

    /// The group size to record in the manifest for a requested integer group size.
    pub fn manifest_group(self, int_group: usize) -> usize {
        match self {
            QuantEncoding::Nvfp4 => NVFP4_GROUP,
            QuantEncoding::Fp8Block => FP8_BLOCK,
            _ => int_group,
        }
    }
}

impl fmt::Display for QuantEncoding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a tensor is stored: a floating-point element type, or a quantized encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Encoding {
    Float(DType),
    Quant(QuantEncoding),
}

impl Encoding {
    /// The manifest spelling: `bf16`, `f16`, `f32`, or a quantized name.
    pub fn name(self) -> &'static str {
        match self {
            Encoding::Float(DType::BF16) => "bf16",
            Encoding::Float(DType::F16) => "f16",
            Encoding::Float(DType::F32) => "f32",
            Encoding::Quant(q) => q.name(),
        }
    }

    pub fn parse(name: &str) -> Option<Encoding> {
        match name {
            "bf16" => Some(Encoding::Float(DType::BF16)),
            "f16" => Some(Encoding::Float(DType::F16)),
            "f32" => Some(Encoding::Float(DType::F32)),
            other => QuantEncoding::parse(other).map(Encoding::Quant),
        }
    }
}

impl fmt::Display for Encoding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A quantized matrix `[rows, cols]` borrowed from its container: codes, scales and the
/// parameters that read them.
#[derive(Clone, Copy, Debug)]
pub struct QuantMat<'a> {
    pub encoding: QuantEncoding,
    pub rows: usize,
    pub cols: usize,
    pub group_size: usize,
    pub codes: &'a [u8],
    pub scales: &'a [u8],
    /// NVFP4's per-matrix scale (1 for the other encodings).
    pub global_scale: f32,
}

impl<'a> QuantMat<'a> {
    /// Checks shape, group size and region lengths.
    pub fn new(
        encoding: QuantEncoding,
        rows: usize,
        cols: usize,
        group_size: usize,
        codes: &'a [u8],
        scales: &'a [u8],
        global_scale: f32,
    ) -> Result<Self, String> {
        encoding.check_shape(rows, cols, group_size)?;
        let group_size = encoding.manifest_group(group_size);
        let want_codes = encoding.codes_bytes(rows, cols).ok_or("shape overflows")?;
        let want_scales = encoding
            .scales_bytes(rows, cols, group_size)
            .ok_or("shape overflows")?;
        if codes.len() != want_codes {
            return Err(format!(
                "{encoding} [{rows}, {cols}] needs {want_codes} code bytes, got {}",
                codes.len()
            ));
        }
        if scales.len() != want_scales {
            return Err(format!(
                "{encoding} [{rows}, {cols}] group {group_size} needs {want_scales} scale bytes, got {}",
                scales.len()
            ));
        }
        if encoding == QuantEncoding::Nvfp4 && !(global_scale.is_finite() && global_scale > 0.0) {
            return Err(format!(
                "nvfp4 global scale {global_scale} is not positive and finite"
            ));
        }
        Ok(Self {
            encoding,
            rows,
            cols,
            group_size,
            codes,
            scales,
            global_scale,
        })
    }

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

/// The stored form of a quantized matrix, owned (what a converter writes).
#[derive(Clone, Debug, PartialEq)]
pub struct Quantized {
    pub codes: Vec<u8>,
    pub scales: Vec<u8>,
    pub global_scale: f32,
}

impl Quantized {
    /// Borrows it as a matrix.
    pub fn view(
        &self,
        encoding: QuantEncoding,
        rows: usize,
        cols: usize,
        group: usize,
    ) -> QuantMat<'_> {
        QuantMat {
            encoding,
            rows,
            cols,
            group_size: encoding.manifest_group(group),
            codes: &self.codes,
            scales: &self.scales,
            global_scale: self.global_scale,
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
    if let Some(i) = values.iter().position(|v| !v.is_finite()) {
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
