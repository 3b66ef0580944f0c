//! The server endpoint's defences in virtual time: mintgate's
//! `Endpoint` runs in a simulated sensor node, and simulated observers and
//! flooders, block-wise fetchers and uploaders no one trusts talk to it
//! over simulated links.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mintgate_coap::server::observe::Ended;
use mintgate_coap::server::{EndpointConfig, Resource, Router};
use mintgate_coap::wire::{Code, ContentFormat, MessageType, MessageWriter, OptionNumber};

use super::coap::CoapServer;
use super::*;

fn addr(i: u32) -> SocketAddr {
    SocketAddr::from(([10, 0, (i >> 8) as u8, i as u8], 5683))
}

fn request(ty: MessageType, mid: u16, token: &[u8], observe: bool) -> Vec<u8> {
    let mut buf = [0u8; 64];
    let mut w = MessageWriter::new(&mut buf, ty, Code::GET, mid, token).unwrap();
    if observe {
        w.option(OptionNumber::OBSERVE, &[]).unwrap();
    }
    w.option(OptionNumber::URI_PATH, b"obs").unwrap();
    let n = w.finish();
    buf[..n].to_vec()
}

/// A sensor whose `/obs` changes every second: the endpoint notifies its
/// observers at each change.
struct Sensor {
    server: CoapServer,
    next_change: Option<Instant>,
}

impl Sensor {
    fn new(cfg: EndpointConfig) -> Sensor {
        let mut r = Router::new();
        r.add(Resource::new("obs").flag("obs").get(|_, rb| {
            rb.content_format(ContentFormat::TEXT_PLAIN)
                .static_payload(b"21.5");
        }))
        .unwrap();
        let cfg = EndpointConfig {
            handler_slots: 4,
            ..cfg
        };
        Sensor {
            server: CoapServer::with_config(r, Duration::ZERO, cfg),
            next_change: None,
        }
    }
}

