//! The quantized encodings and the matrix types every encoding module reads: which encoding,
//! its group sizes and byte counts, a borrowed quantized matrix (checked on construction) and an
//! owned one.

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
