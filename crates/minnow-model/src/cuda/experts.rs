//! A MoE layer's routed experts in device memory, one matrix per projection with every expert
//! stacked along the output rows: `[E (+1 packed shared), 2 I, D]` for gate/up (gate first) and
//! `[E (+1), D, I]` for down. Each projection is either BF16 rows or, for a quantized checkpoint,
//! the integer codes and FP16 scales exactly as the file stores them (`i8_mma` / `i4_mma`; the
//! row-major `i8_sym` / `i4_sym` are repacked into that order once, at load), which the
//! quantized grouped GEMM reads directly: the weights are never widened on the device (4-bit
//! codes are then put in the kernels' word order in place, `ops::codes4_word_order`: the same
//! bytes, each lane's codes of two 16-column steps side by side). NVFP4 is
//! repacked once at load (`ops::nvfp4_fragment_order`): its E2M1 codes move to the INT4
//! positions unchanged and each E4M3 block scale becomes its exact BF16 value, so a weight takes
//! 5 bits on the device against the file's 4.5 (the scale's second byte buys a kernel that
//! needs no E4M3 decoding). Our FP8 (`fp8_e4m3_b128`) is repacked once too
//! (`ops::fp8_fragment_order`): its E4M3 bytes move to the INT8 positions unchanged and each
//! 128 x 128 block's F32 scale is copied per 8-row band and group (`ops::fp8_group`), 1.016
//! bytes a weight on the device against the file's 1.0001 at groups of 128. Shapes the kernels
//! refuse are widened to BF16 at load, with a warning.

use half::{bf16, f16};
use minnow_format::{QuantParts, TensorRef, TensorSource};
use minnow_runtime::cuda::ops::{self, CodeMatrices, ExpertTiles};
use minnow_runtime::cuda::tuning::tuning;
use minnow_runtime::cuda::{CudaResult, DeviceBuffer, Gpu};
use minnow_runtime::quant::{int, QuantEncoding};

use super::device_error::device_err;
use crate::error::{ModelError, Result};

/// One projection of a layer's routed experts.
pub(crate) enum ExpertMatrix {
    /// BF16 rows, `[slots, N, K]`.
    Bf16(DeviceBuffer<bf16>),
    /// `*_mma` codes (tiles of 8 rows x 16 columns) and their FP16 scales, experts concatenated
    /// as the format lays them out; with a packed shared expert, its BF16 weights in the same
    /// fragment order (`ops::bf16_fragment_order`) and its slot (the number of routed experts).
    Codes {
        encoding: QuantEncoding,
        group: usize,
        codes: DeviceBuffer<u8>,
        scales: DeviceBuffer<u8>,
        /// NVFP4: each 8-row band's global scale (`[slots x N / 8]`).
        band_scale: Option<DeviceBuffer<f32>>,
        shared: Option<(DeviceBuffer<bf16>, usize)>,
    },
}

impl ExpertMatrix {
    pub fn bytes(&self) -> usize {
        match self {
            ExpertMatrix::Bf16(b) => b.bytes(),
            ExpertMatrix::Codes {
                codes,
                scales,
                band_scale,
                shared,
                ..
            } => {
                codes.bytes()
                    + scales.bytes()
                    + band_scale.as_ref().map_or(0, |b| b.bytes())
                    + shared.as_ref().map_or(0, |(b, _)| b.bytes())
            }
        }
    }

    /// Bytes of the BF16 shared expert carried beside codes (0 for BF16 rows, whose packed slot
    /// is part of the same buffer).
    pub fn shared_bytes(&self) -> usize {
        match self {
            ExpertMatrix::Codes {
                shared: Some((b, _)),
                ..
            } => b.bytes(),
            _ => 0,
        }
    }

    /// The BF16 rows, when the projection is stored that way (the pool GEMM and the packed
    /// shared expert need them).
    pub fn bf16(&self) -> Option<&DeviceBuffer<bf16>> {
        match self {
            ExpertMatrix::Bf16(b) => Some(b),
            ExpertMatrix::Codes { .. } => None,
        }
    }

    /// Codes with a packed shared expert: its BF16 weights, already in the codes' fragment
    /// order (`ops::bf16_fragment_order`), become expert `slot`, which the grouped GEMM computes
    /// with the routed experts. BF16 rows are returned unchanged (they pack the shared expert as
    /// their last slot at load).
    pub fn with_shared(mut self, weights: DeviceBuffer<bf16>, slot: usize) -> Self {
        if let ExpertMatrix::Codes { shared, .. } = &mut self {
            *shared = Some((weights, slot));
        }
        self
    }

