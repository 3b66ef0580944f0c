//! OSCORE through the HTTP proxy (RFC 8613 section 11): `mintgate http
//! --oscore` maps an HTTP request to CoAP, protects it and sends it as a
//! POST with the `OSCORE` header field; `mintgate serve`'s proxy forwards
//! it untouched to the gateway's CoAP endpoint, which verifies it, applies
//! `access.write = "oscore"`, and answers protected. The proxy holds no
//! key: a wrong key is refused by the gateway, and a plain HTTP write by
//! the proxy's write policy. With `[[proxy.oscore]]` the proxy is the
//! OSCORE client itself: plain HTTP requests go protected to that upstream.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{free_tcp, free_udp, http, tmp_dir, write_config, Serve, BIN};

const SECRET: &str = "0102030405060708090a0b0c0d0e0f10";

/// A client context file `DIR/NAME.toml` and the server's section for it.
fn context(dir: &Path, name: &str, secret_file: &str, kid: u8) -> String {
    std::fs::write(
        dir.join(format!("{name}.toml")),
        format!(
            "name = \"{name}\"\nmaster_secret_file = \"{secret_file}\"\n\
             sender_id = \"{kid:02x}\"\nrecipient_id = \"01\"\n"
        ),
    )
    .unwrap();
    format!(
        "[[oscore.contexts]]\nname = \"{name}\"\nmaster_secret_file = \"{}\"\n\
         sender_id = \"01\"\nrecipient_id = \"{kid:02x}\"\n",
        dir.join("secret.hex").display()
    )
}

/// `mintgate http ARGS`: exit code, stdout, stderr.
fn mintgate_http(dir: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let o = std::process::Command::new(BIN)
        .arg("http")
        .args(["--timeout", "10s"])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run mintgate http");
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn oscore_passes_the_http_proxy_end_to_end() {
    let dir = tmp_dir("oscore-http");
    std::fs::write(dir.join("secret.hex"), SECRET).unwrap();
    std::fs::write(dir.join("wrong.hex"), "f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff").unwrap();
    let coap = free_udp();
    let web = free_tcp();
    let mut contexts = context(&dir, "field", "secret.hex", 0x02);
    // the server knows kid 03 with the right secret; the client's copy is wrong
    contexts += &context(&dir, "thief", "wrong.hex", 0x03);
    let cfg = write_config(
        &dir,
        coap,
        &format!(
            "[proxy]\nhttp = \"127.0.0.1:{web}\"\n[access]\nwrite = \"oscore\"\n\
             [oscore]\nstate = \"{}\"\n{contexts}",
            dir.join("state").display()
        ),
    );
    let mut s = Serve::start(&cfg, &dir.join("serve.log"), &[]);
    s.wait_coap(
        format!("127.0.0.1:{coap}").parse().unwrap(),
        Duration::from_secs(15),
    );
    common::wait_tcp(web, Duration::from_secs(10));
    let url = |path: &str| format!("http://127.0.0.1:{web}/hc/coap://127.0.0.1:{coap}{path}");

    // a protected GET: the inner 2.05 comes back verified
    let (code, out, err) = mintgate_http(&dir, &["--oscore", "field.toml", &url("/request")]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.contains("hello world"), "{out}");
    assert!(err.contains("OSCORE answer verified"), "{err}");

    // a protected write is let through by the proxy and allowed by the
    // gateway's access.write = "oscore"; the value reads back protected
    let (code, out, err) = mintgate_http(
        &dir,
        &[
            "--oscore",
            "field.toml",
            "-X",
            "PUT",
            "-H",
            "Content-Type: text/plain",
            "-d",
            "1",
            &url("/actuators/led0"),
        ],
    );
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.starts_with("HTTP/1.1 204"),
        "the inner 2.04: {out}{err}"
    );
    let (_, out, err) = mintgate_http(&dir, &["--oscore", "field.toml", &url("/actuators/led0")]);
    assert!(
        out.lines().last().is_some_and(|l| l.trim() == "1"),
        "{out}{err}"
    );

    // the same write unprotected: refused by the proxy's write policy
    let (st, _, body) = http(
        web,
        "PUT",
        &format!("/hc/coap://127.0.0.1:{coap}/actuators/led0"),
        &[("Content-Type", "text/plain")],
        b"0",
    );
    assert_eq!(st, 401, "{body}");
    assert!(body.contains("OSCORE"), "{body}");

    // a wrong key: the gateway cannot verify and refuses unprotected
    let (code, out, err) = mintgate_http(&dir, &["--oscore", "thief.toml", &url("/request")]);
    assert_eq!(code, Some(3), "{out}{err}");
    assert!(out.contains("Decryption failed"), "{out}");
    assert!(err.contains("not OSCORE-protected"), "{err}");

    // a malformed OSCORE header field is the proxy's 400; a GET with one
    // too (OSCORE comes as POST)
    let hc = format!("/hc/coap://127.0.0.1:{coap}/");
    let (st, _, body) = http(web, "POST", &hc, &[("OSCORE", "C+U")], b"x");
    assert_eq!(st, 400, "{body}");
    assert!(body.contains("base64url"), "{body}");
    let (st, _, body) = http(web, "GET", &hc, &[("OSCORE", "CSU")], b"");
    assert_eq!(st, 400, "{body}");

    // a well-formed header the gateway cannot verify (no such kid)
    let (st, head, body) = http(
        web,
        "POST",
        &hc,
        &[("OSCORE", "CSU"), ("Content-Type", "application/oscore")],
        b"\x01\x02\x03\x04\x05\x06\x07\x08\x09",
    );
    assert_eq!(st, 403, "4.01 from the gateway maps to 403: {head}{body}");
    assert!(body.contains("Security context not found"), "{body}");
    s.terminate(Duration::from_secs(10));
}

