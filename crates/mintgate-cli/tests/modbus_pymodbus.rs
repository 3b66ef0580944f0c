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

/// pymodbus's RTU server (tests/modbus_peer.py `rtu`: units 1 and 2) on
/// the serial port `tty`, once it says it is ready.
fn start_rtu_slave(py: &Path, tty: &Path) -> Child {
    let mut slave = Command::new(py)
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/modbus_peer.py"))
        .arg("rtu")
        .arg(tty)
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
    slave
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
    let mut slave = start_rtu_slave(&py, &pty.b);
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

/// A line process (tests/modbus_peer.py `relay`) between the gateway's
/// serial port and the slave's, spoiling answers on command; killed on drop.
struct Relay {
    child: Child,
    stdin: std::process::ChildStdin,
    out: BufReader<std::process::ChildStdout>,
}

impl Relay {
    fn start(py: &Path, master: &Path, slave: &Path) -> Relay {
        let mut child = Command::new(py)
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/modbus_peer.py"))
            .arg("relay")
            .arg(master)
            .arg(slave)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the line relay");
        let stdin = child.stdin.take().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut l = String::new();
        out.read_line(&mut l).unwrap();
        assert_eq!(l.trim(), "ready");
        Relay { child, stdin, out }
    }

    fn mode(&mut self, m: &str) {
        use std::io::Write;
        writeln!(self.stdin, "{m}").unwrap();
        let mut l = String::new();
        self.out.read_line(&mut l).unwrap();
        assert_eq!(l.trim(), "ok");
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Faults of an RTU line, each between two stretches of a good line: CRC
/// errors (a bit flipped in every answer), garbage in place of the
/// answers, and a slave that answers after the timeout. Each is reported
/// (`last_error`, GET 5.03), counted (`errors`), and recovered from without
/// a restart (the value is read again, and errors stop growing).
#[test]
fn modbus_rtu_crc_errors_garbage_and_a_late_slave_are_counted_and_recovered_from() {
    let Some(py) = python() else {
        return;
    };
    let dir = tmp_dir("modbus-rtu-faults");
    // gateway <-> line1 <-> relay <-> line2 <-> slave
    for d in ["1", "2"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    let Some(line1) = PtyPair::start(&dir.join("1")) else {
        return;
    };
    let Some(line2) = PtyPair::start(&dir.join("2")) else {
        return;
    };
    let mut slave = start_rtu_slave(&py, &line2.b);
    let mut relay = Relay::start(&py, &line1.b, &line2.a);
    let (coap, metrics) = (free_udp(), free_tcp());
    let cfg = format!(
        "[metrics]\nbind = \"127.0.0.1:{metrics}\"\n\
         [[devices.list]]\nname = \"u1\"\nunit_id = 1\nkind = \"modbus\"\nserial = \"{}\"\n\
         baud = 19200\nparity = \"none\"\nperiod = \"100ms\"\ntimeout = \"200ms\"\nretries = 0\n\
         [[devices.list.points]]\nname = \"count\"\ntable = \"holding\"\naddress = 0\n",
        line1.a.display()
    );
    let cfg = write_config(&dir, coap, &cfg);
    let mut s = Serve::start(&cfg, &dir.join("serve.log"), &[]);
    let gw: SocketAddr = format!("127.0.0.1:{coap}").parse().unwrap();
    s.wait_coap(gw, Duration::from_secs(15));
    let get = || text(coap_get(gw, "sensors/u1.count"));
    let errors = || {
        let t = http(metrics, "GET", "/metrics", &[], b"").2;
        metric(&t, "mintgate_field_errors_total{connection=\"u1\"}").unwrap_or(-1.0)
    };
    let good = wait_until(Duration::from_secs(10), || get().filter(|v| v == "1234"));
    assert!(good.is_some(), "{}", s.log_text());
    for fault in ["crc", "garbage", "late 400"] {
        let before = errors();
        relay.mode(fault);
        let seen = wait_until(Duration::from_secs(5), || {
            (get().is_none() && errors() >= before + 2.0).then_some(())
        });
        let err = field_link(metrics, "u1.count")["last_error"]
            .as_str()
            .unwrap_or("")
            .to_string();
        assert!(
            seen.is_some(),
            "{fault}: errors {before} -> {}, GET {:?}, last_error {err:?}",
            errors(),
            get()
        );
        assert!(!err.is_empty(), "{fault}: no last_error");
        eprintln!(
            "{fault}: errors {before} -> {}, last_error {err:?}",
            errors()
        );
        relay.mode("pass");
        let back = Instant::now();
        let again = wait_until(Duration::from_secs(5), || get().filter(|v| v == "1234"));
        assert!(again.is_some(), "{fault}: not recovered: {:?}", get());
        eprintln!(
            "{fault}: value back {:?} after the line was good again",
            back.elapsed()
        );
        // recovered: a good line makes no more errors (answers the relay
        // held back may still arrive for a moment: RTU has no transaction
        // ids, so the master cannot tell them from the answer it waits for)
        let settled = wait_until(Duration::from_secs(3), || {
            let e = errors();
            std::thread::sleep(Duration::from_millis(500));
            (errors() == e).then_some(())
        });
        assert!(
            settled.is_some(),
            "{fault}: errors still growing on a good line"
        );
        assert_eq!(field_link(metrics, "u1.count")["connected"], true);
    }
    drop(s);
    let _ = slave.kill();
    let _ = slave.wait();
}

/// `mintgate lab fieldbus` for a few seconds with small numbers: it starts
/// its pymodbus servers and a gateway, and writes a CSV whose figures are
/// sane: the points read per second near the rate configured, no error,
/// every change seen at every end, every latency positive and under a
/// second.
#[cfg(feature = "labs")]
#[test]
fn lab_fieldbus_runs_briefly_and_writes_sane_figures() {
    let Some(py) = python() else {
        return;
    };
    let dir = tmp_dir("lab-fieldbus");
    let o = Command::new(common::BIN)
        .args([
            "lab",
            "fieldbus",
            "--devices",
            "2",
            "--points",
            "10",
            "--hz",
            "20",
            "--duration",
            "3s",
            "--broker",
            "embedded",
            "--out",
        ])
        .arg(&dir)
        .arg("--python")
        .arg(&py)
        .output()
        .expect("run mintgate lab fieldbus");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(stdout.contains("anchor: ThingsBoard"), "{stdout}");
    let csv = std::fs::read_to_string(dir.join("fieldbus.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("kind,name,metric,value"));
    let rows: Vec<(String, String, String, f64)> = lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            assert_eq!(f.len(), 4, "{l}");
            (f[0].into(), f[1].into(), f[2].into(), f[3].parse().unwrap())
        })
        .collect();
    let get = |k: &str, n: &str, m: &str| {
        rows.iter()
            .find(|r| r.0 == k && r.1 == n && r.2 == m)
            .unwrap_or_else(|| panic!("no {k},{n},{m} in\n{csv}"))
            .3
    };
    // 2 devices x 10 points x 20 Hz
    let pts = get("run", "all", "points_per_s");
    assert!((360.0..=420.0).contains(&pts), "points/s {pts}\n{stdout}");
    assert!((36.0..=42.0).contains(&get("run", "all", "requests_per_s")));
    assert_eq!(get("run", "all", "errors"), 0.0);
    assert!(get("run", "gateway", "cpu_pct") > 0.0);
    assert!(get("run", "simulators", "cpu_pct") > 0.0);
    for d in ["d0", "d1"] {
        let p = get("device", d, "points_per_s");
        assert!((180.0..=210.0).contains(&p), "{d}: {p}");
        assert!(get("device", d, "lateness_p99_ms") >= 0.0);
    }
    let samples: Vec<f64> = rows
        .iter()
        .filter(|r| r.0 == "sample" && r.2.ends_with("_ms"))
        .map(|r| r.3)
        .collect();
    // 3 s of changes 2-4 periods (100-200 ms) apart, 4 ends each
    assert!(samples.len() >= 4 * 10, "{csv}");
    for v in &samples {
        assert!(*v > 0.0 && *v < 1000.0, "a latency of {v} ms\n{csv}");
    }
    for end in ["observe", "mqtt", "coil"] {
        assert_eq!(get("latency", end, "missed"), 0.0, "{end}");
        let p99 = get("latency", end, "p99_ms");
        assert!(p99 >= get("latency", end, "p50_ms") && p99 > 0.0);
        assert!(get("latency", end, "after_read_p50_ms") > 0.0);
        assert_eq!(
            get("latency", end, "target_p99_ms"),
            if end == "coil" { 51.0 } else { 55.0 }
        );
    }
    let svg = std::fs::read_to_string(dir.join("fieldbus.svg")).unwrap();
    assert!(svg.contains("<svg"), "{svg}");
}
