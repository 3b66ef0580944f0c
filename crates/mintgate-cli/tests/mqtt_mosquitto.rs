//! `mintgate publish` / `mintgate subscribe` against a real mosquitto:
//! a `kill -9` of the publisher mid-stream, resumed from its state folder,
//! and a broker restart mid-stream; in both the subscriber must get 1..=N,
//! each once, in order.
//!
//! Each test starts its own mosquitto on a free loopback port with a
//! generated config (not Debian's service on 1883). Without mosquitto the
//! tests are skipped with a message, unless `MINTGATE_REQUIRE_PEERS` is set,
//! in which case they fail.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mintgate_mqtt::broker::{find_mosquitto, Mosquitto};

mod common;
use mintgate_mqtt::reorder::ReorderConfig;
use mintgate_mqtt::{SubEvent, Subscriber, SubscriberConfig};

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "mintgate-test-{name}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Starts a private mosquitto, or `None` (skipped) when it is not installed
/// and peers are not required.
fn mosquitto(dir: &std::path::Path) -> Option<Mosquitto> {
    let Some(bin) = find_mosquitto() else {
        if std::env::var_os("MINTGATE_REQUIRE_PEERS").is_some() {
            panic!("mosquitto is not installed and MINTGATE_REQUIRE_PEERS is set (apt-get install mosquitto)");
        }
        eprintln!(
            "skipping: mosquitto is not installed (apt-get install mosquitto to run this test)"
        );
        return None;
    };
    Some(Mosquitto::start(&bin, dir).expect("starting mosquitto"))
}

/// A child process killed on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn mintgate(args: &[String]) -> Proc {
    Proc(
        Command::new(env!("CARGO_BIN_EXE_mintgate"))
            .args(args)
            .arg("--log=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running mintgate"),
    )
}

