//! The model's weights in device memory, in the layouts the CUDA forward wants: BF16 matrices in
//! PyTorch `[out, in]` order, gate and up projections stacked (`[2 I, D]`, gate first) so one GEMM
//! computes both, routed experts packed per layer (`[E, 2 I, D]` and `[E, D, I]`) for the grouped
//! GEMM, and the router kept exact: BF16 when stored BF16, else F32; its bias in F32
//! (docs/model.md §4, §7.6); tensor names come from [`crate::schema`].

use half::{bf16, f16};
use minnow_format::TensorSource;
use minnow_runtime::cuda::tma::TensorMaps;
use minnow_runtime::cuda::{ops, DeviceBuffer, Gpu};
use minnow_runtime::dtype::widen;
use minnow_runtime::quant::QuantEncoding;
use minnow_runtime::DType;

use super::device_error::device_err;
use super::experts::{load_projection, stored_codes, ExpertMatrix, Projection};
use crate::config::Config;
use crate::error::{ModelError, Result};
use crate::schema::{self, Tensor};

pub(crate) struct DenseMlp {
    pub gate_up: DeviceBuffer<bf16>,
    pub down: DeviceBuffer<bf16>,
    pub width: usize,
}

/// The router matrix `[E, D]`. BF16 when the checkpoint stores it in BF16 (every released one):
/// the BF16 GEMM with F32 output computes exactly the promoted F32 products, on tensor cores.
/// Any other stored type is kept in F32 and multiplied in full F32.
pub(crate) enum RouterWeights {
    Bf16(DeviceBuffer<bf16>),
    F32(DeviceBuffer<f32>),
}

impl RouterWeights {
    fn bytes(&self) -> usize {
        match self {
            RouterWeights::Bf16(b) => b.bytes(),
            RouterWeights::F32(b) => b.bytes(),
        }
    }
}

/// Where a MoE layer's shared expert lives.
pub(crate) enum SharedExpert {
    None,
    /// Own matrices, run through cuBLAS (widths other than one routed expert's).
    Separate(DenseMlp),
    /// Packed as expert `E` after the routed ones (one shared expert of the routed width, as in
    /// every released checkpoint): the grouped GEMM computes it along with the routed experts
    /// (BF16 routed experts hold it as their last slot; codes carry it in BF16, see
    /// `ExpertMatrix::Codes`).
    Packed,
}

pub(crate) struct Moe {
    pub router: RouterWeights,
    pub bias: DeviceBuffer<f32>,
    /// `[E (+1 packed shared), 2 I, D]` and `[E (+1), D, I]`.
    pub experts_gate_up: ExpertMatrix,
    pub experts_down: ExpertMatrix,
    pub shared: SharedExpert,
    /// Tensor maps of the BF16 `[experts_gate_up, experts_down]` (boxes of 64 rows) for the TMA
    /// kernels that stream them: the wgmma grouped expert GEMM (`ops::grouped_wgmma_supported`),
    /// the TMA-fed mma.sync one (`ops::grouped_tma_supported`) and the pool GEMM of 2.2 denoising
    /// steps (`ops::pool_gemm_supported`), where the GPU and the shapes allow any of them.
    pub expert_maps: Option<TensorMaps>,
}

