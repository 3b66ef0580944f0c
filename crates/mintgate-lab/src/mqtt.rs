//! `lab mqtt`: paper 004, Fig. 5. 1,000 messages of 26 bytes numbered
//! 0001-1000, 5 runs per method and broker:
//!
//! - `pubqueue_qos1`: the publish queue (persistent, redb), QoS 1, window 1
//!   (the next message only after the previous PUBACK).
//! - `qos2`: plain QoS 2 with one message in flight (how the earlier work
//!   got ordering).
//! - `qos1`: plain QoS 1 with the client's default in-flight limit
//!   (rumqttc: 100), for reference: fast, but with no order guarantee once
//!   something fails.
//! - `pubqueue_qos1_wN`: the publish queue with window N (default 16) and
//!   the receiver restoring the order (not in the paper; our second target).
//! - `qos1_w1`: plain QoS 1 with one message in flight, no queue, no store
//!   (not in the paper): one bare PUBLISH/PUBACK round trip per message,
//!   so that `pubqueue_qos1` against it shows what the queue itself costs.
//! - `paho_pubqueue_qos1`, `paho_qos2`: the paper's two methods with the
//!   paper's client, Eclipse Paho (Java, `peers/paho`), when Java and Maven
//!   are there: QoS 1 with the next message after the previous one's
//!   deliveryComplete, and QoS 2 one in flight, both with Paho's default
//!   file persistence (or memory, or not at all: `MqttLabOptions::paho`),
//!   the bare 26-byte bodies and a Paho subscriber
//!   checking them. Information beside ours (not in the verdicts): what the
//!   paper's ratio is on this machine with the paper's client.
//!
//! With the private mosquitto, the same mosquitto also listens over TLS
//! (`mosq-tls`: a CA and a server certificate made for the run, rustls on
//! our side) and `pubqueue_qos1_wN` is run there too: its rate over TLS
//! against plain TCP to the same broker in the same session (target: at
//! least 80 %, 0 missing, 0 out of order).
//!
//! Every message goes in the same JSON envelope (`pub`, `seq`, `ts`, `msg`
//! with the 26-byte body). A subscriber on the same broker, connected before
//! the run starts, checks every message: `missing` counts sequence numbers
//! that never arrived, `out_of_order` counts messages the application saw
//! out of order: after the reorder buffer for the publish-queue methods (the
//! receiving side is part of them), in arrival order for the plain ones. The
//! raw arrival inversions and duplicates of every method are in the table.
//!
//! A run's time is from the first enqueue/publish (after the connection is
//! up and, for the queue, its store open) until the publisher has every
//! acknowledgement and the subscriber every message. The queue's time
//! includes the durable write of the 1,000 messages.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use mintgate_mqtt::broker::{find_mosquitto, EmbeddedBroker, Mosquitto};
use mintgate_mqtt::plain::{publish_plain, CLIENT_DEFAULT_INFLIGHT};
use mintgate_mqtt::reorder::ReorderConfig;
use mintgate_mqtt::{
    BrokerUrl, Publisher, PublisherConfig, Qos, SubEvent, Subscriber, SubscriberConfig,
};
use mintgate_netsim::tcp_relay::{TcpRelay, TcpRelayConfig};
use plotters::prelude::*;

use crate::{line, paper, LabOptions, Summary};

/// Options of `lab mqtt`.
#[derive(Clone)]
pub struct MqttLabOptions {
    /// Output folder, progress sink, `quick`.
    pub common: LabOptions,
    /// A broker to use instead of a private mosquitto (the embedded broker
    /// is always measured too).
    pub broker: Option<BrokerUrl>,
    /// Runs per method and broker [5; quick 2].
    pub runs: Option<usize>,
    /// Messages per run [1000, the paper's].
    pub messages: Option<u64>,
    /// Window of the extra windowed publish-queue method [16].
    pub window: usize,
    /// The Paho peer: its persistence, or off [file, Paho's default].
    pub paho: PahoMode,
    /// One-way delay of a modelled link between every client and every
    /// broker (mintgate's TCP delay relay in front of each broker) [0: the
    /// clients reach the brokers over bare loopback].
    pub link_delay: Duration,
}

/// Whether and how `lab mqtt` runs the paper's client, Eclipse Paho.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PahoMode {
    /// Not run.
    Off,
    /// Paho's `MemoryPersistence`.
    Memory,
    /// Paho's default, `MqttDefaultFilePersistence` (a file per message in
    /// flight).
    File,
}

impl PahoMode {
    /// The peer's argument and the table's word: `memory` or `file`.
    fn persistence(self) -> &'static str {
        match self {
            PahoMode::Off => "off",
            PahoMode::Memory => "memory",
            PahoMode::File => "file",
        }
    }
}

impl std::str::FromStr for PahoMode {
    type Err = String;
    fn from_str(s: &str) -> Result<PahoMode, String> {
        match s {
            "off" => Ok(PahoMode::Off),
            "memory" => Ok(PahoMode::Memory),
            "file" => Ok(PahoMode::File),
            _ => Err(format!("expected file, memory or off, not {s:?}")),
        }
    }
}

