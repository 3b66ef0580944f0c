//! The bounded queue through a broker outage (issue 23's target, scaled by
//! its arguments): a publisher enqueues at RATE messages/s to a mosquitto
//! that this program stops for OUTAGE seconds and starts again; the queue
//! is bounded at MAX messages with drop-oldest. Prints the process's
//! resident memory during the outage, the dropped count, and checks that
//! what arrives is in order, the newest MAX of the outage among them, and
//! that arrived + dropped = enqueued exactly.
//!
//! `cargo run --release -p mintgate-mqtt --example outage -- RATE BEFORE OUTAGE AFTER MAX`
//! (defaults 100 5 40 5 1000; the case is 100 5 600 5 10000).

use std::time::{Duration, Instant};

use mintgate_mqtt::broker::{find_mosquitto, Mosquitto};
use mintgate_mqtt::queue::{Limits, WhenFull};
use mintgate_mqtt::{Publisher, PublisherConfig, SubEvent, Subscriber, SubscriberConfig};

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn main() {
    let a: Vec<u64> = std::env::args()
        .skip(1)
        .map(|s| s.parse().expect("numbers: RATE BEFORE OUTAGE AFTER MAX"))
        .collect();
    let arg = |i: usize, d: u64| a.get(i).copied().unwrap_or(d);
    let (rate, before, outage, after, max) = (
        arg(0, 100).clamp(1, 10_000),
        arg(1, 5).min(3600),
        arg(2, 40).min(3600),
        arg(3, 5).min(3600),
        arg(4, 1000).max(17),
    );
    let bin = find_mosquitto().expect("mosquitto is needed");
    let dir = std::env::temp_dir().join(format!("mintgate-outage-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut broker = Mosquitto::start(&bin, &dir.join("broker")).expect("mosquitto");
    let topic = "outage/t";
    let mut sc = SubscriberConfig::new(broker.url(), topic);
    sc.persistent_session = true;
    sc.client_id = Some(format!("outage-sub-{}", std::process::id()));
    sc.reorder.first_seq = Some(1);
    sc.reorder.gap_timeout = Some(Duration::from_millis(500));
    sc.reorder.max_buffer = 100_000;
    let mut sub = Subscriber::start(sc).expect("subscriber");
    assert!(sub.wait_subscribed(Duration::from_secs(10)));
    let mut pc = PublisherConfig::new(broker.url());
    pc.window = 16;
    pc.state = Some(dir.join("queue"));
    pc.limits = Limits {
        max_messages: max,
        max_bytes: 1 << 30,
        when_full: WhenFull::DropOldest,
    };
    let p = Publisher::start(pc).expect("publisher");
    let period = Duration::from_nanos(1_000_000_000 / rate);
    let t0 = Instant::now();
    let total = rate * (before + outage + after);
    let (mut rss_min, mut rss_max, mut last_sample) = (u64::MAX, 0u64, Instant::now());
    let mut stopped = false;
    let mut restarted = false;
    let mut got: Vec<u64> = Vec::new();
    let mut skipped = 0u64;
    for i in 0..total {
        let due = t0 + period * i as u32;
        while Instant::now() < due {
            if let Some(SubEvent::Delivery(d)) =
                sub.recv_timeout(due.saturating_duration_since(Instant::now()))
            {
                skipped += d.skipped_before;
                got.push(d.env.seq);
            }
        }
        let s = t0.elapsed().as_secs();
        if !stopped && s >= before {
            broker.stop();
            stopped = true;
            println!("{:>6.1} s: broker stopped", t0.elapsed().as_secs_f64());
        }
        if stopped && !restarted && s >= before + outage {
            broker.restart().expect("mosquitto again");
            restarted = true;
            println!(
                "{:>6.1} s: broker started again; queue {} unacked, {} dropped",
                t0.elapsed().as_secs_f64(),
                p.status().unacked,
                p.status().queue.dropped_full
            );
        }
        if stopped && !restarted && last_sample.elapsed() >= Duration::from_secs(1) {
            last_sample = Instant::now();
            let r = rss_kib();
            rss_min = rss_min.min(r);
            rss_max = rss_max.max(r);
        }
        p.enqueue(topic, &format!("{i:08}")).expect("enqueue");
    }
    assert!(p.wait_idle(Duration::from_secs(120)), "{:?}", p.status());
    let end = Instant::now() + Duration::from_secs(30);
    let st = p.status();
    let delivered_want = st.queue.acked;
    while (got.len() as u64) < delivered_want && Instant::now() < end {
        if let Some(SubEvent::Delivery(d)) = sub.recv_timeout(Duration::from_secs(1)) {
            skipped += d.skipped_before;
            got.push(d.env.seq);
        }
    }
    let in_order = got.windows(2).all(|w| w[0] < w[1]);
    let dropped = st.queue.dropped_full;
    // The unbroken run of seqs ending at the last one: every message after
    // the last dropped one arrived.
    let tail = got
        .iter()
        .rev()
        .zip((1..=total).rev())
        .take_while(|(g, want)| *g == want)
        .count() as u64;
    println!(
        "rate {rate}/s, outage {outage} s, max_messages {max} drop-oldest, window 16:\n\
         enqueued {total}, acked {}, arrived {} (in order: {in_order}), dropped {dropped} \
         (gaps the subscriber saw: {skipped}); arrived + dropped = enqueued: {}\n\
         the newest {tail} arrived in order with no gap (at least max_messages: {}), \
         the last dropped was seq {}\n\
         RSS during the outage: {} .. {} KiB",
        st.queue.acked,
        got.len(),
        got.len() as u64 + dropped == total,
        tail >= max,
        total - tail,
        rss_min,
        rss_max
    );
    drop(p);
    drop(broker);
    let _ = std::fs::remove_dir_all(&dir);
}
