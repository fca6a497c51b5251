//! The MoE expert GEMMs of `kernels/router.cu` and `kernels/moe.cu`: the device-side dispatch of
//! assignments into tiles, and the grouped GEMM over those tiles with BF16 or quantized experts.

use super::super::error::CudaResult;
use super::super::gpu::Gpu;
use super::super::kernels;
use super::super::launch::LaunchConfig;
use super::unsupported::unsupported;

/// Rows per tile of the grouped expert GEMM for `assignments` rows over `experts` that can get
/// them: 16 when experts get few rows each (decoding; the kernel then streams weights), 64 when
/// they get 12 or more (`MINNOW_MOE64_ROWS`; prefill, batches of many denoising blocks: a 16-row tile would
/// stream the same expert's weights once per tile; a 128-row tile with these 4-warp CTAs measured
/// slower, docs/performance.md).
pub fn moe_tile_rows(assignments: usize, experts: usize) -> usize {
    let busy = experts.min(assignments).max(1);
    if assignments / busy >= super::super::tuning::tuning().moe64_rows {
        64
    } else {
        16
    }
}

/// Upper bound of the tiles `moe_dispatch` can produce for `assignments` rows over `experts`
/// (the most experts that can receive rows: with 2.2 block admission far fewer than all, which
/// keeps the grouped GEMM's grid, whose CTAs past the real tile count exit at once, small).
pub fn moe_max_tiles(assignments: usize, experts: usize, tile_rows: usize) -> usize {
    assignments.div_ceil(tile_rows) + experts.min(assignments)
}

/// Most CTAs of the multi-CTA dispatch (`moe_dispatch_count` / `_scatter`).
const DISPATCH_MAX_CTAS: usize = 64;
/// Routed assignments per CTA of the multi-CTA dispatch.
const DISPATCH_PER_CTA: usize = 2048;
/// The fewest routed assignments for which the multi-CTA dispatch replaces the single-CTA kernel
/// (whose scattered writes from one SM cost ~40 µs per layer at 32,768).
pub(super) const DISPATCH_MULTI_MIN: usize = 8192;

/// The `i32`s of scratch [`moe_dispatch`] needs for `experts` experts (per-CTA counts).
pub fn moe_dispatch_scratch_len(experts: usize) -> usize {
    DISPATCH_MAX_CTAS * experts
}

/// Sorts the `tokens * k` assignments by expert — plus, with `shared_expert`, one more per token to
/// that expert (assignment `tokens * k + t`) — into `slot_pos [A]`, `row_token [A]` (i32), the
/// tile list `tiles [max_tiles, 4]` (i32) cut at `tile_rows` rows, and `num_tiles [1]`. `experts`
/// counts the shared expert too; no routed assignment may name it. `scratch` holds
/// [`moe_dispatch_scratch_len`] i32s. Few assignments take one CTA; many take three launches over
/// up to 64 CTAs (the same outputs; rows of one routed expert are in no particular order either
/// way, and no row's result depends on it).
#[allow(clippy::too_many_arguments)]
pub fn moe_dispatch(
    gpu: &Gpu,
    topk_idx: u64,
    tokens: usize,
    k: usize,
    experts: usize,
    tile_rows: usize,
    shared_expert: Option<usize>,
    slot_pos: u64,
    row_token: u64,
    tiles: u64,
    num_tiles: u64,
    scratch: u64,
) -> CudaResult<()> {
    if shared_expert.is_some_and(|s| s >= experts) {
        return unsupported(format!(
            "shared expert index {shared_expert:?} of {experts} experts"
        ));
    }
    if experts > 1024 {
        return unsupported(format!("{experts} experts (at most 1024)"));
    }
    let a = tokens * k;
    let shared = shared_expert.map_or(-1, |s| s as i32);
    if a >= DISPATCH_MULTI_MIN {
        let ctas = a.div_ceil(DISPATCH_PER_CTA).min(DISPATCH_MAX_CTAS);
        let per_cta = LaunchConfig::new((ctas as u32, 1, 1), 512, (4 * experts) as u32);
        kernels::router::moe_dispatch_count(
            gpu,
            per_cta,
            topk_idx,
            a as i32,
            experts as i32,
            scratch,
        )?;
        kernels::router::moe_dispatch_plan(
            gpu,
            LaunchConfig::new((1, 1, 1), 1024, 0),
            scratch,
            ctas as i32,
            tokens as i32,
            experts as i32,
            tile_rows as i32,
            shared,
            tiles,
            num_tiles,
        )?;
        return kernels::router::moe_dispatch_scatter(
            gpu,
            per_cta,
            topk_idx,
            a as i32,
            k as i32,
            experts as i32,
            shared,
            scratch,
            slot_pos,
            row_token,
        );
    }
    let cfg = LaunchConfig::new((1, 1, 1), 1024, (8 * experts) as u32);
    kernels::router::moe_dispatch(
        gpu,
        cfg,
        topk_idx,
        a as i32,
        k as i32,
        experts as i32,
        tile_rows as i32,
        shared,
        slot_pos,
        row_token,
        tiles,
        num_tiles,
    )
}

/// Dynamic shared memory of `grouped_gemm_m{16,64}`; mirrors `Tile<BM, STAGES>` in kernels/moe.cu.
pub(super) fn grouped_gemm_smem_bytes(tile_rows: usize, stages: usize) -> usize {
    stages * (tile_rows + 64) * 72 * 2
}

