//! A real TCP delay relay: `client <-> relay <-> server` on loopback.
//!
//! It models a network link in front of a TCP server (an MQTT broker, an
//! HTTP server): every accepted connection gets its own connection to the
//! server, and the bytes of each direction are held for that direction's
//! one-way delay, then written in the order they were read. A half-close is
//! delayed like data, so the far side sees the end of the stream when it
//! would have on the modelled link.
//!
//! Invariants:
//! - bytes are never reordered or duplicated, and dropped only when the
//!   side they are going to has gone (TCP's own guarantee; loss on a TCP
//!   path shows up as delay, so the relay models delay only);
//! - each direction holds at most 256 reads (`HELD_CHUNKS`): a receiver
//!   that stops reading stops the sender, as TCP's flow control would;
//! - a chunk leaves no earlier than `delay` after it was read; how much
//!   later is the sleep's overshoot (tens of microseconds on Linux, where
//!   the writer threads ask for a 1 us timer slack);
//! - Nagle is off on both legs: the relay adds the configured delay, not
//!   the kernel's coalescing.
//!
//! Each connection runs four blocking threads (a reader and a writer per
//! direction), which keeps the timing exact without a timer wheel; this is
//! a test and lab tool for tens of connections, not a load balancer.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Relay configuration.
#[derive(Clone, Copy, Debug)]
pub struct TcpRelayConfig {
    /// Where clients connect.
    pub listen: SocketAddr,
    /// The server.
    pub forward: SocketAddr,
    /// One-way delay, client to server.
    pub up: Duration,
    /// One-way delay, server to client.
    pub down: Duration,
}

/// Counters of one direction.
#[derive(Debug, Default)]
pub struct TcpDirectionStats {
    /// Bytes read on this direction.
    pub bytes: AtomicU64,
    /// Reads (chunks) held and forwarded.
    pub chunks: AtomicU64,
}

/// Counters of the relay.
#[derive(Debug, Default)]
pub struct TcpRelayStats {
    /// Client connections accepted and joined to the server.
    pub connections: AtomicU64,
    /// Client connections closed because the server could not be reached.
    pub refused: AtomicU64,
    /// Client to server.
    pub up: TcpDirectionStats,
    /// Server to client.
    pub down: TcpDirectionStats,
}

/// A running TCP relay; dropping it closes every connection and stops it.
///
/// Each connection holds 4 threads and 10 descriptors (the two sockets and
/// their clones), so a default limit of 1,024 descriptors allows about 100
/// connections at once.
pub struct TcpRelay {
    addr: SocketAddr,
    stats: Arc<TcpRelayStats>,
    stop: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
    thread: Option<JoinHandle<()>>,
}