impl Moe {
    fn new(
        gpu: &Gpu,
        c: &Config,
        router: RouterWeights,
        bias: DeviceBuffer<f32>,
        experts_gate_up: ExpertMatrix,
        experts_down: ExpertMatrix,
        shared: SharedExpert,
    ) -> Self {
        let (d, w) = (c.hidden_size, c.moe_intermediate_size);
        let packed = matches!(shared, SharedExpert::Packed);
        let slots = c.num_experts + usize::from(packed);
        let pooled = c.expert_capacity.is_some()
            && packed
            && ops::pool_gemm_supported(gpu, 1, 2 * w, d)
            && ops::pool_gemm_supported(gpu, 1, d, w);
        let tuning = minnow_runtime::cuda::tuning::tuning();
        let grouped = (tuning.grouped_tma
            && [16, 64].iter().any(|&rows| {
                ops::grouped_tma_supported(gpu, rows, 2 * w, d)
                    && ops::grouped_tma_supported(gpu, rows, d, w)
            }))
            || (tuning.grouped_wgmma
                && ops::grouped_wgmma_supported(gpu, 2 * w, d)
                && ops::grouped_wgmma_supported(gpu, d, w));
        let expert_maps = match (experts_gate_up.bf16(), experts_down.bf16()) {
            (Some(gate_up), Some(down)) if pooled || grouped => TensorMaps::try_rows(
                gpu,
                ops::POOL_GEMM_WEIGHT_ROWS,
                &[
                    (gate_up.ptr(), d, slots * 2 * w),
                    (down.ptr(), w, slots * d),
                ],
            ),
            _ => None,
        };
        Self {
            router,
            bias,
            experts_gate_up,
            experts_down,
            shared,
            expert_maps,
        }
    }
}

impl Moe {
    /// Both expert projections' BF16 rows, when neither is stored as codes (what the pool GEMM
    /// and a packed shared expert read).
    pub fn bf16_experts(&self) -> Option<(&DeviceBuffer<bf16>, &DeviceBuffer<bf16>)> {
        Some((self.experts_gate_up.bf16()?, self.experts_down.bf16()?))
    }
}

/// Whether the config's shared expert can ride in the grouped GEMM as one more expert: as the
/// last slot of BF16 routed experts, or beside codes in their fragment order.
pub(crate) fn shared_packs(c: &Config) -> bool {
    c.num_shared_experts == 1
}

/// Whether a packable shared expert joins quantized routed experts' grouped launch
/// (`Tuning::shared_in_codes`), where their tiles can take it.
fn shared_joins_codes(c: &Config) -> bool {
    shared_packs(c) && minnow_runtime::cuda::tuning::tuning().shared_in_codes
}

pub(crate) enum Mlp {
    Dense(DenseMlp),
    Moe(Box<Moe>),
}

pub(crate) struct Layer {
    pub input_norm: DeviceBuffer<bf16>,
    pub post_norm: DeviceBuffer<bf16>,
    pub qkv: DeviceBuffer<bf16>,
    pub q_norm: DeviceBuffer<bf16>,
    pub k_norm: DeviceBuffer<bf16>,
    pub dense: DeviceBuffer<bf16>,
    pub mlp: Mlp,
}

pub(crate) struct Weights {
    pub embed: DeviceBuffer<bf16>,
    pub layers: Vec<Layer>,
    pub final_norm: DeviceBuffer<bf16>,
    pub lm_head: DeviceBuffer<bf16>,
}

/// Reads tensors from a checkpoint, checking each shape against the config.
struct Reader<'a> {
    source: &'a dyn TensorSource,
}

impl Reader<'_> {
    fn values(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let t = self.source.tensor(name).ok_or_else(|| {
            ModelError::Weights(format!("{}: missing tensor {name}", self.source.describe()))
        })?;
        if t.shape != shape {
            return Err(ModelError::Weights(format!(
                "{name}: shape {:?}, expected {shape:?}",
                t.shape
            )));
        }
        if let Some(q) = t.quant_mat() {
            // A quantized tensor the device keeps in BF16 (see `experts`): its stored values.
            let mut values = vec![0.0f32; q.rows * q.cols];
            q.dequantize(&mut values);
            return Ok(values);
        }
        let dtype = t.dtype.ok_or_else(|| {
            ModelError::Weights(format!("{name}: unsupported element type {}", t.dtype_name))
        })?;
        Ok(widen(dtype, t.data))
    }

    fn bf16(&self, name: &str, shape: &[usize]) -> Result<Vec<bf16>> {
        // Stored BF16 (most of a checkpoint) is copied as it is: no F32 copy on the way.
        if let Some(t) = self.source.tensor(name) {
            if t.shape == shape && t.quant.is_none() && t.dtype == Some(DType::BF16) {
                return Ok(t
                    .data
                    .chunks_exact(2)
                    .map(|b| bf16::from_bits(u16::from_le_bytes([b[0], b[1]])))
                    .collect());
            }
        }
        Ok(self
            .values(name, shape)?
            .into_iter()
            .map(bf16::from_f32)
            .collect())
    }
}

