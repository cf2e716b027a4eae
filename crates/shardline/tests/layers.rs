//! Layers import downward only: each module of the runtime names only the modules below it. The
//! order (bottom first): `clock`, `error`, `format` (how stored records are versioned), `trace` ·
//! `transport` (1) · `membership` (2) · `journal` (the
//! interface entities persist through) · `sharding` (3: regions, coordinators, shard hosts, the
//! `Entity` contract they host) · `entity` (4: the typed API) · `cluster` (the node that wires
//! them). Test-support modules (`drills`, `golden`, conformance suites) may use anything.
//!
//! Every path a module names is checked, wherever it is written: whole `use` items (over several
//! lines, braces nested), and paths in code. `crate::` paths are absolute; `super::` and `self::`
//! paths are resolved from the module the code is in (a file's, or an inline `mod`'s within it).
//! An item the crate root re-exports counts as the module it is re-exported from.

use std::collections::BTreeMap;
use std::path::Path;

const ORDER: &[&[&str]] = &[
    &["clock", "driver", "error", "format", "ports", "sabotage", "trace"],
    &["transport"],
    &["membership"],
    &["journal"],
    &["sharding"],
    &["entity"],
    &["cluster"],
];

/// What the checker sees of Rust source: comments, literals, lifetimes and numbers left out.
#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    Sep,
    Punct(char),
}

/// The tokens of `src` that paths are made of.
fn tokens(src: &str) -> Vec<Tok> {
    let c: Vec<char> = src.chars().collect();
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && at(i + 1) == '*' {
            // Block comments nest.
            let mut depth = 0;
            loop {
                if at(i) == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if at(i) == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else if i >= c.len() {
                    break;
                } else {
                    i += 1;
                }
            }
        } else if ch == '"' {
            i = skip_string(&c, i);
        } else if ch == '\'' {
            if at(i + 1) == '\\' {
                // An escaped char literal: '\n', '\'', '\u{1F600}'.
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                // A lifetime or a label.
                i += 1;
                while at(i).is_alphanumeric() || at(i) == '_' {
                    i += 1;
                }
            }
        } else if ch.is_ascii_digit() {
            while at(i).is_alphanumeric() || at(i) == '_' || (at(i) == '.' && at(i + 1).is_ascii_digit()) {
                i += 1;
            }
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while at(i).is_alphanumeric() || at(i) == '_' {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            let raw_string = matches!(word.as_str(), "r" | "br" | "cr") && matches!(at(i), '"' | '#');
            if raw_string {
                let mut hashes = 0;
                while at(i) == '#' {
                    hashes += 1;
                    i += 1;
                }
                if at(i) != '"' {
                    // `r#ident`: a raw identifier.
                    let start = i;
                    while at(i).is_alphanumeric() || at(i) == '_' {
                        i += 1;
                    }
                    out.push(Tok::Ident(c[start..i].iter().collect()));
                    continue;
                }
                i += 1;
                loop {
                    if i >= c.len() {
                        break;
                    }
                    if c[i] == '"' && (1..=hashes).all(|k| at(i + k) == '#') {
                        i += 1 + hashes;
                        break;
                    }
                    i += 1;
                }
            } else if matches!(word.as_str(), "b" | "c") && at(i) == '"' {
                i = skip_string(&c, i);
            } else if word == "b" && at(i) == '\'' {
                i += 1;
                while i < c.len() && c[i] != '\'' {
                    i += if c[i] == '\\' { 2 } else { 1 };
                }
                i += 1;
            } else {
                out.push(Tok::Ident(word));
            }
        } else if ch == ':' && at(i + 1) == ':' {
            out.push(Tok::Sep);
            i += 2;
        } else {
            if !ch.is_whitespace() {
                out.push(Tok::Punct(ch));
            }
            i += 1;
        }
    }
    out
}

/// The index after the string literal opening at `i`.
fn skip_string(c: &[char], mut i: usize) -> usize {
    i += 1;
    while i < c.len() && c[i] != '"' {
        i += if c[i] == '\\' { 2 } else { 1 };
    }
    i + 1
}

