//! Devices as resources, Observe (RFC 7641), Block2 and `/links`, over
//! real loopback UDP against an in-process gateway.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::unreachable
)] // test code

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use mintgate_coap::server::block::BlockOpt;
use mintgate_coap::wire::{empty_message, Code, MessageType, MessageWriter, OptionNumber, Packet};
use mintgate_devices::{DeviceKind, DeviceSpec};
use mintgate_gateway::config::PoolMode;
use mintgate_gateway::devices::DeviceHost;
use mintgate_gateway::{resources, Config, Gateway};

fn config() -> Config {
    let mut c = Config::default();
    c.coap.bind = vec!["127.0.0.1:0".parse().unwrap()];
    c.pipeline.pool = PoolMode::Fixed(2);
    c.buffers.partitions = vec![
        mintgate_gateway::config::Partition {
            block_size: 192,
            blocks: 1024,
        },
        mintgate_gateway::config::Partition {
            block_size: 1280,
            blocks: 256,
        },
    ];
    c.coap.observe_con_every = 3;
    c.directpath.priority = 0;
    let mut fast = DeviceSpec::new("fast", DeviceKind::SimSensor);
    fast.signal = Some("walk(20, 1, 0, 40)".into());
    fast.period = Some("20ms".into());
    fast.history = 200;
    c.devices.list.push(fast);
    c
}

struct Rig {
    gw: Gateway,
    host: DeviceHost,
    addr: SocketAddr,
}

fn rig(c: Config) -> Rig {
    let gw = Gateway::start(c.clone(), resources::router_for(&c)).expect("gateway starts");
    let host = DeviceHost::start(&c, &gw).expect("devices start");
    let addr = gw.local_addrs()[0];
    Rig { gw, host, addr }
}

fn client(server: SocketAddr) -> UdpSocket {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_millis(1500)))
        .unwrap();
    s.connect(server).unwrap();
    s
}

fn msg(
    ty: MessageType,
    code: Code,
    mid: u16,
    token: &[u8],
    path: &str,
    opts: &[(OptionNumber, u32)],
    payload: &[u8],
) -> Vec<u8> {
    let mut b = vec![0u8; 1400];
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    let mut w = MessageWriter::new(&mut b, ty, code, mid, token).unwrap();
    let mut before: Vec<_> = opts.iter().filter(|o| o.0 .0 < 11).collect();
    before.sort_by_key(|o| o.0 .0);
    for (n, v) in before {
        w.option_uint(*n, *v).unwrap();
    }
    w.path_options(OptionNumber::URI_PATH, path).unwrap();
    let mut after: Vec<_> = opts.iter().filter(|o| o.0 .0 > 11).collect();
    after.sort_by_key(|o| o.0 .0);
    let mut q_done = query.is_empty();
    for (n, v) in after {
        if !q_done && n.0 > 15 {
            w.option(OptionNumber::URI_QUERY, query.as_bytes()).unwrap();
            q_done = true;
        }
        w.option_uint(*n, *v).unwrap();
    }
    if !q_done {
        w.option(OptionNumber::URI_QUERY, query.as_bytes()).unwrap();
    }
    w.payload(payload).unwrap();
    let n = w.finish();
    b.truncate(n);
    b
}

fn recv(s: &UdpSocket) -> Vec<u8> {
    let mut b = vec![0u8; 2048];
    let n = s.recv(&mut b).expect("an answer within the timeout");
    b.truncate(n);
    b
}

fn obs_of(p: &Packet<&[u8]>) -> Option<u32> {
    p.option(OptionNumber::OBSERVE).and_then(|o| o.uint())
}

