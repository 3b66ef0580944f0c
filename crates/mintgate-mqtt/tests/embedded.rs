//! End to end over the embedded broker (rumqttd): the publish queue, the
//! plain baselines and the reordering subscriber, MQTT 3.1.1 and 5.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::unreachable
)] // test code

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use mintgate_mqtt::broker::EmbeddedBroker;
use mintgate_mqtt::plain::publish_plain;
use mintgate_mqtt::{
    BrokerUrl, Publisher, PublisherConfig, Qos, SubEvent, Subscriber, SubscriberConfig,
};

fn broker() -> &'static EmbeddedBroker {
    static B: OnceLock<EmbeddedBroker> = OnceLock::new();
    B.get_or_init(|| EmbeddedBroker::start_loopback().expect("starting the embedded broker"))
}

fn topic(name: &str) -> String {
    format!("mintgate/test/{name}/{:08x}", rand_u32())
}

fn rand_u32() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(7)
}

/// Collects deliveries until `n` arrived or `limit` passed; returns the
/// delivered sequences of `publisher`.
fn collect(sub: &mut Subscriber, publisher: &str, n: usize, limit: Duration) -> Vec<u64> {
    let end = Instant::now() + limit;
    let mut got = Vec::new();
    while got.len() < n {
        let Some(left) = end.checked_duration_since(Instant::now()) else {
            break;
        };
        match sub.recv_timeout(left) {
            Some(SubEvent::Delivery(d)) if d.env.publisher == publisher => {
                assert_eq!(d.skipped_before, 0, "gap before {}", d.env.seq);
                got.push(d.env.seq);
            }
            Some(_) => {}
            None => break,
        }
    }
    got
}

fn run_queue(url: BrokerUrl, window: usize, n: u64) {
    let t = topic(&format!("w{window}"));
    let mut sub = Subscriber::start(SubscriberConfig::new(url.clone(), t.clone())).unwrap();
    assert!(sub.wait_subscribed(Duration::from_secs(10)), "no SUBACK");
    let mut cfg = PublisherConfig::new(url);
    cfg.window = window;
    let p = Publisher::start(cfg).unwrap();
    let bodies: Vec<String> = (1..=n).map(|i| format!("{i:04}")).collect();
    let seqs = p.enqueue_many(&t, bodies).unwrap();
    assert_eq!(seqs, 1..=n);
    assert!(
        p.wait_idle(Duration::from_secs(30)),
        "not all acked: {:?}",
        p.status()
    );
    let got = collect(
        &mut sub,
        p.publisher_id(),
        n as usize,
        Duration::from_secs(20),
    );
    assert_eq!(got, (1..=n).collect::<Vec<_>>());
    let st = p.close(Duration::from_secs(1));
    assert_eq!(st.queue.acked, n);
    assert_eq!(st.unacked, 0);
}

#[test]
fn queue_window_1_in_order_v311() {
    run_queue(broker().url(), 1, 200);
}

#[test]
fn queue_window_8_in_order_v311() {
    run_queue(broker().url(), 8, 300);
}

#[test]
fn queue_window_4_in_order_v5() {
    run_queue(broker().url_v5(), 4, 200);
}

#[test]
fn plain_qos2_and_qos1_reach_the_subscriber() {
    for (qos, inflight) in [(Qos::ExactlyOnce, 1u16), (Qos::AtLeastOnce, 100)] {
        let t = topic(&format!("plain{}", qos.level()));
        let mut sc = SubscriberConfig::new(broker().url(), t.clone());
        sc.qos = qos;
        let mut sub = Subscriber::start(sc).unwrap();
        assert!(sub.wait_subscribed(Duration::from_secs(10)));
        let bodies: Vec<String> = (1..=150).map(|i| format!("{i:04}")).collect();
        let r = publish_plain(
            &broker().url(),
            &t,
            qos,
            inflight,
            "plain-pub",
            &bodies,
            Duration::from_secs(30),
        )
        .unwrap();
        assert_eq!(r.acked, 150);
        let got = collect(&mut sub, "plain-pub", 150, Duration::from_secs(20));
        assert_eq!(got, (1..=150).collect::<Vec<_>>(), "QoS {}", qos.level());
    }
}

#[test]
fn enqueue_while_broker_unreachable_then_deliver() {
    // Nothing listens on this port: the queue accepts and waits.
    let port = mintgate_mqtt::broker::free_port([127, 0, 0, 1].into()).unwrap();
    let url: BrokerUrl = format!("mqtt://127.0.0.1:{port}").parse().unwrap();
    let p = Publisher::start(PublisherConfig::new(url)).unwrap();
    assert_eq!(p.enqueue("a/b", "x").unwrap(), 1);
    assert!(!p.wait_idle(Duration::from_millis(300)));
    let st = p.status();
    assert!(
        !st.connected && st.unacked == 1 && st.last_error.is_some(),
        "{st:?}"
    );
    assert!(p.enqueue("a/+", "x").is_err(), "wildcard topic accepted");
}

