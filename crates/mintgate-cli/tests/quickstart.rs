//! A newcomer's first ten minutes, as README.md's quick start writes them:
//! the block after the `quickstart` marker is read from the README and each
//! command is run as written, with the ports swapped for free ones (5683 for
//! the CoAP port, 8080 for the HTTP port) and `mintgate` for the binary
//! under test. `cargo install` is the build that made that binary (checked
//! to be there, not run). The MQTT step runs a second gateway with the
//! bridges (`serve --mqtt`, CoAP on 5684 swapped for a free port) and
//! `mintgate subscribe`; the embedded broker gets free ports through
//! `--mqtt-listen`/`--mqtt-listen5` and the subscriber its `--broker`, the
//! ports being the only change.
//!
//! Also here: `--log-format json` gives one JSON object per line, and every
//! subcommand's `--help` describes the command and each of its options.

use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_mintgate");

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .parent()
        .unwrap()
}

fn free_udp() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn free_tcp() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The quick start's commands (comments removed), each with whether it runs
/// in the background (`&`, trailing or between two commands of a line).
fn quickstart() -> Vec<(String, bool)> {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let at = readme
        .find("<!-- quickstart:")
        .expect("README.md has the quickstart marker");
    let block = &readme[at..];
    let start = block.find("```sh\n").expect("a sh block after the marker") + 6;
    let end = start + block[start..].find("```").unwrap();
    block[start..end]
        .lines()
        .map(|l| l.split("  #").next().unwrap().trim())
        .filter(|l| !l.is_empty())
        .flat_map(|l| {
            let parts: Vec<&str> = l.split(" & ").collect();
            let last = parts.len() - 1;
            parts
                .into_iter()
                .enumerate()
                .map(move |(i, c)| match c.trim().strip_suffix('&') {
                    Some(c) => (c.trim().to_owned(), true),
                    None => (c.trim().to_owned(), i < last),
                })
        })
        .collect()
}