/// Whether the tiled tensor-core kernels take an expert GEMM of `n` outputs over `k` inputs
/// (`n % 64 == 0`, `k % 32 == 0`); other shapes run `grouped_gemm_any`, slower but general.
pub fn grouped_gemm_tiled(n: usize, k: usize) -> bool {
    n.is_multiple_of(64) && k.is_multiple_of(32)
}

/// The device-side tile list a dispatch wrote ([`moe_dispatch`]): what every grouped expert
/// GEMM runs over, one CTA row per possible tile.
#[derive(Clone, Copy, Debug)]
pub struct ExpertTiles {
    /// `[max_tiles]` of (expert, first row, end row, unused) as `i32`.
    pub tiles: u64,
    /// The number of tiles the dispatch wrote (one `i32`); CTAs past it exit at once.
    pub num_tiles: u64,
    /// The bound on that number the grid is sized for ([`moe_max_tiles`]).
    pub max_tiles: usize,
    /// The rows a tile holds at most: 16 or 64 (the dispatch's cut), or
    /// [`GROUPED_WGMMA_ROWS`](super::GROUPED_WGMMA_ROWS) for the wgmma kernel.
    pub rows: usize,
    /// The list was written before the kernel queued just before this launch (a down
    /// projection's: the dispatch, then gate/up), so the codes tiles may read it, and start
    /// their first weights, before waiting for that kernel. False when the dispatch may be the
    /// launch just before.
    pub settled: bool,
}

/// Grouped GEMM over the dispatched tiles: `Y[p] = X[row_token[p] or p] . W[e]^T` with
/// `W [E, n, k]`. `row_token` 0 means rows are read in place.
#[allow(clippy::too_many_arguments)]
pub fn grouped_gemm(
    gpu: &Gpu,
    x: u64,
    row_token: u64,
    w: u64,
    y: u64,
    t: &ExpertTiles,
    n: usize,
    k: usize,
) -> CudaResult<()> {
    let (tiles, num_tiles, max_tiles, tile_rows) = (t.tiles, t.num_tiles, t.max_tiles, t.rows);
    if ![16, 64].contains(&tile_rows) {
        return unsupported(format!("expert GEMM tiles of {tile_rows} rows"));
    }
    if max_tiles == 0 {
        return Ok(());
    }
    if !grouped_gemm_tiled(n, k) {
        // Shapes the tiled kernels refuse (e.g. 24-wide experts): the general kernel.
        let cfg = LaunchConfig::new((n.div_ceil(64) as u32, max_tiles as u32, 1), 64, 0);
        return kernels::moe::grouped_gemm_any(
            gpu, cfg, x, row_token, w, y, tiles, num_tiles, n as i32, k as i32,
        );
    }
    use kernels::moe::{grouped_gemm_m16, grouped_gemm_m16s3, grouped_gemm_m64, GroupedGemm};
    let (kernel, stages): (GroupedGemm, _) =
        match (tile_rows, super::super::tuning::tuning().moe16_stages) {
            (16, 3) => (grouped_gemm_m16s3, 3),
            (16, _) => (grouped_gemm_m16, 4),
            _ => (grouped_gemm_m64, 3),
        };
    let cfg = LaunchConfig::new(
        ((n / 64) as u32, max_tiles as u32, 1),
        128,
        grouped_gemm_smem_bytes(tile_rows, stages) as u32,
    );
    kernel(
        gpu, cfg, x, row_token, w, y, tiles, num_tiles, n as i32, k as i32,
    )
}

/// What the codes of [`CodeMatrices`] are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CodeKind {
    /// `i8_mma` codes, FP16 group scales.
    Int8,
    /// `i4_mma` codes, FP16 group scales.
    Int4,
    /// NVFP4 as [`nvfp4_fragment_order`] repacks it: E2M1 codes in the `i4_mma` positions, BF16
    /// block scales of 16 columns, and an F32 factor per 8-row band (the global scale).
    E2m1,
    /// `fp8_e4m3_b128` as [`fp8_fragment_order`] repacks it: E4M3 codes in the `i8_mma`
    /// positions and each 128 x 128 block's F32 scale per (8-row band, group of 128 columns).
    E4m3,
}

impl CodeKind {
    fn bits(self) -> usize {
        match self {
            CodeKind::Int8 | CodeKind::E4m3 => 8,
            CodeKind::Int4 | CodeKind::E2m1 => 4,
        }
    }
}

/// Routed expert weights stored as `*_mma` codes (tiles of 8 rows x 16 columns in tensor-core
/// fragment order) with group scales: what the quantized grouped GEMM reads.
#[derive(Clone, Copy, Debug)]
pub struct CodeMatrices {
    pub kind: CodeKind,
    /// Columns per scale (16 for E2M1).
    pub group: usize,
    pub codes: u64,
    pub scales: u64,
    /// E2M1: one F32 per 8-row band of the codes (`[slots x n / 8]`); 0 otherwise.
    pub band_scale: u64,
    /// A packed shared expert: BF16 weights in the codes' fragment order
    /// ([`bf16_fragment_order`]) and the expert slot whose tiles read them.
    pub shared: Option<(u64, usize)>,
}

