//! `mintgate bench`'s modes beyond plain UDP, each run for about a second:
//! `coap+tcp://` (one connection per client, RFC 8323) against `mintgate
//! serve` and against libcoap's `coap-server-notls` (Debian libcoap3-bin;
//! under MINTGATE_REQUIRE_PEERS a missing libcoap fails the test), and
//! `--oscore` (RFC 8613) against `mintgate serve` with one context per
//! client, plus a client whose key is wrong, whose answers must all count
//! as undecryptable.
#![cfg(feature = "labs")]

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{free_tcp, free_udp, output_text, tmp_dir, write_config, Kill, Serve};

const SECRET: &str = "1112131415161718191a1b1c1d1e1f20";
const SALT: &str = "9e7ca92223786340";

/// `mintgate bench ARGS --json` for 1 s (after 200 ms of warm-up): its
/// exit status and report.
fn bench(dir: &Path, args: &[&str]) -> (Option<i32>, serde_json::Value) {
    let o = Command::new(common::BIN)
        .arg("bench")
        .args(args)
        .args(["--duration", "1s", "--warmup", "200ms", "--json"])
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run mintgate bench");
    let report = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("bench printed no JSON ({e}): {}", output_text(&o)));
    (o.status.code(), report)
}

fn n(r: &serde_json::Value, key: &str) -> u64 {
    r[key].as_u64().unwrap_or_else(|| panic!("no {key} in {r}"))
}

/// Every request answered, with 2.xx, none lost.
fn assert_all_answered(code: Option<i32>, r: &serde_json::Value) {
    assert_eq!(code, Some(0), "{r}");
    assert!(n(r, "received") > 100, "{r}");
    assert_eq!(n(r, "received"), n(r, "sent"), "{r}");
    assert_eq!((n(r, "errors"), n(r, "lost")), (0, 0), "{r}");
    assert!(r["requests_per_sec"].as_f64().unwrap() > 0.0, "{r}");
}

/// A server `[[oscore.contexts]]` and the matching client file
/// `DIR/ctxI.toml` for client `i` (Sender IDs 0x10 + i, server's 0x80 + i).
fn oscore_context(dir: &Path, i: u8, secret_file: &str) -> String {
    std::fs::write(
        dir.join(format!("ctx{i}.toml")),
        format!(
            "name = \"bench{i}\"\nmaster_secret_file = \"{secret_file}\"\n\
             master_salt = \"{SALT}\"\nsender_id = \"{:02x}\"\nrecipient_id = \"{:02x}\"\n",
            0x10 + i,
            0x80 + i
        ),
    )
    .unwrap();
    // the server takes relative files from its working directory
    format!(
        "[[oscore.contexts]]\nname = \"bench{i}\"\nmaster_secret_file = \"{}\"\n\
         master_salt = \"{SALT}\"\nsender_id = \"{:02x}\"\nrecipient_id = \"{:02x}\"\n",
        dir.join("secret.hex").display(),
        0x80 + i,
        0x10 + i
    )
}

#[test]
fn bench_over_tcp_and_with_oscore_against_serve() {
    let dir = tmp_dir("bench-modes");
    std::fs::write(dir.join("secret.hex"), SECRET).unwrap();
    std::fs::write(dir.join("wrong.hex"), "2122232425262728292a2b2c2d2e2f30").unwrap();
    let tcp: SocketAddr = format!("127.0.0.1:{}", free_tcp()).parse().unwrap();
    let udp = free_udp();
    let mut contexts = String::new();
    for i in 0..3 {
        contexts += &oscore_context(&dir, i, "secret.hex");
    }
    // context 3 on the server, the client's copy with another Master Secret
    contexts += &oscore_context(&dir, 3, "wrong.hex");
    let cfg = write_config(
        &dir,
        udp,
        &format!(
            "tcp_bind = [\"{tcp}\"]\n[oscore]\nstate = \"{}\"\n{contexts}",
            dir.join("state").display()
        ),
    );
    let mut s = Serve::start(&cfg, &dir.join("serve.log"), &[]);
    s.wait_coap(
        format!("127.0.0.1:{udp}").parse().unwrap(),
        Duration::from_secs(15),
    );

    let (code, r) = bench(
        &dir,
        &[&format!("coap+tcp://{tcp}/request"), "--clients", "4"],
    );
    assert_all_answered(code, &r);
    assert_eq!(
        (r["transport"].as_str(), r["type"].as_str()),
        (Some("tcp"), Some("TCP"))
    );

    let uri = format!("coap://127.0.0.1:{udp}/request");
    let (code, r) = bench(
        &dir,
        &[
            "--oscore",
            "ctx0.toml,ctx1.toml,ctx2.toml",
            "--clients",
            "3",
            &uri,
        ],
    );
    assert_all_answered(code, &r);
    assert_eq!(n(&r, "oscore_contexts"), 3, "{r}");
    assert_eq!(n(&r, "undecryptable"), 0, "{r}");
    // the contexts' sequence numbers were reserved in their files
    for i in 0..3 {
        let seq = std::fs::read_to_string(dir.join(format!("bench{i}.seq"))).unwrap();
        assert!(
            seq.trim().parse::<u64>().unwrap() > 0,
            "bench{i}.seq: {seq:?}"
        );
    }

    // a wrong key: the server cannot decrypt and refuses unprotected,
    // which the bench must not take for an answer
    let (code, r) = bench(&dir, &["--oscore", "ctx3.toml", "--clients", "1", &uri]);
    assert_eq!(code, Some(3), "only errors: {r}");
    assert!(n(&r, "received") > 0, "{r}");
    assert_eq!(n(&r, "undecryptable"), n(&r, "received"), "{r}");
    assert_eq!(r["requests_per_sec"].as_f64(), Some(0.0), "{r}");

    // OSCORE is for coap:// only
    let o = Command::new(common::BIN)
        .args([
            "bench",
            "--oscore",
            "ctx0.toml",
            &format!("coap+tcp://{tcp}/request"),
        ])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(!o.status.success(), "{}", output_text(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_over_tcp_against_libcoap() {
    if !common::have_command("coap-server-notls", "Debian libcoap3-bin") {
        return;
    }
    let dir = tmp_dir("bench-libcoap");
    let port = free_tcp();
    let _srv = Kill(
        Command::new("coap-server-notls")
            .args(["-A", "127.0.0.1", "-p", &port.to_string(), "-d", "10"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start coap-server-notls"),
    );
    common::wait_tcp(port, Duration::from_secs(10));
    let uri = format!("coap+tcp://127.0.0.1:{port}/request");
    // libcoap makes /request on a PUT (-d 10 allows dynamic resources)
    let put = Command::new("coap-client-notls")
        .args(["-B", "5", "-m", "put", "-e", "hello world", &uri])
        .output()
        .expect("run coap-client-notls");
    assert!(put.status.success(), "{}", output_text(&put));
    let (code, r) = bench(&dir, &[&uri, "--clients", "4"]);
    assert_all_answered(code, &r);
    let _ = std::fs::remove_dir_all(&dir);
}
