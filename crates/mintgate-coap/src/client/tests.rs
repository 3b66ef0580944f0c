//! The client in virtual time: one `Instant::now()` per test, then only
//! added durations.

use std::sync::{Arc, Mutex};

use super::*;
use crate::rto::Basic;
use crate::wire::ContentFormat;

fn server() -> SocketAddr {
    "192.0.2.1:5683".parse().unwrap()
}

fn other_server() -> SocketAddr {
    "[2001:db8::1]:5683".parse().unwrap()
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// What the client called on its controller.
#[derive(Clone, Debug, PartialEq)]
enum Call {
    Initial { in_flight: usize },
    Response { rtt: Duration, retransmissions: u32 },
    GiveUp { retransmissions: u32 },
}

/// Basic, recording every call the client makes.
struct Recorder {
    inner: Basic,
    calls: Arc<Mutex<Vec<Call>>>,
}

impl RtoController for Recorder {
    fn initial_rto(&mut self, dest: SocketAddr, now: Instant, in_flight: usize) -> Duration {
        self.calls.lock().unwrap().push(Call::Initial { in_flight });
        self.inner.initial_rto(dest, now, in_flight)
    }
    fn backoff(&mut self, dest: SocketAddr, now: Instant, prev: Duration, n: u32) -> Duration {
        self.inner.backoff(dest, now, prev, n)
    }
    fn on_response(&mut self, dest: SocketAddr, now: Instant, rtt: Duration, n: u32) {
        self.calls.lock().unwrap().push(Call::Response {
            rtt,
            retransmissions: n,
        });
        self.inner.on_response(dest, now, rtt, n)
    }
    fn on_give_up(&mut self, dest: SocketAddr, now: Instant, n: u32) {
        self.calls
            .lock()
            .unwrap()
            .push(Call::GiveUp { retransmissions: n });
        self.inner.on_give_up(dest, now, n)
    }
    fn max_retransmit(&self, dest: SocketAddr) -> u32 {
        self.inner.max_retransmit(dest)
    }
    fn nstart(&self, dest: SocketAddr) -> usize {
        self.inner.nstart(dest)
    }
    fn name(&self) -> &'static str {
        "recorder"
    }
}

fn client_with(params: TransmissionParams, seed: u64) -> (Client, Arc<Mutex<Vec<Call>>>) {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let rto = Recorder {
        inner: Basic::new(params, seed),
        calls: calls.clone(),
    };
    let mut config = ClientConfig::new(params);
    config.non_timeout = secs(5.0);
    config.separate_timeout = secs(60.0);
    (Client::new(config, Box::new(rto), seed), calls)
}

fn client() -> (Client, Arc<Mutex<Vec<Call>>>) {
    client_with(TransmissionParams::default(), 1)
}

fn get(confirmable: bool, path: &str) -> Request {
    Request {
        confirmable,
        code: Code::GET,
        options: vec![(OptionNumber::URI_PATH, path.as_bytes().to_vec())],
        payload: Vec::new(),
    }
}

/// A sent message, decoded.
#[derive(Debug)]
struct Sent {
    dest: SocketAddr,
    ty: MessageType,
    code: Code,
    mid: u16,
    token: Vec<u8>,
    bytes: Vec<u8>,
}

fn sent(c: &mut Client, now: Instant) -> Vec<Sent> {
    let mut out = Vec::new();
    while let Some(t) = c.poll_transmit(now) {
        let p = Packet::new_checked(&t.bytes[..]).expect("client sent a malformed message");
        out.push(Sent {
            dest: t.dest,
            ty: p.msg_type(),
            code: p.code(),
            mid: p.message_id(),
            token: p.token().to_vec(),
            bytes: t.bytes.clone(),
        });
    }
    out
}

fn events(c: &mut Client) -> Vec<Event> {
    std::iter::from_fn(|| c.poll_event()).collect()
}

/// A response message from the server.
fn msg(ty: MessageType, code: Code, mid: u16, token: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; 256];
    let mut w = MessageWriter::new(&mut buf, ty, code, mid, token).unwrap();
    if !code.is_empty() {
        w.option_uint(
            OptionNumber::CONTENT_FORMAT,
            ContentFormat::TEXT_PLAIN.0 as u32,
        )
        .unwrap();
        w.payload(payload).unwrap();
    }
    let n = w.finish();
    buf.truncate(n);
    buf
}

