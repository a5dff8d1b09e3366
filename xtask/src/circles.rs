//! No import circles between a crate's modules.
//!
//! A crate whose modules use each other both ways (`backend` uses `cache`
//! and `cache` uses `backend`) has no reading order: neither module can be
//! understood, changed or tested without the other, and the pair tends to
//! grow into one module split across two files. Here every library and
//! binary crate of the workspace is read with `syn`, each top-level module's
//! references to the others (`use crate::…`, `crate::…` paths, `super::…`
//! from a nested module, and items re-exported by the crate root, counted
//! for the module that defines them) become the edges of a graph, and any
//! circle in it is an error naming the references that close it.
//!
//! The crate root is left out (it declares and re-exports every module), and
//! so are `#[cfg(test)]` items: a unit test may reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use lease_testkit::workspace_root;
use syn::visit::Visit;

/// Fails naming every import circle in the workspace's crates.
pub fn check() -> Result<(), String> {
    let root = workspace_root();
    let mut found = Vec::new();
    for krate in crates(&root)? {
        for circle in circles_in(&krate)? {
            let shown = krate.strip_prefix(&root).unwrap_or(&krate).display();
            found.push(format!("{shown}: {circle}"));
        }
    }
    if found.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "import circles between modules (move what both need into the lower module, or a module of its own):\n{}",
            found.join("\n")
        ))
    }
}

/// The `src` directories of the workspace's members.
fn crates(root: &Path) -> Result<Vec<PathBuf>, String> {
    let manifest = fs::read_to_string(root.join("Cargo.toml"))
        .map_err(|e| format!("circles: reading the workspace manifest: {e}"))?;
    let mut dirs = Vec::new();
    let mut in_members = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with("members") {
            in_members = true;
            continue;
        }
        if in_members {
            if line.starts_with(']') {
                break;
            }
            let name = line.trim_matches(|c| c == '"' || c == ',' || c == ' ');
            if !name.is_empty() && !name.starts_with('#') {
                dirs.push(root.join(name).join("src"));
            }
        }
    }
    Ok(dirs)
}

/// One reference from a module to another: where it stands.
type Edges = BTreeMap<(String, String), String>;

/// The circles among `src`'s top-level modules, each described by the
/// references that close it.
fn circles_in(src: &Path) -> Result<Vec<String>, String> {
    let root_file = ["lib.rs", "main.rs"]
        .iter()
        .map(|f| src.join(f))
        .find(|p| p.exists());
    let Some(root_file) = root_file else {
        return Ok(Vec::new());
    };
    let mut files = Vec::new();
    collect(src, &mut files);
    let mut modules = BTreeSet::new();
    for f in &files {
        if let Some(path) = module_path(src, f) {
            if let Some(top) = path.first() {
                modules.insert(top.clone());
            }
        }
    }
    let reexports = reexports(&root_file, &modules)?;
    let mut edges = Edges::new();
    for f in &files {
        let Some(path) = module_path(src, f) else {
            continue;
        };
        let Some(top) = path.first().cloned() else {
            continue;
        };
        let text = fs::read_to_string(f).map_err(|e| format!("circles: {}: {e}", f.display()))?;
        let file = syn::parse_file(&text).map_err(|e| format!("circles: {}: {e}", f.display()))?;
        let mut refs = Refs {
            here: path.clone(),
            found: Vec::new(),
        };
        refs.visit_file(&file);
        for (segments, line) in refs.found {
            let Some(first) = segments.first() else {
                continue;
            };
            let target = if modules.contains(first) {
                first.clone()
            } else if let Some(m) = reexports.get(first) {
                m.clone()
            } else {
                continue;
            };
            if target != top {
                let at = format!("{}:{line}", f.strip_prefix(src).unwrap_or(f).display());
                edges.entry((top.clone(), target)).or_insert(at);
            }
        }
    }
    Ok(describe(&edges))
}

/// Every `.rs` file below `dir`, except binaries of their own (`src/bin`).
fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n != "bin") {
                collect(&p, out);
            }
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// `src/a/b.rs` → `[a, b]`, `src/a/mod.rs` → `[a]`, the crate root → `[]`;
/// `None` for the crate root itself (its edges are not counted).
fn module_path(src: &Path, file: &Path) -> Option<Vec<String>> {
    let rel = file.strip_prefix(src).ok()?;
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|l| l == "mod") {
        parts.pop();
    }
    if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main") {
        return None;
    }
    Some(parts)
}

