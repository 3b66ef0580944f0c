//! Modbus TCP devices of `mintgate serve` against a server no one here
//! wrote: pymodbus's (PyPI, installed by scripts/test.sh into
//! target/py-venv; tests/modbus_peer.py gives it known values and lets the
//! test change and read them through pymodbus's own client). The gateway
//! reads every type over CoAP GET, an observer sees a register the test
//! changes, PUTs write a coil, a register and a register pair the test
//! reads back from the server, a direct-path link turns a coil on when a
//! register crosses a threshold; a device with nothing listening and one
//! that never answers do not slow the live one's polls.
//!
//! Under MINTGATE_REQUIRE_PEERS=1 a missing pymodbus fails the test.

mod common;

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    closed_port, coap_get, field_link, free_tcp, free_udp, http, metric, mintgate, observe, text,
    tmp_dir, venv_python, wait_until, write_config, PyPeer, Serve,
};

fn python() -> Option<PathBuf> {
    venv_python("pymodbus")
}

/// The pymodbus server (tests/modbus_peer.py), killed on drop.
fn start_peer(py: &Path, port: Option<u16>) -> PyPeer {
    PyPeer::start(py, "modbus_peer.py", port, &[])
}

#[test]
fn modbus_points_read_observed_and_written_against_pymodbus() {
    let Some(py) = python() else {
        return;
    };
    let mut peer = start_peer(&py, None);
    // a server that accepts and never answers, and a port nothing listens on
    let mute = TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = closed_port(true);
    let dir = tmp_dir("modbus-pymodbus");
    let (coap, metrics) = (free_udp(), free_tcp());
    let point =
        |name: &str, rest: &str| format!("[[devices.list.points]]\nname = \"{name}\"\n{rest}\n");
    let mut cfg = format!(
        "[metrics]\nbind = \"127.0.0.1:{metrics}\"\n\
         [[devices.list]]\nname = \"plc\"\nkind = \"modbus\"\nhost = \"127.0.0.1:{}\"\n\
         unit_id = 1\ntimeout = \"1s\"\nperiod = \"50ms\"\n",
        peer.port
    );
    for (name, rest) in [
        ("count", "table = \"holding\"\naddress = 0"),
        ("temp", "table = \"holding\"\naddress = 1\ntype = \"i16\""),
        (
            "volts",
            "table = \"holding\"\naddress = 2\ntype = \"f32\"\nunit = \"V\"",
        ),
        (
            "amps",
            "table = \"holding\"\naddress = 4\ntype = \"f32\"\nword_order = \"little\"",
        ),
        (
            "flag",
            "table = \"holding\"\naddress = 20\ntype = \"bool\"\nbit = 2",
        ),
        (
            "level",
            "table = \"input\"\naddress = 0\nscale = 0.1\noffset = -40.0",
        ),
        ("relay", "table = \"coil\"\naddress = 3\nwritable = true"),
        (
            "setpoint",
            "table = \"holding\"\naddress = 10\nwritable = true",
        ),
        (
            "big",
            "table = \"holding\"\naddress = 12\ntype = \"u32\"\nwritable = true",
        ),
    ] {
        cfg.push_str(&point(name, rest));
    }
    for (name, port, timeout) in [
        ("dead", dead, "500ms"),
        // an address the server does not have: exception responses
        ("bad", peer.port, "1s"),
        ("mute", mute.local_addr().unwrap().port(), "1s"),
    ] {
        cfg.push_str(&format!(
            "[[devices.list]]\nname = \"{name}\"\nkind = \"modbus\"\nhost = \"127.0.0.1:{port}\"\n\
             timeout = \"{timeout}\"\nperiod = \"50ms\"\n{}",
            point(
                "x",
                if name == "bad" {
                    "table = \"holding\"\naddress = 1000"
                } else {
                    "table = \"holding\"\naddress = 0"
                }
            )
        ));
    }
    // the direct path from a register to a coil
    let cfg = format!(
        "[directpath]\npriority = 0\nlinks = [\"plc.count | threshold(5000, 4500) -> actuator(plc.relay)\"]\n{cfg}"
    );
    let cfg = write_config(&dir, coap, &cfg);
    let mut s = Serve::start(&cfg, &dir.join("serve.log"), &[]);
    let gw: SocketAddr = format!("127.0.0.1:{coap}").parse().unwrap();
    s.wait_coap(gw, Duration::from_secs(15));
    let get = |path: &str| text(coap_get(gw, path));

    // every type, order, scale and table, as the server holds them
    let first = wait_until(Duration::from_secs(10), || get("sensors/plc.count"));
    assert_eq!(first.as_deref(), Some("1234"), "{}", s.log_text());
    for (path, want) in [
        ("sensors/plc.temp", "-200"),
        ("sensors/plc.volts", "230.5"),
        ("sensors/plc.amps", "0.25"),
        ("sensors/plc.flag", "1"),
        ("sensors/plc.level", "25"),
        ("actuators/plc.setpoint", "0"),
    ] {
        let got = wait_until(Duration::from_secs(5), || get(path));
        assert_eq!(got.as_deref(), Some(want), "{path}");
    }
    // nothing listening: 5.03 (no 2.xx payload), and the reason on the dashboard
    assert_eq!(get("sensors/dead.x"), None);

    // an observer sees a change the test makes in the server
    let uri = |p: &str| format!("coap://{gw}/{p}");
    let (mut obs, notes) = observe(&uri("sensors/plc.count"));
    let (_, l) = notes
        .recv_timeout(Duration::from_secs(10))
        .expect("the registration's answer");
    assert!(l.contains("1234"), "{l}");
    let changed = Instant::now();
    assert_eq!(peer.cmd("set-hr 0 4321"), "ok");
    let seen = loop {
        let (t, l) = notes
            .recv_timeout(Duration::from_secs(5))
            .expect("a notification of the change");
        if l.contains("4321") {
            break t;
        }
    };
    let _ = obs.kill();
    let _ = obs.wait();
    eprintln!(
        "register change to notification: {:?} (poll period 50 ms)",
        seen - changed
    );
    assert!(seen - changed < Duration::from_secs(2));

    // PUTs: a coil (function 5), a register (6), a register pair (16)
    for (path, value, read, want) in [
        ("actuators/plc.relay", "0", "get-co 3 1", "0"),
        ("actuators/plc.setpoint", "777", "get-hr 10 1", "777"),
        ("actuators/plc.big", "70000", "get-hr 12 2", "1 4464"),
    ] {
        let o = mintgate(&["put", &uri(path), "-e", value]);
        assert!(
            o.status.success(),
            "PUT {path}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(peer.cmd(read), want, "{path}");
    }
    // the direct path: the register crosses 5000, the link sets the coil
    let crossed = Instant::now();
    assert_eq!(peer.cmd("set-hr 0 6000"), "ok");
    let on = wait_until(Duration::from_secs(5), || {
        (peer.cmd("get-co 3 1") == "1").then(Instant::now)
    });
    let on = on.expect("the link set the coil");
    eprintln!(
        "register crossing to coil set (direct path): {:?}",
        on - crossed
    );
    // and the coil's resource reads it back from the server
    let got = wait_until(Duration::from_secs(5), || {
        get("actuators/plc.relay").filter(|v| v == "1")
    });
    assert!(got.is_some());
    // a value the point cannot hold: refused, the server untouched
    let o = mintgate(&["put", &uri("actuators/plc.setpoint"), "-e", "70000"]);
    assert!(!o.status.success());
    assert_eq!(peer.cmd("get-hr 10 1"), "777");
    // and the resource reads back what the server now holds
    let got = wait_until(Duration::from_secs(5), || {
        get("actuators/plc.big").filter(|v| v == "70000")
    });
    assert!(got.is_some());

    // the dead and the mute device do not slow the live one: over 2 s its
    // six requests (contiguous holding 0-5, 10, 12-13, 20; input 0; coil
    // 3) every 50 ms are all made
    let m = || http(metrics, "GET", "/metrics", &[], b"").2;
    let polls = |t: &str, c: &str| {
        metric(
            t,
            &format!("mintgate_field_polls_total{{connection=\"{c}\"}}"),
        )
        .unwrap_or(0.0)
    };
    let (t0, before) = (Instant::now(), m());
    std::thread::sleep(Duration::from_secs(2));
    let after = m();
    let secs = t0.elapsed().as_secs_f64();
    let made = polls(&after, "plc") - polls(&before, "plc");
    let expected = 6.0 * secs / 0.05;
    eprintln!(
        "plc: {made} polls in {secs:.2} s ({expected:.0} due); mute: {}, dead: {} polls",
        polls(&after, "mute") - polls(&before, "mute"),
        polls(&after, "dead") - polls(&before, "dead"),
    );
    assert!(made >= 0.8 * expected, "{made} of {expected} polls");
    let late = metric(
        &after,
        "mintgate_field_poll_lateness_seconds{connection=\"plc\",quantile=\"0.99\"}",
    )
    .unwrap();
    // a device's requests go one at a time on its connection: the sixth
    // request of a cycle waits for the five before it (pymodbus takes a
    // few ms each), never for the dead or mute device; bounded loosely, as
    // the whole suite runs beside it on two cores
    eprintln!("plc: poll lateness p99 {:.2} ms", late * 1e3);
    assert!(late < 0.25, "polls started {late} s late at p99");
    let errors = |c: &str| {
        metric(
            &after,
            &format!("mintgate_field_errors_total{{connection=\"{c}\"}}"),
        )
        .unwrap_or(0.0)
    };
    assert!(errors("dead") > 0.0 && errors("mute") > 0.0, "{after}");
    assert_eq!(errors("plc"), 0.0, "{after}");
    assert_eq!(
        metric(&after, "mintgate_field_connected{connection=\"plc\"}"),
        Some(1.0)
    );
    // the dashboard's rows say why
    let row = |name: &str| field_link(metrics, name);
    let mute_err = row("mute.x")["last_error"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(mute_err.contains("no answer within 1s"), "{mute_err}");
    let dead_err = row("dead.x")["last_error"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        dead_err.contains(&format!("127.0.0.1:{dead}")),
        "{dead_err}"
    );
    assert_eq!(row("plc.count")["connected"], true);
    assert_eq!(row("plc.count")["connection"], "plc");
    // an exception response: counted, said, and the connection kept
    let bad = row("bad.x");
    let bad_err = bad["last_error"].as_str().unwrap_or("").to_string();
    assert!(bad_err.contains("exception"), "{bad_err}");
    assert_eq!(bad["connected"], true);
    assert!(errors("bad") > 0.0);
    assert_eq!(get("sensors/bad.x"), None);

    // the server stops and comes back on its port: reported, then recovered
    // from without a restart of the gateway
    let port = peer.port;
    drop(peer);
    let errs = || {
        let t = m();
        metric(&t, "mintgate_field_errors_total{connection=\"plc\"}").unwrap_or(0.0)
    };
    assert!(wait_until(Duration::from_secs(10), || (errs() > 0.0).then_some(())).is_some());
    assert_eq!(get("sensors/plc.count"), None);
    let _peer = start_peer(&py, Some(port));
    let back = wait_until(Duration::from_secs(10), || get("sensors/plc.count"));
    assert_eq!(back.as_deref(), Some("1234"), "a fresh server's value");
    let t = m();
    assert_eq!(
        metric(&t, "mintgate_field_connected{connection=\"plc\"}"),
        Some(1.0)
    );
    drop(mute);
}

/// A pty pair from socat (Debian), killed on drop: what one end's writer
/// sends, the other end reads, as on a serial line.
struct PtyPair {
    child: Child,
    a: PathBuf,
    b: PathBuf,
}

impl PtyPair {
    fn start(dir: &std::path::Path) -> Option<PtyPair> {
        let (a, b) = (dir.join("tty-a"), dir.join("tty-b"));
        let child = Command::new("socat")
            .arg(format!("pty,raw,echo=0,link={}", a.display()))
            .arg(format!("pty,raw,echo=0,link={}", b.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let Ok(child) = child else {
            assert!(
                std::env::var_os("MINTGATE_REQUIRE_PEERS").is_none(),
                "socat is required (MINTGATE_REQUIRE_PEERS is set) but not on PATH"
            );
            eprintln!("skipping: socat (Debian) is not on PATH");
            return None;
        };
        let p = PtyPair { child, a, b };
        wait_until(Duration::from_secs(5), || {
            (p.a.exists() && p.b.exists()).then_some(())
        })
        .expect("socat made the pty pair");
        Some(p)
    }
}

impl Drop for PtyPair {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Modbus RTU: two units of pymodbus's serial server on one bus (a socat
/// pty pair), and a third unit that is not there: the gateway reads both
/// units' points, writes one and reads it back, and counts the missing
/// unit's timeouts without losing the others.
#[test]
fn modbus_rtu_units_share_a_serial_bus_against_pymodbus() {
    let Some(py) = python() else {
        return;
    };
    let dir = tmp_dir("modbus-rtu");
    let Some(pty) = PtyPair::start(&dir) else {
        return;
    };
    let mut slave = Command::new(&py)
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/modbus_peer.py"))
        .arg("rtu")
        .arg(&pty.b)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the pymodbus RTU server");
    let mut ready = String::new();
    BufReader::new(slave.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert_eq!(ready.trim(), "ready");
    let (coap, metrics) = (free_udp(), free_tcp());
    let bus = format!(
        "kind = \"modbus\"\nserial = \"{}\"\nbaud = 19200\nparity = \"none\"\nperiod = \"100ms\"\n",
        pty.a.display()
    );
    let cfg = format!(
        "[metrics]\nbind = \"127.0.0.1:{metrics}\"\n\
         [[devices.list]]\nname = \"u1\"\nunit_id = 1\n{bus}\
         [[devices.list.points]]\nname = \"count\"\ntable = \"holding\"\naddress = 0\n\
         [[devices.list.points]]\nname = \"volts\"\ntable = \"holding\"\naddress = 2\ntype = \"f32\"\n\
         [[devices.list.points]]\nname = \"set\"\ntable = \"holding\"\naddress = 10\nwritable = true\n\
         [[devices.list]]\nname = \"u2\"\nunit_id = 2\n{bus}\
         [[devices.list.points]]\nname = \"count\"\ntable = \"holding\"\naddress = 0\n\
         [[devices.list]]\nname = \"u3\"\nunit_id = 3\ntimeout = \"100ms\"\nretries = 0\n{bus}\
         [[devices.list.points]]\nname = \"count\"\ntable = \"holding\"\naddress = 0\n"
    );
    let cfg = write_config(&dir, coap, &cfg);
    let mut s = Serve::start(&cfg, &dir.join("serve.log"), &[]);
    let gw: SocketAddr = format!("127.0.0.1:{coap}").parse().unwrap();
    s.wait_coap(gw, Duration::from_secs(15));
    let get = |path: &str| text(coap_get(gw, path));
    for (path, want) in [
        ("sensors/u1.count", "1234"),
        ("sensors/u1.volts", "230.5"),
        ("sensors/u2.count", "2222"),
    ] {
        let got = wait_until(Duration::from_secs(10), || get(path));
        assert_eq!(got.as_deref(), Some(want), "{path}: {}", s.log_text());
    }
    let uri = format!("coap://{gw}/actuators/u1.set");
    let o = mintgate(&["put", &uri, "-e", "55"]);
    assert!(
        o.status.success(),
        "PUT: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    // read back from the slave by the next polls (a write that never went
    // out would be overwritten by the slave's 0)
    std::thread::sleep(Duration::from_millis(500));
    let got = wait_until(Duration::from_secs(5), || {
        get("actuators/u1.set").filter(|v| v == "55")
    });
    assert!(got.is_some(), "{:?}", get("actuators/u1.set"));
    assert_eq!(get("sensors/u3.count"), None);
    let t = http(metrics, "GET", "/metrics", &[], b"").2;
    let m = |name: &str, c: &str| metric(&t, &format!("{name}{{connection=\"{c}\"}}"));
    assert!(m("mintgate_field_errors_total", "u3") > Some(0.0), "{t}");
    assert_eq!(m("mintgate_field_errors_total", "u1"), Some(0.0), "{t}");
    assert_eq!(m("mintgate_field_errors_total", "u2"), Some(0.0), "{t}");
    eprintln!(
        "RTU polls: u1 {:?}, u2 {:?}, u3 {:?} (errors {:?})",
        m("mintgate_field_polls_total", "u1"),
        m("mintgate_field_polls_total", "u2"),
        m("mintgate_field_polls_total", "u3"),
        m("mintgate_field_errors_total", "u3"),
    );
    drop(s);
    let _ = slave.kill();
    let _ = slave.wait();
}
