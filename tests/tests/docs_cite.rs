//! The documents may cite only what exists. README.md, docs/*.md and every
//! crate's `lib.rs` overview name files, tests and functions as evidence ("kept
//! by `storage/src/wal/`", "checked by `a_full_cluster_restart_keeps_all_state`");
//! a renamed or deleted one leaves a claim nobody can check. This test fails on
//! each such citation:
//!
//! - a **file path**: a code span (`` `…` ``) or a plain-text word that ends in
//!   a source or document extension, or a code span whose first folder is one
//!   of the repository's (`powerfs/`, `scripts/module-arrows`). It must exist
//!   relative to the repository root or to the citing document's folder, or, for
//!   a path given inside its crate (`edge/service.rs`, `wal/mod.rs`), as the end
//!   of a path in the repository; a bare file name (`main.rs`) must be some
//!   file's name. Absolute paths, routes, URLs, globs and placeholders
//!   (`<data_dir>/wal/*.wal`, `node-N.log`) are not repository paths and are
//!   skipped; so is what sits in fenced code blocks (shell sessions), but for
//!   the module maps below;
//! - a **test or function name**: a code span that is a snake_case identifier
//!   of four words or more (`reopened_store_equals_a_fresh_replay_of_its_log`),
//!   or a qualified function (`Schedule::hold`, `into_round()`). It must be a
//!   `fn` in the workspace's Rust sources or, failing that, a name the code
//!   uses outside comments (a configuration field, a metric name);
//! - a **module map**: a fenced block whose first line is a folder of the
//!   repository (`node/src/`) draws that folder as a tree. Every file and
//!   folder it draws must exist, and every file and folder two levels deep
//!   (but `mod.rs`) must be drawn, so the map shows what is on disk. The node's
//!   map also claims an order (each part uses only those below it), which the
//!   imports `scripts/module-arrows` prints must follow.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Extensions that make a word a file path.
const FILE_EXTENSIONS: [&str; 13] = [
    "rs", "md", "toml", "json", "yml", "yaml", "sh", "ts", "mjs", "py", "service", "lock", "html",
];

/// Folders never walked: build output, dependencies, git's own.
const SKIPPED_DIRS: [&str; 3] = [".git", "target", "node_modules"];

/// How deep a module map must draw its folder.
const MAP_DEPTH: usize = 2;

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the repository")
        .to_path_buf()
}

/// Every file and folder of the repository, as `/`-separated relative paths.
struct Tree {
    files: BTreeSet<String>,
    dirs: BTreeSet<String>,
}

impl Tree {
    fn walk(root: &Path) -> Self {
        let mut tree = Tree {
            files: BTreeSet::new(),
            dirs: BTreeSet::new(),
        };
        tree.walk_dir(root, "");
        tree
    }

    fn walk_dir(&mut self, dir: &Path, prefix: &str) {
        for entry in std::fs::read_dir(dir).expect("a repository folder is readable") {
            let entry = entry.expect("a folder entry is readable");
            let name = entry.file_name().to_string_lossy().into_owned();
            let rel = format!("{prefix}{name}");
            let kind = entry.file_type().expect("a file type");
            if kind.is_dir() {
                if SKIPPED_DIRS.contains(&name.as_str()) {
                    continue;
                }
                self.walk_dir(&entry.path(), &format!("{rel}/"));
                self.dirs.insert(rel);
            } else {
                self.files.insert(rel);
            }
        }
    }

    fn has(&self, rel: &str) -> bool {
        let rel = rel.trim_end_matches('/');
        self.files.contains(rel) || self.dirs.contains(rel)
    }

    fn has_top_level(&self, name: &str) -> bool {
        !name.is_empty() && self.has(name)
    }