/// The names the crate root re-exports, each with the top-level module that
/// defines it (`pub use backend::{NatsBackend, Seen}` → both → `backend`).
fn reexports(root: &Path, modules: &BTreeSet<String>) -> Result<BTreeMap<String, String>, String> {
    let text = fs::read_to_string(root).map_err(|e| format!("circles: {}: {e}", root.display()))?;
    let file = syn::parse_file(&text).map_err(|e| format!("circles: {}: {e}", root.display()))?;
    let mut names = BTreeMap::new();
    for item in &file.items {
        if let syn::Item::Use(u) = item {
            let mut leaves = Vec::new();
            leaves_of(&u.tree, Vec::new(), &mut leaves);
            for (path, name) in leaves {
                let path: Vec<_> = path
                    .into_iter()
                    .skip_while(|s| s == "crate" || s == "self")
                    .collect();
                if let Some(first) = path.first() {
                    if modules.contains(first) {
                        names.insert(name, first.clone());
                    }
                }
            }
        }
    }
    Ok(names)
}

/// The (path, name) of every name a `use` tree brings in.
fn leaves_of(tree: &syn::UseTree, prefix: Vec<String>, out: &mut Vec<(Vec<String>, String)>) {
    match tree {
        syn::UseTree::Path(p) => {
            let mut prefix = prefix;
            prefix.push(p.ident.to_string());
            leaves_of(&p.tree, prefix, out);
        }
        syn::UseTree::Name(n) => out.push((prefix, n.ident.to_string())),
        syn::UseTree::Rename(r) => out.push((prefix, r.rename.to_string())),
        syn::UseTree::Glob(_) => {}
        syn::UseTree::Group(g) => {
            for t in &g.items {
                leaves_of(t, prefix.clone(), out);
            }
        }
    }
}

/// Collects a file's references to the crate's other modules.
struct Refs {
    /// The module path of the file being read.
    here: Vec<String>,
    /// Each reference: its path below the crate root, and its line.
    found: Vec<(Vec<String>, usize)>,
}

impl Refs {
    /// `segments` as written (`crate::a::b`, `super::x`, `self::y`),
    /// resolved to a path below the crate root, if it is one.
    fn push(&mut self, segments: &[String], line: usize) {
        let mut base: Vec<String> = match segments.first().map(String::as_str) {
            Some("crate") => Vec::new(),
            Some("super") | Some("self") => self.here.clone(),
            _ => return,
        };
        let mut rest = segments;
        if rest.first().is_some_and(|s| s == "crate") {
            rest = &rest[1..];
        }
        while let Some(s) = rest.first() {
            match s.as_str() {
                "super" => {
                    base.pop();
                }
                "self" => {}
                _ => break,
            }
            rest = &rest[1..];
        }
        base.extend(rest.iter().cloned());
        if !base.is_empty() {
            self.found.push((base, line));
        }
    }
}

/// `#[cfg(test)]`, `#[cfg(all(test, feature = "x"))]` and the like (a
/// `not(…)` anywhere makes it count as code).
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.meta.require_list().is_ok_and(|l| {
                let idents: Vec<String> = flatten(l.tokens.clone())
                    .into_iter()
                    .filter_map(|t| match t {
                        proc_macro2::TokenTree::Ident(i) => Some(i.to_string()),
                        _ => None,
                    })
                    .collect();
                idents.iter().any(|i| i == "test") && !idents.iter().any(|i| i == "not")
            })
    })
}

impl<'ast> Visit<'ast> for Refs {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs: &[syn::Attribute] = match item {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Use(u) => &u.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Struct(s) => &s.attrs,
            syn::Item::Enum(e) => &e.attrs,
            syn::Item::Const(c) => &c.attrs,
            syn::Item::Static(s) => &s.attrs,
            syn::Item::Trait(t) => &t.attrs,
            syn::Item::Type(t) => &t.attrs,
            syn::Item::Macro(m) => &m.attrs,
            _ => &[],
        };
        if is_test_only(attrs) {
            return;
        }
        syn::visit::visit_item(self, item);
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let mut leaves = Vec::new();
        leaves_of(&u.tree, Vec::new(), &mut leaves);
        let line = u.use_token.span.start().line;
        for (mut path, name) in leaves {
            path.push(name);
            self.push(&path, line);
        }
        // A glob (`use super::*`) brings in the parent's names: count the
        // parent itself.
        let mut globs = Vec::new();
        globs_of(&u.tree, Vec::new(), &mut globs);
        for path in globs {
            self.push(&path, line);
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if segments.len() > 1 {
            let line = p
                .segments
                .first()
                .map_or(0, |s| s.ident.span().start().line);
            self.push(&segments, line);
        }
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        // Macro arguments are tokens, not syntax: look for `crate :: name`.
        let tokens: Vec<proc_macro2::TokenTree> = flatten(m.tokens.clone());
        for w in tokens.windows(4) {
            if let (
                proc_macro2::TokenTree::Ident(c),
                proc_macro2::TokenTree::Punct(a),
                proc_macro2::TokenTree::Punct(b),
                proc_macro2::TokenTree::Ident(n),
            ) = (&w[0], &w[1], &w[2], &w[3])
            {
                if c == "crate" && a.as_char() == ':' && b.as_char() == ':' {
                    self.push(&["crate".into(), n.to_string()], c.span().start().line);
                }
            }
        }
        syn::visit::visit_macro(self, m);
    }
}

