//! The Network Receiver and the handler threads run as SCHED_BATCH above
//! `batch_sched_above` datagrams per second, and at the normal policy again
//! when load falls. Its own test binary, so that the only `nr-*` and `htp-*`
//! threads in the process are this gateway's.

use std::net::UdpSocket;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use mintgate_coap::wire::{Code, MessageType, MessageWriter, OptionNumber};
use mintgate_gateway::config::PoolMode;
use mintgate_gateway::{resources, Config, Gateway};

/// Scheduling policy of every thread of this process named `nr-*` or
/// `htp-*`, from field 41 of /proc/self/task/TID/stat.
fn pipeline_policies() -> Vec<i32> {
    let mut out = Vec::new();
    for t in std::fs::read_dir("/proc/self/task").unwrap() {
        let dir = t.unwrap().path();
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
            continue;
        };
        if !comm.starts_with("nr-") && !comm.starts_with("htp-") {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap();
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        out.push(rest.split(' ').nth(41 - 3).unwrap().parse().unwrap());
    }
    out
}

fn get(mid: u16) -> Vec<u8> {
    let mut b = vec![0u8; 64];
    let mut w = MessageWriter::new(&mut b, MessageType::Non, Code::GET, mid, &[1]).unwrap();
    w.path_options(OptionNumber::URI_PATH, "request").unwrap();
    let n = w.finish();
    b.truncate(n);
    b
}

#[test]
fn receiver_switches_to_batch_under_load_and_back_when_it_falls() {
    let mut c = Config::default();
    c.coap.bind = vec!["127.0.0.1:0".parse().unwrap()];
    c.pipeline.pool = PoolMode::Fixed(1);
    c.pipeline.batch_sched_above = 2_000;
    let gw = Gateway::start(c, resources::default_router()).unwrap();
    let counters = gw.counters().clone();
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.connect(gw.local_addrs()[0]).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    // a thread names itself once it runs: one receiver, one handler
    let end = Instant::now() + Duration::from_secs(2);
    while pipeline_policies().len() < 2 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(pipeline_policies(), vec![libc::SCHED_OTHER; 2]);

    // about 10,000 requests/s in bursts of 20 every 2 ms, for at most 3 s
    // or until the receiver has switched and stayed so for 300 ms
    let mut buf = [0u8; 256];
    let mut mid = 0u16;
    let end = Instant::now() + Duration::from_secs(3);
    let mut since: Option<Instant> = None;
    while Instant::now() < end {
        for _ in 0..20 {
            mid = mid.wrapping_add(1);
            s.send(&get(mid)).unwrap();
        }
        for _ in 0..20 {
            if s.recv(&mut buf).is_err() {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(2));
        if counters.pipeline_batch_threads.load(Relaxed) == 2 {
            let t = *since.get_or_insert_with(Instant::now);
            if t.elapsed() > Duration::from_millis(300) {
                break;
            }
        }
    }
    assert_eq!(
        counters.pipeline_batch_threads.load(Relaxed),
        2,
        "switched on"
    );
    assert_eq!(pipeline_policies(), vec![libc::SCHED_BATCH; 2]);
    assert!(counters.pipeline_batch_switches.load(Relaxed) >= 2);

    // quiet: back within a couple of 100 ms windows (both threads wake at
    // least every 100 ms to look)
    let end = Instant::now() + Duration::from_secs(2);
    while counters.pipeline_batch_threads.load(Relaxed) != 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        counters.pipeline_batch_threads.load(Relaxed),
        0,
        "switched off"
    );
    assert_eq!(pipeline_policies(), vec![libc::SCHED_OTHER; 2]);
    // the exposition carries both
    let text = mintgate_gateway::metrics::render_prometheus(&gw.handle());
    assert!(text.contains("mintgate_pipeline_batch_threads 0"), "{text}");
    assert!(
        text.contains("mintgate_pipeline_batch_switches_total"),
        "{text}"
    );
    drop(gw);
}
