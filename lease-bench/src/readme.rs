//! The *Latest results* section of this crate's README, rewritten from a
//! full run's `results.md` so the published numbers are always a run's own
//! output, never retyped.

use std::path::Path;

const BEGIN: &str = "<!-- lease-bench results: begin";
const END: &str = "<!-- lease-bench results: end -->";

/// Replaces what lies between the README's result markers with `results`
/// (the run's markdown, its top-level title dropped: the section has one).
pub fn update(readme: &Path, results: &str) -> Result<(), String> {
    let text = std::fs::read_to_string(readme)
        .map_err(|e| format!("cannot read {}: {e}", readme.display()))?;
    let updated = splice(&text, results)
        .ok_or_else(|| format!("{} has no result markers to rewrite", readme.display()))?;
    std::fs::write(readme, updated).map_err(|e| format!("cannot write {}: {e}", readme.display()))
}

fn splice(text: &str, results: &str) -> Option<String> {
    let begin = text.find(BEGIN)?;
    let begin_end = begin + text[begin..].find('\n')? + 1;
    let end = begin_end + text[begin_end..].find(END)?;
    let body = results
        .strip_prefix("# lease-bench results\n")
        .unwrap_or(results)
        .trim();
    Some(format!("{}{}\n{}", &text[..begin_end], body, &text[end..]))
}

#[cfg(test)]
mod tests {
    use super::splice;

    #[test]
    fn replaces_only_between_the_markers() {
        let text = "intro\n<!-- lease-bench results: begin (x) -->\nold\nnumbers\n<!-- lease-bench results: end -->\nafter\n";
        let out = splice(text, "# lease-bench results\n\nnew | table\n").expect("markers");
        assert_eq!(
            out,
            "intro\n<!-- lease-bench results: begin (x) -->\nnew | table\n<!-- lease-bench results: end -->\nafter\n"
        );
        assert_eq!(splice("no markers", "x"), None);
        assert_eq!(
            splice("<!-- lease-bench results: begin -->\nno end", "x"),
            None
        );
    }
}