    /// Whether a packed shared expert can ride beside these codes (the tiled kernels take the
    /// projection's shape: `n` output rows).
    pub fn codes_take_shared(&self, n: usize) -> bool {
        matches!(self, ExpertMatrix::Codes { group, .. } if ops::codes_tiled(n, *group))
    }

    /// The encoding's name as a file spells it (`bf16` for BF16 rows).
    pub fn encoding_name(&self) -> &'static str {
        match self {
            ExpertMatrix::Bf16(_) => "bf16",
            ExpertMatrix::Codes { encoding, .. } => encoding.name(),
        }
    }

    /// What the kernels read: the BF16 rows, or the codes as `ops::CodeMatrices`.
    fn kernel_view(&self) -> KernelView<'_> {
        match self {
            ExpertMatrix::Bf16(rows) => KernelView::Bf16(rows),
            ExpertMatrix::Codes {
                encoding,
                group,
                codes,
                scales,
                band_scale,
                shared,
            } => KernelView::Codes(CodeMatrices {
                kind: code_kind(*encoding),
                group: *group,
                codes: codes.ptr(),
                scales: scales.ptr(),
                band_scale: band_scale.as_ref().map_or(0, |b| b.ptr()),
                shared: shared.as_ref().map(|(b, slot)| (b.ptr(), *slot)),
            }),
        }
    }

    /// The column group of the activation rows when this `n` x `k` projection multiplies FP8
    /// codes by FP8 activations here (`ops::w8a8_supported`), else `None`.
    pub fn w8a8_group(&self, gpu: &Gpu, n: usize, k: usize) -> Option<usize> {
        match self.kernel_view() {
            KernelView::Codes(w) if ops::w8a8_supported(gpu, &w, n, k) => Some(w.group),
            _ => None,
        }
    }

    /// Whether this `n` x `k` projection is codes that the wgmma kernels take here (tiles of
    /// `ops::GROUPED_WGMMA_ROWS`, BF16 activations: `ops::codes_wgmma_supported`); false for
    /// BF16 rows, whose streamed kernels moe.rs picks itself.
    pub fn codes_wgmma(&self, gpu: &Gpu, n: usize, k: usize) -> bool {
        matches!(self.kernel_view(), KernelView::Codes(w) if ops::codes_wgmma_supported(gpu, &w, n, k))
    }

    /// Whether the kernel that decodes codes into shared memory (`ops::grouped_gemm_codes_ss`)
    /// takes this projection: INT4, INT8 or E4M3 codes without a packed shared expert.
    pub fn codes_ss(&self, gpu: &Gpu, n: usize, k: usize) -> bool {
        matches!(self.kernel_view(), KernelView::Codes(w) if ops::codes_ss_supported(gpu, &w, n, k))
    }

    /// Whether [`Self::grouped_gemm`] of this gate/up projection (`n` rows `[gate; up]` per
    /// expert) can write silu_mul's result itself (`gated`): quantized codes times BF16
    /// activations (not W8A8, `w8a8`) at the tiled kernels' shapes, unless `MINNOW_CODES_GATED=0`.
    pub fn gates_in_gemm(&self, n: usize, w8a8: bool) -> bool {
        matches!(self.kernel_view(), KernelView::Codes(w) if ops::codes_tiled(n, w.group))
            && !w8a8
            && tuning().codes_gated
    }

    /// `Y[p] = X[row_token[p] or p] . W[e]^T` over the dispatched tiles (see
    /// [`ops::grouped_gemm`]), whatever the encoding; with `xq` (FP8 codes, see
    /// [`Self::w8a8_group`]) over those E4M3 rows of `X`. `gated` (where
    /// [`Self::gates_in_gemm`]): `Y` gets silu_mul's `n / 2` columns instead.
    #[allow(clippy::too_many_arguments)]
    pub fn grouped_gemm(
        &self,
        gpu: &Gpu,
        x: u64,
        xq: Option<&ops::E4m3Rows>,
        row_token: u64,
        y: u64,
        tiles: &ExpertTiles,
        n: usize,
        k: usize,
        gated: bool,
    ) -> CudaResult<()> {
        match self.kernel_view() {
            KernelView::Bf16(_) if gated => Err(minnow_runtime::cuda::CudaError::Unsupported(
                "a gated grouped GEMM over BF16 expert rows (their streamed kernels gate)".into(),
            )),
            KernelView::Bf16(w) => ops::grouped_gemm(gpu, x, row_token, w.ptr(), y, tiles, n, k),
            // Tiles of 128 rows: moe.rs chose the wgmma kernels (`Self::codes_wgmma`, or
            // `Self::codes_ss`).
            KernelView::Codes(w) if tiles.rows == ops::GROUPED_WGMMA_ROWS && xq.is_none() => {
                ops::grouped_gemm_codes_wgmma(gpu, x, row_token, &w, y, tiles, n, k, gated)
            }
            KernelView::Codes(w) => {
                ops::grouped_gemm_codes(gpu, x, xq, row_token, &w, y, tiles, n, k, gated)
            }
        }
    }
}

