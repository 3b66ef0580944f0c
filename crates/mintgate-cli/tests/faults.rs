//! Faults: a crash under load, and a state folder that cannot be written.
//! - `kill -9` of `mintgate serve` under load, then a restart: the device
//!   histories it had stored and the MQTT messages it had queued are all
//!   there, none lost;
//! - a read-only history folder is a clear error at start; a full MQTT
//!   queue folder is a warning, and the gateway serves (its queue refuses
//!   messages until there is space; crates/mintgate-mqtt/tests/disk_full.rs
//!   fills a disk while the queue runs).
//!
//! What "stored" means, precisely: the history store is flushed once a
//! second (docs/config.md, `devices.store`), so the records a client read
//! more than a flush period before the kill must all come back; the MQTT
//! queue commits each message durably before it counts as enqueued, so
//! every message the bridge had enqueued (`mintgate_mqtt_bridge_enqueued_total`)
//! must reach a subscriber, in order, with no sequence number skipped.
//!
//! The MQTT part needs only mintgate (its broker runs as a separate process,
//! so that it survives the gateway's kill). The full-disk and read-only
//! cases mount a tmpfs inside a private mount namespace (`unshare -m`, so
//! nothing stays mounted whatever happens); they need root and are skipped
//! with a message otherwise (unless MINTGATE_REQUIRE_PEERS is set).

mod common;

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;