/// A `mintgate proxy` child (killed on drop) whose `[proxy]` is `section`.
struct Proxy(std::process::Child);

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn proxy(dir: &Path, name: &str, web: u16, section: &str) -> Proxy {
    let cfg = dir.join(format!("{name}.toml"));
    std::fs::write(&cfg, section).unwrap();
    let child = std::process::Command::new(BIN)
        .args(["proxy", "-c"])
        .arg(&cfg)
        .args(["--http", &format!("127.0.0.1:{web}")])
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join(format!("{name}.log"))).unwrap())
        .spawn()
        .expect("start mintgate proxy");
    common::wait_tcp(web, Duration::from_secs(10));
    Proxy(child)
}

/// The proxy's upstream client as the OSCORE client (`[[proxy.oscore]]`):
/// plain HTTP requests reach a gateway that takes only protected writes,
/// protected by the proxy, a body of several blocks each block protected
/// on its own (inner blocks, RFC 8613 4.1.3.4.1) both ways. A proxy whose
/// key is wrong gets the gateway's unprotected refusal and answers 502.
#[test]
fn the_proxy_protects_what_it_sends_to_an_oscore_upstream() {
    let dir = tmp_dir("oscore-upstream");
    std::fs::write(dir.join("secret.hex"), SECRET).unwrap();
    std::fs::write(dir.join("wrong.hex"), "f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff").unwrap();
    let coap = free_udp();
    let mut contexts = context(&dir, "edge", "secret.hex", 0x04);
    contexts += &context(&dir, "stale", "wrong.hex", 0x05);
    let cfg = write_config(
        &dir,
        coap,
        &format!(
            "[access]\nwrite = \"oscore\"\n[oscore]\nstate = \"{}\"\n{contexts}",
            dir.join("state").display()
        ),
    );
    let mut s = Serve::start(&cfg, &dir.join("serve.log"), &[]);
    s.wait_coap(
        format!("127.0.0.1:{coap}").parse().unwrap(),
        Duration::from_secs(15),
    );
    let section = |ctx: &str| {
        format!(
            "[proxy]\nallow = [\"127.0.0.1:{coap}\"]\n\
             [[proxy.oscore]]\nupstream = \"127.0.0.1:{coap}\"\ncontext = \"{}\"\n",
            dir.join(ctx).display()
        )
    };
    let web = free_tcp();
    let _p = proxy(&dir, "proxy-edge", web, &section("edge.toml"));
    let path = format!("/hc/coap://127.0.0.1:{coap}/echo");

    // plain HTTP, protected on the CoAP side: the gateway takes the write
    let body: Vec<u8> = (0..3000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let (st, head, text) = http(web, "PUT", &path, &[("Content-Type", "text/plain")], &body);
    assert!((200..300).contains(&st), "{head}{text}");
    let (st, head, text) = http(web, "GET", &path, &[], b"");
    assert_eq!(st, 200, "{head}");
    assert!(text.as_bytes() == body, "{} bytes back", text.len());
    // the same write straight to the gateway, unprotected: refused
    let o = std::process::Command::new(BIN)
        .args(["put", &format!("coap://127.0.0.1:{coap}/echo"), "-e", "x"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{o:?}");

    // the wrong key: the gateway refuses unprotected, the proxy says so
    let web2 = free_tcp();
    let _p2 = proxy(&dir, "proxy-stale", web2, &section("stale.toml"));
    let (st, head, text) = http(web2, "GET", &path, &[], b"");
    assert_eq!(st, 502, "{head}{text}");
    assert!(
        text.contains("refused the protected request: 4.00"),
        "{text}"
    );
    s.terminate(Duration::from_secs(10));
}
