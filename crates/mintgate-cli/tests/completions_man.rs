//! `mintgate completions SHELL` and `mintgate man`: produced from the clap
//! definitions, they name the real subcommands and options.

mod common;

use common::*;

/// Subcommands every output must name (not the labs: they may be built
/// out with a cargo feature).
const SUBCOMMANDS: [&str; 6] = ["serve", "observe", "proxy", "get", "completions", "man"];

#[test]
fn completion_scripts_name_the_real_subcommands_and_options() {
    for (shell, marker) in [
        ("bash", "complete -F _mintgate"),
        ("zsh", "#compdef mintgate"),
        ("fish", "complete -c mintgate"),
        ("elvish", "edit:completion:arg-completer[mintgate]"),
        ("powershell", "Register-ArgumentCompleter"),
    ] {
        let out = mintgate(&["completions", shell]);
        assert!(out.status.success(), "{shell}: {out:?}");
        let s = String::from_utf8(out.stdout).unwrap();
        assert!(s.contains(marker), "{shell}: no {marker:?} in\n{s}");
        for sub in SUBCOMMANDS {
            assert!(s.contains(sub), "{shell}: no {sub}");
        }
        // options of serve
        for opt in ["print-config", "mqtt-broker", "stats-every"] {
            assert!(s.contains(opt), "{shell}: no --{opt}");
        }
    }
    // a shell it does not know is a usage error
    let out = mintgate(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

#[test]
fn bash_accepts_the_completion_script() {
    let out = mintgate(&["completions", "bash"]);
    assert!(out.status.success());
    let dir = tmp_dir("completions");
    let f = dir.join("mintgate.bash");
    std::fs::write(&f, &out.stdout).unwrap();
    // source it and ask what `mintgate se<TAB>` completes to
    let script = format!(
        "source {}; COMP_WORDS=(mintgate se); COMP_CWORD=1; _mintgate mintgate se mintgate; \
         printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        f.display()
    );
    let out = std::process::Command::new("bash")
        .args(["--norc", "-c", &script])
        .output()
        .expect("run bash");
    assert!(out.status.success(), "{out:?}");
    let words = String::from_utf8(out.stdout).unwrap();
    assert_eq!(words.trim(), "serve", "{words}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_man_page_lists_the_subcommands_and_man_dir_writes_one_per_command() {
    let out = mintgate(&["man"]);
    assert!(out.status.success(), "{out:?}");
    let page = String::from_utf8(out.stdout).unwrap();
    assert!(
        page.starts_with(".ie") || page.contains(".TH mintgate 1"),
        "{page}"
    );
    assert!(page.contains(".TH mintgate 1"), "{page}");
    assert!(page.contains(".SH SUBCOMMANDS"), "{page}");
    for sub in SUBCOMMANDS {
        assert!(
            page.contains(&format!("mintgate\\-{sub}(1)")),
            "no {sub} in\n{page}"
        );
    }
    let dir = tmp_dir("man");
    let out = mintgate(&["man", "--dir", dir.join("man1").to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    for name in [
        "mintgate.1",
        "mintgate-serve.1",
        "mintgate-observe.1",
        "mintgate-man.1",
    ] {
        let p = dir.join("man1").join(name);
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(text.contains(".SH NAME"), "{name}");
    }
    let serve = std::fs::read_to_string(dir.join("man1/mintgate-serve.1")).unwrap();
    assert!(serve.contains("print\\-config"), "{serve}");
    let _ = std::fs::remove_dir_all(&dir);
}
