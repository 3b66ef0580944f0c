//! An impaired IP link between two network namespaces, for TCP and UDP
//! alike (this machine has no netem).
//!
//! Two new network namespaces, "client" and "server", each get a TUN device
//! (`mgc0` with 10.77.0.1, `mgs0` with 10.77.0.2, point to point). A relay
//! thread reads every IP packet one TUN device delivers and writes it into
//! the other after the direction's delay, unless the loss model drops it.
//! So the kernels' real TCP (handshake, retransmission timers, congestion
//! control, tail-loss probes) and QUIC over real UDP see the same path.
//!
//! What it models: one-way delay `delay ± jitter` (uniform) and independent
//! (or bursty) loss per packet, in each direction, seeded. Packets of a
//! direction leave in the order they came (jitter varies the delay but does
//! not reorder; a real path rarely reorders and a reordering relay would
//! punish TCP's duplicate-ACK logic for an artefact). What it does not:
//! bandwidth limits and queueing (packets are never held for a rate),
//! reordering, duplication, MTU below 1500, or ECN.
//!
//! Sockets belong to the namespace of the thread that creates them, so the
//! caller runs code "in" a namespace with [`ImpairedLink::spawn_in`]: the
//! server side binds its listeners there, the client side runs its whole
//! request loop there. Needs CAP_SYS_ADMIN and CAP_NET_ADMIN (root) and
//! `/dev/net/tun`; [`ImpairedLink::start`] says why when it cannot.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mintgate_netsim::loss::LossModel;

/// The client namespace's address.
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
/// The server namespace's address.
pub const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);

/// What the link does to each direction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkImpairment {
    /// One-way delay.
    pub delay: Duration,
    /// Uniform jitter around it (never below zero).
    pub jitter: Duration,
    /// Loss rate per packet, 0..=1.
    pub loss: f64,
}

/// Counters of one direction.
#[derive(Debug, Default)]
pub struct LinkDirStats {
    /// Packets read from the sending side.
    pub packets: AtomicU64,
    /// Packets dropped by the loss model.
    pub dropped: AtomicU64,
}

/// Both directions' counters.
#[derive(Debug, Default)]
pub struct LinkStats {
    /// Client to server.
    pub up: LinkDirStats,
    /// Server to client.
    pub down: LinkDirStats,
}

/// The running link; dropping it stops the relay (the namespaces go away
/// with the last socket in them).
pub struct ImpairedLink {
    client_ns: Arc<OwnedFd>,
    server_ns: Arc<OwnedFd>,
    stats: Arc<LinkStats>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const SIOCGIFFLAGS: libc::c_ulong = 0x8913;
const SIOCSIFFLAGS: libc::c_ulong = 0x8914;
const SIOCSIFADDR: libc::c_ulong = 0x8916;
const SIOCSIFDSTADDR: libc::c_ulong = 0x8918;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;

#[repr(C)]
struct IfReqFlags {
    name: [u8; 16],
    flags: libc::c_short,
    _pad: [u8; 22],
}

#[repr(C)]
struct IfReqAddr {
    name: [u8; 16],
    addr: libc::sockaddr_in,
    _pad: [u8; 8],
}

fn name16(n: &str) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..n.len().min(15)].copy_from_slice(&n.as_bytes()[..n.len().min(15)]);
    b
}

fn cvt(r: libc::c_int, what: &str) -> io::Result<()> {
    if r < 0 {
        let e = io::Error::last_os_error();
        Err(io::Error::new(e.kind(), format!("{what}: {e}")))
    } else {
        Ok(())
    }
}

