//! The house rules ARCHITECTURE.md states, checked: no source file over 600
//! lines, and no crate depending on one of its own layer or above.

use std::path::{Path, PathBuf};

/// The workspace's crates by directory, with their layer (ARCHITECTURE.md,
/// "Layers"): a crate may depend only on crates of a lower layer.
const LAYERS: &[(&str, u8)] = &[
    ("outbox-core", 0),
    ("outbox-sql", 1),
    ("outbox-sqlx", 2),
    ("outbox-diesel", 2),
    ("outbox-redis", 2),
    ("outbox-kafka", 2),
    ("outbox-sns", 2),
    ("outbox", 3),
    ("outbox-cli", 4),
    ("examples", 5),
    ("outbox-bench", 5),
    ("outbox-chaos", 5),
    ("tests", 5),
];

const MAX_LINES: usize = 600;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace above tests/")
        .to_path_buf()
}

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a readable directory") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "target") {
                rust_files(&path, found);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

#[test]
fn no_source_file_is_over_600_lines() {
    let root = workspace();
    let mut files = Vec::new();
    for (dir, _) in LAYERS {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(files.len() > 100, "found only {} files", files.len());
    let long: Vec<String> = files
        .iter()
        .filter_map(|path| {
            let lines = std::fs::read_to_string(path).ok()?.lines().count();
            (lines > MAX_LINES).then(|| format!("{} ({lines} lines)", path.display()))
        })
        .collect();
    assert!(long.is_empty(), "files over {MAX_LINES} lines: {long:?}");
}

/// The workspace crates `manifest` depends on to build (its
/// `[dependencies]` and target-specific dependencies, not dev- or build-).
fn workspace_dependencies(manifest: &str) -> Vec<String> {
    let mut section = String::new();
    let mut found = Vec::new();
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            section = line.to_owned();
            continue;
        }
        let builds = section.ends_with("dependencies]")
            && !section.contains("dev-dependencies")
            && !section.contains("build-dependencies");
        if builds && line.starts_with("outbox") {
            let name = line
                .split(|c: char| c == '.' || c == '=' || c.is_whitespace())
                .next()
                .unwrap_or_default();
            found.push(name.to_owned());
        }
    }
    found
}

/// The directory of the crate a dependency key names.
fn directory_of(key: &str) -> &str {
    match key {
        "outbox-redis-streams" => "outbox-redis",
        "outbox-rdkafka" => "outbox-kafka",
        "outbox-relay-core" => "outbox-core",
        other => other,
    }
}

#[test]
fn nothing_depends_on_its_own_layer_or_above() {
    let root = workspace();
    let layer = |dir: &str| LAYERS.iter().find(|(d, _)| *d == dir).map(|(_, l)| *l);
    let mut upward = Vec::new();
    let mut checked = 0;
    for (dir, own) in LAYERS {
        let manifest = std::fs::read_to_string(root.join(dir).join("Cargo.toml"))
            .expect("a member's Cargo.toml");
        for dependency in workspace_dependencies(&manifest) {
            checked += 1;
            match layer(directory_of(&dependency)) {
                Some(theirs) if theirs < *own => {}
                Some(theirs) => upward.push(format!(
                    "{dir} (layer {own}) -> {dependency} (layer {theirs})"
                )),
                None => upward.push(format!("{dir} -> {dependency}: a crate with no layer")),
            }
        }
    }
    assert!(checked >= 20, "read only {checked} workspace dependencies");
    assert!(
        upward.is_empty(),
        "dependencies against the layers: {upward:?}"
    );
}
