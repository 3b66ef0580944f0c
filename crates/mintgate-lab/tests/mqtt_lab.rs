//! `lab mqtt` end to end with short settings: every method against the
//! embedded broker (and mosquitto when installed, as the test command
//! installs it), Eclipse Paho's two methods too where Java and Maven are,
//! every message present and in order, the CSV and plot written, the
//! table's verdict and reference lines present.

use std::sync::Arc;

use mintgate_lab::{lab_mqtt, LabOptions, MqttLabOptions};

/// One run per method, window 4, quick Paho warm-up, progress on stderr.
fn short(out: &std::path::Path) -> MqttLabOptions {
    MqttLabOptions {
        common: LabOptions {
            out: out.to_path_buf(),
            quick: true,
            progress: Arc::new(|l: &str| eprintln!("{l}")),
            ..LabOptions::default()
        },
        runs: Some(1),
        window: 4,
        ..MqttLabOptions::default()
    }
}

#[test]
fn mqtt_lab_runs_every_method_and_loses_nothing() {
    let out = std::env::temp_dir().join(format!("mintgate-lab-mqtt-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let s = lab_mqtt(&MqttLabOptions {
        messages: Some(60),
        ..short(&out)
    })
    .expect("lab mqtt runs");
    assert_eq!(s.lab, "mqtt");
    let csv = std::fs::read_to_string(out.join("mqtt.csv")).expect("mqtt.csv");
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("broker,method,run,messages,seconds,missing,out_of_order")
    );
    let all: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    // the TLS case: the window-16 queue over mosquitto's TLS listener, one row
    let (tls, rows): (Vec<Vec<&str>>, Vec<Vec<&str>>) =
        all.into_iter().partition(|r| r[0] == "mosq-tls");
    if mintgate_mqtt::broker::find_mosquitto().is_some() {
        assert_eq!(tls.len(), 1, "{csv}");
        assert_eq!(tls[0][1], "pubqueue_qos1_w4", "{csv}");
        assert_eq!((tls[0][5], tls[0][6]), ("0", "0"), "{csv}");
    }
    let brokers: std::collections::BTreeSet<&str> = rows.iter().map(|r| r[0]).collect();
    assert!(brokers.contains("embedded"), "{csv}");
    let mosquitto = mintgate_mqtt::broker::find_mosquitto().is_some();
    assert_eq!(brokers.contains("mosquitto"), mosquitto, "{csv}");
    let methods = [
        "pubqueue_qos1",
        "qos2",
        "qos1",
        "pubqueue_qos1_w4",
        "qos1_w1",
    ];
    // The paper's client (peers/paho, built with Maven) runs where Java
    // and Maven are; the test command has them, and requires it.
    let paho = rows.iter().any(|r| r[1].starts_with("paho_"));
    if std::env::var_os("MINTGATE_REQUIRE_PEERS").is_some() {
        assert!(
            paho,
            "no Paho rows (MINTGATE_REQUIRE_PEERS is set):\n{}",
            s.table
        );
    }
    let paho_methods: &[&str] = if paho {
        &["paho_pubqueue_qos1", "paho_qos2"]
    } else {
        &[]
    };
    assert_eq!(
        rows.len(),
        (methods.len() + paho_methods.len()) * brokers.len(),
        "{csv}"
    );
    for b in &brokers {
        for &m in methods.iter().chain(paho_methods) {
            let r = rows
                .iter()
                .find(|r| r[0] == *b && r[1] == m)
                .unwrap_or_else(|| panic!("no row for {b} {m}:\n{csv}"));
            assert_eq!(r[3], "60", "{r:?}");
            let secs: f64 = r[4].parse().unwrap();
            assert!(secs > 0.0 && secs < 30.0, "{r:?}");
            assert_eq!((r[5], r[6]), ("0", "0"), "missing / out of order: {r:?}");
        }
    }
    let svg = std::fs::read_to_string(out.join("mqtt.svg")).expect("mqtt.svg");
    assert!(svg.starts_with("<svg") && svg.contains("qos1_w1"));
    for b in &brokers {
        assert!(
            s.table
                .contains(&format!("{b}: QoS 2 time / Pub Queue time"))
                && s.table.contains(&format!(
                    "{b}: for reference, plain QoS 2 / plain QoS 1 (both one in flight"
                )),
            "{}",
            s.table
        );
        if paho {
            assert!(
                s.table.contains(&format!(
                    "{b}: the paper's client, Eclipse Paho (Java, file persistence), in the same \
                     session: QoS 2 time / Pub Queue time = "
                )) && svg.contains("paho_qos2"),
                "{}",
                s.table
            );
        }
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// With `link_delay`, every client goes through the TCP delay relay: a
/// window-1 method then takes at least one modelled round trip per message
/// and QoS 2 at least two, and still nothing is lost or reordered.
#[test]
fn mqtt_lab_over_a_modelled_link_pays_its_round_trips() {
    let out = std::env::temp_dir().join(format!("mintgate-lab-mqtt-link-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let delay = std::time::Duration::from_millis(2);
    let n = 25u32;
    let s = lab_mqtt(&MqttLabOptions {
        messages: Some(n.into()),
        paho: mintgate_lab::PahoMode::Off,
        link_delay: delay,
        ..short(&out)
    })
    .expect("lab mqtt runs over a link");
    let csv = std::fs::read_to_string(out.join("mqtt.csv")).expect("mqtt.csv");
    let rtt = (delay * 2).as_secs_f64();
    let mut checked = 0;
    for r in csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect::<Vec<_>>())
    {
        let secs: f64 = r[4].parse().unwrap();
        assert_eq!((r[5], r[6]), ("0", "0"), "missing / out of order: {r:?}");
        // rows on bare loopback beside the link's, for information
        if r[0].ends_with("-lo") {
            continue;
        }
        let round_trips = match r[1] {
            "pubqueue_qos1" | "qos1_w1" => 1.0,
            "qos2" => 2.0,
            _ => continue,
        };
        assert!(
            secs >= round_trips * rtt * f64::from(n),
            "{r:?}: faster than {round_trips} round trip(s) of {rtt} s per message"
        );
        checked += 1;
    }
    assert!(checked >= 3, "{csv}");
    assert!(
        s.table
            .contains("through mintgate's TCP delay relay, 2ms each way"),
        "{}",
        s.table
    );
    let _ = std::fs::remove_dir_all(&out);
}
