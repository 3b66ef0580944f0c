//! A lean CoAP load generator, driven by `mintgate bench` and by the labs.
//!
//! [`run`] sends `GET path` to one server from many logical clients and
//! measures throughput and latency:
//!
//! - **Clients are real**: each has its own UDP socket and so its own source
//!   port, connected to the target (the kernel drops datagrams from anyone
//!   else). The soft RLIMIT_NOFILE is raised to the hard limit first; more
//!   clients than that allows is an error ([`LoadError::TooManyClients`]).
//!   Or, with [`LoadSpec::shared_socket`] against an IPv4 loopback server,
//!   each client has a loopback address of its own (127.1.0.1 onwards) and
//!   the clients of a worker thread share one socket: one endpoint per
//!   client as the server sees it, batched system calls across clients.
//! - **Closed loop** ([`Mode::Closed`]): every client keeps `window` requests
//!   outstanding, sending a new one as soon as one is answered or times out.
//!   This finds the server's capacity.
//! - **Open loop** ([`Mode::Open`]): every client sends `rate_per_client`
//!   requests per second on a fixed schedule whatever the responses (the
//!   clients' phases are spread evenly), as in the paper's benchmark (10/s
//!   per client, 1 to 10,000 clients). This measures latency at a given
//!   offered load. Sends are issued with the poll's millisecond resolution;
//!   latency is measured from the actual send.
//! - **No retransmission**, for CON as for NON: a request not answered within
//!   `timeout` counts as lost and its slot is reused (with a new token, so a
//!   late answer is recognised and counted in `unmatched`, not as a
//!   response). CON responses may be piggybacked or separate (an empty ACK,
//!   then a CON or NON response, which is acknowledged); a Reset completes the
//!   request as an error.
//! - **Lean**: `threads` worker threads each own a share of the clients, one
//!   mio poll, and a slot table allocated up front. Requests are preformatted
//!   once and patched with message ID and token per send; responses are read
//!   and requests sent with `recvmmsg`/`sendmmsg`; nothing allocates per
//!   request. Latency is timed from a timestamp kept per outstanding request.
//! - **Over TCP** ([`Transport::Tcp`], RFC 8323): each client is one
//!   connection that sends its CSM and waits for the server's, then keeps
//!   `window` requests outstanding, matched by token (closed loop only).
//! - **With OSCORE** ([`run_protected`], RFC 8613): every request is
//!   protected under its client's security context and every answer
//!   verified; one that does not verify counts as an error.
//! - **Bounded**: sending stops at `warmup + duration`; the run then drains
//!   until every request is answered or timed out, at most `timeout` more.
//!
//! [`probe`] times single CON GETs with RFC 7252 retransmissions from a
//! source of their own, to see whether a loaded server still answers.
//!
//! Accounting: `sent`, `received`, `lost`, `errors` and the latency
//! percentiles cover the requests *sent* during the measured period (after
//! the warm-up); every one of them is either received or lost by the end, so
//! `received + lost == sent`. `requests_per_sec` and `per_second` count the
//! successful (2.xx) responses that *arrived* during the measured period.

mod histogram;
mod oscore;
pub mod probe;
mod schedule;
mod slots;
mod sys;
mod tcp;
mod template;
mod worker;

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use mintgate_coap::oscore::Context;
use tcp::TcpWorker;
use worker::{ClientIo, Counts, Driver, Live, Offload, Outcome, Timing, Worker};

pub use histogram::Histogram;
use schedule::Schedule;
use template::RequestTemplate;

/// How the clients pace their requests.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mode {
    /// Each of `clients` keeps `window` (1..=65536) requests outstanding.
    Closed {
        /// Logical clients, each with its own socket.
        clients: usize,
        /// Requests outstanding per client.
        window: usize,
    },
    /// Each of `clients` sends `rate_per_client` requests per second.
    Open {
        /// Logical clients, each with its own socket.
        clients: usize,
        /// Requests per second per client (positive, finite).
        rate_per_client: f64,
    },
}

impl Mode {
    /// Logical clients.
    pub fn clients(&self) -> usize {
        match *self {
            Mode::Closed { clients, .. } | Mode::Open { clients, .. } => clients,
        }
    }
}

