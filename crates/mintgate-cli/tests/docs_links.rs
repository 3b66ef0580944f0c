//! The book cannot rot: every page in docs/ is reachable from
//! docs/SUMMARY.md (mdBook's table of contents), and every relative link in
//! README.md and docs/ resolves to a file or folder of the repository, and
//! its `#anchor`, when it has one into a Markdown page, to a heading of that
//! page (slugs as GitHub and mdBook make them). Links inside code are not
//! links; links with a scheme (`https:`) are not checked (no network).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// docs/ and everything under it that is Markdown, relative to the repo.
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, rel: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let (p, r) = (e.path(), rel.join(e.file_name()));
            if p.is_dir() {
                walk(&p, &r, out);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(r);
            }
        }
    }
    let mut v = Vec::new();
    walk(&repo().join("docs"), Path::new("docs"), &mut v);
    v.sort();
    v
}

/// The text outside fenced code blocks and inline code spans, with the
/// line numbers kept (code is blanked, not removed).
fn prose(md: &str) -> String {
    let mut out = String::with_capacity(md.len());
    let mut fenced = false;
    for line in md.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            out.push('\n');
            continue;
        }
        if !fenced {
            let mut in_code = false;
            for c in line.chars() {
                if c == '`' {
                    in_code = !in_code;
                }
                out.push(if in_code || c == '`' { ' ' } else { c });
            }
        }
        out.push('\n');
    }
    out
}

/// (line, target) of every inline link `[text](target)`.
fn links(md: &str) -> Vec<(usize, String)> {
    let text = prose(md);
    let mut v = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].trim();
            // `<a b.md>` may hold spaces; otherwise a title may follow.
            let target = match target.strip_prefix('<') {
                Some(t) => t.split('>').next().unwrap_or(""),
                None => target.split_whitespace().next().unwrap_or(""),
            };
            v.push((n + 1, target.to_owned()));
            rest = &after[end..];
        }
    }
    v
}

/// A heading's anchor as GitHub and mdBook make it: lower case, letters,
/// digits, `-` and `_` kept, spaces to `-`, the rest dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .flat_map(char::to_lowercase)
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Every anchor a page has: its headings' slugs, repeats numbered `-1`,
/// `-2` as GitHub does, and explicit `<a id="...">` / `id="..."` ones.
fn anchors(md: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in md.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            let s = slug(&line[hashes..]);
            let n = seen.entry(s.clone()).or_insert(0);
            out.insert(if *n == 0 {
                s.clone()
            } else {
                format!("{s}-{n}")
            });
            *n += 1;
        }
        let mut rest = line;
        while let Some(at) = rest.find("id=\"") {
            let after = &rest[at + 4..];
            if let Some(end) = after.find('"') {
                out.insert(after[..end].to_owned());
            }
            rest = after;
        }
    }
    out
}

/// `base/rel` with `.` and `..` resolved, relative to the repo.
fn resolve(base: &Path, rel: &str) -> PathBuf {
    let mut out = PathBuf::new();
    for c in base.join(rel).components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// Every broken link of `page` (relative to the repo), as messages.
fn broken_links(page: &Path) -> Vec<String> {
    let root = repo();
    let md = std::fs::read_to_string(root.join(page)).unwrap();
    let dir = page.parent().unwrap_or(Path::new(""));
    let mut bad = Vec::new();
    for (line, target) in links(&md) {
        if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (file, anchor) = match target.split_once('#') {
            Some((f, a)) => (f, Some(a)),
            None => (target.as_str(), None),
        };
        let path = if file.is_empty() {
            page.to_path_buf()
        } else {
            resolve(dir, file)
        };
        let where_ = format!("{}:{line}: ({target})", page.display());
        if !root.join(&path).exists() {
            bad.push(format!("{where_}: {} does not exist", path.display()));
            continue;
        }
        if let Some(a) = anchor {
            if path.extension().is_some_and(|x| x == "md") {
                let text = std::fs::read_to_string(root.join(&path)).unwrap();
                if !anchors(&text).contains(a) {
                    bad.push(format!("{where_}: {} has no heading #{a}", path.display()));
                }
            }
        }
    }
    bad
}

#[test]
fn every_relative_link_in_the_readme_and_the_book_resolves() {
    let mut all = vec![PathBuf::from("README.md")];
    all.extend(pages());
    assert!(all.len() >= 10, "{all:?}");
    let bad: Vec<String> = all.iter().flat_map(|p| broken_links(p)).collect();
    assert!(bad.is_empty(), "broken links:\n{}", bad.join("\n"));
}

#[test]
fn every_page_of_the_book_is_reachable_from_summary_md() {
    let summary = std::fs::read_to_string(repo().join("docs/SUMMARY.md")).unwrap();
    let listed: BTreeSet<PathBuf> = links(&summary)
        .into_iter()
        .map(|(_, t)| resolve(Path::new("docs"), t.split('#').next().unwrap_or("")))
        .collect();
    let unlisted: Vec<String> = pages()
        .into_iter()
        .filter(|p| p != Path::new("docs/SUMMARY.md") && !listed.contains(p))
        .map(|p| p.display().to_string())
        .collect();
    assert!(
        unlisted.is_empty(),
        "pages docs/SUMMARY.md does not list (add them to it): {unlisted:?}"
    );
}

#[test]
fn the_checker_finds_links_and_anchors_as_written() {
    let md = "# A `[x]` — b → c\n\n## Same\n## Same\n\n[one](a.md#s) `[no](code.md)`\n\
              ```sh\n[no](fence.md)\n```\n[two](<b c.md>) [three](https://x/y)\n";
    let got: Vec<String> = links(md).into_iter().map(|(_, t)| t).collect();
    assert_eq!(got, ["a.md#s", "b c.md", "https://x/y"]);
    let a = anchors(md);
    assert!(a.contains("a-x--b--c"), "{a:?}");
    assert!(a.contains("same") && a.contains("same-1"), "{a:?}");
    assert_eq!(
        resolve(Path::new("docs"), "../examples/x.toml"),
        PathBuf::from("examples/x.toml")
    );
}
