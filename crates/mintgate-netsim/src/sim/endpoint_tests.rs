//! The server endpoint's defences in virtual time: mintgate's
//! `Endpoint` runs in a simulated sensor node, and simulated observers and
//! flooders no one trusts talk to it over simulated links.

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