fn empty(ty: MessageType, mid: u16) -> Vec<u8> {
    msg(ty, Code::EMPTY, mid, &[], &[])
}

#[test]
fn retransmission_schedule_doubles_then_gives_up_after_max_retransmit() {
    let t0 = Instant::now();
    let (mut c, calls) = client();
    let id = c.request(t0, server(), get(true, "a")).unwrap();
    let first = sent(&mut c, t0);
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].ty, MessageType::Con);
    let rto0 = c.poll_timeout().unwrap() - t0;
    assert!(rto0 >= secs(2.0) && rto0 <= secs(3.0), "initial {rto0:?}");

    let mut now = t0;
    let mut expected = rto0;
    for n in 1..=4u32 {
        let due = now + expected;
        assert_eq!(c.poll_timeout(), Some(due));
        // Nothing happens just before the deadline.
        c.handle_timeout(due - Duration::from_millis(1));
        assert!(sent(&mut c, due).is_empty());
        c.handle_timeout(due);
        let re = sent(&mut c, due);
        assert_eq!(re.len(), 1, "retransmission {n}");
        assert_eq!(re[0].bytes, first[0].bytes, "retransmitted byte for byte");
        assert!(events(&mut c).is_empty());
        now = due;
        expected *= 2;
    }
    // After the 4th retransmission the client waits 16 x the initial
    // timeout, then gives up: 31 x in all.
    let give_up = t0 + rto0 * 31;
    assert_eq!(c.poll_timeout(), Some(give_up));
    c.handle_timeout(give_up - Duration::from_millis(1));
    assert!(events(&mut c).is_empty());
    c.handle_timeout(give_up);
    assert!(sent(&mut c, give_up).is_empty());
    assert_eq!(events(&mut c), vec![Event::Timeout { id }]);
    assert_eq!(c.poll_timeout(), None);
    assert_eq!(c.live_exchanges(), 0);
    let s = c.stats();
    assert_eq!((s.transmissions, s.retransmissions, s.timeouts), (1, 4, 1));
    assert_eq!(
        *calls.lock().unwrap(),
        vec![
            Call::Initial { in_flight: 1 },
            Call::GiveUp { retransmissions: 4 }
        ]
    );
    // Within MAX_TRANSMIT_WAIT, as RFC 7252 4.8.2 promises.
    assert!(give_up - t0 <= TransmissionParams::default().max_transmit_wait());
}

#[test]
fn piggybacked_ack_stops_retransmissions() {
    let t0 = Instant::now();
    let (mut c, calls) = client();
    let id = c.request(t0, server(), get(true, "a")).unwrap();
    let req = sent(&mut c, t0).remove(0);
    let rto0 = c.poll_timeout().unwrap() - t0;
    c.handle_timeout(t0 + rto0);
    assert_eq!(sent(&mut c, t0 + rto0).len(), 1);

    let at = t0 + rto0 + secs(0.5);
    c.handle_datagram(
        at,
        server(),
        &msg(MessageType::Ack, Code::CONTENT, req.mid, &req.token, b"hi"),
    );
    match events(&mut c).as_slice() {
        [Event::Response {
            id: rid,
            code,
            msg_type,
            options,
            payload,
            rtt,
            retransmissions,
        }] => {
            assert_eq!(*rid, id);
            assert_eq!(*code, Code::CONTENT);
            assert_eq!(*msg_type, MessageType::Ack);
            assert_eq!(options, &vec![(OptionNumber::CONTENT_FORMAT, Bytes::new())]);
            assert_eq!(&payload[..], b"hi");
            assert_eq!(*rtt, rto0 + secs(0.5));
            assert_eq!(*retransmissions, 1);
        }
        e => panic!("unexpected events {e:?}"),
    }
    assert_eq!(c.poll_timeout(), None);
    c.handle_timeout(t0 + secs(200.0));
    assert!(sent(&mut c, t0 + secs(200.0)).is_empty());
    assert!(events(&mut c).is_empty());
    assert_eq!(
        calls.lock().unwrap()[1],
        Call::Response {
            rtt: rto0 + secs(0.5),
            retransmissions: 1
        }
    );
}

