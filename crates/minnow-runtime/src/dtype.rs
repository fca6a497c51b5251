//! Element types of stored weights and their conversion to the F32 compute type.
//!
//! Weights stay in their stored type (usually BF16, memory-mapped) and are widened to F32 where
//! they are used: a 16B checkpoint does not fit in RAM as F32, and on a memory-bound CPU reading
//! half the bytes is faster than reading a pre-widened copy.

use std::fmt;

/// A stored element type the CPU operators can read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    BF16,
    F16,
    F32,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::BF16 | DType::F16 => 2,
            DType::F32 => 4,
        }
    }

    /// The safetensors spelling ("BF16", "F16", "F32").
    pub fn name(self) -> &'static str {
        match self {
            DType::BF16 => "BF16",
            DType::F16 => "F16",
            DType::F32 => "F32",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Widens `src` (little-endian elements of `dtype`) into `dst`; `dst.len()` elements are read.
///
/// Panics if `src` is shorter than `dst.len() * dtype.size()`: callers check shapes when a
/// checkpoint is opened, so a mismatch here is a bug, not bad input.
pub fn widen_into(dtype: DType, src: &[u8], dst: &mut [f32]) {
    let n = dst.len();
    let src = &src[..n * dtype.size()];
    match dtype {
        DType::BF16 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = f32::from_bits((u16::from_le_bytes([s[0], s[1]]) as u32) << 16);
            }
        }
        DType::F16 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = half::f16::from_bits(u16::from_le_bytes([s[0], s[1]])).to_f32();
            }
        }
        DType::F32 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            }
        }
    }
}

/// Widens a whole buffer into a new vector.
pub fn widen(dtype: DType, src: &[u8]) -> Vec<f32> {
    let mut out = vec![0.0; src.len() / dtype.size()];
    widen_into(dtype, src, &mut out);
    out
}

/// A read-only row-major matrix `[rows, cols]` in its stored element type, usually a slice of a
/// memory-mapped checkpoint. Linear layers use it as `W` in `y = x · Wᵀ`.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a> {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
}

impl<'a> MatRef<'a> {
    /// Wraps stored bytes; `None` when the byte count does not match the shape.
    pub fn new(dtype: DType, rows: usize, cols: usize, data: &'a [u8]) -> Option<Self> {
        (rows.checked_mul(cols)?.checked_mul(dtype.size())? == data.len()).then_some(Self {
            dtype,
            rows,
            cols,
            data,
        })
    }

    /// Wraps F32 values.
    pub fn from_f32(rows: usize, cols: usize, data: &'a [f32]) -> Self {
        assert_eq!(rows * cols, data.len(), "MatRef::from_f32 shape");
        Self {
            dtype: DType::F32,
            rows,
            cols,
            data: bytemuck::cast_slice(data),
        }
    }

    /// Stored bytes of rows `start..end`.
    pub fn row_bytes(&self, start: usize, end: usize) -> &'a [u8] {
        let w = self.cols * self.dtype.size();
        &self.data[start * w..end * w]
    }

    /// Rows `start..end` as a matrix of their own.
    pub fn rows_range(&self, start: usize, end: usize) -> MatRef<'a> {
        MatRef {
            dtype: self.dtype,
            rows: end - start,
            cols: self.cols,
            data: self.row_bytes(start, end),
        }
    }

    /// Row `r` widened into `dst` (`dst.len() == cols`).
    pub fn widen_row(&self, r: usize, dst: &mut [f32]) {
        widen_into(self.dtype, self.row_bytes(r, r + 1), dst);
    }

    /// The stored values as F32 when they already are F32 and suitably aligned (no copy).
    pub fn as_f32(&self) -> Option<&'a [f32]> {
        if self.dtype == DType::F32 {
            bytemuck::try_cast_slice(self.data).ok()
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widens_each_dtype() {
        let vals = [1.5f32, -2.25, 0.0, 3.0e-3];
        let bf: Vec<u8> = vals
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect();
        let f16: Vec<u8> = vals
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect();
        let f32b: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        for (dt, bytes) in [(DType::BF16, bf), (DType::F16, f16), (DType::F32, f32b)] {
            let got = widen(dt, &bytes);
            for (g, v) in got.iter().zip(vals) {
                assert!((g - v).abs() <= v.abs() * 8e-3, "{dt}: {g} vs {v}");
            }
        }
        // BF16 widening is exact.
        assert_eq!(
            widen(DType::BF16, &half::bf16::from_f32(1.5).to_le_bytes()),
            vec![1.5]
        );
    }

    #[test]
    fn matref_checks_byte_count() {
        assert!(MatRef::new(DType::BF16, 2, 3, &[0u8; 12]).is_some());
        assert!(MatRef::new(DType::BF16, 2, 3, &[0u8; 10]).is_none());
    }
}