impl Default for MqttLabOptions {
    fn default() -> Self {
        MqttLabOptions {
            common: LabOptions::default(),
            broker: None,
            runs: None,
            messages: None,
            window: 16,
            paho: PahoMode::File,
            link_delay: Duration::ZERO,
        }
    }
}

/// The body of message `i`: 26 bytes, `0001:mintgate-fig5-payload`.
pub fn body(i: u64) -> String {
    format!("{i:04}:mintgate-fig5-payload")
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Method {
    PubQueue,
    Qos2,
    Qos1,
    PubQueueWindow(usize),
    Qos1One,
    PahoPubQueue,
    PahoQos2,
}

impl Method {
    fn name(self) -> String {
        match self {
            Method::PubQueue => "pubqueue_qos1".into(),
            Method::Qos2 => "qos2".into(),
            Method::Qos1 => "qos1".into(),
            Method::PubQueueWindow(w) => format!("pubqueue_qos1_w{w}"),
            Method::Qos1One => "qos1_w1".into(),
            Method::PahoPubQueue => "paho_pubqueue_qos1".into(),
            Method::PahoQos2 => "paho_qos2".into(),
        }
    }

    /// The Paho peer's name for the method, for the Paho methods.
    fn paho(self) -> Option<&'static str> {
        match self {
            Method::PahoPubQueue => Some("pubqueue_qos1"),
            Method::PahoQos2 => Some("qos2"),
            _ => None,
        }
    }
}

/// One run's measurement (a row of `mqtt.csv`).
#[derive(Clone, Debug)]
pub struct MqttRow {
    /// `embedded`, `mosquitto` or `external`.
    pub broker: String,
    /// Method name.
    pub method: String,
    /// Run number, 1-based.
    pub run: usize,
    /// Messages published.
    pub messages: u64,
    /// Seconds for the run.
    pub seconds: f64,
    /// Sequence numbers that never reached the subscriber.
    pub missing: u64,
    /// Messages the application saw out of order (see the module docs).
    pub out_of_order: u64,
    /// Arrivals with a lower sequence than an earlier new one, before any
    /// reordering.
    pub raw_out_of_order: u64,
    /// Duplicate arrivals.
    pub duplicates: u64,
    /// Why the run failed, if it did.
    pub error: Option<String>,
}

impl MqttRow {
    /// A run not measured yet: every message missing.
    fn unmeasured(broker: &str, m: Method, run: usize, n: u64) -> MqttRow {
        MqttRow {
            broker: broker.into(),
            method: m.name(),
            run,
            messages: n,
            seconds: 0.0,
            missing: n,
            out_of_order: 0,
            raw_out_of_order: 0,
            duplicates: 0,
            error: None,
        }
    }
}

fn embedded() -> anyhow::Result<&'static EmbeddedBroker> {
    static B: OnceLock<EmbeddedBroker> = OnceLock::new();
    if let Some(b) = B.get() {
        return Ok(b);
    }
    let b = EmbeddedBroker::start_loopback().context("starting the embedded broker")?;
    Ok(B.get_or_init(|| b))
}