#[test]
fn a_shared_datagram_is_sliced_not_copied() {
    let t0 = Instant::now();
    let (mut c, _) = client();
    c.request(t0, server(), get(true, "a")).unwrap();
    let req = sent(&mut c, t0).remove(0);
    let d = Bytes::from(msg(
        MessageType::Ack,
        Code::CONTENT,
        req.mid,
        &req.token,
        b"shared",
    ));
    let range = d.as_ptr_range();
    c.handle_datagram_bytes(t0, server(), d.clone());
    match events(&mut c).as_slice() {
        [Event::Response {
            options, payload, ..
        }] => {
            assert_eq!(&payload[..], b"shared");
            assert!(range.contains(&payload.as_ptr()), "payload is a slice");
            assert_eq!(options.len(), 1);
        }
        e => panic!("unexpected events {e:?}"),
    }
    assert_eq!(c.stats().bytes_copied, 0);

    // the borrowed-slice entry point copies, and says so
    c.request(t0, server(), get(true, "b")).unwrap();
    let req = sent(&mut c, t0).remove(0);
    c.handle_datagram(
        t0,
        server(),
        &msg(
            MessageType::Ack,
            Code::CONTENT,
            req.mid,
            &req.token,
            b"copied",
        ),
    );
    assert_eq!(events(&mut c).len(), 1);
    assert_eq!(
        c.stats().bytes_copied,
        6,
        "payload; the empty option value copies nothing"
    );
}

#[test]
fn separate_response_after_empty_ack_is_acknowledged() {
    let t0 = Instant::now();
    let (mut c, calls) = client();
    let id = c.request(t0, server(), get(true, "slow")).unwrap();
    let req = sent(&mut c, t0).remove(0);

    // The empty ACK ends retransmission; the exchange now waits for the
    // separate response for `separate_timeout`.
    let t1 = t0 + secs(0.1);
    c.handle_datagram(t1, server(), &empty(MessageType::Ack, req.mid));
    assert!(events(&mut c).is_empty());
    assert_eq!(c.poll_timeout(), Some(t1 + secs(60.0)));
    assert_eq!(
        calls.lock().unwrap()[1],
        Call::Response {
            rtt: secs(0.1),
            retransmissions: 0
        }
    );
    c.handle_timeout(t0 + secs(10.0));
    assert!(sent(&mut c, t0 + secs(10.0)).is_empty());

    // The separate response, a CON with the server's own message ID.
    let t2 = t0 + secs(12.0);
    let resp = msg(MessageType::Con, Code::CONTENT, 0x7777, &req.token, b"late");
    c.handle_datagram(t2, server(), &resp);
    let acks = sent(&mut c, t2);
    assert_eq!(acks.len(), 1);
    assert_eq!(
        (acks[0].ty, acks[0].code, acks[0].mid, acks[0].dest),
        (MessageType::Ack, Code::EMPTY, 0x7777, server())
    );
    match events(&mut c).as_slice() {
        [Event::Response {
            id: rid,
            msg_type: MessageType::Con,
            payload,
            rtt,
            ..
        }] => {
            assert_eq!(*rid, id);
            assert_eq!(&payload[..], b"late");
            assert_eq!(*rtt, secs(12.0));
        }
        e => panic!("unexpected events {e:?}"),
    }
    assert_eq!(c.poll_timeout(), None);

    // The server lost our ACK and sends the response again: ACKed again,
    // no second event.
    c.handle_datagram(t2 + secs(2.0), server(), &resp);
    let again = sent(&mut c, t2 + secs(2.0));
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].bytes, acks[0].bytes);
    assert!(events(&mut c).is_empty());
    assert_eq!(c.stats().duplicates, 1);
    assert_eq!(c.stats().acks_sent, 2);
}