impl TcpRelay {
    /// Binds `cfg.listen` and starts relaying.
    pub fn start(cfg: TcpRelayConfig) -> io::Result<TcpRelay> {
        let listener = TcpListener::bind(cfg.listen)?;
        let addr = listener.local_addr()?;
        let stats = Arc::new(TcpRelayStats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let open = Arc::new(Mutex::new(Vec::new()));
        let (s, st, o) = (stats.clone(), stop.clone(), open.clone());
        let thread = std::thread::Builder::new()
            .name("netem-tcp".into())
            .spawn(move || accept_loop(cfg, listener, &s, &st, &o))?;
        Ok(TcpRelay {
            addr,
            stats,
            stop,
            open,
            thread: Some(thread),
        })
    }

    /// The listening address (with the port chosen for `:0`).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The counters.
    pub fn stats(&self) -> &TcpRelayStats {
        &self.stats
    }
}

impl Drop for TcpRelay {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        // wake the blocking accept; it sees `stop` and returns
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        for s in self
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

fn accept_loop(
    cfg: TcpRelayConfig,
    listener: TcpListener,
    stats: &Arc<TcpRelayStats>,
    stop: &Arc<AtomicBool>,
    open: &Arc<Mutex<Vec<TcpStream>>>,
) {
    for client in listener.incoming() {
        if stop.load(Relaxed) {
            return;
        }
        let client = match client {
            Ok(c) => c,
            Err(e) => {
                // e.g. out of descriptors: the connection stays queued, so
                // pause instead of spinning on it
                tracing::warn!(error = %e, "netem tcp: accept failed");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        // Connecting to the server happens on the connection's own thread,
        // so that a server that does not answer holds up only its client.
        let (stats, stop, open) = (stats.clone(), stop.clone(), open.clone());
        let spawned = std::thread::Builder::new()
            .name("netem-tcp-conn".into())
            .spawn(move || connect(cfg, client, &stats, &stop, &open));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "netem tcp: no thread for a connection");
        }
    }
}

/// Joins one client to a new connection to the server, or closes it.
fn connect(
    cfg: TcpRelayConfig,
    client: TcpStream,
    stats: &Arc<TcpRelayStats>,
    stop: &AtomicBool,
    open: &Arc<Mutex<Vec<TcpStream>>>,
) {
    let server = match TcpStream::connect_timeout(&cfg.forward, Duration::from_secs(5)) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, forward = %cfg.forward, "netem tcp: server unreachable");
            stats.refused.fetch_add(1, Relaxed);
            // the client's connection was accepted; it now sees the end of
            // the stream (or a reset if it had sent something)
            return;
        }
    };
    let (c, s) = (client.try_clone(), server.try_clone());
    match join(cfg, client, server, stats, stop, open) {
        Ok(()) => {
            stats.connections.fetch_add(1, Relaxed);
        }
        Err(e) => {
            tracing::warn!(error = %e, "netem tcp: could not start a connection");
            // whatever part of it started, end it: no half-relayed client
            for sock in [c, s].into_iter().flatten() {
                let _ = sock.shutdown(Shutdown::Both);
            }
        }
    }
}

/// Starts the two directions of one relayed connection.
fn join(
    cfg: TcpRelayConfig,
    client: TcpStream,
    server: TcpStream,
    stats: &Arc<TcpRelayStats>,
    stop: &AtomicBool,
    open: &Arc<Mutex<Vec<TcpStream>>>,
) -> io::Result<()> {
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    {
        let mut o = open.lock().unwrap_or_else(|e| e.into_inner());
        // checked under the lock the relay's Drop takes after setting it:
        // a connection is either closed by Drop or never started
        if stop.load(Relaxed) {
            return Err(io::Error::other("the relay is stopping"));
        }
        // forget connections that have finished (both legs closed); this
        // runs per new connection, so an idle relay keeps the last ones
        o.retain(|s| s.peer_addr().is_ok());
        o.push(client.try_clone()?);
        o.push(server.try_clone()?);
    }
    let st = stats.clone();
    pipe(
        "up",
        client.try_clone()?,
        server.try_clone()?,
        cfg.up,
        move |n| count(&st.up, n),
    )?;
    let st = stats.clone();
    pipe("down", server, client, cfg.down, move |n| {
        count(&st.down, n)
    })?;
    Ok(())
}

fn count(d: &TcpDirectionStats, n: usize) {
    d.bytes.fetch_add(n as u64, Relaxed);
    d.chunks.fetch_add(1, Relaxed);
}

/// Chunks one direction holds at most (each up to 64 KiB): when the far
/// side reads slower than the near side writes, the reader stops reading
/// and TCP's flow control reaches the sender, as on a real link.
const HELD_CHUNKS: usize = 256;

