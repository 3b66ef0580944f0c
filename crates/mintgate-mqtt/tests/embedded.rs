//! End to end over the embedded broker (rumqttd): the publish queue, the
//! plain baselines and the reordering subscriber, MQTT 3.1.1 and 5.

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
