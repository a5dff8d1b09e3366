//! The public docs speak to users: no README and no doc comment of a crate
//! refers to the project's own history (design seeds, issue numbers, the
//! design brief, the names of the prototypes it grew from), which mean
//! nothing to a reader on crates.io or docs.rs.

use std::fs;
use std::path::{Path, PathBuf};

use lease_testkit::workspace_root;

/// Words that only mean something inside the project's history.
const NAMES: &[&str] = &["halease", "sensorkit", "brief.md", "the brief", "seeds/"];
/// Words that are history when a number follows them (a seed or an issue
/// by its number).
const NUMBERED: &[&str] = &["seed ", "issue ", "issue #"];

/// Fails with every offending line of every README and doc comment.
pub fn check() -> Result<(), String> {
    let root = workspace_root();
    let mut found = Vec::new();
    for file in files(&root) {
        let Ok(text) = fs::read_to_string(&file) else {
            continue;
        };
        let is_rust = file.extension().is_some_and(|e| e == "rs");
        for (n, line) in text.lines().enumerate() {
            let trimmed = line.trim_start();
            let public = !is_rust || trimmed.starts_with("//!") || trimmed.starts_with("///");
            if public && refers_to_history(line) {
                let shown = file.strip_prefix(&root).unwrap_or(&file).display();
                found.push(format!("{shown}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    if found.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "public docs refer to the project's history (say what the thing does instead):\n{}",
            found.join("\n")
        ))
    }
}

fn refers_to_history(line: &str) -> bool {
    let lower = line.to_lowercase();
    NAMES.iter().any(|n| lower.contains(n))
        || NUMBERED.iter().any(|w| {
            lower.match_indices(w).any(|(i, _)| {
                lower[i + w.len()..]
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_digit())
            })
        })
}

/// The READMEs and Rust sources of the workspace's crates (not `target`, not
/// hidden directories, not tests: test code is not public documentation).
fn files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || name == "target" || name == "tests" {
                continue;
            }
            if path.is_dir() {
                dirs.push(path);
            } else if name == "README.md" || name.ends_with(".rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::refers_to_history;

    #[test]
    fn history_is_recognised_and_ordinary_words_are_not() {
        for history in [
            "as seed 003 asks",
            "see issue 9",
            "fixed in issue #12",
            "the halease protocol",
            "per the brief",
            "from ../shared/seeds/",
        ] {
            assert!(refers_to_history(history), "{history}");
        }
        for ordinary in [
            "the seed of the run's random choices",
            "an nkey seed",
            "this issue is known",
            "a brief pause",
        ] {
            assert!(!refers_to_history(ordinary), "{ordinary}");
        }
    }
}
