//! Writing a planned `.mnw` file on several threads: every tensor's encoding and regions are
//! decided first (a [`Plan`]); then workers take one tensor at a time, largest first, and fill
//! its regions through a [`TensorOutput`], which hashes each region as it streams. Where the
//! bytes come from is the caller's: `convert` reads a source checkpoint, `cargo xtask
//! make-checkpoint` generates random weights. A tensor's bytes depend only on the tensor, so
//! the file is the same for any number of workers and any order they finish in.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use minnow_runtime::quant::Encoding;

use super::layout::ARCHITECTURE;
use super::manifest::{AssetText, Manifest, Region, TensorRecord, VERSION};
use super::writer::OutputFile;
use crate::error::{FormatError, Result};

/// One tensor of the output.
#[derive(Clone, Debug)]
pub struct PlannedTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub source: Encoding,
    pub target: Encoding,
    /// Manifest group size (0 for floating point).
    pub group_size: usize,
    pub data_offset: u64,
    pub data_bytes: u64,
    pub scales: Option<(u64, u64)>,
}

impl PlannedTensor {
    /// Bytes of its regions.
    pub fn region_bytes(&self) -> u64 {
        self.data_bytes + self.scales.map_or(0, |s| s.1)
    }

    /// The end of its last region.
    fn region_end(&self) -> u64 {
        self.scales
            .map_or(self.data_offset + self.data_bytes, |(o, b)| o + b)
    }
}

/// The decided output: tensors with their regions, plus notes for the user.
#[derive(Debug)]
pub struct Plan {
    pub tensors: Vec<PlannedTensor>,
    pub data_end: u64,
    /// Sentences about choices made (a projection kept in its source type, ...).
    pub notes: Vec<String>,
}

impl Plan {
    /// Bytes of every region.
    pub fn region_bytes(&self) -> u64 {
        self.tensors.iter().map(PlannedTensor::region_bytes).sum()
    }
}

/// What the file says besides its tensors.
pub struct ModelText<'a> {
    /// Where the weights came from (the manifest's `model_id`).
    pub model_id: &'a str,
    /// The text files by file name (config, tokenizer, chat template, ...).
    pub assets: &'a BTreeMap<String, String>,
}

/// The two passes of writing a file, for progress reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Regions being encoded and written: bytes written of the regions' total.
    Writing,
    /// The finished temporary file being re-read and hashed (as `validate` does): bytes read of
    /// the file's data part.
    Verifying,
}

/// How the writing runs.
pub struct Workers<'a> {
    /// Threads filling tensors (clamped to 1..=64).
    pub count: usize,
    /// Stops the workers at their next chunk (the temporary file is removed).
    pub cancel: &'a AtomicBool,
    /// `progress(stage, done, total)`; calls come from several threads, so `done` may arrive
    /// slightly out of order.
    pub progress: &'a (dyn Fn(Stage, u64, u64) + Sync),
}

/// What a finished file reports.
#[derive(Debug)]
pub struct Summary {
    pub file_bytes: u64,
    pub notes: Vec<String>,
    /// Tensors and bytes per target encoding.
    pub per_encoding: BTreeMap<String, (usize, u64)>,
    pub timings: Timings,
}

/// Where the wall time of writing a file went.
#[derive(Clone, Copy, Debug)]
pub struct Timings {
    /// Encoding the tensors and writing them to the file (the system writes them to the disk
    /// meanwhile).
    pub writing: Duration,
    /// Waiting for what the disk had not yet received.
    pub sync: Duration,
    /// Re-reading and checking the file (as `validate` does).
    pub verifying: Duration,
}

/// The digests of one filled tensor's regions, and NVFP4's global scale.
pub struct Digests {
    pub data: String,
    pub scales: Option<String>,
    pub global_scale: Option<f32>,
}

/// Where a worker writes one tensor: its regions as streams.
pub struct TensorOutput<'a> {
    output: &'a OutputFile,
    step: &'a (dyn Fn(usize) + Sync),
    stop: &'a (dyn Fn() -> bool + Sync),
}