/// Waits for the process to exit (at most `limit`); returns its code and
/// output, or panics.
fn finish(mut p: Proc, limit: Duration) -> (i32, String, String) {
    let end = Instant::now() + limit;
    loop {
        if let Some(status) = p.0.try_wait().unwrap() {
            let mut out = String::new();
            let mut err = String::new();
            use std::io::Read;
            if let Some(mut s) = p.0.stdout.take() {
                s.read_to_string(&mut out).unwrap();
            }
            if let Some(mut s) = p.0.stderr.take() {
                s.read_to_string(&mut err).unwrap();
            }
            return (status.code().unwrap_or(-1), out, err);
        }
        assert!(
            Instant::now() < end,
            "mintgate did not finish within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Delivered sequences of one run, as collected by a subscriber.
#[derive(Default)]
struct Seen {
    delivered: Vec<u64>,
    skipped: u64,
}

/// An in-process subscriber collecting deliveries in a thread.
fn collect_in_background(
    mut sub: Subscriber,
    n: usize,
    limit: Duration,
) -> (Arc<Mutex<Seen>>, std::thread::JoinHandle<Subscriber>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let s2 = seen.clone();
    let h = std::thread::spawn(move || {
        let end = Instant::now() + limit;
        while Instant::now() < end && s2.lock().unwrap().delivered.len() < n {
            if let Some(SubEvent::Delivery(d)) = sub.recv_timeout(Duration::from_millis(100)) {
                let mut s = s2.lock().unwrap();
                s.skipped += d.skipped_before;
                s.delivered.push(d.env.seq);
            }
        }
        sub
    });
    (seen, h)
}

fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn publisher_kill_9_mid_stream_then_resume() {
    let dir = tmp("kill9");
    let Some(broker) = mosquitto(&dir.join("broker")) else {
        return;
    };
    const N: usize = 1500;
    let topic = "mintgate/test/kill9".to_string();
    let mut sc = SubscriberConfig::new(broker.url(), topic.clone());
    sc.reorder = ReorderConfig {
        first_seq: Some(1),
        gap_timeout: Some(Duration::from_secs(20)),
        ..ReorderConfig::default()
    };
    let mut sub = Subscriber::start(sc).unwrap();
    assert!(
        sub.wait_subscribed(Duration::from_secs(10)),
        "no SUBACK from mosquitto"
    );
    let (seen, collector) = collect_in_background(sub, N, Duration::from_secs(80));

    let state = dir.join("state");
    let args: Vec<String> = [
        "publish",
        "--broker",
        &broker.url().to_string(),
        "--topic",
        &topic,
        "--count",
        &N.to_string(),
        "--rate",
        "600",
        "--state",
        state.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut first = mintgate(&args);
    assert!(
        wait_for(Duration::from_secs(30), || seen
            .lock()
            .unwrap()
            .delivered
            .len()
            >= 400),
        "the publisher did not get going"
    );
    // kill -9 (SIGKILL) mid-stream.
    first.0.kill().unwrap();
    let status = first.0.wait().unwrap();
    assert_eq!(
        status.code(),
        None,
        "the publisher was not killed by the signal but exited"
    );
    let at_kill = seen.lock().unwrap().delivered.len();
    assert!(
        at_kill < N,
        "the publisher finished before the kill ({at_kill})"
    );
    drop(first);

    let (code, out, err) = finish(mintgate(&args), Duration::from_secs(60));
    assert_eq!(code, 0, "resumed publish failed:\n{out}\n{err}");
    assert!(
        err.contains("publish: resuming"),
        "the second run did not resume:\n{err}"
    );
    assert!(out.contains("publish complete"), "{out}");

    let sub = collector.join().unwrap();
    let s = seen.lock().unwrap();
    assert_eq!(s.skipped, 0, "messages lost (gaps skipped)");
    assert_eq!(
        s.delivered,
        (1..=N as u64).collect::<Vec<_>>(),
        "not 1..=N once in order"
    );
    eprintln!(
        "kill -9 at {at_kill}/{N} delivered; subscriber stats after resume: {:?}",
        sub.stats()
    );
    drop(broker);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn broker_restart_mid_stream() {
    let dir = tmp("restart");
    let Some(mut broker) = mosquitto(&dir.join("broker")) else {
        return;
    };
    const N: usize = 1500;
    let url = broker.url().to_string();
    let topic = "mintgate/test/restart";
    // The subscriber is `mintgate subscribe` with a persistent session, so
    // mosquitto keeps (and saves on SIGTERM) what is queued for it.
    let mut subp = mintgate(
        &[
            "subscribe",
            "--broker",
            &url,
            "--topic",
            topic,
            "--count",
            "1500",
            "--json",
            "--client-id",
            "mintgate-test-restart-sub",
            "--persistent",
            "--timeout",
            "90s",
            "--gap-timeout",
            "30s",
        ]
        .map(String::from),
    );
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let l2 = lines.clone();
    let stdout = subp.0.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines().map_while(Result::ok) {
            l2.lock().unwrap().push(l);
        }
    });
    let subscribed = Arc::new(Mutex::new(Vec::<String>::new()));
    let s2 = subscribed.clone();
    let stderr = subp.0.stderr.take().unwrap();
    let err_reader = std::thread::spawn(move || {
        for l in BufReader::new(stderr).lines().map_while(Result::ok) {
            s2.lock().unwrap().push(l);
        }
    });
    assert!(
        wait_for(Duration::from_secs(15), || subscribed
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("subscribed to"))),
        "mintgate subscribe did not subscribe"
    );

    let state = dir.join("state");
    let publ = mintgate(
        &[
            "publish",
            "--broker",
            &url,
            "--topic",
            topic,
            "--count",
            "1500",
            "--rate",
            "500",
            "--state",
            state.to_str().unwrap(),
            "--timeout",
            "80s",
        ]
        .map(String::from),
    );
    assert!(
        wait_for(Duration::from_secs(30), || lines.lock().unwrap().len()
            >= 400),
        "nothing arrived before the restart"
    );
    broker.restart().expect("restarting mosquitto");
    let at_restart = lines.lock().unwrap().len();
    assert!(at_restart < N, "the stream finished before the restart");

    let (code, out, err) = finish(publ, Duration::from_secs(85));
    assert_eq!(code, 0, "publish failed:\n{out}\n{err}");
    let (scode, _, _) = finish(subp, Duration::from_secs(60));
    reader.join().unwrap();
    err_reader.join().unwrap();
    let errs = subscribed.lock().unwrap().join("\n");
    assert_eq!(
        scode, 0,
        "mintgate subscribe did not get --count messages:\n{errs}"
    );
    assert!(
        errs.contains("disconnected"),
        "the subscriber never saw the restart:\n{errs}"
    );
    let mut seqs = Vec::new();
    for l in lines.lock().unwrap().iter() {
        let v: serde_json::Value = serde_json::from_str(l).expect("a JSON line");
        assert_eq!(v["skipped_before"], 0, "a gap was skipped: {l}");
        assert_eq!(v["msg"].as_str().unwrap().len(), 4, "{l}");
        seqs.push(v["seq"].as_u64().unwrap());
    }
    assert_eq!(
        seqs,
        (1..=N as u64).collect::<Vec<_>>(),
        "not 1..=N once in order"
    );
    eprintln!("restart at {at_restart}/{N} delivered; publisher: {out}; subscriber: {errs}");
    drop(broker);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A broker that is not there is said at once, not waited on in silence;
/// `--timeout` then gives up with exit 1 (no mosquitto needed).
#[test]
fn subscribe_says_when_the_broker_is_not_there() {
    let port = common::closed_port(true);
    let p = mintgate(&[
        "subscribe".into(),
        "--broker".into(),
        format!("mqtt://127.0.0.1:{port}"),
        "--topic".into(),
        "t".into(),
        "--count".into(),
        "1".into(),
        "--timeout".into(),
        "3s".into(),
    ]);
    let (code, _, err) = finish(p, Duration::from_secs(20));
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!(
            "subscribe: NOT connected to mqtt://127.0.0.1:{port}"
        )) && err.contains("refused"),
        "{err}"
    );
    // said once while it retries (after a second, not per retry), once more
    // in the closing line
    assert_eq!(err.matches("NOT connected").count(), 2, "{err}");
    assert!(err.contains("never subscribed"), "{err}");
    // without --count too: a broker never reached is no success
    let p = mintgate(&[
        "subscribe".into(),
        "--broker".into(),
        format!("mqtt://127.0.0.1:{port}"),
        "--topic".into(),
        "t".into(),
        "--timeout".into(),
        "500ms".into(),
    ]);
    let (code, _, err) = finish(p, Duration::from_secs(20));
    assert_eq!(code, 1, "{err}");
    // too short for the retry line: the closing line says why
    assert!(
        err.contains("never subscribed") && err.contains("refused"),
        "{err}"
    );
}

/// `mintgate publish` of `n` messages (seq 1..=n) to `topic`, waiting for
/// every acknowledgement.
fn publish_count(url: &str, topic: &str, n: u32) {
    let n = n.to_string();
    let a = [
        "publish",
        "--broker",
        url,
        "--topic",
        topic,
        "--count",
        &n,
        "--timeout",
        "20s",
    ];
    let (code, out, err) = finish(mintgate(&a.map(String::from)), Duration::from_secs(30));
    assert_eq!(code, 0, "publish failed:\n{out}\n{err}");
}

/// A persistent subscriber that comes back to messages the broker queued
/// for it: they can arrive before the SUBACK and fill `--count`; that is a
/// success (the broker was reached), not "never subscribed".
#[test]
fn persistent_subscriber_gets_its_queued_messages() {
    let dir = tmp("queued");
    let Some(broker) = mosquitto(&dir.join("broker")) else {
        return;
    };
    let url = broker.url().to_string();
    let topic = "mintgate/test/queued";
    let sub = |count: Option<&str>, timeout: &str| {
        let mut a = vec![
            "subscribe",
            "--broker",
            &url,
            "--topic",
            topic,
            "--client-id",
            "mintgate-test-queued-sub",
            "--persistent",
            "--timeout",
            timeout,
        ];
        if let Some(c) = count {
            a.extend(["--count", c]);
        }
        mintgate(&a.into_iter().map(String::from).collect::<Vec<_>>())
    };
    // Register the session, then go away.
    let (code, _, err) = finish(sub(None, "1s"), Duration::from_secs(20));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("subscribed to"), "{err}");
    // Three messages while it is away.
    publish_count(&url, topic, 3);
    // Back: the three queued messages, in order, and exit 0.
    let (code, out, err) = finish(sub(Some("3"), "20s"), Duration::from_secs(30));
    assert_eq!(code, 0, "{out}\n{err}");
    let seqs: Vec<&str> = out
        .lines()
        .map(|l| l.split(' ').nth(1).unwrap_or(""))
        .collect();
    assert_eq!(seqs, ["1", "2", "3"], "{out}\n{err}");
    assert!(!err.contains("never subscribed"), "{err}");
    drop(broker);
    let _ = std::fs::remove_dir_all(&dir);
}