#[test]
fn separate_non_response_is_accepted_without_ack() {
    let t0 = Instant::now();
    let (mut c, _) = client();
    let id = c.request(t0, server(), get(true, "slow")).unwrap();
    let req = sent(&mut c, t0).remove(0);
    c.handle_datagram(t0, server(), &empty(MessageType::Ack, req.mid));
    let t1 = t0 + secs(3.0);
    c.handle_datagram(
        t1,
        server(),
        &msg(MessageType::Non, Code::CONTENT, 9, &req.token, b"x"),
    );
    assert!(sent(&mut c, t1).is_empty());
    assert!(matches!(
        events(&mut c).as_slice(),
        [Event::Response { id: r, msg_type: MessageType::Non, .. }] if *r == id
    ));
}

#[test]
fn separate_response_times_out() {
    let t0 = Instant::now();
    let (mut c, _) = client();
    let id = c.request(t0, server(), get(true, "never")).unwrap();
    let req = sent(&mut c, t0).remove(0);
    c.handle_datagram(t0, server(), &empty(MessageType::Ack, req.mid));
    c.handle_timeout(t0 + secs(60.0));
    assert_eq!(events(&mut c), vec![Event::Timeout { id }]);
}

#[test]
fn response_before_ack_acknowledges_implicitly() {
    let t0 = Instant::now();
    let (mut c, calls) = client();
    let id = c.request(t0, server(), get(true, "a")).unwrap();
    let req = sent(&mut c, t0).remove(0);
    c.handle_datagram(
        t0 + secs(1.0),
        server(),
        &msg(MessageType::Con, Code::CONTENT, 5, &req.token, b"r"),
    );
    assert_eq!(sent(&mut c, t0).len(), 1, "the CON response is ACKed");
    assert!(matches!(events(&mut c).as_slice(), [Event::Response { id: r, .. }] if *r == id));
    assert_eq!(c.poll_timeout(), None, "no more retransmissions");
    assert_eq!(calls.lock().unwrap().len(), 2);
}

#[test]
fn tokens_match_responses_with_several_in_flight() {
    let t0 = Instant::now();
    let params = TransmissionParams {
        nstart: 3,
        ..TransmissionParams::default()
    };
    let (mut c, calls) = client_with(params, 9);
    let ids: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|p| c.request(t0, server(), get(true, p)).unwrap())
        .collect();
    let other = c.request(t0, other_server(), get(false, "d")).unwrap();
    let reqs = sent(&mut c, t0);
    assert_eq!(reqs.len(), 4);
    // Blind start: the controller sees 1, 2, 3 parallel exchanges.
    assert_eq!(
        *calls.lock().unwrap(),
        (1..=3)
            .map(|n| Call::Initial { in_flight: n })
            .collect::<Vec<_>>()
    );
    // Distinct tokens, consecutive message IDs.
    for (i, r) in reqs.iter().enumerate() {
        assert_eq!(r.token.len(), 8);
        for s in &reqs[i + 1..] {
            assert_ne!(r.token, s.token);
        }
    }
    assert_eq!(reqs[1].mid, reqs[0].mid.wrapping_add(1));
    assert_eq!(reqs[2].mid, reqs[0].mid.wrapping_add(2));

    let t1 = t0 + secs(0.2);
    // The NON's token sent from the wrong peer matches nothing.
    c.handle_datagram(
        t1,
        server(),
        &msg(MessageType::Non, Code::CONTENT, 1, &reqs[3].token, b"d"),
    );
    assert!(events(&mut c).is_empty());
    assert_eq!(c.stats().unmatched, 1);
    // Answer out of order: c piggybacked, a separately (NON), b piggybacked,
    // d from the right peer.
    c.handle_datagram(
        t1,
        server(),
        &msg(
            MessageType::Ack,
            Code::CONTENT,
            reqs[2].mid,
            &reqs[2].token,
            b"c",
        ),
    );
    c.handle_datagram(t1, server(), &empty(MessageType::Ack, reqs[0].mid));
    c.handle_datagram(
        t1,
        server(),
        &msg(MessageType::Non, Code::CONTENT, 2, &reqs[0].token, b"a"),
    );
    c.handle_datagram(
        t1,
        server(),
        &msg(
            MessageType::Ack,
            Code::NOT_FOUND,
            reqs[1].mid,
            &reqs[1].token,
            b"b",
        ),
    );
    c.handle_datagram(
        t1,
        other_server(),
        &msg(MessageType::Non, Code::CONTENT, 1, &reqs[3].token, b"d"),
    );
    let got: Vec<(ExchangeId, Code, Vec<u8>)> = events(&mut c)
        .into_iter()
        .map(|e| match e {
            Event::Response {
                id, code, payload, ..
            } => (id, code, payload.to_vec()),
            e => panic!("unexpected {e:?}"),
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (ids[2], Code::CONTENT, b"c".to_vec()),
            (ids[0], Code::CONTENT, b"a".to_vec()),
            (ids[1], Code::NOT_FOUND, b"b".to_vec()),
            (other, Code::CONTENT, b"d".to_vec()),
        ]
    );
    assert_eq!(c.live_exchanges(), 0);
    assert_eq!(c.poll_timeout(), None);
}

