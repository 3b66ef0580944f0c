//! `mintgate lab mqtt --outage D`: the bounded publish queue through a
//! broker outage (`[mqtt.queue]`, `docs/mqtt.md`).
//!
//! A publisher (the gateway's publish queue: window 16, a persistent store,
//! `max_messages`, drop-oldest) enqueues at `rate` messages/s on one topic
//! of a private mosquitto; a persistent-session subscriber reorders what
//! arrives. After `before`, the lab stops mosquitto for `outage` and
//! starts it again; after `after` more it stops enqueueing and waits until
//! everything left is acknowledged and delivered. Every second it samples
//! this process's VmRSS, the queue's depth and its drop count
//! (`outage.csv`).
//!
//! Its verdict (the target: 10 minutes at 100 messages/s with
//! `max_messages` 10,000):
//! - the count is exact: arrived + dropped = enqueued;
//! - what arrived is in order, and the newest `max_messages` of the outage
//!   are all among it (the unbroken run of seqs ending at the last is at
//!   least that long);
//! - memory stays flat: once the queue has been full for 30 s, VmRSS never
//!   rises more than 1 MiB above what it was at that moment.
//!
//! The subscriber cannot tell the seqs the queue dropped from seqs lost on
//! the way, so it holds what comes after a gap in its reorder buffer for up
//! to [`GAP_TIMEOUT`] before it gives the gap up; the lab prints how many it
//! held, and "in order" is what the subscriber delivered. A second
//! subscriber no one here wrote, `mosquitto_sub` with a persistent session
//! of its own, witnesses what the broker delivered.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use mintgate_mqtt::broker::{find_mosquitto, Mosquitto};
use mintgate_mqtt::queue::{Limits, WhenFull};
use mintgate_mqtt::{Publisher, PublisherConfig, SubEvent, Subscriber, SubscriberConfig};

use crate::{LabOptions, Summary};

/// How RSS may grow once settled, bytes.
const FLAT_SLACK: u64 = 1 << 20;

/// How long the subscriber waits for a missing seq before giving it up:
/// longer than a returning broker takes to hand a persistent session what
/// it queued, short enough that a message really lost shows within the
/// lab's final wait.
const GAP_TIMEOUT: Duration = Duration::from_secs(5);

/// The outage case's settings.
#[derive(Clone)]
pub struct OutageOptions {
    /// Output folder, progress sink.
    pub common: LabOptions,
    /// Messages per second.
    pub rate: u64,
    /// Publishing before the broker stops.
    pub before: Duration,
    /// How long the broker is away.
    pub outage: Duration,
    /// Publishing after it returns.
    pub after: Duration,
    /// `max_messages` of the queue (drop-oldest).
    pub max_messages: u64,
}

impl Default for OutageOptions {
    fn default() -> Self {
        OutageOptions {
            common: LabOptions::default(),
            rate: 100,
            before: Duration::from_secs(5),
            outage: Duration::from_secs(600),
            after: Duration::from_secs(5),
            max_messages: 10_000,
        }
    }
}

/// One second of the run.
struct Sample {
    t: f64,
    phase: &'static str,
    rss: u64,
    unacked: usize,
    dropped: u64,
}

