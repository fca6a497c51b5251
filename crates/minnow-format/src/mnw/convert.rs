//! Conversion of a checkpoint (safetensors directory or floating-point `.mnw`) into a new
//! `.mnw`, quantizing the routed experts (or what `--tensor-rules` names).
//!
//! Every tensor's encoding and every region's offset are decided first ([`plan`]); then the
//! workers of `planned::write_planned` take tensors in turn and write each into its own regions.
//! A tensor's bytes depend only on the tensor, so the output is identical for any number of
//! workers. Memory stays bounded: a worker holds one band of rows of one matrix at a time (at
//! most [`BAND_BYTES`] of F32), and copies are streamed in chunks from the memory-mapped source.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::AtomicBool;

use minnow_runtime::dtype::widen_into;
use minnow_runtime::quant::{
    global_scale_for, quantize_rows, Encoding, QuantEncoding, DEFAULT_INT_GROUP, INT_GROUP_SIZES,
    ROW_BAND,
};
use minnow_runtime::DType;
use serde::Deserialize;

use super::planned::{write_planned, Digests, ModelText, RegionStream, TensorOutput, Workers};
pub use super::planned::{Plan, PlannedTensor, Stage, Summary, Timings};
use super::writer::RegionPlanner;
use crate::error::{FormatError, Result};
use crate::source::{TensorRef, TensorSource};

/// F32 bytes of source rows a worker widens at once.
pub const BAND_BYTES: usize = 16 << 20;
/// Bytes copied per step when a tensor keeps its encoding.
const COPY_CHUNK: usize = 8 << 20;

/// What `--experts` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertChoice {
    Original,
    Int8,
    Int4,
    Nvfp4,
    /// Ours: `fp8_e4m3_b128`.
    Fp8,
}

/// `--quant-layout`: the tensor-core fragment order (default) or row-major.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantLayout {
    Mma,
    Row,
}

/// One entry of a `--tensor-rules` file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorRule {
    pub prefix: String,
    /// An encoding name; `null` keeps the source's.
    pub encoding: Option<String>,
    #[serde(default)]
    pub group_size: Option<usize>,
}

impl TensorRule {
    /// Parses a rules file: a JSON array of rules.
    pub fn parse_file(path: &Path) -> Result<Vec<TensorRule>> {
        let text = std::fs::read_to_string(path).map_err(|source| FormatError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|e| {
            FormatError::invalid(
                path,
                format!(
                    "not a JSON array of {{\"prefix\", \"encoding\", \"group_size\"}} rules: {e}"
                ),
            )
        })
    }
}

#[derive(Clone, Debug)]
pub struct ConvertOptions {
    pub experts: ExpertChoice,
    pub layout: QuantLayout,
    /// Integer group size; `None` is 128 (or, for a matrix whose K 128 does not divide, the
    /// largest of 64, 32, 16 that does).
    pub group_size: Option<usize>,
    pub workers: usize,
    pub rules: Vec<TensorRule>,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        Self {
            experts: ExpertChoice::Original,
            layout: QuantLayout::Mma,
            group_size: None,
            workers: 1,
            rules: Vec::new(),
        }
    }
}

impl ConvertOptions {
    /// The encoding `--experts` gives routed experts, if it quantizes.
    fn expert_encoding(&self) -> std::result::Result<Option<QuantEncoding>, String> {
        Ok(match (self.experts, self.layout) {
            (ExpertChoice::Original, _) => None,
            (ExpertChoice::Int8, QuantLayout::Mma) => Some(QuantEncoding::I8Mma),
            (ExpertChoice::Int8, QuantLayout::Row) => Some(QuantEncoding::I8Sym),
            (ExpertChoice::Int4, QuantLayout::Mma) => Some(QuantEncoding::I4Mma),
            (ExpertChoice::Int4, QuantLayout::Row) => Some(QuantEncoding::I4Sym),
            (ExpertChoice::Nvfp4, QuantLayout::Mma) => Some(QuantEncoding::Nvfp4),
            (ExpertChoice::Fp8, QuantLayout::Row) => Some(QuantEncoding::Fp8Block),
            (ExpertChoice::Nvfp4, QuantLayout::Row) => {
                return Err(
                    "nvfp4 has only the fragment (mma) layout; drop --quant-layout row".into(),
                )
            }
            (ExpertChoice::Fp8, QuantLayout::Mma) => Some(QuantEncoding::Fp8Block),
        })
    }
}

