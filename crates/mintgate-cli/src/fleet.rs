//! `mintgate lab fleet`: K gateway processes (`mintgate serve --nats` with
//! S simulated sensors each at HZ, as a user would run them) publishing into
//! a private 3-node JetStream cluster on loopback (a stream with 3
//! replicas); mid-run one node is killed (-9) and restarted, later the
//! stream's leader. A consumer reads the stream as it fills. Reports the
//! offered and stored rates, the latency from a sensor's sample to the
//! stream (the server's timestamp) and to the consumer (p50, p99, max; p99
//! outside the failovers, and each failover's gap), the lost (gaps in a
//! sequence), duplicated and out-of-order counts, and where the CPU went
//! (the gateways, the nats-servers, the lab's consumer; from /proc) beside
//! the machine's load. Writes `fleet.csv` (one row per second) and
//! `fleet.svg`.
//!
//! With `--compare`, the same load for the same time also goes, without
//! failures, through nats-server's MQTT listener (one node with JetStream;
//! QoS 1) and through mosquitto (QoS 1), each read by an MQTT subscriber;
//! printed beside the JetStream figures and drawn in the same plot.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures_util::StreamExt as _;
use mintgate_nats::cluster::{
    process_cpu_seconds, stream_now, wait_stream_ready, Cluster, Options,
};

/// Arguments of `mintgate lab fleet`.
#[derive(clap::Args)]
pub struct FleetArgs {
    /// Short settings: 3 gateways x 10 sensors x 10 Hz for 20 s.
    #[arg(long)]
    quick: bool,
    /// Gateway processes [10; quick 3].
    #[arg(long)]
    gateways: Option<usize>,
    /// Simulated sensors per gateway [100; quick 10].
    #[arg(long)]
    sensors: Option<usize>,
    /// Samples per second of each sensor.
    #[arg(long, default_value_t = 10.0)]
    rate: f64,
    /// How long the gateways publish [60s; quick 20s].
    #[arg(long, value_parser = |s: &str| mintgate_gateway::config::parse_duration(s))]
    duration: Option<Duration>,
    /// No node or leader kill: the steady state (e.g. to find the highest
    /// rate sustained).
    #[arg(long)]
    no_failures: bool,
    /// Also the same load, without failures, through nats-server's MQTT
    /// listener and through mosquitto (QoS 1), printed beside.
    #[arg(long)]
    compare: bool,
    /// Output folder (fleet.csv, fleet.svg, the servers' and gateways'
    /// logs).
    #[arg(long, default_value = "lab-out/")]
    out: PathBuf,
    /// The `mintgate` binary the gateways run (`serve`): by default this
    /// one; give a build without the labs to measure the gateway as it
    /// ships.
    #[arg(long, value_name = "PATH")]
    gateway_exe: Option<PathBuf>,
}

struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One message as the reader saw it.
struct Seen {
    publisher: String,
    topic: String,
    seq: u64,
    sample_ms: i64,
    /// The stream's timestamp (JetStream only).
    stored_ms: Option<i64>,
    consumed_ms: i64,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn pct(v: &mut [i64], p: f64) -> i64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// The load: K gateways x S sensors x HZ for D.
#[derive(Clone, Copy)]
struct Load {
    k: usize,
    s: usize,
    rate: f64,
    dur: Duration,
}

impl Load {
    fn offered(&self) -> f64 {
        self.k as f64 * self.s as f64 * self.rate
    }
}

/// Where the gateways publish.
enum Via<'a> {
    /// `serve --nats URLS`.
    JetStream(&'a str),
    /// `serve --mqtt-broker URL`.
    Mqtt(String),
}

/// The machine's CPU time (all cores) and its idle part, in ticks, from
/// `/proc/stat`.
fn machine_ticks() -> Option<(u64, u64)> {
    let st = std::fs::read_to_string("/proc/stat").ok()?;
    let line = st.lines().next()?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal
    let total = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
    Some((total, idle))
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

/// A run of the load, measured.
struct Run {
    label: String,
    seen: Vec<Seen>,
    /// The stream's count (JetStream).
    stored: Option<u64>,
    enqueued: u64,
    left: u64,
    unknown: usize,
    run_s: f64,
    cpu_gateways: f64,
    cpu_server: f64,
    cpu_lab: f64,
    /// Of all cores over the run, 0..=1.
    machine_busy: f64,
    load_before: String,
    load_after: String,
    /// (ms since the Unix epoch, what)
    events: Vec<(i64, String)>,
    t0_ms: i64,
}

/// Starts the gateways of `load` publishing through `via`.
fn start_gateways(dir: &Path, load: Load, via: &Via, exe: &Path) -> anyhow::Result<Vec<Proc>> {
    let period_ms = (1000.0 / load.rate).max(1.0);
    let mut gws = Vec::new();
    for g in 0..load.k {
        let mut conf = format!(
            "[coap]\nbind = [\"127.0.0.1:0\"]\n\n[pipeline]\npool = \"fixed:1\"\n\n\
             [mqtt]\nstate = \"{}\"\nwindow = 64\ntopic_prefix = \"gw{g}/\"\n\n\
             [nats]\nstream = \"FLEET\"\nsubject = \"FLEET.{{topic}}\"\nreplicas = 3\n",
            dir.join(format!("q{g}")).display()
        );
        for i in 0..load.s {
            conf.push_str(&format!(
                "\n[[devices.list]]\nname = \"s{i}\"\nkind = \"sim-sensor\"\nsignal = \"sine(22, 3, 60s)\"\nperiod = \"{period_ms}ms\"\n"
            ));
        }
        let f = dir.join(format!("gw{g}.toml"));
        std::fs::write(&f, conf)?;
        let log = std::fs::File::create(dir.join(format!("gw{g}.log")))?;
        let mut cmd = Command::new(exe);
        cmd.args(["serve", "--config"]).arg(&f);
        match via {
            Via::JetStream(urls) => cmd.args(["--nats", urls]),
            Via::Mqtt(url) => cmd.args(["--mqtt-broker", url]),
        };
        gws.push(Proc(
            cmd.stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()?,
        ));
    }
    Ok(gws)
}

/// Stops the gateways in order (SIGTERM: what their bridges hold is
/// enqueued, their queues drain for 2 s; at most 30 s in all, an
/// overloaded gateway may need long to enqueue its backlog) and returns
/// the CPU seconds they used until then.
fn stop_gateways(gws: &mut [Proc]) -> anyhow::Result<f64> {
    let cpu = gws
        .iter()
        .filter_map(|g| process_cpu_seconds(g.0.id()))
        .sum();
    for g in gws.iter() {
        if let Ok(pid) = i32::try_from(g.0.id()) {
            // SAFETY: kill(2) on our own child's pid.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
    }
    let stopped = Instant::now();
    for g in gws.iter_mut() {
        while g.0.try_wait()?.is_none() && stopped.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(cpu)
}

/// What each gateway enqueued and left unacknowledged at its stop (its
/// last log line of the bridges; kept in its queue's store for a next
/// start), and how many did not say.
fn queue_counts(dir: &Path, k: usize) -> (u64, u64, usize) {
    let (mut enqueued, mut left, mut unknown) = (0u64, 0u64, 0usize);
    for g in 0..k {
        let log = std::fs::read_to_string(dir.join(format!("gw{g}.log"))).unwrap_or_default();
        let field = |name: &str| -> Option<u64> {
            let line = log
                .lines()
                .rev()
                .find(|l| l.contains("MQTT bridges stopped"))?;
            let v = line.split(&format!(" {name}=")).nth(1)?;
            v.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
        };
        match (field("enqueued"), field("unacked")) {
            (Some(e), Some(u)) => {
                enqueued += e;
                left += u;
            }
            _ => unknown += 1,
        }
    }
    (enqueued, left, unknown)
}

/// The sample time of a message: the sensor's `ts` in the body, else the
/// envelope's enqueue time.
fn sample_ms(env: &mintgate_mqtt::Envelope) -> i64 {
    serde_json::from_str::<serde_json::Value>(&env.msg)
        .ok()
        .and_then(|v| v["ts"].as_i64())
        .unwrap_or(env.ts as i64)
}

/// Reads the stream of `t` from its start as it fills, until `stop`; a
/// consumer lives on one node, so when it fails (a node killed) a new one
/// starts after the last stream sequence seen, and when it skips ahead a
/// new one starts at the first message missing (counted in `rereads`).
fn jetstream_reader(
    t: mintgate_nats::Target,
    stop: Arc<AtomicBool>,
    seen_tx: std::sync::mpsc::Sender<Seen>,
    rereads: Arc<std::sync::atomic::AtomicU64>,
) -> std::thread::JoinHandle<anyhow::Result<()>> {
    std::thread::spawn(move || -> anyhow::Result<()> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async move {
            use mintgate_nats::async_nats::{self, jetstream};
            let client = async_nats::ConnectOptions::new()
                .connect(t.servers.as_slice())
                .await?;
            let js = jetstream::new(client);
            let mut next_seq = 1u64;
            let mut reread_from = None::<u64>;
            'outer: while !stop.load(Relaxed) {
                let consumer = async {
                    js.get_stream(&t.stream)
                        .await?
                        .create_consumer(jetstream::consumer::pull::Config {
                            ack_policy: jetstream::consumer::AckPolicy::None,
                            deliver_policy: jetstream::consumer::DeliverPolicy::ByStartSequence {
                                start_sequence: next_seq,
                            },
                            inactive_threshold: Duration::from_secs(10),
                            ..Default::default()
                        })
                        .await
                        .map_err(anyhow::Error::from)
                }
                .await;
                let messages = match consumer {
                    Ok(c) => c
                        .stream()
                        .heartbeat(Duration::from_secs(1))
                        .expires(Duration::from_secs(4))
                        .messages()
                        .await
                        .ok(),
                    Err(_) => None,
                };
                let Some(mut msgs) = messages else {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                };
                while !stop.load(Relaxed) {
                    let m =
                        match tokio::time::timeout(Duration::from_millis(200), msgs.next()).await {
                            Ok(Some(Ok(m))) => m,
                            // a node failing: a new consumer
                            Ok(Some(Err(_)) | None) => continue 'outer,
                            Err(_) => continue,
                        };
                    let consumed_ms = now_ms();
                    let Ok(info) = m.info() else { continue };
                    // A consumer without acknowledgements promises no
                    // delivery: around a failover it may skip ahead. The
                    // stream's sequence has no holes here (nothing is
                    // deleted), so a jump means messages not delivered:
                    // read again from the first one missing, once per
                    // place (a real hole is then taken as it is).
                    if info.stream_sequence > next_seq && reread_from != Some(next_seq) {
                        reread_from = Some(next_seq);
                        rereads.fetch_add(1, Relaxed);
                        continue 'outer;
                    }
                    if info.stream_sequence < next_seq {
                        continue;
                    }
                    next_seq = info.stream_sequence + 1;
                    let stored_ms = (info.published.unix_timestamp_nanos() / 1_000_000) as i64;
                    let Ok(env) = mintgate_mqtt::decode(&m.payload) else {
                        continue;
                    };
                    let _ = seen_tx.send(Seen {
                        sample_ms: sample_ms(&env),
                        publisher: env.publisher,
                        topic: m.subject.to_string(),
                        seq: env.seq,
                        stored_ms: Some(stored_ms),
                        consumed_ms,
                    });
                }
            }
            anyhow::Ok(())
        })
    })
}

/// Subscribes to everything (`#`, QoS 1) at the MQTT broker `port` until
/// `stop`; `ready` is set once the subscription is granted.
fn mqtt_reader(
    port: u16,
    stop: Arc<AtomicBool>,
    ready: Arc<AtomicBool>,
    seen_tx: std::sync::mpsc::Sender<Seen>,
) -> std::thread::JoinHandle<anyhow::Result<()>> {
    std::thread::spawn(move || -> anyhow::Result<()> {
        use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async move {
            let mut o = MqttOptions::new("fleet-reader", "127.0.0.1", port);
            o.set_keep_alive(Duration::from_secs(10));
            o.set_max_packet_size(1 << 16, 1 << 16);
            let (client, mut ev) = AsyncClient::new(o, 1000);
            client.subscribe("#", QoS::AtLeastOnce).await?;
            while !stop.load(Relaxed) {
                let e = match tokio::time::timeout(Duration::from_millis(200), ev.poll()).await {
                    Ok(Ok(e)) => e,
                    Ok(Err(_)) => {
                        // not up yet, or gone: rumqttc connects again on
                        // the next poll
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                    Err(_) => continue,
                };
                match e {
                    Event::Incoming(Packet::SubAck(_)) => ready.store(true, Relaxed),
                    Event::Incoming(Packet::ConnAck(_)) if ready.load(Relaxed) => {
                        // a new session: subscribe again
                        client.subscribe("#", QoS::AtLeastOnce).await?;
                    }
                    Event::Incoming(Packet::Publish(p)) => {
                        let consumed_ms = now_ms();
                        let Ok(env) = mintgate_mqtt::decode(&p.payload) else {
                            continue;
                        };
                        let _ = seen_tx.send(Seen {
                            sample_ms: sample_ms(&env),
                            publisher: env.publisher,
                            topic: p.topic.clone(),
                            seq: env.seq,
                            stored_ms: None,
                            consumed_ms,
                        });
                    }
                    _ => {}
                }
            }
            anyhow::Ok(())
        })
    })
}

/// Collects what the reader saw: until it has `want` (or nothing came for
/// 5 s; at most 30 s), then stops it.
fn collect(
    rx: &std::sync::mpsc::Receiver<Seen>,
    stop: &AtomicBool,
    want: impl Fn(usize) -> bool,
) -> Vec<Seen> {
    let mut seen = Vec::new();
    let end = Instant::now() + Duration::from_secs(30);
    let mut last = Instant::now();
    while !want(seen.len()) && Instant::now() < end && last.elapsed() < Duration::from_secs(5) {
        if let Ok(x) = rx.recv_timeout(Duration::from_millis(200)) {
            seen.push(x);
            last = Instant::now();
        }
    }
    stop.store(true, Relaxed);
    while let Ok(x) = rx.try_recv() {
        seen.push(x);
    }
    seen
}

/// Runs the lab.
pub fn run_fleet(a: FleetArgs) -> anyhow::Result<std::process::ExitCode> {
    let load = Load {
        k: a.gateways.unwrap_or(if a.quick { 3 } else { 10 }),
        s: a.sensors.unwrap_or(if a.quick { 10 } else { 100 }),
        rate: a.rate,
        dur: a
            .duration
            .unwrap_or(Duration::from_secs(if a.quick { 20 } else { 60 })),
    };
    anyhow::ensure!((1..=50).contains(&load.k), "--gateways: 1..=50");
    anyhow::ensure!((1..=1000).contains(&load.s), "--sensors: 1..=1000");
    anyhow::ensure!(
        a.rate > 0.0 && a.rate <= 1000.0,
        "--rate: above 0, at most 1000"
    );
    anyhow::ensure!(
        load.dur >= Duration::from_secs(5) && load.dur <= Duration::from_secs(3600),
        "--duration: 5s..=1h"
    );
    let dir = a.out.join("fleet");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    println!(
        "fleet: {} gateways x {} sensors x {} Hz = {:.0} messages/s offered for {:.0} s into a \
         3-node cluster (stream of 3 replicas){}; {} cores, load {}",
        load.k,
        load.s,
        load.rate,
        load.offered(),
        load.dur.as_secs_f64(),
        if a.no_failures { ", no failures" } else { "" },
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        loadavg()
    );
    let exe = match a.gateway_exe {
        Some(p) => p,
        None => std::env::current_exe()?,
    };
    anyhow::ensure!(
        exe.is_file(),
        "--gateway-exe {}: no such file",
        exe.display()
    );
    let js = run_jetstream(&dir.join("jetstream"), load, !a.no_failures, &exe)?;
    let mut runs = vec![js];
    if a.compare {
        runs.push(run_mqtt(&dir.join("nats-mqtt"), load, false, &exe)?);
        match mintgate_mqtt::broker::find_mosquitto() {
            Some(_) => runs.push(run_mqtt(&dir.join("mosquitto"), load, true, &exe)?),
            None => println!("(mosquitto is not installed: no mosquitto run)"),
        }
    }
    report(&a.out, load, &runs)?;
    Ok(std::process::ExitCode::SUCCESS)
}

/// The JetStream run: the cluster, the gateways, the reader, and (with
/// `failures`) a node and then the leader killed and restarted.
fn run_jetstream(dir: &Path, load: Load, failures: bool, exe: &Path) -> anyhow::Result<Run> {
    std::fs::create_dir_all(dir)?;
    let mut cluster = Cluster::start_for_tests(&dir.join("cluster"), 3)?.ok_or_else(|| {
        anyhow::anyhow!("nats-server is not installed (apt-get install nats-server)")
    })?;
    let t = cluster.target("FLEET").map_err(anyhow::Error::msg)?;
    wait_stream_ready(&t, Duration::from_secs(30)).context("the stream")?;
    let urls = cluster.urls().join(",");
    let (seen_tx, seen_rx) = std::sync::mpsc::channel::<Seen>();
    let stop = Arc::new(AtomicBool::new(false));
    let rereads = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let reader = jetstream_reader(t.clone(), stop.clone(), seen_tx, rereads.clone());
    // run_mqtt measures the same way and fills its Run alike; the steps stay
    // inline because each run interleaves them with its own (the failures,
    // the stream's count, the reader catching up).
    let load_before = loadavg();
    let ticks0 = machine_ticks();
    let lab0 = process_cpu_seconds(std::process::id()).unwrap_or(0.0);
    let server0 = cluster.cpu_seconds();
    let mut gws = start_gateways(dir, load, &Via::JetStream(&urls), exe)?;
    let t0 = Instant::now();
    let t0_ms = now_ms();
    let at = |f: f64| t0 + load.dur.mul_f64(f);
    let wait_until =
        |when: Instant| std::thread::sleep(when.saturating_duration_since(Instant::now()));
    let mut events = Vec::new();
    if failures {
        // a node that is not the leader, then the leader
        wait_until(at(0.25));
        let leader = stream_now(&t)
            .ok()
            .and_then(|s| s.leader)
            .unwrap_or_default();
        let victim = (0..3).find(|&i| cluster.name(i) != leader).unwrap_or(0);
        cluster.kill(victim);
        events.push((now_ms(), format!("killed {} (-9)", cluster.name(victim))));
        wait_until(at(0.4));
        cluster.restart(victim)?;
        events.push((now_ms(), format!("restarted {}", cluster.name(victim))));
        wait_until(at(0.55));
        // one failure at a time: the restarted node current again first
        // (else killing the leader leaves no majority)
        let since = Instant::now();
        let ready = wait_stream_ready(&t, Duration::from_secs(15));
        events.push((
            now_ms(),
            match &ready {
                Ok(_) => format!(
                    "all 3 replicas current (waited {:.1} s)",
                    since.elapsed().as_secs_f64()
                ),
                Err(e) => format!("replicas not all current after 15 s: {e}"),
            },
        ));
        let leader = stream_now(&t)
            .ok()
            .and_then(|s| s.leader)
            .unwrap_or_default();
        let li = cluster.index_of(&leader).unwrap_or(0);
        cluster.kill(li);
        events.push((
            now_ms(),
            format!("killed the leader {} (-9)", cluster.name(li)),
        ));
        wait_until(at(0.7));
        cluster.restart(li)?;
        events.push((now_ms(), format!("restarted {}", cluster.name(li))));
    }
    wait_until(at(1.0));
    let cpu_gateways = stop_gateways(&mut gws)?;
    let run_s = t0.elapsed().as_secs_f64();
    let cpu_server = cluster.cpu_seconds() - server0;
    let ticks1 = machine_ticks();
    let load_after = loadavg();
    // let the reader catch up: until it has seen what the stream holds
    let stored = stream_now(&t).map(|s| s.messages).unwrap_or(0);
    let seen = collect(&seen_rx, &stop, |n| n as u64 >= stored);
    let _ = reader.join();
    let skipped = rereads.load(Relaxed);
    if skipped > 0 {
        events.push((
            now_ms(),
            format!(
                "the reader's consumer skipped ahead {skipped} time(s); each time it read again \
                 from the first message missing"
            ),
        ));
    }
    let cpu_lab = process_cpu_seconds(std::process::id()).unwrap_or(0.0) - lab0;
    let stored = stream_now(&t).map(|s| s.messages).unwrap_or(stored);
    let (enqueued, left, unknown) = queue_counts(dir, load.k);
    Ok(Run {
        label: "JetStream (3 replicas)".into(),
        seen,
        stored: Some(stored),
        enqueued,
        left,
        unknown,
        run_s,
        cpu_gateways,
        cpu_server,
        cpu_lab,
        machine_busy: busy(ticks0, ticks1),
        load_before,
        load_after,
        events,
        t0_ms,
    })
}

fn busy(a: Option<(u64, u64)>, b: Option<(u64, u64)>) -> f64 {
    match (a, b) {
        (Some((t0, i0)), Some((t1, i1))) if t1 > t0 => {
            1.0 - (i1.saturating_sub(i0)) as f64 / (t1 - t0) as f64
        }
        _ => f64::NAN,
    }
}

/// The same load through an MQTT broker, no failures: nats-server's MQTT
/// listener (one node with JetStream) or, with `mosquitto`, mosquitto.
fn run_mqtt(dir: &Path, load: Load, mosquitto: bool, exe: &Path) -> anyhow::Result<Run> {
    use mintgate_mqtt::broker::{find_mosquitto, free_port, Mosquitto};
    std::fs::create_dir_all(dir)?;
    let mut nats = None;
    let mut mosq = None;
    let (port, label) = if mosquitto {
        let bin = find_mosquitto().context("mosquitto")?;
        let m = Mosquitto::start(&bin, &dir.join("mosquitto"))?;
        let p = m.port();
        mosq = Some(m);
        (p, "mosquitto (MQTT QoS 1)")
    } else {
        let port = free_port([127, 0, 0, 1].into())?;
        let opts = Options {
            extra: format!("mqtt {{\n  listen: 127.0.0.1:{port}\n}}\n"),
            ..Options::default()
        };
        nats = Some(
            Cluster::start_for_tests_with(&dir.join("server"), 1, opts)?
                .context("nats-server is not installed")?,
        );
        (port, "nats-server MQTT (QoS 1, 1 node)")
    };
    let server_cpu = || -> f64 {
        match (&nats, &mosq) {
            (Some(c), _) => c.cpu_seconds(),
            (_, Some(m)) => m.pid().and_then(process_cpu_seconds).unwrap_or(0.0),
            _ => 0.0,
        }
    };
    let (seen_tx, seen_rx) = std::sync::mpsc::channel::<Seen>();
    let stop = Arc::new(AtomicBool::new(false));
    let ready = Arc::new(AtomicBool::new(false));
    let reader = mqtt_reader(port, stop.clone(), ready.clone(), seen_tx);
    let end = Instant::now() + Duration::from_secs(15);
    while !ready.load(Relaxed) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    anyhow::ensure!(
        ready.load(Relaxed),
        "{label}: the subscriber was not subscribed within 15 s"
    );
    let load_before = loadavg();
    let ticks0 = machine_ticks();
    let lab0 = process_cpu_seconds(std::process::id()).unwrap_or(0.0);
    let server0 = server_cpu();
    let mut gws = start_gateways(
        dir,
        load,
        &Via::Mqtt(format!("mqtt://127.0.0.1:{port}")),
        exe,
    )?;
    let t0 = Instant::now();
    let t0_ms = now_ms();
    std::thread::sleep(load.dur);
    let cpu_gateways = stop_gateways(&mut gws)?;
    let run_s = t0.elapsed().as_secs_f64();
    let cpu_server = server_cpu() - server0;
    let ticks1 = machine_ticks();
    let load_after = loadavg();
    let (enqueued, left, unknown) = queue_counts(dir, load.k);
    let delivered = enqueued.saturating_sub(left) as usize;
    let seen = collect(&seen_rx, &stop, |n| unknown == 0 && n >= delivered);
    let _ = reader.join();
    let cpu_lab = process_cpu_seconds(std::process::id()).unwrap_or(0.0) - lab0;
    Ok(Run {
        label: label.into(),
        seen,
        stored: None,
        enqueued,
        left,
        unknown,
        run_s,
        cpu_gateways,
        cpu_server,
        cpu_lab,
        machine_busy: busy(ticks0, ticks1),
        load_before,
        load_after,
        events: Vec::new(),
        t0_ms,
    })
}

/// Per (publisher, topic): lost (gaps below the highest), duplicated, out
/// of order (in the order read).
fn counts(seen: &[Seen]) -> (usize, u64, u64, u64) {
    let mut streams: HashMap<(&str, &str), Vec<u64>> = HashMap::new();
    for x in seen {
        streams
            .entry((x.publisher.as_str(), x.topic.as_str()))
            .or_default()
            .push(x.seq);
    }
    let (mut lost, mut dup, mut ooo) = (0u64, 0u64, 0u64);
    for seqs in streams.values() {
        ooo += seqs.windows(2).filter(|w| w[1] < w[0]).count() as u64;
        let mut sorted = seqs.clone();
        sorted.sort_unstable();
        let before = sorted.len();
        sorted.dedup();
        dup += (before - sorted.len()) as u64;
        let max = sorted.last().copied().unwrap_or(0);
        lost += max - sorted.len() as u64;
    }
    (streams.len(), lost, dup, ooo)
}

/// The latency to the end of a run: to the stream (JetStream) or to the
/// MQTT subscriber.
fn to_end(x: &Seen) -> i64 {
    x.stored_ms.unwrap_or(x.consumed_ms) - x.sample_ms
}

/// Per second of sample time since `t0_ms`: (messages, p50, p99, max).
fn per_second(seen: &[Seen], t0_ms: i64) -> BTreeMap<i64, (usize, i64, i64, i64)> {
    let mut by: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for x in seen {
        by.entry((x.sample_ms - t0_ms).div_euclid(1000))
            .or_default()
            .push(to_end(x));
    }
    by.into_iter()
        .map(|(s, mut v)| {
            let n = v.len();
            (
                s,
                (n, pct(&mut v, 0.5), pct(&mut v, 0.99), pct(&mut v, 1.0)),
            )
        })
        .collect()
}

/// The failovers of a run: for each kill, the second it happened, the
/// longest time nothing was stored from about then on (until the next
/// kill, at most 30 s: the gap), and the first second after it whose p99 is under
/// 250 ms again.
fn failovers(run: &Run, secs: &BTreeMap<i64, (usize, i64, i64, i64)>) -> Vec<(i64, i64, i64)> {
    let mut stored: Vec<i64> = run.seen.iter().filter_map(|x| x.stored_ms).collect();
    stored.sort_unstable();
    let kills: Vec<i64> = run
        .events
        .iter()
        .filter(|(_, what)| what.starts_with("killed"))
        .map(|&(ms, _)| ms)
        .collect();
    kills
        .iter()
        .enumerate()
        .map(|(i, &ms)| {
            // a gap that starts from 1 s before this kill until 1 s
            // before the next (at most 30 s after it)
            let end = kills
                .get(i + 1)
                .map_or(i64::MAX, |next| next - 1000)
                .min(ms + 30_000);
            let gap = stored
                .windows(2)
                .filter(|w| w[1] > ms && w[0] >= ms - 1000 && w[0] < end)
                .map(|w| w[1] - w[0])
                .max()
                .unwrap_or(0);
            // from the second before the kill (its samples wait for the
            // failover too) to the first second after the gap whose p99 is
            // under 250 ms again
            let kill_s = (ms - run.t0_ms).div_euclid(1000) - 1;
            let gap_end_s = (ms + gap - run.t0_ms).div_euclid(1000) + 1;
            let back = secs
                .range(gap_end_s..)
                .find(|(_, v)| v.2 < 250)
                .map(|(s, _)| *s)
                .unwrap_or(i64::MAX);
            (kill_s, gap, back)
        })
        .collect()
}

fn report(out: &Path, load: Load, runs: &[Run]) -> anyhow::Result<()> {
    let mut csv = String::from("run,second,messages,p50_ms,p99_ms,max_ms\n");
    let mut series = Vec::new();
    for run in runs {
        let secs = per_second(&run.seen, run.t0_ms);
        for (s, (n, p50, p99, max)) in &secs {
            csv.push_str(&format!(
                "{},{s},{n},{p50},{p99},{max}\n",
                run.label.split(' ').next().unwrap_or("run")
            ));
        }
        series.push(mintgate_lab::FleetSeries {
            label: run.label.clone(),
            points: secs
                .iter()
                .filter(|(s, _)| **s >= 0)
                .map(|(s, v)| (*s as f64, v.0 as f64, v.2 as f64))
                .collect(),
        });
        print_run(run, &secs, load);
    }
    let csv_path = out.join("fleet.csv");
    std::fs::write(&csv_path, csv)?;
    let svg = out.join("fleet.svg");
    let events: Vec<(f64, String)> = runs
        .first()
        .map(|r| {
            r.events
                .iter()
                .map(|(ms, what)| ((ms - r.t0_ms) as f64 / 1000.0, what.clone()))
                .collect()
        })
        .unwrap_or_default();
    mintgate_lab::fleet_svg(
        &svg,
        &format!(
            "fleet: {} gateways x {} sensors x {} Hz = {:.0} msg/s offered",
            load.k,
            load.s,
            load.rate,
            load.offered()
        ),
        &series,
        &events,
    )?;
    if runs.len() > 1 {
        println!(
            "\nside by side (latency: sample to stored for JetStream, to the subscriber for MQTT)"
        );
        println!(
            "{:<34} {:>9} {:>7} {:>6} {:>6} {:>8} {:>8} {:>8} {:>9} {:>9}",
            "run",
            "delivered",
            "lost",
            "twice",
            "order",
            "p50 ms",
            "p99 ms",
            "max ms",
            "gw CPU s",
            "srv CPU s"
        );
        for run in runs {
            let (_, lost, dup, ooo) = counts(&run.seen);
            let mut lat: Vec<i64> = run.seen.iter().map(to_end).collect();
            println!(
                "{:<34} {:>9} {:>7} {:>6} {:>6} {:>8} {:>8} {:>8} {:>9.1} {:>9.1}",
                run.label,
                run.seen.len(),
                lost,
                dup,
                ooo,
                pct(&mut lat, 0.5),
                pct(&mut lat, 0.99),
                pct(&mut lat, 1.0),
                run.cpu_gateways,
                run.cpu_server
            );
        }
    }
    println!("wrote {} and {}", csv_path.display(), svg.display());
    Ok(())
}

fn print_run(run: &Run, secs: &BTreeMap<i64, (usize, i64, i64, i64)>, load: Load) {
    println!("\n== {}", run.label);
    for (ms, what) in &run.events {
        println!("  {:>5.1} s  {what}", (ms - run.t0_ms) as f64 / 1000.0);
    }
    let (streams, lost, dup, ooo) = counts(&run.seen);
    let delivered = run.stored.unwrap_or(run.seen.len() as u64);
    println!(
        "offered {:.0} msg/s nominal; {} {delivered} ({:.0} msg/s over the {:.1} s run)",
        load.offered(),
        if run.stored.is_some() {
            "stored in the stream"
        } else {
            "received by the subscriber"
        },
        delivered as f64 / run.run_s,
        run.run_s
    );
    // Acknowledged = enqueued - left. Every acknowledged message must be
    // in the stream; what the stream holds beyond them (once each) was
    // stored but its acknowledgement had not reached the gateway when it
    // stopped: still in its queue, sent again by a restart and dropped then
    // by the stream's de-duplication. Stored twice is what the reader,
    // which read the whole stream, found twice.
    let acked = run.enqueued.saturating_sub(run.left);
    let once = delivered.saturating_sub(dup);
    if run.unknown == 0 {
        let held = if run.stored.is_some() {
            "stored"
        } else {
            "received"
        };
        println!(
            "enqueued by the gateways {}, left unacknowledged in their queues at the stop {}: \
             lost {}, {held} twice {dup}; {held} but not yet acknowledged when the gateways \
             stopped {} (kept in their queues; a restart sends them again, and the \
             de-duplication drops them)",
            run.enqueued,
            run.left,
            acked.saturating_sub(once),
            once.saturating_sub(acked),
        );
    } else {
        println!(
            "lost / twice UNKNOWN: {} of {} gateways did not stop within 30 s of SIGTERM \
             (overloaded?) and were killed",
            run.unknown, load.k
        );
    }
    println!(
        "the reader read {} over {streams} streams (gateway, sensor): gaps {lost}, duplicates \
         {dup}, out of order {ooo}",
        run.seen.len()
    );
    let mut lat: Vec<i64> = run.seen.iter().map(to_end).collect();
    let what = if run.stored.is_some() {
        "sample -> stored  "
    } else {
        "sample -> received"
    };
    println!(
        "{what} p50 {} ms, p99 {} ms, max {} ms",
        pct(&mut lat, 0.5),
        pct(&mut lat, 0.99),
        pct(&mut lat, 1.0)
    );
    if run.stored.is_some() {
        let mut c: Vec<i64> = run
            .seen
            .iter()
            .map(|x| x.consumed_ms - x.sample_ms)
            .collect();
        println!(
            "sample -> reader   p50 {} ms, p99 {} ms, max {} ms",
            pct(&mut c, 0.5),
            pct(&mut c, 0.99),
            pct(&mut c, 1.0)
        );
    }
    let fo = failovers(run, secs);
    if !fo.is_empty() {
        let mut outside: Vec<i64> = run
            .seen
            .iter()
            .filter(|x| {
                let s = (x.sample_ms - run.t0_ms).div_euclid(1000);
                !fo.iter().any(|&(k, _, back)| s >= k && s < back)
            })
            .map(to_end)
            .collect();
        for (k, gap, back) in &fo {
            println!(
                "failover at {} s: nothing stored for {gap} ms; p99 under 250 ms again from \
                 second {}",
                k + 1,
                if *back == i64::MAX {
                    "(never in the run)".to_string()
                } else {
                    back.to_string()
                }
            );
        }
        let excluded: i64 = fo
            .iter()
            .map(|&(k, _, back)| back.min(load.dur.as_secs() as i64 + 1) - k)
            .sum();
        println!(
            "sample -> stored outside the failovers ({excluded} s left out): p50 {} ms, p99 {} ms, \
             max {} ms ({} messages)",
            pct(&mut outside, 0.5),
            pct(&mut outside, 0.99),
            pct(&mut outside, 1.0),
            outside.len()
        );
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    println!(
        "CPU over the run: gateways {:.1} s ({:.0} % of a core, {:.1} us/msg), servers {:.1} s \
         ({:.0} %, {:.1} us/msg), this lab (reader) {:.1} s; the machine {:.0} % busy of {} cores \
         (load {} before, {} after)",
        run.cpu_gateways,
        100.0 * run.cpu_gateways / run.run_s,
        1e6 * run.cpu_gateways / delivered.max(1) as f64,
        run.cpu_server,
        100.0 * run.cpu_server / run.run_s,
        1e6 * run.cpu_server / delivered.max(1) as f64,
        run.cpu_lab,
        100.0 * run.machine_busy,
        cores,
        run.load_before,
        run.load_after
    );
}
