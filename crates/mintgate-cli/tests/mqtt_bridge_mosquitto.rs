//! `mintgate serve --mqtt` against a real mosquitto: a sensor's values on
//! its topic in order, commands to an actuator (read back with `mintgate
//! get`), malformed commands counted in /metrics, a direct-path
//! `mqtt(TOPIC)` output, libcoap's observable `/time` bridged to a topic,
//! and a clean stop on SIGTERM with everything acknowledged.
//!
//! Order on a topic is checked as a plain MQTT subscriber sees it (the
//! envelopes' `seq` increases; it counts over all the bridges' topics).
//!
//! A private mosquitto on a free loopback port (not Debian's service on
//! 1883). Without mosquitto the test is skipped with a message, and
//! without libcoap's `coap-server-notls` its observe part is, unless
//! `MINTGATE_REQUIRE_PEERS` is set, in which case they fail.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use mintgate_mqtt::broker::{find_mosquitto, Mosquitto};
use mintgate_mqtt::plain::publish_raw;
use mintgate_mqtt::{BrokerUrl, Listener, ListenerConfig, ListenerControl, Qos};

fn unique() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
    )
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mintgate-test-{name}-{}", unique()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn require_peers() -> bool {
    std::env::var_os("MINTGATE_REQUIRE_PEERS").is_some()
}

fn on_path(exe: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(exe).is_file()))
}

/// A child process killed on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .unwrap()
        .port()
}

fn free_tcp_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .unwrap()
        .port()
}

/// Pings (empty CON, answered by a Reset) until a CoAP server answers.
fn coap_ready(child: &mut Child, port: u16) -> bool {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let dest: SocketAddr = ([127, 0, 0, 1], port).into();
    let ping = [0x40, 0x00, 0x43, 0x21];
    let until = Instant::now() + Duration::from_secs(15);
    let mut buf = [0u8; 64];
    while Instant::now() < until {
        if child.try_wait().ok().flatten().is_some() {
            return false;
        }
        let _ = sock.send_to(&ping, dest);
        if let Ok((n, _)) = sock.recv_from(&mut buf) {
            if n >= 4 && buf[0] >> 4 == 0x7 && buf[2..4] == ping[2..4] {
                return true;
            }
        }
    }
    false
}