/// MQTT 5's session expiry (`--session-expiry`): a session that expired
/// while its subscriber was away has nothing queued for it when it comes
/// back (the same steps as above, where a day's expiry kept all three);
/// over MQTT 3.1.1, where the broker decides, the option is refused.
#[test]
fn an_expired_mqtt5_session_keeps_nothing() {
    let dir = tmp("expiry");
    let Some(broker) = mosquitto(&dir.join("broker")) else {
        return;
    };
    let url = broker.url().to_string();
    let url5 = url.replacen("mqtt://", "mqtt5://", 1);
    let topic = "mintgate/test/expiry";
    let sub = |url: &str, expiry: &str, timeout: &str| {
        let a = [
            "subscribe",
            "--broker",
            url,
            "--topic",
            topic,
            "--client-id",
            "mintgate-test-expiry-sub",
            "--persistent",
            "--session-expiry",
            expiry,
            "--timeout",
            timeout,
        ];
        mintgate(&a.map(String::from))
    };
    let (code, _, err) = finish(sub(&url, "1s", "1s"), Duration::from_secs(20));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("MQTT 5"), "{err}");
    // Registered with a 1 s expiry, then away for 3 s: the session is gone.
    let (code, _, err) = finish(sub(&url5, "1s", "1s"), Duration::from_secs(20));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("subscribed to"), "{err}");
    std::thread::sleep(Duration::from_secs(3));
    publish_count(&url, topic, 3);
    let (code, out, err) = finish(sub(&url5, "1h", "2s"), Duration::from_secs(20));
    assert_eq!(code, 0, "{err}");
    assert!(
        out.trim().is_empty(),
        "an expired session delivered:\n{out}"
    );
    // Now registered with an hour: what is published while away is kept.
    publish_count(&url, topic, 2);
    let (code, out, err) = finish(sub(&url5, "1h", "2s"), Duration::from_secs(20));
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 2, "{out}\n{err}");
    drop(broker);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A filter that breaks the wildcard rules is refused at once, naming the
