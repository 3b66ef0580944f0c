//! docs/commands.md is every command's `--help`, rendered from clap's
//! `Command` (the same definitions the program parses with), so the
//! reference and the program cannot drift. The test renders it again and
//! compares; after changing a command's help, regenerate it with
//!
//! ```sh
//! MINTGATE_BLESS=1 cargo test -p mintgate-cli --bin mintgate commands_md
//! ```
//!
//! A command that exists only with a cargo feature is listed in `GATED`:
//! its section says so. A build without that feature cannot render it (nor
//! the lists of its parents), so it checks every other section and leaves
//! those alone; such a build refuses to regenerate the file.

use clap::CommandFactory;

/// Commands that exist only with a cargo feature: (command path, feature).
/// Add a line here when a subcommand is put behind a feature, e.g.
/// `("mintgate lab", "labs")`.
const GATED: &[(&str, &str)] = &[("mintgate lab", "labs"), ("mintgate bench", "labs")];

const DOC: &str = "docs/commands.md";

type Gated = [(&'static str, &'static str)];

/// The feature `path` (or a command above it) needs, if any.
fn gate_of(gated: &Gated, path: &str) -> Option<(&'static str, &'static str)> {
    gated
        .iter()
        .copied()
        .find(|(p, _)| path == *p || path.starts_with(&format!("{p} ")))
}

/// Environment values would show in the help (`[env: MINTGATE_LOG=debug]`)
/// and make the rendering depend on who runs it.
fn hide_env_values(cmd: clap::Command) -> clap::Command {
    cmd.mut_args(|a| a.hide_env_values(true))
        .mut_subcommands(hide_env_values)
}

/// (command path, long help) for every command, depth first, in the order
/// the program lists them; clap's own `help` subcommands left out.
fn render(cmd: &mut clap::Command, path: String, out: &mut Vec<(String, String)>) {
    let help = cmd.render_long_help().to_string();
    let help: Vec<&str> = help.lines().map(str::trim_end).collect();
    out.push((path.clone(), help.join("\n").trim().to_owned()));
    for sub in cmd.get_subcommands_mut() {
        if sub.get_name() == "help" {
            continue;
        }
        let p = format!("{path} {}", sub.get_name());
        render(sub, p, out);
    }
}

fn anchor(path: &str) -> String {
    path.replace(' ', "-")
}

fn section(gated: &Gated, path: &str, help: &str) -> String {
    let mut s = format!("## `{path}`\n\n");
    if let Some((p, feature)) = gate_of(gated, path) {
        s.push_str(&format!(
            "Only in a build with the cargo feature `{feature}` (as `{p}` is).\n\n"
        ));
    }
    s.push_str("```text\n");
    s.push_str(help);
    s.push_str("\n```\n");
    s
}

fn document(gated: &Gated, sections: &[(String, String)]) -> String {
    let mut d = String::from(
        "# Command reference\n\n\
         Every command's `--help`, as the program prints it. This page is generated from the \
         program's own command definitions by a test (`help_doc.rs` in mintgate-cli), which fails \
         when the two differ; do not edit it by hand. After changing a command's help, regenerate \
         it with\n\n\
         ```sh\n\
         MINTGATE_BLESS=1 cargo test -p mintgate-cli --bin mintgate commands_md\n\
         ```\n\n\
         What each command is for, with examples, is in [commands in practice](cli-guide.md). \
         `-h` prints the short form of the same help.\n\n",
    );
    for (path, _) in sections {
        let depth = path.matches(' ').count();
        let indent = "  ".repeat(depth.saturating_sub(1));
        let gate = gate_of(gated, path)
            .map(|(_, f)| format!(" (feature `{f}`)"))
            .unwrap_or_default();
        if depth > 0 {
            d.push_str(&format!("{indent}- [`{path}`](#{}){gate}\n", anchor(path)));
        }
    }
    for (path, help) in sections {
        d.push('\n');
        d.push_str(&section(gated, path, help));
    }
    d
}

/// The document's sections as (heading path, whole section text).
fn split_sections(doc: &str) -> Vec<(String, String)> {
    let mut v = Vec::new();
    let mut rest = doc;
    while let Some(at) = rest.find("\n## `") {
        let body = &rest[at + 1..];
        let end = body[3..].find("\n## `").map_or(body.len(), |e| e + 3 + 1);
        let path = body[4..].split('`').next().unwrap_or("").to_owned();
        v.push((path, body[..end].to_owned()));
        rest = &body[end - 1..];
        if end == body.len() {
            break;
        }
    }
    v
}

fn repo_file(rel: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
}

/// A line-by-line account of where `want` and `got` part.
fn first_difference(want: &str, got: &str) -> String {
    let (w, g): (Vec<&str>, Vec<&str>) = (want.lines().collect(), got.lines().collect());
    let at = w.iter().zip(&g).take_while(|(a, b)| a == b).count();
    let show = |v: &[&str]| {
        v.iter()
            .skip(at)
            .take(6)
            .copied()
            .collect::<Vec<_>>()
            .join("\n")
    };
    format!(
        "first difference at line {}:\n--- {DOC} (committed)\n{}\n+++ rendered from the program\n{}",
        at + 1,
        show(&w),
        show(&g)
    )
}