/// Names the routed-expert family of a tensor: `Some(family)` for a routed expert's projection
/// matrix, where every expert of one layer and projection has the same `family` (they share one
/// encoding, and notes name them by it), `None` for every other tensor.
///
/// The model's tensor schema decides which tensors those are
/// (`minnow_model::schema::routed_expert_family`, by the tensors' roles). This crate sits below
/// the model crate and knows no tensor names, so the caller passes the schema's answer in.
pub type ExpertFamilies<'a> = &'a (dyn Fn(&str) -> Option<String> + Sync);

/// The input of a conversion.
pub struct ConvertInput<'a> {
    pub source: &'a dyn TensorSource,
    /// Which tensors are routed experts (what `--experts` re-encodes), and their families.
    pub expert_families: ExpertFamilies<'a>,
    pub assets: BTreeMap<String, String>,
    pub model_id: String,
}

/// The default integer group size for a K dimension.
fn default_group(k: usize) -> Option<usize> {
    INT_GROUP_SIZES
        .iter()
        .rev()
        .copied()
        .find(|g| *g <= DEFAULT_INT_GROUP && k.is_multiple_of(*g))
}

/// Decides every tensor's encoding and region; `expert_families` says which tensors are routed
/// experts (see [`ExpertFamilies`]).
pub fn plan(
    source: &dyn TensorSource,
    expert_families: ExpertFamilies<'_>,
    options: &ConvertOptions,
) -> Result<Plan> {
    let bad = |m: String| FormatError::invalid(source.describe(), m);
    if let Some(g) = options.group_size {
        if !INT_GROUP_SIZES.contains(&g) {
            return Err(bad(format!(
                "--group-size must be 16, 32, 64 or 128, not {g}"
            )));
        }
    }
    let expert_encoding = options.expert_encoding().map_err(bad)?;
    let mut rule_used = vec![false; options.rules.len()];
    let mut notes = BTreeMap::<String, String>::new();
    let mut planner = RegionPlanner::default();
    let mut tensors = Vec::new();
    for name in source.names() {
        let t = source.tensor(name).expect("listed tensor");
        let src = t.encoding().ok_or_else(|| {
            bad(format!(
                "tensor '{name}' has element type {}, which a .mnw file cannot hold",
                t.dtype_name
            ))
        })?;
        let k = t.shape.last().copied().unwrap_or(0);
        let rows = if t.shape.len() == 2 { t.shape[0] } else { 0 };
        let source_group = t.quant.map_or(0, |q| q.group_size);
        // The default: routed experts get --experts when their shape allows it.
        let mut target = (src, source_group);
        let family = expert_families(name).filter(|_| t.shape.len() == 2);
        if let (Some(q), Some(family)) = (expert_encoding, family) {
            if let Encoding::Quant(stored) = src {
                // Already quantized: kept only when it already is what was asked for.
                // Re-encoding is refused rather than done from the stored values: those
                // carry the first rounding, so the result would be worse than the same
                // encoding made from the source checkpoint and would not match its bytes.
                let group = q.manifest_group(options.group_size.unwrap_or(source_group));
                if (stored, source_group) != (q, group) {
                    return Err(bad(format!(
                        "tensor '{name}' is already quantized ({stored}, group size \
                         {source_group}); re-encoding it as {q} (group size {group}) would round \
                         twice. Convert from the floating-point checkpoint instead, or use \
                         --experts original to copy the quantized tensors as they are"
                    )));
                }
            }
            if matches!(src, Encoding::Float(_)) {
                let group = match options.group_size {
                    Some(g) => Some(g),
                    None => default_group(k),
                };
                let group = q.manifest_group(group.unwrap_or(DEFAULT_INT_GROUP));
                match q.check_shape(rows, k, group) {
                    Ok(()) => target = (Encoding::Quant(q), group),
                    // An explicit --group-size that K does not allow is the user's error ...
                    Err(why)
                        if options.group_size.is_some_and(|g| !k.is_multiple_of(g))
                            && !matches!(q, QuantEncoding::Nvfp4 | QuantEncoding::Fp8Block) =>
                    {
                        return Err(bad(format!("tensor '{name}': {why}")))
                    }
                    // ... a shape the encoding cannot hold keeps the projection as it is (all
                    // experts of it alike), said in a note.
                    Err(why) => {
                        notes.insert(family.clone(), format!("{family} kept in {src}: {why}"));
                    }
                }
            }
        }
        // Then the rules, later ones winning.
        for (i, rule) in options.rules.iter().enumerate() {
            if !name.starts_with(&rule.prefix) {
                continue;
            }
            rule_used[i] = true;
            let Some(enc_name) = &rule.encoding else {
                target = (src, source_group);
                continue;
            };
            let enc = Encoding::parse(enc_name)
                .ok_or_else(|| bad(format!("tensor rule {i}: unknown encoding '{enc_name}'")))?;
            target = match enc {
                Encoding::Float(_) => (enc, 0),
                Encoding::Quant(q) => {
                    if t.shape.len() != 2 {
                        return Err(bad(format!(
                            "tensor rule {i}: '{name}' has shape {:?}; only matrices can be {q}",
                            t.shape
                        )));
                    }
                    let group = rule
                        .group_size
                        .or(options.group_size)
                        .or_else(|| default_group(k))
                        .unwrap_or(DEFAULT_INT_GROUP);
                    let group = q.manifest_group(group);
                    q.check_shape(rows, k, group)
                        .map_err(|why| bad(format!("tensor rule {i}: '{name}': {why}")))?;
                    (enc, group)
                }
            };
        }
        let (target, group_size) = target;
        if let (Encoding::Quant(_), true) = (src, src != target) {
            return Err(bad(format!(
                "tensor '{name}' is stored as {src}; only floating-point tensors can be re-encoded (to {target})"
            )));
        }
        let numel = t.numel() as u64;
        let (data_bytes, scale_bytes) = match target {
            Encoding::Float(d) => (numel * d.size() as u64, None),
            Encoding::Quant(q) => (
                q.codes_bytes(rows, k).expect("checked shape") as u64,
                Some(q.scales_bytes(rows, k, group_size).expect("checked shape") as u64),
            ),
        };
        let data_offset = planner.place(data_bytes);
        let scales = scale_bytes.map(|b| (planner.place(b), b));
        tensors.push(PlannedTensor {
            name: name.to_string(),
            shape: t.shape.to_vec(),
            source: src,
            target,
            group_size,
            data_offset,
            data_bytes,
            scales,
        });
    }
    if let Some(i) = rule_used.iter().position(|used| !used) {
        return Err(bad(format!(
            "tensor rule {i} (prefix '{}') matches no tensor",
            options.rules[i].prefix
        )));
    }
    // All experts of one layer and projection share one encoding and group size.
    let mut families: BTreeMap<String, (Encoding, usize, &str)> = BTreeMap::new();
    for t in &tensors {
        if let Some(family) = expert_families(&t.name) {
            let seen = families
                .entry(family.clone())
                .or_insert((t.target, t.group_size, &t.name));
            if (seen.0, seen.1) != (t.target, t.group_size) {
                return Err(bad(format!(
                    "'{}' would be {} (group {}) but '{}' {} (group {}): all experts of one layer \
                     and projection must share an encoding",
                    t.name, t.target, t.group_size, seen.2, seen.0, seen.1
                )));
            }
        }
    }
    Ok(Plan {
        data_end: planner.end(),
        tensors,
        notes: notes.into_values().collect(),
    })
}