    /// Whether `cited`, written in a document in folder `doc_dir`, names
    /// something in the repository (see the module docs for the rule).
    fn resolves(&self, cited: &str, doc_dir: &str) -> bool {
        let cited = cited.trim_end_matches('/');
        if self.has(cited) || self.has(&join(doc_dir, cited)) {
            return true;
        }
        let all = || self.files.iter().chain(&self.dirs);
        if cited.contains('/') {
            let suffix = format!("/{cited}");
            all().any(|path| path.ends_with(&suffix))
        } else {
            all().any(|path| path.rsplit('/').next() == Some(cited))
        }
    }

    fn rust_files(&self) -> impl Iterator<Item = &String> {
        self.files.iter().filter(|path| path.ends_with(".rs"))
    }
}

fn join(dir: &str, rel: &str) -> String {
    if dir.is_empty() {
        rel.to_owned()
    } else {
        format!("{dir}/{rel}")
    }
}

/// One document: its path and the text to read (for a `lib.rs`, its `//!` lines).
struct Doc {
    path: String,
    text: String,
}

impl Doc {
    fn dir(&self) -> &str {
        self.path.rsplit_once('/').map_or("", |(dir, _)| dir)
    }
}

fn documents(root: &Path, tree: &Tree) -> Vec<Doc> {
    let read = |rel: &str| std::fs::read_to_string(root.join(rel)).expect("a document");
    let mut docs = vec![Doc {
        path: "README.md".into(),
        text: read("README.md"),
    }];
    for path in &tree.files {
        let markdown =
            path.starts_with("docs/") && path.ends_with(".md") && !path[5..].contains('/');
        if markdown {
            docs.push(Doc {
                path: path.clone(),
                text: read(path),
            });
        }
        let depth = path.matches('/').count();
        if path.ends_with("/src/lib.rs") && depth == 2 {
            let source = read(path);
            let overview: Vec<&str> = source
                .lines()
                .filter_map(|line| line.trim_start().strip_prefix("//!"))
                .map(|line| line.strip_prefix(' ').unwrap_or(line))
                .collect();
            docs.push(Doc {
                path: path.clone(),
                text: overview.join("\n"),
            });
        }
    }
    docs
}

/// A document split into prose (fenced blocks blanked out) and its fenced blocks.
struct Parts {
    prose: String,
    fences: Vec<Vec<String>>,
}

fn split_fences(text: &str) -> Parts {
    let mut parts = Parts {
        prose: String::new(),
        fences: Vec::new(),
    };
    let mut fence: Option<Vec<String>> = None;
    for line in text.lines() {
        let marker = line.trim_start().starts_with("```");
        match (&mut fence, marker) {
            (None, true) => fence = Some(Vec::new()),
            (Some(_), true) => parts.fences.extend(fence.take()),
            (Some(lines), false) => lines.push(line.to_owned()),
            (None, false) => parts.prose.push_str(line),
        }
        parts.prose.push('\n');
    }
    parts
}

/// The code spans of prose (a span may wrap a line) and the prose around them.
fn code_spans(prose: &str) -> (Vec<String>, String) {
    let mut spans = Vec::new();
    let mut outside = String::new();
    let mut pieces = prose.split('`');
    outside.push_str(pieces.next().unwrap_or(""));
    while let Some(span) = pieces.next() {
        spans.push(span.split_whitespace().collect::<Vec<_>>().join(" "));
        outside.push(' ');
        outside.push_str(pieces.next().unwrap_or(""));
    }
    (spans, outside)
}

fn has_file_extension(word: &str) -> bool {
    let name = word.trim_end_matches('/').rsplit('/').next().unwrap_or("");
    name.rsplit_once('.')
        .is_some_and(|(stem, ext)| !stem.is_empty() && FILE_EXTENSIONS.contains(&ext))
}

/// The repository path a code span cites, if it is one.
fn cited_path<'a>(span: &'a str, tree: &Tree, doc_dir: &str) -> Option<&'a str> {
    let span = span.strip_prefix("./").unwrap_or(span);
    let not_a_path = |c: char| c.is_whitespace() || "*<>{}$…|:=#()[]'\"~,;!?@%".contains(c);
    if span.is_empty()
        || span.starts_with(['/', '-'])
        || span.contains("..")
        || span.contains(not_a_path)
    {
        return None;
    }
    if span
        .split('/')
        .any(|part| part.is_empty() && !span.ends_with('/'))
    {
        return None;
    }
    let first = span.split('/').next().unwrap_or("");
    let in_repo_folder =
        span.contains('/') && (tree.has_top_level(first) || tree.has(&join(doc_dir, first)));
    (has_file_extension(span) || in_repo_folder).then_some(span)
}