fn wait_for(mut f: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

#[test]
fn observe_register_notify_ack_and_reset() {
    let r = rig(config());
    let s = client(r.addr);
    s.send(&msg(
        MessageType::Con,
        Code::GET,
        1,
        b"ob1",
        "sensors/fast",
        &[(OptionNumber::OBSERVE, 0)],
        b"",
    ))
    .unwrap();
    let first = recv(&s);
    let p = Packet::new_checked(&first[..]).unwrap();
    assert_eq!(
        (p.msg_type(), p.code(), p.message_id()),
        (MessageType::Ack, Code::CONTENT, 1)
    );
    let mut last = obs_of(&p).expect("the registration's answer carries Observe");
    // fresh for the sampling period (20 ms, rounded up to a second), not
    // the default 60 s a missing Max-Age would mean
    assert_eq!(
        p.option(OptionNumber::MAX_AGE).and_then(|o| o.uint()),
        Some(1)
    );
    let v: f64 = std::str::from_utf8(p.payload()).unwrap().parse().unwrap();
    assert!((0.0..=40.0).contains(&v));
    assert_eq!(r.gw.notifier().observers(), 1);

    // notifications: increasing Observe values, every third one CON
    let (mut cons, mut nons) = (0, 0);
    for _ in 0..7 {
        let b = recv(&s);
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.token(), b"ob1");
        assert_eq!(p.code(), Code::CONTENT);
        let o = obs_of(&p).unwrap();
        assert!(o > last, "{o} after {last}");
        last = o;
        match p.msg_type() {
            MessageType::Con => {
                cons += 1;
                s.send(&empty_message(MessageType::Ack, p.message_id()))
                    .unwrap();
            }
            MessageType::Non => nons += 1,
            t => panic!("{t:?}"),
        }
    }
    assert!(cons >= 2 && nons >= 4, "{cons} CON, {nons} NON");
    // a Reset of a notification ends the observation
    let b = recv(&s);
    let p = Packet::new_checked(&b[..]).unwrap();
    s.send(&empty_message(MessageType::Rst, p.message_id()))
        .unwrap();
    assert!(wait_for(|| r.gw.notifier().observers() == 0));
    let n = r.gw.notifier();
    let c = n.counters();
    assert!(n.removed() >= 1 && c.notifications.load(Relaxed) >= 8);
    assert_eq!(
        c.ended(mintgate_coap::server::observe::Ended::Reset),
        1,
        "ended by the Reset"
    );
    // drain what was in flight, then silence
    std::thread::sleep(Duration::from_millis(100));
    s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    while s.recv(&mut [0u8; 512]).is_ok() {}
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    assert!(
        s.recv(&mut [0u8; 512]).is_err(),
        "no notification after the Reset"
    );
}