/// The paths a `use` tree starting at `toks[*i]` imports, each with the name it binds (None for
/// a glob); `*i` ends after the tree.
fn use_tree(toks: &[Tok], i: &mut usize, prefix: &[String], out: &mut Vec<(Vec<String>, Option<String>)>) {
    let mut path = prefix.to_vec();
    if prefix.is_empty() && toks.get(*i) == Some(&Tok::Sep) {
        // `use ::name`: another crate.
        path.push("::".into());
        *i += 1;
    }
    loop {
        match toks.get(*i) {
            Some(Tok::Ident(name)) => {
                path.push(name.clone());
                *i += 1;
                if toks.get(*i) == Some(&Tok::Sep) {
                    *i += 1;
                    continue;
                }
                break;
            }
            Some(Tok::Punct('*')) => {
                *i += 1;
                out.push((path, None));
                return;
            }
            Some(Tok::Punct('{')) => {
                *i += 1;
                while *i < toks.len() && toks[*i] != Tok::Punct('}') {
                    use_tree(toks, i, &path, out);
                    if toks.get(*i) == Some(&Tok::Punct(',')) {
                        *i += 1;
                    }
                }
                *i += 1;
                return;
            }
            _ => break,
        }
    }
    // `a::b::{self}` imports `a::b`.
    if path.last().is_some_and(|s| s == "self") && path.len() > 1 {
        path.pop();
    }
    let mut name = path.last().cloned();
    if toks.get(*i) == Some(&Tok::Ident("as".into())) {
        if let Some(Tok::Ident(alias)) = toks.get(*i + 1) {
            name = Some(alias.clone());
        }
        *i += 2;
    }
    out.push((path, name));
}

