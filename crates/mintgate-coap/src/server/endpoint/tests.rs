use super::*;
use crate::server::Resource;
use crate::wire::ContentFormat;
use mintgate_buf::PartitionConfig;

fn pool() -> Pool {
    Pool::new(&[PartitionConfig {
        block_size: 2048,
        blocks: 256,
    }])
}

fn router() -> Router {
    let mut r = Router::new();
    r.add(Resource::new("small").get(|_, rb| {
        rb.content_format(ContentFormat::TEXT_PLAIN)
            .static_payload(b"21.5");
    }))
    .unwrap();
    r.add(Resource::new("sensors/big").get(|_, rb| {
        rb.content_format(ContentFormat::TEXT_PLAIN)
            .static_payload(&[b'x'; 900]);
    }))
    .unwrap();
    r.add(Resource::new("obs").flag("obs").get(|_, rb| {
        rb.content_format(ContentFormat::TEXT_PLAIN)
            .static_payload(b"1");
    }))
    .unwrap();
    r
}

fn get(ty: MessageType, mid: u16, path: &str, extra: &[(OptionNumber, &[u8])]) -> Vec<u8> {
    let mut buf = [0u8; 512];
    let mut w = MessageWriter::new(&mut buf, ty, Code::GET, mid, &mid.to_be_bytes()).unwrap();
    let mut opts: Vec<(OptionNumber, Vec<u8>)> = path
        .split('/')
        .map(|s| (OptionNumber::URI_PATH, s.as_bytes().to_vec()))
        .collect();
    opts.extend(extra.iter().map(|(n, v)| (*n, v.to_vec())));
    opts.sort_by_key(|(n, _)| *n);
    for (n, v) in &opts {
        w.option(*n, v).unwrap();
    }
    let n = w.finish();
    buf[..n].to_vec()
}

/// Runs one datagram through the endpoint as a server would.
fn exchange(
    ep: &Endpoint,
    r: &Router,
    now: Instant,
    peer: SocketAddr,
    d: &[u8],
) -> Option<Transmit> {
    match ep.handle_datagram(now, peer, 0, d) {
        Incoming::Request { .. } => {
            let p = Packet::new_checked(d).unwrap();
            let t = ep.begin(0, now, peer, 0, &p, false);
            let req = Request {
                peer,
                packet: &p,
                identity: None,
            };
            let h = ep.process(now, r, &req);
            ep.respond(now, t, r, &req, h).transmit()
        }
        Incoming::Duplicate(t) | Incoming::Malformed(t) | Incoming::Ignored(t) => t,
        Incoming::Consumed => None,
    }
}

fn peer(i: u8) -> SocketAddr {
    SocketAddr::from(([192, 0, 2, i], 40000))
}

#[test]
fn small_answers_go_whole_large_ones_within_three_times() {
    let ep = Endpoint::new(EndpointConfig::default(), pool(), Instant::now());
    let r = router();
    let now = Instant::now();
    let req = get(MessageType::Con, 1, "small", &[]);
    let t = exchange(&ep, &r, now, peer(1), &req).unwrap();
    let v = t.datagram.to_vec();
    assert_eq!(
        Packet::new_checked(v.as_slice()).unwrap().payload(),
        b"21.5"
    );
    let req = get(MessageType::Con, 2, "sensors/big", &[]);
    let t = exchange(&ep, &r, now, peer(1), &req).unwrap();
    assert!(
        t.datagram.len() <= 3 * req.len(),
        "{} > 3 x {}",
        t.datagram.len(),
        req.len()
    );
    let v = t.datagram.to_vec();
    let p = Packet::new_checked(v.as_slice()).unwrap();
    assert_eq!(p.code(), Code::CONTENT);
    assert!(p.option(OptionNumber::BLOCK2).is_some());
    assert!(p.option(OptionNumber::ECHO).is_some());
    assert_eq!(ep.stats().amplification_blocks.load(Relaxed), 1);
    // the duplicate gets the same cut answer
    let d = exchange(&ep, &r, now, peer(1), &req).unwrap();
    assert_eq!(d.datagram.to_vec(), v);
}

