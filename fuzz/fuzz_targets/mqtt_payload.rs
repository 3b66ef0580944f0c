//! MQTT message payloads as the subscriber and the bridge decode them:
//! the publish-queue envelope (`mintgate_mqtt::decode`), bridge command
//! payloads (`mintgate_gateway::bridge::parse_command`), and a stream of
//! envelopes through the subscriber's reorder buffer (`Reorder`).
//!
//! Checked: an accepted envelope has seq >= 1 and a publisher id within
//! bounds and round-trips through `encode`; a command is finite; the
//! reorder buffer delivers each (publisher, topic) stream's sequence numbers strictly
//! increasing, never a duplicate, holds no more than its bound, and its
//! counters agree with what came out.
#![no_main]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use libfuzzer_sys::arbitrary::{Result as UResult, Unstructured};
use libfuzzer_sys::fuzz_target;
use mintgate_gateway::bridge::parse_command;
use mintgate_mqtt::payload::MAX_PUBLISHER_LEN;
use mintgate_mqtt::reorder::Push;
use mintgate_mqtt::{decode, Envelope, Reorder, ReorderConfig};

const MAX_BUFFER: usize = 4;
const MAX_PUBLISHERS: usize = 2;

fn check_payload(data: &[u8]) -> Option<Envelope> {
    if let Ok(v) = parse_command(data) {
        assert!(v.is_finite(), "command value {v}");
    }
    let env = decode(data).ok()?;
    assert!(env.seq >= 1);
    assert!((1..=MAX_PUBLISHER_LEN).contains(&env.publisher.len()));
    assert_eq!(decode(&env.encode()).as_ref(), Ok(&env));
    Some(env)
}

fn reorder(u: &mut Unstructured<'_>, first: Option<Envelope>) -> UResult<()> {
    let cfg = ReorderConfig {
        first_seq: if u.arbitrary()? { Some(1) } else { None },
        join_wait: Duration::from_millis(20),
        gap_timeout: if u.arbitrary()? {
            Some(Duration::from_millis(50))
        } else {
            None
        },
        max_buffer: MAX_BUFFER,
        max_publishers: MAX_PUBLISHERS,
    };
    let mut r = Reorder::new(cfg);
    let t0 = Instant::now();
    let mut now = t0;
    let mut last: HashMap<(String, String), u64> = HashMap::new();
    let mut delivered = 0u64;
    let mut envs: Vec<Envelope> = first.into_iter().collect();
    for _ in 0..u.int_in_range(0..=40)? {
        envs.push(Envelope {
            publisher: (*u.choose(&["a", "b", "c"])?).to_string(),
            seq: u.int_in_range(1..=12)?,
            ts: 0,
            msg: String::new(),
        });
    }
    for env in envs {
        now += Duration::from_millis(u.int_in_range(0..=30)?);
        let held = r.held();
        let topic = *u.choose(&["t/1", "t/2"])?;
        let push = r.push(topic, env, now);
        if push == Push::Duplicate || push == Push::Rejected {
            assert_eq!(r.held(), held, "a dropped envelope changed the buffer");
        }
        r.poll_timeout(now);
        if let Some(t) = r.next_timeout() {
            assert!(
                t <= now + Duration::from_millis(50),
                "a gap timer past its timeout"
            );
        }
        while let Some(d) = r.poll_deliver() {
            delivered += 1;
            let stream = (d.env.publisher.clone(), d.topic.clone());
            let prev = last.insert(stream, d.env.seq);
            if let Some(p) = prev {
                assert!(
                    d.env.seq > p,
                    "{} delivered {} after {p}",
                    d.env.publisher,
                    d.env.seq
                );
                assert_eq!(d.skipped_before, d.env.seq - p - 1, "skipped count");
            }
        }
        assert!(r.held() <= MAX_BUFFER * MAX_PUBLISHERS, "held {}", r.held());
    }
    let s = r.stats();
    assert_eq!(s.delivered, delivered);
    assert!(s.delivered + s.duplicates + s.rejected <= s.received);
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    // A length byte, that many bytes of payload, then the stream's script.
    let (n, rest) = match data.split_first() {
        Some((&n, rest)) => ((n as usize).min(rest.len()), rest),
        None => return,
    };
    let (payload, script) = rest.split_at(n);
    let first = check_payload(payload);
    let _ = reorder(&mut Unstructured::new(script), first);
});
