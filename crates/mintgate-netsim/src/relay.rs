//! A real UDP impairment relay: `client <-> relay <-> server` on loopback.
//!
//! Clients send to the relay's listening address; for each client the relay
//! opens its own upstream socket towards the server (so the server sees one
//! peer per client and its answers find their way back). Each direction has
//! its own loss model and its own delay (`delay ± jitter`, uniform; jitter can
//! reorder, as on a real path). Everything is counted per direction.
//!
//! Delayed datagrams leave when a `timerfd` armed for the earliest one
//! fires: epoll's own timeout is whole milliseconds (rounded up), which
//! would add up to 1 ms to every delay and make sub-millisecond links
//! meaningless.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::net::UdpSocket;
use mio::{Events, Interest, Poll, Token};

use crate::loss::LossModel;

/// Most clients the relay keeps a mapping for; more are dropped and counted.
pub const MAX_CLIENTS: usize = 4096;

/// What the relay does to each direction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Impairment {
    /// Loss rate, 0..=1.
    pub loss: f64,
    /// Mean burst length of losses (1 = independent).
    pub burst: f64,
    /// One-way delay.
    pub delay: Duration,
    /// Uniform jitter around the delay (`delay ± jitter`, never below 0).
    pub jitter: Duration,
}

/// Relay configuration.
#[derive(Clone, Copy, Debug)]
pub struct RelayConfig {
    /// Where clients send.
    pub listen: SocketAddr,
    /// The server.
    pub forward: SocketAddr,
    /// Client to server.
    pub up: Impairment,
    /// Server to client.
    pub down: Impairment,
    /// Seed of the loss and jitter draws.
    pub seed: u64,
}

/// Counters of one direction.
#[derive(Debug, Default)]
pub struct DirectionStats {
    /// Datagrams received on this direction.
    pub received: AtomicU64,
    /// Datagrams dropped by the loss model.
    pub dropped: AtomicU64,
    /// Datagrams delivered.
    pub forwarded: AtomicU64,
    /// Datagrams that could not be sent or had no mapping.
    pub errors: AtomicU64,
}

/// Counters of both directions.
#[derive(Debug, Default)]
pub struct RelayStats {
    /// Client to server.
    pub up: DirectionStats,
    /// Server to client.
    pub down: DirectionStats,
}