#[test]
fn piggybacked_response_with_wrong_token_is_ignored() {
    let t0 = Instant::now();
    let (mut c, _) = client();
    c.request(t0, server(), get(true, "a")).unwrap();
    let req = sent(&mut c, t0).remove(0);
    let mut wrong = req.token.clone();
    wrong[0] ^= 0xff;
    c.handle_datagram(
        t0,
        server(),
        &msg(MessageType::Ack, Code::CONTENT, req.mid, &wrong, b"x"),
    );
    assert!(events(&mut c).is_empty());
    assert_eq!(c.stats().unmatched, 1);
    assert!(c.poll_timeout().is_some(), "still retransmitting");
}

#[test]
fn nstart_queues_requests_per_destination() {
    let t0 = Instant::now();
    let (mut c, calls) = client();
    let a1 = c.request(t0, server(), get(true, "1")).unwrap();
    let a2 = c.request(t0, server(), get(false, "2")).unwrap();
    let a3 = c.request(t0, server(), get(true, "3")).unwrap();
    let b1 = c.request(t0, other_server(), get(true, "1")).unwrap();
    let first = sent(&mut c, t0);
    // Only one outstanding exchange per destination (NSTART = 1).
    assert_eq!(
        first.iter().map(|s| s.dest).collect::<Vec<_>>(),
        vec![server(), other_server()]
    );
    assert_eq!(c.live_exchanges(), 4);

    // a1 and b1 acknowledged: a2 (NON) goes out, a3 still waits.
    let t1 = t0 + secs(1.0);
    c.handle_datagram(
        t1,
        server(),
        &msg(
            MessageType::Ack,
            Code::CONTENT,
            first[0].mid,
            &first[0].token,
            b"",
        ),
    );
    c.handle_datagram(
        t1,
        other_server(),
        &msg(
            MessageType::Ack,
            Code::CONTENT,
            first[1].mid,
            &first[1].token,
            b"",
        ),
    );
    let second = sent(&mut c, t1);
    assert_eq!(second.len(), 1);
    assert_eq!((second[0].dest, second[0].ty), (server(), MessageType::Non));
    assert_eq!(
        events(&mut c).iter().map(Event::id).collect::<Vec<_>>(),
        vec![a1, b1]
    );

    // a2 is outstanding until its response or its NON timeout (5 s); then a3.
    let t2 = t1 + secs(5.0);
    c.handle_timeout(t2 - Duration::from_millis(1));
    assert!(sent(&mut c, t2).is_empty());
    c.handle_timeout(t2);
    assert_eq!(events(&mut c), vec![Event::Timeout { id: a2 }]);
    let third = sent(&mut c, t2);
    assert_eq!(third.len(), 1);
    assert_eq!((third[0].dest, third[0].ty), (server(), MessageType::Con));
    // a3's timer runs from its own start, not from when it was queued.
    let a3_due = c.poll_timeout().unwrap();
    assert!(a3_due >= t2 + secs(2.0) && a3_due <= t2 + secs(3.0));
    assert_eq!(
        calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| matches!(c, Call::Initial { .. }))
            .count(),
        3,
        "the NON does not reach the controller"
    );
    c.handle_datagram(t2, server(), &empty(MessageType::Rst, third[0].mid));
    assert_eq!(events(&mut c), vec![Event::Reset { id: a3 }]);
    assert_eq!(c.live_exchanges(), 0);
    assert!(c.dests.is_empty(), "idle destinations are forgotten");
}