/// Converts `input` into a new file at `out`. `cancel` stops the workers at their next step
/// (the temporary file is removed); `progress(bytes_done, bytes_total)` reports written bytes.
pub fn convert(
    input: &ConvertInput<'_>,
    out: &Path,
    options: &ConvertOptions,
    cancel: &AtomicBool,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<Summary> {
    convert_in_stages(input, out, options, cancel, &|stage, done, total| {
        if stage == Stage::Writing {
            progress(done, total)
        }
    })
}

/// [`convert`], reporting both passes: `progress(stage, done, total)`. Calls come from several
/// worker threads, so `done` may arrive slightly out of order.
pub fn convert_in_stages(
    input: &ConvertInput<'_>,
    out: &Path,
    options: &ConvertOptions,
    cancel: &AtomicBool,
    progress: &(dyn Fn(Stage, u64, u64) + Sync),
) -> Result<Summary> {
    let plan = plan(input.source, input.expert_families, options)?;
    write_planned(
        &plan,
        out,
        &ModelText {
            model_id: &input.model_id,
            assets: &input.assets,
        },
        &Workers {
            count: options.workers,
            cancel,
            progress,
        },
        &|output, t| {
            let tensor = input.source.tensor(&t.name).expect("planned tensor");
            write_tensor(output, t, &tensor)
        },
        // Read once: its mapped pages need not stay in this process.
        &|t| input.source.release(&t.name),
    )
}

/// Writes one tensor's regions and returns their digests.
fn write_tensor(
    output: &TensorOutput<'_>,
    t: &PlannedTensor,
    src: &TensorRef<'_>,
) -> Result<Digests> {
    match (t.source, t.target) {
        (a, b) if a == b => {
            let data = copy_region(output.data(t), src.data)?;
            let scales = match (output.scales(t), src.quant) {
                (Some(region), Some(q)) => Some(copy_region(region, q.scales)?),
                _ => None,
            };
            Ok(Digests {
                data,
                scales,
                global_scale: src
                    .quant
                    .filter(|q| q.encoding == QuantEncoding::Nvfp4)
                    .map(|q| q.global_scale),
            })
        }
        (Encoding::Float(from), Encoding::Float(to)) => recast(output, t, src.data, from, to),
        (Encoding::Float(from), Encoding::Quant(q)) => {
            quantize_tensor(output, t, src.data, from, q)
        }
        (Encoding::Quant(_), _) => unreachable!("plan refuses re-encoding quantized tensors"),
    }
}

fn copy_region(mut region: RegionStream<'_>, bytes: &[u8]) -> Result<String> {
    for chunk in bytes.chunks(COPY_CHUNK) {
        region.write(chunk)?;
    }
    region.finish()
}

/// Rounds F32 to a floating-point element type (nearest even).
fn narrow(values: &[f32], to: DType, out: &mut Vec<u8>) {
    out.clear();
    for &v in values {
        match to {
            DType::BF16 => out.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes()),
            DType::F16 => out.extend_from_slice(&half::f16::from_f32(v).to_le_bytes()),
            DType::F32 => out.extend_from_slice(&v.to_le_bytes()),
        }
    }
}

