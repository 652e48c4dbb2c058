//! The crate graph against the table of `docs/architecture.md`: every
//! dependency of a workspace crate on another is one its row allows, and
//! the test helpers are a dev-dependency only. A crate missing from the
//! table, or a dependency the table does not name, fails the test.

use std::collections::{BTreeMap, BTreeSet};

/// The crates a row's "may use" column names ("everything below it":
/// the rows above; "everything": every crate).
fn allowed(table: &[(String, String)]) -> BTreeMap<String, BTreeSet<String>> {
    let short = |crate_name: &str| crate_name.trim_start_matches("sless-").to_owned();
    let names: Vec<String> = table.iter().map(|(name, _)| short(name)).collect();
    let mut out = BTreeMap::new();
    for (i, (name, may_use)) in table.iter().enumerate() {
        let allowed: BTreeSet<String> = if may_use.starts_with("everything below") {
            names[..i].iter().cloned().collect()
        } else if may_use.starts_with("everything") {
            names.iter().filter(|n| **n != short(name)).cloned().collect()
        } else {
            names
                .iter()
                .filter(|n| {
                    may_use
                        .split(|c: char| !c.is_ascii_alphanumeric() && c != '-')
                        .any(|word| word == n.as_str())
                })
                .cloned()
                .collect()
        };
        out.insert(name.clone(), allowed);
    }
    out
}

/// The rows of the table: (crate, what it may use).
fn table() -> Vec<(String, String)> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/architecture.md")).unwrap();
    doc.lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let name = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            (cells.len() == 5 && name != "crate").then(|| (name.to_owned(), cells[3].to_owned()))
        })
        .collect()
}

#[test]
fn every_dependency_between_crates_is_one_the_architecture_allows() {
    let metadata = std::process::Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        metadata.status.success(),
        "{}",
        String::from_utf8_lossy(&metadata.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&metadata.stdout).unwrap();
    let table = table();
    let allowed = allowed(&table);
    let workspace: BTreeSet<String> = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_owned())
        .collect();
    let short = |name: &str| name.trim_start_matches("sless-").to_owned();
    for package in metadata["packages"].as_array().unwrap() {
        let name = package["name"].as_str().unwrap();
        let may_use = allowed
            .get(name)
            .unwrap_or_else(|| panic!("{name} has no row in docs/architecture.md"));
        for dependency in package["dependencies"].as_array().unwrap() {
            let used = dependency["name"].as_str().unwrap();
            if !workspace.contains(used) {
                continue;
            }
            let dev = dependency["kind"] == "dev";
            if used == "sless-testkit" {
                assert!(dev, "{name} uses the test helpers outside its tests");
                continue;
            }
            assert!(
                may_use.contains(&short(used)),
                "{name} uses {used}, which its row of docs/architecture.md does not allow ({may_use:?})"
            );
        }
    }
    assert!(table.len() >= workspace.len(), "{table:?}");
}
