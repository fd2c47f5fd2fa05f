//! The crate's layering, read from its source: every path into another top-level module
//! (`crate::x`, `crate::{x, ..}`, a `super::` that climbs to the crate root) must go to a
//! lower layer. Comments and doc comments are not imports and are skipped.
//!
//! The layers, bottom up (`src/sys/mod.rs` and `docs/layout.md` say what each holds):
//!
//! | rank | modules | what |
//! |---|---|---|
//! | 0 | `sys` | mmap arrays, the fork gate, the provisioning mark, NUMA system calls |
//! | 1 | `nic` | the verbs: device, PD, MR, MW, CQ, QP, UMEM; the soft NIC |
//! | 2 | `arena` | reservation, slabs, registration, its own prefetch-on-commit and reserve |
//! | 3 | `alloc` | the allocator core (`Core`): pages, heaps, thread caches, the quarantine hook |
//! | 4 | `grant`, `prefetch`, `queue_mem` | the features built on the core |
//! | 5 | `pool` | `Pool`, the facade composing the core and the features |
//! | 6 | `global` | `GlobalPool`, the global allocator front end over a `Pool` |
//! | 7 | `cm` | connection management over `rdma_cm` |
//!
//! Modules of one rank do not import each other either. A path to an item re-exported at the
//! crate root (`crate::Pool`) counts as a path to the module it comes from (read from
//! `lib.rs`). `KNOWN_UPWARD` lists edges allowed to run upward (none: the list may only
//! shrink, and the test fails when a listed edge is gone); the same for `KNOWN_LONG`, the
//! source files over [`MAX_LINES`] lines.
//!
//! Soft NIC only (not in the rxe guest): it reads the source files and touches no NIC.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const LAYERS: &[(&str, u32)] = &[
    ("sys", 0),
    ("nic", 1),
    ("arena", 2),
    ("alloc", 3),
    ("grant", 4),
    ("prefetch", 4),
    ("queue_mem", 4),
    ("pool", 5),
    ("global", 6),
    ("cm", 7),
];

/// Edges `(from, to)` that still run upward or sideways.
const KNOWN_UPWARD: &[(&str, &str)] = &[];

/// Longest source file, in lines.
const MAX_LINES: usize = 600;

/// Source files still longer than [`MAX_LINES`] (relative to `src/`).
const KNOWN_LONG: &[&str] = &[];

fn rank(module: &str) -> Option<u32> {
    LAYERS.iter().find(|(m, _)| *m == module).map(|&(_, r)| r)
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module path of a source file under `src/` (`alloc/heap.rs` → `[alloc, heap]`,
/// `alloc/mod.rs` → `[alloc]`, `lib.rs` → `[]`).
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_string());
    }
    parts
}

/// The code of a line, without its comment (good enough for this crate: no `//` in strings
/// on lines that also name `crate::`).
fn code(line: &str) -> &str {
    let t = line.trim_start();
    if t.starts_with("//") {
        return "";
    }
    line.split("//").next().unwrap_or("")
}

fn ident_at(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The top-level modules a line of code names from the crate root.
fn targets(code: &str, here: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        // `$crate::` in a macro is the crate root too; `foo_crate::` is not.
        let before = rest[..i].chars().next_back();
        let after = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            rest = after;
            continue;
        }
        out.extend(group_or_ident(after));
        rest = after;
    }
    // `super::` chains that climb to the crate root.
    let mut rest = code;
    while let Some(i) = rest.find("super::") {
        let before = rest[..i].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            rest = &rest[i + 7..];
            continue;
        }
        let mut after = &rest[i..];
        let mut ups = 0;
        while let Some(a) = after.strip_prefix("super::") {
            ups += 1;
            after = a;
        }
        if ups == here.len() {
            out.extend(group_or_ident(after));
        }
        rest = after;
    }
    out
}

/// `x::…` → `[x]`; `{x::…, y, z::{…}}` → `[x, y, z]`.
fn group_or_ident(s: &str) -> Vec<String> {
    let Some(inner) = s.strip_prefix('{') else {
        return vec![ident_at(s).to_string()];
    };
    let (mut depth, mut out, mut start) = (0, Vec::new(), true);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => start = true,
            c if start && !c.is_whitespace() => {
                out.push(ident_at(&inner[i..]).to_string());
                start = false;
            }
            _ => {}
        }
    }
    out
}