/// One direction: a reader stamps each chunk with when it may leave, a
/// writer sends it then.
///
/// The end of the stream, or a read error (a reset), is forwarded after the
/// delay as a write shutdown, behind the data held before it. When writing
/// fails (the far side is gone) the writer stops reading this direction
/// (shutting its source's read side); the other direction goes on
/// delivering what it holds, so a last answer before a close is not lost.
fn pipe(
    name: &str,
    mut from: TcpStream,
    mut to: TcpStream,
    delay: Duration,
    on_chunk: impl Fn(usize) + Send + 'static,
) -> io::Result<()> {
    let (tx, rx) = mpsc::sync_channel::<(Instant, Vec<u8>)>(HELD_CHUNKS);
    let from_r = from.try_clone()?;
    std::thread::Builder::new()
        .name(format!("netem-tcp-{name}-r"))
        .spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match from.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        on_chunk(n);
                        if tx
                            .send((Instant::now() + delay, buf[..n].to_vec()))
                            .is_err()
                        {
                            return; // the writer has stopped: nothing to forward
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            // end of stream: the writer forwards it once the delay has run
            let _ = tx.send((Instant::now() + delay, Vec::new()));
        })?;
    std::thread::Builder::new()
        .name(format!("netem-tcp-{name}-w"))
        .spawn(move || {
            fine_timer_slack();
            while let Ok((due, data)) = rx.recv() {
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                if data.is_empty() {
                    let _ = to.shutdown(Shutdown::Write);
                    return;
                }
                if to.write_all(&data).is_err() {
                    // the reader sees the end of its stream and stops
                    let _ = from_r.shutdown(Shutdown::Read);
                    return;
                }
            }
        })?;
    Ok(())
}

