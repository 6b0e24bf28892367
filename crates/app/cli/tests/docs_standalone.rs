//! Issue 10: the project's docs and outputs stand alone. Nothing a user
//! reads may send them to the team's private notes (the `shared/` tree next
//! to the repository, with its reference files), which a clone does not have.

use std::path::{Path, PathBuf};

/// Names of the private notes; built from parts so this file does not match itself.
fn needles() -> Vec<String> {
    let r = ["shared", "reference"].join("/");
    let files = ["anchors", "algorithms", "nvme-tcp-facts", "fast-data-path"];
    let mut v: Vec<String> = files.iter().map(|f| format!("{f}.md")).collect();
    v.push(r);
    v.push(["..", "shared", ""].join("/"));
    v
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../..")
}

/// Every file a user reads or runs: docs, READMEs, sources, scripts, configs.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with('.')
            || ["target", "corpus", "artifacts"].contains(&name.as_str())
            || name.starts_with("target-")
        {
            continue;
        }
        if p.is_dir() {
            files(&p, out);
        } else if ["md", "rs", "sh", "py", "toml", "txt"]
            .iter()
            .any(|x| p.extension().is_some_and(|e| e == *x))
        {
            out.push(p);
        }
    }
}

#[test]
fn no_doc_source_or_script_points_at_the_private_notes() {
    let mut all = Vec::new();
    files(&repo(), &mut all);
    assert!(
        all.len() > 100,
        "found only {} files under {:?}",
        all.len(),
        repo()
    );
    let needles = needles();
    let mut hits = Vec::new();
    for f in &all {
        let Ok(text) = std::fs::read_to_string(f) else {
            continue;
        };
        for (i, line) in text.lines().enumerate() {
            if let Some(n) = needles.iter().find(|n| line.contains(n.as_str())) {
                hits.push(format!("{}:{}: {n}", f.display(), i + 1));
            }
        }
    }
    assert!(
        hits.is_empty(),
        "references a clone does not have:\n{}",
        hits.join("\n")
    );
}