/// Words of plain prose that cite a file: `docs/operations.md`, `protocol.md#x`.
fn prose_paths(outside: &str) -> Vec<String> {
    outside
        .split(|c: char| !(c.is_ascii_alphanumeric() || "_./-".contains(c)))
        .map(|word| word.trim_end_matches('.'))
        .filter(|word| !word.starts_with(['/', '.', '-']))
        .filter(|word| has_file_extension(word) && (word.contains('/') || word.ends_with(".md")))
        .map(str::to_owned)
        .collect()
}

fn is_snake_identifier(word: &str) -> bool {
    word.starts_with(|c: char| c.is_ascii_lowercase())
        && word
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// The function or test a code span cites, if it is one.
fn cited_name(span: &str) -> Option<&str> {
    if let Some(called) = span.strip_suffix("()") {
        return is_snake_identifier(called).then_some(called);
    }
    if let Some((path, last)) = span.rsplit_once("::") {
        let path_ok = path
            .split("::")
            .all(|part| part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
        return (path_ok && is_snake_identifier(last)).then_some(last);
    }
    (is_snake_identifier(span) && span.matches('_').count() >= 3).then_some(span)
}

/// The names Rust code defines as `fn`, and every word it uses outside
/// comments (fields, string contents such as metric names).
struct CodeNames {
    functions: BTreeSet<String>,
    words: BTreeSet<String>,
}

impl CodeNames {
    fn read(root: &Path, tree: &Tree) -> Self {
        let mut names = CodeNames {
            functions: BTreeSet::new(),
            words: BTreeSet::new(),
        };
        for path in tree.rust_files() {
            let Ok(source) = std::fs::read_to_string(root.join(path)) else {
                continue;
            };
            let code = strip_comments(&source);
            let words: Vec<&str> = code
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|word| !word.is_empty())
                .collect();
            for pair in words.windows(2) {
                if pair[0] == "fn" {
                    names.functions.insert(pair[1].to_owned());
                }
            }
            names.words.extend(words.into_iter().map(str::to_owned));
        }
        names
    }

    fn knows(&self, name: &str) -> bool {
        self.functions.contains(name) || self.words.contains(name)
    }
}

/// Rust source without its comments. Strings and character literals are
/// kept whole, so a `"/raft/*"` does not open a comment.
fn strip_comments(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut chars = source.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek()) {
            ('/', Some('/')) => {
                chars.by_ref().take_while(|&c| c != '\n').for_each(drop);
                out.push('\n');
            }
            ('/', Some('*')) => {
                let mut last = ' ';
                for c in chars.by_ref() {
                    if last == '*' && c == '/' {
                        break;
                    }
                    last = c;
                }
                out.push(' ');
            }
            ('"', _) => {
                out.push(c);
                while let Some(c) = chars.next() {
                    out.push(c);
                    match c {
                        '\\' => out.extend(chars.next()),
                        '"' => break,
                        _ => {}
                    }
                }
            }
            ('\'', Some(&next)) => {
                // A character literal ('x', '\n', '"'), or a lifetime ('a).
                out.push(c);
                let literal: String = chars.clone().take(4).collect();
                let len = if next == '\\' {
                    literal.find('\'').map(|end| end + 1)
                } else {
                    (literal.chars().nth(1) == Some('\'')).then_some(2)
                };
                for _ in 0..len.unwrap_or(0) {
                    out.extend(chars.next());
                }
            }
            _ => out.push(c),
        }
    }
    out
}