impl CodeMatrices {
    /// Whether the kind has what its kernels read: E2M1 codes come with groups of 16 and their
    /// band scales.
    pub(super) fn complete(&self) -> bool {
        self.kind != CodeKind::E2m1 || (self.group == 16 && self.band_scale != 0)
    }
}

/// A row-major BF16 matrix `[rows, cols]` in the `*_mma` fragment order (tiles of 8 rows x 16
/// columns, `[rows / 8][cols / 16][lane 0..32][4]`, lane `l` holding row `l / 4` and columns
/// `2 (l % 4)`, `+ 1`, `+ 8`, `+ 9`): how the quantized grouped GEMM reads a packed shared
/// expert's BF16 weights beside the routed experts' codes. Needs `rows % 8 == 0` and
/// `cols % 16 == 0`.
pub fn bf16_fragment_order<T: Copy>(rows: usize, cols: usize, values: &[T]) -> Vec<T> {
    assert!(rows.is_multiple_of(8) && cols.is_multiple_of(16) && values.len() == rows * cols);
    let mut out = Vec::with_capacity(values.len());
    for band in 0..rows / 8 {
        for tile in 0..cols / 16 {
            for lane in 0..32 {
                let row = band * 8 + lane / 4;
                let c0 = tile * 16 + 2 * (lane % 4);
                for c in [c0, c0 + 1, c0 + 8, c0 + 9] {
                    out.push(values[row * cols + c]);
                }
            }
        }
    }
    out
}

/// NVFP4 codes and block scales of one `[rows, cols]` matrix (the format's fragment order, see
/// `quant::nvfp4`) in the order the quantized grouped GEMM reads them as [`CodeKind::E2m1`]:
/// each code's nibble (sign, exponent, mantissa: unchanged) at the position an `i4_mma` code of
/// the same row and column takes, and each block's E4M3 scale as BF16 bits (exact: every E4M3
/// value is a BF16 value) in the `i4_mma` scale order with groups of 16, `[rows / 8][cols /
/// 16][8]`. The global scale is not part of it (the kernel takes it per band). Needs `rows % 8 ==
/// 0` and `cols % 64 == 0`; `codes` and `scales` as the format stores them.
pub fn nvfp4_fragment_order(
    rows: usize,
    cols: usize,
    codes: &[u8],
    scales: &[u8],
) -> (Vec<u8>, Vec<u8>) {
    use crate::quant::{fp8, int, nvfp4, QuantEncoding};
    assert!(rows.is_multiple_of(8) && cols.is_multiple_of(64));
    let mut nibbles = vec![0u8; rows * cols];
    nvfp4::unpack_codes(rows, cols, codes, &mut nibbles);
    // `pack_codes` keeps a code's low four bits, whatever they mean.
    let nibbles: Vec<i8> = nibbles.into_iter().map(|c| c as i8).collect();
    let packed = int::pack_codes(QuantEncoding::I4Mma, rows, cols, &nibbles);
    let e4m3 = fp8::e4m3_table();
    // `pack_scales` moves 16-bit values into the `*_mma` scale order; these are BF16 bits.
    let bf16_bits: Vec<half::f16> = nvfp4::unpack_scales(rows, cols, scales)
        .into_iter()
        .map(|code| half::f16::from_bits(half::bf16::from_f32(e4m3[code as usize]).to_bits()))
        .collect();
    let packed_scales = int::pack_scales(QuantEncoding::I4Mma, rows, cols / 16, &bf16_bits);
    (packed, packed_scales)
}

/// The scale group the E4M3 kernels use for an FP8 matrix of `cols` columns: the largest of
/// 128, 64, 32 and 16 that divides `cols` (the kernels need groups that divide K; each such group
/// lies inside one 128-column block, so it takes that block's scale). `None` when 16 does not
/// divide `cols`.
pub fn fp8_group(cols: usize) -> Option<usize> {
    [128, 64, 32, 16]
        .into_iter()
        .find(|g| cols.is_multiple_of(*g))
}

/// Bytes one `[rows, cols]` matrix of an encoding repacked at load (NVFP4 or our FP8) takes on
/// the device, `(codes, scales)`, when the repacked kernels take its shape (whole 16-row warps;
/// NVFP4: K % 64 == 0; FP8: groups of [`fp8_group`]); `None` otherwise (the loader then widens it
/// to BF16) and for encodings stored as they are. NVFP4: 4-bit codes and a BF16 scale per 16
/// (the band's global scale apart); FP8: a byte per code and 16 bytes of scales per 8-row band
/// and group.
pub fn repacked_bytes(
    encoding: crate::quant::QuantEncoding,
    rows: usize,
    cols: usize,
) -> Option<(usize, usize)> {
    use crate::quant::QuantEncoding;
    if !rows.is_multiple_of(16) {
        return None;
    }
    match encoding {
        QuantEncoding::Nvfp4 if cols.is_multiple_of(64) => Some((rows * cols / 2, rows * cols / 8)),
        QuantEncoding::Fp8Block => {
            fp8_group(cols).map(|group| (rows * cols, rows / 8 * (cols / group) * 16))
        }
        _ => None,
    }
}