/// Asks the kernel to wake this thread's sleeps within 1 us of their end
/// (the default slack is 50 us, which would show on sub-millisecond links).
fn fine_timer_slack() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and only changes
    // the calling thread's timer slack.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1_000 as libc::c_ulong, 0, 0, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that echoes each connection until the client closes.
    fn echo_server() -> SocketAddr {
        echo_server_n(8)
    }

    /// The same for `n` connections.
    fn echo_server_n(n: usize) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for s in l.incoming().take(n) {
                let Ok(mut s) = s else { continue };
                std::thread::spawn(move || {
                    let mut r = s.try_clone().unwrap();
                    let _ = io::copy(&mut r, &mut s);
                    let _ = s.shutdown(Shutdown::Write);
                });
            }
        });
        a
    }

    fn relay(forward: SocketAddr, up: Duration, down: Duration) -> TcpRelay {
        TcpRelay::start(TcpRelayConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            forward,
            up,
            down,
        })
        .unwrap()
    }

    #[test]
    fn a_round_trip_takes_both_delays_and_no_more_than_a_little_over() {
        let r = relay(
            echo_server(),
            Duration::from_millis(15),
            Duration::from_millis(25),
        );
        let mut c = TcpStream::connect(r.local_addr()).unwrap();
        c.set_nodelay(true).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut rtts = Vec::new();
        for i in 0..5u8 {
            let t = Instant::now();
            c.write_all(&[i; 10]).unwrap();
            let mut b = [0u8; 10];
            c.read_exact(&mut b).unwrap();
            rtts.push(t.elapsed());
            assert_eq!(b, [i; 10]);
        }
        let min = *rtts.iter().min().unwrap();
        assert!(min >= Duration::from_millis(40), "15 + 25 ms: {rtts:?}");
        // a loaded machine can stretch one round trip, not every one
        assert!(min < Duration::from_millis(60), "{rtts:?}");
        assert_eq!(r.stats().connections.load(Relaxed), 1);
        assert_eq!(r.stats().up.bytes.load(Relaxed), 50);
        assert_eq!(r.stats().down.bytes.load(Relaxed), 50);
    }

    #[test]
    fn a_large_stream_arrives_whole_and_in_order_and_the_close_follows_it() {
        let r = relay(echo_server(), Duration::from_millis(2), Duration::ZERO);
        let c = TcpStream::connect(r.local_addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let data: Vec<u8> = (0..2_000_000u32).map(|i| (i % 251) as u8).collect();
        let mut w = c.try_clone().unwrap();
        let sent = data.clone();
        let writer = std::thread::spawn(move || {
            w.write_all(&sent).unwrap();
            w.shutdown(Shutdown::Write).unwrap();
        });
        let mut back = Vec::new();
        (&c).read_to_end(&mut back).unwrap(); // ends only on the relayed close
        writer.join().unwrap();
        assert_eq!(back.len(), data.len());
        assert!(back == data, "bytes changed or reordered");
    }

    #[test]
    fn an_answer_held_on_the_link_survives_the_server_closing_under_an_upload() {
        // the server answers after 4 bytes and closes while the client is
        // still sending (an HTTP 413, a broker refusing a client)
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let fwd = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut b = [0u8; 4];
            s.read_exact(&mut b).unwrap();
            s.write_all(b"413").unwrap();
            std::thread::sleep(Duration::from_millis(10));
        });
        let r = relay(fwd, Duration::from_millis(20), Duration::from_millis(20));
        let c = TcpStream::connect(r.local_addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut w = c.try_clone().unwrap();
        let uploader = std::thread::spawn(move || {
            for _ in 0..500 {
                if w.write_all(&[7u8; 1024]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        let mut got = Vec::new();
        let _ = (&c).read_to_end(&mut got);
        assert_eq!(got, b"413", "the held answer was lost");
        drop(c);
        uploader.join().unwrap();
    }

    #[test]
    fn a_server_that_stops_reading_stops_the_client_not_the_relays_memory() {
        // a server that accepts and never reads
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let fwd = l.local_addr().unwrap();
        let hold = std::thread::spawn(move || {
            let s = l.accept().unwrap();
            std::thread::sleep(Duration::from_secs(4));
            drop(s);
        });
        let r = relay(fwd, Duration::ZERO, Duration::ZERO);
        let mut c = TcpStream::connect(r.local_addr()).unwrap();
        c.set_write_timeout(Some(Duration::from_secs(1))).unwrap();
        let chunk = vec![1u8; 1 << 20];
        let mut sent = 0usize;
        while sent < 200 << 20 && c.write_all(&chunk).is_ok() {
            sent += chunk.len();
        }
        let held = r.stats().up.bytes.load(Relaxed);
        assert!(sent < 200 << 20, "the client never had to wait");
        // at most HELD_CHUNKS reads of 64 KiB in the relay, plus what is
        // waiting in the server's receive buffer
        assert!(held < ((HELD_CHUNKS as u64) << 16) + (32 << 20), "{held}");
        drop(c);
        drop(r);
        hold.join().unwrap();
    }

    #[test]
    fn an_unreachable_server_closes_the_client_and_is_counted() {
        // a port that was free a moment ago: nothing listens there
        let gone = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let r = relay(gone, Duration::ZERO, Duration::ZERO);
        let mut c = TcpStream::connect(r.local_addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 1];
        let n = c.read(&mut b).unwrap_or(0);
        assert_eq!(n, 0, "the relay must close a client it cannot join");
        assert_eq!(r.stats().refused.load(Relaxed), 1);
        assert_eq!(r.stats().connections.load(Relaxed), 0);
    }

    #[test]
    fn finished_connections_do_not_keep_descriptors() {
        let r = relay(echo_server_n(40), Duration::ZERO, Duration::ZERO);
        for _ in 0..30 {
            let mut c = TcpStream::connect(r.local_addr()).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            c.write_all(b"x").unwrap();
            c.shutdown(Shutdown::Write).unwrap();
            let mut b = Vec::new();
            c.read_to_end(&mut b).unwrap(); // the server's close, relayed
            assert_eq!(b, b"x");
        }
        // the next connection forgets the finished ones and their
        // descriptors: its own two sockets stay, and at most the previous
        // connection's if its last ACK is still on the way (a leak: 62)
        let end = Instant::now() + Duration::from_secs(5);
        let _c = TcpStream::connect(r.local_addr()).unwrap();
        while r.stats().connections.load(Relaxed) < 31 && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(10));
        }
        let kept = r.open.lock().unwrap().len();
        assert!((2..=4).contains(&kept), "{kept} sockets kept");
    }

    #[test]
    fn dropping_the_relay_closes_its_connections() {
        let r = relay(echo_server(), Duration::ZERO, Duration::ZERO);
        let mut c = TcpStream::connect(r.local_addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.write_all(b"x").unwrap();
        let mut b = [0u8; 1];
        c.read_exact(&mut b).unwrap();
        drop(r);
        assert_eq!(
            c.read(&mut b).unwrap_or(0),
            0,
            "open after the relay stopped"
        );
    }
}