/// The paths a module map draws, relative to the repository, and its folder.
fn map_entries(fence: &[String], tree: &Tree) -> Option<(String, Vec<String>)> {
    let base = fence.first()?.trim();
    if !base.ends_with('/') || base.contains(' ') || !tree.has(base) {
        return None;
    }
    let mut stack: Vec<String> = Vec::new();
    let mut entries = Vec::new();
    for line in &fence[1..] {
        let Some(branch) = line.find(['├', '└']) else {
            continue;
        };
        let depth = line[..branch].chars().count() / 4;
        let after = line[branch..].trim_start_matches(['├', '└', '─', ' ']);
        let names = after.split("  ").next().unwrap_or("");
        stack.truncate(depth);
        for name in names.split(", ").map(str::trim) {
            entries.push(format!("{base}{}{name}", stack.concat()));
        }
        if let Some(folder) = names.strip_suffix('/').filter(|_| !names.contains(", ")) {
            stack.push(format!("{folder}/"));
        }
    }
    Some((base.to_owned(), entries))
}

/// Files and folders at most `MAP_DEPTH` levels below `base` that a map must draw.
fn expected_map_entries(base: &str, tree: &Tree) -> Vec<String> {
    let under = |path: &String| -> Option<String> {
        let rest = path.strip_prefix(base)?;
        let shallow = rest.matches('/').count() < MAP_DEPTH && !rest.ends_with("mod.rs");
        shallow.then(|| rest.to_owned())
    };
    let files = tree.files.iter().filter_map(under);
    let dirs = tree
        .dirs
        .iter()
        .filter_map(under)
        .map(|dir| format!("{dir}/"));
    files
        .chain(dirs)
        .map(|rest| format!("{base}{rest}"))
        .collect()
}

/// What `doc` cites that the repository lacks, one line each.
fn missing_citations(doc: &Doc, tree: &Tree, code: &CodeNames) -> Vec<String> {
    let parts = split_fences(&doc.text);
    let (spans, outside) = code_spans(&parts.prose);
    let paths = spans
        .iter()
        .filter_map(|span| cited_path(span, tree, doc.dir()))
        .map(str::to_owned)
        .chain(prose_paths(&outside))
        .filter(|path| !tree.resolves(path, doc.dir()))
        .map(|path| format!("file `{path}`"));
    let names = spans
        .iter()
        .filter_map(|span| cited_name(span))
        .filter(|name| !code.knows(name))
        .map(|name| format!("test or function `{name}`"));
    let maps = parts
        .fences
        .iter()
        .filter_map(|fence| map_entries(fence, tree))
        .flat_map(|(base, drawn)| map_errors(&base, &drawn, tree));
    paths
        .chain(names)
        .chain(maps)
        .map(|what| format!("{}: {what}", doc.path))
        .collect()
}

/// Where a map of `base` draws what is not there, or leaves out what is.
fn map_errors(base: &str, drawn: &[String], tree: &Tree) -> Vec<String> {
    let absent = drawn
        .iter()
        .filter(|entry| !tree.has(entry))
        .map(|entry| format!("map of {base} draws `{entry}`"));
    let same = |a: &str, b: &str| a.trim_end_matches('/') == b.trim_end_matches('/');
    let left_out = expected_map_entries(base, tree)
        .into_iter()
        .filter(|entry| !drawn.iter().any(|d| same(d, entry)))
        .map(|entry| format!("map of {base} lacks `{entry}`"));
    absent.chain(left_out).collect()
}

#[test]
fn every_path_test_and_module_the_docs_cite_exists() {
    let root = repository();
    let tree = Tree::walk(&root);
    let code = CodeNames::read(&root, &tree);
    let mut missing: Vec<String> = documents(&root, &tree)
        .iter()
        .flat_map(|doc| missing_citations(doc, &tree, &code))
        .collect();
    missing.sort();
    missing.dedup();
    assert!(
        missing.is_empty(),
        "the docs cite {} thing(s) the repository does not have:\n{}",
        missing.len(),
        missing.join("\n")
    );
}