/// Our block-scaled FP8 (`fp8_e4m3_b128`: row-major E4M3 codes, one F32 scale per 128 x 128
/// block, edge blocks cut short) of one `[rows, cols]` matrix in the order the quantized grouped
/// GEMM reads it as [`CodeKind::E4m3`] with groups of [`fp8_group`] columns: each code byte,
/// unchanged, at the position an `i8_mma` code of the same row and column takes, and per 8-row
/// band and group 16 bytes holding its block's F32 scale four times (the place of an `i8_mma`
/// band's eight FP16 scales, so the kernels' copies stay the same; 1/64 of the codes' bytes with
/// groups of 128, against the file's 1/16,384). Needs `rows % 8 == 0` and `cols % 16 == 0`;
/// `codes` and `scales` as the format stores them.
pub fn fp8_fragment_order(
    rows: usize,
    cols: usize,
    codes: &[u8],
    scales: &[u8],
) -> (Vec<u8>, Vec<u8>) {
    use crate::quant::{int, QuantEncoding, FP8_BLOCK};
    let group = fp8_group(cols).expect("columns a multiple of 16");
    assert!(rows.is_multiple_of(8));
    let (blocks_k, groups) = (cols.div_ceil(FP8_BLOCK), cols / group);
    assert_eq!(codes.len(), rows * cols);
    assert_eq!(scales.len(), rows.div_ceil(FP8_BLOCK) * blocks_k * 4);
    // `pack_codes` moves a code's eight bits, whatever they mean (a view, no copy).
    let packed = int::pack_codes(
        QuantEncoding::I8Mma,
        rows,
        cols,
        bytemuck::cast_slice(codes),
    );
    let mut packed_scales = Vec::with_capacity(rows / 8 * groups * 16);
    for band in 0..rows / 8 {
        for g in 0..groups {
            let block = band * 8 / FP8_BLOCK * blocks_k + g * group / FP8_BLOCK;
            for _ in 0..4 {
                packed_scales.extend_from_slice(&scales[block * 4..block * 4 + 4]);
            }
        }
    }
    (packed, packed_scales)
}

/// Activation rows quantized to E4M3 for the W8A8 expert GEMM ([`quantize_rows_e4m3`]):
/// `codes` `[rows, k]` bytes in [`e4m3_rows_order`], `scales` `[rows, k / group]` F32.
#[derive(Clone, Copy, Debug)]
pub struct E4m3Rows {
    pub codes: u64,
    pub scales: u64,
}

/// Where column `c` of a row of E4M3 activation codes sits in the W8A8 kernels' order: inside
/// each 16-column chunk, bytes `4 j .. 4 j + 3` hold columns `2 j`, `2 j + 1`, `2 j + 8`,
/// `2 j + 9`, the positions lane `j` of a quad holds in the `i8_mma` weight tiles. An m16n8k32
/// product over two such chunks then pairs every weight with its own activation (the k order
/// inside the product is permuted alike on both sides).
pub fn e4m3_rows_position(c: usize) -> usize {
    let (chunk, i) = (c / 16, c % 16);
    let (j, b) = match i {
        0..=7 => (i / 2, i % 2),
        _ => ((i - 8) / 2, 2 + i % 2),
    };
    chunk * 16 + 4 * j + b
}

/// E4M3 activation codes `[rows, cols]` (row-major, natural order) in the W8A8 kernels' order
/// ([`e4m3_rows_position`]). Needs `cols % 16 == 0`.
pub fn e4m3_rows_order(rows: usize, cols: usize, codes: &[u8]) -> Vec<u8> {
    assert!(cols.is_multiple_of(16) && codes.len() == rows * cols);
    let mut out = vec![0u8; codes.len()];
    for (src, dst) in codes.chunks_exact(cols).zip(out.chunks_exact_mut(cols)) {
        for (c, &v) in src.iter().enumerate() {
            dst[e4m3_rows_position(c)] = v;
        }
    }
    out
}

/// Whether FP8 experts of an `n` x `k` projection run as W8A8 here: E4M3 codes on the tiled
/// kernels with groups of 32..128 columns, and the sm_90 PTX (FP8 tensor cores; the portable
/// build has no FP8 product).
pub fn w8a8_supported(gpu: &Gpu, w: &CodeMatrices, n: usize, k: usize) -> bool {
    w.kind == CodeKind::E4m3
        && gpu.uses_sm90_ptx()
        && codes_tiled(n, w.group)
        && w.group >= 32
        && k.is_multiple_of(w.group)
}

/// `rows` BF16 rows of `k` columns to E4M3 codes and F32 scales per group of `group` columns
/// (the rule of `quant::fp8::quantize_rows`, bit for bit), in the order the W8A8 kernels read.
pub fn quantize_rows_e4m3(
    gpu: &Gpu,
    x: u64,
    rows: usize,
    k: usize,
    group: usize,
    out: &E4m3Rows,
) -> CudaResult<()> {
    if !group.is_power_of_two() || !(16..=128).contains(&group) || !k.is_multiple_of(group) {
        return unsupported(format!(
            "E4M3 activation rows of {k} columns in groups of {group}"
        ));
    }
    let threads = rows * k / 16;
    if threads == 0 {
        return Ok(());
    }
    let cfg = LaunchConfig::new((threads.div_ceil(256) as u32, 1, 1), 256, 0);
    kernels::moe::quantize_rows_e4m3(
        gpu,
        cfg,
        x,
        rows as i32,
        k as i32,
        group as i32,
        out.codes,
        out.scales,
    )
}

