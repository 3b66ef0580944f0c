//! `/healthz`, `/readyz`, `mintgate_up` and `mintgate_ready` on the HTTP
//! front end and the metrics listener of a running `mintgate serve`, and
//! its service-manager notifications (`READY=1`, `WATCHDOG=1`,
//! `STOPPING=1` on the `NOTIFY_SOCKET` datagram socket).

mod common;

use std::net::SocketAddr;
use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Datagrams on `sock` until one holds `needle` (within `limit`); all of
/// them, or `None`.
fn wait_notify(sock: &UnixDatagram, needle: &str, limit: Duration) -> Option<Vec<String>> {
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let end = Instant::now() + limit;
    let mut seen = Vec::new();
    let mut b = [0u8; 4096];
    while Instant::now() < end {
        if let Ok(n) = sock.recv(&mut b) {
            let m = String::from_utf8_lossy(&b[..n]).into_owned();
            let hit = m.lines().any(|l| l == needle);
            seen.push(m);
            if hit {
                return Some(seen);
            }
        }
    }
    None
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[test]
fn ready_healthy_and_notified_on_both_http_listeners() {
    let dir = tmp_dir("health-ok");
    let (coap, http_port, metrics) = (free_udp(), free_tcp(), free_tcp());
    let cfg = write_config(
        &dir,
        coap,
        &format!(
            "[metrics]\nbind = \"127.0.0.1:{metrics}\"\n[proxy]\nhttp = \"127.0.0.1:{http_port}\"\n"
        ),
    );
    let notify = dir.join("notify.sock");
    let sock = UnixDatagram::bind(&notify).unwrap();
    let log = dir.join("serve.log");
    // WATCHDOG_PID must be the gateway's own pid: the shell execs it
    let child = Command::new("sh")
        .args(["-c", "WATCHDOG_PID=$$ exec \"$0\" \"$@\"", BIN])
        .args(["--log", "info", "serve", "-c"])
        .arg(&cfg)
        .env("NOTIFY_SOCKET", &notify)
        .env("WATCHDOG_USEC", "400000")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut gw = Serve { child, log };
    let seen = wait_notify(&sock, "READY=1", Duration::from_secs(20))
        .unwrap_or_else(|| panic!("no READY=1:\n{}", gw.log_text()));
    let ready = seen.last().unwrap();
    assert!(
        ready.contains("STATUS=serving CoAP on udp 127.0.0.1:"),
        "{ready}"
    );
    // READY=1 comes once every listener is bound: all answer at once
    let coap_addr: SocketAddr = format!("127.0.0.1:{coap}").parse().unwrap();
    assert_eq!(
        text(coap_get(coap_addr, "request")).as_deref(),
        Some("hello world")
    );
    for port in [http_port, metrics] {
        let (st, head, body) = http(port, "GET", "/healthz", &[], b"");
        assert_eq!(st, 200, "{head}{body}");
        assert_eq!(json(&body)["alive"], true, "{body}");
        let (st, head, body) = http(port, "GET", "/readyz", &[], b"");
        assert_eq!(st, 200, "{head}{body}");
        assert!(head.contains("content-type: application/json"), "{head}");
        let v = json(&body);
        assert_eq!(v["ready"], true, "{body}");
        assert_eq!(v["checks"]["startup"], "ok", "{body}");
        assert_eq!(v["checks"]["pipeline"], "ok", "{body}");
        assert!(v.get("reason").is_none(), "{body}");
    }
    let (_, _, m) = http(metrics, "GET", "/metrics", &[], b"");
    assert_eq!(metric(&m, "mintgate_up"), Some(1.0), "{m}");
    assert_eq!(metric(&m, "mintgate_ready"), Some(1.0), "{m}");
    // the watchdog pings at half of WATCHDOG_USEC while the pipeline runs
    let t = Instant::now();
    for _ in 0..2 {
        wait_notify(&sock, "WATCHDOG=1", Duration::from_secs(5))
            .unwrap_or_else(|| panic!("no WATCHDOG=1:\n{}", gw.log_text()));
    }
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    // SIGTERM: STOPPING=1, then a clean exit
    // SAFETY: signalling our own child by its pid.
    unsafe { libc::kill(gw.pid() as libc::pid_t, libc::SIGTERM) };
    wait_notify(&sock, "STOPPING=1", Duration::from_secs(10))
        .unwrap_or_else(|| panic!("no STOPPING=1:\n{}", gw.log_text()));
    assert!(gw.terminate(Duration::from_secs(10)), "{}", gw.log_text());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unreachable_mqtt_broker_makes_it_not_ready_until_the_broker_comes() {
    let dir = tmp_dir("health-mqtt");
    let (coap, http_port, metrics) = (free_udp(), free_tcp(), free_tcp());
    let broker = closed_port(true);
    let cfg = write_config(
        &dir,
        coap,
        &format!(
            "[metrics]\nbind = \"127.0.0.1:{metrics}\"\n[proxy]\nhttp = \"127.0.0.1:{http_port}\"\n\
             [mqtt]\nenabled = true\nbroker = \"mqtt://127.0.0.1:{broker}\"\nstate = \"{}\"\n",
            dir.join("mqtt-state").display()
        ),
    );
    let mut gw = Serve::start(&cfg, &dir.join("serve.log"), &[]);
    // every listener is bound once it says it serves
    gw.wait_log("mintgate serving CoAP", Duration::from_secs(20));
    // alive, not ready: the reason names the uplink, not its address
    for port in [http_port, metrics] {
        let (st, _, body) = http(port, "GET", "/healthz", &[], b"");
        assert_eq!(st, 200, "{body}");
        let (st, head, body) = http(port, "GET", "/readyz", &[], b"");
        assert_eq!(st, 503, "{head}{body}");
        let v = json(&body);
        assert_eq!(v["ready"], false, "{body}");
        let reason = v["reason"].as_str().unwrap();
        assert!(
            reason.starts_with("mqtt: the publish queue is not connected to the MQTT broker"),
            "{reason}"
        );
        assert!(!reason.contains(&broker.to_string()), "{reason}");
        assert_eq!(v["checks"]["pipeline"], "ok", "{body}");
        assert_ne!(v["checks"]["mqtt"], "ok", "{body}");
    }
    let (_, _, m) = http(metrics, "GET", "/metrics", &[], b"");
    assert_eq!(metric(&m, "mintgate_up"), Some(1.0), "{m}");
    assert_eq!(metric(&m, "mintgate_ready"), Some(0.0), "{m}");
    // the broker comes up: ready within the reconnect back-off (2 s at most)
    let v5 = free_tcp();
    let mut b = Command::new(BIN)
        .args([
            "broker",
            "--listen",
            &format!("127.0.0.1:{broker}"),
            "--listen-v5",
            &format!("127.0.0.1:{v5}"),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let ready = wait_until(Duration::from_secs(20), || {
        let (st, _, body) = http(http_port, "GET", "/readyz", &[], b"");
        (st == 200).then_some(body)
    });
    let _ = b.kill();
    let _ = b.wait();
    let body = ready.unwrap_or_else(|| panic!("not ready with a broker:\n{}", gw.log_text()));
    assert_eq!(json(&body)["checks"]["mqtt"], "ok", "{body}");
    drop(gw);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A standalone `mintgate proxy` answers `/healthz` and `/readyz` on its
/// HTTP listener, in the gateway's shapes, once its listeners are bound.
#[test]
fn a_standalone_proxy_is_healthy_and_ready_once_listening() {
    let dir = tmp_dir("health-proxy");
    let port = free_tcp();
    let log = dir.join("proxy.log");
    let child = Command::new(BIN)
        .args(["--log", "info", "proxy", "--http"])
        .arg(format!("127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    // the same handle as serve's: kills the child when dropped
    let mut p = Serve { child, log };
    p.wait_log("proxy on tcp", Duration::from_secs(20));
    let (st, head, body) = http(port, "GET", "/healthz", &[], b"");
    assert_eq!(st, 200, "{head}{body}");
    let v = json(&body);
    assert_eq!(v["alive"], true, "{body}");
    assert!(v["uptime_seconds"].is_u64(), "{body}");
    let (st, head, body) = http(port, "GET", "/readyz", &[], b"");
    assert_eq!(st, 200, "{head}{body}");
    assert!(head.contains("content-type: application/json"), "{head}");
    let v = json(&body);
    assert_eq!(v["ready"], true, "{body}");
    assert_eq!(v["checks"]["listening"], "ok", "{body}");
    // anything else is still the proxy's: not found, not a health answer
    let (st, _, _) = http(port, "GET", "/healthz/x", &[], b"");
    assert_eq!(st, 404);
    assert!(p.terminate(Duration::from_secs(10)), "{}", p.log_text());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `/metrics` read by the Prometheus project's own Python client, a parser
/// no one here wrote, in both formats the endpoint speaks: the Prometheus
/// text format by default and OpenMetrics when `Accept` asks for it (as
/// Prometheus does). OpenMetrics' parser is strict: a page that parses has
/// its `# EOF`, counters with `_total` samples, histograms with `+Inf`, and
/// no family twice.
#[test]
fn metrics_parse_with_the_prometheus_client_in_both_formats() {
    let Some(py) = venv_python("prometheus_client") else {
        return;
    };
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/metrics_parse.py");
    let dir = tmp_dir("metrics-parse");
    let (coap, http_port, metrics) = (free_udp(), free_tcp(), free_tcp());
    let cfg = write_config(
        &dir,
        coap,
        &format!(
            "[metrics]\nbind = \"127.0.0.1:{metrics}\"\n[proxy]\nhttp = \"127.0.0.1:{http_port}\"\n"
        ),
    );
    let mut gw = Serve::start(&cfg, &dir.join("serve.log"), &[]);
    gw.wait_log("mintgate serving CoAP", Duration::from_secs(20));
    let coap_addr: SocketAddr = format!("127.0.0.1:{coap}").parse().unwrap();
    for _ in 0..3 {
        assert!(coap_get(coap_addr, "request").is_some());
    }
    let parse = |body: &str, om: bool| -> serde_json::Value {
        let file = dir.join(if om { "om.txt" } else { "prom.txt" });
        std::fs::write(&file, body).unwrap();
        let mut cmd = Command::new(&py);
        cmd.arg(script);
        if om {
            cmd.arg("--openmetrics");
        }
        let out = cmd.arg(&file).output().unwrap();
        assert!(out.status.success(), "{}\n{body}", output_text(&out));
        json(&String::from_utf8_lossy(&out.stdout))
    };

    let (st, head, prom) = http(metrics, "GET", "/metrics", &[], b"");
    assert_eq!(st, 200, "{head}");
    assert!(
        head.contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    let p = parse(&prom, false);
    let (st, head, om) = http(
        metrics,
        "GET",
        "/metrics",
        &[(
            "Accept",
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
        )],
        b"",
    );
    assert_eq!(st, 200, "{head}");
    assert!(
        head.contains("content-type: application/openmetrics-text; version=1.0.0"),
        "{head}"
    );
    assert!(om.ends_with("# EOF\n"), "{om}");
    let o = parse(&om, true);

    let kind = |v: &serde_json::Value, name: &str| v["families"][name].as_str().map(str::to_owned);
    for (name, want) in [
        ("mintgate_nr_datagrams", "counter"),
        ("mintgate_htp_threads", "gauge"),
        ("mintgate_dropped", "counter"),
        ("mintgate_directpath_e2e_latency_seconds", "histogram"),
        ("mintgate_proxy_connections_handed_off", "counter"),
        ("process_cpu_seconds", "counter"),
        ("mintgate_build", "info"),
    ] {
        assert_eq!(kind(&o, name).as_deref(), Some(want), "{name} in {om}");
    }
    // the same families either way (an info family is a gauge in 0.0.4)
    let names = |v: &serde_json::Value| -> Vec<String> {
        let mut n: Vec<String> = v["families"]
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.trim_end_matches("_info").to_owned())
            .collect();
        n.sort();
        n
    };
    let (pn, on) = (names(&p), names(&o));
    assert!(on.len() > 100, "{on:?}");
    assert_eq!(pn.len(), on.len(), "{pn:?}\n{on:?}");
    // every GET was counted, in either exposition
    for v in [&p, &o] {
        let n = v["samples"]["mintgate_nr_datagrams_total"].as_f64();
        assert!(n.is_some_and(|n| n >= 3.0), "{v}");
        assert!(v["samples"]["mintgate_dropped_total{reason=\"peer_limit\"}"].is_number());
    }
    drop(gw);
    let _ = std::fs::remove_dir_all(&dir);
}
