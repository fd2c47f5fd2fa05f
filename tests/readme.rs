//! The README's first screen is a program that works: its complete program is
//! `examples/readme.rs` byte for byte, and it runs — the file is compiled into this test
//! (`include!`, so this binary's global allocator is the README's `GlobalPool`) and its `main`
//! called, on the embedded default NIC (the soft NIC without a device). `scripts/test.sh` also
//! runs it as a user does, `cargo run --example readme`.
//!
//! The README also keeps the two commands `.ci/run` and `scripts/demo.sh` stand behind, and
//! every relative link of the README and of `docs/` reaches a file (and a heading) that exists.

include!("../examples/readme.rs");

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_readme_program_is_examples_readme_rs() {
    let readme = read(&root().join("README.md"));
    let program = read(&root().join("examples/readme.rs"));
    let first = readme
        .find("```rust\n")
        .expect("README.md has a Rust program");
    assert!(
        readme[first..].starts_with(&format!("```rust\n{program}```\n")),
        "README.md's first Rust block differs from examples/readme.rs"
    );
    assert!(
        readme.find("\n## ").is_none_or(|section| first < section),
        "the README's program comes before its first section"
    );
}

#[test]
fn the_readme_program_runs() {
    main().expect("the README's program");
}

#[test]
fn the_readme_keeps_the_demo_and_test_commands() {
    let readme = read(&root().join("README.md"));
    for line in [
        "bash scripts/demo.sh    # the demo:",
        "bash scripts/test.sh    # the whole test suite:",
        "`.ci/run` runs exactly `bash scripts/test.sh`",
    ] {
        assert!(readme.contains(line), "README.md lost {line:?}");
    }
}

/// GitHub's anchor of a heading: lower case, spaces to `-`, punctuation other than `-` and `_`
/// dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_ascii_lowercase()),
            _ => None,
        })
        .collect()
}

/// The markdown outside code blocks, line by line.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|l| {
            if l.starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

fn anchors(text: &str) -> Vec<String> {
    prose(text)
        .into_iter()
        .filter(|l| l.starts_with('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect()
}

#[test]
fn the_readme_and_docs_link_to_what_exists() {
    let mut files = vec![root().join("README.md")];
    for entry in std::fs::read_dir(root().join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            files.push(path);
        }
    }
    let mut broken = Vec::new();
    for file in &files {
        let text = read(file);
        for line in prose(&text) {
            for (i, _) in line.match_indices("](") {
                let rest = &line[i + 2..];
                let Some(end) = rest.find(')') else { continue };
                let target = &rest[..end];
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (path, fragment) = target.split_once('#').unwrap_or((target, ""));
                let linked = if path.is_empty() {
                    file.clone()
                } else {
                    file.parent().unwrap().join(path)
                };
                if !linked.exists() {
                    broken.push(format!("{}: {target} (no such file)", file.display()));
                } else if !fragment.is_empty()
                    && linked.extension().is_some_and(|e| e == "md")
                    && !anchors(&read(&linked)).iter().any(|a| a == fragment)
                {
                    broken.push(format!("{}: {target} (no such heading)", file.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}