/// What the expert GEMM kernels read of an [`ExpertMatrix`].
enum KernelView<'a> {
    Bf16(&'a DeviceBuffer<bf16>),
    Codes(CodeMatrices),
}

/// The kernel's view of codes loaded from `e` (an encoding [`device_encoding`] accepts).
fn code_kind(e: QuantEncoding) -> ops::CodeKind {
    match e {
        QuantEncoding::I8Mma | QuantEncoding::I8Sym => ops::CodeKind::Int8,
        QuantEncoding::I4Mma | QuantEncoding::I4Sym => ops::CodeKind::Int4,
        QuantEncoding::Nvfp4 => ops::CodeKind::E2m1,
        QuantEncoding::Fp8Block => ops::CodeKind::E4m3,
    }
}

/// What a stored encoding becomes on the device: the fragment order of an integer encoding, or
/// NVFP4 and FP8 themselves (repacked by `load_codes`). Every encoding has a GPU kernel.
fn device_encoding(e: QuantEncoding) -> QuantEncoding {
    match e {
        QuantEncoding::I8Mma | QuantEncoding::I8Sym => QuantEncoding::I8Mma,
        QuantEncoding::I4Mma | QuantEncoding::I4Sym => QuantEncoding::I4Mma,
        QuantEncoding::Nvfp4 => QuantEncoding::Nvfp4,
        QuantEncoding::Fp8Block => QuantEncoding::Fp8Block,
    }
}

/// One matrix of the projection, `[rows, cols]`: the tensor names stacked, in order.
pub(crate) struct Projection<'a> {
    pub names: Vec<String>,
    pub rows: usize,
    pub cols: usize,
    /// Where the projection is logged ("layer 3 gate/up").
    pub label: &'a str,
}

/// How a projection's tensors are stored, when they can stay quantized on the device: every
/// tensor in one encoding and group size, at shapes its kernels take.
pub(crate) fn stored_codes(
    source: &dyn TensorSource,
    p: &Projection<'_>,
) -> Option<(QuantEncoding, usize)> {
    let mut common = None;
    for name in &p.names {
        let q = source.tensor(name)?.quant?;
        let key = (q.encoding, q.group_size);
        match common {
            None => common = Some(key),
            Some(c) if c == key => {}
            Some(_) => return None,
        }
    }
    let (encoding, group) = common?;
    let shapes_ok = if matches!(encoding, QuantEncoding::Nvfp4 | QuantEncoding::Fp8Block) {
        // The E2M1 and E4M3 kernels are the tiled ones only.
        ops::repacked_bytes(encoding, p.rows, p.cols).is_some()
            && (encoding != QuantEncoding::Nvfp4 || group == 16)
    } else {
        // (4-bit codes go to the device in the word order: pairs of 16-column steps.)
        let cols_ok = match encoding {
            QuantEncoding::I4Mma | QuantEncoding::I4Sym => ops::codes4_cols_ok(p.cols),
            _ => p.cols.is_multiple_of(16),
        };
        p.rows.is_multiple_of(8) && cols_ok && group > 0 && p.cols.is_multiple_of(group)
    };
    shapes_ok.then_some((encoding, group))
}

/// Whether any tensor of the projection is quantized (whatever the encoding).
fn any_quantized(source: &dyn TensorSource, p: &Projection<'_>) -> bool {
    p.names
        .iter()
        .any(|n| source.tensor(n).is_some_and(|t| t.quant.is_some()))
}

/// Reads a tensor as BF16 values of the given shape (dequantizing a quantized one).
pub(crate) type WidenFn<'a> = dyn Fn(&str, &[usize]) -> Result<Vec<bf16>> + 'a;