/// Runs the lab; writes `mqtt.csv` and `mqtt.svg`.
pub fn lab_mqtt(opts: &MqttLabOptions) -> anyhow::Result<Summary> {
    let o = &opts.common;
    let runs = opts.runs.unwrap_or(if o.quick { 2 } else { 5 }).max(1);
    let n = opts.messages.unwrap_or(1000).clamp(1, 100_000);
    let window = opts.window.clamp(2, 1024);
    crate::create_out(&o.out)?;
    let progress = &o.progress;
    let work = std::env::temp_dir().join(format!(
        "mintgate-lab-mqtt-{}-{:08x}",
        std::process::id(),
        rand_u32()
    ));
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;

    let mut brokers: Vec<(String, BrokerUrl)> = vec![("embedded".into(), embedded()?.url())];
    let mut notes = Vec::new();
    let _mosquitto; // kept alive until the lab ends
    match &opts.broker {
        Some(url) => brokers.push(("external".into(), url.clone())),
        None => match find_mosquitto() {
            Some(bin) => {
                // The same mosquitto also listens over TLS (a CA and a
                // certificate made for the run): the windowed queue is
                // measured there too, against the plain listener.
                let (tls_extra, tls_url) = tls_listener(&work.join("pki"))?;
                let m = Mosquitto::start_with(&bin, &work.join("mosquitto"), &tls_extra)
                    .with_context(|| format!("starting {}", bin.display()))?;
                brokers.push(("mosquitto".into(), m.url()));
                brokers.push((TLS_BROKER.into(), tls_url));
                _mosquitto = Some(m);
            }
            None => notes.push(
                "mosquitto: not installed (apt-get install mosquitto, or --broker URL); \
                 measured against the embedded broker only"
                    .to_string(),
            ),
        },
    }
    // The paper's broker, publisher and subscriber were three hosts on a
    // network; a link delay puts a modelled link between each client and
    // the broker (every client, ours and Paho's, connects through it).
    let mut relays = Vec::new(); // kept alive until the lab ends
                                 // with a link, the paper's two methods run on bare loopback too, beside
                                 // the modelled link, for information
    let bare: Vec<(String, BrokerUrl)> = if opts.link_delay.is_zero() {
        Vec::new()
    } else {
        brokers.clone()
    };
    if !opts.link_delay.is_zero() {
        for (b, url) in brokers.iter_mut() {
            let (relay, via) = link(url, opts.link_delay)
                .with_context(|| format!("putting a link in front of {b} ({url})"))?;
            *url = via;
            relays.push(relay);
        }
        notes.push(format!(
            "link: every client reaches each broker through mintgate's TCP delay relay, \
             {:?} each way ({:?} round trip); without --link-delay, bare loopback",
            opts.link_delay,
            opts.link_delay * 2
        ));
    }
    let mut methods = vec![
        Method::PubQueue,
        Method::Qos2,
        Method::Qos1,
        Method::PubQueueWindow(window),
        Method::Qos1One,
    ];
    let mut pahos = match opts.paho {
        PahoMode::Off => brokers.iter().map(|_| None).collect(),
        mode => paho_peers(
            &brokers,
            mode,
            if o.quick { 1 } else { 3 },
            n,
            progress,
            &mut notes,
        ),
    };
    if pahos.iter().any(Option::is_some) {
        methods.extend([Method::PahoPubQueue, Method::PahoQos2]);
    }
    progress(&format!(
        "lab mqtt: {n} messages of {} bytes per run, {runs} run(s) per method, brokers: {}",
        body(1).len(),
        brokers
            .iter()
            .map(|(b, u)| format!("{b} ({u})"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let mut rows = Vec::new();
    // Runs take turns over the brokers and methods (run 1 of each, then
    // run 2 of each, ...): on a shared machine whose speed drifts, every
    // method then samples the same stretches of time, and the ratios (TLS
    // against TCP too) compare like with like.
    for run in 1..=runs {
        for ((bname, url), paho) in brokers.iter().zip(pahos.iter_mut()) {
            for &m in &methods {
                if url.tls && m != Method::PubQueueWindow(window) {
                    continue; // over TLS only the windowed queue, against plain TCP
                }
                let row = match (m.paho(), paho.as_mut()) {
                    (None, _) => run_one(bname, url, m, run, n, &work),
                    (Some(pm), Some(p)) => paho_run(p, bname, m, pm, run, n),
                    (Some(_), None) => continue,
                };
                progress(&format!(
                    "lab mqtt: {bname:9} {:18} run {run}: {:.3} s, missing {}, out of order {} \
                     (raw {}, duplicates {}){}",
                    row.method,
                    row.seconds,
                    row.missing,
                    row.out_of_order,
                    row.raw_out_of_order,
                    row.duplicates,
                    row.error
                        .as_deref()
                        .map(|e| format!(" FAILED: {e}"))
                        .unwrap_or_default()
                ));
                rows.push(row);
            }
        }
    }
    drop(pahos);
    // the paper's two methods on bare loopback (information beside the
    // modelled link), taking turns as above
    for (bname, url) in &bare {
        let name = loopback_name(bname);
        for run in 1..=runs {
            for m in [Method::PubQueue, Method::Qos2] {
                let row = run_one(&name, url, m, run, n, &work);
                progress(&format!(
                    "lab mqtt: {name} {:18} run {run}: {:.3} s, missing {}, out of order {}{}",
                    row.method,
                    row.seconds,
                    row.missing,
                    row.out_of_order,
                    row.error
                        .as_deref()
                        .map(|e| format!(" FAILED: {e}"))
                        .unwrap_or_default()
                ));
                rows.push(row);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&work);

    let csv_path = o.out.join("mqtt.csv");
    let mut csv = String::from("broker,method,run,messages,seconds,missing,out_of_order\n");
    for r in &rows {
        line(
            &mut csv,
            format_args!(
                "{},{},{},{},{:.4},{},{}",
                r.broker, r.method, r.run, r.messages, r.seconds, r.missing, r.out_of_order
            ),
        );
    }
    crate::write_file(&csv_path, &csv)?;
    let svg_path = o.out.join("mqtt.svg");
    plot(&svg_path, &rows, &brokers, &methods, n)?;
    let link = (!opts.link_delay.is_zero()).then_some(opts.link_delay);
    let (table, met) = table(
        &rows, &brokers, &methods, n, window, opts.paho, link, &notes,
    );
    Ok(Summary {
        lab: "mqtt",
        table,
        files: vec![csv_path, svg_path],
        target_met: Some(met),
    })
}

/// The name of the TLS listener of the lab's mosquitto in the tables.
const TLS_BROKER: &str = "mosq-tls";

/// A CA and a server certificate for 127.0.0.1 written to `dir`: the
/// config lines of a TLS listener on a free loopback port for mosquitto,
/// and the URL that reaches it, trusting that CA.
fn tls_listener(dir: &Path) -> anyhow::Result<(String, BrokerUrl)> {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "mintgate lab CA");
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate()?)?;
    let key = KeyPair::generate()?;
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])?.signed_by(&key, &ca)?;
    let (ca_file, cert_file, key_file) = (
        dir.join("ca.pem"),
        dir.join("server.pem"),
        dir.join("server.key"),
    );
    crate::write_file(&ca_file, &ca.pem())?;
    crate::write_file(&cert_file, &cert.pem())?;
    crate::write_file(&key_file, &key.serialize_pem())?;
    let port = mintgate_mqtt::broker::free_port([127, 0, 0, 1].into())?;
    let extra = format!(
        "listener {port} 127.0.0.1\ncafile {}\ncertfile {}\nkeyfile {}\n",
        ca_file.display(),
        cert_file.display(),
        key_file.display()
    );
    let url: BrokerUrl = format!("mqtts://127.0.0.1:{port}")
        .parse()
        .map_err(anyhow::Error::msg)?;
    Ok((
        extra,
        url.with_security(mintgate_mqtt::Security {
            ca_file: Some(ca_file),
            ..Default::default()
        }),
    ))
}

/// A TCP delay relay in front of the broker at `url`, and the URL that
/// reaches the broker through it.
fn link(url: &BrokerUrl, delay: Duration) -> anyhow::Result<(TcpRelay, BrokerUrl)> {
    use std::net::ToSocketAddrs;
    let forward = (url.host.as_str(), url.port)
        .to_socket_addrs()?
        .next()
        .context("the broker's host resolves to no address")?;
    let listen = if forward.is_ipv6() {
        "[::1]:0"
    } else {
        "127.0.0.1:0"
    };
    let relay = TcpRelay::start(TcpRelayConfig {
        listen: listen.parse().expect("literal"),
        forward,
        up: delay,
        down: delay,
    })?;
    let mut via = BrokerUrl::from_addr(relay.local_addr()).with_version(url.version);
    via.tls = url.tls;
    via.security = url.security.clone();
    Ok((relay, via))
}

fn rand_u32() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32))
        .unwrap_or(0)
}