/// Runs the outage case; see the module docs.
pub fn lab_mqtt_outage(opts: &OutageOptions) -> anyhow::Result<Summary> {
    let o = &opts.common;
    let rate = opts.rate.clamp(1, 10_000);
    let max = opts.max_messages.clamp(17, 10_000_000);
    crate::create_out(&o.out)?;
    let bin = find_mosquitto().context(
        "the outage case needs mosquitto (apt-get install mosquitto), which it stops and starts",
    )?;
    let work = std::env::temp_dir().join(format!("mintgate-lab-outage-{}", std::process::id()));
    let mut broker = Mosquitto::start(&bin, &work.join("broker"))
        .with_context(|| format!("starting {}", bin.display()))?;
    let topic = "lab/outage";
    let mut sc = SubscriberConfig::new(broker.url(), topic);
    sc.persistent_session = true;
    sc.client_id = Some(format!("mg-outage-sub-{}", std::process::id()));
    sc.reorder.first_seq = Some(1);
    sc.reorder.gap_timeout = Some(GAP_TIMEOUT);
    sc.reorder.max_buffer = 100_000;
    let mut sub = Subscriber::start(sc)?;
    // A second subscriber no one here wrote, as a witness of what the
    // broker delivers: mosquitto_sub with a persistent session of its own.
    let witness_out = work.join("witness.out");
    let mut witness = witness_start(broker.port(), topic, &witness_out);
    anyhow::ensure!(
        sub.wait_subscribed(Duration::from_secs(10)),
        "the subscriber got no SUBACK from mosquitto"
    );
    let mut pc = PublisherConfig::new(broker.url());
    pc.window = 16;
    pc.state = Some(work.join("queue"));
    pc.limits = Limits {
        max_messages: max,
        max_bytes: 1 << 30,
        when_full: WhenFull::DropOldest,
    };
    let p = Publisher::start(pc)?;
    let period = Duration::from_nanos(1_000_000_000 / rate);
    let span = opts.before + opts.outage + opts.after;
    let total = (span.as_secs_f64() * rate as f64) as u64;
    (o.progress)(&format!(
        "lab mqtt --outage: {rate} msg/s for {:.0} s, mosquitto away from {:.0} s for {:.0} s, \
         max_messages {max} drop-oldest",
        span.as_secs_f64(),
        opts.before.as_secs_f64(),
        opts.outage.as_secs_f64()
    ));
    let t0 = Instant::now();
    let (mut stopped, mut restarted) = (false, false);
    let mut got: Vec<u64> = Vec::new();
    let mut gaps = 0u64;
    let mut samples: Vec<Sample> = Vec::new();
    let mut next_sample = t0;
    let mut take = |d: mintgate_mqtt::reorder::Delivery, got: &mut Vec<u64>| {
        gaps += d.skipped_before;
        got.push(d.env.seq);
    };
    for i in 0..total {
        let due = t0 + period.mul_f64(i as f64);
        while Instant::now() < due {
            if let Some(SubEvent::Delivery(d)) =
                sub.recv_timeout(due.saturating_duration_since(Instant::now()))
            {
                take(d, &mut got);
            }
        }
        let el = t0.elapsed();
        if !stopped && el >= opts.before {
            broker.stop();
            stopped = true;
            (o.progress)(&format!("{:>7.1} s: mosquitto stopped", el.as_secs_f64()));
        }
        if stopped && !restarted && el >= opts.before + opts.outage {
            broker.restart().context("starting mosquitto again")?;
            restarted = true;
            let st = p.status();
            (o.progress)(&format!(
                "{:>7.1} s: mosquitto started again; queue {} unacked, {} dropped",
                el.as_secs_f64(),
                st.unacked,
                st.queue.dropped_full
            ));
        }
        if Instant::now() >= next_sample {
            next_sample += Duration::from_secs(1);
            let st = p.status();
            samples.push(Sample {
                t: el.as_secs_f64(),
                phase: match (stopped, restarted) {
                    (false, _) => "before",
                    (true, false) => "outage",
                    (true, true) => "after",
                },
                rss: crate::footprint::proc_mem(std::process::id())
                    .map(|m| m.rss)
                    .unwrap_or(0),
                unacked: st.unacked,
                dropped: st.queue.dropped_full,
            });
            if samples.len().is_multiple_of(60) {
                (o.progress)(&format!(
                    "{:>7.1} s: {} unacked, {} dropped, VmRSS {:.1} MiB",
                    el.as_secs_f64(),
                    st.unacked,
                    st.queue.dropped_full,
                    samples.last().map_or(0.0, |s| s.rss as f64 / 1048576.0)
                ));
            }
        }
        p.enqueue(topic, &format!("{i:08}"))
            .context("enqueueing (drop-oldest never refuses at this rate)")?;
    }
    let idle = p.wait_idle(Duration::from_secs(120));
    let st = p.status();
    let end = Instant::now() + GAP_TIMEOUT + Duration::from_secs(30);
    while (got.len() as u64) < st.queue.acked && Instant::now() < end {
        if let Some(SubEvent::Delivery(d)) = sub.recv_timeout(Duration::from_secs(1)) {
            take(d, &mut got);
        }
    }
    let rs = sub.stats();
    let witnessed = witness.as_mut().map(|w| {
        let _ = w.kill();
        let _ = w.wait();
        witness_seqs(&witness_out)
    });
    drop(p);
    drop(sub);
    drop(broker);
    let _ = std::fs::remove_dir_all(&work);

    let dropped = st.queue.dropped_full;
    let missing = missing_ranges(&got, total);
    let witness_line = match &witnessed {
        Some(w) => {
            let mut uniq = w.clone();
            uniq.sort_unstable();
            uniq.dedup();
            format!(
                "mosquitto_sub (persistent session, a witness) received {} ({} distinct); never: {}",
                w.len(),
                uniq.len(),
                missing_ranges(&uniq, total)
            )
        }
        None => "mosquitto_sub not found (apt-get install mosquitto-clients): no witness".into(),
    };
    let in_order = got.windows(2).all(|w| w[0] < w[1]);
    let tail = got
        .iter()
        .rev()
        .zip((1..=total).rev())
        .take_while(|(g, want)| *g == want)
        .count() as u64;
    let exact = got.len() as u64 + dropped == total;
    // flat: from 30 s after the queue first held max_messages, to the end
    // of the outage
    let full_at = samples
        .iter()
        .find(|s| s.phase == "outage" && s.unacked as u64 >= max)
        .map(|s| s.t);
    let settled: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.phase == "outage" && full_at.is_some_and(|f| s.t >= f + 30.0))
        .collect();
    let (rss_settle, rss_peak) = (
        settled.first().map_or(0, |s| s.rss),
        settled.iter().map(|s| s.rss).max().unwrap_or(0),
    );
    let flat = !settled.is_empty() && rss_peak <= rss_settle + FLAT_SLACK;

    let csv = o.out.join("outage.csv");
    let mut text = String::from("t_s,phase,rss_bytes,unacked,dropped\n");
    for s in &samples {
        text.push_str(&format!(
            "{:.1},{},{},{},{}\n",
            s.t, s.phase, s.rss, s.unacked, s.dropped
        ));
    }
    crate::write_file(&csv, &text)?;
    let mib = |b: u64| b as f64 / 1048576.0;
    let yes = |b: bool| if b { "yes" } else { "NO" };
    let (received, reordered, late) = (rs.received, rs.reordered, rs.duplicates);
    let table = format!(
        "MQTT publish queue through a broker outage: {rate} msg/s, mosquitto away {:.0} s, \
         max_messages {max}, drop-oldest, window 16\n\
         enqueued {total}, acknowledged {}, arrived {} (in order: {}), dropped {dropped}, \
         gaps the subscriber saw {gaps}{}\n\
         the subscriber received {received} (held out of order {reordered}, dropped as duplicates or late {late})\n\
         seqs that never arrived (dropped by the queue, or lost): {missing}\n\
         {witness_line}\n\
         arrived + dropped = enqueued: {}\n\
         the newest {tail} arrived in order with no gap (at least max_messages: {})\n\
         VmRSS: {:.1} MiB 30 s after the queue filled, peak {:.1} MiB after that \
         (flat within 1 MiB: {}); peak of the run {:.1} MiB\n",
        opts.outage.as_secs_f64(),
        st.queue.acked,
        got.len(),
        yes(in_order),
        if idle {
            ""
        } else {
            " (NOT all acknowledged within 120 s)"
        },
        yes(exact),
        yes(tail >= max),
        mib(rss_settle),
        mib(rss_peak),
        if settled.is_empty() {
            "not measured: the queue was never full for 30 s of the outage"
        } else {
            yes(flat)
        },
        mib(samples.iter().map(|s| s.rss).max().unwrap_or(0)),
    );
    Ok(Summary {
        lab: "mqtt-outage",
        table,
        files: vec![PathBuf::from(&csv)],
        target_met: Some(idle && in_order && exact && tail >= max && flat),
    })
}