fn sockaddr(ip: Ipv4Addr) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// In the calling thread: a new network namespace with `lo` up and a TUN
/// device `name` with `local` and the point-to-point peer `peer`. Returns
/// the namespace handle and the TUN file descriptor (non-blocking).
fn make_namespace(name: &str, local: Ipv4Addr, peer: Ipv4Addr) -> io::Result<(OwnedFd, OwnedFd)> {
    // SAFETY: plain syscalls on this thread; every pointer is to a live local.
    unsafe {
        cvt(
            libc::unshare(libc::CLONE_NEWNET),
            "unshare(CLONE_NEWNET) (needs root)",
        )?;
        let ns = libc::open(
            c"/proc/thread-self/ns/net".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        );
        cvt(ns, "opening /proc/thread-self/ns/net")?;
        let ns = OwnedFd::from_raw_fd(ns);
        let tun = libc::open(
            c"/dev/net/tun".as_ptr(),
            libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
        );
        cvt(tun, "opening /dev/net/tun")?;
        let tun = OwnedFd::from_raw_fd(tun);
        let mut req = IfReqFlags {
            name: name16(name),
            flags: IFF_TUN | IFF_NO_PI,
            _pad: [0; 22],
        };
        cvt(
            libc::ioctl(tun.as_raw_fd(), TUNSETIFF as _, &mut req),
            "TUNSETIFF",
        )?;
        let s = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        cvt(s, "socket")?;
        let s = OwnedFd::from_raw_fd(s);
        for (dev, up_only) in [("lo", true), (name, false)] {
            if !up_only {
                let mut a = IfReqAddr {
                    name: name16(dev),
                    addr: sockaddr(local),
                    _pad: [0; 8],
                };
                cvt(
                    libc::ioctl(s.as_raw_fd(), SIOCSIFADDR as _, &mut a),
                    "SIOCSIFADDR",
                )?;
                let mut d = IfReqAddr {
                    name: name16(dev),
                    addr: sockaddr(peer),
                    _pad: [0; 8],
                };
                cvt(
                    libc::ioctl(s.as_raw_fd(), SIOCSIFDSTADDR as _, &mut d),
                    "SIOCSIFDSTADDR",
                )?;
            }
            let mut f = IfReqFlags {
                name: name16(dev),
                flags: 0,
                _pad: [0; 22],
            };
            cvt(
                libc::ioctl(s.as_raw_fd(), SIOCGIFFLAGS as _, &mut f),
                "SIOCGIFFLAGS",
            )?;
            f.flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            cvt(
                libc::ioctl(s.as_raw_fd(), SIOCSIFFLAGS as _, &mut f),
                "SIOCSIFFLAGS",
            )?;
        }
        Ok((ns, tun))
    }
}

/// Moves the calling thread into the namespace `ns`.
fn enter(ns: &OwnedFd) -> io::Result<()> {
    // SAFETY: setns on a namespace fd we own; affects this thread only.
    cvt(
        unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) },
        "setns",
    )
}

impl ImpairedLink {
    /// Creates the namespaces and starts the relay with `up` (client to
    /// server) and `down` impairments.
    pub fn start(up: LinkImpairment, down: LinkImpairment, seed: u64) -> io::Result<ImpairedLink> {
        let make = |name: &'static str, local, peer| {
            std::thread::spawn(move || make_namespace(name, local, peer))
                .join()
                .map_err(|_| io::Error::other("namespace thread panicked"))?
        };
        let (client_ns, client_tun) = make("mgc0", CLIENT_IP, SERVER_IP)?;
        let (server_ns, server_tun) = make("mgs0", SERVER_IP, CLIENT_IP)?;
        let stats = Arc::new(LinkStats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp) = (stats.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("tun-relay".into())
            .spawn(move || relay(client_tun, server_tun, up, down, seed, &st, &sp))?;
        Ok(ImpairedLink {
            client_ns: Arc::new(client_ns),
            server_ns: Arc::new(server_ns),
            stats,
            stop,
            thread: Some(thread),
        })
    }

    /// Runs `f` on a new thread inside the client (`server == false`) or
    /// server namespace and returns its handle.
    pub fn spawn_in<T: Send + 'static>(
        &self,
        server: bool,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> io::Result<JoinHandle<io::Result<T>>> {
        let ns = if server {
            self.server_ns.clone()
        } else {
            self.client_ns.clone()
        };
        std::thread::Builder::new()
            .name(if server { "ns-server" } else { "ns-client" }.into())
            .spawn(move || {
                enter(&ns)?;
                Ok(f())
            })
    }

    /// The counters.
    pub fn stats(&self) -> &LinkStats {
        &self.stats
    }
}