#[test]
fn an_echo_round_trip_verifies_the_address() {
    let ep = Endpoint::new(EndpointConfig::default(), pool(), Instant::now());
    let r = router();
    let now = Instant::now();
    let req = get(MessageType::Con, 1, "sensors/big", &[]);
    let v = exchange(&ep, &r, now, peer(1), &req)
        .unwrap()
        .datagram
        .to_vec();
    let p = Packet::new_checked(v.as_slice()).unwrap();
    let echo = p.option(OptionNumber::ECHO).unwrap().value.to_vec();
    // someone else repeating that Echo gains nothing
    let forged = get(
        MessageType::Con,
        2,
        "sensors/big",
        &[(OptionNumber::ECHO, &echo)],
    );
    let t = exchange(&ep, &r, now, peer(2), &forged).unwrap();
    assert!(t.datagram.len() <= 3 * forged.len());
    assert_eq!(ep.stats().echo_invalid.load(Relaxed), 1);
    // the client that received it is verified by repeating it
    let again = get(
        MessageType::Con,
        3,
        "sensors/big",
        &[(OptionNumber::ECHO, &echo)],
    );
    let t = exchange(&ep, &r, now + Duration::from_secs(1), peer(1), &again).unwrap();
    let v = t.datagram.to_vec();
    assert_eq!(
        Packet::new_checked(v.as_slice()).unwrap().payload().len(),
        900
    );
    assert!(ep.is_verified(now + Duration::from_secs(2), &peer(1)));
    // and stays so for a while, without Echo
    let plain = get(MessageType::Con, 4, "sensors/big", &[]);
    let t = exchange(&ep, &r, now + Duration::from_secs(3), peer(1), &plain).unwrap();
    assert!(t.datagram.len() > 900);
}

#[test]
fn an_unverified_client_gets_every_byte_block_by_block() {
    let ep = Endpoint::new(EndpointConfig::default(), pool(), Instant::now());
    let r = router();
    let now = Instant::now();
    let mut body = Vec::new();
    let mut num = 0u32;
    let mut szx = 6u8;
    for mid in 1..200u16 {
        let b = BlockOpt {
            num,
            more: false,
            szx,
        };
        let mut enc = [0u8; 4];
        let v = crate::wire::encode_uint(b.encode(), &mut enc).to_vec();
        let extra: Vec<(OptionNumber, &[u8])> = if num == 0 {
            vec![]
        } else {
            vec![(OptionNumber::BLOCK2, &v)]
        };
        let req = get(MessageType::Con, mid, "sensors/big", &extra);
        let t = exchange(&ep, &r, now, peer(9), &req).unwrap();
        assert!(t.datagram.len() <= 3 * req.len());
        let d = t.datagram.to_vec();
        let p = Packet::new_checked(d.as_slice()).unwrap();
        let got =
            BlockOpt::decode(p.option(OptionNumber::BLOCK2).unwrap().uint().unwrap()).unwrap();
        assert_eq!(got.num as usize * got.size(), body.len());
        body.extend_from_slice(p.payload());
        if !got.more {
            break;
        }
        szx = got.szx;
        num = got.num + 1;
    }
    assert_eq!(body, vec![b'x'; 900]);
}

#[test]
fn separate_responses_and_their_retransmissions() {
    let cfg = EndpointConfig::default();
    let ep = Endpoint::new(cfg.clone(), pool(), Instant::now());
    let r = router();
    let t0 = Instant::now();
    let req = get(MessageType::Con, 7, "small", &[]);
    let Incoming::Request { con: true, mid: 7 } = ep.handle_datagram(t0, peer(1), 0, &req) else {
        panic!("a new CON request");
    };
    let p = Packet::new_checked(req.as_slice()).unwrap();
    let t = ep.begin(3, t0, peer(1), 0, &p, false);
    // the handler is slow: an empty ACK after separate_after
    assert_eq!(ep.poll_timeout(), Some(t0 + cfg.separate_after));
    ep.handle_timeout(t0 + cfg.separate_after);
    let ack = ep.poll_transmit().unwrap();
    assert_eq!(
        ack.datagram.to_vec(),
        empty_message(MessageType::Ack, 7).to_vec()
    );
    let now = t0 + Duration::from_secs(2);
    let rq = Request {
        peer: peer(1),
        packet: &p,
        identity: None,
    };
    let h = ep.process(now, &r, &rq);
    let resp = ep.respond(now, t, &r, &rq, h).transmit().unwrap();
    let v = resp.datagram.to_vec();
    let rp = Packet::new_checked(v.as_slice()).unwrap();
    assert_eq!(rp.msg_type(), MessageType::Con);
    let mid = rp.message_id();
    // retransmitted 4 times, within [2, 3] s first, then given up
    let mut sent = 0;
    while let Some(due) = ep.poll_timeout() {
        ep.handle_timeout(due);
        while let Some(x) = ep.poll_transmit() {
            assert_eq!(x.datagram.to_vec(), v);
            sent += 1;
        }
    }
    assert_eq!(sent, 4);
    assert_eq!(ep.stats().gave_up.load(Relaxed), 1);
    assert_eq!(ep.pending(), 0);
    // an ACK after that is nothing to anyone
    assert!(matches!(
        ep.handle_datagram(now, peer(1), 0, &empty_message(MessageType::Ack, mid)),
        Incoming::Ignored(None)
    ));
}