#[test]
fn reset_ends_the_exchange() {
    let t0 = Instant::now();
    let (mut c, calls) = client();
    let con = c.request(t0, server(), get(true, "a")).unwrap();
    let non = c.request(t0, other_server(), get(false, "b")).unwrap();
    let reqs = sent(&mut c, t0);
    let t1 = t0 + secs(0.3);
    c.handle_datagram(t1, server(), &empty(MessageType::Rst, reqs[0].mid));
    c.handle_datagram(t1, other_server(), &empty(MessageType::Rst, reqs[1].mid));
    assert_eq!(
        events(&mut c),
        vec![Event::Reset { id: con }, Event::Reset { id: non }]
    );
    assert_eq!(c.poll_timeout(), None);
    c.handle_timeout(t0 + secs(100.0));
    assert!(sent(&mut c, t0 + secs(100.0)).is_empty());
    assert!(events(&mut c).is_empty());
    // A Reset is neither an RTT sample nor a give-up.
    assert_eq!(calls.lock().unwrap().len(), 1);
    assert_eq!(c.stats().resets, 2);
    // A second Reset for the same message matches nothing.
    c.handle_datagram(t1, server(), &empty(MessageType::Rst, reqs[0].mid));
    assert_eq!(c.stats().unmatched, 1);
}

#[test]
fn non_request_is_sent_once_and_times_out() {
    let t0 = Instant::now();
    let (mut c, calls) = client();
    let id = c.request(t0, server(), get(false, "a")).unwrap();
    let req = sent(&mut c, t0);
    assert_eq!(req.len(), 1);
    assert_eq!(req[0].ty, MessageType::Non);
    assert_eq!(c.poll_timeout(), Some(t0 + secs(5.0)));
    c.handle_timeout(t0 + secs(4.999));
    assert!(sent(&mut c, t0).is_empty());
    assert!(events(&mut c).is_empty());
    c.handle_timeout(t0 + secs(5.0));
    assert!(sent(&mut c, t0).is_empty(), "a NON is never retransmitted");
    assert_eq!(events(&mut c), vec![Event::Timeout { id }]);
    assert!(calls.lock().unwrap().is_empty());
}

#[test]
fn duplicate_responses_are_ignored() {
    let t0 = Instant::now();
    let (mut c, _) = client();
    let id = c.request(t0, server(), get(true, "a")).unwrap();
    let req = sent(&mut c, t0).remove(0);
    let ack = msg(MessageType::Ack, Code::CONTENT, req.mid, &req.token, b"1");
    c.handle_datagram(t0, server(), &ack);
    c.handle_datagram(t0 + secs(1.0), server(), &ack);
    assert_eq!(
        events(&mut c).iter().map(Event::id).collect::<Vec<_>>(),
        vec![id]
    );
    assert_eq!(c.stats().responses, 1);
    assert_eq!(c.stats().unmatched, 1);

    // A NON answered by the same NON response twice.
    let id2 = c.request(t0, server(), get(false, "b")).unwrap();
    let req2 = sent(&mut c, t0).remove(0);
    let resp = msg(MessageType::Non, Code::CONTENT, 40, &req2.token, b"2");
    c.handle_datagram(t0, server(), &resp);
    c.handle_datagram(t0, server(), &resp);
    assert_eq!(
        events(&mut c).iter().map(Event::id).collect::<Vec<_>>(),
        vec![id2]
    );
    assert_eq!(c.stats().duplicates, 1);
    assert!(sent(&mut c, t0).is_empty());
}