/// Loads one projection: as the codes `codes` says it is stored in (from [`stored_codes`]),
/// else BF16 through `widen` (which dequantizes a quantized tensor). A quantized projection
/// that must be widened says so once.
pub(crate) fn load_projection(
    gpu: &Gpu,
    source: &dyn TensorSource,
    p: &Projection<'_>,
    codes: Option<(QuantEncoding, usize)>,
    widen: &WidenFn<'_>,
) -> Result<ExpertMatrix> {
    if let Some((encoding, group)) = codes {
        return load_codes(gpu, source, p, encoding, group);
    }
    if any_quantized(source, p) {
        tracing::warn!(
            "{}: quantized experts at a shape the GPU kernels do not take (or in mixed \
             encodings); widened to BF16 on the device",
            p.label
        );
    }
    let matrix = p.rows * p.cols;
    let buf = gpu
        .alloc::<bf16>(p.names.len() * matrix)
        .map_err(device_err)?;
    for (i, name) in p.names.iter().enumerate() {
        let values = widen(name, &[p.rows, p.cols])?;
        gpu.write(&buf, i * matrix, &values).map_err(device_err)?;
    }
    Ok(ExpertMatrix::Bf16(buf))
}

fn load_codes(
    gpu: &Gpu,
    source: &dyn TensorSource,
    p: &Projection<'_>,
    stored: QuantEncoding,
    group: usize,
) -> Result<ExpertMatrix> {
    let encoding = device_encoding(stored);
    if encoding == QuantEncoding::Nvfp4 {
        return load_nvfp4(gpu, source, p);
    }
    if encoding == QuantEncoding::Fp8Block {
        return load_fp8(gpu, source, p);
    }
    let (rows, cols) = (p.rows, p.cols);
    let groups = cols / group;
    let code_bytes = encoding
        .codes_bytes(rows, cols)
        .ok_or_else(|| ModelError::Weights(format!("{}: shape overflows", p.label)))?;
    let scale_bytes = groups * rows * 2;
    let codes = gpu
        .alloc::<u8>(p.names.len() * code_bytes)
        .map_err(device_err)?;
    let scales = gpu
        .alloc::<u8>(p.names.len() * scale_bytes)
        .map_err(device_err)?;
    if stored != encoding {
        tracing::info!(
            "{}: {} experts repacked once into {} (the order the GPU kernels read)",
            p.label,
            stored.name(),
            encoding.name()
        );
    }
    for (i, name) in p.names.iter().enumerate() {
        let t = tensor(source, name, &[rows, cols])?;
        let q = t.quant.expect("checked by stored_codes");
        let check = |what: &str, got: usize, want: usize| {
            if got == want {
                Ok(())
            } else {
                Err(ModelError::Weights(format!(
                    "{name}: {what} of {got} bytes, expected {want}"
                )))
            }
        };
        if stored == encoding {
            check("codes", t.data.len(), code_bytes)?;
            check("scales", q.scales.len(), scale_bytes)?;
            gpu.write(&codes, i * code_bytes, t.data)
                .map_err(device_err)?;
            gpu.write(&scales, i * scale_bytes, q.scales)
                .map_err(device_err)?;
        } else {
            let row_major = stored
                .codes_bytes(rows, cols)
                .ok_or_else(|| ModelError::Weights(format!("{name}: shape overflows")))?;
            check("codes", t.data.len(), row_major)?;
            check("scales", q.scales.len(), scale_bytes)?;
            let mut values = vec![0i8; rows * cols];
            int::unpack_codes(stored, rows, cols, t.data, &mut values);
            let packed = int::pack_codes(encoding, rows, cols, &values);
            let row_scales: Vec<f16> = int::unpack_scales(stored, rows, groups, q.scales)
                .into_iter()
                .map(f16::from_f32)
                .collect();
            let packed_scales = int::pack_scales(encoding, rows, groups, &row_scales);
            gpu.write(&codes, i * code_bytes, &packed)
                .map_err(device_err)?;
            gpu.write(&scales, i * scale_bytes, &packed_scales)
                .map_err(device_err)?;
        }
    }
    if encoding == QuantEncoding::I4Mma {
        ops::codes4_word_order(gpu, codes.ptr(), p.names.len(), rows, cols).map_err(device_err)?;
    }
    Ok(ExpertMatrix::Codes {
        encoding,
        group,
        codes,
        scales,
        band_scale: None,
        shared: None,
    })
}