fn flatten(ts: proc_macro2::TokenStream) -> Vec<proc_macro2::TokenTree> {
    let mut out = Vec::new();
    for t in ts {
        match t {
            proc_macro2::TokenTree::Group(g) => out.extend(flatten(g.stream())),
            t => out.push(t),
        }
    }
    out
}

fn globs_of(tree: &syn::UseTree, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    match tree {
        syn::UseTree::Path(p) => {
            let mut prefix = prefix;
            prefix.push(p.ident.to_string());
            globs_of(&p.tree, prefix, out);
        }
        syn::UseTree::Glob(_) => out.push(prefix),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                globs_of(t, prefix.clone(), out);
            }
        }
        _ => {}
    }
}

/// Each circle of the graph (a strongly connected set of two or more
/// modules) as `a → b (at) → … → a`.
fn describe(edges: &Edges) -> Vec<String> {
    let mut graph: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges.keys() {
        graph.entry(a).or_default().push(b);
        graph.entry(b).or_default();
    }
    let mut out = Vec::new();
    for set in strongly_connected(&graph) {
        if set.len() < 2 {
            continue;
        }
        let members: BTreeSet<&str> = set.iter().copied().collect();
        let refs: Vec<String> = edges
            .iter()
            .filter(|((a, b), _)| members.contains(a.as_str()) && members.contains(b.as_str()))
            .map(|((a, b), at)| format!("{a} → {b} ({at})"))
            .collect();
        out.push(format!("{{{}}}: {}", set.join(", "), refs.join("; ")));
    }
    out
}

/// Tarjan's algorithm, iteratively over a small graph.
fn strongly_connected<'a>(graph: &BTreeMap<&'a str, Vec<&'a str>>) -> Vec<Vec<&'a str>> {
    struct State<'a> {
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<&'a str>>,
    }
    fn visit<'a>(v: &'a str, g: &BTreeMap<&'a str, Vec<&'a str>>, s: &mut State<'a>) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        for &w in g.get(v).map(Vec::as_slice).unwrap_or(&[]) {
            if !s.index.contains_key(w) {
                visit(w, g, s);
                let lw = s.low[w];
                let lv = s.low[v];
                s.low.insert(v, lv.min(lw));
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low[v];
                s.low.insert(v, lv.min(iw));
            }
        }
        if s.low[v] == s.index[v] {
            let mut set = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                set.push(w);
                if w == v {
                    break;
                }
            }
            set.sort_unstable();
            s.out.push(set);
        }
    }
    let mut s = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for &v in graph.keys() {
        if !s.index.contains_key(v) {
            visit(v, graph, &mut s);
        }
    }
    s.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn krate(files: &[(&str, &str)]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "xtask-circles-{}-{}",
            std::process::id(),
            files.len() * 1000 + files.iter().map(|(_, t)| t.len()).sum::<usize>()
        ));
        let _ = fs::remove_dir_all(&dir);
        for (name, text) in files {
            let p = dir.join(name);
            fs::create_dir_all(p.parent().expect("a parent")).expect("mkdir");
            fs::write(p, text).expect("write");
        }
        dir
    }

    #[test]
    fn a_circle_through_a_reexport_and_a_nested_module_is_found() {
        let src = krate(&[
            ("lib.rs", "mod a; mod b; mod c; pub use b::Thing;"),
            ("a.rs", "use crate::Thing; pub fn f() {}"),
            ("b.rs", "pub struct Thing; fn g() { crate::c::h(); }"),
            ("c/mod.rs", "mod inner; pub fn h() {}"),
            ("c/inner.rs", "use super::super::a::f;"),
        ]);
        let found = circles_in(&src).expect("reads");
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with("{a, b, c}"), "{found:?}");
        assert!(found[0].contains("c → a (c/inner.rs:1)"), "{found:?}");
    }

    #[test]
    fn one_way_references_and_test_only_ones_are_no_circle() {
        let src = krate(&[
            ("lib.rs", "mod a; mod b;"),
            (
                "a.rs",
                "use crate::b::X; fn f() { println!(\"{}\", crate::b::Y); }",
            ),
            (
                "b.rs",
                "pub struct X; pub const Y: u8 = 1;\n#[cfg(test)]\nmod tests { use crate::a; }\n#[cfg(all(test, feature = \"m\"))]\nmod more { use crate::a; }",
            ),
        ]);
        assert_eq!(circles_in(&src).expect("reads"), Vec::<String>::new());
    }
}
