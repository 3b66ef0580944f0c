//! `mintgate publish --nats` and `mintgate subscribe --nats` against a real
//! 3-node nats-server cluster on loopback (a stream with 3 replicas): the
//! publisher killed -9 mid-stream and run again completes its sequence,
//! stored once; a durable consumer read in two runs resumes where the
//! first stopped; `serve --nats` publishes its sensors into the stream.
//!
//! Without nats-server the tests are skipped with a message, unless
//! `MINTGATE_REQUIRE_PEERS` is set, in which case they fail.

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mintgate_nats::cluster::{read_all, stream_now, wait_stream_ready, Cluster};

fn cluster(dir: &std::path::Path) -> Option<Cluster> {
    Cluster::start_for_tests(dir, 3).expect("starting the cluster")
}

fn tmp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("mintgate-cli-nats-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn mintgate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mintgate"))
}

#[test]
fn publisher_killed_and_restarted_completes_once_and_a_durable_reader_resumes() {
    let dir = tmp("kill");
    let Some(c) = cluster(&dir.join("cluster")) else {
        return;
    };
    let t = c.target("GW").unwrap();
    wait_stream_ready(&t, Duration::from_secs(20)).unwrap();
    let urls = c.urls().join(",");
    let n = 3000u64;
    let state = dir.join("q");
    let publish = || {
        let mut cmd = mintgate();
        cmd.args([
            "publish",
            "--nats",
            &urls,
            "--stream",
            "GW",
            "--replicas",
            "3",
        ])
        .args(["--topic", "sensors/temp0", "--count", &n.to_string()])
        .args(["--window", "8", "--rate", "1500", "--publisher-id", "gw1"])
        .arg("--state")
        .arg(&state)
        .args(["--timeout", "60s"])
        .stdin(Stdio::null());
        cmd
    };
    // first run: killed -9 once a third is stored
    let mut child = publish().stdout(Stdio::null()).spawn().unwrap();
    let t0 = Instant::now();
    loop {
        assert!(t0.elapsed() < Duration::from_secs(30), "nothing stored");
        assert!(
            child.try_wait().unwrap().is_none(),
            "publish ended before the kill"
        );
        if stream_now(&t).map(|s| s.messages).unwrap_or(0) >= n / 3 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let at_kill = stream_now(&t).unwrap().messages;
    eprintln!("publisher killed -9 with {at_kill} stored");
    assert!(at_kill < n, "the kill came too late to test anything");
    // second run: completes
    let out = publish().output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("publish complete"), "{text}");
    // stored once
    assert_eq!(stream_now(&t).unwrap().messages, n);
    let all = read_all(&t, n).unwrap();
    let seqs: HashSet<u64> = all
        .iter()
        .map(|(_, p, _)| mintgate_mqtt::decode(p).unwrap().seq)
        .collect();
    assert_eq!(seqs.len() as u64, n);
    assert_eq!(seqs.iter().max(), Some(&n));

    // a durable reader in two runs of half each: in order, and the second
    // resumes after the first's last
    let read = |count: u64| {
        let out = mintgate()
            .args([
                "subscribe",
                "--nats",
                &urls,
                "--stream",
                "GW",
                "--durable",
                "reader",
            ])
            .args(["--count", &count.to_string(), "--timeout", "30s"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{}",
            &err[err.len().saturating_sub(3000)..]
        );
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                assert_eq!(f[0], "gw1", "{l}");
                f[1].parse::<u64>().unwrap()
            })
            .collect::<Vec<u64>>()
    };
    let first = read(n / 2);
    assert_eq!(first, (1..=n / 2).collect::<Vec<_>>());
    let second = read(n / 2);
    assert_eq!(second, (n / 2 + 1..=n).collect::<Vec<_>>());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn serve_publishes_its_sensors_into_the_stream() {
    let dir = tmp("serve");
    let Some(c) = cluster(&dir.join("cluster")) else {
        return;
    };
    let t = c.target("mintgate").unwrap();
    wait_stream_ready(&t, Duration::from_secs(20)).unwrap();
    let conf = dir.join("gw.toml");
    let values = dir.join("values.csv");
    std::fs::write(
        &values,
        (1..=20).map(|i| format!("{i}\n")).collect::<String>(),
    )
    .unwrap();
    std::fs::write(
        &conf,
        format!(
            r#"[coap]
bind = ["127.0.0.1:0"]

[pipeline]
pool = "fixed:1"

[directpath]
priority = 0
links = ["count | threshold(10, 5) -> mqtt(alerts/count)"]

[[devices.list]]
name = "count"
kind = "sim-sensor"
signal = "replay({values})"
period = "20ms"

[mqtt]
state = "{state}"
window = 4
topic_prefix = ""

[nats]
replicas = 3
"#,
            values = values.display(),
            state = dir.join("q").display()
        ),
    )
    .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _gw = Kill(
        mintgate()
            .args(["serve", "--config"])
            .arg(&conf)
            .args(["--nats", &c.urls().join(",")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("serve.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    // the device values 1..=20 (the replay stops at its end), and the
    // direct path's alert when it crossed 10
    let t0 = Instant::now();
    let sensor = |all: &[mintgate_nats::cluster::Stored]| {
        all.iter()
            .filter(|(s, _, _)| s == "mintgate.sensors.count")
            .map(|(_, p, id)| (mintgate_mqtt::decode(p).unwrap(), id.clone()))
            .collect::<Vec<_>>()
    };
    let all = loop {
        let all = read_all(&t, 0).unwrap_or_default();
        if sensor(&all).len() >= 20 && all.iter().any(|(s, _, _)| s == "mintgate.alerts.count") {
            break all;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "not stored in 20 s: {:?}\n{}",
            all.iter().map(|(s, _, _)| s).collect::<Vec<_>>(),
            std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let values = sensor(&all);
    for (i, (env, id)) in values.iter().enumerate() {
        assert_eq!(env.seq, i as u64 + 1, "in order, once");
        assert!(env.msg.contains("\"device\":\"count\""), "{}", env.msg);
        assert!(id
            .as_deref()
            .is_some_and(|id| id.starts_with(&env.publisher)));
    }
    // the replay's values in its order (1..=20, again from 1): none lost
    // or doubled between the sensor and the stream
    let v: Vec<u64> = values
        .iter()
        .map(|(env, _)| {
            serde_json::from_str::<serde_json::Value>(&env.msg).unwrap()["value"]
                .as_f64()
                .unwrap() as u64
        })
        .collect();
    for w in v.windows(2) {
        assert_eq!(w[1], w[0] % 20 + 1, "{v:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `[nats]` is checked at the start and an error names the key; what needs
/// an MQTT broker is refused with the JetStream output.
#[test]
fn bad_nats_settings_are_refused_at_the_start() {
    let dir = tmp("bad");
    let run = |toml: &str, extra: &[&str]| {
        let f = dir.join("gw.toml");
        std::fs::write(&f, toml).unwrap();
        let out = mintgate()
            .args(["serve", "--config"])
            .arg(&f)
            .args(extra)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = run(
        "[nats]\nenabled = true\nreplicas = 9\n",
        &["--print-config"],
    );
    assert!(e.contains("nats.replicas"), "{e}");
    let e = run(
        "[nats]\nsubject = \"a.b\"\n",
        &["--nats", "nats://127.0.0.1:1", "--print-config"],
    );
    assert!(e.contains("nats.subject"), "{e}");
    let e = run(
        "[coap]\nbind = [\"127.0.0.1:0\"]\n[[mqtt.command]]\ntopic = \"cmd/led\"\ndevice = \"led0\"\n",
        &["--nats", "nats://127.0.0.1:1"],
    );
    assert!(e.contains("mqtt.command") && e.contains("nats"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