impl<'a> TensorOutput<'a> {
    /// The tensor's data region, to be written from its start to its end.
    pub fn data(&self, t: &PlannedTensor) -> RegionStream<'a> {
        self.region(&t.name, "data", t.data_offset, t.data_bytes)
    }

    /// The tensor's scales region (a quantized tensor's), to be written from start to end.
    pub fn scales(&self, t: &PlannedTensor) -> Option<RegionStream<'a>> {
        t.scales
            .map(|(offset, bytes)| self.region(&t.name, "scales", offset, bytes))
    }

    fn region(&self, name: &str, what: &'static str, offset: u64, bytes: u64) -> RegionStream<'a> {
        RegionStream {
            output: self.output,
            step: self.step,
            stop: self.stop,
            name: name.to_string(),
            what,
            next: offset,
            end: offset + bytes,
            hasher: blake3::Hasher::new(),
        }
    }
}

/// One region written front to back in chunks, hashed as it goes.
pub struct RegionStream<'a> {
    output: &'a OutputFile,
    step: &'a (dyn Fn(usize) + Sync),
    stop: &'a (dyn Fn() -> bool + Sync),
    name: String,
    what: &'static str,
    next: u64,
    end: u64,
    hasher: blake3::Hasher,
}

impl RegionStream<'_> {
    /// Appends `bytes` to the region. Fails when the writing was stopped (an error elsewhere,
    /// a cancel) or the bytes would pass the region's end.
    pub fn write(&mut self, bytes: &[u8]) -> Result<()> {
        if (self.stop)() {
            return Err(interrupted(&self.name));
        }
        if self.next + bytes.len() as u64 > self.end {
            return Err(FormatError::invalid(
                &self.name,
                format!(
                    "{} bytes more than the planned {} region holds",
                    self.next + bytes.len() as u64 - self.end,
                    self.what
                ),
            ));
        }
        self.output.write_at(bytes, self.next)?;
        self.hasher.update(bytes);
        self.next += bytes.len() as u64;
        (self.step)(bytes.len());
        Ok(())
    }

    /// The region's BLAKE3 digest (lowercase hex), once it has been filled exactly.
    pub fn finish(self) -> Result<String> {
        if self.next != self.end {
            return Err(FormatError::invalid(
                &self.name,
                format!(
                    "the {} region was left {} bytes short",
                    self.what,
                    self.end - self.next
                ),
            ));
        }
        Ok(self.hasher.finalize().to_hex().to_string())
    }
}

pub(crate) fn interrupted(name: &str) -> FormatError {
    FormatError::invalid(name, "interrupted")
}