/// The commands of this build, (path, help), as `--help` renders them.
fn this_build() -> Vec<(String, String)> {
    let mut cmd = hide_env_values(crate::Cli::command());
    cmd.build();
    let mut sections = Vec::new();
    render(&mut cmd, "mintgate".to_owned(), &mut sections);
    sections
}

const HOW: &str = "regenerate it with `MINTGATE_BLESS=1 cargo test -p mintgate-cli --bin mintgate \
                   commands_md` and commit docs/commands.md";

/// The commands `gated` names that this build lacks (their feature is off).
fn missing(gated: &Gated, sections: &[(String, String)]) -> Vec<&'static str> {
    gated
        .iter()
        .map(|(p, _)| *p)
        .filter(|p| !sections.iter().any(|(s, _)| s == p))
        .collect()
}

/// Whether `committed` is what this build renders: all of it with every
/// feature on; without a feature, every section this build renders except
/// the parents of the missing commands (their lists differ), and the
/// missing ones present and marked.
fn check(gated: &Gated, sections: &[(String, String)], committed: &str) -> Result<(), String> {
    let missing = missing(gated, sections);
    if missing.is_empty() {
        let rendered = document(gated, sections);
        return if committed == rendered {
            Ok(())
        } else {
            Err(format!(
                "{DOC} differs from the program's help; {HOW}.\n{}",
                first_difference(committed, &rendered)
            ))
        };
    }
    let doc = split_sections(committed);
    let parent_of_missing = |p: &str| missing.iter().any(|m| m.starts_with(&format!("{p} ")));
    for (p, help) in sections {
        if parent_of_missing(p) {
            continue;
        }
        let want = section(gated, p, help);
        let got = doc.iter().find(|(d, _)| d == p).map(|(_, s)| s.as_str());
        if got.map(str::trim_end) != Some(want.trim_end()) {
            return Err(format!(
                "{DOC}: the section of `{p}` differs from the program's help; {HOW}.\n{}",
                first_difference(got.unwrap_or(""), &want)
            ));
        }
    }
    for m in &missing {
        match doc.iter().find(|(d, _)| d == m) {
            Some((_, s)) if s.contains("Only in a build with the cargo feature") => {}
            Some(_) => return Err(format!("{DOC}: `{m}` is not marked as feature-gated")),
            None => return Err(format!("{DOC} has no section for the feature-gated `{m}`")),
        }
    }
    Ok(())
}

#[test]
fn commands_md_is_the_programs_help() {
    let sections = this_build();
    assert!(sections.len() > 10, "{} commands", sections.len());
    let path = repo_file(DOC);
    if std::env::var_os("MINTGATE_BLESS").is_some() {
        let missing = missing(GATED, &sections);
        assert!(
            missing.is_empty(),
            "{missing:?} not in this build: regenerate {DOC} with every feature on"
        );
        std::fs::write(&path, document(GATED, &sections)).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if let Err(e) = check(GATED, &sections, &committed) {
        panic!("{e}");
    }
}

#[test]
fn a_build_without_a_feature_checks_the_rest_and_keeps_the_gated_sections() {
    let s = |p: &str, h: &str| (p.to_owned(), h.to_owned());
    let gated: &Gated = &[("mintgate lab", "labs")];
    let full = vec![
        s("mintgate", "Commands: serve lab"),
        s("mintgate serve", "Run the gateway"),
        s("mintgate lab", "Labs"),
        s("mintgate lab vta", "Paper 000"),
    ];
    let doc = document(gated, &full);
    assert!(doc.contains("Only in a build with the cargo feature `labs`"));
    assert_eq!(check(gated, &full, &doc), Ok(()));
    // the same file, checked by a build without `labs`: its root lists fewer
    // commands, which is not held against it
    let lean = vec![
        s("mintgate", "Commands: serve"),
        s("mintgate serve", "Run the gateway"),
    ];
    assert_eq!(check(gated, &lean, &doc), Ok(()));
    // but a changed help of a command it has is
    let changed = vec![
        s("mintgate", "Commands: serve"),
        s("mintgate serve", "Run it"),
    ];
    assert!(check(gated, &changed, &doc).is_err());
    // and a gated section must be in the file, marked
    let unmarked = document(&[], &full);
    assert!(check(gated, &lean, &unmarked).is_err());
    let without = document(gated, &full[..2]);
    assert!(check(gated, &lean, &without).is_err());
    // with every feature on, the whole file must match
    assert!(check(gated, &full, &doc.replace("Paper 000", "Paper 001")).is_err());
}

#[test]
fn sections_split_back_into_the_commands_they_were_written_from() {
    let sections = vec![
        ("mintgate".to_owned(), "Usage: mintgate".to_owned()),
        ("mintgate lab".to_owned(), "Usage: mintgate lab".to_owned()),
        (
            "mintgate lab all".to_owned(),
            "x\n## not a heading".to_owned(),
        ),
    ];
    let split = split_sections(&document(&[], &sections));
    let paths: Vec<&str> = split.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(paths, ["mintgate", "mintgate lab", "mintgate lab all"]);
    for ((p, help), (_, s)) in sections.iter().zip(&split) {
        assert_eq!(s.trim_end(), section(&[], p, help).trim_end());
    }
}
