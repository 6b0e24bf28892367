//! The storage node's wings (docs/architecture.md): which module of
//! `src/` may name which. Reads every source file as text, so a new file is
//! checked the day it lands; a violation names the file, the line and the
//! rule.
//!
//! | wing      | may name (besides itself)          |
//! |-----------|------------------------------------|
//! | `sys`     | nothing                            |
//! | `config`  | `sys`                              |
//! | `backend` | `sys`, `config`                    |
//! | `state`   | `sys`, `config`, `backend`         |
//! | `data`    | `sys`, `config`, `backend`, `state`|
//! | `control` | `sys`, `config`, `backend`, `state`|
//!
//! `server.rs` (the wiring), `fuzzing.rs` (a harness) and `lib.rs` see
//! everything. `use crate::{a, b}` is refused everywhere below them, so
//! every cross-module path is spelled `crate::wing::...` and this check
//! cannot be walked around.

use std::path::{Path, PathBuf};

const WINGS: [&str; 6] = ["sys", "config", "backend", "state", "data", "control"];

/// The top-level modules a file of `wing` may name.
fn allowed(wing: &str) -> &'static [&'static str] {
    match wing {
        "sys" => &["sys"],
        "config" => &["sys", "config"],
        "backend" => &["sys", "config", "backend"],
        "state" => &["sys", "config", "backend", "state"],
        "data" => &["sys", "config", "backend", "state", "data"],
        "control" => &["sys", "config", "backend", "state", "control"],
        _ => &[],
    }
}

/// Every `crate::X` that a file of `wing` may not name, and every
/// `crate::{`, as "line N: ...".
fn violations(wing: &str, text: &str) -> Vec<String> {
    let ok = allowed(wing);
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find("crate::") {
            let after = &rest[at + "crate::".len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '{')
                .collect();
            // `trellis_crate::` or `my_crate::` are not this crate's paths.
            let own = rest[..at]
                .chars()
                .last()
                .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
            if own && name.starts_with('{') {
                out.push(format!(
                    "line {}: `crate::{{...}}`: name each wing's path in full",
                    i + 1
                ));
            } else if own && !ok.contains(&name.as_str()) {
                out.push(format!(
                    "line {}: names `crate::{name}`, which the {wing} wing may not (it may name {})",
                    i + 1,
                    ok.join(", ")
                ));
            }
            rest = after;
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn every_wing_names_only_the_wings_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut bad = Vec::new();
    let mut checked = 0;
    for wing in WINGS {
        let dir = src.join(wing);
        assert!(
            dir.is_dir(),
            "src/{wing}/ is missing: the layout of docs/architecture.md"
        );
        let mut files = Vec::new();
        rust_files(&dir, &mut files);
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            for v in violations(wing, &text) {
                bad.push(format!("{}: {v}", f.strip_prefix(&src).unwrap().display()));
            }
            checked += 1;
        }
    }
    // Everything else at the top is the wiring or a harness.
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let known = WINGS.contains(&name.as_str())
            || ["lib.rs", "server.rs", "fuzzing.rs"].contains(&name.as_str());
        assert!(known, "src/{name}: put it in a wing (docs/architecture.md)");
    }
    assert!(
        checked > 30,
        "only {checked} files read: is the walk broken?"
    );
    assert!(bad.is_empty(), "layering violations:\n{}", bad.join("\n"));
}

#[test]
fn the_check_catches_an_upward_path_and_a_grouped_import() {
    assert!(violations("data", "use crate::state::subsystem::Registry;").is_empty());
    assert_eq!(violations("data", "use crate::control::ha::Ha;").len(), 1);
    assert_eq!(
        violations("state", "x: crate::data::qos::QosQueue,").len(),
        1
    );
    assert_eq!(violations("control", "/// see `crate::data::tcp`").len(), 1);
    assert_eq!(violations("sys", "use crate::{config, state};").len(), 1);
    assert!(violations("config", "use trellis_crate::data;").is_empty());
    assert_eq!(
        violations("backend", "let x = crate::state::nsset::X; crate::data::y").len(),
        2
    );
}