/// How requests reach the server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Transport {
    /// CoAP over UDP (RFC 7252), NON or CON.
    #[default]
    Udp,
    /// CoAP over TCP (RFC 8323): one connection per client, closed loop
    /// only; the options for UDP (CON, GSO, GRO, a shared socket) do not
    /// apply.
    Tcp,
}

/// What load to put on which server.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadSpec {
    /// The server.
    pub target: SocketAddr,
    /// UDP or TCP.
    pub transport: Transport,
    /// The resource to GET, e.g. `/request`.
    pub path: String,
    /// CON (true) or NON requests.
    pub confirmable: bool,
    /// Pacing.
    pub mode: Mode,
    /// Measured period.
    pub duration: Duration,
    /// Load before the measured period, not counted.
    pub warmup: Duration,
    /// After this a request counts as lost.
    pub timeout: Duration,
    /// Worker threads (at least 1; at most one per client).
    pub threads: usize,
    /// Send each client's batch as one UDP GSO train (`UDP_SEGMENT`): the
    /// server gets the same datagrams, but back to back in its socket at
    /// once (burst arrivals) instead of one by one. Off by default; falls
    /// back to `sendmmsg` where the kernel has no UDP GSO.
    pub gso: bool,
    /// Receive with UDP GRO (`UDP_GRO`): a train of equal responses the
    /// server sent with `UDP_SEGMENT` arrives as one message, which the
    /// generator splits itself, instead of being split by the kernel on
    /// delivery and read datagram by datagram. Responses sent one by one
    /// (every server without segmentation offload) arrive exactly as without
    /// it. Lowers the generator's own CPU per response and the delivery
    /// work on loopback; falls back silently where the kernel lacks it.
    pub gro: bool,
    /// The clients of each worker thread share one UDP socket, each sending
    /// from a loopback address of its own (127.1.0.1, 127.1.0.2, ...; set
    /// per datagram with `IP_PKTINFO`) instead of from a socket and port of
    /// its own. The server still sees one endpoint per client, but the
    /// generator reads and writes the datagrams of many clients per system
    /// call, which costs it much less CPU when many clients have few
    /// requests outstanding each. Needs an IPv4 loopback target; the shared
    /// socket listens on the wildcard address (answers from anyone but the
    /// target are counted as unmatched).
    pub shared_socket: bool,
}

impl LoadSpec {
    /// NON requests for 10 s after 1 s of warm-up, 2 s timeout, one thread.
    pub fn new(target: SocketAddr, path: impl Into<String>, mode: Mode) -> LoadSpec {
        LoadSpec {
            target,
            transport: Transport::Udp,
            path: path.into(),
            confirmable: false,
            mode,
            duration: Duration::from_secs(10),
            warmup: Duration::from_secs(1),
            timeout: Duration::from_secs(2),
            threads: 1,
            gso: false,
            gro: false,
            shared_socket: false,
        }
    }

    /// Slots per client: the most requests a client can have outstanding.
    fn slots_per_client(&self) -> Result<usize, LoadError> {
        let cap = match self.mode {
            Mode::Closed { window, .. } => window as f64,
            // Sends within one timeout, plus slack for the schedule's rounding.
            Mode::Open {
                rate_per_client, ..
            } => (rate_per_client * self.timeout.as_secs_f64()).ceil() + 2.0,
        };
        if !(1.0..=65536.0).contains(&cap) {
            return Err(LoadError::Invalid(format!(
                "{cap} requests outstanding per client: must be 1 to 65536 \
                 (window, or rate x timeout in open loop)"
            )));
        }
        Ok(cap as usize)
    }