#[test]
fn malformed_datagrams_are_ignored_and_counted() {
    let t0 = Instant::now();
    let (mut c, _) = client();
    let id = c.request(t0, server(), get(true, "a")).unwrap();
    let req = sent(&mut c, t0).remove(0);
    let mut bad_version = msg(MessageType::Ack, Code::CONTENT, req.mid, &req.token, b"x");
    bad_version[0] = (bad_version[0] & 0x3f) | 0x80;
    let mut truncated = msg(MessageType::Ack, Code::CONTENT, req.mid, &req.token, b"x");
    truncated[0] |= 0x0f; // token length 15
    for d in [
        &[][..],
        &[0x40, 0x01][..],
        &bad_version,
        &truncated,
        &[0xff; 40],
    ] {
        c.handle_datagram(t0, server(), d);
    }
    // RST with a code, empty NON: format errors too.
    c.handle_datagram(
        t0,
        server(),
        &msg(MessageType::Rst, Code::CONTENT, req.mid, &[], b"x"),
    );
    c.handle_datagram(t0, server(), &empty(MessageType::Non, 3));
    assert_eq!(c.stats().malformed, 7);
    assert_eq!(c.stats().datagrams_received, 7);
    assert!(events(&mut c).is_empty());
    assert!(sent(&mut c, t0).is_empty());
    // The exchange is unaffected.
    c.handle_datagram(
        t0,
        server(),
        &msg(MessageType::Ack, Code::CONTENT, req.mid, &req.token, b"ok"),
    );
    assert_eq!(
        events(&mut c).iter().map(Event::id).collect::<Vec<_>>(),
        vec![id]
    );
}

#[test]
fn unmatched_con_and_pings_get_reset() {
    let t0 = Instant::now();
    let (mut c, _) = client();
    c.handle_datagram(
        t0,
        server(),
        &msg(MessageType::Con, Code::CONTENT, 100, b"zzzz", b"x"),
    );
    c.handle_datagram(t0, server(), &empty(MessageType::Con, 101));
    c.handle_datagram(
        t0,
        server(),
        &msg(MessageType::Non, Code::CONTENT, 102, b"zzzz", b"x"),
    );
    let out = sent(&mut c, t0);
    assert_eq!(
        out.iter().map(|s| (s.ty, s.mid)).collect::<Vec<_>>(),
        vec![(MessageType::Rst, 100), (MessageType::Rst, 101)]
    );
    assert_eq!(c.stats().unmatched, 3);
    assert_eq!(c.stats().resets_sent, 2);
}

#[test]
fn seen_message_ids_expire_after_their_lifetime() {
    let t0 = Instant::now();
    let (mut c, _) = client();
    let resp = msg(MessageType::Con, Code::CONTENT, 100, b"zzzz", b"x");
    c.handle_datagram(t0, server(), &resp);
    c.handle_datagram(t0 + secs(246.0), server(), &resp);
    assert_eq!(c.stats().duplicates, 1);
    // After EXCHANGE_LIFETIME (247 s) the ID is new again.
    c.handle_datagram(t0 + secs(247.0), server(), &resp);
    assert_eq!(c.stats().duplicates, 1);
    assert_eq!(c.stats().unmatched, 2);
}

#[test]
fn tokens_and_message_ids_depend_on_the_seed() {
    let t0 = Instant::now();
    let first = |seed: u64, token_len: usize| {
        let p = TransmissionParams::default();
        let mut config = ClientConfig::new(p);
        config.token_len = token_len;
        let mut c = Client::new(config, Box::new(Basic::new(p, seed)), seed);
        c.request(t0, server(), get(false, "a")).unwrap();
        sent(&mut c, t0).remove(0)
    };
    let (a, b, a2) = (first(1, 8), first(2, 8), first(1, 8));
    assert_eq!((a.mid, &a.token), (a2.mid, &a2.token));
    assert_ne!((a.mid, &a.token), (b.mid, &b.token));
    assert_eq!(first(3, 4).token.len(), 4);
    assert_eq!(first(3, 0).token.len(), 4, "clamped to at least 4");
    assert_eq!(first(3, 20).token.len(), 8, "clamped to at most 8");
}