/// libcoap's server on a free port, or `None` (skipped).
fn libcoap_server() -> Option<(Proc, u16)> {
    if !on_path("coap-server-notls") {
        if require_peers() {
            panic!("coap-server-notls is not on PATH and MINTGATE_REQUIRE_PEERS is set (install libcoap3-bin)");
        }
        eprintln!(
            "skipping the observe part: coap-server-notls is not on PATH (install libcoap3-bin)"
        );
        return None;
    }
    for _ in 0..5 {
        let port = free_udp_port();
        let mut child = Command::new("coap-server-notls")
            .args(["-A", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawning coap-server-notls");
        if coap_ready(&mut child, port) {
            return Some((Proc(child), port));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("coap-server-notls did not come up");
}

/// A plain subscription to one topic, messages taken as they arrive.
///
/// The bridges' envelopes number messages per publisher across all its
/// topics, so one topic alone shows gaps in `seq`: the order on a topic is
/// checked here as a plain MQTT subscriber sees it (`seq` strictly
/// increasing), not through the reordering `Subscriber`.
struct Collector {
    rx: mpsc::Receiver<Vec<u8>>,
    control: ListenerControl,
    thread: Option<std::thread::JoinHandle<()>>,
    last_seq: u64,
}

impl Collector {
    fn start(url: &BrokerUrl, topic: &str) -> Collector {
        let (listener, control) = Listener::new(ListenerConfig {
            broker: url.clone(),
            filters: vec![topic.to_string()],
            qos: Qos::AtLeastOnce,
            client_id: format!("mg-test-{}", unique()),
            persistent_session: false,
            session_expiry: mintgate_mqtt::conn::DEFAULT_SESSION_EXPIRY,
        });
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            listener.run(|_, payload| {
                let _ = tx.send(payload.to_vec());
            })
        });
        assert!(
            control.wait_subscribed(Duration::from_secs(10)),
            "no SUBACK"
        );
        Collector {
            rx,
            control,
            thread: Some(thread),
            last_seq: 0,
        }
    }

    /// Up to `n` message bodies within `limit`, checked in order.
    fn bodies(&mut self, n: usize, limit: Duration) -> Vec<serde_json::Value> {
        let end = Instant::now() + limit;
        let mut got = Vec::new();
        while got.len() < n {
            let Some(left) = end.checked_duration_since(Instant::now()) else {
                break;
            };
            let Ok(p) = self.rx.recv_timeout(left) else {
                break;
            };
            let env = mintgate_mqtt::decode(&p).expect("an envelope");
            assert!(
                env.seq > self.last_seq,
                "seq {} after {}",
                env.seq,
                self.last_seq
            );
            self.last_seq = env.seq;
            got.push(serde_json::from_str(&env.msg).expect("the body is JSON"));
        }
        got
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.control.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `mintgate get URI`: the payload, if 2.xx.
fn get(uri: &str) -> Option<String> {
    let o = Command::new(env!("CARGO_BIN_EXE_mintgate"))
        .args(["get", uri, "--timeout", "3s"])
        .stdin(Stdio::null())
        .output()
        .expect("running mintgate get");
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// GET /metrics over HTTP/1.0.
fn metrics(port: u16) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("the metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The text without terminal colour sequences (`ESC [ ... m`).
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// `mintgate serve --mqtt --config CFG --log FILTER`, its log to `log`.
fn serve_mqtt(cfg: &Path, filter: &str, log: &Path) -> Proc {
    Proc(
        Command::new(env!("CARGO_BIN_EXE_mintgate"))
            .args(["serve", "--mqtt", "--config"])
            .arg(cfg)
            .args(["--log", filter])
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .expect("running mintgate serve"),
    )
}

/// Publishes `on` to `cmd` until the actuator at `lamp` reads 1 (a command
/// sent before the bridge has subscribed is lost), for at most 20 s.
fn switch_on_once_subscribed(url: &BrokerUrl, cmd: &str, lamp: &str) -> bool {
    (0..40).any(|_| {
        publish_raw(url, cmd, &[b"on".to_vec()], Duration::from_secs(5)).unwrap();
        wait_for(Duration::from_millis(500), || {
            get(lamp).as_deref() == Some("1")
        })
    })
}

fn wait_for(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

fn write_config(
    dir: &Path,
    coap: u16,
    metrics: u16,
    url: &BrokerUrl,
    prefix: &str,
    observe: Option<u16>,
) -> PathBuf {
    let values = dir.join("values.csv");
    let text: String = (1..=40).map(|i| format!("{i}\n")).collect();
    std::fs::write(&values, text).unwrap();
    let mut cfg = format!(
        r#"[coap]
bind = ["127.0.0.1:{coap}"]

[pipeline]
pool = "fixed:1"

[metrics]
bind = "127.0.0.1:{metrics}"

[directpath]
priority = 0
links = ["sq | threshold(23, 21) -> mqtt({prefix}alerts/sq)"]

[[devices.list]]
name = "count"
kind = "sim-sensor"
signal = "replay({values})"
period = "20ms"

[[devices.list]]
name = "sq"
kind = "sim-sensor"
signal = "square(20, 25, 200ms)"
period = "10ms"

[[devices.list]]
name = "lamp"
kind = "sim-actuator"

[mqtt]
broker = "{url}"
state = "{state}"
topic_prefix = "{prefix}"

[[mqtt.publish]]
device = "sq"
topic = "{prefix}slow/sq"
min_interval = "1h"

[[mqtt.command]]
topic = "{prefix}cmd/lamp"
device = "lamp"
"#,
        values = values.display(),
        state = dir.join("queue").display(),
    );
    if let Some(port) = observe {
        cfg.push_str(&format!(
            "\n[[mqtt.observe]]\nuri = \"coap://127.0.0.1:{port}/time\"\ntopic = \"{prefix}libcoap/time\"\n"
        ));
    }
    let f = dir.join("gw.toml");
    std::fs::write(&f, cfg).unwrap();
    f
}

#[test]
fn serve_mqtt_bridges_against_mosquitto() {
    let dir = tmp("bridge");
    let Some(bin) = find_mosquitto() else {
        if require_peers() {
            panic!("mosquitto is not installed and MINTGATE_REQUIRE_PEERS is set (apt-get install mosquitto)");
        }
        eprintln!(
            "skipping: mosquitto is not installed (apt-get install mosquitto to run this test)"
        );
        return;
    };
    let broker = Mosquitto::start(&bin, &dir.join("mosquitto")).expect("starting mosquitto");
    let url = broker.url();
    let libcoap = libcoap_server();
    let prefix = format!("cli/{}/", unique());
    let (coap, mport) = (free_udp_port(), free_tcp_port());
    let cfg = write_config(
        &dir,
        coap,
        mport,
        &url,
        &prefix,
        libcoap.as_ref().map(|l| l.1),
    );

    let mut count = Collector::start(&url, &format!("{prefix}sensors/count"));
    let mut alerts = Collector::start(&url, &format!("{prefix}alerts/sq"));
    let mut slow = Collector::start(&url, &format!("{prefix}slow/sq"));
    let mut time = Collector::start(&url, &format!("{prefix}libcoap/time"));

    let log = dir.join("serve.log");
    let mut serve = serve_mqtt(&cfg, "warn,mintgate_gateway::bridge=info", &log);
    let server_log = || strip_ansi(&std::fs::read_to_string(&log).unwrap_or_default());
    assert!(
        coap_ready(&mut serve.0, coap),
        "serve did not come up: {}",
        server_log()
    );

    // a sensor's values, in order
    let got = count.bodies(40, Duration::from_secs(30));
    assert_eq!(got.len(), 40, "40 values within 30 s: {}", server_log());
    let vals: Vec<f64> = got.iter().map(|j| j["value"].as_f64().unwrap()).collect();
    for w in vals.windows(2) {
        assert_eq!(w[1], w[0] % 40.0 + 1.0, "in order: {vals:?}");
    }

    // the direct path's mqtt output: threshold crossings only
    let got = alerts.bodies(4, Duration::from_secs(20));
    let vals: Vec<f64> = got.iter().map(|j| j["value"].as_f64().unwrap()).collect();
    assert_eq!(vals.len(), 4, "four crossings: {}", server_log());
    assert!(vals.windows(2).all(|w| w[0] != w[1]), "{vals:?}");

    // commands: until the bridge has subscribed, a command is lost (clean
    // session), so the first is repeated until it shows
    let cmd = format!("{prefix}cmd/lamp");
    let lamp = format!("coap://127.0.0.1:{coap}/actuators/lamp");
    assert!(
        switch_on_once_subscribed(&url, &cmd, &lamp),
        "the command never reached the actuator: {}",
        server_log()
    );
    publish_raw(
        &url,
        &cmd,
        &[
            b"banana".to_vec(),
            Vec::new(),
            vec![0xff, 0x00],
            b"0.5".to_vec(),
        ],
        Duration::from_secs(5),
    )
    .unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || get(&lamp).as_deref()
            == Some("0.5")),
        "{}",
        server_log()
    );
    let m = metrics(mport);
    assert_eq!(
        metric(
            &m,
            "mintgate_mqtt_bridge_commands_total{result=\"rejected\"}"
        ),
        Some(3.0),
        "{m}"
    );
    assert!(
        metric(
            &m,
            "mintgate_mqtt_bridge_commands_total{result=\"applied\"}"
        ) >= Some(2.0)
    );
    assert_eq!(metric(&m, "mintgate_mqtt_connected"), Some(1.0), "{m}");
    assert!(metric(&m, "mintgate_mqtt_bridge_enqueued_total") >= Some(40.0));
    // min_interval = 1h: the square wave's first value only
    let got = slow.bodies(2, Duration::from_secs(2));
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        metric(&m, "mintgate_mqtt_bridge_skipped_total") >= Some(50.0),
        "{m}"
    );

    // libcoap's /time, observed and bridged
    if let Some((_, port)) = &libcoap {
        let got = time.bodies(3, Duration::from_secs(15));
        assert_eq!(
            got.len(),
            3,
            "three notifications of /time: {}",
            server_log()
        );
        let uri = format!("coap://127.0.0.1:{port}/time");
        assert!(got.iter().all(|j| j["uri"] == uri.as_str()), "{got:?}");
        let obs: Vec<u64> = got.iter().map(|j| j["observe"].as_u64().unwrap()).collect();
        assert!(obs.windows(2).all(|w| w[0] < w[1]), "{obs:?}");
        assert!(got
            .iter()
            .all(|j| !j["payload"].as_str().unwrap().is_empty()));
    }

    // SIGTERM: a clean stop, the queue drained
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(serve.0.id() as i32, libc::SIGTERM);
    }
    let end = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = serve.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < end, "serve did not stop within 20 s");
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = server_log();
    assert!(status.success(), "exit {status:?}: {text}");
    let stopped = text
        .lines()
        .find(|l| l.contains("MQTT bridges stopped"))
        .unwrap_or_else(|| panic!("no stop line: {text}"));
    assert!(stopped.contains("unacked=0"), "{stopped}");
    assert!(dir.join("queue").join("queue.redb").is_file());
    drop(broker);
    let _ = std::fs::remove_dir_all(&dir);
}

/// One message as `mosquitto_sub -V mqttv5 -F '%t|%E|%P|%p'` prints it.
#[derive(Debug)]
struct Seen {
    topic: String,
    expiry: Option<u64>,
    publisher: Option<String>,
    seq: Option<u64>,
    payload: String,
}

fn parse_seen(line: &str) -> Option<Seen> {
    let mut f = line.splitn(4, '|');
    let (topic, expiry, props, payload) = (f.next()?, f.next()?, f.next()?, f.next()?);
    let prop = |k: &str| {
        props
            .split_whitespace()
            .find_map(|p| p.strip_prefix(k)?.strip_prefix(':').map(str::to_owned))
    };
    Some(Seen {
        topic: topic.into(),
        expiry: expiry.trim().parse().ok(),
        publisher: prop("pub"),
        seq: prop("seq").and_then(|s| s.parse().ok()),
        payload: payload.into(),
    })
}

/// Payload formats (SenML, bare), topic templates and the MQTT 5
/// properties (publisher and seq as user properties, message expiry), as
/// mosquitto's own `mosquitto_sub` sees them.
#[test]
fn formats_templates_and_mqtt5_properties_against_mosquitto() {
    let dir = tmp("formats");
    let (Some(bin), true) = (find_mosquitto(), on_path("mosquitto_sub")) else {
        if require_peers() {
            panic!("mosquitto or mosquitto_sub is not installed and MINTGATE_REQUIRE_PEERS is set (apt-get install mosquitto mosquitto-clients)");
        }
        eprintln!("skipping: mosquitto or mosquitto_sub is not installed");
        return;
    };
    let broker = Mosquitto::start(&bin, &dir.join("mosquitto")).expect("starting mosquitto");
    let root = format!("fmt-{}", unique());
    let (coap, mport) = (free_udp_port(), free_tcp_port());
    let values = dir.join("values.csv");
    let n = 30usize;
    std::fs::write(
        &values,
        (1..=n).map(|i| format!("{i}\n")).collect::<String>(),
    )
    .unwrap();
    let cfg = dir.join("gw.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"[coap]
bind = ["127.0.0.1:{coap}"]
[pipeline]
pool = "fixed:1"
[metrics]
bind = "127.0.0.1:{mport}"
[[devices.list]]
name = "temp0"
kind = "sim-sensor"
signal = "replay({values})"
period = "20ms"
unit = "Cel"
[[devices.list]]
name = "temp1"
kind = "sim-sensor"
signal = "replay({values})"
period = "20ms"
[mqtt]
broker = "mqtt5://127.0.0.1:{port}"
state = "{state}"
publish_devices = false
format = "senml"
message_expiry = "1h"
status_topic = "{root}/status/{{gateway}}"
[[mqtt.publish]]
device = "temp0"
topic = "{root}/{{gateway}}/{{kind}}/{{device}}"
[[mqtt.publish]]
device = "temp1"
topic = "{root}/bare/{{device}}"
format = "bare"
"#,
            values = values.display(),
            port = broker.port(),
            state = dir.join("queue").display(),
        ),
    )
    .unwrap();
    let sub_out = dir.join("sub.txt");
    let sub = Proc(
        Command::new("mosquitto_sub")
            .args(["-V", "mqttv5", "-h", "127.0.0.1", "-p"])
            .arg(broker.port().to_string())
            .args(["-t", &format!("{root}/#"), "-F", "%t|%E|%P|%p", "-W", "60"])
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&sub_out).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .expect("running mosquitto_sub"),
    );
    // mosquitto_sub subscribed: a probe it prints
    assert!(
        wait_for(Duration::from_secs(10), || {
            let _ = publish_raw(
                &broker.url(),
                &format!("{root}/probe"),
                &[b"p".to_vec()],
                Duration::from_secs(2),
            );
            std::fs::read_to_string(&sub_out).is_ok_and(|t| t.contains("/probe|"))
        }),
        "mosquitto_sub did not subscribe"
    );
    let log = dir.join("serve.log");
    let _serve = serve_mqtt(&cfg, "warn", &log);
    let seen = || -> Vec<Seen> {
        std::fs::read_to_string(&sub_out)
            .unwrap_or_default()
            .lines()
            .filter_map(parse_seen)
            .filter(|s| !s.topic.ends_with("/probe"))
            .collect()
    };
    let bare_topic = format!("{root}/bare/temp1");
    let done = wait_for(Duration::from_secs(30), || {
        let s = seen();
        s.iter().filter(|m| m.topic == bare_topic).count() >= n
            && s.iter()
                .filter(|m| m.payload.starts_with('['))
                .map(|m| m.payload.matches("\"n\"").count())
                .sum::<usize>()
                >= n
    });
    let s = seen();
    let server_log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(done, "not all values within 30 s: {s:?} {server_log}");

    // every queued publish: expiry within the hour, publisher and seq
    let gw = s
        .iter()
        .find_map(|m| m.publisher.clone())
        .unwrap_or_else(|| panic!("no publisher property: {s:?}"));
    let status = format!("{root}/status/{gw}");
    for m in s.iter().filter(|m| m.topic != status) {
        assert!(
            m.expiry.is_some_and(|e| (3590..=3600).contains(&e)),
            "{m:?}"
        );
        assert_eq!(m.publisher.as_deref(), Some(gw.as_str()), "{m:?}");
    }
    // the status topic, with the gateway id
    assert!(
        s.iter().any(|m| m.topic == status && m.payload == "online"),
        "{s:?}"
    );
    // the replayed values come round in order (the first ones may have
    // been sampled before the bridges started)
    let in_order = |v: &[f64]| v.windows(2).all(|w| w[1] == w[0] % n as f64 + 1.0);
    // bare: the values alone, their seqs 1, 2, 3, ...
    let bare: Vec<&Seen> = s.iter().filter(|m| m.topic == bare_topic).collect();
    let vals: Vec<f64> = bare.iter().map(|m| m.payload.parse().unwrap()).collect();
    assert!(in_order(&vals), "{vals:?}");
    for (i, m) in bare.iter().enumerate() {
        assert_eq!(m.seq, Some(i as u64 + 1), "{bare:?}");
    }
    // SenML on the templated topic: one pack per batch, records in order
    let senml_topic = format!("{root}/{gw}/sim-sensor/temp0");
    let mut vals = Vec::new();
    let mut seqs = Vec::new();
    for m in s.iter().filter(|m| m.payload.starts_with('[')) {
        assert_eq!(m.topic, senml_topic, "{m:?}");
        seqs.push(m.seq.unwrap());
        let pack: serde_json::Value = serde_json::from_str(&m.payload).unwrap();
        let recs = pack.as_array().unwrap();
        assert_eq!(recs[0]["bn"], format!("{gw}/"), "{m:?}");
        for r in recs {
            assert_eq!(
                (r["n"].as_str(), r["u"].as_str()),
                (Some("temp0"), Some("Cel"))
            );
            assert!(r["t"].as_f64().unwrap() > 1.0e9, "absolute time: {r}");
            vals.push(r["v"].as_f64().unwrap());
        }
    }
    assert!(vals.len() >= n && in_order(&vals), "{vals:?}");
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());

    // `mintgate subscribe` orders bare payloads by their MQTT 5 properties
    let o = Command::new(env!("CARGO_BIN_EXE_mintgate"))
        .args(["subscribe", "--broker"])
        .arg(format!("mqtt5://127.0.0.1:{}", broker.port()))
        .args([
            "--topic",
            &bare_topic,
            "--count",
            "5",
            "--json",
            "--timeout",
            "20s",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("running mintgate subscribe");
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 5, "{o:?}");
    for w in lines.windows(2) {
        assert_eq!(w[0]["pub"], gw.as_str());
        assert_eq!(
            w[1]["seq"].as_u64(),
            w[0]["seq"].as_u64().map(|s| s + 1),
            "{lines:?}"
        );
    }
    drop(sub);
    drop(broker);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `mqtt.command_session_expiry` (MQTT 5): the command subscription's
/// session outlives the gateway, so a command sent while it was down
/// (killed -9) is applied when it comes back; with a clean session (the
/// default, and the first test above) it would be lost.
#[test]
fn commands_sent_while_away_are_applied_with_a_persistent_command_session() {
    let dir = tmp("cmdsession");
    let Some(bin) = find_mosquitto() else {
        assert!(
            !require_peers(),
            "mosquitto is not installed (apt-get install mosquitto)"
        );
        return;
    };
    let broker = Mosquitto::start(&bin, &dir.join("mosquitto")).expect("starting mosquitto");
    let url = broker.url();
    let url5 = format!("mqtt5://127.0.0.1:{}", broker.port());
    let prefix = format!("cli/{}/", unique());
    let coap = free_udp_port();
    let cfg = dir.join("gw.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"[coap]
bind = ["127.0.0.1:{coap}"]

[[devices.list]]
name = "lamp"
kind = "sim-actuator"

[mqtt]
broker = "{url5}"
state = "{state}"
publish_devices = false
command_session_expiry = "1h"

[[mqtt.command]]
topic = "{prefix}cmd/lamp"
device = "lamp"
"#,
            state = dir.join("queue").display(),
        ),
    )
    .unwrap();
    let cmd = format!("{prefix}cmd/lamp");
    let lamp = format!("coap://127.0.0.1:{coap}/actuators/lamp");
    let log = dir.join("serve.log");
    let server_log = || strip_ansi(&std::fs::read_to_string(&log).unwrap_or_default());
    let mut serve = serve_mqtt(&cfg, "warn", &log);
    assert!(coap_ready(&mut serve.0, coap), "{}", server_log());
    // subscribed once a command shows
    assert!(
        switch_on_once_subscribed(&url, &cmd, &lamp),
        "the command never reached the actuator: {}",
        server_log()
    );
    drop(serve); // killed -9
    publish_raw(&url, &cmd, &[b"0.25".to_vec()], Duration::from_secs(5)).unwrap();
    let log2 = dir.join("serve2.log");
    let mut serve = serve_mqtt(&cfg, "warn", &log2);
    assert!(coap_ready(&mut serve.0, coap), "{}", server_log());
    assert!(
        wait_for(Duration::from_secs(20), || get(&lamp).as_deref()
            == Some("0.25")),
        "the command sent while the gateway was away was not applied (lamp {:?}): {}",
        get(&lamp),
        strip_ansi(&std::fs::read_to_string(&log2).unwrap_or_default())
    );
    drop(serve);
    drop(broker);
    let _ = std::fs::remove_dir_all(&dir);
}