    fn validate(&self) -> Result<(), LoadError> {
        let bad = |m: &str| Err(LoadError::Invalid(m.to_string()));
        if self.mode.clients() == 0 {
            return bad("at least one client is needed");
        }
        if let Mode::Open {
            rate_per_client, ..
        } = self.mode
        {
            if !(rate_per_client.is_finite() && rate_per_client > 0.0) {
                return bad("the rate per client must be a positive number");
            }
        }
        if self.duration.is_zero() {
            return bad("the duration must be positive");
        }
        if self.timeout.is_zero() {
            return bad("the timeout must be positive");
        }
        if self.shared_socket {
            match self.target {
                SocketAddr::V4(t) if t.ip().is_loopback() => {}
                _ => {
                    return bad(
                        "a shared socket needs an IPv4 loopback target (127.0.0.0/8): \
                         its clients send from loopback addresses of their own",
                    )
                }
            }
            if self.gso {
                return bad("GSO trains need a socket per client, not a shared socket");
            }
            if self.mode.clients() > SHARED_MAX_CLIENTS {
                return bad("a shared socket has loopback addresses for at most 1,000,000 clients");
            }
        }
        if self.target.port() == 0 {
            return bad("the target port must not be 0");
        }
        if self.transport == Transport::Tcp {
            if !matches!(self.mode, Mode::Closed { .. }) {
                return bad("over TCP the load is a closed loop only (a window, not a rate)");
            }
            if self.confirmable || self.gso || self.gro || self.shared_socket {
                return bad(
                    "CON, GSO, GRO and a shared socket are for UDP: over TCP there are none",
                );
            }
        }
        Ok(())
    }
}

/// Why a run could not start or went wrong.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The spec is inconsistent.
    #[error("invalid load: {0}")]
    Invalid(String),
    /// The path does not fit a request.
    #[error("cannot format the request: {0}")]
    Path(mintgate_coap::wire::WriteError),
    /// One socket per client exceeds the file-descriptor limit.
    #[error(
        "{clients} clients need {needed} file descriptors but the limit is {limit} \
         (raise the hard limit, e.g. `ulimit -Hn`, or use fewer clients)"
    )]
    TooManyClients {
        /// Clients asked for.
        clients: usize,
        /// Descriptors needed.
        needed: u64,
        /// The soft limit after raising it to the hard limit.
        limit: u64,
    },
    /// A system call failed.
    #[error("{0}: {1}")]
    Io(&'static str, std::io::Error),
    /// A worker thread panicked.
    #[error("a load-generator thread panicked")]
    WorkerPanicked,
}

/// Phase of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Load is on, not yet measured.
    Warmup,
    /// Load is on and measured.
    Measure,
    /// Sending stopped; waiting for the last answers or timeouts.
    Drain,
}

/// A snapshot for a progress display, delivered about every 200 ms and once
/// at the end. Counters are those of the measured period so far (zero during
/// the warm-up).
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    /// Since the load started.
    pub elapsed: Duration,
    /// `warmup + duration`.
    pub total: Duration,
    /// Where the run is.
    pub phase: Phase,
    /// Requests sent.
    pub sent: u64,
    /// Responses received.
    pub received: u64,
    /// Requests timed out.
    pub lost: u64,
    /// Non-2.xx responses, Resets and answers that did not verify.
    pub errors: u64,
    /// 2.xx responses per second since the previous snapshot.
    pub rate: f64,
}

/// Latency of the measured requests that got a response (any code).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Latency {
    /// Median.
    pub p50: Duration,
    /// 90th percentile.
    pub p90: Duration,
    /// 99th percentile.
    pub p99: Duration,
    /// 99.9th percentile.
    pub p999: Duration,
    /// Largest.
    pub max: Duration,
    /// Mean.
    pub mean: Duration,
}

/// The result of a run. See the crate docs for what each counter covers;
/// `received + lost == sent` and `errors <= received` always hold.
#[derive(Clone, Debug)]
pub struct LoadReport {
    /// Requests sent during the measured period.
    pub sent: u64,
    /// Of those, answered (any code, or a Reset) within the timeout.
    pub received: u64,
    /// Of those, not answered within the timeout.
    pub lost: u64,
    /// Of the received, answers that were not 2.xx (including Resets, and
    /// with OSCORE those that did not verify).
    pub errors: u64,
    /// With OSCORE: of the errors, answers that did not verify or decrypt
    /// (an unprotected refusal such as 4.01 counts here too).
    pub undecryptable: u64,
    /// Datagrams that matched no outstanding request: late answers after a
    /// timeout, duplicates, or not CoAP responses to us.
    pub unmatched: u64,
    /// Open loop: scheduled sends not made because the client already had
    /// the most requests outstanding or its socket buffer was full.
    pub skipped: u64,
    /// Failed system calls on the sockets (e.g. connection refused), TCP
    /// connections that failed or closed, and OSCORE requests that could
    /// not be protected.
    pub io_errors: u64,
    /// With [`LoadSpec::gro`]: datagrams (warm-up included) that arrived
    /// inside a coalesced train of several; always 0 without it.
    pub in_trains: u64,
    /// Successful (2.xx) responses per second during the measured period.
    pub requests_per_sec: f64,
    /// Successful responses in each second of the measured period.
    pub per_second: Vec<u64>,
    /// Latency percentiles.
    pub latency: Latency,
    /// The measured period.
    pub measured: Duration,
    /// Wall time of the whole run (warm-up, measure, drain).
    pub wall: Duration,
    /// CPU time the worker threads used: the generator's own cost.
    pub generator_cpu: Duration,
}

