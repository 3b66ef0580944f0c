//! OSCORE (RFC 8613) between mintgate and a stack no one here wrote:
//! aiocoap (PyPI, with its `oscore` extra, in target/py-venv; scripts/test.sh
//! installs it). aiocoap-client GETs and PUTs through `mintgate serve` with
//! `access.write = "oscore"`; `mintgate get/put --oscore` talks to
//! aiocoap-fileserver. Without aiocoap the tests are skipped, unless
//! MINTGATE_REQUIRE_PEERS is set: then they fail.

mod common;

use common::{output_text, Kill};

use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn venv_bin(name: &str) -> Option<PathBuf> {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/py-venv/bin");
    let ok = venv.join(name).exists()
        && Command::new(venv.join("python"))
            .args(["-c", "import aiocoap.oscore, cbor2, filelock"])
            .status()
            .is_ok_and(|s| s.success());
    if ok {
        return Some(venv.join(name));
    }
    assert!(
        std::env::var_os("MINTGATE_REQUIRE_PEERS").is_none(),
        "aiocoap[oscore] ({name}) is required (MINTGATE_REQUIRE_PEERS is set) but not in target/py-venv"
    );
    eprintln!("skipping: aiocoap[oscore] is not in target/py-venv");
    None
}

fn free_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mintgate-oscore-aio-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn mintgate(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mintgate"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("run mintgate")
}

fn run(cmd: &Path, args: &[&str]) -> Output {
    Command::new("timeout")
        .arg("30")
        .arg(cmd)
        .args(args)
        .output()
        .expect("run aiocoap-client")
}