#[test]
fn requests_are_encoded_in_option_order_and_checked() {
    let t0 = Instant::now();
    let (mut c, _) = client();
    let req = Request {
        confirmable: true,
        code: Code::PUT,
        options: vec![
            (OptionNumber::CONTENT_FORMAT, vec![50]),
            (OptionNumber::URI_PATH, b"x".to_vec()),
            (OptionNumber::URI_HOST, b"h".to_vec()),
            (OptionNumber::URI_PATH, b"y".to_vec()),
        ],
        payload: b"{}".to_vec(),
    };
    c.request(t0, server(), req).unwrap();
    let s = sent(&mut c, t0).remove(0);
    let p = Packet::new_checked(&s.bytes[..]).unwrap();
    let opts: Vec<_> = p
        .options()
        .map(|o| (o.number.0, o.value.to_vec()))
        .collect();
    assert_eq!(
        opts,
        vec![
            (3, b"h".to_vec()),
            (11, b"x".to_vec()),
            (11, b"y".to_vec()),
            (12, vec![50])
        ]
    );
    assert_eq!((p.code(), p.payload()), (Code::PUT, &b"{}"[..]));

    let mut bad = get(true, "a");
    bad.code = Code::CONTENT;
    assert_eq!(
        c.request(t0, server(), bad),
        Err(RequestError::NotARequest(Code::CONTENT))
    );
    let mut big = get(true, "a");
    big.payload = vec![0; 2000];
    assert!(matches!(
        c.request(t0, server(), big),
        Err(RequestError::TooLarge { max: 1152, .. })
    ));
    assert_eq!(c.stats().requests, 1);
}

#[test]
fn cocoa_paces_non_requests_at_one_per_rto() {
    use crate::rto::Cocoa;
    let t0 = Instant::now();
    let mut c = Client::new(
        ClientConfig::default(),
        Box::new(Cocoa::new(TransmissionParams::default(), 1)),
        1,
    );
    let dest: SocketAddr = "10.0.0.9:5683".parse().unwrap();
    let non = || Request {
        confirmable: false,
        code: Code::GET,
        options: vec![],
        payload: vec![],
    };
    let a = c.request(t0, dest, non()).unwrap();
    let b = c.request(t0, dest, non()).unwrap();
    let first = c.poll_transmit(t0).expect("first NON goes at once");
    assert!(c.poll_transmit(t0).is_none(), "NSTART 1: the second waits");
    // answer the first after 50 ms: the slot frees, but CoCoA's blind RTO
    // (2 s, no estimate from NONs) paces the second NON
    let p = Packet::new_checked(&first.bytes[..]).unwrap();
    let mut resp = [0u8; 32];
    let n = {
        let w =
            MessageWriter::new(&mut resp, MessageType::Non, Code::CONTENT, 7, p.token()).unwrap();
        w.finish()
    };
    let t1 = t0 + Duration::from_millis(50);
    c.handle_datagram(t1, dest, &resp[..n]);
    assert!(matches!(c.poll_event(), Some(Event::Response { id, .. }) if id == a));
    assert!(c.poll_transmit(t1).is_none(), "paced");
    let due = c.poll_timeout().expect("a pacing timer");
    assert_eq!(due, t0 + Duration::from_secs(2));
    c.handle_timeout(due);
    assert!(
        c.poll_transmit(due).is_some(),
        "sent when the interval passed"
    );
    assert_eq!(c.live_exchanges(), 1);
    let _ = b;
}

#[test]
fn basic_does_not_pace_non_requests() {
    let t0 = Instant::now();
    let mut c = Client::new(
        ClientConfig {
            params: TransmissionParams {
                nstart: 4,
                ..TransmissionParams::default()
            },
            ..ClientConfig::default()
        },
        Box::new(crate::rto::Basic::new(
            TransmissionParams {
                nstart: 4,
                ..TransmissionParams::default()
            },
            1,
        )),
        1,
    );
    let dest: SocketAddr = "10.0.0.9:5683".parse().unwrap();
    for _ in 0..3 {
        c.request(
            t0,
            dest,
            Request {
                confirmable: false,
                code: Code::GET,
                options: vec![],
                payload: vec![],
            },
        )
        .unwrap();
    }
    let mut sent = 0;
    while c.poll_transmit(t0).is_some() {
        sent += 1;
    }
    assert_eq!(sent, 3);
}