/// A child killed on drop.
struct Kid(Child);

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The records of `mintgate get coap://.../PATH/history` as (ms, value).
fn history(coap: u16, path: &str) -> HashSet<(u64, String)> {
    // just after a start the devices' resources may not be added yet
    // (`/request` answers first): 4.04 (exit 3) is retried for a while
    let end = Instant::now() + Duration::from_secs(20);
    let o = loop {
        let o = mintgate(&["get", &format!("coap://127.0.0.1:{coap}/{path}/history")]);
        if o.status.code() != Some(3) || Instant::now() > end {
            break o;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(o.status.success(), "{o:?}");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .skip(1)
        .filter_map(|l| {
            let (t, v) = l.split_once(',')?;
            Some((t.parse().ok()?, v.to_owned()))
        })
        .collect()
}

/// One CON PUT of `value` to /actuators/led0; true on 2.04.
fn put_led(s: &UdpSocket, mid: u16, value: u32) -> bool {
    let mut m = vec![0x42, 0x03];
    m.extend_from_slice(&mid.to_be_bytes());
    m.extend_from_slice(&[0x5A, 0x5A, 0xB9]);
    m.extend_from_slice(b"actuators");
    m.push(0x04);
    m.extend_from_slice(b"led0");
    m.push(0xFF);
    m.extend_from_slice(value.to_string().as_bytes());
    if s.send(&m).is_err() {
        return false;
    }
    let mut b = [0u8; 512];
    let end = Instant::now() + Duration::from_millis(500);
    while Instant::now() < end {
        match s.recv(&mut b) {
            Ok(n) if n >= 4 && b[2..4] == mid.to_be_bytes() => return b[1] == 0x44,
            Ok(_) => continue,
            Err(_) => return false,
        }
    }
    false
}

fn metric_at(port: u16, name: &str) -> f64 {
    let (_, _, text) = http(port, "GET", "/metrics", &[], b"");
    metric(&text, name).unwrap_or_else(|| panic!("{name} not in /metrics"))
}

#[test]
fn kill_9_under_load_loses_no_stored_history_and_no_queued_message() {
    let started = Instant::now();
    let dir = tmp_dir("faults-kill");
    let (coap, metrics, broker, broker5) = (free_udp(), free_tcp(), free_tcp(), free_tcp());
    let coap_addr: SocketAddr = format!("127.0.0.1:{coap}").parse().unwrap();

    // the broker and a subscriber, both outliving the gateway
    let _broker = Kid(Command::new(BIN)
        .args(["--log", "warn", "broker", "--listen"])
        .arg(format!("127.0.0.1:{broker}"))
        .arg("--listen-v5")
        .arg(format!("127.0.0.1:{broker5}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the broker"));
    let end = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", broker)).is_err() {
        assert!(Instant::now() < end, "the broker did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut sub = Kid(Command::new(BIN)
        .args([
            "--log",
            "warn",
            "subscribe",
            "--json",
            "--gap-timeout",
            "60s",
        ])
        .args(["--topic", "mintgate/#", "--broker"])
        .arg(format!("mqtt://127.0.0.1:{broker}"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the subscriber"));
    // (topic, seq, skipped_before) of every delivery, in order (sequence
    // numbers count per topic)
    let got: Arc<Mutex<Vec<(String, u64, u64)>>> = Arc::default();
    {
        let got = got.clone();
        let out = sub.0.stdout.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&l) {
                    let n = |k: &str| v[k].as_u64().unwrap_or(u64::MAX);
                    let topic = v["topic"].as_str().unwrap_or("?").to_string();
                    got.lock()
                        .unwrap()
                        .push((topic, n("seq"), n("skipped_before")));
                }
            }
        });
    }
    let subscribed = Arc::new(AtomicBool::new(false));
    {
        let subscribed = subscribed.clone();
        let err = sub.0.stderr.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                if l.contains("subscribed to") {
                    subscribed.store(true, Ordering::Relaxed);
                }
            }
        });
    }
    let end = Instant::now() + Duration::from_secs(10);
    while !subscribed.load(Ordering::Relaxed) {
        assert!(Instant::now() < end, "the subscriber did not subscribe");
        std::thread::sleep(Duration::from_millis(50));
    }

    // a sensor sampled 10 times a second, and the actuator written about
    // 150 times a second: each value a history record and a queued MQTT
    // message (slower sampling keeps the history's representation still
    // long enough for a block-wise GET)
    let cfg = write_config(
        &dir,
        coap,
        &format!(
            "[metrics]\nbind = \"127.0.0.1:{metrics}\"\n\
             [devices]\nstore = \"{}\"\n\
             [[devices.list]]\nname = \"temp0\"\nkind = \"sim-sensor\"\n\
             signal = \"walk(20, 0.1, 0, 40)\"\nperiod = \"100ms\"\nhistory = 100000\n\
             [[devices.list]]\nname = \"led0\"\nkind = \"sim-actuator\"\nhistory = 100000\n\
             [mqtt]\nenabled = true\nbroker = \"mqtt://127.0.0.1:{broker}\"\nstate = \"{}\"\n",
            dir.join("history").display(),
            dir.join("mqtt").display()
        ),
    );
    let mut gw = Serve::start(&cfg, &dir.join("serve1.log"), &[]);
    gw.wait_coap(coap_addr, Duration::from_secs(30));
    gw.wait_log("mintgate serving CoAP", Duration::from_secs(30));

    // load: a NON flood on /request and a stream of acknowledged PUTs
    let load = std::thread::spawn(move || {
        let mut spec = mintgate_loadgen::LoadSpec::new(
            coap_addr,
            "/request",
            mintgate_loadgen::Mode::Open {
                clients: 50,
                rate_per_client: 100.0,
            },
        );
        spec.duration = Duration::from_secs(4);
        spec.warmup = Duration::ZERO;
        spec.timeout = Duration::from_millis(500);
        mintgate_loadgen::run(&spec, |_| {})
    });
    let stop_puts = Arc::new(AtomicBool::new(false));
    // the PUTs pause while a history is read: a resource changing every few
    // milliseconds cannot be read block-wise (its ETag changes in between)
    let pause_puts = Arc::new(AtomicBool::new(false));
    let puts = {
        let stop = stop_puts.clone();
        let pause = pause_puts.clone();
        std::thread::spawn(move || {
            let s = UdpSocket::bind("127.0.0.1:0").unwrap();
            s.connect(coap_addr).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
            let mut acked = 0u32;
            let mut v = 1u32;
            while !stop.load(Ordering::Relaxed) && v < 100_000 {
                if pause.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                }
                if put_led(&s, v as u16, v) {
                    acked += 1;
                }
                v += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            acked
        })
    };
    std::thread::sleep(Duration::from_secs(2));
    pause_puts.store(true, Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(20));
    let temp_before = history(coap, "sensors/temp0");
    let led_before = history(coap, "actuators/led0");
    pause_puts.store(false, Ordering::Relaxed);
    // a flush period and more, still under load, then the kill
    std::thread::sleep(Duration::from_millis(1500));
    let enqueued = metric_at(metrics, "mintgate_mqtt_bridge_enqueued_total") as u64;
    gw.kill9();
    stop_puts.store(true, Ordering::Relaxed);
    let acked = puts.join().unwrap();
    let report = load.join().unwrap().expect("load ran");
    println!(
        "before the kill: {} temp0 and {} led0 records read, {enqueued} MQTT messages enqueued, \
         {acked} PUTs acknowledged, {} NON GETs answered",
        temp_before.len(),
        led_before.len(),
        report.received
    );
    assert!(temp_before.len() >= 10 && led_before.len() >= 50 && enqueued >= 50);

    // restart on the same state
    let mut gw = Serve::start(&cfg, &dir.join("serve2.log"), &[]);
    gw.wait_coap(coap_addr, Duration::from_secs(30));
    let temp_after = history(coap, "sensors/temp0");
    let led_after = history(coap, "actuators/led0");
    let lost_temp: Vec<_> = temp_before.difference(&temp_after).collect();
    let lost_led: Vec<_> = led_before.difference(&led_after).collect();
    assert!(lost_temp.is_empty(), "temp0 records lost: {lost_temp:?}");
    assert!(lost_led.is_empty(), "led0 records lost: {lost_led:?}");

    // every message enqueued before the kill reaches the subscriber, in
    // order, none skipped
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let g = got.lock().unwrap().clone();
        let mut per_topic: std::collections::BTreeMap<&str, Vec<u64>> = Default::default();
        for (t, seq, _) in &g {
            per_topic.entry(t.as_str()).or_default().push(*seq);
        }
        let top = g.len() as u64;
        if top >= enqueued {
            for (t, seqs) in &per_topic {
                let want: Vec<u64> = (1..=seqs.len() as u64).collect();
                assert_eq!(seqs, &want, "{t}: delivered in order, each once, from 1");
            }
            assert!(g.iter().all(|d| d.2 == 0), "nothing skipped");
            println!(
                "after the restart: {} temp0 and {} led0 records; {top} MQTT messages delivered, \
                 each topic 1..N in order ({per_topic:?} by topic; >= the {enqueued} enqueued \
                 before the kill); {secs:.1} s",
                temp_after.len(),
                led_after.len(),
                per_topic = per_topic
                    .iter()
                    .map(|(t, v)| (*t, v.len()))
                    .collect::<Vec<_>>(),
                secs = started.elapsed().as_secs_f64()
            );
            break;
        }
        assert!(
            Instant::now() < end,
            "only {top} of the {enqueued} MQTT messages arrived:\n{}",
            gw.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(gw.terminate(Duration::from_secs(10)), "{}", gw.log_text());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Root and `unshare` for a private mount namespace; otherwise a skip
/// message (a failure when MINTGATE_REQUIRE_PEERS is set).
fn can_mount() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let ok = root
        && Command::new("unshare")
            .args(["-m", "true"])
            .status()
            .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("MINTGATE_REQUIRE_PEERS").is_none(),
            "root and unshare(1) are required (MINTGATE_REQUIRE_PEERS is set)"
        );
        eprintln!("skipping: needs root and unshare(1) to mount a small tmpfs privately");
    }
    ok
}