/// Puts 4-bit codes ([`CodeKind::Int4`], [`CodeKind::E2m1`]) of `matrices` matrices of `[rows,
/// cols]` (`codes`: their `i4_mma`-ordered bytes on the device, as files store them and
/// [`nvfp4_fragment_order`] writes them) into the word order the kernels read, in place: each
/// lane's codes of a band's two 16-column steps become one 32-bit word, so a lane loads one
/// word per two steps and each BF16 pair it decodes is a shift and a mask away (see
/// kernels/codes.cuh). Run once per matrix set, at load. Needs `rows % 8 == 0` and
/// `cols % 32 == 0` ([`codes4_cols_ok`]).
pub fn codes4_word_order(
    gpu: &Gpu,
    codes: u64,
    matrices: usize,
    rows: usize,
    cols: usize,
) -> CudaResult<()> {
    if !rows.is_multiple_of(8) || !codes4_cols_ok(cols) {
        return unsupported(format!("4-bit expert codes of {rows} x {cols}"));
    }
    // 128 bytes (a band's two steps) per warp.
    let chunks = matrices * rows * cols / 2 / 128;
    if chunks == 0 {
        return Ok(());
    }
    let blocks = chunks.div_ceil(8).min(65_535) as u32;
    let cfg = LaunchConfig::new((blocks, 1, 1), 256, 0);
    kernels::moe::codes4_word_order(gpu, cfg, codes, chunks as i64)
}

/// Whether 4-bit expert codes of `cols` columns (the K of their GEMM) fit the word order: whole
/// pairs of 16-column steps.
pub fn codes4_cols_ok(cols: usize) -> bool {
    cols.is_multiple_of(32)
}

/// Whether the tiled quantized kernels (not the general one) take an `n`-row projection with
/// groups of `group` columns: the condition for a packed shared expert beside codes.
pub fn codes_tiled(n: usize, group: usize) -> bool {
    n.is_multiple_of(16) && group.is_power_of_two() && (16..=128).contains(&group)
}

/// Dynamic shared memory of `grouped_gemm_i{8,4}_r{16,64}` (mirrors `minnow_codes::Stage` in
/// kernels/moe.cu): per stage of 128 columns, 16 bands x 8 code tiles, 16 bands x 8 scale rows
/// of 16 bytes, and the tile's activation rows at a pitch of 136; 3 stages for 16-row tiles, 2
/// for 64-row tiles.
fn codes_tile_smem_bytes(bits: usize, tile_rows: usize) -> usize {
    let stage = 16 * 8 * (8 * 16 * bits / 8) + 16 * 8 * 16 + tile_rows * 136 * 2;
    stage * if tile_rows == 64 { 2 } else { 3 }
}

/// One stage of the W8A8 tiles (mirrors `minnow_codes::StageQ`): the E4M3 stage's codes and
/// scales, the rows' E4M3 bytes at a pitch of 144 and 4 F32 row scales per row.
fn w8a8_stage_bytes(tile_rows: usize) -> usize {
    16 * 8 * 128 + 16 * 8 * 16 + tile_rows * 144 + tile_rows * 16
}