fn register(ep: &Endpoint, r: &Router, now: Instant, from: SocketAddr, mid: u16) -> bool {
    let req = get(
        MessageType::Con,
        mid,
        "obs",
        &[(OptionNumber::OBSERVE, &[])],
    );
    let t = exchange(ep, r, now, from, &req).unwrap();
    let v = t.datagram.to_vec();
    Packet::new_checked(v.as_slice())
        .unwrap()
        .option(OptionNumber::OBSERVE)
        .is_some()
}

#[test]
fn an_observer_that_never_acknowledges_is_dropped_within_100_s() {
    let ep = Endpoint::new(EndpointConfig::default(), pool(), Instant::now());
    let r = router();
    let t0 = Instant::now();
    assert!(register(&ep, &r, t0, peer(1), 1));
    // the resource changes every second; the client never answers
    let mut sent = 0;
    let mut t = t0;
    let mut ended_at = None;
    for s in 1..=200u64 {
        t = t0 + Duration::from_secs(s);
        let mut out = Vec::new();
        ep.notify(t, &r, "obs", &mut out);
        sent += out.len();
        ep.handle_timeout(t);
        while ep.poll_transmit().is_some() {
            sent += 1;
        }
        if ep.observers() == 0 {
            ended_at = Some(s);
            break;
        }
    }
    let ended_at = ended_at.expect("the relation ends");
    assert!(ended_at <= 100, "ended after {ended_at} s");
    assert_eq!(ep.stats().ended(Ended::Unacknowledged), 1);
    // the first notification is CON; nothing else goes while it waits
    assert_eq!(sent, 5, "one CON and its 4 retransmissions");
    assert_eq!(
        ep.stats().notifications_replaced.load(Relaxed),
        ended_at - 1
    );
    let _ = t;
}

#[test]
fn an_observer_that_acknowledges_stays_and_a_reset_ends_it() {
    let ep = Endpoint::new(EndpointConfig::default(), pool(), Instant::now());
    let r = router();
    let t0 = Instant::now();
    assert!(register(&ep, &r, t0, peer(1), 1));
    let mut last = Vec::new();
    for s in 1..=300u64 {
        let t = t0 + Duration::from_secs(s);
        let mut out = Vec::new();
        ep.notify(t, &r, "obs", &mut out);
        for x in &out {
            let v = x.datagram.to_vec();
            let p = Packet::new_checked(v.as_slice()).unwrap();
            if p.msg_type() == MessageType::Con {
                let ack = empty_message(MessageType::Ack, p.message_id());
                assert!(matches!(
                    ep.handle_datagram(t, peer(1), 0, &ack),
                    Incoming::Consumed
                ));
            }
            last = v;
        }
        ep.handle_timeout(t);
        while ep.poll_transmit().is_some() {}
    }
    assert_eq!(ep.observers(), 1);
    assert_eq!(ep.stats().gave_up.load(Relaxed), 0);
    assert_eq!(ep.stats().notifications.load(Relaxed), 300);
    // a Reset to the last (NON or CON) notification ends the relation
    let mid = Packet::new_checked(last.as_slice()).unwrap().message_id();
    let rst = empty_message(MessageType::Rst, mid);
    assert!(matches!(
        ep.handle_datagram(t0, peer(1), 0, &rst),
        Incoming::Consumed
    ));
    assert_eq!(ep.observers(), 0);
    assert_eq!(ep.stats().ended(Ended::Reset), 1);
}