/// Writes the file `out` of `plan`: `fill` writes one tensor's regions (called on the worker
/// threads, each tensor once, largest first so that no large tensor is left for the end) and
/// `done(tensor)` follows it (a source can drop what it read). Then the manifest and header are
/// written, the file synced, verified and published (see [`OutputFile::finish`]).
pub fn write_planned(
    plan: &Plan,
    out: &Path,
    text: &ModelText<'_>,
    workers: &Workers<'_>,
    fill: &(dyn Fn(&TensorOutput<'_>, &PlannedTensor) -> Result<Digests> + Sync),
    done: &(dyn Fn(&PlannedTensor) + Sync),
) -> Result<Summary> {
    let output = OutputFile::create(out, plan.data_end)?;
    let started = Instant::now();
    let total = plan.region_bytes();
    let mut order: Vec<usize> = (0..plan.tensors.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(plan.tensors[i].region_bytes()));
    let written = AtomicU64::new(0);
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let results: Mutex<Vec<Option<Digests>>> =
        Mutex::new((0..plan.tensors.len()).map(|_| None).collect());
    let first_error: Mutex<Option<FormatError>> = Mutex::new(None);
    let step = |bytes: usize| {
        let d = written.fetch_add(bytes as u64, Ordering::Relaxed) + bytes as u64;
        (workers.progress)(Stage::Writing, d, total);
    };
    let stop = || workers.cancel.load(Ordering::Relaxed) || failed.load(Ordering::Relaxed);
    let regions = TensorOutput {
        output: &output,
        step: &step,
        stop: &stop,
    };
    std::thread::scope(|s| {
        for _ in 0..workers.count.clamp(1, 64) {
            s.spawn(|| loop {
                if stop() {
                    return;
                }
                let Some(&i) = order.get(next.fetch_add(1, Ordering::Relaxed)) else {
                    return;
                };
                let t = &plan.tensors[i];
                let filled = fill(&regions, t);
                done(t);
                // Its regions are final: the disk can take them now.
                output.start_writeback(t.data_offset, t.region_end() - t.data_offset);
                match filled {
                    Ok(d) => results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(d),
                    Err(e) => {
                        failed.store(true, Ordering::Relaxed);
                        first_error
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .get_or_insert(e);
                        return;
                    }
                }
            });
        }
    });
    let writing = started.elapsed();
    if let Some(e) = first_error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e);
    }
    if workers.cancel.load(Ordering::Relaxed) {
        return Err(FormatError::invalid(
            out,
            "interrupted; no file was written",
        ));
    }
    let results = results.into_inner().unwrap_or_else(|e| e.into_inner());
    let mut per_encoding: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    let mut records = BTreeMap::new();
    for (t, d) in plan.tensors.iter().zip(results) {
        let d = d.expect("every tensor filled when no worker failed");
        let entry = per_encoding.entry(t.target.name().to_string()).or_default();
        entry.0 += 1;
        entry.1 += t.region_bytes();
        let record = TensorRecord {
            shape: t.shape.iter().map(|&n| n as u64).collect(),
            encoding: t.target.name().to_string(),
            data: Region {
                offset: t.data_offset,
                bytes: t.data_bytes,
                blake3: d.data,
            },
            scales: t
                .scales
                .zip(d.scales)
                .map(|((offset, bytes), blake3)| Region {
                    offset,
                    bytes,
                    blake3,
                }),
            group_size: t.group_size as u64,
            global_scale: d.global_scale,
        };
        records.insert(t.name.clone(), record);
    }
    let manifest = Manifest {
        version: VERSION,
        architecture: ARCHITECTURE.to_string(),
        model_id: text.model_id.to_string(),
        assets: text
            .assets
            .iter()
            .map(|(k, v)| (k.clone(), AssetText(v.clone())))
            .collect(),
        tensors: records,
    };
    let finished = output.finish(&manifest, plan.data_end, &|done, total| {
        (workers.progress)(Stage::Verifying, done, total)
    })?;
    Ok(Summary {
        file_bytes: finished.file_len,
        notes: plan.notes.clone(),
        per_encoding,
        timings: Timings {
            writing,
            sync: finished.sync,
            verifying: finished.verify,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mnw::validate::validate_file;
    use crate::mnw::writer::RegionPlanner;
    use minnow_runtime::DType;

    fn one_tensor_plan() -> Plan {
        let mut planner = RegionPlanner::default();
        let bf16 = Encoding::Float(DType::BF16);
        let tensor = PlannedTensor {
            name: "t".into(),
            shape: vec![2, 2],
            source: bf16,
            target: bf16,
            group_size: 0,
            data_offset: planner.place(8),
            data_bytes: 8,
            scales: None,
        };
        Plan {
            tensors: vec![tensor],
            data_end: planner.end(),
            notes: Vec::new(),
        }
    }

    fn write_with(out: &Path, bytes: &[u8]) -> Result<Summary> {
        let assets = crate::mnw::layout::REQUIRED_ASSETS
            .iter()
            .map(|name| (name.to_string(), "{}".to_string()))
            .collect();
        let cancel = AtomicBool::new(false);
        write_planned(
            &one_tensor_plan(),
            out,
            &ModelText {
                model_id: "test",
                assets: &assets,
            },
            &Workers {
                count: 2,
                cancel: &cancel,
                progress: &|_, _, _| {},
            },
            &|output, t| {
                let mut data = output.data(t);
                for chunk in bytes.chunks(3) {
                    data.write(chunk)?;
                }
                Ok(Digests {
                    data: data.finish()?,
                    scales: None,
                    global_scale: None,
                })
            },
            &|_| {},
        )
    }

    /// A filler that writes less or more than the planned region fails, naming the tensor, and
    /// leaves no file; one that fills it exactly gives a file whose digests verify.
    #[test]
    fn regions_must_be_filled_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("x.mnw");
        let short = write_with(&out, &[1; 7]).unwrap_err().to_string();
        assert!(
            short.contains("t: the data region was left 1 bytes short"),
            "{short}"
        );
        let long = write_with(&out, &[1; 9]).unwrap_err().to_string();
        assert!(long.contains("more than the planned data region"), "{long}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        let summary = write_with(&out, &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        assert_eq!(summary.per_encoding["bf16"], (1, 8));
        assert!(validate_file(&out, &|_, _| {}).unwrap().problems.is_empty());
    }
}