#[test]
fn one_topic_of_several_has_no_gaps_and_a_late_subscriber_starts_at_once() {
    // One publisher alternating between two topics, window 4. A subscriber
    // of one of them sees 1, 2, 3, ... with no gap (each topic has its own
    // sequence), and one that subscribes after 100 messages starts where
    // the stream is, without waiting for the numbers it missed.
    let base = topic("two");
    let (a, b) = (format!("{base}/a"), format!("{base}/b"));
    let mut sub_a = Subscriber::start(SubscriberConfig::new(broker().url(), a.clone())).unwrap();
    assert!(sub_a.wait_subscribed(Duration::from_secs(10)));
    let mut cfg = PublisherConfig::new(broker().url());
    cfg.window = 4;
    let p = Publisher::start(cfg).unwrap();
    for i in 1..=100u64 {
        assert_eq!(p.enqueue(&a, &format!("a{i}")).unwrap(), i);
        assert_eq!(p.enqueue(&b, &format!("b{i}")).unwrap(), i);
    }
    assert!(p.wait_idle(Duration::from_secs(30)));
    let t0 = Instant::now();
    let got = collect(&mut sub_a, p.publisher_id(), 100, Duration::from_secs(20));
    assert_eq!(got, (1..=100).collect::<Vec<_>>());
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert_eq!(p.next_seq(&a).unwrap(), 101);

    let mut late = Subscriber::start(SubscriberConfig::new(broker().url(), b.clone())).unwrap();
    assert!(late.wait_subscribed(Duration::from_secs(10)));
    let t0 = Instant::now();
    for i in 1..=20 {
        p.enqueue(&b, &format!("b{}", 100 + i)).unwrap();
    }
    let got = collect(&mut late, p.publisher_id(), 20, Duration::from_secs(20));
    assert_eq!(got, (101..=120).collect::<Vec<_>>());
    // The 10 s gap timeout was not waited for.
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    p.close(Duration::from_secs(1));
}

#[test]
fn concurrent_enqueues_share_durable_writes_and_stay_in_order() {
    // Four producers enqueue one message at a time into a persistent queue:
    // while one durable write runs, the next ones are staged and written
    // together. Each caller gets its own numbers; the receiver gets 1..=200
    // in order; the state is empty afterwards.
    let t = topic("group");
    let state = std::env::temp_dir().join(format!(
        "mintgate-mqtt-group-{}-{:08x}",
        std::process::id(),
        rand_u32()
    ));
    let mut sub = Subscriber::start(SubscriberConfig::new(broker().url(), t.clone())).unwrap();
    assert!(sub.wait_subscribed(Duration::from_secs(10)));
    let mut cfg = PublisherConfig::new(broker().url());
    cfg.window = 8;
    cfg.state = Some(state.clone());
    let p = std::sync::Arc::new(Publisher::start(cfg).unwrap());
    let handles: Vec<_> = (0..4)
        .map(|k| {
            let (p, t) = (p.clone(), t.clone());
            std::thread::spawn(move || {
                (0..50)
                    .map(|i| p.enqueue(&t, &format!("{k}-{i}")).unwrap())
                    .collect::<Vec<u64>>()
            })
        })
        .collect();
    let mut seqs: Vec<u64> = Vec::new();
    for h in handles {
        let mine = h.join().unwrap();
        assert!(mine.windows(2).all(|w| w[0] < w[1]), "{mine:?}");
        seqs.extend(mine);
    }
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=200).collect::<Vec<_>>());
    let got = collect(&mut sub, p.publisher_id(), 200, Duration::from_secs(20));
    assert_eq!(got, (1..=200).collect::<Vec<_>>());
    assert!(p.wait_idle(Duration::from_secs(10)));
    let p = std::sync::Arc::into_inner(p).unwrap();
    p.close(Duration::from_secs(1));
    let s = mintgate_mqtt::store::RedbStore::open(&state, None).unwrap();
    use mintgate_mqtt::store::Store as _;
    assert!(s.recovered().index.is_empty());
    assert_eq!(s.recovered().numbering.topic_next.get(&t), Some(&201));
    drop(s);
    let _ = std::fs::remove_dir_all(&state);
}