/// A Paho peer per broker (`None` where there is none, with a note saying
/// why), each warmed up by `warm` untimed rounds of both methods: a JVM
/// runs its first thousands of calls interpreted.
fn paho_peers(
    brokers: &[(String, BrokerUrl)],
    mode: PahoMode,
    warm: usize,
    n: u64,
    progress: &crate::ProgressFn,
    notes: &mut Vec<String>,
) -> Vec<Option<crate::paho::PahoPeer>> {
    let jar = match crate::peers::paho_jar(progress) {
        Ok(j) => j,
        Err(why) => {
            let why = format!("Paho (the paper's client) not measured: {why:#}");
            progress(&format!("lab mqtt: {why}"));
            notes.push(why);
            return brokers.iter().map(|_| None).collect();
        }
    };
    brokers
        .iter()
        .map(|(b, url)| {
            if url.tls {
                return None; // the windowed queue only, not Paho
            }
            let mut p = match crate::paho::PahoPeer::start(&jar, url, mode.persistence()) {
                Ok(p) => p,
                Err(why) => {
                    let why = format!("Paho not measured against {b}: {why:#}");
                    progress(&format!("lab mqtt: {why}"));
                    notes.push(why);
                    return None;
                }
            };
            progress(&format!(
                "lab mqtt: warming up Paho's JVM against {b}: {warm} untimed round(s) of both methods"
            ));
            for _ in 0..warm {
                for m in [Method::PahoPubQueue, Method::PahoQos2] {
                    let name = m.paho().unwrap_or_default();
                    if let Err(why) = p.run(name, 0, n) {
                        let why = format!("Paho not measured against {b}: warm-up: {why:#}");
                        progress(&format!("lab mqtt: {why}"));
                        notes.push(why);
                        return None;
                    }
                }
            }
            Some(p)
        })
        .collect()
}

/// One run of a Paho method, as a row like ours (arrival order: Paho's
/// subscriber does no reordering).
fn paho_run(
    p: &mut crate::paho::PahoPeer,
    bname: &str,
    m: Method,
    pm: &str,
    run: usize,
    n: u64,
) -> MqttRow {
    let mut row = MqttRow::unmeasured(bname, m, run, n);
    match p.run(pm, run, n) {
        Ok(r) => {
            // Field copies alike to those in mintgate-cli's bench.rs:
            // unrelated types.
            row.seconds = r.seconds;
            row.missing = r.missing;
            row.out_of_order = r.out_of_order;
            row.raw_out_of_order = r.out_of_order;
            row.duplicates = r.duplicates;
            row.error = r.error;
        }
        Err(e) => row.error = Some(format!("{e:#}")),
    }
    row
}

