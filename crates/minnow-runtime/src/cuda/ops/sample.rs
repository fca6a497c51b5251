//! Sampled candidates drawn on the device from a forward's BF16 logits rows (`kernels/sample.cu`).

use super::elementwise::{top1_softmax, topk_rows, TOP1_SLICES, TOPK_MAX};
use super::unsupported::unsupported;
use crate::cuda::buffer::DeviceBuffer;
use crate::cuda::error::CudaResult;
use crate::cuda::gpu::Gpu;
use crate::cuda::kernels;
use crate::cuda::launch::LaunchConfig;

/// Largest vocabulary [`draw_rows`] takes (the kernel's block sums live in shared memory).
pub const DRAW_MAX_VOCAB: usize = 1024 * 256;

/// Words of one draw's parameters as the kernel reads them (`DrawParams`, 32 bytes).
pub const DRAW_PARAM_WORDS: usize = 8;

/// Which sampling rule a draw follows (the kernel's `rule`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrawRuleCode {
    /// LLaDA2.0/2.1: tempered logits, filters, confidence in the filtered distribution.
    Official = 0,
    /// LLaDA2.2: tempered weights, filters, confidence under the untempered softmax.
    Port = 1,
}

/// One draw's parameters, laid out as the kernel's `DrawParams`.
pub fn draw_params(
    row: u32,
    rule: DrawRuleCode,
    top_k: u32,
    temperature: f32,
    top_p: f32,
    uniform: f64,
) -> [u32; DRAW_PARAM_WORDS] {
    let u = uniform.to_bits();
    [
        row,
        rule as u32,
        top_k,
        temperature.to_bits(),
        top_p.to_bits(),
        0,
        u as u32,
        (u >> 32) as u32,
    ]
}

/// Draws one candidate per entry of `params` (`draws` entries of [`DRAW_PARAM_WORDS`] words,
/// [`draw_params`]) from the BF16 logits rows `[rows, vocab]` at `logits`: `out[2 i]` gets the
/// token, `out[2 i + 1]` its confidence (F32 bits). `best_ids` / `best_values` are the rows' best
/// ids and their logits (`best_k` per row, in [`topk_rows`]'s order),
/// `top_token` / `top_conf` their argmax and its probability, as the forward's top-k kernels left
/// them. One CTA per draw.
#[allow(clippy::too_many_arguments)]
pub fn draw_rows(
    gpu: &Gpu,
    logits: u64,
    best_ids: u64,
    best_values: u64,
    best_k: usize,
    top_token: u64,
    top_conf: u64,
    params: u64,
    out: u64,
    draws: usize,
    vocab: usize,
) -> CudaResult<()> {
    if vocab == 0 || vocab > DRAW_MAX_VOCAB || best_k == 0 {
        return unsupported(format!(
            "device draws over rows of {vocab} logits (1 to {DRAW_MAX_VOCAB}) with {best_k} best ids"
        ));
    }
    if draws == 0 {
        return Ok(());
    }
    let cfg = LaunchConfig::new((draws as u32, 1, 1), 1024, 0);
    kernels::sample::draw_rows(
        gpu,
        cfg,
        logits,
        best_ids,
        best_values,
        best_k as i32,
        top_token,
        top_conf,
        params,
        out,
        vocab as i32,
    )
}

/// Rows of BF16 logits on the device with what a forward's top-k step leaves beside them (top-1
/// pairs, [`TOPK_MAX`] best ids), and room for `max_draws` draws: the draw
/// kernel's inputs outside a forward, for its tests and benchmarks.
pub struct LogitRows {
    logits: DeviceBuffer<u16>,
    top: DeviceBuffer<u32>,
    best: DeviceBuffer<u32>,
    params: DeviceBuffer<u32>,
    out: DeviceBuffer<u32>,
    rows: usize,
    vocab: usize,
}

impl LogitRows {
    /// Uploads `bits` (BF16 bits, `[rows, vocab]`) and runs the top-1 and top-k kernels on them.
    pub fn new(gpu: &Gpu, bits: &[u16], vocab: usize, max_draws: usize) -> CudaResult<Self> {
        let rows = bits.len() / vocab.max(1);
        let k = TOPK_MAX.min(vocab);
        let scratch: DeviceBuffer<f32> = gpu.alloc(rows * TOP1_SLICES * 3)?;
        let me = LogitRows {
            logits: gpu.upload(bits)?,
            top: gpu.alloc(2 * rows)?,
            best: gpu.alloc(2 * rows * k)?,
            params: gpu.alloc(max_draws.max(1) * DRAW_PARAM_WORDS)?,
            out: gpu.alloc(2 * max_draws.max(1))?,
            rows,
            vocab,
        };
        top1_softmax(
            gpu,
            me.logits.ptr(),
            scratch.ptr(),
            me.top.ptr(),
            me.top.ptr_at(rows),
            rows,
            vocab,
        )?;
        topk_rows(
            gpu,
            me.logits.ptr(),
            me.best.ptr(),
            me.best.ptr_at(rows * k),
            rows,
            vocab,
            k,
        )?;
        gpu.synchronize()?;
        Ok(me)
    }

    /// One `(token, confidence)` per entry of `params` ([`draw_params`], rows counted here).
    pub fn draw(
        &self,
        gpu: &Gpu,
        params: &[[u32; DRAW_PARAM_WORDS]],
    ) -> CudaResult<Vec<(u32, f32)>> {
        if params.len() * 2 > self.out.len() {
            return unsupported(format!(
                "{} draws into room for {}",
                params.len(),
                self.out.len() / 2
            ));
        }
        let k = TOPK_MAX.min(self.vocab);
        gpu.write(&self.params, 0, params.as_flattened())?;
        draw_rows(
            gpu,
            self.logits.ptr(),
            self.best.ptr(),
            self.best.ptr_at(self.rows * k),
            k,
            self.top.ptr(),
            self.top.ptr_at(self.rows),
            self.params.ptr(),
            self.out.ptr(),
            params.len(),
            self.vocab,
        )?;
        let mut out = vec![0u32; 2 * params.len()];
        gpu.read(&self.out, 0, &mut out)?;
        Ok(out
            .chunks_exact(2)
            .map(|p| (p[0], f32::from_bits(p[1])))
            .collect())
    }
}
