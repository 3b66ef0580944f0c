//! A disk that fills while the publish queue runs: a 4 MiB tmpfs mounted in
//! a private mount namespace (the test runs itself again under `unshare
//! -m`, so nothing stays mounted whatever happens). Needs root and
//! unshare(1); skipped with a message otherwise (a failure when
//! MINTGATE_REQUIRE_PEERS is set), like the gateway's faults test.
//!
//! The queue fills the disk (a filler file takes the rest): enqueueing is
//! refused as "disk full", every refused message is counted, what was
//! accepted stays; when the filler goes, enqueueing resumes by itself; a
//! later start from the same store sends everything accepted, 1, 2, 3, ...
//! with no gap (refused messages took no number).

use std::io::Write as _;
use std::process::Command;
use std::time::{Duration, Instant};

use mintgate_mqtt::broker::EmbeddedBroker;
use mintgate_mqtt::publisher::{PublishError, Refusal};
use mintgate_mqtt::{
    BrokerUrl, Publisher, PublisherConfig, SubEvent, Subscriber, SubscriberConfig,
};

const INNER: &str = "MINTGATE_DISK_FULL_INNER";
const NAME: &str = "a_disk_that_fills_stops_enqueueing_until_space_returns";

fn can_mount() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let ok = root
        && Command::new("unshare")
            .args(["-m", "true"])
            .status()
            .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("MINTGATE_REQUIRE_PEERS").is_none(),
            "root and unshare(1) are required (MINTGATE_REQUIRE_PEERS is set)"
        );
        eprintln!("skipping: needs root and unshare(1) to mount a small tmpfs privately");
    }
    ok
}

#[test]
fn a_disk_that_fills_stops_enqueueing_until_space_returns() {
    if std::env::var_os(INNER).is_none() {
        if !can_mount() {
            return;
        }
        let st = Command::new("unshare")
            .args(["-m", "--propagation", "private"])
            .arg(std::env::current_exe().unwrap())
            .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
            .env(INNER, "1")
            .status()
            .unwrap();
        assert!(st.success(), "the test in its mount namespace failed");
        return;
    }
    let dir = std::env::temp_dir().join(format!("mintgate-diskfull-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"])
        .arg(&dir)
        .status()
        .unwrap();
    assert!(mounted.success());
    let state = dir.join("q");
    // No broker listens there while the disk fills: everything stays queued.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let url: BrokerUrl = format!("mqtt://127.0.0.1:{port}").parse().unwrap();
    let mut cfg = PublisherConfig::new(url);
    cfg.state = Some(state.clone());
    cfg.window = 4;
    cfg.publisher_id = Some("disk".into());
    let p = Publisher::start(cfg.clone()).unwrap();
    let body = "v".repeat(1000);
    let mut accepted = 0u64;
    for _ in 0..20 {
        accepted += p
            .enqueue_many("t/disk", vec![body.clone(); 8])
            .unwrap()
            .count() as u64;
    }
    // the filler takes what is left
    let filler = dir.join("filler");
    {
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![7u8; 16 << 10];
        while f.write_all(&chunk).is_ok() {}
    }
    let mut refused = 0u64;
    let t0 = Instant::now();
    let mut full_at = None;
    while t0.elapsed() < Duration::from_secs(30) {
        match p.enqueue_many("t/disk", vec![body.clone(); 8]) {
            Ok(r) => accepted += r.count() as u64,
            Err(PublishError::Refused {
                accepted: a,
                refused: r,
                why: Refusal::DiskFull,
            }) => {
                accepted += a;
                refused += r;
                full_at.get_or_insert(Instant::now());
            }
            Err(e) => panic!("unexpected: {e}"),
        }
        std::thread::sleep(Duration::from_millis(1));
        // refused for a while (writes tried again once a second)
        if full_at.is_some_and(|t| t.elapsed() > Duration::from_millis(2500)) {
            break;
        }
    }
    assert!(
        full_at.is_some(),
        "the disk never filled ({accepted} accepted)"
    );
    let st = p.status();
    println!("accepted {accepted}, refused {refused}, status {st:?}");
    assert!(st.store_full && !st.stopped, "{st:?}");
    assert_eq!(st.queue.refused_disk, refused, "every refusal counted");
    assert_eq!(st.unacked as u64, accepted, "what was accepted stays");
    // space returns: enqueueing resumes by itself
    std::fs::remove_file(&filler).unwrap();
    let t1 = Instant::now();
    let resumed = loop {
        match p.enqueue_many("t/disk", vec![body.clone(); 8]) {
            Ok(r) => {
                accepted += r.count() as u64;
                break true;
            }
            Err(PublishError::Refused { refused: r, .. }) => refused += r,
            Err(e) => panic!("unexpected: {e}"),
        }
        if t1.elapsed() > Duration::from_secs(10) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(resumed, "enqueueing did not resume after space returned");
    println!("resumed after {:?}", t1.elapsed());
    let st = p.close(Duration::ZERO);
    assert!(!st.store_full);
    assert_eq!(st.queue.refused_disk, refused);
    assert_eq!(st.unacked as u64, accepted);
    // a later start sends everything accepted, in order, without a gap
    let b = EmbeddedBroker::start(
        format!("127.0.0.1:{port}").parse().unwrap(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .unwrap();
    let mut sub = Subscriber::start(SubscriberConfig::new(b.url(), "t/disk")).unwrap();
    assert!(sub.wait_subscribed(Duration::from_secs(10)));
    let p = Publisher::start(cfg).unwrap();
    assert_eq!(p.status().resumed as u64, accepted);
    let mut got = Vec::new();
    let end = Instant::now() + Duration::from_secs(60);
    while (got.len() as u64) < accepted && Instant::now() < end {
        if let Some(SubEvent::Delivery(d)) = sub.recv_timeout(Duration::from_secs(1)) {
            assert_eq!(d.skipped_before, 0, "gap before {}", d.env.seq);
            got.push(d.env.seq);
        }
    }
    assert_eq!(got, (1..=accepted).collect::<Vec<_>>());
    assert!(p.wait_idle(Duration::from_secs(10)));
    drop(p);
    let _ = Command::new("umount").arg(&dir).status();
    let _ = std::fs::remove_dir_all(&dir);
}