/// One run: subscriber up, publish all, wait for all.
fn run_one(bname: &str, url: &BrokerUrl, m: Method, run: usize, n: u64, work: &Path) -> MqttRow {
    let mut row = MqttRow::unmeasured(bname, m, run, n);
    let nonce = rand_u32();
    let topic = format!("mintgate/lab/fig5/{}/{run}/{nonce:08x}", m.name());
    let publisher = format!("lab-{}-{run}-{nonce:08x}", m.name());
    let mut sc = SubscriberConfig::new(url.clone(), topic.clone());
    sc.qos = if m == Method::Qos2 {
        Qos::ExactlyOnce
    } else {
        Qos::AtLeastOnce
    };
    sc.report_arrivals = true;
    sc.reorder = ReorderConfig {
        // Subscribed before the first message: anything lost is a gap.
        first_seq: Some(1),
        gap_timeout: None,
        max_buffer: n as usize + 1,
        ..ReorderConfig::default()
    };
    let mut sub = match Subscriber::start(sc) {
        Ok(s) => s,
        Err(e) => {
            row.error = Some(format!("subscriber: {e}"));
            return row;
        }
    };
    if !sub.wait_subscribed(Duration::from_secs(10)) {
        row.error = Some("no SUBACK within 10 s".into());
        return row;
    }
    let bodies: Vec<String> = (1..=n).map(body).collect();
    // Set-up (opening the store, connecting) is not timed: the clock starts
    // when the first message is handed to the queue or the client.
    let queue = match m {
        Method::PubQueue | Method::PubQueueWindow(_) => {
            let mut cfg = PublisherConfig::new(url.clone());
            cfg.window = match m {
                Method::PubQueueWindow(w) => w,
                _ => 1,
            };
            cfg.state = Some(work.join(format!("state-{}-{run}-{nonce:08x}", m.name())));
            cfg.publisher_id = Some(publisher.clone());
            let p = match Publisher::start(cfg) {
                Ok(p) => p,
                Err(e) => {
                    row.error = Some(format!("publish queue: {e}"));
                    return row;
                }
            };
            if !p
                .wait_until(Duration::from_secs(10), |s| s.connected)
                .connected
            {
                row.error = Some("the publish queue did not connect within 10 s".into());
                return row;
            }
            Some(p)
        }
        Method::Qos2 | Method::Qos1 | Method::Qos1One => None,
        Method::PahoPubQueue | Method::PahoQos2 => {
            row.error = Some("a Paho method is run by the Paho peer".into());
            return row;
        }
    };
    let t_setup = Instant::now();
    let url2 = url.clone();
    let topic2 = topic.clone();
    let pubname = publisher.clone();
    let pub_thread = std::thread::spawn(move || -> Result<(Instant, Instant), String> {
        let limit = Duration::from_secs(60);
        match queue {
            Some(p) => {
                let start = Instant::now();
                p.enqueue_many(&topic2, bodies).map_err(|e| e.to_string())?;
                let ok = p.wait_idle(limit);
                let done = Instant::now();
                let st = p.close(Duration::ZERO);
                if ok {
                    Ok((start, done))
                } else {
                    Err(format!(
                        "{} unacknowledged after {limit:?} ({})",
                        st.unacked,
                        st.last_error.unwrap_or_default()
                    ))
                }
            }
            None => {
                let (qos, inflight) = match m {
                    Method::Qos2 => (Qos::ExactlyOnce, 1),
                    Method::Qos1One => (Qos::AtLeastOnce, 1),
                    _ => (Qos::AtLeastOnce, CLIENT_DEFAULT_INFLIGHT),
                };
                let r = publish_plain(&url2, &topic2, qos, inflight, &pubname, &bodies, limit)?;
                Ok((r.started, r.started + r.elapsed))
            }
        }
    });
    // Watch the subscriber while the publisher runs.
    let reordering = matches!(m, Method::PubQueue | Method::PubQueueWindow(_));
    let mut seen = vec![false; n as usize + 1];
    let mut distinct = 0u64;
    let mut max_raw = 0u64;
    let mut last_delivered = 0u64;
    let mut last_arrival = t_setup;
    let mut pub_done: Option<Result<(Instant, Instant), String>> = None;
    let mut quiet_since = Instant::now();
    let mut handle = Some(pub_thread);
    loop {
        if let Some(h) = handle.take_if(|h| h.is_finished()) {
            pub_done = Some(
                h.join()
                    .unwrap_or_else(|_| Err("publisher panicked".into())),
            );
            quiet_since = Instant::now();
        }
        // Done when every message arrived and (for the queue methods) came
        // out of the reorder buffer too.
        let all_in = distinct == n && (!reordering || last_delivered == n);
        if all_in && pub_done.is_some() {
            break;
        }
        // Bounded: 15 s without an arrival after the publisher finished, or
        // 90 s in all.
        if (pub_done.is_some() && quiet_since.elapsed() > Duration::from_secs(15))
            || t_setup.elapsed() > Duration::from_secs(90)
        {
            break;
        }
        match sub.recv_timeout(Duration::from_millis(20)) {
            Some(SubEvent::Arrival(env, at)) if env.publisher == publisher => {
                last_arrival = at;
                quiet_since = last_arrival;
                let s = env.seq;
                if s >= 1 && s <= n && !seen[s as usize] {
                    seen[s as usize] = true;
                    distinct += 1;
                    if s < max_raw {
                        row.raw_out_of_order += 1;
                    }
                    max_raw = max_raw.max(s);
                } else {
                    row.duplicates += 1;
                }
            }
            Some(SubEvent::Delivery(d)) if d.env.publisher == publisher => {
                if d.env.seq <= last_delivered || d.skipped_before > 0 {
                    row.error
                        .get_or_insert_with(|| "reorder buffer misbehaved".into());
                }
                last_delivered = d.env.seq;
            }
            _ => {}
        }
    }
    // A publisher still running after the bounds: wait for its own limit.
    if let Some(h) = handle.take() {
        pub_done = Some(
            h.join()
                .unwrap_or_else(|_| Err("publisher panicked".into())),
        );
    }
    row.missing = n - distinct;
    row.out_of_order = if reordering {
        // Delivered in order by construction unless the buffer misbehaved;
        // what is not delivered yet is missing or held behind a gap.
        0
    } else {
        row.raw_out_of_order
    };
    match pub_done {
        Some(Ok((start, done))) => {
            let end = if distinct == n {
                done.max(last_arrival)
            } else {
                done
            };
            row.seconds = end.saturating_duration_since(start).as_secs_f64();
        }
        Some(Err(e)) => {
            row.seconds = t_setup.elapsed().as_secs_f64();
            row.error = Some(e);
        }
        None => {}
    }
    if reordering && last_delivered != distinct && row.missing == 0 {
        row.error
            .get_or_insert_with(|| format!("delivered up to {last_delivered} of {distinct}"));
    }
    row
}