#[test]
fn deregistration_non_observable_and_removal() {
    let r = rig(config());
    let s = client(r.addr);
    // a resource without obs answers a GET with Observe as a plain GET
    s.send(&msg(
        MessageType::Con,
        Code::GET,
        2,
        b"x",
        "request",
        &[(OptionNumber::OBSERVE, 0)],
        b"",
    ))
    .unwrap();
    let b = recv(&s);
    let p = Packet::new_checked(&b[..]).unwrap();
    assert_eq!(p.payload(), b"hello world");
    assert_eq!(obs_of(&p), None);
    assert_eq!(r.gw.notifier().observers(), 0);

    // register on the actuator, change it by PUT from another client: notified
    s.send(&msg(
        MessageType::Con,
        Code::GET,
        3,
        b"a",
        "actuators/led0",
        &[(OptionNumber::OBSERVE, 0)],
        b"",
    ))
    .unwrap();
    let b = recv(&s);
    assert!(obs_of(&Packet::new_checked(&b[..]).unwrap()).is_some());
    let other = client(r.addr);
    other
        .send(&msg(
            MessageType::Con,
            Code::PUT,
            4,
            b"p",
            "actuators/led0",
            &[],
            b"0.5",
        ))
        .unwrap();
    let b = recv(&other);
    assert_eq!(Packet::new_checked(&b[..]).unwrap().code(), Code::CHANGED);
    let b = recv(&s);
    let p = Packet::new_checked(&b[..]).unwrap();
    assert_eq!((p.token(), p.payload()), (&b"a"[..], &b"0.5"[..]));
    other
        .send(&msg(
            MessageType::Con,
            Code::PUT,
            5,
            b"p",
            "actuators/led0",
            &[],
            b"warm",
        ))
        .unwrap();
    let b = recv(&other);
    let p = Packet::new_checked(&b[..]).unwrap();
    assert_eq!(p.code(), Code::BAD_REQUEST);
    assert!(std::str::from_utf8(p.payload())
        .unwrap()
        .contains("expected a number"));

    // Observe: 1 deregisters
    s.send(&msg(
        MessageType::Con,
        Code::GET,
        6,
        b"a",
        "actuators/led0",
        &[(OptionNumber::OBSERVE, 1)],
        b"",
    ))
    .unwrap();
    let b = recv(&s);
    assert_eq!(obs_of(&Packet::new_checked(&b[..]).unwrap()), None);
    assert_eq!(r.gw.notifier().observers(), 0);

    // removing a device sends its observers a final 4.04
    s.send(&msg(
        MessageType::Con,
        Code::GET,
        7,
        b"f",
        "sensors/fast",
        &[(OptionNumber::OBSERVE, 0)],
        b"",
    ))
    .unwrap();
    let _ = recv(&s);
    r.host.remove_device(&r.gw, "fast").unwrap();
    let got_404 = (0..20).any(|_| {
        let b = recv(&s);
        let p = Packet::new_checked(&b[..]).unwrap();
        if p.msg_type() == MessageType::Con {
            let _ = s.send(&empty_message(MessageType::Ack, p.message_id()));
        }
        p.code() == Code::NOT_FOUND
    });
    assert!(got_404);
    assert!(wait_for(|| r.gw.notifier().observers() == 0));
    s.send(&msg(
        MessageType::Con,
        Code::GET,
        8,
        b"g",
        "sensors/fast",
        &[],
        b"",
    ))
    .unwrap();
    let b = recv(&s);
    assert_eq!(Packet::new_checked(&b[..]).unwrap().code(), Code::NOT_FOUND);

    // and added back at run time
    let mut spec = DeviceSpec::new("fast2", DeviceKind::SimSensor);
    spec.signal = Some("constant(7)".into());
    r.host.add_device(&r.gw, spec).unwrap();
    s.send(&msg(
        MessageType::Con,
        Code::GET,
        9,
        b"h",
        "sensors/fast2",
        &[],
        b"",
    ))
    .unwrap();
    let b = recv(&s);
    assert_eq!(Packet::new_checked(&b[..]).unwrap().payload(), b"7");
}