/// Where to put a tensor: a device buffer and an element offset.
fn put<T: Copy>(gpu: &Gpu, buf: &DeviceBuffer<T>, offset: usize, data: &[T]) -> Result<()> {
    gpu.write(buf, offset, data).map_err(device_err)
}

fn upload<T: Copy>(gpu: &Gpu, data: &[T]) -> Result<DeviceBuffer<T>> {
    gpu.upload(data).map_err(device_err)
}

/// Shapes derived from the config, shared by loading and random initialisation.
pub(crate) struct Dims {
    pub d: usize,
    pub qkv_rows: usize,
    pub attn_width: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub dense_width: usize,
    pub expert_width: usize,
    pub shared_width: usize,
    pub experts: usize,
}

impl Dims {
    pub fn new(c: &Config) -> Self {
        Self {
            d: c.hidden_size,
            qkv_rows: (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim,
            attn_width: c.num_attention_heads * c.head_dim,
            head_dim: c.head_dim,
            vocab: c.vocab_size,
            dense_width: c.intermediate_size,
            expert_width: c.moe_intermediate_size,
            shared_width: c.moe_intermediate_size * c.num_shared_experts,
            experts: c.num_experts,
        }
    }
}

impl Weights {
    /// Uploads every tensor of the checkpoint (BF16; see [`RouterWeights`] for the router; the
    /// expert bias in F32).
    pub fn load(gpu: &Gpu, config: &Config, source: &dyn TensorSource) -> Result<Self> {
        let started = std::time::Instant::now();
        let r = Reader { source };
        let dims = Dims::new(config);
        let d = dims.d;
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let swiglu = |mlp: schema::Mlp, width: usize| -> Result<DenseMlp> {
                let name = |projection| {
                    Tensor::MlpProjection {
                        layer: i,
                        mlp,
                        projection,
                    }
                    .name()
                };
                let gate_up = gpu.alloc::<bf16>(2 * width * d).map_err(device_err)?;
                put(
                    gpu,
                    &gate_up,
                    0,
                    &r.bf16(&name(schema::Projection::Gate), &[width, d])?,
                )?;
                put(
                    gpu,
                    &gate_up,
                    width * d,
                    &r.bf16(&name(schema::Projection::Up), &[width, d])?,
                )?;
                let down = upload(gpu, &r.bf16(&name(schema::Projection::Down), &[d, width])?)?;
                Ok(DenseMlp {
                    gate_up,
                    down,
                    width,
                })
            };
            let mlp = if i < config.first_k_dense_replace {
                Mlp::Dense(swiglu(schema::Mlp::Dense, dims.dense_width)?)
            } else {
                let (e, w) = (dims.experts, dims.expert_width);
                let name = Tensor::Router(i).name();
                let values = r.values(&name, &[e, d])?;
                let router = if source.tensor(&name).and_then(|t| t.dtype) == Some(DType::BF16) {
                    RouterWeights::Bf16(upload(
                        gpu,
                        &values
                            .iter()
                            .map(|&v| bf16::from_f32(v))
                            .collect::<Vec<_>>(),
                    )?)
                } else {
                    RouterWeights::F32(upload(gpu, &values)?)
                };
                let bias = if config.moe_router_enable_expert_bias {
                    upload(gpu, &r.values(&Tensor::RouterBias(i).name(), &[e])?)?
                } else {
                    upload(gpu, &vec![0f32; e])?
                };
                // Routed experts stay in their stored integer codes when the kernels read
                // them; the shared expert (never quantized) then cannot join their matrices.
                let expert_names = |x: usize, proj: &str| -> Vec<String> {
                    let mlp = if x < e {
                        schema::Mlp::Expert(x)
                    } else {
                        schema::Mlp::Shared
                    };
                    let name = |projection| {
                        Tensor::MlpProjection {
                            layer: i,
                            mlp,
                            projection,
                        }
                        .name()
                    };
                    match proj {
                        "gate_up" => {
                            vec![name(schema::Projection::Gate), name(schema::Projection::Up)]
                        }
                        _ => vec![name(schema::Projection::Down)],
                    }
                };
                let projection = |slots: usize, proj: &str, rows, cols, label| Projection {
                    names: (0..slots).flat_map(|x| expert_names(x, proj)).collect(),
                    rows,
                    cols,
                    label,
                };
                let gate_up_label = format!("layer {i} experts gate/up");
                let down_label = format!("layer {i} experts down");
                let gate_up_codes =
                    stored_codes(source, &projection(e, "gate_up", w, d, &gate_up_label));
                let down_codes = stored_codes(source, &projection(e, "down", d, w, &down_label));
                let packed =
                    shared_packs(config) && gate_up_codes.is_none() && down_codes.is_none();
                let slots = e + usize::from(packed);
                let widen = |name: &str, shape: &[usize]| r.bf16(name, shape);
                let mut experts_gate_up = load_projection(
                    gpu,
                    source,
                    &projection(slots, "gate_up", w, d, &gate_up_label),
                    gate_up_codes,
                    &widen,
                )?;
                let mut experts_down = load_projection(
                    gpu,
                    source,
                    &projection(slots, "down", d, w, &down_label),
                    down_codes,
                    &widen,
                )?;
                // Beside codes, the shared expert (BF16) joins the quantized grouped GEMM as
                // expert `e`, in the codes' fragment order.
                let beside_codes = shared_joins_codes(config)
                    && experts_gate_up.codes_take_shared(2 * w)
                    && experts_down.codes_take_shared(d);
                if beside_codes {
                    let rows = |proj: &str, n: usize, k: usize| -> Result<Vec<bf16>> {
                        let mut all = Vec::with_capacity(n * k);
                        let names = expert_names(e, proj);
                        for name in &names {
                            all.extend(widen(name, &[n / names.len(), k])?);
                        }
                        Ok(all)
                    };
                    let ordered = |n: usize, k: usize, rows: Vec<bf16>| {
                        upload(gpu, &ops::bf16_fragment_order(n, k, &rows))
                    };
                    experts_gate_up = experts_gate_up
                        .with_shared(ordered(2 * w, d, rows("gate_up", 2 * w, d)?)?, e);
                    experts_down = experts_down.with_shared(ordered(d, w, rows("down", d, w)?)?, e);
                }
                let shared = if packed || beside_codes {
                    SharedExpert::Packed
                } else if config.num_shared_experts > 0 {
                    SharedExpert::Separate(swiglu(schema::Mlp::Shared, dims.shared_width)?)
                } else {
                    SharedExpert::None
                };
                Mlp::Moe(Box::new(Moe::new(
                    gpu,
                    config,
                    router,
                    bias,
                    experts_gate_up,
                    experts_down,
                    shared,
                )))
            };
            layers.push(Layer {
                input_norm: upload(gpu, &r.bf16(&Tensor::InputNorm(i).name(), &[d])?)?,
                post_norm: upload(gpu, &r.bf16(&Tensor::PostAttentionNorm(i).name(), &[d])?)?,
                qkv: upload(gpu, &r.bf16(&Tensor::Qkv(i).name(), &[dims.qkv_rows, d])?)?,
                q_norm: upload(
                    gpu,
                    &r.bf16(&Tensor::QueryNorm(i).name(), &[dims.head_dim])?,
                )?,
                k_norm: upload(gpu, &r.bf16(&Tensor::KeyNorm(i).name(), &[dims.head_dim])?)?,
                dense: upload(
                    gpu,
                    &r.bf16(&Tensor::AttentionOut(i).name(), &[d, dims.attn_width])?,
                )?,
                mlp,
            });
        }
        let weights = Self {
            embed: upload(gpu, &r.bf16(&Tensor::Embedding.name(), &[dims.vocab, d])?)?,
            layers,
            final_norm: upload(gpu, &r.bf16(&Tensor::FinalNorm.name(), &[d])?)?,
            lm_head: upload(gpu, &r.bf16(&Tensor::LmHead.name(), &[dims.vocab, d])?)?,
        };
        // The load ends when the last copy has landed.
        gpu.synchronize().map_err(device_err)?;
        let parts: Vec<(String, u64)> = weights
            .bytes_by_encoding()
            .into_iter()
            .map(|(name, b)| match name {
                "other" => ("other tensors".to_string(), b as u64),
                _ => (format!("routed experts {name}"), b as u64),
            })
            .collect();
        tracing::info!(
            "{}",
            crate::load_report::line(
                &format!("loaded {} to {}", source.describe(), gpu.name()),
                &parts,
                started.elapsed()
            )
        );
        Ok(weights)
    }