/// The items `lib.rs` re-exports at the crate root, with the module each comes from:
/// `pub use pool::{Pool, PoolError};` → `[(Pool, pool), (PoolError, pool)]`.
fn root_exports(lib: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in lib.lines().map(code) {
        let Some(path) = line.trim().strip_prefix("pub use ") else {
            continue;
        };
        let path = path.trim_end_matches(';');
        let module = ident_at(path).to_string();
        let items = match path.find('{') {
            Some(i) => path[i + 1..path.rfind('}').unwrap_or(path.len())]
                .split(',')
                .map(str::to_string)
                .collect(),
            None => vec![path.to_string()],
        };
        for item in items {
            let name = item.rsplit(" as ").next().unwrap_or(&item);
            let name = name.rsplit("::").next().unwrap_or(name).trim();
            if !name.is_empty() {
                out.push((name.to_string(), module.clone()));
            }
        }
    }
    out
}

#[test]
fn every_import_goes_down() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let exports = root_exports(&std::fs::read_to_string(src.join("lib.rs")).unwrap());
    // A root item stands for the module it is re-exported from.
    let module_of = |t: String| match exports.iter().find(|(name, _)| *name == t) {
        Some((_, m)) => m.clone(),
        None => t,
    };
    let mut files = Vec::new();
    sources(&src, &mut files);
    files.sort();
    assert!(files.len() > 50, "the sources were not found under {src:?}");
    let mut wrong = Vec::new();
    let mut upward = BTreeSet::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let here = module_path(rel);
        let Some(top) = here.first() else { continue };
        let Some(mine) = rank(top) else {
            wrong.push(format!("{}: module `{top}` has no layer", rel.display()));
            continue;
        };
        let text = std::fs::read_to_string(f).unwrap();
        for (n, line) in text.lines().enumerate() {
            for t in targets(code(line), &here).into_iter().map(module_of) {
                if &t == top || rank(&t).is_none() {
                    continue; // itself, or a macro
                }
                if rank(&t).unwrap() >= mine {
                    if KNOWN_UPWARD.contains(&(top.as_str(), t.as_str())) {
                        upward.insert((top.clone(), t));
                    } else {
                        wrong.push(format!(
                            "{}:{}: `{top}` (layer {mine}) imports `{t}` (layer {}): {}",
                            rel.display(),
                            n + 1,
                            rank(&t).unwrap(),
                            line.trim()
                        ));
                    }
                }
            }
        }
    }
    for &(a, b) in KNOWN_UPWARD {
        if !upward.contains(&(a.to_string(), b.to_string())) {
            wrong.push(format!(
                "`{a}` no longer imports `{b}`: take the edge out of KNOWN_UPWARD"
            ));
        }
    }
    assert!(wrong.is_empty(), "layering broken:\n{}", wrong.join("\n"));
}

#[test]
fn no_source_file_is_long() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut wrong = Vec::new();
    let mut long = BTreeSet::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap().to_string_lossy().into_owned();
        // Test doubles are test code.
        if rel.contains("/tests/") {
            continue;
        }
        let n = std::fs::read_to_string(f).unwrap().lines().count();
        if n > MAX_LINES {
            if KNOWN_LONG.contains(&rel.as_str()) {
                long.insert(rel);
            } else {
                wrong.push(format!("{rel}: {n} lines (at most {MAX_LINES})"));
            }
        }
    }
    for k in KNOWN_LONG {
        if !long.contains(*k) {
            wrong.push(format!("{k} is no longer long: take it out of KNOWN_LONG"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_reader_sees_groups_and_climbs() {
    let here = vec!["alloc".to_string(), "heap".to_string()];
    assert_eq!(
        targets("use crate::{arena::Arena, nic, grant::{A, B}};", &here),
        ["arena", "nic", "grant"]
    );
    assert_eq!(targets("let x = crate::sys::os::errno();", &here), ["sys"]);
    assert_eq!(targets("use super::super::grant::X;", &here), ["grant"]);
    assert!(targets("use super::page::Page;", &here).is_empty());
    assert!(targets("use rdma_crate::x;", &here).is_empty());
    assert_eq!(code("    /// [`crate::grant`]"), "");
    assert_eq!(
        module_path(Path::new("nic/soft/qp.rs")),
        ["nic", "soft", "qp"]
    );
    assert_eq!(module_path(Path::new("nic/mod.rs")), ["nic"]);
    assert_eq!(
        root_exports("pub use pool::{Pool, PoolError};\npub use global::GlobalPool;\nmod x;"),
        [
            ("Pool".to_string(), "pool".to_string()),
            ("PoolError".to_string(), "pool".to_string()),
            ("GlobalPool".to_string(), "global".to_string())
        ]
    );
}