#[derive(Default)]
struct Agg {
    runs: usize,
    failed: usize,
    mean: f64,
    median: f64,
    min: f64,
    max: f64,
    missing: u64,
    ooo: u64,
    raw_ooo: u64,
    dups: u64,
}

fn aggregate(rows: &[MqttRow], broker: &str, method: &str) -> Agg {
    let rs: Vec<&MqttRow> = rows
        .iter()
        .filter(|r| r.broker == broker && r.method == method)
        .collect();
    let mut ok: Vec<f64> = rs
        .iter()
        .filter(|r| r.error.is_none())
        .map(|r| r.seconds)
        .collect();
    ok.sort_by(f64::total_cmp);
    let median = match ok.len() {
        0 => f64::NAN,
        k if k % 2 == 1 => ok[k / 2],
        k => (ok[k / 2 - 1] + ok[k / 2]) / 2.0,
    };
    Agg {
        runs: rs.len(),
        failed: rs.len() - ok.len(),
        mean: if ok.is_empty() {
            f64::NAN
        } else {
            ok.iter().sum::<f64>() / ok.len() as f64
        },
        median,
        min: ok.iter().copied().fold(f64::INFINITY, f64::min),
        max: ok.iter().copied().fold(0.0, f64::max),
        missing: rs.iter().map(|r| r.missing).sum(),
        ooo: rs.iter().map(|r| r.out_of_order).sum(),
        raw_ooo: rs.iter().map(|r| r.raw_out_of_order).sum(),
        dups: rs.iter().map(|r| r.duplicates).sum(),
    }
}

/// The broker column of the bare-loopback rows run beside a modelled link.
fn loopback_name(broker: &str) -> String {
    format!("{broker}-lo")
}

/// Whether QoS 2 time / Pub Queue time reproduces the paper's "about 2x"
/// within [`paper::MQTT_RATIO_TOLERANCE`] (1.7-2.3x).
pub fn ratio_reproduced(r: f64) -> bool {
    let lo = paper::MQTT_QOS2_OVER_PUBQUEUE * (1.0 - paper::MQTT_RATIO_TOLERANCE);
    let hi = paper::MQTT_QOS2_OVER_PUBQUEUE * (1.0 + paper::MQTT_RATIO_TOLERANCE);
    // a hair of slack for the float products (1.7 and 2.3 themselves pass)
    (lo - 1e-9..=hi + 1e-9).contains(&r)
}