/// The grouped GEMM of [`grouped_gemm`] over quantized experts: per scale group, the F32 sum of
/// code x activation on tensor cores, then `acc = fma(sum, scale, acc)`, in ascending K (so a
/// row's result does not depend on the batch, and no weight is rounded to BF16). Needs
/// `n % 8 == 0`, `k % 16 == 0` and a group that divides `k` (the format's rules for `*_mma`).
///
/// With `xq` (E4M3 experts where [`w8a8_supported`]): the W8A8 kernels over those rows, `x`'s
/// quantization by [`quantize_rows_e4m3`] with the experts' group (`x` itself still feeds a
/// packed shared expert). Tiles of 16 or 64 rows; `grouped_gemm_codes_wgmma` takes 128.
///
/// `gated` (a gate/up projection, each expert's `n` rows `[gate; up]`; BF16 activations and
/// the tiled kernels' shapes only, [`codes_tiled`]): `y` gets `silu_mul`'s `n / 2` columns per
/// row instead of the `n` products, the same bits as this GEMM followed by
/// [`silu_mul`](super::silu_mul), without the second launch and the products' round trip
/// through memory.
#[allow(clippy::too_many_arguments)]
pub fn grouped_gemm_codes(
    gpu: &Gpu,
    x: u64,
    xq: Option<&E4m3Rows>,
    row_token: u64,
    w: &CodeMatrices,
    y: u64,
    t: &ExpertTiles,
    n: usize,
    k: usize,
    gated: bool,
) -> CudaResult<()> {
    let (tiles, num_tiles, max_tiles, tile_rows) = (t.tiles, t.num_tiles, t.max_tiles, t.rows);
    // (32-row tiles: the codes kernels over BF16 rows only, not W8A8.)
    let heights: &[usize] = if xq.is_some() {
        &[16, 64]
    } else {
        &[16, 32, 64]
    };
    if !heights.contains(&tile_rows) {
        return unsupported(format!("expert GEMM tiles of {tile_rows} rows"));
    }
    // (The general kernel, for shapes the tiles refuse, does not gate.)
    if gated && (xq.is_some() || !codes_tiled(n, w.group)) {
        return unsupported(format!(
            "a gated expert GEMM over {:?} experts of {n} x {k}{}",
            w.kind,
            if xq.is_some() {
                " on E4M3 activations"
            } else {
                ""
            }
        ));
    }
    if let Some(q) = xq {
        if !w8a8_supported(gpu, w, n, k) {
            return unsupported(format!(
                "W8A8 over {:?} experts of {n} x {k} with groups of {} here",
                w.kind, w.group
            ));
        }
        if max_tiles == 0 {
            return Ok(());
        }
        use kernels::moe::{grouped_gemm_f8f8_r16, grouped_gemm_f8f8_r64, W8a8Gemm};
        // 3 stages for 16-row tiles, 2 for 64-row tiles, as the E4M3 kernels (3 and 4 stages
        // for 64 rows measured slower in prefill).
        let (kernel, stages): (W8a8Gemm, usize) = if tile_rows == 16 {
            (grouped_gemm_f8f8_r16, 3)
        } else {
            (grouped_gemm_f8f8_r64, 2)
        };
        let cfg = LaunchConfig::new(
            (n.div_ceil(128) as u32, max_tiles as u32, 1),
            256,
            (stages * w8a8_stage_bytes(tile_rows)) as u32,
        );
        return kernel(
            gpu,
            cfg,
            x,
            q.codes,
            q.scales,
            row_token,
            w.codes,
            w.scales,
            w.group as i32,
            w.shared.map_or(0, |(ptr, _)| ptr),
            w.shared.map_or(-1, |(_, slot)| slot as i32),
            y,
            tiles,
            num_tiles,
            n as i32,
            k as i32,
        );
    }
    // The kernels per encoding: (16-row tiles, 64-row tiles, the general kernel).
    use kernels::moe::{
        grouped_gemm_f4_r16, grouped_gemm_f4_r32, grouped_gemm_f4_r64, grouped_gemm_f8_r16,
        grouped_gemm_f8_r32, grouped_gemm_f8_r64, grouped_gemm_i4_any, grouped_gemm_i4_r16,
        grouped_gemm_i4_r32, grouped_gemm_i4_r64, grouped_gemm_i8_any, grouped_gemm_i8_r16,
        grouped_gemm_i8_r32, grouped_gemm_i8_r64, CodesGemm,
    };
    let (tiled_kernels, any): ([CodesGemm; 3], Option<CodesGemm>) = match w.kind {
        CodeKind::Int8 => (
            [
                grouped_gemm_i8_r16,
                grouped_gemm_i8_r32,
                grouped_gemm_i8_r64,
            ],
            Some(grouped_gemm_i8_any),
        ),
        CodeKind::Int4 => (
            [
                grouped_gemm_i4_r16,
                grouped_gemm_i4_r32,
                grouped_gemm_i4_r64,
            ],
            Some(grouped_gemm_i4_any),
        ),
        // E2M1 and E4M3 have tiled kernels only: a loader widens shapes they refuse.
        CodeKind::E2m1 => (
            [
                grouped_gemm_f4_r16,
                grouped_gemm_f4_r32,
                grouped_gemm_f4_r64,
            ],
            None,
        ),
        CodeKind::E4m3 => (
            [
                grouped_gemm_f8_r16,
                grouped_gemm_f8_r32,
                grouped_gemm_f8_r64,
            ],
            None,
        ),
    };
    if !w.complete() {
        return unsupported(format!(
            "E2M1 expert codes need groups of 16 and band scales (got groups of {})",
            w.group
        ));
    }
    let k_ok = if w.kind.bits() == 4 {
        codes4_cols_ok(k)
    } else {
        k.is_multiple_of(16)
    };
    if !n.is_multiple_of(8) || !k_ok || w.group == 0 || !k.is_multiple_of(w.group) {
        return unsupported(format!(
            "quantized experts of {n} x {k} with groups of {}",
            w.group
        ));
    }
    if max_tiles == 0 {
        return Ok(());
    }
    // Shapes the tiled kernels refuse take the general kernel (`codes_tile` in kernels/moe.cu
    // needs whole 16-column warps and a group of one to eight 16-column steps).
    let tiled = codes_tiled(n, w.group);
    if w.shared.is_some() && !tiled {
        return unsupported(format!(
            "a packed shared expert beside quantized experts of {n} x {k} with groups of {}",
            w.group
        ));
    }
    let (kernel, cfg) = match (tiled, any) {
        (true, _) => (
            tiled_kernels[match tile_rows {
                16 => 0,
                32 => 1,
                _ => 2,
            }],
            LaunchConfig::new(
                (n.div_ceil(128) as u32, max_tiles as u32, 1),
                256,
                codes_tile_smem_bytes(w.kind.bits(), tile_rows) as u32,
            ),
        ),
        (false, Some(any)) => (
            any,
            LaunchConfig::new((n.div_ceil(64) as u32, max_tiles as u32, 1), 64, 0),
        ),
        (false, None) => {
            return unsupported(format!("{:?} expert codes of {n} x {k}", w.kind));
        }
    };
    // (Only the tiled kernels read their tiles before waiting.)
    let settled = tiled && t.settled;
    launch_codes(
        kernel, gpu, cfg, x, row_token, w, y, t, n, k, gated, settled,
    )
}

