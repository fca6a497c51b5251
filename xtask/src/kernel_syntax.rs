//! `cargo xtask kernel-syntax`: parses every `kernels/*.cu` with the host C++ compiler, for each
//! target the PTX is built for (sm_80, and sm_90 or sm_90a as `kernels` picks), so a kernel edit
//! made on a machine without nvcc gets its front-end errors (typos, wrong types, template
//! arguments that do not fit) before a GPU machine is at hand.
//!
//! It is a parse, not a compile: the CUDA names come from the declarations in
//! `xtask/cuda_host_shim/`, and each inline-PTX `asm` statement is replaced by a call that only
//! evaluates its operands, so the PTX text itself is left for ptxas to check. A clean run here
//! says nothing about registers, spills or the instructions; `cargo xtask kernels` on a machine
//! with nvcc stays the judge.
//!
//! Environment: `CXX` (default `g++`; clang++ works too).

use std::path::{Path, PathBuf};
use std::process::Command;

/// (`__CUDA_ARCH__`, whether the sm_90a feature macro is defined): the preprocessor views the
/// kernels are parsed under, one per PTX target.
fn views(stem: &str) -> Vec<(u32, bool)> {
    let sm90a = minnow_runtime::cuda::ptx::SM90A_MODULES.contains(&stem);
    vec![(800, false), (900, sm90a)]
}

pub fn run() -> Result<(), String> {
    let root = crate::kernels::workspace_root()?;
    parse_all(&root, &root.join("target/kernel-syntax"))
}

/// Stages the rewritten sources under `staged` and parses each `.cu` in every view.
fn parse_all(root: &Path, staged: &Path) -> Result<(), String> {
    std::fs::create_dir_all(staged).map_err(|e| format!("{}: {e}", staged.display()))?;
    let mut sources = Vec::new();
    for entry in std::fs::read_dir(root.join("kernels")).map_err(|e| format!("kernels/: {e}"))? {
        let path = entry.map_err(|e| format!("kernels/: {e}"))?.path();
        let is_kernel = path.extension().is_some_and(|x| x == "cu" || x == "cuh");
        if !is_kernel {
            continue;
        }
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let rewritten =
            replace_inline_ptx(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let name = path.file_name().expect("a file from read_dir has a name");
        std::fs::write(staged.join(name), rewritten)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if path.extension().is_some_and(|x| x == "cu") {
            sources.push(path);
        }
    }
    sources.sort();
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    let shim = root.join("xtask/cuda_host_shim");
    let mut failed = Vec::new();
    for source in &sources {
        let stem = source
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default();
        let file = staged.join(source.file_name().expect("a source has a name"));
        for (arch, sm90a) in views(stem) {
            let view = format!(
                "{stem}.cu at __CUDA_ARCH__={arch}{}",
                if sm90a { " (sm_90a)" } else { "" }
            );
            if !parse(&cxx, &shim, &file, arch, sm90a)? {
                failed.push(view);
            } else {
                println!("parsed {view}");
            }
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("{} failed to parse: {}", cxx, failed.join(", ")))
    }
}

/// One `-fsyntax-only` run; the compiler's diagnostics go to the terminal (they name the staged
/// copy under target/kernel-syntax, whose lines match the source's).
fn parse(cxx: &str, shim: &Path, file: &PathBuf, arch: u32, sm90a: bool) -> Result<bool, String> {
    let mut cmd = Command::new(cxx);
    cmd.args([
        "-x",
        "c++",
        "-std=c++17",
        "-fsyntax-only",
        "-Wno-unknown-pragmas",
    ])
    .arg("-I")
    .arg(shim)
    .arg("-include")
    .arg(shim.join("minnow_cuda_shim.h"))
    .arg(format!("-D__CUDA_ARCH__={arch}"));
    if sm90a {
        cmd.arg("-D__CUDA_ARCH_FEAT_SM90_ALL");
    }
    let status = cmd
        .arg(file)
        .status()
        .map_err(|e| format!("running {cxx}: {e} (set CXX to a C++ compiler)"))?;
    Ok(status.success())
}

/// The text with every `asm [volatile] ( ... )` statement replaced by
/// `minnow_shim_asm_operands(<the operands' expressions>)`, on the same lines (newlines inside the
/// statement are kept, so diagnostics keep the source's line numbers).
fn replace_inline_ptx(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let mut copied = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' | b'\'' => i = skip_literal(bytes, i)?,
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                i = text[i..].find('\n').map_or(bytes.len(), |n| i + n);
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i = text[i + 2..].find("*/").map_or(bytes.len(), |n| i + n + 4);
            }
            _ if starts_word(bytes, i, "asm") => {
                let mut j = i + 3;
                j = skip_space(bytes, j);
                if starts_word(bytes, j, "volatile") {
                    j = skip_space(bytes, j + "volatile".len());
                }
                if bytes.get(j) != Some(&b'(') {
                    i += 3;
                    continue;
                }
                let close = matching_paren(bytes, j)?;
                let operands = operand_expressions(&text[j + 1..close])?;
                let newlines = text[i..=close].matches('\n').count();
                out.push_str(&text[copied..i]);
                out.push_str("minnow_shim_asm_operands(");
                out.push_str(&operands.join(", "));
                out.push(')');
                out.push_str(&"\n".repeat(newlines));
                i = close + 1;
                copied = i;
            }
            _ => i += 1,
        }
    }
    out.push_str(&text[copied..]);
    Ok(out)
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