/// Runs `mintgate serve -c cfg` after `prepare` (shell commands) in a
/// private mount namespace; its exit status and stderr, and whether it
/// answered a CoAP GET of /.well-known/core on `coap` meanwhile.
fn serve_in_namespace(prepare: &str, cfg: &Path, coap: u16) -> (Option<i32>, String, bool) {
    let script = format!("set -e; {prepare}; exec \"$0\" --log warn serve -c \"$1\"",);
    let mut child = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script, BIN])
        .arg(cfg)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run unshare");
    // a gateway that started after all is stopped after 10 s
    let end = Instant::now() + Duration::from_secs(10);
    let mut served = false;
    while Instant::now() < end {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        if !served {
            served = coap_get(([127, 0, 0, 1], coap).into(), ".well-known/core").is_some();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if matches!(child.try_wait(), Ok(None)) {
        let _ = child.kill();
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        served,
    )
}

#[test]
fn read_only_state_folder_is_an_error_a_full_queue_folder_a_warning() {
    if !can_mount() {
        return;
    }
    let dir = tmp_dir("faults-fs");
    let mnt = dir.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let coap = free_udp();
    let write_cfg = |name: &str, section: &str| {
        let p = dir.join(name);
        std::fs::write(
            &p,
            format!("[coap]\nbind = [\"127.0.0.1:{coap}\"]\n{section}"),
        )
        .unwrap();
        p
    };
    let m = mnt.display();
    // a read-only file system: the history store
    let cfg = write_cfg("ro.toml", &format!("[devices]\nstore = \"{m}/history\"\n"));
    let (code, err, _) = serve_in_namespace(
        &format!("mount -t tmpfs -o size=1m tmpfs {m}; mkdir {m}/history; mount -o remount,ro {m}"),
        &cfg,
        coap,
    );
    println!("read-only: exit {code:?}: {err}");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("devices.store") && err.contains("Read-only file system"),
        "{err}"
    );
    // a full file system: the MQTT queue; the gateway starts and serves
    // (killed after 10 s), with a warning
    let cfg = write_cfg(
        "full.toml",
        &format!("[mqtt]\nenabled = true\nstate = \"{m}/mqtt\"\nembedded_listen = \"127.0.0.1:0\"\nembedded_listen5 = \"127.0.0.1:0\"\n"),
    );
    let (code, err, served) = serve_in_namespace(
        &format!(
            "mount -t tmpfs -o size=256k tmpfs {m}; mkdir {m}/mqtt; \
             dd if=/dev/zero of={m}/fill bs=4k count=1000 2>/dev/null || true"
        ),
        &cfg,
        coap,
    );
    println!("full: exit {code:?}, served {served}: {err}");
    assert_eq!(code, None, "still running when killed: {err}");
    assert!(served, "CoAP was not served: {err}");
    assert!(
        err.contains("mqtt.state")
            && err.contains("No space left on device")
            && err.contains("starting anyway"),
        "{err}"
    );
    // nearly full (room for the probe, not for 1 MiB): the space check
    // warns the same way
    let (code, err, served) = serve_in_namespace(
        &format!("mount -t tmpfs -o size=512k tmpfs {m}; mkdir {m}/mqtt"),
        &cfg,
        coap,
    );
    println!("nearly full: exit {code:?}, served {served}: {err}");
    assert_eq!(code, None, "still running when killed: {err}");
    assert!(served, "CoAP was not served: {err}");
    assert!(
        err.contains("mqtt.state") && err.contains("bytes free"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A broker the MQTT bridges cannot reach is said in the log (after 2 s
/// of failed attempts), not only in /api/state.
#[test]
fn an_unreachable_broker_is_logged() {
    let dir = common::tmp_dir("unreachable-broker");
    let coap = common::free_udp();
    let broker = common::closed_port(true);
    let state = dir.join("mqtt-state");
    let cfg = common::write_config(
        &dir,
        coap,
        &format!(
            "[mqtt]\nenabled = true\nbroker = \"mqtt://127.0.0.1:{broker}\"\nstate = \"{}\"\n",
            state.display()
        ),
    );
    let mut s = common::Serve::start(&cfg, &dir.join("serve.log"), &[]);
    s.wait_log(
        &format!("cannot connect to mqtt://127.0.0.1:{broker}"),
        Duration::from_secs(20),
    );
    assert!(s.log_text().contains("refused"), "{}", s.log_text());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A lab stopped by SIGTERM (a plain `kill`, which reaches the lab alone,
/// not its process group) stops the servers it started too, and exits
/// 128 + 15.
#[test]
fn a_killed_lab_stops_the_servers_it_started() {
    let dir = common::tmp_dir("lab-sigterm");
    let mut lab = Command::new(common::BIN)
        .args(["lab", "overload", "--quick", "--out"])
        .arg(dir.join("out"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lab_pid = lab.id().to_string();
    let children = || -> Vec<u32> {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .ok()
                    .and_then(|st| {
                        let rest = st[st.rfind(')')? + 1..].to_string();
                        rest.split_whitespace().nth(1).map(|pp| pp == lab_pid)
                    })
                    .unwrap_or(false)
            })
            .collect()
    };
    // wait for the lab's `mintgate serve`
    let end = Instant::now() + Duration::from_secs(30);
    let mut kids = Vec::new();
    while kids.is_empty() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(100));
        kids = children();
    }
    assert!(!kids.is_empty(), "the lab started no server");
    // SAFETY: signalling our own child by its pid.
    unsafe { libc::kill(lab.id() as libc::pid_t, libc::SIGTERM) };
    let st = lab.wait().unwrap();
    assert_eq!(st.code(), Some(143));
    let end = Instant::now() + Duration::from_secs(10);
    let gone = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|st| {
                st[st.rfind(')').unwrap_or(0) + 1..]
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(true)
    };
    while !kids.iter().all(|&p| gone(p)) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left: Vec<u32> = kids.iter().copied().filter(|&p| !gone(p)).collect();
    for &p in &left {
        // SAFETY: cleaning up what the lab left, by pid.
        unsafe { libc::kill(p as libc::pid_t, libc::SIGKILL) };
    }
    assert!(left.is_empty(), "still running after the lab: {left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// bench says by its exit status when a run measured nothing: 5 when the
/// target never answered, 3 when it answered only with errors.
#[test]
fn bench_exit_status_tells_a_run_that_measured_nothing() {
    let bench = |uri: &str| {
        Command::new(common::BIN)
            .args([
                "bench",
                uri,
                "--duration",
                "1s",
                "--warmup",
                "0s",
                "--clients",
                "2",
            ])
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let closed = common::closed_port(false);
    let o = bench(&format!("coap://127.0.0.1:{closed}/request"));
    assert_eq!(o.status.code(), Some(5), "{o:?}");
    let dir = common::tmp_dir("bench-exit");
    let coap = common::free_udp();
    let cfg = common::write_config(&dir, coap, "");
    let mut s = common::Serve::start(&cfg, &dir.join("serve.log"), &[]);
    let addr: SocketAddr = format!("127.0.0.1:{coap}").parse().unwrap();
    s.wait_coap(addr, Duration::from_secs(15));
    let o = bench(&format!("coap://127.0.0.1:{coap}/no-such-path"));
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    let o = bench(&format!("coap://127.0.0.1:{coap}/request"));
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