/// Every path `src` names that starts at the crate root or at a module (`crate::`, `super::`,
/// `self::`, or any path of a `use` item), with the module of the code that names it and the
/// name a `use` binds (None elsewhere). `module` is the file's module.
#[allow(clippy::type_complexity)]
fn paths(module: &[String], src: &str) -> Vec<(Vec<String>, Vec<String>, Option<String>)> {
    let toks = tokens(src);
    let mut out = Vec::new();
    // Inline modules open here: their name and the brace depth inside them.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let here = |inline: &[(String, usize)]| -> Vec<String> {
        module.iter().cloned().chain(inline.iter().map(|(m, _)| m.clone())).collect()
    };
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            Tok::Ident(w) if w == "mod" => {
                if let (Some(Tok::Ident(name)), Some(Tok::Punct('{'))) = (toks.get(i + 1), toks.get(i + 2)) {
                    depth += 1;
                    inline.push((name.clone(), depth));
                    i += 3;
                    continue;
                }
            }
            Tok::Ident(w) if w == "use" => {
                let mut used = Vec::new();
                let mut j = i + 1;
                use_tree(&toks, &mut j, &[], &mut used);
                let at = here(&inline);
                out.extend(used.into_iter().map(|(p, name)| (at.clone(), p, name)));
                i = j;
                continue;
            }
            Tok::Ident(w) if matches!(w.as_str(), "crate" | "super" | "self") => {
                let after_dollar = i > 0 && toks[i - 1] == Tok::Punct('$');
                let in_path = i > 0 && toks[i - 1] == Tok::Sep;
                if toks.get(i + 1) == Some(&Tok::Sep) && !after_dollar && !in_path {
                    let mut p = vec![w.clone()];
                    let mut j = i + 1;
                    while toks.get(j) == Some(&Tok::Sep) {
                        match toks.get(j + 1) {
                            Some(Tok::Ident(s)) => {
                                p.push(s.clone());
                                j += 2;
                            }
                            _ => break,
                        }
                    }
                    out.push((here(&inline), p, None));
                    i = j;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// The absolute path (from the crate root) `path`, named in module `at`, stands for; None when
/// it is not in this crate (another crate, or a name relative to `at`, which stays inside it).
fn resolve(at: &[String], path: &[String]) -> Option<Result<Vec<String>, String>> {
    let first = path.first()?;
    match first.as_str() {
        "crate" => Some(Ok(path[1..].to_vec())),
        "self" => Some(Ok(at.iter().chain(&path[1..]).cloned().collect())),
        "super" => {
            let ups = path.iter().take_while(|s| *s == "super").count();
            if ups > at.len() {
                return Some(Err(format!("{} goes above the crate root", path.join("::"))));
            }
            Some(Ok(at[..at.len() - ups].iter().chain(&path[ups..]).cloned().collect()))
        }
        _ => None,
    }
}

fn level(module: &str) -> Option<usize> {
    ORDER.iter().position(|l| l.contains(&module))
}

/// Where what a layered module names lives: a top-level module of the crate, or (for a name the
/// crate root re-exports) the top-level module it is re-exported from.
enum Home {
    Module(String),
    /// Another crate's item, re-exported.
    Elsewhere,
}

/// Per name at the crate root: where it comes from.
fn root_names(modules: &[String], lib_rs: &str) -> BTreeMap<String, Home> {
    let mut names: BTreeMap<String, Home> = modules.iter().map(|m| (m.clone(), Home::Module(m.clone()))).collect();
    for (at, path, name) in paths(&[], lib_rs) {
        let (Some(name), true) = (name, at.is_empty()) else { continue };
        let path = match resolve(&[], &path) {
            Some(Ok(p)) => p,
            Some(Err(_)) => continue,
            None => path,
        };
        let home = match path.first() {
            Some(m) if modules.contains(m) => Home::Module(m.clone()),
            _ => Home::Elsewhere,
        };
        names.insert(name, home);
    }
    names
}

/// The imports of a layer above, in `files` (module path, name shown, source). `modules`: the
/// crate's top-level modules; `lib_rs`: the crate root's source.
fn violations(files: &[(Vec<String>, String, String)], modules: &[String], lib_rs: &str) -> Vec<String> {
    let roots = root_names(modules, lib_rs);
    let mut wrong = Vec::new();
    for (module, shown, src) in files {
        let Some(mine) = module.first().and_then(|m| level(m)) else { continue };
        // Conformance suites are test support.
        if module.iter().any(|m| m == "conformance") {
            continue;
        }
        for (at, path, _) in paths(module, src) {
            let abs = match resolve(&at, &path) {
                None => continue,
                Some(Err(e)) => {
                    wrong.push(format!("{shown}: {e}"));
                    continue;
                }
                Some(Ok(abs)) => abs,
            };
            let named = format!("{} (crate::{})", path.join("::"), abs.join("::"));
            let Some(first) = abs.first() else {
                wrong.push(format!("{shown}: {named} names the crate root, which holds every layer"));
                continue;
            };
            match roots.get(first) {
                Some(Home::Elsewhere) => {}
                Some(Home::Module(m)) => {
                    // A module outside the layers (test support) is above all of them.
                    if level(m).is_none_or(|l| l > mine) {
                        wrong.push(format!("{shown}: {} uses {named}, of {m}", at.join("::")));
                    }
                }
                None => wrong.push(format!("{shown}: {named}: not a module nor a re-export of the crate root")),
            }
        }
    }
    wrong
}

/// Import loops between the files of one layer: each loop as `a → b → … → a`. A file names
/// another when a path it writes resolves into it (the longest file module the path starts
/// with). A module and its own descendants are left out: a parent re-exports its children, and a
/// child reaches the parent's items through `super::`, and neither is a loop between concepts.
fn loops(files: &[(Vec<String>, String, String)]) -> Vec<String> {
    use std::collections::{BTreeMap, BTreeSet};
    let known: BTreeSet<Vec<String>> = files.iter().map(|(m, _, _)| m.clone()).collect();
    let file_of = |path: &[String]| -> Option<Vec<String>> {
        (1..=path.len()).rev().map(|n| path[..n].to_vec()).find(|p| known.contains(p))
    };
    let related = |a: &[String], b: &[String]| a.starts_with(b) || b.starts_with(a);
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (module, _, src) in files {
        let Some(layer) = module.first().filter(|m| level(m).is_some()) else { continue };
        if module.iter().any(|m| m == "conformance") {
            continue;
        }
        for (at, path, _) in paths(module, src) {
            let Some(Ok(abs)) = resolve(&at, &path) else { continue };
            let Some(to) = file_of(&abs) else { continue };
            if to.first() == Some(layer) && !related(module, &to) {
                edges.entry(module.clone()).or_default().insert(to);
            }
        }
    }
    // Every elementary loop, found once from its smallest module.
    let mut found = Vec::new();
    for start in edges.keys() {
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        while let Some((at, trail)) = stack.pop() {
            for next in edges.get(&at).into_iter().flatten() {
                if next == start {
                    let names: Vec<String> = trail.iter().chain([start]).map(|m| m.join("::")).collect();
                    found.push(names.join(" → "));
                } else if next > start && !trail.contains(next) {
                    let mut t = trail.clone();
                    t.push(next.clone());
                    stack.push((next.clone(), t));
                }
            }
        }
    }
    found.sort();
    found
}

#[test]
fn no_files_of_one_layer_import_each_other_in_a_loop() {
    let files = crate_files(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let found = loops(&files);
    assert!(found.is_empty(), "import loops inside a layer:\n{}", found.join("\n"));
}

#[test]
fn the_loop_finder_finds_a_loop_through_super_and_a_multi_line_use() {
    let file = |m: &[&str], src: &str| (m.iter().map(|s| s.to_string()).collect(), m.join("/"), src.to_string());
    let files = [
        file(&["sharding"], "pub mod entity; pub mod node; pub use entity::Entity;"),
        file(&["sharding", "entity"], "use super::node::Node;"),
        file(&["sharding", "node"], "use crate::{\n    sharding::{\n        message::Frame,\n    },\n};"),
        file(&["sharding", "message"], "fn f() -> crate::sharding::entity::Entity { todo!() }"),
        file(&["sharding", "region"], "use super::node::Node;"),
    ];
    assert_eq!(
        loops(&files),
        ["sharding::entity → sharding::node → sharding::message → sharding::entity"],
        "the parent's re-export is no loop, a one-way import is none"
    );
}

/// Every `.rs` file under `src`, with its module path.
fn crate_files(src: &Path) -> Vec<(Vec<String>, String, String)> {
    let mut out = Vec::new();
    let mut todo = vec![src.to_path_buf()];
    while let Some(p) = todo.pop() {
        if p.is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                todo.push(e.unwrap().path());
            }
        } else if p.extension().is_some_and(|e| e == "rs") {
            let rel = p.strip_prefix(src).unwrap();
            let mut module: Vec<String> = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
            let file = module.pop().unwrap();
            match file.as_str() {
                "mod.rs" | "lib.rs" => {}
                f => module.push(f.trim_end_matches(".rs").to_string()),
            }
            out.push((module, rel.display().to_string(), std::fs::read_to_string(&p).unwrap()));
        }
    }
    out.sort();
    out
}

#[test]
fn no_module_imports_a_layer_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for module in ORDER.iter().flat_map(|l| l.iter()) {
        let (dir, file) = (src.join(module), src.join(format!("{module}.rs")));
        assert!(dir.is_dir() || file.exists(), "{module} is missing: update the layer list");
    }
    let files = crate_files(&src);
    let mut modules: Vec<String> = files.iter().filter_map(|(m, _, _)| m.first().cloned()).collect();
    modules.dedup();
    let lib_rs = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let wrong = violations(&files, &modules, &lib_rs);
    assert!(wrong.is_empty(), "imports of a layer above:\n{}", wrong.join("\n"));
}