/// The broker's side of every accepted connection has TCP_NODELAY (rumqttd
/// does not set it; the embedded broker sets it on its listeners, whose
/// accepted sockets inherit it). Checked on the broker's own socket, found
/// among this process's descriptors by its two addresses.
#[cfg(target_os = "linux")]
#[test]
fn accepted_connections_have_nodelay() {
    use std::os::fd::BorrowedFd;
    for addr in [broker().addr(), broker().addr_v5()] {
        let client = std::net::TcpStream::connect(addr).unwrap();
        let me = client.local_addr().unwrap();
        let end = Instant::now() + Duration::from_secs(10);
        let nodelay = loop {
            let mut found = None;
            for entry in std::fs::read_dir("/proc/self/fd").unwrap() {
                let Ok(fd) = entry.unwrap().file_name().to_string_lossy().parse::<i32>() else {
                    continue;
                };
                // SAFETY: an open descriptor of this process, borrowed only
                // for these read-only socket queries.
                let bfd = unsafe { BorrowedFd::borrow_raw(fd) };
                let s = socket2::SockRef::from(&bfd);
                let local = s.local_addr().ok().and_then(|a| a.as_socket());
                let peer = s.peer_addr().ok().and_then(|a| a.as_socket());
                if local == Some(addr) && peer == Some(me) {
                    found = Some(s.tcp_nodelay().unwrap());
                }
            }
            if let Some(n) = found {
                break n;
            }
            assert!(Instant::now() < end, "the broker never accepted {me}");
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(
            nodelay,
            "the broker's socket for {me} on {addr} has Nagle on"
        );
    }
}

/// The two listeners get different free ports, one address for both is
/// refused, and a port another program holds is an error, not a broker
/// whose MQTT 5 clients reach someone else.
#[cfg(target_os = "linux")]
#[test]
fn listeners_are_distinct_and_a_taken_port_is_an_error() {
    use std::io::BufRead as _;
    use std::net::SocketAddr;
    let b = broker();
    assert_ne!(b.addr(), b.addr_v5());
    let same: SocketAddr = (
        [127, 0, 0, 1],
        mintgate_mqtt::broker::free_port([127, 0, 0, 1].into()).unwrap(),
    )
        .into();
    let Err(e) = EmbeddedBroker::start(same, same) else {
        panic!("one address for both was accepted");
    };
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");

    // Another process listens on a port; the broker is told to use it.
    let mut holder = std::process::Command::new("python3")
        .args([
            "-c",
            "import socket,time\n\
             s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(16)\n\
             print(s.getsockname()[1], flush=True); time.sleep(60)",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    std::io::BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let taken: SocketAddr = ([127, 0, 0, 1], line.trim().parse().unwrap()).into();
    let r = EmbeddedBroker::start(([127, 0, 0, 1], 0).into(), taken);
    let _ = holder.kill();
    let _ = holder.wait();
    let Err(e) = r else {
        panic!("a port another program holds was accepted");
    };
    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");

    // An address that is not this machine's (TEST-NET-1, RFC 5737): an
    // error at once with its cause, found by binding (nothing is sent).
    let t0 = std::time::Instant::now();
    let Err(e) = EmbeddedBroker::start(([127, 0, 0, 1], 0).into(), ([192, 0, 2, 1], 1883).into())
    else {
        panic!("an address of no interface here was accepted");
    };
    assert_eq!(e.kind(), std::io::ErrorKind::AddrNotAvailable, "{e}");
    assert!(e.to_string().contains("192.0.2.1:1883"), "{e}");
    assert!(t0.elapsed() < std::time::Duration::from_secs(2));
}

/// Group commit across topics: enqueues submitted before any is waited for
/// share durable writes (the bridge's many sensors, each on its topic, cost
/// a commit per batch, not per message); enqueued one by one, waiting each
/// time, every one is a write of its own. Each topic's seqs are its own.
#[test]
fn submissions_before_waiting_share_durable_writes() {
    let dir = std::env::temp_dir().join(format!("mintgate-group-commit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut cfg = PublisherConfig::new(broker().url());
    cfg.state = Some(dir.clone());
    let p = Publisher::start(cfg).unwrap();
    let base = topic("group");
    let topics: Vec<String> = (0..50).map(|i| format!("{base}/s{i}")).collect();
    let before = p.status().durable_writes;
    let submitted: Vec<_> = topics
        .iter()
        .map(|t| {
            p.submit_many_with(t, Default::default(), vec!["v".into()])
                .unwrap()
        })
        .collect();
    for s in submitted {
        assert_eq!(s.wait().unwrap(), 1..=1, "each topic starts at 1");
    }
    let grouped = p.status().durable_writes - before;
    let before = p.status().durable_writes;
    for t in &topics {
        assert_eq!(p.enqueue(t, "w").unwrap(), 2);
    }
    let one_by_one = p.status().durable_writes - before;
    assert_eq!(one_by_one, 50, "one write per waited enqueue");
    // the first submission may start a write alone; the rest wait for it
    // and go together (a loaded machine may split them once or twice more)
    assert!(grouped <= 5, "{grouped} writes for 50 submissions");
    assert!(p.wait_idle(Duration::from_secs(30)), "{:?}", p.status());
    let st = p.close(Duration::from_secs(1));
    assert_eq!(st.queue.acked, 100);
    let _ = std::fs::remove_dir_all(&dir);
}
