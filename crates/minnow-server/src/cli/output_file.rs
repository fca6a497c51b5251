//! Writing a user-named output file without harming what is already there: the path must be new
//! or an existing regular file (then only with `--force`); symlinks (dangling ones included),
//! FIFOs, devices, sockets and directories are refused with or without `--force`, never followed
//! or replaced. The content goes to a fresh temporary file beside the target (created exclusively,
//! so nothing planted there is followed) and is renamed over it only when complete, so a failure
//! never leaves a half-written output.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};

/// Refuses an output path that may not be written; call it before any expensive work.
pub fn check_writable(output: &Path, force: bool) -> Result<(), String> {
    match std::fs::symlink_metadata(output) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let parent = parent_dir(output);
            if !parent.is_dir() {
                return Err(format!(
                    "{}: the directory {} does not exist",
                    output.display(),
                    parent.display()
                ));
            }
            Ok(())
        }
        Err(e) => Err(format!("{}: {e}", output.display())),
        Ok(meta) => {
            let kind = meta.file_type();
            if kind.is_symlink() {
                Err(format!(
                    "{} is a symbolic link; refusing to write through or replace it",
                    output.display()
                ))
            } else if !kind.is_file() {
                Err(format!(
                    "{} exists and is not a regular file ({}); refusing to replace it",
                    output.display(),
                    describe(&meta)
                ))
            } else if !force {
                Err(format!(
                    "{} already exists (pass --force to overwrite)",
                    output.display()
                ))
            } else {
                Ok(())
            }
        }
    }
}

/// Writes `output` through `write` (which fills the given temporary path) and renames the result
/// into place; `check_writable` runs again just before the rename.
pub fn write_atomically(
    output: &Path,
    force: bool,
    write: impl FnOnce(&Path) -> Result<(), String>,
) -> Result<(), String> {
    check_writable(output, force)?;
    let tmp = create_temporary(output)?;
    let result = write(&tmp)
        .and_then(|()| check_writable(output, force))
        .and_then(|()| {
            std::fs::rename(&tmp, output).map_err(|e| format!("{}: {e}", output.display()))
        });
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// A new, empty file beside `output`, created exclusively (`O_EXCL`: never an existing file or
/// symlink).
fn create_temporary(output: &Path) -> Result<PathBuf, String> {
    let name = output
        .file_name()
        .ok_or_else(|| format!("{}: not a file path", output.display()))?;
    for attempt in 0..16u32 {
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(
            ".tmp-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>() ^ attempt
        ));
        let tmp = output.with_file_name(tmp_name);
        match OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(_) => return Ok(tmp),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(format!("{}: {e}", tmp.display())),
        }
    }
    Err(format!(
        "{}: cannot create a temporary file beside it",
        output.display()
    ))
}

fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

fn describe(meta: &std::fs::Metadata) -> &'static str {
    let kind = meta.file_type();
    if kind.is_dir() {
        return "a directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return "a FIFO";
        }
        if kind.is_char_device() || kind.is_block_device() {
            return "a device";
        }
        if kind.is_socket() {
            return "a socket";
        }
    }
    "a special file"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_text(output: &Path, force: bool, text: &str) -> Result<(), String> {
        write_atomically(output, force, |tmp| {
            std::fs::write(tmp, text).map_err(|e| e.to_string())
        })
    }

    #[test]
    fn new_and_regular_files() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.bin");
        write_text(&out, false, "one").unwrap();
        assert!(write_text(&out, false, "two")
            .unwrap_err()
            .contains("--force"));
        write_text(&out, true, "two").unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "two");
        // No temporary file is left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        assert!(check_writable(&dir.path().join("no/such/dir/x"), true).is_err());
    }

    #[cfg(unix)]
    #[test]
    fn symlinks_fifos_devices_and_directories_are_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("precious");
        std::fs::write(&target, "keep").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        for force in [false, true] {
            for path in [&link, &dangling] {
                let error = write_text(path, force, "x").unwrap_err();
                assert!(error.contains("symbolic link"), "{error}");
            }
            if made.as_ref().is_ok_and(|s| s.success()) {
                let error = write_text(&fifo, force, "x").unwrap_err();
                assert!(error.contains("FIFO"), "{error}");
            }
            let error = write_text(Path::new("/dev/null"), force, "x").unwrap_err();
            assert!(error.contains("device"), "{error}");
            let error = write_text(dir.path(), force, "x").unwrap_err();
            assert!(error.contains("directory"), "{error}");
        }
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        assert!(std::fs::symlink_metadata(&dangling)
            .unwrap()
            .file_type()
            .is_symlink());
        assert!(!dir.path().join("nowhere").exists());
    }
}