/// NVFP4 experts, repacked for the E2M1 kernels (see the module documentation).
fn load_nvfp4(gpu: &Gpu, source: &dyn TensorSource, p: &Projection<'_>) -> Result<ExpertMatrix> {
    let (rows, cols) = (p.rows, p.cols);
    tracing::info!(
        "{}: nvfp4 experts repacked once for the GPU kernels (E2M1 codes at the INT4 positions, \
         BF16 block scales)",
        p.label
    );
    let mut band_scale = Vec::with_capacity(p.names.len() * rows / 8);
    let (codes, scales) = load_repacked(
        gpu,
        source,
        p,
        QuantEncoding::Nvfp4,
        rows * cols / 16,
        |data, q| {
            band_scale.extend(std::iter::repeat_n(q.global_scale, rows / 8));
            ops::nvfp4_fragment_order(rows, cols, data, q.scales)
        },
    )?;
    ops::codes4_word_order(gpu, codes.ptr(), p.names.len(), rows, cols).map_err(device_err)?;
    Ok(ExpertMatrix::Codes {
        encoding: QuantEncoding::Nvfp4,
        group: 16,
        codes,
        scales,
        band_scale: Some(gpu.upload(&band_scale).map_err(device_err)?),
        shared: None,
    })
}

/// FP8 experts, repacked for the E4M3 kernels (see the module documentation).
fn load_fp8(gpu: &Gpu, source: &dyn TensorSource, p: &Projection<'_>) -> Result<ExpertMatrix> {
    use minnow_runtime::quant::FP8_BLOCK;
    let (rows, cols) = (p.rows, p.cols);
    let group = ops::fp8_group(cols).expect("checked by stored_codes");
    tracing::info!(
        "{}: fp8_e4m3_b128 experts repacked once for the GPU kernels (E4M3 codes at the INT8 \
         positions, F32 block scales per 8-row band and {group} columns)",
        p.label
    );
    let file_scales = rows.div_ceil(FP8_BLOCK) * cols.div_ceil(FP8_BLOCK) * 4;
    let (codes, scales) = load_repacked(
        gpu,
        source,
        p,
        QuantEncoding::Fp8Block,
        file_scales,
        |data, q| ops::fp8_fragment_order(rows, cols, data, q.scales),
    )?;
    Ok(ExpertMatrix::Codes {
        encoding: QuantEncoding::Fp8Block,
        group,
        codes,
        scales,
        band_scale: None,
        shared: None,
    })
}

/// Every expert matrix of a projection in `encoding` (NVFP4 or FP8, repacked at load), checked
/// against the sizes its file must have (`file_scales` bytes of scales; the codes are as many
/// bytes in the file as on the device), turned into the kernels' order by `repack` (codes,
/// scales), and written side by side on the device, `ops::repacked_bytes` per matrix.
fn load_repacked(
    gpu: &Gpu,
    source: &dyn TensorSource,
    p: &Projection<'_>,
    encoding: QuantEncoding,
    file_scales: usize,
    mut repack: impl FnMut(&[u8], &QuantParts<'_>) -> (Vec<u8>, Vec<u8>),
) -> Result<(DeviceBuffer<u8>, DeviceBuffer<u8>)> {
    let (code_bytes, scale_bytes) =
        ops::repacked_bytes(encoding, p.rows, p.cols).expect("checked by stored_codes");
    let n = p.names.len();
    let codes = gpu.alloc::<u8>(n * code_bytes).map_err(device_err)?;
    let scales = gpu.alloc::<u8>(n * scale_bytes).map_err(device_err)?;
    for (i, name) in p.names.iter().enumerate() {
        let t = tensor(source, name, &[p.rows, p.cols])?;
        let q = t.quant.expect("checked by stored_codes");
        if t.data.len() != code_bytes || q.scales.len() != file_scales {
            return Err(ModelError::Weights(format!(
                "{name}: {encoding} codes of {} bytes and scales of {}, expected {code_bytes} \
                 and {file_scales}",
                t.data.len(),
                q.scales.len()
            )));
        }
        let (packed, packed_scales) = repack(t.data, &q);
        debug_assert_eq!(packed_scales.len(), scale_bytes);
        gpu.write(&codes, i * code_bytes, &packed)
            .map_err(device_err)?;
        gpu.write(&scales, i * scale_bytes, &packed_scales)
            .map_err(device_err)?;
    }
    Ok((codes, scales))
}

fn tensor<'a>(source: &'a dyn TensorSource, name: &str, shape: &[usize]) -> Result<TensorRef<'a>> {
    let t = source.tensor(name).ok_or_else(|| {
        ModelError::Weights(format!("{}: missing tensor {name}", source.describe()))
    })?;
    if t.shape != shape {
        return Err(ModelError::Weights(format!(
            "{name}: shape {:?}, expected {shape:?}",
            t.shape
        )));
    }
    Ok(t)
}
