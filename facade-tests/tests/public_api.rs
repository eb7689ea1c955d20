//! The public API of every published crate, item by item, against the
//! snapshot in `api/CRATE.txt`: any change to the public surface shows in
//! the diff of a commit, and is made on purpose.
//!
//! Each crate's rustdoc JSON is built with every feature by
//! `scripts/api-json.sh` (in `target/api`) and read with the `public-api`
//! crate. After a deliberate change, write the new
//! snapshots with
//!
//! ```text
//! DISTLOCK_UPDATE_API=1 cargo nextest run -p facade-tests -E 'binary(public_api)'
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace's root (this test's crate is one of its members).
fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// Every published crate's name and public items, one per line, sorted:
/// `scripts/api-json.sh` builds their rustdoc JSON.
fn public_apis() -> Vec<(String, String)> {
    let mut script = Command::new("bash");
    script.arg(root().join("scripts/api-json.sh"));
    // Run as scripts/test.sh runs it beside the test build, so that this
    // finds that build done: the `CARGO` and `CARGO_*` variables a test
    // process is given would make cargo redo it (a dependency's build
    // script reruns when `CARGO_MANIFEST_DIR` changes).
    for (key, _) in std::env::vars_os() {
        let set_for_tests = key.to_str().is_some_and(|k| {
            k == "CARGO"
                || (k.starts_with("CARGO_") && k != "CARGO_HOME" && k != "CARGO_TARGET_DIR")
        });
        if set_for_tests {
            script.env_remove(key);
        }
    }
    let built = script.output().expect("scripts/api-json.sh runs");
    assert!(
        built.status.success(),
        "scripts/api-json.sh failed:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let docs = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root().join("target"), PathBuf::from)
        .join("api/doc");
    let crates = String::from_utf8_lossy(&built.stdout).into_owned();
    crates
        .lines()
        .map(|krate| {
            let json = docs.join(format!("{}.json", krate.replace('-', "_")));
            // Blanket impls (`Into`, a dependency's marker traits) follow
            // from the rest and change with the dependencies' versions:
            // left out. Auto traits (`Send`, `Sync`, `Unpin`) are part of
            // the contract: kept.
            let api = public_api::Builder::from_rustdoc_json(&json)
                .omit_blanket_impls(true)
                .build()
                .unwrap_or_else(|e| panic!("reading {}: {e}", json.display()));
            let items = api.items().map(|item| format!("{item}\n")).collect();
            (krate.to_string(), items)
        })
        .collect()
}

/// The lines only in `a`, each marked with `mark`.
fn only_in(a: &str, b: &str, mark: char) -> Vec<String> {
    let theirs: std::collections::HashSet<&str> = b.lines().collect();
    a.lines()
        .filter(|l| !theirs.contains(l))
        .map(|l| format!("{mark} {l}"))
        .collect()
}

#[test]
fn every_crates_public_api_is_its_snapshot() {
    let update = std::env::var_os("DISTLOCK_UPDATE_API").is_some();
    let mut changes = Vec::new();
    let apis = public_apis();
    // Every snapshot belongs to a crate the script builds.
    let built: Vec<&str> = apis.iter().map(|(krate, _)| krate.as_str()).collect();
    for entry in std::fs::read_dir(root().join("api")).expect("api/") {
        let file = entry.expect("api/ entry").file_name();
        let krate = file.to_string_lossy().trim_end_matches(".txt").to_string();
        assert!(
            built.contains(&krate.as_str()),
            "api/{krate}.txt has no crate in scripts/api-json.sh"
        );
    }
    for (krate, now) in apis {
        assert!(
            now.lines().count() > 10,
            "{krate}: suspiciously few public items:\n{now}"
        );
        let path = root().join("api").join(format!("{krate}.txt"));
        if update {
            std::fs::write(&path, &now).expect("writing the snapshot");
            continue;
        }
        let snapshot = std::fs::read_to_string(&path).unwrap_or_default();
        if snapshot != now {
            changes.push(format!("{}:", path.display()));
            changes.extend(only_in(&snapshot, &now, '-'));
            changes.extend(only_in(&now, &snapshot, '+'));
        }
    }
    assert!(
        changes.is_empty(),
        "the public API changed; if on purpose, update the snapshots \
         (DISTLOCK_UPDATE_API=1, see facade-tests/tests/public_api.rs):\n{}",
        changes.join("\n")
    );
}