fn recast(
    output: &TensorOutput<'_>,
    t: &PlannedTensor,
    data: &[u8],
    from: DType,
    to: DType,
) -> Result<Digests> {
    let per_chunk = COPY_CHUNK / 4;
    let mut wide = vec![0.0f32; per_chunk];
    let mut narrow_buf = Vec::new();
    let mut region = output.data(t);
    for chunk in data.chunks(per_chunk * from.size()) {
        let n = chunk.len() / from.size();
        widen_into(from, chunk, &mut wide[..n]);
        narrow(&wide[..n], to, &mut narrow_buf);
        region.write(&narrow_buf)?;
    }
    Ok(Digests {
        data: region.finish()?,
        scales: None,
        global_scale: None,
    })
}

fn quantize_tensor(
    output: &TensorOutput<'_>,
    t: &PlannedTensor,
    data: &[u8],
    from: DType,
    q: QuantEncoding,
) -> Result<Digests> {
    let (rows, cols) = (t.shape[0], t.shape[1]);
    let row_bytes = cols * from.size();
    // Bands of whole 128-row units, each band's output contiguous in both regions.
    let band = (BAND_BYTES / (cols.max(1) * 4) / ROW_BAND).max(1) * ROW_BAND;
    let mut wide = vec![0.0f32; band.min(rows) * cols];
    let one_band = rows <= band;
    let global = if q == QuantEncoding::Nvfp4 {
        // A first pass for the matrix's largest magnitude (NVFP4's global scale). A matrix of
        // one band (every expert of the released models) stays widened for the pass below.
        let mut max_abs = 0.0f32;
        for chunk in data.chunks(band * row_bytes) {
            let n = chunk.len() / from.size();
            widen_into(from, chunk, &mut wide[..n]);
            max_abs = wide[..n].iter().fold(max_abs, |m, v| m.max(v.abs()));
        }
        Some(global_scale_for(q, max_abs))
    } else {
        None
    };
    let widened = one_band && global.is_some();
    let mut codes = output.data(t);
    let mut scales = output.scales(t).expect("quantized tensors have scales");
    for (b, chunk) in data.chunks(band * row_bytes).enumerate() {
        let band_rows = chunk.len() / row_bytes;
        let n = band_rows * cols;
        if !widened {
            widen_into(from, chunk, &mut wide[..n]);
        }
        let qz =
            quantize_rows(q, band_rows, cols, t.group_size, &wide[..n], global).map_err(|e| {
                FormatError::invalid(
                    &t.name,
                    format!("cannot quantize (rows from {}): {e}", b * band),
                )
            })?;
        codes.write(&qz.codes)?;
        scales.write(&qz.scales)?;
    }
    Ok(Digests {
        data: codes.finish()?,
        scales: Some(scales.finish()?),
        global_scale: global,
    })
}
