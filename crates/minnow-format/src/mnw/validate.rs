//! `validate`: every byte of a file accounted for. The header and manifest are checked as a
//! reader checks them, then the manifest's BLAKE3 against the header, every region's BLAKE3
//! against the manifest, every padding byte against zero, and every quantized scale for being
//! positive and finite. Regions are checked in parallel, each thread reading through one fixed
//! buffer (plus the manifest, at most 128 MiB), so memory stays bounded whatever the file size.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use minnow_runtime::quant::{QuantEncoding, QuantMat};
use rayon::prelude::*;

use super::layout::{check, Header, Span, ALIGN, HEADER_LEN};
use crate::error::{FormatError, Result};

/// Bytes read per step: large enough that hashing one step spreads over every core.
const CHUNK: usize = 8 << 20;

/// What a validation found.
#[derive(Debug, Default)]
pub struct Report {
    /// One sentence per problem, naming the region (by tensor) or the byte range at fault.
    pub problems: Vec<String>,
    /// Regions whose digest was checked (including the manifest).
    pub regions_checked: usize,
    pub bytes_read: u64,
    pub tensors: usize,
}

impl Report {
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Validates the file at `path`; `progress(bytes_done, bytes_total)` is called as it reads
/// (from several threads: regions are read and hashed in parallel).
/// An I/O error is an `Err`; everything wrong with the content is in the report.
pub fn validate_file(path: &Path, progress: &(dyn Fn(u64, u64) + Sync)) -> Result<Report> {
    let io = |source| FormatError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    let mut report = Report::default();
    let mut head = [0u8; HEADER_LEN];
    let got = read_up_to(&file, 0, &mut head).map_err(io)?;
    let header = match Header::decode(&head[..got], len) {
        Ok(h) => h,
        Err(e) => {
            report.problems.push(format!("header: {e}"));
            return Ok(report);
        }
    };
    let mut manifest = vec![0u8; header.manifest_len as usize];
    file.read_exact_at(&mut manifest, header.manifest_offset)
        .map_err(io)?;
    report.regions_checked += 1;
    let digest = blake3::hash(&manifest);
    if digest.as_bytes() != &header.manifest_blake3 {
        report.problems.push(format!(
            "manifest: BLAKE3 {} does not match the header's {}",
            digest.to_hex(),
            blake3::Hash::from_bytes(header.manifest_blake3).to_hex()
        ));
    }
    let checked = match check(&header, &manifest) {
        Ok(c) => c,
        Err(e) => {
            report.problems.push(format!("manifest: {e}"));
            return Ok(report);
        }
    };
    drop(manifest);
    report.tensors = checked.entries.len();

    let total = header.manifest_offset;
    // Regions are checked on every core, each with the padding before it; their problems are
    // then reported in file order, as a serial pass would find them.
    let done = AtomicU64::new(HEADER_LEN as u64);
    let per_span: Vec<std::io::Result<Vec<String>>> = checked
        .spans
        .par_iter()
        .enumerate()
        .map_init(
            || vec![0u8; CHUNK],
            |buf, (i, span)| {
                let (cursor, after) = match i.checked_sub(1).map(|p| &checked.spans[p]) {
                    Some(before) => (before.end, before.label()),
                    None => (HEADER_LEN as u64, "the header".to_string()),
                };
                let mut problems = Vec::new();
                check_zero(&file, cursor, span.start, &after, buf, &mut problems)?;
                hash_region(&file, span, buf, &mut problems)?;
                let read = span.end - cursor;
                progress(done.fetch_add(read, Ordering::Relaxed) + read, total);
                Ok(problems)
            },
        )
        .collect();
    for problems in per_span {
        report.problems.extend(problems.map_err(io)?);
    }
    report.regions_checked += checked.spans.len();
    let (cursor, after) = match checked.spans.last() {
        Some(last) => (last.end, last.label()),
        None => (HEADER_LEN as u64, "the header".to_string()),
    };
    let mut buf = vec![0u8; CHUNK.min((total - cursor) as usize)];
    check_zero(&file, cursor, total, &after, &mut buf, &mut report.problems).map_err(io)?;
    progress(total, total);
    report.bytes_read = len;
    Ok(report)
}

fn read_up_to(file: &File, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64)? {
            0 => break,
            n => done += n,
        }
    }
    Ok(done)
}

/// Bytes `start..end` must all be zero (padding).
fn check_zero(
    file: &File,
    start: u64,
    end: u64,
    after: &str,
    buf: &mut [u8],
    problems: &mut Vec<String>,
) -> std::io::Result<()> {
    let mut pos = start;
    while pos < end {
        let n = ((end - pos) as usize).min(buf.len());
        file.read_exact_at(&mut buf[..n], pos)?;
        if let Some(i) = buf[..n].iter().position(|&b| b != 0) {
            let region = if end <= ALIGN && start <= HEADER_LEN as u64 {
                "header padding".to_string()
            } else {
                format!("padding after {after}")
            };
            problems.push(format!(
                "{region} (bytes {start}..{end}): byte {} is {:#04x}, not zero",
                pos + i as u64,
                buf[i]
            ));
            return Ok(());
        }
        pos += n as u64;
    }
    Ok(())
}

fn hash_region(
    file: &File,
    span: &Span,
    buf: &mut [u8],
    problems: &mut Vec<String>,
) -> std::io::Result<()> {
    let mut hasher = blake3::Hasher::new();
    let mut pos = span.start;
    let mut bad_scale = None;
    while pos < span.end {
        let n = ((span.end - pos) as usize).min(buf.len());
        file.read_exact_at(&mut buf[..n], pos)?;
        // The digest of a region is the same however its hashing is split across threads
        // (a large region, hashed while few others remain, spreads over the idle cores).
        hasher.update_rayon(&buf[..n]);
        if let (Some(enc), None) = (span.encoding, bad_scale) {
            bad_scale = first_bad_scale(enc, &buf[..n]).map(|(i, v)| {
                let size = scale_size(enc);
                ((pos - span.start) as usize / size + i, v)
            });
        }
        pos += n as u64;
    }
    let digest = hasher.finalize().to_hex();
    if !digest.as_str().eq_ignore_ascii_case(&span.blake3) {
        problems.push(format!(
            "{} (offset {}, {} bytes): BLAKE3 {digest} does not match the manifest's {}",
            span.label(),
            span.start,
            span.end - span.start,
            span.blake3
        ));
    }
    if let Some((i, v)) = bad_scale {
        problems.push(format!(
            "{}: scale {i} is {v}, not positive and finite",
            span.label()
        ));
    }
    Ok(())
}

fn scale_size(enc: QuantEncoding) -> usize {
    match enc {
        QuantEncoding::Nvfp4 => 1,
        QuantEncoding::Fp8Block => 4,
        _ => 2,
    }
}

/// The first bad scale among `bytes` (whole scales: chunks are a multiple of every size).
fn first_bad_scale(enc: QuantEncoding, bytes: &[u8]) -> Option<(usize, f32)> {
    QuantMat {
        encoding: enc,
        rows: 0,
        cols: 0,
        group_size: 0,
        codes: &[],
        scales: bytes,
        global_scale: 1.0,
    }
    .find_bad_scale()
}
