//! The Network Receiver and the handler threads run as SCHED_BATCH above
//! `batch_sched_above` datagrams per second, and at the normal policy again
//! when load falls. Its own test binary, and its tests take turns (`ONE`),
//! so that the only `nr-*` and `htp-*` threads in the process are those of
//! the test's gateway.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::unreachable
)] // test code

use std::net::UdpSocket;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use mintgate_coap::wire::{Code, MessageType, MessageWriter, OptionNumber};
use mintgate_gateway::config::PoolMode;
use mintgate_gateway::{resources, Config, Gateway};

static ONE: Mutex<()> = Mutex::new(());

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

/// A gateway with one handler thread and `batch_sched_above = above`, and
/// a client socket connected to it.
fn start(above: u64) -> (Gateway, UdpSocket) {
    let mut c = Config::default();
    c.coap.bind = vec!["127.0.0.1:0".parse().unwrap()];
    c.pipeline.pool = PoolMode::Fixed(1);
    c.pipeline.batch_sched_above = above;
    let gw = Gateway::start(c, resources::default_router()).unwrap();
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.connect(gw.local_addrs()[0]).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    (gw, s)
}

/// Sends about 10,000 NON GETs/s (bursts of 20 every 2 ms, reading the
/// answers) until `done` has held for 300 ms, for at most 5 s; returns
/// whether it held, and the pipeline threads' policies seen at that moment
/// (while the load was still on).
fn load_until(s: &UdpSocket, mid: &mut u16, done: impl Fn() -> bool) -> (bool, Vec<i32>) {
    let mut buf = [0u8; 256];
    let end = Instant::now() + Duration::from_secs(5);
    let mut since: Option<Instant> = None;
    while Instant::now() < end {
        for _ in 0..20 {
            *mid = mid.wrapping_add(1);
            s.send(&get(*mid)).unwrap();
        }
        for _ in 0..20 {
            if s.recv(&mut buf).is_err() {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(2));
        if !done() {
            since = None;
            continue;
        }
        let t = *since.get_or_insert_with(Instant::now);
        if t.elapsed() > Duration::from_millis(300) {
            return (true, pipeline_policies());
        }
    }
    (false, pipeline_policies())
}

#[test]
fn pipeline_threads_switch_to_batch_under_load_and_back_when_it_falls() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    if !matches!(
        mintgate_sched::priority::current_thread_priority(),
        mintgate_sched::priority::Applied::Nice(_)
    ) {
        // run under chrt or similar: the threads would be left alone
        eprintln!("skipped: the test does not run at SCHED_OTHER");
        return;
    }
    let (gw, s) = start(2_000);
    let counters = gw.counters().clone();
    let batch = || counters.pipeline_batch_threads.load(Relaxed);
    // a thread names itself once it runs: one receiver, one handler
    let end = Instant::now() + Duration::from_secs(2);
    while pipeline_policies().len() < 2 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(pipeline_policies(), vec![libc::SCHED_OTHER; 2]);
    let mut mid = 0u16;

    // under load both switch, and the kernel says so
    let (held, seen) = load_until(&s, &mut mid, || batch() == 2);
    assert!(held, "both threads in batch under load; gauge {}", batch());
    assert_eq!(seen, vec![libc::SCHED_BATCH; 2]);
    assert!(counters.pipeline_batch_switches.load(Relaxed) >= 2);

    // handlers added under load switch too; removed ones are uncounted
    gw.resize_htp(3).unwrap();
    let (held, seen) = load_until(&s, &mut mid, || batch() == 4);
    assert!(held, "four threads in batch; gauge {}", batch());
    assert_eq!(seen, vec![libc::SCHED_BATCH; 4]);
    gw.resize_htp(1).unwrap();
    let (held, seen) = load_until(&s, &mut mid, || batch() == 2);
    assert!(held, "back to two threads in batch; gauge {}", batch());
    assert_eq!(seen, vec![libc::SCHED_BATCH; 2]);

    // quiet: back within a couple of 100 ms windows (both threads wake at
    // least every 100 ms to look)
    let end = Instant::now() + Duration::from_secs(3);
    while batch() != 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(batch(), 0, "switched off");
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

#[test]
fn zero_keeps_every_thread_at_its_policy() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let (gw, s) = start(0);
    let counters = gw.counters().clone();
    let mut mid = 0u16;
    // 1 s of the same load: nothing may switch
    let start = Instant::now();
    let (held, _) = load_until(&s, &mut mid, || {
        start.elapsed() > Duration::from_millis(700)
    });
    assert!(held);
    assert_eq!(counters.pipeline_batch_switches.load(Relaxed), 0);
    assert!(pipeline_policies().iter().all(|&p| p != libc::SCHED_BATCH));
    drop(gw);
}