/// Launches a kernel of the codes family (the mma.sync tiles and their wgmma siblings share
/// the parameters) over codes `w` and the dispatched tiles `t`. `settled` (the mma.sync tiles
/// only, where [`ExpertTiles::settled`]): the kernel reads its tile before waiting for the
/// kernel before it.
#[allow(clippy::too_many_arguments)]
pub(super) fn launch_codes(
    kernel: kernels::moe::CodesGemm,
    gpu: &Gpu,
    cfg: LaunchConfig,
    x: u64,
    row_token: u64,
    w: &CodeMatrices,
    y: u64,
    t: &ExpertTiles,
    n: usize,
    k: usize,
    gated: bool,
    settled: bool,
) -> CudaResult<()> {
    // The tiled kernels' `flags` (CODES_GATED, CODES_SETTLED in kernels/moe.cu); the others read
    // bit 0 as `gated`.
    let flags = i32::from(gated) | (i32::from(settled) << 1);
    kernel(
        gpu,
        cfg,
        x,
        row_token,
        w.codes,
        w.scales,
        w.band_scale,
        w.group as i32,
        w.shared.map_or(0, |(ptr, _)| ptr),
        w.shared.map_or(-1, |(_, slot)| slot as i32),
        y,
        t.tiles,
        t.num_tiles,
        n as i32,
        k as i32,
        flags,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values with every sign and a spread of magnitudes, for the repacking tests.
    fn patterned(rows: usize, cols: usize) -> Vec<f32> {
        (0..rows * cols)
            .map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 3.0)
            .collect()
    }

    #[test]
    fn nvfp4_repacked_for_the_gpu_holds_the_same_values() {
        use crate::quant::{self, int, nvfp4::e2m1_to_f32, QuantEncoding};
        let (rows, cols) = (16, 128);
        // Deterministic values with every sign and magnitude, an all-zero block (row 0,
        // columns 0..16), negative values that round to zero, and one large outlier.
        let mut values = patterned(rows, cols);
        values[..16].iter_mut().for_each(|v| *v = 0.0);
        values[cols + 3] = -1e-6;
        values[5 * cols + 70] = 40.0;
        let q = quant::quantize(QuantEncoding::Nvfp4, rows, cols, 16, &values).unwrap();
        let mut want = vec![0f32; rows * cols];
        q.view(QuantEncoding::Nvfp4, rows, cols, 16)
            .dequantize(&mut want);
        let (codes, scales) = nvfp4_fragment_order(rows, cols, &q.codes, &q.scales);
        let mut nibbles = vec![0i8; rows * cols];
        int::unpack_codes(QuantEncoding::I4Mma, rows, cols, &codes, &mut nibbles);
        let blocks = cols / 16;
        assert_eq!(scales.len(), rows * blocks * 2);
        assert_eq!(
            repacked_bytes(QuantEncoding::Nvfp4, rows, cols),
            Some((codes.len(), scales.len()))
        );
        let mut negative_zeros = 0;
        for r in 0..rows {
            for c in 0..cols {
                let at = ((r / 8 * blocks + c / 16) * 8 + r % 8) * 2;
                let scale = half::bf16::from_le_bytes([scales[at], scales[at + 1]]).to_f32();
                let code = nibbles[r * cols + c] as u8 & 0xF;
                negative_zeros += usize::from(code == 8);
                let got = (e2m1_to_f32(code) * scale) * q.global_scale;
                assert_eq!(
                    got.to_bits(),
                    want[r * cols + c].to_bits(),
                    "row {r} column {c}"
                );
            }
        }
        assert!(negative_zeros > 0, "a -0 code survives the repacking");
    }

    #[test]
    fn e4m3_rows_put_each_column_beside_its_weight_in_the_fragment_order() {
        // Row 0 of a band in the fragment order: tile t's lanes 0..4 hold, four values each,
        // the columns an activation row's chunk t must hold in the same places.
        let cols = 48;
        let columns: Vec<u32> = (0..8 * cols as u32).collect();
        let fragments = bf16_fragment_order(8, cols, &columns);
        let row: Vec<u8> = (0..cols as u8).collect();
        let ordered = e4m3_rows_order(1, cols, &row);
        for tile in 0..cols / 16 {
            let weights = &fragments[tile * 128..tile * 128 + 16];
            let activations = &ordered[tile * 16..tile * 16 + 16];
            assert!(weights
                .iter()
                .zip(activations)
                .all(|(&w, &a)| w == a as u32));
        }
    }

    #[test]
    fn fp8_activation_rows_take_a_scale_per_group() {
        use crate::quant::fp8::{e4m3_to_f32, quantize_rows};
        let (rows, cols, group) = (2, 64, 32);
        let mut values = patterned(rows, cols);
        values[32..64].iter_mut().for_each(|v| *v = 0.0); // row 0's second group: zeros
        values[64] = -1e-30; // rounds to a zero code, which keeps no sign
        let (codes, scales) = quantize_rows(rows, cols, group, &values);
        assert_eq!(scales.len(), rows * cols / group);
        assert_eq!(scales[1], 1.0);
        assert_eq!(codes[64], 0);
        for (i, (&code, &v)) in codes.iter().zip(&values).enumerate() {
            let s = scales[i / group];
            let max = values[i / group * group..][..group]
                .iter()
                .fold(0f32, |m, v| m.max(v.abs()));
            if max > 0.0 {
                assert_eq!(s, max / 448.0);
            }
            // E4M3 keeps 3 mantissa bits: within half an ulp (1/16 relative) or a subnormal step.
            let back = e4m3_to_f32(code) * s;
            assert!(
                (back - v).abs() <= v.abs() / 16.0 + s * 2f32.powi(-10),
                "{i}: {v} -> {back}"
            );
        }
    }

    #[test]
    fn fp8_repacked_for_the_gpu_holds_the_same_values() {
        use crate::quant::{self, fp8::e4m3_to_f32, int, QuantEncoding};
        // Two 128-row blocks of scales and two 128-column blocks (both second ones cut short:
        // groups of 64); block (0, 1) holds E4M3 subnormals next to one value that sets its
        // scale, and a -0 code.
        let (rows, cols) = (144, 192);
        let mut values = patterned(rows, cols);
        for r in 0..128 {
            values[r * cols + 128..r * cols + 192]
                .iter_mut()
                .for_each(|v| *v *= 1e-4);
        }
        values[130] = 5.0;
        let mut q = quant::quantize(QuantEncoding::Fp8Block, rows, cols, 128, &values).unwrap();
        // Our quantizer writes no -0; another writer may.
        q.codes[131] = 0x80;
        let mut want = vec![0f32; rows * cols];
        q.view(QuantEncoding::Fp8Block, rows, cols, 128)
            .dequantize(&mut want);
        let (codes, scales) = fp8_fragment_order(rows, cols, &q.codes, &q.scales);
        let mut bytes = vec![0i8; rows * cols];
        int::unpack_codes(QuantEncoding::I8Mma, rows, cols, &codes, &mut bytes);
        assert_eq!(fp8_group(cols), Some(64));
        let groups = cols / 64;
        assert_eq!(scales.len(), rows / 8 * groups * 16);
        assert_eq!(
            repacked_bytes(QuantEncoding::Fp8Block, rows, cols),
            Some((codes.len(), scales.len()))
        );
        let (mut subnormals, mut negative_zeros) = (0, 0);
        for r in 0..rows {
            for c in 0..cols {
                let at = (r / 8 * groups + c / 64) * 16;
                let copies: Vec<f32> = scales[at..at + 16]
                    .chunks(4)
                    .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                    .collect();
                assert!(
                    copies.iter().all(|&s| s == copies[0]),
                    "band {} group {}",
                    r / 8,
                    c / 64
                );
                let code = bytes[r * cols + c] as u8;
                subnormals += usize::from(code & 0x78 == 0 && code & 7 != 0);
                negative_zeros += usize::from(code == 0x80);
                let got = e4m3_to_f32(code) * copies[0];
                assert_eq!(
                    got.to_bits(),
                    want[r * cols + c].to_bits(),
                    "row {r} column {c}"
                );
            }
        }
        assert!(
            subnormals > 0 && negative_zeros > 0,
            "subnormal and -0 codes survive"
        );
    }

    #[test]
    fn expert_tiles_follow_rows_per_expert() {
        // A denoising step: 32 tokens x 8 picks over 256 experts -> few rows per expert.
        assert_eq!(moe_tile_rows(256, 256), 16);
        // An 8K prefill: 65,536 picks -> 256 rows per expert on average.
        assert_eq!(moe_tile_rows(65_536, 256), 64);
        // 4, 16 and 64 denoising blocks of 2.2 (up to 48 admitted experts per block).
        assert_eq!(moe_tile_rows(4 * 32 * 8, 4 * 48), 16);
        assert_eq!(moe_tile_rows(16 * 32 * 8, 256), 64);
        assert_eq!(moe_tile_rows(64 * 32 * 8, 256), 64);
        // The bound covers the worst case: every expert gets a partial tile.
        assert_eq!(moe_max_tiles(256, 256, 16), 16 + 256);
        assert_eq!(moe_max_tiles(4, 256, 16), 1 + 4);
        assert_eq!(grouped_gemm_smem_bytes(16, 3), 3 * 80 * 72 * 2);
        assert_eq!(grouped_gemm_smem_bytes(64, 3), 3 * 128 * 72 * 2);
        // The kernels' static_asserts.
        assert_eq!(codes_tile_smem_bytes(4, 16), 43776);
        assert_eq!(codes_tile_smem_bytes(CodeKind::E2m1.bits(), 64), 55296);
        assert_eq!(codes_tile_smem_bytes(8, 16), 68352);
        assert_eq!(codes_tile_smem_bytes(CodeKind::E4m3.bits(), 16), 68352);
        assert_eq!(codes_tile_smem_bytes(4, 64), 55296);
        assert_eq!(codes_tile_smem_bytes(8, 64), 71680);
        assert_eq!(3 * w8a8_stage_bytes(16), 62976);
        assert_eq!(2 * w8a8_stage_bytes(64), 57344);
    }

    #[test]
    fn fragment_order_puts_each_lane_s_four_weights_together() {
        let (rows, cols) = (16, 32);
        let values: Vec<usize> = (0..rows * cols).collect();
        let order = bf16_fragment_order(rows, cols, &values);
        // Every weight exactly once.
        let mut seen = order.clone();
        seen.sort_unstable();
        assert_eq!(seen, values);
        // Band 1, column tile 1, lane 6: row 8 + 1, columns 16 + 4 + {0, 1, 8, 9}.
        let at = ((cols / 16 + 1) * 32 + 6) * 4;
        let want: Vec<usize> = [20, 21, 28, 29].iter().map(|c| 9 * cols + c).collect();
        assert_eq!(&order[at..at + 4], &want[..]);
    }
}