impl Drop for ImpairedLink {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Dir {
    queue: std::collections::VecDeque<(Instant, Vec<u8>)>,
    last_due: Instant,
    imp: LinkImpairment,
    model: LossModel,
}

impl Dir {
    fn due(&mut self, now: Instant) -> Instant {
        let d =
            self.imp.delay.as_secs_f64() + self.imp.jitter.as_secs_f64() * self.model.symmetric();
        let due = now + Duration::from_secs_f64(d.max(0.0));
        // In order: never before the packet ahead of it.
        let due = due.max(self.last_due);
        self.last_due = due;
        due
    }
}

fn relay(
    client: OwnedFd,
    server: OwnedFd,
    up: LinkImpairment,
    down: LinkImpairment,
    seed: u64,
    stats: &LinkStats,
    stop: &AtomicBool,
) {
    let now = Instant::now();
    let mut dirs = [
        Dir {
            queue: Default::default(),
            last_due: now,
            imp: up,
            model: LossModel::new(up.loss, 1.0, seed),
        },
        Dir {
            queue: Default::default(),
            last_due: now,
            imp: down,
            model: LossModel::new(down.loss, 1.0, seed.rotate_left(29) ^ 0x9e37),
        },
    ];
    let fds: [RawFd; 2] = [client.as_raw_fd(), server.as_raw_fd()];
    let dstats = [&stats.up, &stats.down];
    let mut buf = vec![0u8; 65536];
    while !stop.load(Relaxed) {
        let now = Instant::now();
        // Deliver what is due: direction 0 goes into the server's TUN.
        for (i, d) in dirs.iter_mut().enumerate() {
            while d.queue.front().is_some_and(|(due, _)| *due <= now) {
                if let Some((_, p)) = d.queue.pop_front() {
                    // SAFETY: writing a buffer we own to an fd we own.
                    let _ = unsafe { libc::write(fds[1 - i], p.as_ptr().cast(), p.len()) };
                }
            }
        }
        let next = dirs
            .iter()
            .filter_map(|d| d.queue.front().map(|(t, _)| *t))
            .min();
        let wait_ms = match next {
            Some(t) => t
                .saturating_duration_since(Instant::now())
                .as_micros()
                .div_ceil(1000) as i32,
            None => 50,
        }
        .clamp(0, 50);
        let mut pfd = [
            libc::pollfd {
                fd: fds[0],
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: fds[1],
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfds.
        let n = unsafe { libc::poll(pfd.as_mut_ptr(), 2, wait_ms) };
        if n <= 0 {
            continue;
        }
        for i in 0..2 {
            if pfd[i].revents & libc::POLLIN == 0 {
                continue;
            }
            // Drain what this side has (bounded per round).
            for _ in 0..256 {
                // SAFETY: reading into a buffer we own.
                let r = unsafe { libc::read(fds[i], buf.as_mut_ptr().cast(), buf.len()) };
                if r <= 0 {
                    break;
                }
                dstats[i].packets.fetch_add(1, Relaxed);
                let d = &mut dirs[i];
                if d.model.lose() {
                    dstats[i].dropped.fetch_add(1, Relaxed);
                    continue;
                }
                let due = d.due(Instant::now());
                d.queue.push_back((due, buf[..r as usize].to_vec()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// TCP and UDP both cross the link with its delay; skipped without root.
    #[test]
    fn tcp_and_udp_cross_with_delay() {
        let imp = LinkImpairment {
            delay: Duration::from_millis(20),
            jitter: Duration::ZERO,
            loss: 0.0,
        };
        let link = match ImpairedLink::start(imp, imp, 1) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("skipping: cannot create network namespaces here: {e}");
                return;
            }
        };
        let server = link
            .spawn_in(true, || {
                let l = std::net::TcpListener::bind((SERVER_IP, 7001)).unwrap();
                let u = std::net::UdpSocket::bind((SERVER_IP, 7002)).unwrap();
                (l, u)
            })
            .unwrap()
            .join()
            .unwrap()
            .unwrap();
        let (listener, udp) = server;
        let echo = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut b = [0u8; 5];
            s.read_exact(&mut b).unwrap();
            s.write_all(&b).unwrap();
            let mut ub = [0u8; 16];
            let (n, from) = udp.recv_from(&mut ub).unwrap();
            udp.send_to(&ub[..n], from).unwrap();
        });
        let rtts = link
            .spawn_in(false, || {
                let t0 = Instant::now();
                let mut s = std::net::TcpStream::connect((SERVER_IP, 7001)).unwrap();
                let connect = t0.elapsed();
                s.write_all(b"hello").unwrap();
                let mut b = [0u8; 5];
                s.read_exact(&mut b).unwrap();
                assert_eq!(&b, b"hello");
                let u = std::net::UdpSocket::bind((CLIENT_IP, 0)).unwrap();
                let t1 = Instant::now();
                u.send_to(b"ping", (SERVER_IP, 7002)).unwrap();
                let mut ub = [0u8; 16];
                u.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let (n, _) = u.recv_from(&mut ub).unwrap();
                assert_eq!(&ub[..n], b"ping");
                (connect, t1.elapsed())
            })
            .unwrap()
            .join()
            .unwrap()
            .unwrap();
        echo.join().unwrap();
        // A round trip is two one-way delays of 20 ms.
        assert!(
            rtts.0 >= Duration::from_millis(39),
            "TCP connect took {:?}",
            rtts.0
        );
        assert!(
            rtts.1 >= Duration::from_millis(39),
            "UDP round trip took {:?}",
            rtts.1
        );
        assert!(link.stats().up.packets.load(Relaxed) >= 4);
    }
}
