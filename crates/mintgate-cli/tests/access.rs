//! `[access] write = "token"` end to end: `mintgate serve` refuses CoAP
//! writes without the Access-Token option (4.01) and HTTP writes through its
//! proxy without the bearer token (401), counts the refusals, and takes both
//! with the token (the proxy passes it on to its own CoAP endpoint). Reads
//! need nothing. `write = "dtls"`: only listed DTLS identities write, over
//! coaps; plain and HTTP writes are refused. `write` absent: writes from
//! loopback only, so none through the proxy.

mod common;

use std::time::Duration;

use common::*;

#[test]
fn token_mode_refuses_writes_without_the_token_and_counts_them() {
    let dir = tmp_dir("access");
    let (coap, http_port, metrics) = (free_udp(), free_tcp(), free_tcp());
    let cfg = write_config(
        &dir,
        coap,
        &format!(
            "[proxy]\nhttp = \"127.0.0.1:{http_port}\"\n\
             [metrics]\nbind = \"127.0.0.1:{metrics}\"\n\
             [access]\nwrite = \"token\"\ntokens = [\"s3cret\"]\n"
        ),
    );
    let mut gw = Serve::start(&cfg, &dir.join("serve.log"), &[]);
    let addr = format!("127.0.0.1:{coap}").parse().unwrap();
    gw.wait_coap(addr, Duration::from_secs(20));
    let led = format!("coap://127.0.0.1:{coap}/actuators/led0");

    // CoAP: no token, a wrong one, the right one
    let o = mintgate(&["put", &led, "-e", "1"]);
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("4.01"), "{o:?}");
    let o = mintgate(&["put", &led, "-e", "1", "--access-token", "wrong"]);
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    let o = mintgate(&["put", &led, "-e", "1", "--access-token", "s3cret"]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    // reads need nothing
    let o = mintgate(&["get", &led]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "1");
    // the admin resource: a link added with the token, from loopback
    let links = format!("coap://127.0.0.1:{coap}/links");
    let link = "temp0 | threshold(25, 23) -> actuator(led0)";
    let o = mintgate(&["post", &links, "-e", link]);
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    let o = mintgate(&["post", &links, "-e", link, "--access-token", "s3cret"]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");

    // HTTP through the proxy
    let path = format!("/hc/coap://127.0.0.1:{coap}/actuators/led0");
    let (st, head, _) = http(
        http_port,
        "PUT",
        &path,
        &[("Content-Type", "text/plain")],
        b"0",
    );
    assert_eq!(st, 401, "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("www-authenticate: bearer"),
        "{head}"
    );
    let (st, head, _) = http(
        http_port,
        "PUT",
        &path,
        &[
            ("Content-Type", "text/plain"),
            ("Authorization", "Bearer nope"),
        ],
        b"0",
    );
    assert_eq!(st, 401, "{head}");
    let (st, head, _) = http(
        http_port,
        "PUT",
        &path,
        &[
            ("Content-Type", "text/plain"),
            ("Authorization", "Bearer s3cret"),
        ],
        b"0",
    );
    assert!(st == 204 || st == 200, "the token went on to CoAP: {head}");
    let (st, _, body) = http(http_port, "GET", &path, &[], b"");
    assert_eq!((st, body.trim()), (200, "0"));

    // counted
    let (st, _, text) = http(metrics, "GET", "/metrics", &[], b"");
    assert_eq!(st, 200);
    let m = |name: &str| metric(&text, name).unwrap_or_else(|| panic!("{name} missing"));
    assert_eq!(
        m("mintgate_access_refused_total{reason=\"no_credentials\"}"),
        2.0
    );
    assert_eq!(
        m("mintgate_access_refused_total{reason=\"bad_token\"}"),
        1.0
    );
    assert_eq!(
        m("mintgate_proxy_errors_total{reason=\"write_refused\"}"),
        2.0
    );
    assert!(gw.terminate(Duration::from_secs(10)), "{}", gw.log_text());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dtls_mode_takes_listed_identities_over_coaps_only() {
    let dir = tmp_dir("access-dtls");
    let (coap, coaps, http_port) = (free_udp(), free_udp(), free_tcp());
    let cfg = write_config(
        &dir,
        coap,
        &format!(
            "[proxy]\nhttp = \"127.0.0.1:{http_port}\"\n\
             [coaps]\nbind = [\"127.0.0.1:{coaps}\"]\n\
             psk_keys = {{ \"writer\" = \"k1\", \"reader\" = \"k2\" }}\n\
             [access]\nwrite = \"dtls\"\nidentities = [\"writer\"]\n"
        ),
    );
    let mut gw = Serve::start(&cfg, &dir.join("serve.log"), &[]);
    gw.wait_coap(
        format!("127.0.0.1:{coap}").parse().unwrap(),
        Duration::from_secs(20),
    );
    let led = format!("coap://127.0.0.1:{coap}/actuators/led0");
    // plain UDP carries no DTLS identity: a token does not help
    let o = mintgate(&["put", &led, "-e", "1", "--access-token", "anything"]);
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("4.01"), "{o:?}");
    let path = format!("/hc/coap://127.0.0.1:{coap}/actuators/led0");
    let (st, head, body) = http(http_port, "PUT", &path, &[], b"1");
    assert_eq!(st, 401, "{head}");
    assert!(body.contains("DTLS"), "{body}");
    let (st, _, _) = http(http_port, "GET", &path, &[], b"");
    assert_eq!(st, 200);

    // over coaps: a listed identity writes, another one is refused 4.03
    let sled = format!("coaps://127.0.0.1:{coaps}/actuators/led0");
    let psk = |id: &str, key: &str, args: &[&str]| {
        let mut a = args.to_vec();
        a.extend_from_slice(&["--psk-identity", id, "--psk-key", key]);
        mintgate(&a)
    };
    let o = psk("writer", "k1", &["put", &sled, "-e", "1"]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let o = psk("reader", "k2", &["put", &sled, "-e", "0"]);
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("4.03"), "{o:?}");
    let o = psk("reader", "k2", &["get", &sled]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "1",
        "the refused write changed nothing"
    );
    assert!(gw.terminate(Duration::from_secs(10)), "{}", gw.log_text());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `mintgate serve` on loopback with `extra` config, the HTTP proxy and
/// the metrics endpoint, up and logged; (serve, CoAP, HTTP, metrics ports).
fn serve_with_proxy(dir: &std::path::Path, extra: &str) -> (Serve, u16, u16, u16) {
    let (coap, http_port, metrics) = (free_udp(), free_tcp(), free_tcp());
    let cfg = write_config(
        dir,
        coap,
        &format!(
            "[proxy]\nhttp = \"127.0.0.1:{http_port}\"\n\
             [metrics]\nbind = \"127.0.0.1:{metrics}\"\n{extra}"
        ),
    );
    let mut gw = Serve::start(&cfg, &dir.join("serve.log"), &[]);
    gw.wait_coap(
        format!("127.0.0.1:{coap}").parse().unwrap(),
        Duration::from_secs(20),
    );
    gw.wait_log("HTTP/1.1 and HTTP/2 proxy on tcp", Duration::from_secs(20));
    gw.wait_log("metrics on http", Duration::from_secs(20));
    (gw, coap, http_port, metrics)
}

#[test]
fn proxied_writes_carry_their_origin_and_links_are_bounded() {
    let dir = tmp_dir("access-proxied");
    let (mut gw, coap, http_port, metrics) = serve_with_proxy(
        &dir,
        "[directpath]\nmax_links = 2\n[access]\nwrite = \"open\"\n",
    );
    let link = "temp0 | threshold(25, 23) -> actuator(led0)";
    // through the proxy, unauthenticated: the CoAP endpoint sees the
    // proxy's socket on loopback but takes it as remote (4.03 -> 403)
    let path = format!("/hc/coap://127.0.0.1:{coap}/links");
    let (st, head, body) = http(
        http_port,
        "POST",
        &path,
        &[("Content-Type", "text/plain")],
        link.as_bytes(),
    );
    assert_eq!(st, 403, "{head}\n{body}");
    assert!(body.contains("loopback"), "{body}");
    // a browser's cross-site write is refused by the proxy itself
    let (st, _, body) = http(
        http_port,
        "POST",
        &path,
        &[
            ("Content-Type", "text/plain"),
            ("Origin", "http://evil.example"),
        ],
        link.as_bytes(),
    );
    assert_eq!(st, 403, "{body}");
    assert!(body.contains("origin"), "{body}");
    // reads through the proxy still work
    let (st, _, _) = http(http_port, "GET", &path, &[], b"");
    assert_eq!(st, 200);
    // the same write straight from loopback is taken, up to max_links
    let links = format!("coap://127.0.0.1:{coap}/links");
    for _ in 0..2 {
        let o = mintgate(&["post", &links, "-e", link]);
        assert_eq!(o.status.code(), Some(0), "{o:?}");
    }
    let o = mintgate(&["post", &links, "-e", link]);
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(
        err.contains("4.03") && format!("{out}{err}").contains("directpath.max_links"),
        "{out}{err}"
    );
    // the dashboard has no write route: a cross-site POST gets no 2xx
    let (st, _, _) = http(
        metrics,
        "POST",
        "/api/state",
        &[("Origin", "http://evil.example")],
        b"x",
    );
    assert!(st >= 400, "{st}");
    let (st, _, text) = http(metrics, "GET", "/metrics", &[], b"");
    assert_eq!(st, 200);
    assert_eq!(
        metric(
            &text,
            "mintgate_access_refused_total{reason=\"admin_not_loopback\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(&text, "mintgate_proxy_errors_total{reason=\"cross_site\"}"),
        Some(1.0)
    );
    assert!(gw.terminate(Duration::from_secs(10)), "{}", gw.log_text());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `access.write` absent (a fresh install): writes through the proxy,
/// which count as remote, are refused 403 with a text that says how to
/// choose, and counted; CoAP writes from loopback work. The same write is
/// taken once the file says `write = "open"`.
#[test]
fn an_unchosen_write_mode_refuses_proxied_writes_until_open_is_chosen() {
    let dir = tmp_dir("access-unset");
    let link = "temp0 | threshold(25, 23) -> actuator(led0)";
    for chosen in [None, Some("open")] {
        let access = chosen
            .map(|m| format!("[access]\nwrite = \"{m}\"\n"))
            .unwrap_or_default();
        let (mut gw, coap, http_port, metrics) = serve_with_proxy(&dir, &access);
        let led = format!("/hc/coap://127.0.0.1:{coap}/actuators/led0");
        let links = format!("/hc/coap://127.0.0.1:{coap}/links");
        // a large read first: its Echo round trip verifies the proxy's
        // address (RFC 9175), so that each refused write below is one
        // exchange (a refusal answered with an Echo challenge is checked,
        // and counted, again when repeated)
        let (st, _, _) = http(
            http_port,
            "GET",
            &format!("/hc/coap://127.0.0.1:{coap}/.well-known/core"),
            &[],
            b"",
        );
        assert_eq!(st, 200);
        let put = http(
            http_port,
            "PUT",
            &led,
            &[("Content-Type", "text/plain")],
            b"1",
        );
        let post = http(
            http_port,
            "POST",
            &links,
            &[("Content-Type", "text/plain")],
            link.as_bytes(),
        );
        let (st, _, text) = http(metrics, "GET", "/metrics", &[], b"");
        assert_eq!(st, 200);
        let unset = metric(
            &text,
            "mintgate_access_refused_total{reason=\"write_mode_unset\"}",
        );
        match chosen {
            None => {
                for (st, head, body) in [&put, &post] {
                    assert_eq!(*st, 403, "{head}\n{body}");
                    for word in ["access.write", "\"open\"", "\"token\"", "\"dtls\""] {
                        assert!(body.contains(word), "{body}");
                    }
                }
                assert_eq!(unset, Some(2.0));
                // reads through the proxy are served; CoAP writes from
                // loopback are taken, /links included
                let (st, _, body) = http(http_port, "GET", &led, &[], b"");
                assert_eq!(
                    (st, body.trim()),
                    (200, "0"),
                    "the refused PUT changed nothing"
                );
                let coap_led = format!("coap://127.0.0.1:{coap}/actuators/led0");
                let o = mintgate(&["put", &coap_led, "-e", "1"]);
                assert_eq!(o.status.code(), Some(0), "{o:?}");
                let o = mintgate(&[
                    "post",
                    &format!("coap://127.0.0.1:{coap}/links"),
                    "-e",
                    link,
                ]);
                assert_eq!(o.status.code(), Some(0), "{o:?}");
                // every listener is on loopback: no warning
                assert!(
                    !gw.log_text().contains("access.write not chosen"),
                    "{}",
                    gw.log_text()
                );
            }
            Some(_) => {
                let (st, head, body) = &put;
                assert!(*st == 204 || *st == 200, "{head}\n{body}");
                let (st, _, body) = http(http_port, "GET", &led, &[], b"");
                assert_eq!((st, body.trim()), (200, "1"));
                // an admin write through the proxy still needs more than "open"
                assert_eq!(post.0, 403, "{}", post.2);
                assert!(post.2.contains("loopback"), "{}", post.2);
                assert_eq!(unset, Some(0.0));
            }
        }
        assert!(gw.terminate(Duration::from_secs(10)), "{}", gw.log_text());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// DNS rebinding: a browser on the gateway's host that loads a page whose
/// name resolves to 127.0.0.1 sends that name in `Host`. The dashboard (on
/// both listeners) and writes through the proxy refuse it (403, counted);
/// IP literals and `localhost` pass, and so do reads through the proxy.
#[test]
fn a_foreign_host_is_refused_by_the_dashboard_and_proxy_writes() {
    let dir = tmp_dir("access-host");
    let (mut gw, coap, http_port, metrics) = serve_with_proxy(&dir, "[access]\nwrite = \"open\"\n");
    let evil = [("Host", "evil.example")];
    for port in [metrics, http_port] {
        for path in ["/", "/api/state"] {
            let (st, _, body) = http(port, "GET", path, &evil, b"");
            assert_eq!(st, 403, "{port}{path}: {body}");
            assert!(body.contains("proxy.allowed_hosts"), "{body}");
        }
        let local = format!("localhost:{port}");
        let (st, _, _) = http(port, "GET", "/api/state", &[("Host", &local)], b"");
        assert_eq!(st, 200);
    }
    let led = format!("/hc/coap://127.0.0.1:{coap}/actuators/led0");
    let (st, _, body) = http(http_port, "PUT", &led, &evil, b"1");
    assert_eq!(st, 403, "{body}");
    assert!(body.contains("proxy.allowed_hosts"), "{body}");
    let (st, _, body) = http(http_port, "GET", &led, &evil, b"");
    assert_eq!(
        (st, body.trim()),
        (200, "0"),
        "reads pass; the write did not"
    );
    let (st, head, _) = http(http_port, "PUT", &led, &[("Host", "[::1]")], b"1");
    assert!(st == 204 || st == 200, "{head}");
    let (st, _, text) = http(metrics, "GET", "/metrics", &[], b"");
    assert_eq!(st, 200);
    assert_eq!(
        metric(&text, "mintgate_dashboard_refused_total{reason=\"host\"}"),
        Some(4.0)
    );
    assert_eq!(
        metric(&text, "mintgate_proxy_errors_total{reason=\"bad_host\"}"),
        Some(1.0)
    );
    assert!(gw.terminate(Duration::from_secs(10)), "{}", gw.log_text());
    // a name list is checked when the file is read
    let bad = write_config(&dir, coap, "[proxy]\nallowed_hosts = [\"evil/x\"]\n");
    let o = mintgate(&["serve", "-c", bad.to_str().unwrap(), "--print-config"]);
    assert!(!o.status.success(), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("proxy.allowed_hosts"),
        "{o:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn proxy_tokens_come_from_a_file_or_the_environment_and_are_never_printed() {
    let dir = tmp_dir("access-secrets");
    let f = dir.join("tokens");
    std::fs::write(&f, "# tokens\nfile-secret-1\n\n  file-secret-2  \n").unwrap();
    let o = mintgate(&[
        "proxy",
        "--token-file",
        f.to_str().unwrap(),
        "--print-config",
    ]);
    assert!(o.status.success(), "{o:?}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(!out.contains("file-secret"), "{out}");
    assert_eq!(out.matches("<redacted>").count(), 2, "{out}");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_mintgate"))
        .args(["proxy", "--print-config"])
        .env(
            "MINTGATE_PROXY_TOKENS",
            "env-secret-1,env-secret-2,env-secret-3",
        )
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(!out.contains("env-secret"), "{out}");
    assert_eq!(out.matches("<redacted>").count(), 3, "{out}");
    // an empty file is an error that names the flag, not a silent no-token
    std::fs::write(&f, "# nothing\n").unwrap();
    let o = mintgate(&[
        "proxy",
        "--token-file",
        f.to_str().unwrap(),
        "--print-config",
    ]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--token-file"),
        "{o:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
