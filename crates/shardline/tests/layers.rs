//! Layers import downward only: each module of the runtime names only the modules below it. The
//! order (bottom first): `clock`, `error` · `transport` (1) · `membership` (2) · `journal` (the
//! interface entities persist through) · `sharding` (3: regions, coordinators, shard hosts, the
//! `Entity` contract they host) · `entity` (4: the typed API) · `cluster` (the node that wires
//! them). Test-support modules (`drills`, conformance suites) may use anything.

use std::path::{Path, PathBuf};

const ORDER: &[&[&str]] =
    &[&["clock", "error"], &["transport"], &["membership"], &["journal"], &["sharding"], &["entity"], &["cluster"]];

/// Code lines of every `.rs` file under `path` (a file or a folder), comments left out.
fn code_lines(path: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut todo = vec![path.to_path_buf()];
    while let Some(p) = todo.pop() {
        if p.is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                todo.push(e.unwrap().path());
            }
        } else if p.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&p).unwrap();
            for line in text.lines() {
                let code = line.split("//").next().unwrap_or("");
                if !code.trim().is_empty() {
                    out.push((p.clone(), code.to_string()));
                }
            }
        }
    }
    out
}

/// Items the crate root re-exports, by the module they come from.
const ROOT: &[(&str, &str)] = &[
    ("Cluster", "cluster"),
    ("ClusterBuilder", "cluster"),
    ("Entities", "entity"),
    ("Entity", "entity"),
    ("EntityContext", "entity"),
    ("EntityHandle", "entity"),
    ("EntityRef", "entity"),
    ("EntitySettings", "entity"),
    ("EventSourced", "entity"),
    ("EventSourcedHandle", "entity"),
    ("EventSourcedSettings", "entity"),
    ("StrategyKind", "entity"),
    ("ClusterView", "membership"),
    ("Gossip", "membership"),
    ("GossipConfig", "membership"),
    ("MembershipProvider", "membership"),
    ("TransportConfig", "transport"),
];

fn level(name: &str) -> Option<usize> {
    let module = ROOT.iter().find(|(item, _)| *item == name).map_or(name, |(_, m)| *m);
    ORDER.iter().position(|l| l.contains(&module))
}

/// The names a use of `crate::` starts with: `crate::a::b` gives `a`, `crate::{A, b::C}` gives
/// `A` and `b`.
fn names(after: &str) -> Vec<String> {
    let ident = |s: &str| s.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
    match after.strip_prefix('{') {
        Some(list) => list.split('}').next().unwrap_or("").split(',').map(ident).collect(),
        None => vec![ident(after)],
    }
}

#[test]
fn no_module_imports_a_layer_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut wrong = Vec::new();
    for (i, layer) in ORDER.iter().enumerate() {
        for module in *layer {
            let dir = src.join(module);
            let path = if dir.is_dir() { dir } else { src.join(format!("{module}.rs")) };
            assert!(path.exists(), "{} is missing: update the layer list", path.display());
            for (file, line) in code_lines(&path) {
                if file.ends_with("conformance.rs") {
                    continue;
                }
                for used in line.split("crate::").skip(1) {
                    for name in names(used) {
                        if level(&name).is_some_and(|l| l > i) {
                            wrong.push(format!("{}: {module} uses crate::{name}: {}", file.display(), line.trim()));
                        }
                    }
                }
            }
        }
    }
    assert!(wrong.is_empty(), "imports of a layer above:\n{}", wrong.join("\n"));
}
