//! The runtime crate stands apart from the platform, and neither it nor the controllers crate
//! has a circle of module imports: each module can be read, and changed, knowing only what it
//! imports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Each module of the crate whose sources are in `src` (`a`, or `a::b` for `src/a/b.rs`), and
/// the modules of the same crate its code outside tests names with `crate::`.
fn imports(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut modules = BTreeMap::new();
    let mut pending = vec![src.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("readable source directory") {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path
                .strip_prefix(src)
                .expect("under src")
                .with_extension("");
            let name = relative
                .to_string_lossy()
                .trim_end_matches("/mod")
                .replace('/', "::");
            if name == "lib" {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("readable source");
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            let mut named = BTreeSet::new();
            for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
                for (at, _) in line.match_indices("crate::") {
                    let path: String = line[at + "crate::".len()..]
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                        .collect();
                    let first = path.split("::").next().unwrap_or_default().to_owned();
                    named.insert(first);
                }
                // `use crate::{a, b::C}` names `a` and `b`.
                if let Some(list) = line.trim().strip_prefix("use crate::{") {
                    for item in list.trim_end_matches("};").split(',') {
                        let first = item.trim().split("::").next().unwrap_or_default();
                        named.insert(first.to_owned());
                    }
                }
            }
            modules.insert(name, named);
        }
    }
    let known: BTreeSet<String> = modules
        .keys()
        .map(|m| m.split("::").next().unwrap_or_default().to_owned())
        .collect();
    for (name, named) in &mut modules {
        let top = name.split("::").next().unwrap_or_default().to_owned();
        named.retain(|m| known.contains(m) && *m != top);
    }
    modules
}

/// A circle of imports among `modules` (by their top-level module), if there is one.
fn circle(modules: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (name, named) in modules {
        let top = name.split("::").next().unwrap_or_default().to_owned();
        graph.entry(top).or_default().extend(named.iter().cloned());
    }
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut found = path[at..].to_vec();
            found.push(node.to_owned());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, graph, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, &graph, &mut Vec::new(), &mut done))
}

#[test]
fn no_circle_of_imports_in_the_runtime_or_the_controllers() {
    for krate in ["kube-operator-runtime", "controllers"] {
        let modules = imports(&workspace().join("crates").join(krate).join("src"));
        assert!(modules.len() > 3, "{krate}: its modules are found");
        if let Some(found) = circle(&modules) {
            panic!("{krate}: a circle of imports: {}", found.join(" -> "));
        }
    }
}

#[test]
fn the_checker_finds_a_circle() {
    let modules = BTreeMap::from([
        ("a".to_owned(), BTreeSet::from(["b".to_owned()])),
        ("b".to_owned(), BTreeSet::from(["c".to_owned()])),
        ("c".to_owned(), BTreeSet::from(["a".to_owned()])),
    ]);
    assert_eq!(
        circle(&modules).map(|c| c.join(" -> ")),
        Some("a -> b -> c -> a".to_owned())
    );
}

#[test]
fn the_runtime_depends_on_no_crate_of_the_workspace() {
    let manifest =
        std::fs::read_to_string(workspace().join("crates/kube-operator-runtime/Cargo.toml"))
            .expect("the runtime's manifest");
    for ours in [
        "apis",
        "controllers",
        "codegen",
        "manager",
        "testkit",
        "localcluster",
        "ociimage",
        "imageref",
    ] {
        let named = manifest
            .lines()
            .any(|line| line.split(['=', ' ']).next() == Some(ours));
        assert!(!named, "the runtime depends on {ours}");
    }
}