/// Runs `argv` (bounded to 20 s) and returns its output.
fn run(argv: &[String]) -> Output {
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    let end = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > end {
            let _ = child.kill();
            panic!("{argv:?} ran over 20 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn temperature(text: &str, what: &str) -> f64 {
    let v: f64 = text
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{what}: `{text}` is not a number"));
    // sine(22, 3, 60s)
    assert!((18.9..=25.1).contains(&v), "{what}: {v}");
    v
}

#[test]
fn the_readme_quick_start_works_command_for_command() {
    let steps = quickstart();
    assert_eq!(steps.len(), 8, "{steps:?}");
    let curl_ok = Command::new("curl").arg("--version").output().is_ok();
    if !curl_ok {
        if std::env::var_os("MINTGATE_REQUIRE_PEERS").is_some() {
            panic!("curl is unavailable and MINTGATE_REQUIRE_PEERS is set");
        }
        eprintln!("skipping: curl is not installed (the quick start uses it)");
        return;
    }
    let (coap, coap2, http, mqtt) = (free_udp(), free_udp(), free_tcp(), free_tcp());
    let work = std::env::temp_dir().join(format!("mintgate-quickstart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let mut server: Option<Proc> = None;
    let mut mqtt_gateway: Option<Proc> = None;
    let mut ran = Vec::new();
    for (line, background) in &steps {
        let cmd = line
            .replace("coap://127.0.0.1/", &format!("coap://127.0.0.1:{coap}/"))
            .replace("127.0.0.1:5683", &format!("127.0.0.1:{coap}"))
            .replace("127.0.0.1:5684", &format!("127.0.0.1:{coap2}"))
            .replace("127.0.0.1:8080", &format!("127.0.0.1:{http}"));
        let mut argv: Vec<String> = cmd.split_whitespace().map(str::to_owned).collect();
        match argv[0].as_str() {
            "cargo" => {
                // the build that made the binary under test
                assert_eq!(argv[..3], ["cargo", "install", "--path"]);
                let manifest = repo().join(&argv[3]).join("Cargo.toml");
                let text = std::fs::read_to_string(&manifest).unwrap();
                assert!(
                    text.contains("name = \"mintgate\""),
                    "{}",
                    manifest.display()
                );
                continue;
            }
            "mintgate" => {
                argv[0] = BIN.to_owned();
                // The embedded broker's ports (1883, 1884 by default) and
                // where the subscriber looks for it: free ones instead.
                if argv[1] == "serve" && argv.iter().any(|a| a == "--mqtt") {
                    argv.extend([
                        "--mqtt-listen".into(),
                        format!("127.0.0.1:{mqtt}"),
                        "--mqtt-listen5".into(),
                        "127.0.0.1:0".into(),
                    ]);
                }
                if argv[1] == "subscribe" {
                    assert!(!line.contains("--broker"), "{line}");
                    argv.extend(["--broker".into(), format!("mqtt://127.0.0.1:{mqtt}")]);
                }
            }
            "curl" => argv.insert(1, "-sS".into()),
            other => panic!("unexpected command {other} in the quick start"),
        }
        if *background {
            assert_eq!(argv[1], "serve", "only servers run in the background");
            if !argv.iter().any(|a| a == "--coap") {
                argv.extend(["--coap".into(), format!("127.0.0.1:{coap}")]);
            }
            let (wait_port, slot) = if argv.iter().any(|a| a == "--mqtt") {
                (mqtt, &mut mqtt_gateway)
            } else {
                (http, &mut server)
            };
            let child = Command::new(&argv[0])
                .args(&argv[1..])
                .current_dir(&work)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let p = Proc(child);
            let end = Instant::now() + Duration::from_secs(10);
            while TcpStream::connect(("127.0.0.1", wait_port)).is_err() {
                assert!(Instant::now() < end, "`{line}` did not come up");
                std::thread::sleep(Duration::from_millis(50));
            }
            *slot = Some(p);
            ran.push(line.clone());
            continue;
        }
        assert!(server.is_some(), "`{line}` needs the server started first");
        let out = run(&argv);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "`{cmd}` failed: {}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        if line.starts_with("mintgate get") || line.contains("/hc/coap://") {
            temperature(&stdout, line);
        } else if line.starts_with("mintgate observe") {
            let values: Vec<f64> = stdout.lines().map(|l| temperature(l, line)).collect();
            assert_eq!(values.len(), 3, "{stdout}");
        } else if line.contains("/api/state") {
            let v: serde_json::Value = serde_json::from_str(&stdout).expect("JSON state");
            let temp0 = v["devices"]["list"]
                .as_array()
                .unwrap()
                .iter()
                .find(|d| d["name"] == "temp0")
                .expect("temp0 on the dashboard");
            temperature(&temp0["value"].to_string(), "dashboard temp0");
            assert!(v["pipeline"]["totals"]["handled"].as_u64().unwrap() >= 2);
            // and the page itself
            let page = run(&[
                "curl".into(),
                "-sS".into(),
                format!("http://127.0.0.1:{http}/"),
            ]);
            assert!(String::from_utf8_lossy(&page.stdout).contains("<title>mintgate dashboard"));
        } else if line.starts_with("mintgate subscribe") {
            // `PUBLISHER SEQ MSG`: three values of temp0 from the second
            // gateway, consecutive sequence numbers, in order.
            let lines: Vec<&str> = stdout.lines().collect();
            assert_eq!(lines.len(), 3, "{stdout}");
            let mut seqs = Vec::new();
            for l in &lines {
                let mut f = l.splitn(3, ' ');
                let (_, seq, msg) = (f.next(), f.next().unwrap(), f.next().unwrap());
                seqs.push(seq.parse::<u64>().unwrap());
                let v: serde_json::Value = serde_json::from_str(msg).expect("JSON value");
                assert_eq!(v["device"], "temp0", "{l}");
                temperature(&v["value"].to_string(), line);
            }
            assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
        } else {
            panic!("no check for `{line}`");
        }
        ran.push(line.clone());
    }
    assert_eq!(
        ran.len(),
        7,
        "serve, get, observe, dashboard, proxy, MQTT gateway, subscribe: {ran:?}"
    );
    drop(mqtt_gateway);
    drop(server);
    let _ = std::fs::remove_dir_all(&work);
}

#[test]
fn json_logs_are_one_object_per_line() {
    let coap = free_udp();
    let mut p = Proc(
        Command::new(BIN)
            .args(["serve", "--log-format", "json", "--coap"])
            .arg(format!("127.0.0.1:{coap}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stderr = p.0.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    // read until the "serving" line (bounded: the server logs it at start)
    let mut seen = 0;
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let line = lines.next().expect("a log line").unwrap();
        let v: serde_json::Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("not a JSON object ({e}): {line}"));
        assert!(
            v["timestamp"].is_string() && v["level"].is_string(),
            "{line}"
        );
        assert!(v["fields"]["message"].is_string(), "{line}");
        seen += 1;
        if v["fields"]["message"]
            .as_str()
            .unwrap()
            .contains("mintgate serving CoAP")
        {
            assert_eq!(v["level"], "INFO");
            assert_eq!(v["fields"]["pool"], "vta");
            break;
        }
        assert!(Instant::now() < end && seen < 50, "no start line");
    }
}

/// The subcommands, as `mintgate help` and `mintgate lab help` list them.
fn subcommands(prefix: &[&str]) -> Vec<Vec<String>> {
    let out = Command::new(BIN).args(prefix).arg("-h").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let Some(at) = text.find("Commands:\n") else {
        return vec![];
    };
    let mut found = Vec::new();
    for l in text[at + 10..].lines() {
        if !l.starts_with("  ") {
            break;
        }
        let name = l.split_whitespace().next().unwrap();
        if name == "help" {
            continue;
        }
        let mut path: Vec<String> = prefix.iter().map(|s| s.to_string()).collect();
        path.push(name.to_owned());
        let refs: Vec<&str> = path.iter().map(String::as_str).collect();
        let deeper = subcommands(&refs);
        found.push(path);
        found.extend(deeper);
    }
    found
}

#[test]
fn every_subcommand_help_describes_it_and_each_option() {
    let all = subcommands(&[]);
    for want in [
        "serve",
        "get",
        "observe",
        "bench",
        "lab",
        "proxy",
        "http",
        "subscribe",
    ] {
        assert!(all.iter().any(|p| p == &[want]), "{want} missing: {all:?}");
    }
    assert!(all.iter().any(|p| p == &["lab", "all"]), "{all:?}");
    let mut checked = 0;
    for path in &all {
        let out = Command::new(BIN).args(path).arg("--help").output().unwrap();
        assert!(out.status.success(), "{path:?} --help");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let about = text.lines().next().unwrap_or("");
        assert!(
            about.len() > 15 && !about.starts_with("Usage"),
            "{path:?} has no description: {text}"
        );
        // `--help` puts each entry's help on the lines under it, indented
        // deeper; an entry with no help has none.
        let lines: Vec<&str> = text.lines().collect();
        let mut in_list = false;
        for (i, l) in lines.iter().enumerate() {
            if *l == "Options:" || *l == "Arguments:" {
                in_list = true;
                continue;
            }
            if !l.is_empty() && !l.starts_with(' ') {
                in_list = false;
                continue;
            }
            let t = l.trim_start();
            let indent = l.len() - t.len();
            let entry =
                indent < 10 && (t.starts_with('-') || t.starts_with('<') || t.starts_with('['));
            if in_list && entry && !t.starts_with("-h, --help") && !t.starts_with("-V, --version") {
                checked += 1;
                let next = lines.get(i + 1).copied().unwrap_or("");
                assert!(
                    next.starts_with("          ") && next.trim().len() > 3,
                    "{path:?}: `{}` has no help text",
                    l.trim()
                );
            }
        }
    }
    assert!(checked > 150, "only {checked} options and arguments seen");
}