#[test]
fn history_goes_block_wise_and_links_are_managed_over_coap() {
    let r = rig(config());
    let dev = r.host.manager().get("fast").unwrap();
    assert!(
        wait_for(|| dev.history().updates() >= 120),
        "the history fills"
    );
    let s = client(r.addr);
    let mut body = Vec::new();
    let mut num = 0;
    let mut szx = 6;
    let mut etag: Option<Vec<u8>> = None;
    let mut echo: Option<Vec<u8>> = None;
    // an address not yet verified gets blocks within 3x its request, at a
    // size the server picks, with an Echo value: the client goes on at that
    // size and repeats the Echo (RFC 9175 2.3), which verifies its address,
    // so the next blocks come whole
    let mut small = 0;
    for mid in 1000..1600u16 {
        let opts = [(
            OptionNumber::BLOCK2,
            BlockOpt {
                num,
                more: false,
                szx,
            }
            .encode(),
        )];
        let req = msg(
            MessageType::Con,
            Code::GET,
            mid,
            b"b",
            "sensors/fast/history",
            if num == 0 { &[] } else { &opts },
            b"",
        );
        let mut req = req;
        if let Some(e) = echo.take() {
            // Echo (252) is the last option and there is no payload
            let last = if num == 0 { 11 } else { 23 };
            req.extend_from_slice(&[(13 << 4) | e.len() as u8, 252 - last - 13]);
            req.extend_from_slice(&e);
        }
        s.send(&req).unwrap();
        let b = recv(&s);
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.code(), Code::CONTENT);
        let blk = BlockOpt::decode(
            p.option(OptionNumber::BLOCK2)
                .and_then(|o| o.uint())
                .expect("history is block-wise"),
        )
        .unwrap();
        assert!(blk.szx <= szx && blk.num as usize * blk.size() == num as usize * (16 << szx));
        if let Some(e) = p.option(OptionNumber::ECHO) {
            assert!(
                b.len() <= 3 * req.len(),
                "{} bytes to an unverified address for {}",
                b.len(),
                req.len()
            );
            echo = Some(e.value.to_vec());
            small += 1;
        }
        let tag = p.option(OptionNumber::ETAG).map(|o| o.value.to_vec());
        if etag.is_some() && etag != tag {
            // the history moved on between blocks: start over, as a client must
            body.clear();
            num = 0;
            szx = 6;
            etag = None;
            continue;
        }
        etag = tag;
        body.extend_from_slice(p.payload());
        if !blk.more {
            break;
        }
        num = blk.num + 1;
        szx = blk.szx;
    }
    assert_eq!(small, 1, "one small block, then verified");
    let text = String::from_utf8(body).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "unix_ms,value");
    assert!(lines.len() > 100, "{} lines", lines.len());
    assert!(
        lines[1..]
            .iter()
            .all(|l| l.split(',').count() == 2 && l.split(',').all(|f| f.parse::<f64>().is_ok())),
        "{text}"
    );

    // /links: add, list, remove
    s.send(&msg(
        MessageType::Con,
        Code::POST,
        70,
        b"l",
        "links",
        &[],
        b"fast | threshold(25, 15) -> actuator(led0)",
    ))
    .unwrap();
    let b = recv(&s);
    let p = Packet::new_checked(&b[..]).unwrap();
    assert_eq!(p.code(), Code::CREATED);
    let id = std::str::from_utf8(p.payload()).unwrap().to_string();
    s.send(&msg(
        MessageType::Con,
        Code::POST,
        71,
        b"l",
        "links",
        &[],
        b"fast -> actuator(nope)",
    ))
    .unwrap();
    let b = recv(&s);
    let p = Packet::new_checked(&b[..]).unwrap();
    assert_eq!(p.code(), Code::BAD_REQUEST);
    assert!(std::str::from_utf8(p.payload())
        .unwrap()
        .contains("no device named `nope`"));
    s.send(&msg(
        MessageType::Con,
        Code::GET,
        72,
        b"l",
        "links",
        &[],
        b"",
    ))
    .unwrap();
    let b = recv(&s);
    let listing =
        String::from_utf8(Packet::new_checked(&b[..]).unwrap().payload().to_vec()).unwrap();
    assert_eq!(
        listing,
        format!("{id}: fast | threshold(25.0, 15.0) -> actuator(led0)\n")
    );
    let led = r.host.manager().get("led0").unwrap();
    assert!(
        wait_for(|| led.history().updates() >= 1),
        "the link drives the led"
    );
    s.send(&msg(
        MessageType::Con,
        Code::DELETE,
        73,
        b"l",
        &format!("links?id={id}"),
        &[],
        b"",
    ))
    .unwrap();
    let b = recv(&s);
    assert_eq!(Packet::new_checked(&b[..]).unwrap().code(), Code::DELETED);
    s.send(&msg(
        MessageType::Con,
        Code::DELETE,
        74,
        b"l",
        &format!("links?id={id}"),
        &[],
        b"",
    ))
    .unwrap();
    let b = recv(&s);
    assert_eq!(Packet::new_checked(&b[..]).unwrap().code(), Code::NOT_FOUND);
    assert!(r.host.manager().links().is_empty());
}