#[test]
fn one_source_cannot_fill_the_registry() {
    let mut cfg = EndpointConfig::default();
    cfg.observe.max_per_source = 4;
    cfg.observe.max_observers = 8;
    let ep = Endpoint::new(cfg, pool(), Instant::now());
    let r = router();
    let now = Instant::now();
    let mut ok = 0;
    for port in 0..20u16 {
        let from = SocketAddr::from(([192, 0, 2, 1], 1000 + port));
        ok += register(&ep, &r, now, from, port + 1) as usize;
    }
    assert_eq!(ok, 4);
    assert_eq!(ep.stats().observe_refused_source.load(Relaxed), 16);
    // another host still gets in
    assert!(register(&ep, &r, now, peer(2), 100));
}

#[test]
fn de_duplication_stays_bounded_under_a_flood() {
    let cfg = EndpointConfig {
        dedup_capacity: 1024,
        ..Default::default()
    };
    let ep = Endpoint::new(cfg, pool(), Instant::now());
    let now = Instant::now();
    for i in 0..100_000u32 {
        let from = SocketAddr::from(([10, (i >> 16) as u8, (i >> 8) as u8, i as u8], 5683));
        let d = get(MessageType::Non, i as u16, "small", &[]);
        if let Incoming::Request { .. } = ep.handle_datagram(now, from, 0, &d) {
            // shed at the queue, as an overloaded server does
            let p = Packet::new_checked(d.as_slice()).unwrap();
            assert!(ep.shed(from, 0, &p, 2).is_none());
        }
    }
    assert!(ep.dedup_len() <= 1024 + 16);
}

#[test]
fn a_short_duplicate_from_an_unverified_source_gets_no_more_than_its_share() {
    let ep = Endpoint::new(EndpointConfig::default(), pool(), Instant::now());
    let r = router();
    let now = Instant::now();
    let req = get(MessageType::Con, 7, "sensors/big", &[]);
    let first = exchange(&ep, &r, now, peer(1), &req)
        .unwrap()
        .datagram
        .to_vec();
    assert!(first.len() <= 3 * req.len());
    assert!(first.len() > 12, "the cut answer is more than 3 x 4 bytes");
    // the same exchange repeated whole gets its answer again
    let again = exchange(&ep, &r, now, peer(1), &req)
        .unwrap()
        .datagram
        .to_vec();
    assert_eq!(again, first);
    // a bare 4-byte header with the same message ID is a duplicate too, but
    // the cached answer is more than 3 times its size: nothing goes back
    let bare = [0x40, Code::GET.0, 0, 7];
    assert!(matches!(
        ep.handle_datagram(now, peer(1), 0, &bare),
        Incoming::Duplicate(None)
    ));
    assert_eq!(ep.stats().amplification_dropped.load(Relaxed), 1);
    // a transport-verified source's answers are replayed whatever the size
    assert!(matches!(
        ep.handle_datagram(now, peer(2), 0, &req),
        Incoming::Request { .. }
    ));
    let p = Packet::new_checked(&req[..]).unwrap();
    let t = ep.begin(0, now, peer(2), 0, &p, true);
    let rq = Request {
        peer: peer(2),
        packet: &p,
        identity: None,
    };
    let h = ep.process(now, &r, &rq);
    let whole = ep.respond(now, t, &r, &rq, h).transmit().unwrap();
    assert!(whole.datagram.len() > 900);
    match ep.handle_datagram(now, peer(2), 0, &bare) {
        Incoming::Duplicate(Some(t)) => assert_eq!(t.datagram.len(), whole.datagram.len()),
        other => panic!("{other:?}"),
    }
}

/// A GET of /obs over a reliable connection as the gateway answers it:
/// process, then Observe; the response's Observe value, if any.
fn over_connection(
    ep: &Endpoint,
    r: &Router,
    now: Instant,
    conn: usize,
    observe: &[u8],
) -> Option<u32> {
    let req = get(
        MessageType::Con,
        0,
        "obs",
        &[(OptionNumber::OBSERVE, observe)],
    );
    let p = Packet::new_checked(req.as_slice()).unwrap();
    let rq = Request {
        peer: peer(9),
        packet: &p,
        identity: None,
    };
    let Handled::Respond(mut rb) = ep.process(now, r, &rq) else {
        panic!("answered");
    };
    ep.observe_reliable(now, r, &rq, conn, &mut rb, None);
    let Answer::Send(o) = finish_response(ep.pool(), rb, MessageType::Ack, 0, p.token()) else {
        panic!("encoded");
    };
    let v = o.to_vec();
    let rp = Packet::new_checked(v.as_slice()).unwrap();
    rp.option(OptionNumber::OBSERVE).and_then(|o| o.uint())
}