    /// Random weights at the config's shapes, made on the device (benchmarks: no checkpoint file
    /// of 32 GB has to exist). Matrices are uniform in ±sqrt(3/fan_in) (unit-variance outputs),
    /// norms are 1, the embedding and lm_head uniform in ±1 and ±sqrt(3/D).
    ///
    /// With `experts` an integer `*_mma` encoding, the routed experts are random codes in that
    /// encoding (groups of 128, scales giving the same variance), the shared expert separate in
    /// BF16: the layout a quantized checkpoint loads into. Every MoE layer gets the same codes
    /// (made once on the host): the bytes a forward reads are what matters here.
    pub fn random(
        gpu: &Gpu,
        config: &Config,
        seed: u64,
        experts: Option<QuantEncoding>,
    ) -> Result<Self> {
        let dims = Dims::new(config);
        let d = dims.d;
        let mut random_codes = RandomCodes::new(config, experts, seed)?;
        let mut counter = seed;
        let mut rand = |len: usize, fan_in: usize| -> Result<DeviceBuffer<bf16>> {
            let buf = gpu.alloc::<bf16>(len).map_err(device_err)?;
            counter = counter.wrapping_add(0x9E37_79B9);
            let scale = if fan_in == 0 {
                1.0
            } else {
                (3.0 / fan_in as f32).sqrt()
            };
            ops::fill_random_bf16(gpu, buf.ptr(), len, counter, scale).map_err(device_err)?;
            Ok(buf)
        };
        let ones = |len: usize| upload(gpu, &vec![bf16::ONE; len]);
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let mlp = if i < config.first_k_dense_replace {
                let w = dims.dense_width;
                Mlp::Dense(DenseMlp {
                    gate_up: rand(2 * w * d, d)?,
                    down: rand(d * w, w)?,
                    width: w,
                })
            } else {
                let (e, w) = (dims.experts, dims.expert_width);
                // Router logits of unit scale spread the tokens over many experts; bias small.
                let router: Vec<bf16> = (0..e * d)
                    .map(|j| {
                        bf16::from_f32(
                            hash_uniform(seed ^ (i as u64) << 32, j) * (3.0 / d as f32).sqrt(),
                        )
                    })
                    .collect();
                let bias: Vec<f32> = (0..e)
                    .map(|j| 0.01 * hash_uniform(seed ^ 0xB1A5 ^ (i as u64) << 40, j))
                    .collect();
                let packed = shared_packs(config) && experts.is_none();
                // Beside random codes, a random BF16 shared expert joins their grouped GEMM (any
                // order of random values is random, so no reordering).
                let beside_codes = shared_joins_codes(config)
                    && random_codes.as_ref().is_some_and(|c| {
                        ops::codes_tiled(2 * w, c.group) && ops::codes_tiled(d, c.group)
                    });
                let shared = if packed || beside_codes {
                    SharedExpert::Packed
                } else if config.num_shared_experts > 0 {
                    let sw = dims.shared_width;
                    SharedExpert::Separate(DenseMlp {
                        gate_up: rand(2 * sw * d, d)?,
                        down: rand(d * sw, sw)?,
                        width: sw,
                    })
                } else {
                    SharedExpert::None
                };
                let slots = e + usize::from(packed);
                let (gate_up, down) = match random_codes.as_mut() {
                    Some(codes) if beside_codes => (
                        codes.matrix(gpu, 0)?.with_shared(rand(2 * w * d, d)?, e),
                        codes.matrix(gpu, 1)?.with_shared(rand(d * w, w)?, e),
                    ),
                    Some(codes) => (codes.matrix(gpu, 0)?, codes.matrix(gpu, 1)?),
                    None => (
                        ExpertMatrix::Bf16(rand(slots * 2 * w * d, d)?),
                        ExpertMatrix::Bf16(rand(slots * d * w, w)?),
                    ),
                };
                Mlp::Moe(Box::new(Moe::new(
                    gpu,
                    config,
                    RouterWeights::Bf16(upload(gpu, &router)?),
                    upload(gpu, &bias)?,
                    gate_up,
                    down,
                    shared,
                )))
            };
            layers.push(Layer {
                input_norm: ones(d)?,
                post_norm: ones(d)?,
                qkv: rand(dims.qkv_rows * d, d)?,
                q_norm: ones(dims.head_dim)?,
                k_norm: ones(dims.head_dim)?,
                dense: rand(d * dims.attn_width, dims.attn_width)?,
                mlp,
            });
        }
        let w = Self {
            embed: rand(dims.vocab * d, 0)?,
            layers,
            final_norm: ones(d)?,
            lm_head: rand(dims.vocab * d, d)?,
        };
        gpu.synchronize().map_err(device_err)?;
        Ok(w)
    }

    /// Bytes of the routed experts in device memory per encoding (`bf16`, `i4_mma`, ...), and
    /// of everything else (BF16) under `other`: what the load log reports.
    pub fn bytes_by_encoding(&self) -> Vec<(&'static str, usize)> {
        let mut out: Vec<(&'static str, usize)> = vec![];
        let mut add = |name: &'static str, bytes: usize| match out.iter_mut().find(|e| e.0 == name)
        {
            Some(e) => e.1 += bytes,
            None => out.push((name, bytes)),
        };
        let mut experts = 0;
        for l in &self.layers {
            if let Mlp::Moe(m) = &l.mlp {
                for x in [&m.experts_gate_up, &m.experts_down] {
                    // A shared expert beside codes is BF16: counted with the other tensors.
                    let routed = x.bytes() - x.shared_bytes();
                    add(x.encoding_name(), routed);
                    experts += routed;
                }
            }
        }
        add("other", self.bytes() - experts);
        out
    }

    /// Bytes of all weights in device memory.
    pub fn bytes(&self) -> usize {
        let mlp = |m: &DenseMlp| m.gate_up.bytes() + m.down.bytes();
        self.embed.bytes()
            + self.final_norm.bytes()
            + self.lm_head.bytes()
            + self
                .layers
                .iter()
                .map(|l| {
                    l.input_norm.bytes()
                        + l.post_norm.bytes()
                        + l.qkv.bytes()
                        + l.q_norm.bytes()
                        + l.k_norm.bytes()
                        + l.dense.bytes()
                        + match &l.mlp {
                            Mlp::Dense(m) => mlp(m),
                            Mlp::Moe(m) => {
                                m.router.bytes()
                                    + m.bias.bytes()
                                    + m.experts_gate_up.bytes()
                                    + m.experts_down.bytes()
                                    + match &m.shared {
                                        SharedExpert::Separate(s) => mlp(s),
                                        _ => 0,
                                    }
                            }
                        }
                })
                .sum::<usize>()
    }
}