fn starts_word(bytes: &[u8], i: usize, word: &str) -> bool {
    bytes[i..].starts_with(word.as_bytes())
        && (i == 0 || !is_ident(bytes[i - 1]))
        && bytes.get(i + word.len()).is_none_or(|&b| !is_ident(b))
}

fn skip_space(bytes: &[u8], mut i: usize) -> usize {
    while bytes.get(i).is_some_and(|b| b.is_ascii_whitespace()) {
        i += 1;
    }
    i
}

/// The index just past the string or character literal that starts at `i`.
fn skip_literal(bytes: &[u8], i: usize) -> Result<usize, String> {
    let quote = bytes[i];
    let mut j = i + 1;
    while j < bytes.len() {
        match bytes[j] {
            b'\\' => j += 2,
            b if b == quote => return Ok(j + 1),
            _ => j += 1,
        }
    }
    Err("unterminated literal".into())
}

/// The index of the `)` that closes the `(` at `open`, stepping over literals.
fn matching_paren(bytes: &[u8], open: usize) -> Result<usize, String> {
    let mut depth = 0usize;
    let mut i = open;
    while i < bytes.len() {
        match bytes[i] {
            b'"' | b'\'' => {
                i = skip_literal(bytes, i)?;
                continue;
            }
            b'(' => depth += 1,
            b')' => {
                depth -= 1;
                if depth == 0 {
                    return Ok(i);
                }
            }
            _ => {}
        }
        i += 1;
    }
    Err("an asm statement without its closing parenthesis".into())
}

/// `body` split at the commas or colons that are outside literals and brackets.
fn split_top_level(body: &str, separator: u8) -> Result<Vec<&str>, String> {
    let bytes = body.as_bytes();
    let mut parts = Vec::new();
    let (mut depth, mut start, mut i) = (0i32, 0, 0);
    while i < bytes.len() {
        match bytes[i] {
            b'"' | b'\'' => {
                i = skip_literal(bytes, i)?;
                continue;
            }
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth -= 1,
            b if b == separator && depth == 0 => {
                parts.push(&body[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    parts.push(&body[start..]);
    Ok(parts)
}

/// The expressions of an asm statement's output and input operands (`"+f"(d[0])` gives `d[0]`).
/// A `::` between sections is two separators with an empty list between them.
fn operand_expressions(body: &str) -> Result<Vec<String>, String> {
    let sections = split_top_level(body, b':')?;
    let mut expressions = Vec::new();
    for section in sections.iter().skip(1).take(2) {
        for operand in split_top_level(section, b',')? {
            let operand = operand.trim();
            if operand.is_empty() {
                continue;
            }
            let open = operand
                .find('(')
                .ok_or_else(|| format!("asm operand without an expression: {operand:?}"))?;
            let inner = operand[open..].trim();
            let inner = inner
                .strip_prefix('(')
                .and_then(|s| s.strip_suffix(')'))
                .ok_or_else(|| format!("asm operand not of the form \"c\"(expr): {operand:?}"))?;
            expressions.push(format!("({})", inner.replace('\n', " ")));
        }
    }
    Ok(expressions)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernels as committed parse under the shim. CI installs g++ (.ci/run); without a C++
    /// compiler this fails and says so (set CXX).
    #[test]
    fn every_kernel_parses_with_the_host_compiler_in_every_view() {
        let root = crate::kernels::workspace_root().unwrap();
        let staged = tempfile::tempdir().unwrap();
        parse_all(&root, staged.path()).unwrap();
    }

    #[test]
    fn an_asm_statement_becomes_a_call_on_its_operands_and_keeps_its_lines() {
        let src = "int f(unsigned s, float (&c)[2]) {\n    asm volatile(\"op %0, %1;\\n\"\n        : \"+f\"(c[0]), \"=f\"(c[1])\n        : \"r\"(s) : \"memory\");\n    return 0;\n}\n";
        let out = replace_inline_ptx(src).unwrap();
        assert_eq!(out.lines().count(), src.lines().count());
        assert!(
            out.contains("minnow_shim_asm_operands((c[0]), (c[1]), (s))"),
            "{out}"
        );
        assert!(
            !out.contains("volatile") && !out.contains("memory"),
            "{out}"
        );
    }

    #[test]
    fn an_asm_with_no_operands_and_the_word_in_comments_and_strings_are_handled() {
        let src = "// asm volatile(\"x\");\nconst char* s = \"asm(\";\nvoid g() { asm volatile(\"fence;\" ::: \"memory\"); }\n";
        let out = replace_inline_ptx(src).unwrap();
        assert!(out.contains("// asm volatile(\"x\");"), "{out}");
        assert!(out.contains("\"asm(\""), "{out}");
        assert!(
            out.contains("void g() { minnow_shim_asm_operands(); }"),
            "{out}"
        );
    }

    #[test]
    fn a_constant_operand_and_nested_parentheses_survive() {
        let out =
            replace_inline_ptx("asm(\"w %0;\" ::\"n\"(N), \"l\"((const void*)(p + 1)));").unwrap();
        assert_eq!(
            out,
            "minnow_shim_asm_operands((N), ((const void*)(p + 1)));"
        );
    }

    #[test]
    fn an_identifier_containing_asm_is_not_rewritten() {
        let src = "int wasm(int x); int y = wasm(3); int asm_count = 1;";
        assert_eq!(replace_inline_ptx(src).unwrap(), src);
    }
}
