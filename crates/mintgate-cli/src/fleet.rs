//! `mintgate lab fleet`: K gateway processes (`mintgate serve --nats` with
//! S simulated sensors each at HZ, as a user would run them) publishing into
//! a private 3-node JetStream cluster on loopback (a stream with 3
//! replicas); mid-run one node is killed (-9) and restarted, later the
//! stream's leader. A consumer reads the stream as it fills. Reports the
//! offered and stored rates, the latency from a sensor's sample to the
//! stream (the server's timestamp) and to the consumer (p50, p99, max),
//! and the lost (gaps in a sequence), duplicated and out-of-order counts.
//! Writes `fleet.csv` (one row per second). Not yet: the plot, and the
//! same run through nats-server's MQTT listener and through mosquitto.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures_util::StreamExt as _;
use mintgate_nats::cluster::{stream_now, wait_stream_ready, Cluster};

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
    /// Output folder (fleet.csv, the cluster's and gateways' logs).
    #[arg(long, default_value = "lab-out/")]
    out: PathBuf,
}

struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One stored message as the consumer saw it.
struct Seen {
    publisher: String,
    topic: String,
    seq: u64,
    sample_ms: i64,
    stored_ms: i64,
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

/// Runs the lab.
pub fn run_fleet(a: FleetArgs) -> anyhow::Result<std::process::ExitCode> {
    let k = a.gateways.unwrap_or(if a.quick { 3 } else { 10 });
    let s = a.sensors.unwrap_or(if a.quick { 10 } else { 100 });
    let dur = a
        .duration
        .unwrap_or(Duration::from_secs(if a.quick { 20 } else { 60 }));
    anyhow::ensure!((1..=50).contains(&k), "--gateways: 1..=50");
    anyhow::ensure!((1..=1000).contains(&s), "--sensors: 1..=1000");
    anyhow::ensure!(
        a.rate > 0.0 && a.rate <= 1000.0,
        "--rate: above 0, at most 1000"
    );
    anyhow::ensure!(
        dur >= Duration::from_secs(5) && dur <= Duration::from_secs(3600),
        "--duration: 5s..=1h"
    );
    let dir = a.out.join("fleet");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let mut cluster = Cluster::start_for_tests(&dir.join("cluster"), 3)?.ok_or_else(|| {
        anyhow::anyhow!("nats-server is not installed (apt-get install nats-server)")
    })?;
    let t = cluster.target("FLEET").map_err(anyhow::Error::msg)?;
    wait_stream_ready(&t, Duration::from_secs(30)).context("the stream")?;
    let urls = cluster.urls().join(",");
    let exe = std::env::current_exe()?;
    let period_ms = (1000.0 / a.rate).max(1.0);
    println!(
        "fleet: {k} gateways x {s} sensors x {} Hz = {:.0} messages/s offered for {:.0} s into a 3-node cluster (stream of 3 replicas)",
        a.rate,
        k as f64 * s as f64 * a.rate,
        dur.as_secs_f64()
    );

    // the consumer, from the stream's start, as it fills
    let (seen_tx, seen_rx) = std::sync::mpsc::channel::<Seen>();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let consumer = {
        let (t, stop) = (t.clone(), stop.clone());
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
                // A consumer lives on one node: when it fails (a node
                // killed), a new one starts after the last stream sequence
                // seen.
                let mut next_seq = 1u64;
                'outer: while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let consumer = async {
                        js.get_stream(&t.stream)
                            .await?
                            .create_consumer(jetstream::consumer::pull::Config {
                                ack_policy: jetstream::consumer::AckPolicy::None,
                                deliver_policy:
                                    jetstream::consumer::DeliverPolicy::ByStartSequence {
                                        start_sequence: next_seq,
                                    },
                                inactive_threshold: Duration::from_secs(10),
                                ..Default::default()
                            })
                            .await
                            .map_err(anyhow::Error::from)
                    }
                    .await;
                    let mut msgs = match consumer {
                        Ok(c) => match c
                            .stream()
                            .heartbeat(Duration::from_secs(1))
                            .expires(Duration::from_secs(4))
                            .messages()
                            .await
                        {
                            Ok(m) => m,
                            Err(_) => {
                                tokio::time::sleep(Duration::from_millis(200)).await;
                                continue;
                            }
                        },
                        Err(_) => {
                            tokio::time::sleep(Duration::from_millis(200)).await;
                            continue;
                        }
                    };
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let m = match tokio::time::timeout(Duration::from_millis(200), msgs.next())
                            .await
                        {
                            Ok(Some(Ok(m))) => m,
                            // a node failing: a new consumer
                            Ok(Some(Err(_)) | None) => continue 'outer,
                            Err(_) => continue,
                        };
                        let consumed_ms = now_ms();
                        let Ok(info) = m.info() else { continue };
                        next_seq = info.stream_sequence + 1;
                        let stored_ms = (info.published.unix_timestamp_nanos() / 1_000_000) as i64;
                        let Ok(env) = mintgate_mqtt::decode(&m.payload) else {
                            continue;
                        };
                        let sample_ms = serde_json::from_str::<serde_json::Value>(&env.msg)
                            .ok()
                            .and_then(|v| v["ts"].as_i64())
                            .unwrap_or(env.ts as i64);
                        let _ = seen_tx.send(Seen {
                            publisher: env.publisher,
                            topic: m.subject.to_string(),
                            seq: env.seq,
                            sample_ms,
                            stored_ms,
                            consumed_ms,
                        });
                    }
                }
                anyhow::Ok(())
            })
        })
    };

    // the gateways
    let mut gws = Vec::new();
    for g in 0..k {
        let mut conf = format!(
            "[coap]\nbind = [\"127.0.0.1:0\"]\n\n[pipeline]\npool = \"fixed:1\"\n\n\
             [mqtt]\nstate = \"{}\"\nwindow = 64\ntopic_prefix = \"gw{g}/\"\n\n\
             [nats]\nstream = \"FLEET\"\nsubject = \"FLEET.{{topic}}\"\nreplicas = 3\n",
            dir.join(format!("q{g}")).display()
        );
        for i in 0..s {
            conf.push_str(&format!(
                "\n[[devices.list]]\nname = \"s{i}\"\nkind = \"sim-sensor\"\nsignal = \"sine(22, 3, 60s)\"\nperiod = \"{period_ms}ms\"\n"
            ));
        }
        let f = dir.join(format!("gw{g}.toml"));
        std::fs::write(&f, conf)?;
        let log = std::fs::File::create(dir.join(format!("gw{g}.log")))?;
        gws.push(Proc(
            Command::new(&exe)
                .args(["serve", "--config"])
                .arg(&f)
                .args(["--nats", &urls])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()?,
        ));
    }
    let t0 = Instant::now();
    let at = |f: f64| t0 + dur.mul_f64(f);
    let mut events = Vec::new();
    // a node that is not the leader, then the leader
    let wait_until =
        |when: Instant| std::thread::sleep(when.saturating_duration_since(Instant::now()));
    wait_until(at(0.25));
    let leader = stream_now(&t)
        .ok()
        .and_then(|s| s.leader)
        .unwrap_or_default();
    let victim = (0..3).find(|&i| cluster.name(i) != leader).unwrap_or(0);
    cluster.kill(victim);
    events.push((
        t0.elapsed(),
        format!("killed {} (-9)", cluster.name(victim)),
    ));
    wait_until(at(0.4));
    cluster.restart(victim)?;
    events.push((t0.elapsed(), format!("restarted {}", cluster.name(victim))));
    wait_until(at(0.55));
    // one failure at a time: the restarted node current again first (else
    // killing the leader leaves no majority)
    let since = Instant::now();
    let ready = wait_stream_ready(&t, Duration::from_secs(15));
    events.push((
        t0.elapsed(),
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
        t0.elapsed(),
        format!("killed the leader {} (-9)", cluster.name(li)),
    ));
    wait_until(at(0.7));
    cluster.restart(li)?;
    events.push((t0.elapsed(), format!("restarted {}", cluster.name(li))));
    wait_until(at(1.0));
    // stop the gateways in order (SIGTERM: their queues drain for 2 s)
    for g in &gws {
        if let Ok(pid) = i32::try_from(g.0.id()) {
            // SAFETY: kill(2) on our own child's pid.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
    }
    let stopped = Instant::now();
    for g in &mut gws {
        while g.0.try_wait()?.is_none() && stopped.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let run_s = t0.elapsed().as_secs_f64();
    // let the consumer catch up: until it has seen what the stream holds
    // (at most 30 s; a consumer on a killed node is made again)
    let stored = stream_now(&t).map(|s| s.messages).unwrap_or(0);
    let mut seen = Vec::new();
    let end = Instant::now() + Duration::from_secs(30);
    while (seen.len() as u64) < stored && Instant::now() < end {
        if let Ok(x) = seen_rx.recv_timeout(Duration::from_millis(500)) {
            seen.push(x);
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    while let Ok(x) = seen_rx.try_recv() {
        seen.push(x);
    }
    let _ = consumer.join();
    let stored = stream_now(&t).map(|s| s.messages).unwrap_or(stored);

    // per (publisher, topic): lost (gaps below the highest), duplicated,
    // out of order (in stream order)
    let mut streams: HashMap<(String, String), Vec<u64>> = HashMap::new();
    for x in &seen {
        streams
            .entry((x.publisher.clone(), x.topic.clone()))
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
    let mut to_stored: Vec<i64> = seen.iter().map(|x| x.stored_ms - x.sample_ms).collect();
    let mut to_consumer: Vec<i64> = seen.iter().map(|x| x.consumed_ms - x.sample_ms).collect();
    // per second of the run (by sample time)
    let first = seen.iter().map(|x| x.sample_ms).min().unwrap_or(0);
    let mut per_sec: std::collections::BTreeMap<i64, Vec<i64>> = Default::default();
    for x in &seen {
        per_sec
            .entry((x.sample_ms - first) / 1000)
            .or_default()
            .push(x.stored_ms - x.sample_ms);
    }
    let mut csv = String::from("second,stored,p50_ms,p99_ms,max_ms\n");
    for (sec, v) in &mut per_sec {
        csv.push_str(&format!(
            "{sec},{},{},{},{}\n",
            v.len(),
            pct(v, 0.5),
            pct(v, 0.99),
            pct(v, 1.0)
        ));
    }
    let csv_path = a.out.join("fleet.csv");
    std::fs::write(&csv_path, csv)?;
    // what each gateway enqueued and left unacknowledged at its stop (its
    // last log line of the bridges; kept in its queue's store for a next
    // start)
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
    for (when, what) in &events {
        println!("  {:>5.1} s  {what}", when.as_secs_f64());
    }
    println!(
        "offered {:.0} msg/s nominal; stored {stored} in the stream ({:.0} msg/s over the {run_s:.1} s run), consumed {}",
        k as f64 * s as f64 * a.rate,
        stored as f64 / run_s,
        seen.len()
    );
    // stored = enqueued - left when nothing is lost or stored twice
    let expected = enqueued.saturating_sub(left);
    if unknown == 0 {
        println!(
            "enqueued by the gateways {enqueued}, left unacknowledged in their queues at the stop \
             {left}: lost {}, stored twice {}",
            expected.saturating_sub(stored),
            stored.saturating_sub(expected)
        );
    } else {
        println!(
            "lost / stored twice UNKNOWN: {unknown} of {k} gateways did not stop within 10 s of \
             SIGTERM (overloaded?) and were killed; see their logs in {}",
            dir.display()
        );
    }
    println!(
        "the consumer read {} of the {stored} stored, over {} streams (gateway, sensor): \
         gaps {lost}, duplicates {dup}, out of order in the stream {ooo}",
        seen.len(),
        streams.len()
    );
    println!(
        "sample -> stored   p50 {} ms, p99 {} ms, max {} ms",
        pct(&mut to_stored, 0.5),
        pct(&mut to_stored, 0.99),
        pct(&mut to_stored, 1.0)
    );
    println!(
        "sample -> consumer p50 {} ms, p99 {} ms, max {} ms",
        pct(&mut to_consumer, 0.5),
        pct(&mut to_consumer, 0.99),
        pct(&mut to_consumer, 1.0)
    );
    println!("wrote {}", csv_path.display());
    Ok(std::process::ExitCode::SUCCESS)
}