impl App for Sensor {
    fn on_packet(&mut self, now: Instant, pkt: &Packet, out: &mut Vec<Send>) {
        self.server.on_packet(now, pkt, out);
    }
    fn on_timeout(&mut self, now: Instant, out: &mut Vec<Send>) {
        let next = *self.next_change.get_or_insert(now + Duration::from_secs(1));
        if now >= next {
            self.server.notify(now, "obs", out);
            self.next_change = Some(next + Duration::from_secs(1));
        }
        self.server.on_timeout(now, out);
    }
    fn next_timeout(&mut self) -> Option<Instant> {
        // before the start the first change is not known yet: ask for a
        // call at once
        let change = self.next_change?;
        Some(self.server.next_timeout().map_or(change, |s| s.min(change)))
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// What an observer does with notifications.
#[derive(Clone, Copy)]
enum Then {
    /// Acknowledges CON notifications until this long after its start,
    /// then says nothing more (it went away).
    AckFor(Duration),
    /// Answers the `n`th notification (CON or NON) with a Reset.
    ResetNth(usize),
}

struct Observer {
    server: SocketAddr,
    then: Then,
    started: Option<Instant>,
    notifications: Vec<Duration>,
}

impl App for Observer {
    fn on_start(&mut self, now: Instant, out: &mut Vec<Send>) {
        self.started = Some(now);
        out.push(Send {
            dst: self.server,
            bytes: request(MessageType::Con, 1, b"ob", true),
            after: Duration::ZERO,
            tag: 0,
        });
    }
    fn on_packet(&mut self, now: Instant, pkt: &Packet, out: &mut Vec<Send>) {
        let Ok(p) = mintgate_coap::wire::Packet::new_checked(&pkt.bytes[..]) else {
            return;
        };
        if p.option(OptionNumber::OBSERVE).is_none() || p.msg_type() == MessageType::Ack {
            return; // the registration's answer
        }
        let start = self.started.expect("started");
        self.notifications.push(now - start);
        let mid = p.message_id().to_be_bytes();
        let answer = match self.then {
            Then::AckFor(d) if now - start < d && p.msg_type() == MessageType::Con => {
                Some([0x60, 0, mid[0], mid[1]])
            }
            Then::ResetNth(n) if self.notifications.len() == n => Some([0x70, 0, mid[0], mid[1]]),
            _ => None,
        };
        if let Some(a) = answer {
            out.push(Send {
                dst: pkt.src,
                bytes: a.to_vec(),
                after: Duration::ZERO,
                tag: 0,
            });
        }
    }
    fn on_timeout(&mut self, _: Instant, _: &mut Vec<Send>) {}
    fn next_timeout(&mut self) -> Option<Instant> {
        None
    }
    /// Never: an observer listens until the run's limit.
    fn done(&self) -> bool {
        false
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

fn link() -> LinkConfig {
    LinkConfig::delay(Duration::from_millis(20))
}

/// A sensor and one observer; returns the simulator and both nodes.
fn observed(then: Then, cfg: EndpointConfig) -> (Sim, NodeId, NodeId) {
    let mut sim = Sim::new(7);
    let s = sim.add_node(addr(1), Some(Box::new(Sensor::new(cfg))));
    let o = sim.add_node(
        addr(2),
        Some(Box::new(Observer {
            server: addr(1),
            then,
            started: None,
            notifications: Vec::new(),
        })),
    );
    sim.connect(s, o, link());
    (sim, s, o)
}

fn sensor(sim: &Sim, s: NodeId) -> &CoapServer {
    &sim.app_as::<Sensor>(s).unwrap().server
}

#[test]
fn an_observer_that_goes_away_is_dropped_within_100_s() {
    let silent_from = Duration::from_secs(10);
    let (mut sim, s, o) = observed(Then::AckFor(silent_from), EndpointConfig::default());
    sim.run(Duration::from_secs(9));
    assert_eq!(sensor(&sim, s).endpoint().observers(), 1, "registered");
    sim.run(silent_from + Duration::from_secs(100));
    let ep = sensor(&sim, s).endpoint();
    assert_eq!(ep.observers(), 0, "relation still held 100 s after silence");
    assert_eq!(ep.stats().ended(Ended::Unacknowledged), 1);
    // and it stays over: nothing more reaches the departed client
    let heard = sim.app_as::<Observer>(o).unwrap().notifications.len();
    sim.run(Duration::from_secs(300));
    assert_eq!(
        sim.app_as::<Observer>(o).unwrap().notifications.len(),
        heard
    );
    let last = *sim
        .app_as::<Observer>(o)
        .unwrap()
        .notifications
        .last()
        .unwrap();
    assert!(last <= silent_from + Duration::from_secs(100), "{last:?}");
}

#[test]
fn a_reset_of_an_older_notification_ends_the_relation() {
    // every notification NON but the first: the Reset answers the second,
    // and by the time it arrives a third may have gone out
    let cfg = EndpointConfig {
        observe: mintgate_coap::server::observe::ObserveConfig {
            con_every: 1000,
            ..Default::default()
        },
        ..EndpointConfig::default()
    };
    let (mut sim, s, o) = observed(Then::ResetNth(2), cfg);
    sim.run(Duration::from_secs(30));
    let ep = sensor(&sim, s).endpoint();
    assert_eq!(ep.observers(), 0);
    assert_eq!(ep.stats().ended(Ended::Reset), 1);
    let got = sim.app_as::<Observer>(o).unwrap().notifications.len();
    assert!(got <= 3, "{got} notifications after a Reset of the 2nd");
}

/// Sends a NON GET with a new message ID every `every`, for 30 s.
struct Flooder {
    server: SocketAddr,
    every: Duration,
    until: Option<Instant>,
    next: Option<Instant>,
    mid: u16,
    sent: u64,
}

impl App for Flooder {
    fn on_start(&mut self, now: Instant, out: &mut Vec<Send>) {
        self.until = Some(now + Duration::from_secs(30));
        self.next = Some(now);
        self.on_timeout(now, out);
    }
    fn on_packet(&mut self, _: Instant, _: &Packet, _: &mut Vec<Send>) {}
    fn on_timeout(&mut self, now: Instant, out: &mut Vec<Send>) {
        while let Some(t) = self.next.filter(|t| *t <= now) {
            self.mid = self.mid.wrapping_add(1);
            self.sent += 1;
            out.push(Send {
                dst: self.server,
                bytes: request(MessageType::Non, self.mid, &self.mid.to_be_bytes(), false),
                after: Duration::ZERO,
                tag: 0,
            });
            let n = t + self.every;
            self.next = (Some(n) < self.until).then_some(n);
        }
    }
    fn next_timeout(&mut self) -> Option<Instant> {
        self.next
    }
    fn done(&self) -> bool {
        self.next.is_none()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[test]
fn a_flood_of_distinct_message_ids_keeps_the_tables_bounded() {
    let cfg = EndpointConfig {
        dedup_capacity: 1024,
        ..EndpointConfig::default()
    };
    let mut sim = Sim::new(11);
    let s = sim.add_node(addr(1), Some(Box::new(Sensor::new(cfg))));
    let sources = 32u32;
    for i in 0..sources {
        let f = sim.add_node(
            addr(100 + i),
            Some(Box::new(Flooder {
                server: addr(1),
                every: Duration::from_millis(5),
                until: None,
                next: None,
                mid: (i * 1000) as u16,
                sent: 0,
            })),
        );
        sim.connect(s, f, link());
    }
    // an observer that acknowledges throughout: still served at the end
    let o = sim.add_node(
        addr(2),
        Some(Box::new(Observer {
            server: addr(1),
            then: Then::AckFor(Duration::from_secs(3600)),
            started: None,
            notifications: Vec::new(),
        })),
    );
    sim.connect(s, o, link());
    let mut peak = server_size(&sim, s);
    for t in 1..=31 {
        sim.run(Duration::from_secs(t));
        let now = server_size(&sim, s);
        peak = (peak.0.max(now.0), peak.1.max(now.1), peak.2.max(now.2));
    }
    let sent: u64 = (0..sources as usize)
        .map(|i| sim.app_as::<Flooder>(i + 1).unwrap().sent)
        .sum();
    assert!(sent >= 190_000, "{sent} datagrams in the flood");
    assert!(sensor(&sim, s).stats().requests >= 190_000);
    // entries, expiry-queue slots and bytes stay within the capacity
    // (16 shards, each a sixteenth, rounded up), whatever the flood
    let (entries, queued, bytes) = peak;
    assert!(entries <= 1024, "{entries} entries");
    assert!(queued <= 2 * 1024 + 16 * 64, "{queued} queue slots");
    assert!(bytes <= 1024 * 1280, "{bytes} bytes");
    let heard = sim.app_as::<Observer>(o).unwrap().notifications.len();
    assert!(
        heard >= 29,
        "the observer heard {heard} of 30 notifications"
    );
}

/// The de-duplication tables' entries, queue slots and bytes.
fn server_size(sim: &Sim, s: NodeId) -> (usize, usize, usize) {
    let (z, _) = sensor(sim, s).endpoint().dedup_summary();
    (z.entries, z.queued, z.bytes)
}

/// The per-source cap, over simulated links: three observers on one host
/// (one address, three ports) and one on another, with at most two
/// relations per source. The third from the busy host is answered without
/// Observe and hears no notifications; the other host is not held back.
#[test]
fn one_host_cannot_take_more_than_its_share_of_relations() {
    let cfg = EndpointConfig {
        observe: mintgate_coap::server::observe::ObserveConfig {
            max_per_source: 2,
            ..Default::default()
        },
        ..EndpointConfig::default()
    };
    let mut sim = Sim::new(11);
    let s = sim.add_node(addr(1), Some(Box::new(Sensor::new(cfg))));
    let busy = SocketAddr::from(([10, 0, 0, 2], 0));
    let from: Vec<SocketAddr> = (0..3u16)
        .map(|i| SocketAddr::new(busy.ip(), 40_000 + i))
        .chain(std::iter::once(addr(3)))
        .collect();
    let nodes: Vec<NodeId> = from
        .iter()
        .map(|&a| {
            let o = sim.add_node(
                a,
                Some(Box::new(Observer {
                    server: addr(1),
                    then: Then::AckFor(Duration::from_secs(3600)),
                    started: None,
                    notifications: Vec::new(),
                })),
            );
            sim.connect(s, o, link());
            o
        })
        .collect();
    sim.run(Duration::from_secs(20));
    assert_eq!(sensor(&sim, s).endpoint().observers(), 3, "2 + 1");
    let heard: Vec<usize> = nodes
        .iter()
        .map(|&n| sim.app_as::<Observer>(n).unwrap().notifications.len())
        .collect();
    assert_eq!(heard.iter().filter(|&&h| h == 0).count(), 1, "{heard:?}");
    assert!(heard[3] >= 15, "the other host is served: {heard:?}");
}

/// A server with a 900-byte `/big` and a `/up` that takes uploads (the
/// answer says how many bytes arrived), on the endpoint `cfg` configures.
fn store_server(cfg: EndpointConfig) -> CoapServer {
    let mut r = Router::new();
    r.add(Resource::new("big").get(|_, rb| {
        rb.content_format(ContentFormat::TEXT_PLAIN)
            .static_payload(&[b'x'; 900]);
    }))
    .unwrap();
    r.add(Resource::new("up").put(|req, rb| {
        let n = req.packet.payload().len().to_string();
        rb.set_code(Code::CHANGED).write(n.as_bytes());
    }))
    .unwrap();
    CoapServer::with_config(r, Duration::ZERO, cfg)
}

/// Builds a CON request: `path`, then the other options (any order).
fn con(
    code: Code,
    mid: u16,
    token: &[u8],
    path: &str,
    opts: &[(OptionNumber, Vec<u8>)],
    body: &[u8],
) -> Vec<u8> {
    let mut buf = vec![0u8; 1500];
    let mut w = MessageWriter::new(&mut buf, MessageType::Con, code, mid, token).unwrap();
    let mut all: Vec<(OptionNumber, Vec<u8>)> = path
        .split('/')
        .map(|s| (OptionNumber::URI_PATH, s.as_bytes().to_vec()))
        .chain(opts.iter().cloned())
        .collect();
    all.sort_by_key(|(n, _)| *n);
    for (n, v) in &all {
        w.option(*n, v).unwrap();
    }
    if !body.is_empty() {
        w.payload(body).unwrap();
    }
    let n = w.finish();
    buf.truncate(n);
    buf
}

fn uint(v: u32) -> Vec<u8> {
    let b = v.to_be_bytes();
    let skip = b.iter().take_while(|x| **x == 0).count();
    b[skip..].to_vec()
}

/// GETs `/big` block by block (RFC 7959 2.4: the next block at the size
/// the server answered with). With `echo` it does what RFC 9175 2.3 asks
/// of a client given an Echo option: it repeats the request with it (from
/// the start, as libcoap and mintgate's client do). Keeps each exchange's
/// (request, answer) sizes.
struct Fetcher {
    server: SocketAddr,
    echo: bool,
    token: Vec<u8>,
    mid: u16,
    body: Vec<u8>,
    done: bool,
    last_request: usize,
    exchanges: Vec<(usize, usize)>,
}

impl Fetcher {
    fn new(server: SocketAddr, echo: bool, token: &[u8]) -> Fetcher {
        Fetcher {
            server,
            echo,
            token: token.to_vec(),
            mid: 0,
            body: Vec::new(),
            done: false,
            last_request: 0,
            exchanges: Vec::new(),
        }
    }

    fn ask(&mut self, opts: &[(OptionNumber, Vec<u8>)], out: &mut Vec<Send>) {
        self.mid += 1;
        let bytes = con(Code::GET, self.mid, &self.token, "big", opts, &[]);
        self.last_request = bytes.len();
        out.push(Send {
            dst: self.server,
            bytes,
            after: Duration::ZERO,
            tag: 0,
        });
    }
}

impl App for Fetcher {
    fn on_start(&mut self, _: Instant, out: &mut Vec<Send>) {
        self.ask(&[], out);
    }
    fn on_packet(&mut self, _: Instant, pkt: &Packet, out: &mut Vec<Send>) {
        let Ok(p) = mintgate_coap::wire::Packet::new_checked(&pkt.bytes[..]) else {
            return;
        };
        assert_eq!(p.code(), Code::CONTENT, "{:?}", p.code());
        self.exchanges.push((self.last_request, pkt.bytes.len()));
        if let (true, Some(e)) = (self.echo, p.option(OptionNumber::ECHO)) {
            // repeat with the Echo, from the start
            let e = e.value.to_vec();
            self.body.clear();
            self.ask(&[(OptionNumber::ECHO, e)], out);
            return;
        }
        let block = p
            .option(OptionNumber::BLOCK2)
            .and_then(|o| mintgate_coap::server::block::BlockOpt::decode(o.uint()?));
        match block {
            Some(b) => {
                assert_eq!(b.num as usize * b.size(), self.body.len(), "block order");
                self.body.extend_from_slice(p.payload());
                if b.more {
                    let next = mintgate_coap::server::block::BlockOpt {
                        num: b.num + 1,
                        more: false,
                        szx: b.szx,
                    };
                    self.ask(&[(OptionNumber::BLOCK2, uint(next.encode()))], out);
                } else {
                    self.done = true;
                }
            }
            None => {
                self.body = p.payload().to_vec();
                self.done = true;
            }
        }
    }
    fn on_timeout(&mut self, _: Instant, _: &mut Vec<Send>) {}
    fn next_timeout(&mut self) -> Option<Instant> {
        None
    }
    fn done(&self) -> bool {
        self.done
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Anti-amplification over simulated links: a client that never answers
/// Echo gets all of `/big` in blocks each within 3x its request; a client
/// that repeats the Echo is verified by that one round trip and gets the
/// rest whole in the next answer.
///
/// When the Echo comes depends on the request's size: a block of 16 bytes
/// with a 12-byte Echo takes 39 bytes with a 2-byte token, more than 3 x a
/// 10-byte GET, so such a client gets bare blocks until one with room for
/// the Echo (here the last, 4-byte, one); with an 8-byte token (libcoap's
/// default) the first block carries it.
#[test]
fn unverified_clients_get_answers_within_3x_and_an_echo_round_trip_verifies() {
    let mut sim = Sim::new(5);
    let s = sim.add_node(
        addr(1),
        Some(Box::new(store_server(EndpointConfig::default()))),
    );
    let clients = [
        (false, &b"fe"[..]),
        (true, &b"fe"[..]),
        (true, &b"libcoap8"[..]),
    ];
    let nodes: Vec<NodeId> = clients
        .iter()
        .enumerate()
        .map(|(i, &(echo, token))| {
            let n = sim.add_node(
                addr(2 + i as u32),
                Some(Box::new(Fetcher::new(addr(1), echo, token))),
            );
            sim.connect(s, n, link());
            n
        })
        .collect();
    sim.run(Duration::from_secs(10));
    let f = |i: usize| sim.app_as::<Fetcher>(nodes[i]).unwrap();

    for i in 0..clients.len() {
        assert!(f(i).done, "client {i} finished");
        assert_eq!(f(i).body, vec![b'x'; 900], "client {i}");
    }
    // the plain client: every answer within 3x
    let plain = &f(0).exchanges;
    assert!(plain.len() > 1, "{plain:?}");
    for &(req, ans) in plain {
        assert!(ans <= 3 * req, "{ans} > 3 x {req}: {plain:?}");
    }
    // the echoing ones: within 3x until the Echo came back, then whole
    for i in [1, 2] {
        let ex = &f(i).exchanges;
        let (last_req, last_ans) = *ex.last().unwrap();
        assert!(
            last_ans > 900 && last_ans > 3 * last_req,
            "client {i}: {ex:?}"
        );
        for &(req, ans) in &ex[..ex.len() - 1] {
            assert!(ans <= 3 * req, "client {i}: {ans} > 3 x {req}: {ex:?}");
        }
    }
    assert!(
        f(1).exchanges.len() <= plain.len() + 1,
        "{:?}",
        f(1).exchanges
    );
    assert_eq!(
        f(2).exchanges.len(),
        2,
        "the first block carried the Echo: {:?}",
        f(2).exchanges
    );

    let ep = sim.app_as::<CoapServer>(s).unwrap().endpoint();
    assert_eq!(ep.verified_addresses(), 2, "the two echoing clients");
    let cut = ep
        .stats()
        .amplification_blocks
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(cut >= plain.len() as u64, "{cut} answers cut to a block");
}

/// Uploads a body to `/up` in 1024-byte blocks (RFC 7959 2.5, with a
/// Request-Tag, RFC 9175 3), the next block when the last was answered
/// 2.31. A `stall` uploader never sends its last block and, when its
/// transfer is evicted (4.08), starts another: it holds what it can of the
/// budget for as long as it runs. Keeps every answer's code.
struct Uploader {
    server: SocketAddr,
    body: Vec<u8>,
    stall: bool,
    start: Duration,
    pace: Duration,
    mid: u16,
    tag: u32,
    next: u32,
    codes: Vec<Code>,
    finished: bool,
}

impl Uploader {
    fn new(
        server: SocketAddr,
        size: usize,
        stall: bool,
        start: Duration,
        pace: Duration,
        first_mid: u16,
    ) -> Uploader {
        Uploader {
            server,
            body: (0..size).map(|i| i as u8).collect(),
            stall,
            start,
            pace,
            mid: first_mid,
            tag: u32::from(first_mid),
            next: 0,
            codes: Vec::new(),
            finished: false,
        }
    }

    fn send_block(&mut self, after: Duration, out: &mut Vec<Send>) {
        let blocks = self.body.len().div_ceil(1024) as u32;
        if self.stall && self.next + 1 >= blocks {
            return; // never the last one
        }
        let from = self.next as usize * 1024;
        let to = (from + 1024).min(self.body.len());
        let b = mintgate_coap::server::block::BlockOpt {
            num: self.next,
            more: to < self.body.len(),
            szx: 6,
        };
        self.mid = self.mid.wrapping_add(1);
        let bytes = con(
            Code::PUT,
            self.mid,
            &self.tag.to_be_bytes(),
            "up",
            &[
                (OptionNumber::BLOCK1, uint(b.encode())),
                (OptionNumber::SIZE1, uint(self.body.len() as u32)),
                (OptionNumber::REQUEST_TAG, self.tag.to_be_bytes().to_vec()),
            ],
            &self.body[from..to],
        );
        out.push(Send {
            dst: self.server,
            bytes,
            after,
            tag: 0,
        });
    }
}

impl App for Uploader {
    fn on_start(&mut self, _: Instant, out: &mut Vec<Send>) {
        self.send_block(self.start, out);
    }
    fn on_packet(&mut self, _: Instant, pkt: &Packet, out: &mut Vec<Send>) {
        let Ok(p) = mintgate_coap::wire::Packet::new_checked(&pkt.bytes[..]) else {
            return;
        };
        self.codes.push(p.code());
        match p.code() {
            Code::CONTINUE => {
                self.next += 1;
                self.send_block(self.pace, out);
            }
            Code::CHANGED => {
                assert_eq!(p.payload(), self.body.len().to_string().as_bytes());
                self.finished = true;
            }
            Code::REQUEST_ENTITY_INCOMPLETE if self.stall => {
                // evicted: another transfer, under a new tag
                self.tag = self.tag.wrapping_add(1 << 16);
                self.next = 0;
                self.send_block(self.pace, out);
            }
            _ => {}
        }
    }
    fn on_timeout(&mut self, _: Instant, _: &mut Vec<Send>) {}
    fn next_timeout(&mut self) -> Option<Instant> {
        None
    }
    fn done(&self) -> bool {
        self.finished
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Block1 starvation over simulated links: eight uploaders on one host
/// keep a 32 KiB reassembly budget full of transfers they never finish;
/// an upload from a quiet host that starts 5 s later is never refused and
/// completes, the busy host's transfers making room for it.
#[test]
fn an_upload_from_a_quiet_source_gets_through_a_budget_held_by_a_heavy_one() {
    use mintgate_coap::server::Block1Config;
    let cfg = EndpointConfig {
        block1: Block1Config {
            max_bytes: 32 << 10,
            per_source_bytes: 32 << 10,
            max_transfers: 64,
            per_peer: 8,
            ..Block1Config::default()
        },
        ..EndpointConfig::default()
    };
    let mut sim = Sim::new(9);
    let s = sim.add_node(addr(1), Some(Box::new(store_server(cfg))));
    let busy = SocketAddr::from(([10, 0, 0, 2], 0));
    let heavy: Vec<NodeId> = (0..8u16)
        .map(|i| {
            let n = sim.add_node(
                SocketAddr::new(busy.ip(), 40_000 + i),
                Some(Box::new(Uploader::new(
                    addr(1),
                    16 << 10,
                    true,
                    Duration::ZERO,
                    Duration::from_millis(50),
                    1000 * i,
                ))),
            );
            sim.connect(s, n, link());
            n
        })
        .collect();
    let quiet = sim.add_node(
        addr(3),
        Some(Box::new(Uploader::new(
            addr(1),
            6000,
            false,
            Duration::from_secs(5),
            Duration::ZERO,
            50_000,
        ))),
    );
    sim.connect(s, quiet, link());
    let mut peak = 0;
    let mut before_quiet = None;
    for t in 1..=20 {
        sim.run(Duration::from_secs(t));
        let (st, _, bytes) = sim.app_as::<CoapServer>(s).unwrap().endpoint().block1();
        peak = peak.max(bytes);
        if t == 5 {
            before_quiet = Some((st, bytes));
        }
    }
    let (st5, bytes5) = before_quiet.unwrap();
    assert!(
        bytes5 > 24 << 10,
        "the heavy host holds the budget: {bytes5} bytes"
    );
    assert!(peak <= 32 << 10, "{peak} bytes held");
    let q = sim.app_as::<Uploader>(quiet).unwrap();
    assert!(q.finished, "the quiet upload completed: {:?}", q.codes);
    assert!(
        !q.codes.contains(&Code::SERVICE_UNAVAILABLE),
        "the quiet source was refused: {:?}",
        q.codes
    );
    let (st, _, _) = sim.app_as::<CoapServer>(s).unwrap().endpoint().block1();
    assert!(st.evicted_heaviest > st5.evicted_heaviest, "{st:?}");
    // the heavy host went on trying throughout
    let tries: usize = heavy
        .iter()
        .map(|&n| sim.app_as::<Uploader>(n).unwrap().codes.len())
        .sum();
    assert!(tries > 100, "{tries} answers to the heavy host");
}