/// rule; a persistent session needs a client id to be found again (no
/// broker needed).
#[test]
fn subscribe_refuses_bad_filters_and_anonymous_persistent_sessions() {
    let p = mintgate(&["subscribe", "--topic", "a/#/b", "--timeout", "20s"].map(String::from));
    let t0 = Instant::now();
    let (code, _, err) = finish(p, Duration::from_secs(20));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("'#' must be a whole level"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(10), "not at once");
    let p = mintgate(&["subscribe", "--topic", "a", "--persistent"].map(String::from));
    let (code, _, err) = finish(p, Duration::from_secs(20));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--client-id"), "{err}");
}

/// A message far above the old 256 KiB packet limit (1 MiB, through
/// mosquitto, MQTT 3.1.1) is delivered, not a disconnect per redelivery.
#[test]
fn a_one_mib_message_is_delivered() {
    let dir = tmp("big");
    let Some(broker) = mosquitto(&dir.join("broker")) else {
        return;
    };
    let url = broker.url();
    let topic = "mintgate/test/big";
    let mut sc = SubscriberConfig::new(url.clone(), topic);
    sc.reorder = ReorderConfig {
        first_seq: Some(1),
        ..ReorderConfig::default()
    };
    let mut sub = Subscriber::start(sc).unwrap();
    assert!(sub.wait_subscribed(Duration::from_secs(10)), "no SUBACK");
    let env = mintgate_mqtt::Envelope {
        publisher: "big".into(),
        seq: 1,
        ts: 0,
        msg: "x".repeat(1 << 20),
    };
    mintgate_mqtt::plain::publish_raw(&url, topic, &[env.encode()], Duration::from_secs(10))
        .expect("publishing 1 MiB");
    let end = Instant::now() + Duration::from_secs(15);
    let mut got = None;
    let mut disconnects = 0;
    while Instant::now() < end && got.is_none() {
        match sub.recv_timeout(Duration::from_millis(200)) {
            Some(SubEvent::Delivery(d)) => got = Some(d.env.msg.len()),
            Some(SubEvent::Disconnected(_)) => disconnects += 1,
            _ => {}
        }
    }
    assert_eq!(got, Some(1 << 20), "{disconnects} disconnect(s)");
    drop(sub);
    drop(broker);
    let _ = std::fs::remove_dir_all(&dir);
}
