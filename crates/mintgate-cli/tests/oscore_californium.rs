//! OSCORE (RFC 8613) between mintgate and Eclipse Californium's cf-oscore,
//! a stack no one here wrote (peers/californium, built with Maven from
//! Maven Central by scripts/test.sh): Californium's client GETs and PUTs
//! through `mintgate serve` with `access.write = "oscore"`, and
//! `mintgate get/put --oscore` talks to Californium's OSCORE server.
//! Without java or the built jar the tests are skipped, unless
//! MINTGATE_REQUIRE_PEERS is set: then they fail.

mod common;

use common::{output_text, Kill};

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The peers' jar, when java and the jar are there.
fn jar() -> Option<PathBuf> {
    let jar =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../peers/californium/target/cf-hello.jar");
    let java = Command::new("java")
        .arg("-version")
        .output()
        .is_ok_and(|o| o.status.success());
    if java && jar.exists() {
        return Some(jar);
    }
    assert!(
        std::env::var_os("MINTGATE_REQUIRE_PEERS").is_none(),
        "Californium (java and peers/californium/target/cf-hello.jar: mvn -q -f peers/californium/pom.xml package) is required (MINTGATE_REQUIRE_PEERS is set)"
    );
    eprintln!("skipping: java or peers/californium/target/cf-hello.jar missing");
    None
}

fn mintgate(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mintgate"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("run mintgate")
}

const SECRET: &str = "0102030405060708090a0b0c0d0e0f10";
const SALT: &str = "9e7ca92223786340";

/// Californium's client, the `requests` in order from one process (see
/// `OscoreClient`): (code, text) of each answer, as it printed them.
fn cf_client(jar: &Path, base: &str, ctx: [&str; 4], requests: &[&str]) -> Vec<(String, String)> {
    let o = Command::new("timeout")
        .current_dir(std::env::temp_dir())
        .args(["60", "java", "-cp"])
        .arg(jar)
        .arg("mintgate.peer.OscoreClient")
        .arg(base)
        .args(ctx)
        .args(requests)
        .output()
        .expect("run java");
    assert!(o.status.success(), "{}", output_text(&o));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| {
            let (c, t) = l.split_once('\t').unwrap_or((l, ""));
            (c.to_owned(), t.to_owned())
        })
        .collect()
}

fn pair(c: &str, t: &str) -> (String, String) {
    (c.to_owned(), t.to_owned())
}

#[test]
fn californium_client_gets_and_puts_through_mintgate_serve() {
    let Some(jar) = jar() else {
        return;
    };
    let d = common::tmp_dir("oscore-cf-client");
    let port = common::free_udp();
    std::fs::write(
        d.join("gw.toml"),
        format!(
            "[coap]\nbind = [\"127.0.0.1:{port}\"]\n[access]\nwrite = \"oscore\"\n\
             [oscore]\nstate = \"state\"\n\
             [[oscore.contexts]]\nname = \"cf\"\nmaster_secret_env = \"MG_TEST_OSCORE_SECRET\"\n\
             master_salt = \"{SALT}\"\nsender_id = \"01\"\nrecipient_id = \"0a\"\n"
        ),
    )
    .unwrap();
    let log = d.join("serve.log");
    let child = Command::new(env!("CARGO_BIN_EXE_mintgate"))
        .args(["serve", "-c", "gw.toml", "--threads", "2"])
        .env("MG_TEST_OSCORE_SECRET", SECRET)
        .current_dir(&d)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start mintgate serve");
    let mut server = Kill(child);
    let uri = |p: &str| format!("coap://127.0.0.1:{port}/{p}");
    let end = Instant::now() + Duration::from_secs(20);
    while mintgate(&["get", &uri("request"), "--timeout", "1s"], &d)
        .status
        .code()
        == Some(5)
    {
        assert!(
            Instant::now() < end && server.0.try_wait().unwrap().is_none(),
            "serve did not come up: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // the client's sender id is the gateway's recipient id
    let ctx = [SECRET, SALT, "0a", "01"];
    let base = format!("coap://127.0.0.1:{port}");
    let got = cf_client(
        &jar,
        &base,
        ctx,
        &[
            "GET:request",
            "PUT:echo:on",
            "GET:echo",
            // unprotected, the same PUT is refused by access.write = "oscore"
            "plain-PUT:echo:off",
            "GET:echo",
        ],
    );
    assert_eq!(
        got,
        [
            pair("2.05", "hello world"),
            pair("2.04", ""),
            pair("2.05", "on"),
            pair("4.01", "writes need OSCORE protection"),
            pair("2.05", "on"),
        ],
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    // a second process starts its sequence numbers at 0 again: a replay
    let again = cf_client(&jar, &base, ctx, &["GET:request"]);
    assert_eq!(again[0].0, "4.01", "{again:?}");
    // a context with another secret: the gateway cannot verify it
    let wrong = ["00112233445566778899aabbccddeeff", SALT, "0a", "01"];
    let got = cf_client(&jar, &base, wrong, &["GET:request"]);
    assert_ne!(got[0].0, "2.05", "a wrong key was accepted: {got:?}");
    let l = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!l.contains("panicked"), "{l}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn mintgate_client_gets_and_puts_to_californium_oscore_server() {
    let Some(jar) = jar() else {
        return;
    };
    let d = common::tmp_dir("oscore-cf-server");
    let port = common::free_udp();
    let mut child = Command::new("java")
        .current_dir(&d)
        .arg("-cp")
        .arg(&jar)
        .arg("mintgate.peer.OscoreServer")
        .arg(port.to_string())
        // the server's sender id is the client's recipient id
        .args([SECRET, SALT, "01", "0b"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start Californium");
    let out = child.stdout.take().unwrap();
    let _server = Kill(child);
    let mut first = String::new();
    BufReader::new(out).read_line(&mut first).unwrap();
    assert_eq!(first.trim(), "ready");
    std::fs::write(d.join("mg.hex"), format!("{SECRET}\n")).unwrap();
    std::fs::write(
        d.join("mg.toml"),
        format!(
            "name = \"mg\"\nmaster_secret_file = \"mg.hex\"\nmaster_salt = \"{SALT}\"\nsender_id = \"0b\"\nrecipient_id = \"01\"\n"
        ),
    )
    .unwrap();
    let uri = format!("coap://127.0.0.1:{port}/secret");

    let o = mintgate(&["get", &uri, "--oscore", "mg.toml"], &d);
    assert!(o.status.success(), "{}", output_text(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim_end(),
        "californium says hi"
    );
    let o = mintgate(
        &["put", &uri, "-e", "from mintgate", "--oscore", "mg.toml"],
        &d,
    );
    assert!(o.status.success(), "{}", output_text(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim_end(),
        "got from mintgate"
    );
    // the resource takes protected requests only
    let o = mintgate(&["get", &uri], &d);
    assert!(!o.status.success(), "{}", output_text(&o));
    let _ = std::fs::remove_dir_all(&d);
}
