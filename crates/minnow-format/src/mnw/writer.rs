//! Writing a new `.mnw` file: regions are placed before any byte is written (so parallel
//! workers can fill them in any order and the result is the same), the file is built under a
//! temporary name beside the output, synced, validated, and only then linked into place,
//! refusing to replace an existing file. Dropping an unfinished [`OutputFile`] (an error, a
//! cancelled conversion) deletes the temporary file.

use std::fs::File;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tempfile::NamedTempFile;

use super::layout::{align_up, Header, ALIGN, MAX_MANIFEST};
use super::manifest::Manifest;
use super::validate::validate_file;
use crate::error::{FormatError, Result};

/// Hands out 4096-aligned offsets for regions in order, from 4096 on.
#[derive(Debug)]
pub struct RegionPlanner {
    next: u64,
}

impl Default for RegionPlanner {
    fn default() -> Self {
        Self { next: ALIGN }
    }
}

impl RegionPlanner {
    /// The offset of a new region of `bytes` bytes.
    pub fn place(&mut self, bytes: u64) -> u64 {
        let at = self.next;
        self.next = align_up(at + bytes).expect("file size overflows u64");
        at
    }

    /// Where the manifest goes: after the last region.
    pub fn end(&self) -> u64 {
        self.next
    }
}

/// A `.mnw` file being written.
pub struct OutputFile {
    temp: NamedTempFile,
    out: PathBuf,
}

impl OutputFile {
    /// Creates the temporary file beside `out`, sized to `data_end` (unwritten bytes read as
    /// zero, which is the padding). Refuses an `out` that already exists.
    pub fn create(out: &Path, data_end: u64) -> Result<OutputFile> {
        if out.exists() {
            return Err(FormatError::invalid(
                out,
                "already exists; not overwriting it",
            ));
        }
        let dir = match out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = out
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "output.mnw".into());
        // Created like any new file (mode 0666 less the process umask, 0644 typically), not
        // tempfile's private 0600: the published file is meant to be shared. The no-clobber
        // publish below does not depend on the mode.
        let temp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".partial")
            .permissions(std::fs::Permissions::from_mode(0o666))
            .tempfile_in(&dir)
            .map_err(|source| FormatError::Io {
                path: dir.clone(),
                source,
            })?;
        let file = OutputFile {
            temp,
            out: out.to_path_buf(),
        };
        file.temp
            .as_file()
            .set_len(data_end)
            .map_err(|e| file.write_error(e))?;
        Ok(file)
    }

    /// The temporary file's path (for tests and messages).
    pub fn temp_path(&self) -> &Path {
        self.temp.path()
    }

    fn file(&self) -> &File {
        self.temp.as_file()
    }

    fn write_error(&self, source: std::io::Error) -> FormatError {
        if source.raw_os_error() == Some(28) {
            return FormatError::invalid(
                &self.out,
                "the disk is full (no space left on the device); nothing was written",
            );
        }
        FormatError::Io {
            path: self.temp.path().to_path_buf(),
            source,
        }
    }

    /// Writes `bytes` at `offset`; safe to call from several threads for disjoint ranges.
    pub fn write_at(&self, bytes: &[u8], offset: u64) -> Result<()> {
        self.file()
            .write_all_at(bytes, offset)
            .map_err(|e| self.write_error(e))
    }

    /// Starts writing `bytes` bytes at `offset` (already written with [`Self::write_at`]) to the
    /// disk without waiting for them, so that the disk works while the converter computes the
    /// next tensors and the final sync has little left to do. A hint: where the system cannot
    /// do it, the final sync writes everything.
    pub fn start_writeback(&self, offset: u64, bytes: u64) {
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            let (Ok(offset), Ok(bytes)) = (i64::try_from(offset), i64::try_from(bytes)) else {
                return;
            };
            // SAFETY: a plain system call on an open descriptor this value owns; it reads no
            // memory of ours. Its result is ignored on purpose (see above).
            let _ = unsafe {
                libc::sync_file_range(
                    self.file().as_raw_fd(),
                    offset,
                    bytes,
                    libc::SYNC_FILE_RANGE_WRITE,
                )
            };
        }
        #[cfg(not(target_os = "linux"))]
        let _ = (offset, bytes);
    }

    /// Appends the manifest and the header, syncs, validates the whole file (reporting
    /// `verified(bytes_read, bytes_total)`), and links it to the output path (failing if that
    /// appeared meanwhile).
    pub fn finish(
        self,
        manifest: &Manifest,
        data_end: u64,
        verified: &(dyn Fn(u64, u64) + Sync),
    ) -> Result<Finished> {
        let bytes = manifest.to_bytes();
        if bytes.len() as u64 > MAX_MANIFEST {
            return Err(FormatError::invalid(
                &self.out,
                format!(
                    "the manifest would be {} bytes, over the 128 MiB limit",
                    bytes.len()
                ),
            ));
        }
        let header = Header {
            manifest_offset: data_end,
            manifest_len: bytes.len() as u64,
            file_len: data_end + bytes.len() as u64,
            manifest_blake3: *blake3::hash(&bytes).as_bytes(),
        };
        self.write_at(&bytes, data_end)?;
        self.write_at(&header.encode(), 0)?;
        let started = Instant::now();
        self.file().sync_all().map_err(|e| self.write_error(e))?;
        let sync = started.elapsed();
        let started = Instant::now();
        let report = validate_file(self.temp.path(), verified)?;
        let verify = started.elapsed();
        if let Some(problem) = report.problems.first() {
            return Err(FormatError::invalid(
                &self.out,
                format!("the written file failed verification: {problem}"),
            ));
        }
        let out = self.out.clone();
        self.temp.persist_noclobber(&out).map_err(|e| {
            if e.error.kind() == std::io::ErrorKind::AlreadyExists {
                FormatError::invalid(&out, "already exists; not overwriting it")
            } else {
                FormatError::Io {
                    path: out.clone(),
                    source: e.error,
                }
            }
        })?;
        // The new name must survive a crash too.
        if let Some(dir) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
        }
        Ok(Finished {
            file_len: header.file_len,
            sync,
            verify,
        })
    }
}

/// A published file: its length, and how long its last two steps took.
#[derive(Clone, Copy, Debug)]
pub struct Finished {
    pub file_len: u64,
    /// Waiting for the file's bytes to reach the disk.
    pub sync: Duration,
    /// Re-reading and checking the synced file.
    pub verify: Duration,
}