#[allow(clippy::too_many_arguments)]
fn table(
    rows: &[MqttRow],
    brokers: &[(String, BrokerUrl)],
    methods: &[Method],
    n: u64,
    window: usize,
    paho: PahoMode,
    link: Option<Duration>,
    notes: &[String],
) -> (String, bool) {
    let mut t = String::new();
    line(
        &mut t,
        format_args!(
            "lab mqtt (paper 004 Fig. 5): {n} messages of {} bytes per run; seconds per run \
             (median, mean, min-max); msg/s and the ratios from the medians",
            body(1).len()
        ),
    );
    line(
        &mut t,
        format_args!(
            "{:<10} {:<19} {:>4} {:>9} {:>9} {:>17} {:>9} {:>8} {:>7} {:>8} {:>6}",
            "broker",
            "method",
            "runs",
            "median s",
            "mean s",
            "min-max s",
            "msg/s",
            "missing",
            "out-ord",
            "raw o-o",
            "dups"
        ),
    );
    let mut met = true;
    let mut verdicts = Vec::new();
    for (b, url) in brokers {
        for m in methods {
            let a = aggregate(rows, b, &m.name());
            if a.runs == 0 {
                continue; // a Paho method where there is no Paho peer
            }
            line(
                &mut t,
                format_args!(
                    "{:<10} {:<19} {:>4} {:>9.3} {:>9.3} {:>8.3}-{:<8.3} {:>9.0} {:>8} {:>7} {:>8} {:>6}{}",
                    b,
                    m.name(),
                    a.runs,
                    a.median,
                    a.mean,
                    a.min,
                    a.max,
                    n as f64 / a.median,
                    a.missing,
                    a.ooo,
                    a.raw_ooo,
                    a.dups,
                    if a.failed > 0 {
                        format!("  ({} run(s) FAILED)", a.failed)
                    } else {
                        String::new()
                    }
                ),
            );
        }
        if url.tls {
            // the windowed queue over TLS against the same mosquitto's
            // plain listener, in the same run
            let tls = aggregate(rows, b, &Method::PubQueueWindow(window).name());
            let tcp = aggregate(rows, "mosquitto", &Method::PubQueueWindow(window).name());
            let ratio = tcp.median / tls.median;
            let ok =
                ratio >= 0.8 && tls.missing == 0 && tls.ooo == 0 && tls.failed == 0 && tls.runs > 0;
            met &= ok;
            verdicts.push(format!(
                "{b}: window {window} over TLS: {:.0} msg/s, plain TCP to the same mosquitto: \
                 {:.0} msg/s, TLS / TCP = {:.0} % (target >= 80 %, 0 missing, 0 out of order: {})",
                n as f64 / tls.median,
                n as f64 / tcp.median,
                ratio * 100.0,
                if ok { "met" } else { "NOT met" },
            ));
            continue;
        }
        let pq = aggregate(rows, b, &Method::PubQueue.name());
        let q2 = aggregate(rows, b, &Method::Qos2.name());
        let pw = aggregate(rows, b, &Method::PubQueueWindow(window).name());
        let q1 = aggregate(rows, b, &Method::Qos1One.name());
        let r1 = q2.median / pq.median;
        let r2 = pq.median / pw.median;
        let r0 = q2.median / q1.median;
        let own = pq.median / q1.median;
        let clean = |a: &Agg| a.missing == 0 && a.ooo == 0 && a.failed == 0;
        let lo = paper::MQTT_QOS2_OVER_PUBQUEUE * (1.0 - paper::MQTT_RATIO_TOLERANCE);
        let hi = paper::MQTT_QOS2_OVER_PUBQUEUE * (1.0 + paper::MQTT_RATIO_TOLERANCE);
        // The ratio target is the paper's "about 2x" within 15 %, over a
        // modelled link: on bare loopback the per-message CPU work, which
        // does not double, outweighs the round trips, and the ratio
        // measures CPU placement (docs/mqtt.md). There it is information.
        let ok1 = clean(&pq) && (link.is_none() || ratio_reproduced(r1));
        let ok2 = r2 >= 3.0 && clean(&pw);
        met &= ok1 && ok2;
        match link {
            Some(d) => verdicts.push(format!(
                "{b}: QoS 2 time / Pub Queue time over the modelled link ({d:?} each way) = \
                 {r1:.2}x (paper: about {:.0}x; target {lo:.1}-{hi:.1}x, 0 missing, 0 out of \
                 order: {}); window {window} + reordering rate / window 1 rate = {r2:.2}x \
                 (target >= 3x, 0 missing, 0 out of order: {})",
                paper::MQTT_QOS2_OVER_PUBQUEUE,
                if ok1 { "met" } else { "NOT met" },
                if ok2 { "met" } else { "NOT met" },
            )),
            None => verdicts.push(format!(
                "{b}: QoS 2 time / Pub Queue time on bare loopback = {r1:.2}x (information: the \
                 paper's about {:.0}x, {lo:.1}-{hi:.1}x, is judged over a modelled link, \
                 --link-delay); Pub Queue 0 missing, 0 out of order: {}; window {window} + \
                 reordering rate / window 1 rate = {r2:.2}x (target >= 3x, 0 missing, 0 out of \
                 order: {})",
                paper::MQTT_QOS2_OVER_PUBQUEUE,
                if ok1 { "met" } else { "NOT met" },
                if ok2 { "met" } else { "NOT met" },
            )),
        }
        if link.is_some() {
            let lb = loopback_name(b);
            let bpq = aggregate(rows, &lb, &Method::PubQueue.name());
            let bq2 = aggregate(rows, &lb, &Method::Qos2.name());
            if bpq.runs > 0 && bq2.runs > 0 {
                verdicts.push(format!(
                    "{b}: beside it, on bare loopback (information): QoS 2 / Pub Queue = {:.2}x \
                     (Pub Queue {:.3} s, QoS 2 {:.3} s, medians of {} runs; {} missing, {} out of order)",
                    bq2.median / bpq.median,
                    bpq.median,
                    bq2.median,
                    bpq.runs.min(bq2.runs),
                    bpq.missing + bq2.missing,
                    bpq.ooo + bq2.ooo,
                ));
            }
        }
        verdicts.push(format!(
            "{b}: for reference, plain QoS 2 / plain QoS 1 (both one in flight, no queue) = \
             {r0:.2}x, the protocols' own ratio here; Pub Queue / plain QoS 1 one in flight = \
             {own:.2}x (what the persistent queue adds to a bare round trip)"
        ));
        let ppq = aggregate(rows, b, &Method::PahoPubQueue.name());
        let pq2 = aggregate(rows, b, &Method::PahoQos2.name());
        if ppq.runs > 0 && pq2.runs > 0 {
            verdicts.push(format!(
                "{b}: the paper's client, Eclipse Paho (Java, {} persistence), in the same \
                 session: QoS 2 time / Pub Queue time = {:.2}x ({} missing, {} out of order); \
                 Paho's Pub Queue time / ours = {:.2}x",
                paho.persistence(),
                pq2.median / ppq.median,
                ppq.missing + pq2.missing,
                ppq.ooo + pq2.ooo,
                ppq.median / pq.median,
            ));
        }
    }
    line(&mut t, format_args!(""));
    for v in verdicts {
        line(&mut t, format_args!("{v}"));
    }
    line(
        &mut t,
        format_args!(
            "out-ord: seen out of order by the application (publish-queue methods: after the \
             receiver's reorder buffer; plain: as they arrived). raw o-o: arrivals before reordering."
        ),
    );
    for p in paper::MQTT_FIG5_TEXT {
        line(&mut t, format_args!("{p}"));
    }
    for note in notes {
        line(&mut t, format_args!("note: {note}"));
    }
    (t, met)
}