#[test]
fn metrics_show_observe_and_the_direct_path() {
    let r = rig(config());
    r.host
        .manager()
        .add_link("fast | cov(0) -> actuator(led0)")
        .unwrap();
    let dp = r.host.manager().directpath();
    assert!(wait_for(|| dp.snapshot().fired >= 5));
    let h = r.gw.handle();
    let text = mintgate_gateway::metrics::render_prometheus(&h);
    let value = |name: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
            .unwrap_or_else(|| panic!("{name} missing:\n{text}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!(value("mintgate_directpath_fired_total") >= 5.0);
    assert_eq!(value("mintgate_directpath_overflow_total"), 0.0);
    assert_eq!(value("mintgate_directpath_links"), 1.0);
    assert!(value("mintgate_directpath_e2e_latency_seconds_count") >= 5.0);
    assert!(value("mintgate_devices") >= 3.0);
    assert_eq!(value("mintgate_observe_observers"), 0.0);
    // a histogram: cumulative buckets up to +Inf, which holds every event
    let inf = "mintgate_directpath_e2e_latency_seconds_bucket{le=\"+Inf\"} ";
    assert!(text.contains("# TYPE mintgate_directpath_e2e_latency_seconds histogram\n"));
    let buckets: Vec<u64> = text
        .lines()
        .filter(|l| l.starts_with("mintgate_directpath_e2e_latency_seconds_bucket{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(buckets.len(), 20, "{text}");
    assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "{buckets:?}");
    assert!(text.contains(&format!(
        "{inf}{}",
        value("mintgate_directpath_e2e_latency_seconds_count")
    )));
}

#[test]
fn notify_every_repeats_an_unchanged_value_and_plain_sensors_stay_quiet() {
    let mut c = config();
    for (name, every) in [("still", None), ("beat", Some("100ms"))] {
        let mut d = DeviceSpec::new(name, DeviceKind::SimSensor);
        d.signal = Some("constant(5)".into());
        d.period = Some("20ms".into());
        d.notify_every = every.map(str::to_string);
        c.devices.list.push(d);
    }
    let r = rig(c);
    let count = |path: &str, token: &[u8]| -> usize {
        let s = client(r.addr);
        s.send(&msg(
            MessageType::Non,
            Code::GET,
            9,
            token,
            path,
            &[(OptionNumber::OBSERVE, 0)],
            b"",
        ))
        .unwrap();
        let first = recv(&s);
        assert!(obs_of(&Packet::new_checked(&first[..]).unwrap()).is_some());
        // one second of notifications (a bounded number of reads)
        s.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let until = Instant::now() + Duration::from_secs(1);
        let mut got = 0;
        let mut b = [0u8; 512];
        while Instant::now() < until && got < 100 {
            if let Ok(n) = s.recv(&mut b) {
                let p = Packet::new_checked(&b[..n]).unwrap();
                if p.msg_type() == MessageType::Con {
                    s.send(&empty_message(MessageType::Ack, p.message_id()))
                        .unwrap();
                }
                assert_eq!(p.payload(), b"5");
                got += 1;
            }
        }
        got
    };
    let beat = count("sensors/beat", b"bt");
    let still = count("sensors/still", b"st");
    assert!((4..=15).contains(&beat), "about 10 a second, got {beat}");
    assert_eq!(
        still, 0,
        "a constant value without notify_every is not notified"
    );
    // a bad duration is refused by name
    let mut bad = DeviceSpec::new("bad", DeviceKind::SimSensor);
    bad.signal = Some("constant(1)".into());
    bad.notify_every = Some("soon".into());
    let e = match r.host.manager().add(bad) {
        Ok(_) => panic!("a bad notify_every was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("notify_every"), "{e}");
}