#[test]
fn a_reliable_connection_observes_without_con_and_close_or_removal_ends_it() {
    use crate::server::observe::RELIABLE;
    let ep = Endpoint::new(EndpointConfig::default(), pool(), Instant::now());
    let r = router();
    let t0 = Instant::now();
    let conn = RELIABLE + 3;
    assert_eq!(over_connection(&ep, &r, t0, conn, &[]), Some(1));
    assert_eq!(ep.observers(), 1);
    // a UDP observer too: its first notification is CON
    assert!(register(&ep, &r, t0, peer(1), 1));
    let mut seqs = Vec::new();
    for s in 1..=5u64 {
        let t = t0 + Duration::from_secs(s);
        let mut out = Vec::new();
        ep.notify(t, &r, "obs", &mut out);
        let tcp: Vec<_> = out.iter().filter(|t| t.listener == conn).collect();
        assert_eq!(tcp.len(), 1, "one notification per change");
        let v = tcp[0].datagram.to_vec();
        let p = Packet::new_checked(v.as_slice()).unwrap();
        assert_eq!((p.msg_type(), p.message_id()), (MessageType::Non, 0));
        seqs.push(p.option(OptionNumber::OBSERVE).unwrap().uint().unwrap());
        // nothing to retransmit to the connection
        ep.handle_timeout(t);
        while let Some(x) = ep.poll_transmit() {
            assert_ne!(x.listener, conn);
        }
    }
    assert_eq!(seqs, [2, 3, 4, 5, 6]);
    // Observe: 1 deregisters, a new registration comes back
    assert_eq!(over_connection(&ep, &r, t0, conn, &[1]), None);
    assert_eq!(ep.stats().ended(Ended::Deregistered), 1);
    assert_eq!(over_connection(&ep, &r, t0, conn, &[]), Some(1));
    // the connection closes: its relation ends, the UDP one stays
    assert_eq!(ep.end_connection(conn), 1);
    assert_eq!(ep.end_connection(conn), 0);
    assert_eq!(ep.stats().ended(Ended::Closed), 1);
    assert_eq!(ep.observers(), 1);
    assert!(ep.stats().retransmissions.load(Relaxed) > 0, "UDP's CON");
    // the resource goes away: a last 4.04 to the connection ends it too
    assert_eq!(over_connection(&ep, &r, t0, conn, &[]), Some(1));
    let mut out = Vec::new();
    ep.notify(t0, &Router::new(), "obs", &mut out);
    let last: Vec<_> = out.iter().filter(|t| t.listener == conn).collect();
    assert_eq!(last.len(), 1);
    let v = last[0].datagram.to_vec();
    assert_eq!(
        Packet::new_checked(v.as_slice()).unwrap().code(),
        Code::NOT_FOUND
    );
    assert_eq!(ep.stats().ended(Ended::NotContent), 2, "both relations");
    assert_eq!(ep.observers(), 0);
}

/// A stand-in for OSCORE: "protects" a notification by adding an option
/// 65000 with its number, and fails once `left` is used up.
#[derive(Debug)]
struct Toy {
    left: std::sync::atomic::AtomicU32,
}

impl crate::server::observe::Seal for Toy {
    fn owner(&self) -> &str {
        "oscore:toy"
    }

    fn seal(
        &self,
        plain: ResponseBuilder,
        out: &mut ResponseBuilder,
    ) -> Result<(), crate::server::observe::SealFailed> {
        let n = self.left.load(Relaxed);
        if n == 0 {
            return Err(crate::server::observe::SealFailed);
        }
        self.left.store(n - 1, Relaxed);
        let v = plain.finish(MessageType::Ack, 0, &[]).unwrap().to_vec();
        let p = Packet::new_checked(v.as_slice()).unwrap();
        out.set_code(p.code());
        for o in p.options() {
            out.option(o.number, o.value);
        }
        out.option_uint(OptionNumber(65000), n);
        out.write(p.payload());
        Ok(())
    }
}