impl LoadReport {
    /// Share of the sent requests that were lost (0 when none was sent).
    pub fn loss_ratio(&self) -> f64 {
        if self.sent == 0 {
            0.0
        } else {
            self.lost as f64 / self.sent as f64
        }
    }

    /// Cores the generator kept busy on average (CPU time / wall time).
    pub fn generator_cores(&self) -> f64 {
        let w = self.wall.as_secs_f64();
        if w > 0.0 {
            self.generator_cpu.as_secs_f64() / w
        } else {
            0.0
        }
    }
}

/// Descriptors kept free for the process besides one socket per client.
const FD_MARGIN: u64 = 64;
/// How often `progress` is called.
const PROGRESS_EVERY: Duration = Duration::from_millis(200);

/// Runs the load described by `spec`, calling `progress` about every 200 ms
/// and once at the end; returns when the run is over (after at most
/// `warmup + duration + timeout` plus set-up).
pub fn run<F: FnMut(&Progress)>(spec: &LoadSpec, progress: F) -> Result<LoadReport, LoadError> {
    run_protected(spec, Vec::new(), progress)
}

/// Like [`run`], every request protected with OSCORE (RFC 8613) and every
/// answer verified, unless `contexts` is empty (UDP only). Worker thread
/// `t` takes contexts `t`, `t + threads`, ... (so at least one per thread
/// is needed) and gives them to its clients round robin; clients that
/// share a context share its sequence numbers, which the server's replay
/// window takes as long as it sees them no further out of order than its
/// width (mintgate's 1,024, other servers' as little as 32; one context
/// per client avoids the question). An answer that does not
/// verify (or comes unprotected) is an error, counted in `undecryptable`.
pub fn run_protected<F: FnMut(&Progress)>(
    spec: &LoadSpec,
    contexts: Vec<Context>,
    mut progress: F,
) -> Result<LoadReport, LoadError> {
    spec.validate()?;
    let cap = spec.slots_per_client()?;
    let template = RequestTemplate::new(&spec.path, spec.confirmable).map_err(LoadError::Path)?;
    let clients = spec.mode.clients();
    let threads = spec.threads.clamp(1, clients);
    if !contexts.is_empty() {
        if spec.transport != Transport::Udp {
            return Err(LoadError::Invalid(
                "OSCORE is benchmarked over UDP only".into(),
            ));
        }
        if contexts.len() < threads {
            return Err(LoadError::Invalid(format!(
                "{} OSCORE contexts for {threads} threads: give at least one per thread \
                 (a context is never shared between threads)",
                contexts.len()
            )));
        }
    }
    let mut per_thread: Vec<Vec<Context>> = (0..threads).map(|_| Vec::new()).collect();
    for (j, c) in contexts.into_iter().enumerate() {
        per_thread[j % threads].push(c);
    }

    let limit = sys::raise_nofile_limit().map_err(|e| LoadError::Io("RLIMIT_NOFILE", e))?;
    let sockets = if spec.shared_socket { threads } else { clients };
    let needed = sockets as u64 + 2 * threads as u64 + FD_MARGIN;
    if needed > limit {
        return Err(LoadError::TooManyClients {
            clients,
            needed,
            limit,
        });
    }

    let share = |t: usize| share_of(clients, threads, t);
    let ios = match spec.transport {
        Transport::Udp => client_io(spec, clients, threads)?,
        Transport::Tcp => Vec::new(),
    };
    let conns: Vec<_> = match spec.transport {
        Transport::Tcp => (0..threads)
            .map(|t| tcp::connect(spec.target, share(t), spec.timeout))
            .collect(),
        Transport::Udp => Vec::new(),
    };

    let start = Instant::now() + Duration::from_millis(20);
    let measure_start = start + spec.warmup;
    let timing = Timing {
        start,
        measure_start,
        send_end: measure_start + spec.duration,
        timeout: spec.timeout,
    };
    let bins = spec.duration.as_secs_f64().ceil() as usize;
    let mut workers = Vec::with_capacity(threads);
    for socks in conns {
        let w = TcpWorker::new(socks, &template, cap, timing, bins)
            .map_err(|e| LoadError::Io("setting up the poll", e))?;
        workers.push(AnyWorker::Tcp(Box::new(w)));
    }
    for ((t, io), ctxs) in ios.into_iter().enumerate().zip(per_thread) {
        let n = match &io {
            ClientIo::PerClient(s) => s.len(),
            ClientIo::Shared { clients, .. } => *clients,
        };
        let driver = match spec.mode {
            Mode::Closed { .. } => Driver::Closed,
            Mode::Open {
                rate_per_client, ..
            } => {
                // Interleave the threads' schedules within one send interval.
                let interval = Duration::from_secs_f64(1.0 / rate_per_client / n as f64);
                let phase = interval.mul_f64(t as f64 / threads as f64);
                Driver::Open(Schedule::new(start + phase, rate_per_client, n))
            }
        };
        let w = Worker::new(
            io,
            &template,
            cap,
            driver,
            timing,
            bins,
            Offload {
                gso: spec.gso,
                gro: spec.gro,
            },
        )
        .map_err(|e| LoadError::Io("setting up the poll", e))?;
        let w = if ctxs.is_empty() {
            w
        } else {
            w.with_oscore(ctxs)
        };
        workers.push(AnyWorker::Udp(Box::new(w)));
    }

    let lives: Vec<Live> = (0..threads).map(|_| Live::default()).collect();
    let total = spec.warmup + spec.duration;
    let outcomes = std::thread::scope(|scope| {
        let handles: Vec<_> = workers
            .into_iter()
            .zip(&lives)
            .enumerate()
            .map(|(i, (w, live))| {
                std::thread::Builder::new()
                    .name(format!("loadgen-{i}"))
                    .spawn_scoped(scope, move || w.run(live))
            })
            .collect::<Result<_, _>>()
            .map_err(|e| LoadError::Io("spawning a worker thread", e))?;
        let mut last_ok = 0u64;
        let mut last_at = start;
        loop {
            let finished = handles.iter().all(|h| h.is_finished());
            if !finished {
                std::thread::sleep(PROGRESS_EVERY);
            }
            let now = Instant::now();
            let mut p = Progress {
                elapsed: now.saturating_duration_since(start),
                total,
                phase: if now < measure_start {
                    Phase::Warmup
                } else if now < timing.send_end {
                    Phase::Measure
                } else {
                    Phase::Drain
                },
                sent: 0,
                received: 0,
                lost: 0,
                errors: 0,
                rate: 0.0,
            };
            let mut ok = 0;
            for l in &lives {
                p.sent += l.sent.load(Relaxed);
                p.received += l.received.load(Relaxed);
                p.lost += l.lost.load(Relaxed);
                p.errors += l.errors.load(Relaxed);
                ok += l.ok_total.load(Relaxed);
            }
            let dt = now.saturating_duration_since(last_at).as_secs_f64();
            if dt > 0.0 {
                p.rate = ok.saturating_sub(last_ok) as f64 / dt;
            }
            (last_ok, last_at) = (ok, now);
            progress(&p);
            if finished {
                break;
            }
        }
        handles
            .into_iter()
            .map(|h| match h.join() {
                Ok(Ok(o)) => Ok(o),
                Ok(Err(e)) => Err(LoadError::Io("polling the sockets", e)),
                Err(_) => Err(LoadError::WorkerPanicked),
            })
            .collect::<Result<Vec<_>, _>>()
    })?;
    let wall = start.elapsed();

    let mut counts = Counts::default();
    let mut hist = Histogram::new();
    let mut per_second = vec![0u64; bins];
    let mut generator_cpu = Duration::ZERO;
    for o in &outcomes {
        counts.add(&o.counts);
        hist.merge(&o.hist);
        for (a, b) in per_second.iter_mut().zip(&o.per_second) {
            *a += b;
        }
        generator_cpu += o.cpu;
    }
    let ns = |v: u64| Duration::from_nanos(v);
    Ok(LoadReport {
        sent: counts.sent,
        received: counts.received,
        lost: counts.lost,
        errors: counts.errors,
        undecryptable: counts.undecryptable,
        unmatched: counts.unmatched,
        skipped: counts.skipped,
        io_errors: counts.io_errors,
        in_trains: counts.in_trains,
        requests_per_sec: counts.ok_in_window as f64 / spec.duration.as_secs_f64(),
        per_second,
        latency: Latency {
            p50: ns(hist.quantile(0.50)),
            p90: ns(hist.quantile(0.90)),
            p99: ns(hist.quantile(0.99)),
            p999: ns(hist.quantile(0.999)),
            max: ns(hist.max()),
            mean: ns(hist.mean()),
        },
        measured: spec.duration,
        wall,
        generator_cpu,
    })
}