/// Waits until `probe` answers (a plain GET with mintgate's client).
fn wait_for(uri: &str, child: &mut Child, log: &Path, d: &Path) {
    let end = Instant::now() + Duration::from_secs(20);
    while Instant::now() < end {
        let o = mintgate(&["get", uri, "--timeout", "1s"], d);
        if o.status.code() != Some(5) {
            return;
        }
        if let Ok(Some(s)) = child.try_wait() {
            panic!(
                "server exited ({s}): {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!(
        "no answer from {uri} in 20 s: {}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

const SECRET: &str = "1112131415161718191a1b1c1d1e1f20";

#[test]
fn aiocoap_client_gets_and_puts_through_mintgate_serve() {
    let Some(client) = venv_bin("aiocoap-client") else {
        return;
    };
    let d = dir("client");
    let port = free_port();
    std::fs::write(
        d.join("gw.toml"),
        format!(
            "[coap]\nbind = [\"127.0.0.1:{port}\"]\n[access]\nwrite = \"oscore\"\n\
             [oscore]\nstate = \"state\"\n\
             [[oscore.contexts]]\nname = \"aio\"\nmaster_secret_env = \"MG_TEST_OSCORE_SECRET\"\n\
             master_salt = \"9e7ca92223786340\"\nsender_id = \"01\"\nrecipient_id = \"0a\"\n"
        ),
    )
    .unwrap();
    std::fs::create_dir_all(d.join("ctx")).unwrap();
    std::fs::write(
        d.join("ctx/settings.json"),
        format!(
            "{{\"sender-id_hex\": \"0a\", \"recipient-id_hex\": \"01\", \
             \"secret_hex\": \"{SECRET}\", \"salt_hex\": \"9e7ca92223786340\"}}"
        ),
    )
    .unwrap();
    let creds = d.join("creds.json");
    std::fs::write(
        &creds,
        format!(
            "{{\"coap://127.0.0.1:{port}/*\": {{\"oscore\": {{\"basedir\": \"{}/\"}}}}}}",
            d.join("ctx").display()
        ),
    )
    .unwrap();
    let log = d.join("serve.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_mintgate"))
        .args(["serve", "-c", "gw.toml", "--threads", "2"])
        .env("MG_TEST_OSCORE_SECRET", SECRET)
        .current_dir(&d)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start mintgate serve");
    let uri = |p: &str| format!("coap://127.0.0.1:{port}/{p}");
    wait_for(&uri("request"), &mut child, &log, &d);
    let _server = Kill(child);
    let c = creds.to_str().unwrap();

    let o = run(&client, &["--credentials", c, &uri("request")]);
    assert!(o.status.success(), "{}", output_text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "hello world");

    let o = run(
        &client,
        &[
            "--credentials",
            c,
            "-m",
            "PUT",
            "--payload",
            "on",
            &uri("echo"),
        ],
    );
    assert!(o.status.success(), "protected PUT: {}", output_text(&o));
    let o = run(&client, &["--credentials", c, &uri("echo")]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "on",
        "{}",
        output_text(&o)
    );

    // the same PUT unprotected is refused by access.write = "oscore"
    let o = run(&client, &["-m", "PUT", "--payload", "off", &uri("echo")]);
    assert!(!o.status.success(), "{}", output_text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("4.01")
            || String::from_utf8_lossy(&o.stderr).contains("4.01"),
        "{}",
        output_text(&o)
    );

    let m = mintgate(&["get", &uri("request")], &d);
    assert!(m.status.success());
    let metrics = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!metrics.contains("panicked"), "{metrics}");
}

#[test]
fn mintgate_client_gets_and_puts_to_aiocoap_fileserver() {
    let Some(server) = venv_bin("aiocoap-fileserver") else {
        return;
    };
    let d = dir("server");
    let port = free_port();
    std::fs::create_dir_all(d.join("files")).unwrap();
    std::fs::create_dir_all(d.join("srv")).unwrap();
    std::fs::write(d.join("files/hello.txt"), "served by aiocoap\n").unwrap();
    std::fs::write(
        d.join("srv/settings.json"),
        format!("{{\"sender-id_hex\": \"01\", \"recipient-id_hex\": \"0b\", \"secret_hex\": \"{SECRET}\"}}"),
    )
    .unwrap();
    std::fs::write(
        d.join("creds.json"),
        format!(
            "{{\":mg\": {{\"oscore\": {{\"basedir\": \"{}/\"}}}}}}",
            d.join("srv").display()
        ),
    )
    .unwrap();
    std::fs::write(d.join("mg.hex"), format!("{SECRET}\n")).unwrap();
    std::fs::write(
        d.join("mg.toml"),
        "name = \"mg\"\nmaster_secret_file = \"mg.hex\"\nsender_id = \"0b\"\nrecipient_id = \"01\"\n",
    )
    .unwrap();
    // a context with the wrong secret: the server cannot verify it
    std::fs::write(d.join("bad.hex"), "00112233445566778899aabbccddeeff\n").unwrap();
    std::fs::write(
        d.join("bad.toml"),
        "master_secret_file = \"bad.hex\"\nsender_id = \"0b\"\nrecipient_id = \"01\"\n",
    )
    .unwrap();
    let log = d.join("fileserver.log");
    let mut child = Command::new(&server)
        .args([
            "--bind",
            &format!("127.0.0.1:{port}"),
            "--credentials",
            "creds.json",
            "--write",
            "files",
        ])
        .current_dir(&d)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start aiocoap-fileserver");
    let uri = |p: &str| format!("coap://127.0.0.1:{port}/{p}");
    wait_for(&uri("hello.txt"), &mut child, &log, &d);
    let _server = Kill(child);

    // mintgate's client verifies the answer: an unprotected one fails
    let o = mintgate(&["get", &uri("hello.txt"), "--oscore", "mg.toml"], &d);
    assert!(o.status.success(), "{}", output_text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "served by aiocoap\n");

    let o = mintgate(
        &[
            "put",
            &uri("new.txt"),
            "-e",
            "written by mintgate",
            "--oscore",
            "mg.toml",
        ],
        &d,
    );
    assert!(o.status.success(), "{}", output_text(&o));
    assert_eq!(
        std::fs::read_to_string(d.join("files/new.txt")).unwrap(),
        "written by mintgate"
    );
    // the sequence number went to its file before use
    let seq: u64 = std::fs::read_to_string(d.join("mg.seq"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(seq >= 2, "{seq}");

    let o = mintgate(&["get", &uri("hello.txt"), "--oscore", "bad.toml"], &d);
    assert!(
        !o.status.success(),
        "a wrong key was accepted: {}",
        output_text(&o)
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("refused the OSCORE request"),
        "{}",
        output_text(&o)
    );
}