/// RFC 8613 4.1.3.5 as the endpoint sees it: a relation registered through
/// a seal gets each notification through it, ends (counted) when it
/// fails, and is neither taken over nor ended by plain requests with the
/// same peer and token; the outer request's Observe is not acted on.
#[test]
fn a_sealed_relation_gets_only_sealed_notifications_and_ends_when_sealing_fails() {
    let ep = Endpoint::new(EndpointConfig::default(), pool(), Instant::now());
    let r = router();
    let t0 = Instant::now();
    let inner = get(MessageType::Con, 5, "obs", &[(OptionNumber::OBSERVE, &[])]);
    // the outer message: an OSCORE option, and its own (outer) Observe
    let outer = get(
        MessageType::Con,
        5,
        "obs",
        &[(OptionNumber::OBSERVE, &[]), (crate::oscore::OSCORE, &[])],
    );
    let (ip, op) = (
        Packet::new_checked(&inner[..]).unwrap(),
        Packet::new_checked(&outer[..]).unwrap(),
    );
    assert!(matches!(
        ep.handle_datagram(t0, peer(1), 0, &outer),
        Incoming::Request { .. }
    ));
    let t = ep.begin(0, t0, peer(1), 0, &op, true);
    let ireq = Request {
        peer: peer(1),
        packet: &ip,
        identity: Some("oscore:toy"),
    };
    let Handled::Respond(mut rb) = ep.process(t0, &r, &ireq) else {
        panic!("no answer")
    };
    let seal = Arc::new(Toy {
        left: std::sync::atomic::AtomicU32::new(2),
    });
    ep.observe_sealed(t0, &r, &ireq, &t, &mut rb, seal);
    let oreq = Request {
        packet: &op,
        ..ireq
    };
    let first = ep
        .respond(t0, t, &r, &oreq, Handled::Respond(rb))
        .transmit()
        .unwrap()
        .datagram
        .to_vec();
    let fp = Packet::new_checked(first.as_slice()).unwrap();
    assert_eq!(fp.option(OptionNumber::OBSERVE).unwrap().uint(), Some(1));
    assert_eq!(ep.observers(), 1, "registered once, not again as plain");
    // plain requests with the same peer and token: no registration, no end
    let plain = get(MessageType::Con, 6, "obs", &[(OptionNumber::OBSERVE, &[])]);
    let plain = [&plain[..4], &5u16.to_be_bytes()[..], &plain[6..]].concat();
    let a = exchange(&ep, &r, t0, peer(1), &plain).unwrap();
    assert!(Packet::new_checked(a.datagram.to_vec().as_slice())
        .unwrap()
        .option(OptionNumber::OBSERVE)
        .is_none());
    assert_eq!(ep.stats().observe_refused_taken.load(Relaxed), 1);
    let dereg = get(MessageType::Con, 7, "obs", &[(OptionNumber::OBSERVE, &[1])]);
    let dereg = [&dereg[..4], &5u16.to_be_bytes()[..], &dereg[6..]].concat();
    exchange(&ep, &r, t0, peer(1), &dereg).unwrap();
    assert_eq!(ep.observers(), 1, "a plain Observe: 1 does not end it");
    // two notifications go through the seal, the third cannot be sealed
    for (i, left) in [(1u64, 2u32), (2, 1)] {
        let mut out = Vec::new();
        ep.notify(t0 + Duration::from_secs(i), &r, "obs", &mut out);
        assert_eq!(out.len(), 1);
        let v = out[0].datagram.to_vec();
        let p = Packet::new_checked(v.as_slice()).unwrap();
        assert_eq!(p.option(OptionNumber(65000)).unwrap().uint(), Some(left));
        assert_eq!(p.token(), &5u16.to_be_bytes());
        if p.msg_type() == MessageType::Con {
            let ack = empty_message(MessageType::Ack, p.message_id());
            ep.handle_datagram(t0, peer(1), 0, &ack);
        }
    }
    let mut out = Vec::new();
    ep.notify(t0 + Duration::from_secs(3), &r, "obs", &mut out);
    assert!(out.is_empty(), "nothing unprotected goes out");
    assert_eq!(ep.observers(), 0);
    assert_eq!(ep.stats().ended(Ended::Unprotected), 1);
}