/// Starts `mosquitto_sub` on `topic` at 127.0.0.1:`port`, QoS 1, with a
/// persistent session, writing what it receives to `out`; `None` when it is
/// not installed.
fn witness_start(port: u16, topic: &str, out: &std::path::Path) -> Option<std::process::Child> {
    let file = std::fs::File::create(out).ok()?;
    std::process::Command::new("mosquitto_sub")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-t",
            topic,
            "-q",
            "1",
            "-c",
        ])
        .args(["-i", &format!("mg-outage-witness-{}", std::process::id())])
        .stdout(file)
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()
}

/// The seqs of the envelopes `mosquitto_sub` wrote, in arrival order.
fn witness_seqs(out: &std::path::Path) -> Vec<u64> {
    std::fs::read_to_string(out)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| mintgate_mqtt::payload::decode(l.as_bytes()).ok())
        .map(|e| e.seq)
        .collect()
}

/// The seqs in 1..=total missing from `got` (sorted), as ranges: `a-b, c`,
/// at most eight of them, then how many more.
fn missing_ranges(got: &[u64], total: u64) -> String {
    let mut have: Vec<u64> = got.to_vec();
    have.sort_unstable();
    have.dedup();
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    let mut next = 1u64;
    for &g in have.iter().chain(std::iter::once(&(total + 1))) {
        if g > next {
            ranges.push((next, g - 1));
        }
        next = next.max(g + 1);
    }
    if ranges.is_empty() {
        return "none".into();
    }
    let mut out: Vec<String> = ranges
        .iter()
        .take(8)
        .map(|&(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect();
    if ranges.len() > 8 {
        out.push(format!("and {} more ranges", ranges.len() - 8));
    }
    out.join(", ")
}

#[cfg(test)]
mod tests {
    use super::missing_ranges;

    #[test]
    fn missing_ranges_are_said_compactly() {
        assert_eq!(missing_ranges(&[1, 2, 3], 3), "none");
        assert_eq!(missing_ranges(&[2, 5, 3], 7), "1, 4, 6-7");
        assert_eq!(missing_ranges(&[], 2), "1-2");
        let every_other: Vec<u64> = (1..=40).filter(|n| n % 2 == 0).collect();
        assert!(missing_ranges(&every_other, 40).ends_with("and 12 more ranges"));
    }
}
