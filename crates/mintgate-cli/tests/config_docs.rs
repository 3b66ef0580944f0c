//! The configuration's documentation and examples cannot rot:
//! - every key `mintgate serve --print-config` prints (with the defaults and
//!   with each example file, which sets the keys that are absent by
//!   default) is documented in docs/config.md, in its own section;
//! - every example in examples/ loads and starts a gateway (on free
//!   loopback ports), and the systemd unit runs a command line that parses.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_mintgate");

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .parent()
        .unwrap()
}

fn examples() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(repo().join("examples"))
        .expect("examples/")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    v.sort();
    assert!(v.len() >= 3, "{v:?}");
    v
}

fn print_config(args: &[&str]) -> String {
    let out = Command::new(BIN)
        .arg("serve")
        .args(args)
        .arg("--print-config")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "serve {args:?} --print-config: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// (section, key path inside it) for every key in a TOML document; keys of
/// arrays of tables as `list[].name`.
fn keys(v: &toml::Value, section: &str, prefix: &str, out: &mut BTreeSet<(String, String)>) {
    match v {
        toml::Value::Table(t) => {
            for (k, v) in t {
                if section.is_empty() {
                    keys(v, k, "", out);
                    continue;
                }
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                out.insert((section.to_owned(), path.clone()));
                keys(v, section, &path, out);
            }
        }
        toml::Value::Array(a) => {
            for item in a.iter().filter(|i| i.is_table()) {
                keys(item, section, &format!("{prefix}[]"), out);
            }
        }
        _ => {}
    }
}

/// The text of `## `[section]`` up to the next `## `.
fn doc_section<'a>(doc: &'a str, section: &str) -> Option<&'a str> {
    let at = doc.find(&format!("\n## `[{section}]`"))? + 1;
    let rest = &doc[at..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |e| e + 3);
    Some(&rest[..end])
}