/// The rule must see what it is meant to see, and nothing else.
#[test]
fn the_citation_rules_tell_paths_and_names_from_other_words() {
    let root = repository();
    let tree = Tree::walk(&root);
    let path = |span| cited_path(span, &tree, "docs");
    assert_eq!(
        path("node/src/leader/rounds.rs"),
        Some("node/src/leader/rounds.rs")
    );
    assert_eq!(path("powerfs/"), Some("powerfs/"));
    assert_eq!(path("scripts/module-arrows"), Some("scripts/module-arrows"));
    assert_eq!(path("./test.sh"), Some("test.sh"));
    assert_eq!(path(".ci/run"), Some(".ci/run"));
    assert_eq!(path("edge/service.rs"), Some("edge/service.rs"));
    for not_a_path in [
        "<data_dir>/wal/*.wal",
        "node-N.log",
        "data/node-1",
        "/v1/semaphores/{key}",
        "http://127.0.0.1:7001",
        "/dev/fuse",
        "cargo test -p permitd-tests",
        "acct-*",
        ".powerfs-trash",
        "../docs",
    ] {
        assert_eq!(path(not_a_path), None, "{not_a_path}");
    }
    assert!(tree.resolves("edge/service.rs", "docs"));
    assert!(tree.resolves("protocol.md", "docs"));
    assert!(!tree.resolves("storage/tests/no_such_test.rs", "docs"));
    assert_eq!(
        prose_paths("see docs/operations.md, and [x](protocol.md#limits). Node.js"),
        ["docs/operations.md", "protocol.md"]
    );
    assert_eq!(
        cited_name("a_full_cluster_restart_keeps_all_state"),
        Some("a_full_cluster_restart_keeps_all_state")
    );
    assert_eq!(cited_name("Schedule::hold"), Some("hold"));
    assert_eq!(cited_name("into_round()"), Some("into_round"));
    assert_eq!(
        cited_name("max_pending_per_key"),
        Some("max_pending_per_key")
    );
    assert_eq!(cited_name("now_ms"), None);
    assert_eq!(cited_name("PERMITD_KEEP_DIRS"), None);
}

/// architecture.md says of its node map: "Each folder uses only the ones below
/// it in this list" (but `now_ms` of lib.rs). `scripts/module-arrows` draws
/// every import between the node's files; each must point down the map.
#[test]
fn the_node_map_lists_its_parts_in_the_order_their_imports_point() {
    let root = repository();
    let tree = Tree::walk(&root);
    let architecture = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let (base, drawn) = split_fences(&architecture)
        .fences
        .iter()
        .filter_map(|fence| map_entries(fence, &tree))
        .find(|(base, _)| base == "node/src/")
        .expect("architecture.md draws node/src/");
    let mut order: Vec<&str> = Vec::new();
    for entry in &drawn {
        let top = entry[base.len()..].split('/').next().unwrap_or("");
        if !order.contains(&top) {
            order.push(top);
        }
    }
    let output = std::process::Command::new("python3")
        .arg("scripts/module-arrows")
        .current_dir(&root)
        .output()
        .expect("python3 runs scripts/module-arrows");
    assert!(
        output.status.success(),
        "scripts/module-arrows found a cycle"
    );
    let arrows = String::from_utf8(output.stdout).unwrap();
    let mut upward = Vec::new();
    for arrow in arrows.lines().filter_map(|line| line.split_once(" -> ")) {
        let top = |file: &str| file.split('/').next().unwrap_or("").to_owned();
        let (from, to) = (top(arrow.0), top(arrow.1));
        if from == to || to == "lib.rs" {
            continue;
        }
        let place = |part: &str| order.iter().position(|drawn| *drawn == part);
        match (place(&from), place(&to)) {
            (Some(from), Some(to)) if from < to => {}
            _ => upward.push(format!("{} -> {}", arrow.0, arrow.1)),
        }
    }
    assert!(
        upward.is_empty(),
        "imports that do not point down architecture.md's node map ({order:?}):\n{}",
        upward.join("\n")
    );
}