use crate::plot::err;

/// `mqtt.svg`: mean seconds per run for each method, one group of bars per
/// broker, min-max as whiskers, each run as a dot.
fn plot(
    path: &PathBuf,
    rows: &[MqttRow],
    brokers: &[(String, BrokerUrl)],
    methods: &[Method],
    n: u64,
) -> anyhow::Result<()> {
    const COLORS: [RGBColor; 7] = [
        RGBColor(0x1f, 0x77, 0xb4),
        RGBColor(0xd6, 0x27, 0x28),
        RGBColor(0x7f, 0x7f, 0x7f),
        RGBColor(0x2c, 0xa0, 0x2c),
        RGBColor(0x94, 0x67, 0xbd),
        RGBColor(0x17, 0xbe, 0xcf),
        RGBColor(0xff, 0x7f, 0x0e),
    ];
    let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let ymax = rows
        .iter()
        .filter(|r| r.error.is_none())
        .map(|r| r.seconds)
        .fold(0.01, f64::max)
        * 1.15;
    let groups = brokers.len() as f64;
    let width = methods.len() as f64 + 1.0;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{n} MQTT messages: seconds per run (paper 004 Fig. 5)"),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..groups * width, 0f64..ymax)
        .map_err(err)?;
    let names: Vec<String> = brokers.iter().map(|(b, _)| b.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(brokers.len() * 2 + 1)
        .x_label_formatter(&|x| {
            let g = (x / width).floor();
            let centre = g * width + width / 2.0;
            if (x - centre).abs() < 0.3 {
                names.get(g as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc("seconds per run")
        .y_label_formatter(&|y| format!("{y:.2}"))
        .draw()
        .map_err(err)?;
    for (mi, m) in methods.iter().enumerate() {
        let color = COLORS[mi % COLORS.len()];
        let mut bars = Vec::new();
        let mut dots = Vec::new();
        for (bi, (b, _)) in brokers.iter().enumerate() {
            let a = aggregate(rows, b, &m.name());
            let x0 = bi as f64 * width + 0.5 + mi as f64;
            if a.mean.is_finite() {
                bars.push(Rectangle::new(
                    [(x0 + 0.1, 0.0), (x0 + 0.9, a.mean)],
                    color.mix(0.6).filled(),
                ));
                bars.push(Rectangle::new(
                    [(x0 + 0.45, a.min), (x0 + 0.55, a.max)],
                    BLACK.filled(),
                ));
            }
            for r in rows
                .iter()
                .filter(|r| r.broker == *b && r.method == m.name() && r.error.is_none())
            {
                dots.push(Circle::new((x0 + 0.5, r.seconds), 2, BLACK.filled()));
            }
        }
        chart
            .draw_series(bars)
            .map_err(err)?
            .label(m.name())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled()));
        chart.draw_series(dots).map_err(err)?;
    }
    crate::plot::legend(
        &mut chart.configure_series_labels(),
        SeriesLabelPosition::UpperRight,
    )?;
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ratio_target_is_about_2x_within_15_percent() {
        for r in [1.7, 1.85, 2.0, 2.3] {
            assert!(ratio_reproduced(r), "{r}");
        }
        for r in [1.69, 2.31, 1.5, 3.0, f64::NAN] {
            assert!(!ratio_reproduced(r), "{r}");
        }
    }

    #[test]
    fn body_is_26_bytes_numbered() {
        assert_eq!(body(1), "0001:mintgate-fig5-payload");
        assert_eq!(body(1000).len(), 26);
        assert_eq!(body(7).len(), 26);
    }
}