/// The checker itself: what it must catch, and what it must leave alone.
#[test]
fn the_checker_reads_whole_use_items_and_relative_paths() {
    let lib = "mod transport; mod cluster; mod sharding; mod error;\n\
               pub use cluster::{Cluster as Node, ClusterBuilder};\npub use error::Error;\npub use other::Thing;";
    let modules: Vec<String> = ["transport", "cluster", "sharding", "error"].map(String::from).to_vec();
    let file = |m: &[&str], src: &str| (m.iter().map(|s| s.to_string()).collect(), m.join("/"), src.to_string());
    let wrong = violations(
        &[
            file(
                &["transport", "wire"],
                "use crate::{\n    error::Error,\n    cluster::{\n        builder::X,\n    },\n};\n\
                 use super::super::sharding::region;\n\
                 fn f() -> crate::Node { let s = \"crate::cluster::Y\"; /* crate::cluster */ crate::Thing }\n\
                 #[cfg(test)]\nmod tests {\n    use super::super::super::cluster;\n    use super::*;\n}\n\
                 fn g() { self::h(); crate::error::Error::x(); $crate::cluster::Z }",
            ),
            file(
                &["transport"],
                "pub mod wire;\nuse self::wire::W;\nuse crate::{self as root};\nfn z() { super::super::x(); }",
            ),
            file(&["cluster"], "use crate::transport::{self, Link};\nuse super::sharding::R;"),
        ],
        &modules,
        lib,
    );
    let expected = [
        "transport/wire: transport::wire uses crate::cluster::builder::X (crate::cluster::builder::X), of cluster",
        "transport/wire: transport::wire uses super::super::sharding::region (crate::sharding::region), of sharding",
        "transport/wire: transport::wire uses crate::Node (crate::Node), of cluster",
        "transport/wire: transport::wire::tests uses super::super::super::cluster (crate::cluster), of cluster",
        "transport: crate (crate::) names the crate root, which holds every layer",
        "transport: super::super::x goes above the crate root",
    ];
    assert_eq!(wrong, expected, "found:\n{}", wrong.join("\n"));
}