#[test]
fn every_printed_key_is_documented_in_its_section() {
    let doc = std::fs::read_to_string(repo().join("docs/config.md")).unwrap();
    let mut all = BTreeSet::new();
    let mut texts = vec![print_config(&[])];
    for e in examples() {
        texts.push(print_config(&["--config", e.to_str().unwrap()]));
    }
    for t in &texts {
        let v: toml::Value = toml::from_str(t).expect("--print-config prints TOML");
        keys(&v, "", "", &mut all);
    }
    // keys absent by default that the examples must set, so that they are checked too
    for k in [
        ("metrics", "bind"),
        ("proxy", "http"),
        ("proxy", "h3"),
        ("devices", "store"),
        ("coaps", "psk_identity"),
        ("coaps", "psk_key"),
        ("access", "write"),
    ] {
        assert!(
            all.contains(&(k.0.to_owned(), k.1.to_owned())),
            "no example sets {}.{}",
            k.0,
            k.1
        );
    }
    let mut missing = Vec::new();
    for (section, path) in &all {
        let Some(text) = doc_section(&doc, section) else {
            missing.push(format!("[{section}] (no section)"));
            continue;
        };
        let leaf = path.rsplit(['.', ']']).next().unwrap();
        // a key of the section: a table row of its own; a key inside a
        // list of tables (partitions, reverse, devices.list): named in the
        // section
        let row = format!("| `{leaf}`");
        let documented = if path.contains('.') && !path.starts_with("list[]") {
            text.contains(leaf)
        } else {
            text.contains(&row)
                || text.contains(&format!(", `{leaf}`"))
                || text.contains(&format!("`[[{section}.{leaf}]]`"))
        };
        if !documented {
            missing.push(format!("{section}.{path}"));
        }
    }
    assert!(
        missing.is_empty(),
        "keys that docs/config.md does not document: {missing:?}"
    );
    assert!(all.len() > 70, "only {} keys seen", all.len());
}

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn every_example_starts_a_gateway() {
    let work = std::env::temp_dir().join(format!("mintgate-examples-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    for e in examples() {
        let name = e.file_stem().unwrap().to_string_lossy().into_owned();
        let dir = work.join(&name);
        std::fs::create_dir_all(&dir).unwrap();
        // files the examples point at live under /tmp/mintgate-demo: here,
        // under this test's own folder
        let text = std::fs::read_to_string(&e)
            .unwrap()
            .replace("/tmp/mintgate-demo", dir.to_str().unwrap());
        std::fs::write(dir.join("relay"), "0\n").unwrap();
        let cfg = dir.join("config.toml");
        std::fs::write(&cfg, &text).unwrap();
        // a coaps listener too on a free port (it needs the example's keys)
        let coaps: &[&str] = if text.contains("[coaps]") {
            &["--coaps", "127.0.0.1:0"]
        } else {
            &[]
        };
        let mut p = Proc(
            Command::new(BIN)
                .current_dir(&dir)
                .args(["serve", "--config", cfg.to_str().unwrap()])
                .args(coaps)
                .args(["--coap", "127.0.0.1:0", "--http", "127.0.0.1:0"])
                .args(["--h3", "127.0.0.1:0", "--metrics", "127.0.0.1:0"])
                .args(["--log", "info", "--log-format", "json"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let stderr = p.0.stderr.take().unwrap();
        let end = Instant::now() + Duration::from_secs(15);
        let mut log = Vec::new();
        let mut up = false;
        for line in BufReader::new(stderr).lines() {
            let line = line.unwrap();
            if line.contains("mintgate serving CoAP") {
                up = true;
                break;
            }
            log.push(line);
            if Instant::now() > end {
                break;
            }
        }
        assert!(
            up,
            "examples/{name}.toml did not start:\n{}",
            log.join("\n")
        );
    }
    let _ = std::fs::remove_dir_all(&work);
}

#[test]
fn the_systemd_unit_runs_a_valid_command_line() {
    let unit = std::fs::read_to_string(repo().join("examples/mintgate.service")).unwrap();
    for s in [
        "[Unit]",
        "[Service]",
        "[Install]",
        "WantedBy=multi-user.target",
    ] {
        assert!(unit.contains(s), "{s}");
    }
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("ExecStart=");
    let mut argv: Vec<String> = exec.split_whitespace().map(str::to_owned).collect();
    assert!(
        argv[0].ends_with("/mintgate") && argv[1] == "serve",
        "{exec}"
    );
    // the same flags, with the config path pointed at the example it installs
    let at = argv.iter().position(|a| a == "--config").expect("--config") + 1;
    assert!(unit.contains(&format!("examples/gateway.toml {}", argv[at])));
    argv[at] = repo().join("examples/gateway.toml").display().to_string();
    let refs: Vec<&str> = argv[2..].iter().map(String::as_str).collect();
    print_config(&refs);
}

/// `serve --print-config` is the check before a deployment: sections that
/// only a later start (or a later `--http`) would have refused are refused
/// now, with exit 1 and the key named; a valid file passes.
#[test]
fn print_config_checks_every_section() {
    let dir = std::env::temp_dir().join(format!("mintgate-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases = [
        ("[proxy]\ncongestion = \"cubic\"\n", Some("proxy.congestion")),
        ("[proxy]\nnstart = 0\n", Some("proxy.nstart")),
        (
            "[proxy]\n[[proxy.reverse]]\nprefix = \"/x\"\ntarget = \"nota uri\"\n",
            Some("proxy.reverse"),
        ),
        ("[directpath]\npriority = 150\n", Some("directpath.priority")),
        (
            "[directpath]\nlinks = [\"temp0 -> actuator(nope)\"]\n",
            Some("directpath.links"),
        ),
        (
            "[directpath]\nlinks = [\"temp0 -> mqtt(a/b)\"]\n",
            Some("mqtt.enabled = true or --mqtt"),
        ),
        (
            "[[devices.list]]\nname = \"a\"\nkind = \"sim-actuator\"\nsignal = \"constant(1)\"\n",
            Some("devices.list"),
        ),
        (
            "[[devices.list]]\nname = \"s\"\nkind = \"sim-sensor\"\nsignal = \"constant(1)\"\nperiod = \"10us\"\n",
            Some("100us"),
        ),
        (
            "[mqtt]\nenabled = true\n[directpath]\nlinks = [\"temp0 -> mqtt(a/+)\"]\n",
            Some("mqtt(a/+)"),
        ),
        (
            "[directpath]\npriority = 99\nlinks = [\"temp0 | threshold(25, 23) -> actuator(led0)\"]\n",
            None,
        ),
        // an identity in the file takes its key from MINTGATE_PSK_KEY
        (
            "[coaps]\nbind = [\"127.0.0.1:0\"]\npsk_identity = \"gw\"\n",
            None,
        ),
    ];
    for (i, (text, want)) in cases.iter().enumerate() {
        let f = dir.join(format!("c{i}.toml"));
        std::fs::write(&f, text).unwrap();
        let out = Command::new(BIN)
            .args(["serve", "--config"])
            .arg(&f)
            .arg("--print-config")
            .env("MINTGATE_PSK_KEY", "from-the-environment")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        match want {
            Some(w) => {
                assert_eq!(out.status.code(), Some(1), "{text}: {err}");
                assert!(err.contains(w), "{text}: wanted `{w}` in: {err}");
            }
            None => assert!(out.status.success(), "{text}: {err}"),
        }
    }
    // without the variable, the same identity is an error that names it
    let f = dir.join("psk.toml");
    std::fs::write(&f, cases[cases.len() - 1].0).unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&f)
        .arg("--print-config")
        .env_remove("MINTGATE_PSK_KEY")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("MINTGATE_PSK_KEY"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A config error says its cause once (not "cause: cause").
#[test]
fn a_config_error_says_its_cause_once() {
    let out = Command::new(env!("CARGO_BIN_EXE_mintgate"))
        .args([
            "serve",
            "--print-config",
            "-c",
            "/nonexistent/mintgate.toml",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
}

#[test]
fn the_packaged_configuration_is_valid_and_keeps_admin_endpoints_on_loopback() {
    let deb = repo().join("crates/mintgate-cli/debian");
    let conf = deb.join("mintgate.toml");
    let v: toml::Value = toml::from_str(&print_config(&["--config", conf.to_str().unwrap()]))
        .expect("the printed configuration is TOML");
    // writes from loopback only: no write mode chosen, no remote admin
    assert!(v["access"].get("write").is_none(), "{v:?}");
    assert_eq!(v["access"]["admin_remote"].as_bool(), Some(false));
    assert_eq!(v["dashboard"]["allow_remote"].as_bool(), Some(false));
    assert_eq!(v["mqtt"]["enabled"].as_bool(), Some(false));
    for (section, key) in [("metrics", "bind"), ("proxy", "http")] {
        let a: std::net::SocketAddr = v[section][key].as_str().unwrap().parse().unwrap();
        assert!(a.ip().is_loopback(), "{section}.{key} = {a}");
    }
    // the unit starts the installed binary with that file, as notify
    let unit = std::fs::read_to_string(deb.join("mintgate.service")).unwrap();
    for s in [
        "Type=notify",
        "WatchdogSec=",
        "User=mintgate",
        "StateDirectory=mintgate",
        "ExecStart=/usr/bin/mintgate serve --config /etc/mintgate/mintgate.toml ",
        "WantedBy=multi-user.target",
    ] {
        assert!(unit.contains(s), "no {s} in the unit");
    }
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart=/usr/bin/mintgate serve "))
        .unwrap();
    let mut argv: Vec<&str> = exec.split_whitespace().collect();
    assert_eq!(argv[..2], ["--config", "/etc/mintgate/mintgate.toml"]);
    argv[1] = conf.to_str().unwrap();
    print_config(&argv);
}