/// A worker of either transport.
enum AnyWorker {
    Udp(Box<Worker>),
    Tcp(Box<TcpWorker>),
}

impl AnyWorker {
    fn run(self, live: &Live) -> std::io::Result<Outcome> {
        match self {
            AnyWorker::Udp(w) => w.run(live),
            AnyWorker::Tcp(w) => w.run(live),
        }
    }
}

/// Clients a shared socket can give loopback addresses to.
const SHARED_MAX_CLIENTS: usize = 1_000_000;

/// The sockets of each of `threads` workers: `clients` spread evenly.
/// Clients of worker `t` when `clients` are spread evenly over `threads`.
fn share_of(clients: usize, threads: usize, t: usize) -> usize {
    clients / threads + usize::from(t < clients % threads)
}

fn client_io(spec: &LoadSpec, clients: usize, threads: usize) -> Result<Vec<ClientIo>, LoadError> {
    let share = |t: usize| share_of(clients, threads, t);
    let target = match spec.target {
        SocketAddr::V4(t) if spec.shared_socket => t,
        _ => {
            return (0..threads)
                .map(|t| per_client(spec.target, share(t)))
                .collect()
        }
    };
    // 127.1.0.1 onwards, or past the target if it falls in that range
    let mut first = u32::from(Ipv4Addr::new(127, 1, 0, 1));
    let t = u32::from(*target.ip());
    if (first..first + clients as u32).contains(&t) {
        first = t + 1;
    }
    let mut ios = Vec::with_capacity(threads);
    for w in 0..threads {
        let n = share(w);
        let sock = sys::shared_socket().map_err(|e| LoadError::Io("opening a shared socket", e))?;
        ios.push(ClientIo::Shared {
            sock: mio::net::UdpSocket::from_std(sock),
            target,
            first: Ipv4Addr::from(first),
            clients: n,
        });
        first += n as u32;
    }
    Ok(ios)
}

fn per_client(target: SocketAddr, n: usize) -> Result<ClientIo, LoadError> {
    (0..n)
        .map(|_| open_socket(target))
        .collect::<Result<_, _>>()
        .map(ClientIo::PerClient)
}

/// One client's socket: bound to an ephemeral port of the target's family,
/// connected to the target, non-blocking.
fn open_socket(target: SocketAddr) -> Result<mio::net::UdpSocket, LoadError> {
    let local: SocketAddr = if target.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let s = UdpSocket::bind(local).map_err(|e| LoadError::Io("binding a client socket", e))?;
    s.connect(target)
        .map_err(|e| LoadError::Io("connecting a client socket", e))?;
    s.set_nonblocking(true)
        .map_err(|e| LoadError::Io("making a socket non-blocking", e))?;
    Ok(mio::net::UdpSocket::from_std(s))
}