/// A running relay; dropping it stops it.
pub struct Relay {
    addr: SocketAddr,
    stats: Arc<RelayStats>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Relay {
    /// Binds `cfg.listen` and starts relaying.
    pub fn start(cfg: RelayConfig) -> io::Result<Relay> {
        let listener = UdpSocket::bind(cfg.listen)?;
        let addr = listener.local_addr()?;
        let stats = Arc::new(RelayStats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (stats.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("netem".into())
            .spawn(move || {
                if let Err(e) = run(cfg, listener, &s, &st) {
                    tracing::error!(error = %e, "relay stopped");
                }
            })?;
        Ok(Relay {
            addr,
            stats,
            stop,
            thread: Some(thread),
        })
    }

    /// The listening address (with the port chosen for `:0`).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The counters.
    pub fn stats(&self) -> &RelayStats {
        &self.stats
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Where a delayed datagram leaves from.
enum Out {
    /// From the listening socket to a client.
    Listener(SocketAddr),
    /// From client `i`'s upstream socket to the server.
    Upstream(usize),
}

struct Pending {
    due: Instant,
    seq: u64,
    out: Out,
    data: Vec<u8>,
}

impl PartialEq for Pending {
    fn eq(&self, o: &Self) -> bool {
        (self.due, self.seq) == (o.due, o.seq)
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Pending {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.due, self.seq).cmp(&(o.due, o.seq))
    }
}

fn delay_of(imp: &Impairment, model: &mut LossModel) -> Duration {
    if imp.jitter.is_zero() {
        return imp.delay;
    }
    let d = imp.delay.as_secs_f64() + imp.jitter.as_secs_f64() * model.symmetric();
    Duration::from_secs_f64(d.max(0.0))
}

const LISTENER: Token = Token(usize::MAX);
/// Receive errors in a row one wake-up reads past before giving up on a
/// socket until its next event (an error that repeats must not spin).
const MAX_ERRORS_PER_WAKE: u32 = 64;
const TIMER: Token = Token(usize::MAX - 1);

/// A one-shot monotonic timer with nanosecond resolution, pollable by mio.
struct Timer {
    fd: std::os::fd::OwnedFd,
}

impl Timer {
    fn new() -> io::Result<Timer> {
        use std::os::fd::FromRawFd;
        // SAFETY: plain syscall; a non-negative result is a new descriptor
        // that we own from here on.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nobody else.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        Ok(Timer { fd })
    }

    /// Fires once, `after` from now (at least 1 ns: zero would disarm it).
    fn arm(&self, after: Duration) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let after = after.max(Duration::from_nanos(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: after.as_secs() as libc::time_t,
                tv_nsec: after.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: valid descriptor and a fully initialised itimerspec.
        let r =
            unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Consumes an expiry so that the descriptor stops being readable.
    fn clear(&self) {
        use std::os::fd::AsRawFd;
        let mut n = 0u64;
        // SAFETY: reads at most 8 bytes into a u64; errors (EAGAIN) ignored.
        unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                (&mut n as *mut u64).cast(),
                std::mem::size_of::<u64>(),
            );
        }
    }
}

fn run(
    cfg: RelayConfig,
    mut listener: UdpSocket,
    stats: &RelayStats,
    stop: &AtomicBool,
) -> io::Result<()> {
    let mut poll = Poll::new()?;
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)?;
    let timer = Timer::new()?;
    {
        use std::os::fd::AsRawFd;
        poll.registry().register(
            &mut mio::unix::SourceFd(&timer.fd.as_raw_fd()),
            TIMER,
            Interest::READABLE,
        )?;
    }
    let mut up_model = LossModel::new(cfg.up.loss, cfg.up.burst, cfg.seed);
    let mut down_model = LossModel::new(cfg.down.loss, cfg.down.burst, cfg.seed.wrapping_add(1));
    let mut clients: Vec<(SocketAddr, UdpSocket)> = Vec::new();
    let mut by_addr: HashMap<SocketAddr, usize> = HashMap::new();
    let mut heap: BinaryHeap<Reverse<Pending>> = BinaryHeap::new();
    let mut events = Events::with_capacity(256);
    let mut buf = vec![0u8; 65_536];
    let mut seq = 0u64;
    let bind_any: SocketAddr = if cfg.forward.is_ipv6() {
        "[::]:0".parse().expect("literal")
    } else {
        "0.0.0.0:0".parse().expect("literal")
    };
    // when the timer is set to fire: re-armed only when the earliest
    // datagram changes, not on every wake-up
    let mut armed: Option<Instant> = None;
    while !stop.load(Relaxed) {
        if let Some(Reverse(p)) = heap.peek() {
            if armed != Some(p.due) {
                timer.arm(p.due.saturating_duration_since(Instant::now()))?;
                armed = Some(p.due);
            }
        }
        // the timeout only bounds how long a stop request waits
        match poll.poll(&mut events, Some(Duration::from_millis(50))) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        for ev in events.iter() {
            if ev.token() == TIMER {
                timer.clear();
                armed = None;
            } else if ev.token() == LISTENER {
                let mut errors = 0;
                loop {
                    let (n, from) = match listener.recv_from(&mut buf) {
                        Ok(x) => x,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        // an error is reported once (e.g. an ICMP one); the
                        // datagrams queued behind it are still to be read:
                        // mio's events are edge-triggered
                        Err(_) if errors < MAX_ERRORS_PER_WAKE => {
                            errors += 1;
                            stats.up.errors.fetch_add(1, Relaxed);
                            continue;
                        }
                        Err(_) => break,
                    };
                    stats.up.received.fetch_add(1, Relaxed);
                    let idx = match by_addr.get(&from) {
                        Some(i) => *i,
                        None if clients.len() < MAX_CLIENTS => {
                            let mut s = UdpSocket::bind(bind_any)?;
                            s.connect(cfg.forward)?;
                            let i = clients.len();
                            poll.registry()
                                .register(&mut s, Token(i), Interest::READABLE)?;
                            clients.push((from, s));
                            by_addr.insert(from, i);
                            i
                        }
                        None => {
                            stats.up.errors.fetch_add(1, Relaxed);
                            continue;
                        }
                    };
                    if up_model.lose() {
                        stats.up.dropped.fetch_add(1, Relaxed);
                        continue;
                    }
                    seq += 1;
                    let due = Instant::now() + delay_of(&cfg.up, &mut up_model);
                    heap.push(Reverse(Pending {
                        due,
                        seq,
                        out: Out::Upstream(idx),
                        data: buf[..n].to_vec(),
                    }));
                }
            } else {
                let i = ev.token().0;
                let Some((client, sock)) = clients.get(i) else {
                    continue;
                };
                let client = *client;
                let mut errors = 0;
                loop {
                    let n = match sock.recv(&mut buf) {
                        Ok(n) => n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        // e.g. the server's port was closed for a moment
                        // (ICMP): count, and read what is queued behind it
                        Err(_) if errors < MAX_ERRORS_PER_WAKE => {
                            errors += 1;
                            stats.down.errors.fetch_add(1, Relaxed);
                            continue;
                        }
                        Err(_) => break,
                    };
                    stats.down.received.fetch_add(1, Relaxed);
                    if down_model.lose() {
                        stats.down.dropped.fetch_add(1, Relaxed);
                        continue;
                    }
                    seq += 1;
                    let due = Instant::now() + delay_of(&cfg.down, &mut down_model);
                    heap.push(Reverse(Pending {
                        due,
                        seq,
                        out: Out::Listener(client),
                        data: buf[..n].to_vec(),
                    }));
                }
            }
        }
        let now = Instant::now();
        while heap.peek().is_some_and(|Reverse(p)| p.due <= now) {
            let Some(Reverse(p)) = heap.pop() else { break };
            let (sent, dir) = match p.out {
                Out::Upstream(i) => (clients[i].1.send(&p.data), &stats.up),
                Out::Listener(to) => (listener.send_to(&p.data, to), &stats.down),
            };
            match sent {
                Ok(_) => dir.forwarded.fetch_add(1, Relaxed),
                Err(_) => dir.errors.fetch_add(1, Relaxed),
            };
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn echo_server() -> (std::net::UdpSocket, SocketAddr) {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let a = s.local_addr().unwrap();
        let s2 = s.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut b = [0u8; 2048];
            s2.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            while let Ok((n, from)) = s2.recv_from(&mut b) {
                let _ = s2.send_to(&b[..n], from);
            }
        });
        (s, a)
    }

    fn relay(forward: SocketAddr, loss: f64, delay: Duration) -> Relay {
        let imp = Impairment {
            loss,
            burst: 1.0,
            delay,
            jitter: Duration::ZERO,
        };
        Relay::start(RelayConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            forward,
            up: imp,
            down: imp,
            seed: 5,
        })
        .unwrap()
    }

    #[test]
    fn forwards_both_ways_with_the_configured_delay() {
        let (_srv, addr) = echo_server();
        let r = relay(addr, 0.0, Duration::from_millis(40));
        let c = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let t = Instant::now();
        c.send_to(b"ping", r.local_addr()).unwrap();
        let mut b = [0u8; 16];
        let (n, from) = c.recv_from(&mut b).unwrap();
        let rtt = t.elapsed();
        assert_eq!((&b[..n], from), (&b"ping"[..], r.local_addr()));
        assert!(rtt >= Duration::from_millis(80), "two 40 ms legs: {rtt:?}");
        assert_eq!(r.stats().up.forwarded.load(Relaxed), 1);
        // counted just after the send: the answer can arrive first
        let end = Instant::now() + Duration::from_secs(2);
        while r.stats().down.forwarded.load(Relaxed) == 0 && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(r.stats().down.forwarded.load(Relaxed), 1);
    }

    #[test]
    fn a_sub_millisecond_delay_is_kept_not_rounded_up_to_a_millisecond() {
        let (_srv, addr) = echo_server();
        let r = relay(addr, 0.0, Duration::from_micros(200));
        let c = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut rtts = Vec::new();
        for i in 0..20u8 {
            let t = Instant::now();
            c.send_to(&[i], r.local_addr()).unwrap();
            let mut b = [0u8; 4];
            let (n, _) = c.recv_from(&mut b).unwrap();
            rtts.push(t.elapsed());
            assert_eq!(&b[..n], &[i]);
        }
        let min = *rtts.iter().min().unwrap();
        assert!(
            min >= Duration::from_micros(400),
            "two 200 us legs: {rtts:?}"
        );
        // epoll's millisecond timeout would make each leg at least 1 ms;
        // 1.5 ms of slack for wake-ups on a busy machine
        assert!(min < Duration::from_micros(1900), "{rtts:?}");
    }

    #[test]
    fn drops_about_the_configured_share_in_each_direction_and_counts_it() {
        let (_srv, addr) = echo_server();
        let r = relay(addr, 0.2, Duration::ZERO);
        let c = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        c.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        // read while sending: the client's own buffer holds only ~270 datagrams
        let reader = {
            let c = c.try_clone().unwrap();
            std::thread::spawn(move || {
                let (mut got, mut b) = (0u64, [0u8; 16]);
                while c.recv_from(&mut b).is_ok() {
                    got += 1;
                }
                got
            })
        };
        let n = 2000;
        for i in 0..n {
            c.send_to(&(i as u32).to_be_bytes(), r.local_addr())
                .unwrap();
            if i % 20 == 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        let got = reader.join().unwrap();
        let s = r.stats();
        let ratio =
            |d: &DirectionStats| d.dropped.load(Relaxed) as f64 / d.received.load(Relaxed) as f64;
        assert!(s.up.received.load(Relaxed) > 1500, "{:?}", s.up);
        assert!((ratio(&s.up) - 0.2).abs() < 0.04, "up {}", ratio(&s.up));
        assert!(
            (ratio(&s.down) - 0.2).abs() < 0.05,
            "down {}",
            ratio(&s.down)
        );
        // what the server answered and survived the way back is what arrived
        assert_eq!(s.down.forwarded.load(Relaxed), got);
    }
}