/// Random codes and scales for the two expert projections of a layer (gate/up `[E, 2 I, D]`,
/// down `[E, D, I]`) in the device's order (`*_mma`, or NVFP4 and FP8 as `load_codes` repacks
/// them), made once on the host and uploaded for every layer.
struct RandomCodes {
    encoding: QuantEncoding,
    /// Columns per scale: 128 for integer and FP8 codes, NVFP4's 16.
    group: usize,
    /// Per projection: codes, scales and rows.
    host: [(Vec<u8>, Vec<u8>, usize); 2],
}

impl RandomCodes {
    fn new(config: &Config, experts: Option<QuantEncoding>, seed: u64) -> Result<Option<Self>> {
        let Some(encoding) = experts else {
            return Ok(None);
        };
        // The standard deviation of a uniformly random code: about 74 (INT8), 4.6 (INT4), 2.9
        // (E2M1, whose sixteen values are ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}) or 100 (the 254 E4M3
        // values that are numbers).
        let (spread, group) = match encoding {
            QuantEncoding::I8Mma => (74.0, 128),
            QuantEncoding::I4Mma => (4.6, 128),
            QuantEncoding::Nvfp4 => (2.9, 16),
            QuantEncoding::Fp8Block => (100.0, 128),
            other => {
                return Err(ModelError::Weights(format!(
                    "random experts in {other}: only i8_mma, i4_mma, nvfp4 and fp8_e4m3_b128 \
                     have GPU kernels"
                )))
            }
        };
        let (e, w, d) = (
            config.num_experts,
            config.moe_intermediate_size,
            config.hidden_size,
        );
        let mut state = seed | 1;
        let mut make = |rows: usize, cols: usize| -> Result<(Vec<u8>, Vec<u8>, usize)> {
            if !(cols.is_multiple_of(128) && rows.is_multiple_of(16)) {
                return Err(ModelError::Weights(format!(
                    "random {encoding} experts need rows % 16 == 0 and columns % 128 == 0, got {rows} x {cols}"
                )));
            }
            let bytes = encoding.codes_bytes(rows, cols).expect("small shape");
            let mut codes = vec![0u8; bytes];
            for chunk in codes.chunks_mut(8) {
                // xorshift64: fast enough for gigabytes; any byte is a valid code, in any order
                // (so 4-bit codes need no word order, ops::codes4_word_order).
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let v = state.to_le_bytes();
                chunk.copy_from_slice(&v[..chunk.len()]);
            }
            if encoding == QuantEncoding::Fp8Block {
                // Every byte but E4M3's two NaNs is a number: those become ±448.
                for c in codes.iter_mut().filter(|c| **c & 0x7F == 0x7F) {
                    *c -= 1;
                }
            }
            // Scales that give weights of standard deviation 1/sqrt(fan_in) (NVFP4's block
            // scales are BF16 on the device).
            let scale = 1.0 / (spread * (cols as f32).sqrt());
            // (FP8: copies of the F32 block scale filling the scales' bytes the repacked
            // layout has, `ops::repacked_bytes`.)
            let scales = match encoding {
                QuantEncoding::Nvfp4 => half::bf16::from_f32(scale)
                    .to_le_bytes()
                    .repeat(rows * cols / group),
                QuantEncoding::Fp8Block => {
                    let (_, bytes) = ops::repacked_bytes(encoding, rows, cols)
                        .expect("rows % 16 == 0, columns % 128 == 0");
                    scale.to_le_bytes().repeat(bytes / 4)
                }
                _ => f16::from_f32(scale)
                    .to_le_bytes()
                    .repeat(rows * cols / group),
            };
            Ok((codes, scales, rows))
        };
        let gate_up = make(e * 2 * w, d)?;
        let down = make(e * d, w)?;
        Ok(Some(Self {
            encoding,
            group,
            host: [gate_up, down],
        }))
    }

    /// Projection 0 (gate/up) or 1 (down) of one layer, uploaded.
    fn matrix(&mut self, gpu: &Gpu, projection: usize) -> Result<ExpertMatrix> {
        let (codes, scales, rows) = &self.host[projection];
        // NVFP4's global scales: one per 8-row band, all 1 here.
        let band_scale = if self.encoding == QuantEncoding::Nvfp4 {
            Some(upload(gpu, &vec![1f32; rows / 8])?)
        } else {
            None
        };
        Ok(ExpertMatrix::Codes {
            encoding: self.encoding,
            group: self.group,
            codes: upload(gpu, codes)?,
            scales: upload(gpu, scales)?,
            band_scale,
            shared: None,
        })
    }
}

/// Uniform in [-1, 1) from a SplitMix64 hash of (seed, index).
fn hash_uniform(seed: u64, i: usize) -> f32 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15u64.wrapping_mul(i as u64 + 1));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 40) as f32 / 8_388_608.0 - 1.0
}
