//! `mintgate lab`: reproduce the papers' experiments against an in-process
//! gateway on loopback and print our figures beside the papers'.
//!
//! The labs themselves live in the `mintgate-lab` crate; this module parses
//! the command line, runs one, prints its table on stdout (progress goes to
//! stderr) and lists the files it wrote. Exit code 0 when the lab ran (a
//! missed target is reported in the table), 1 on an error.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use mintgate_gateway::config::HandlerCost;
use mintgate_lab::{LabOptions, Summary};

/// Arguments of `mintgate lab`.
#[derive(clap::Args)]
pub struct LabArgs {
    #[command(subcommand)]
    lab: Lab,
}

#[derive(clap::Subcommand)]
enum Lab {
    /// A fleet into a replicated JetStream stream: K gateway processes
    /// (`serve --nats`, S simulated sensors each at HZ) into a private
    /// 3-node nats-server cluster, through a node killed and restarted and
    /// then the stream's leader; prints offered and stored rates, latency
    /// from sample to stream and to a consumer (p50, p99, max), lost,
    /// duplicated and out-of-order counts, each failover's gap and where
    /// the CPU went; `--compare`: the same load through nats-server's MQTT
    /// listener and mosquitto. Writes `fleet.csv` and `fleet.svg`.
    Fleet(crate::fleet::FleetArgs),
    /// coaps (CoAP over DTLS 1.2) on this machine: handshakes per second
    /// (pre-shared key and certificate) and the throughput over established
    /// sessions beside plain CoAP, measured in one run against one
    /// in-process gateway; prints the coaps/coap ratio (target >= 50 %).
    /// Writes `dtls.csv`.
    Dtls(DtlsLabArgs),
    /// Issue 26: Modbus polling against pymodbus servers it starts (DEVICES
    /// x POINTS holding registers at HZ, 10,000 points/s by default) by a
    /// `mintgate serve` it starts; in one run, the gateway's CPU beside the
    /// simulators', the points read per second, poll lateness, and the
    /// latency from a register change in a simulator to an Observe client,
    /// an MQTT subscriber (through the bridge and a private mosquitto or
    /// the embedded broker) and, through a direct-path link, a coil of
    /// another simulated device (p50, p99, most; also from the poll read).
    /// Writes `fieldbus.csv` and `fieldbus.svg`.
    Fieldbus(FieldbusLabArgs),
    /// Every lab in turn (threads, vta, clients, blocksize, congestion,
    /// mqtt, proxy, buffers, directpath, footprint, overload, dtls), then one
    /// self-contained report.html: each lab's figures beside its table of
    /// our figures and the paper's, its CSVs, and a summary of the targets
    /// met or missed. A lab that fails is reported and the others still
    /// run; one that cannot run here (the proxy lab without root) is
    /// reported as skipped, with why. Exit code 1 when a lab failed.
    All {
        /// Short settings for every lab: a few minutes in all on a 2-core
        /// machine (release build). Without it, the papers' settings: hours.
        #[arg(long)]
        quick: bool,
        /// Output folder for every lab's files and report.html.
        #[arg(long, default_value = "lab-out/")]
        out: PathBuf,
    },
    /// Paper 000 Figs. 2-5: NR vs HTP throughput for fixed pools of 1..N
    /// threads under a saturating open-loop load (clients at 10 requests/s).
    Threads {
        #[command(flatten)]
        common: Common,
        /// Largest fixed pool; the lab runs 1..=N threads [default: 8, quick: 4].
        #[arg(long, value_parser = crate::common::at_least::<1>)]
        max_threads: Option<usize>,
        /// Clients at 10 requests/s each [default: 1.25x the largest pool's
        /// nominal capacity, at most 5000].
        #[arg(long)]
        clients: Option<usize>,
    },
    /// Paper 000 Figs. 6-7: the VTA pool tracking a varying open-loop load
    /// (ramp up, plateau, step down, step up, ramp down): NR, HTP, threads
    /// and the cumulative NR - HTP difference per second.
    Vta {
        #[command(flatten)]
        common: Common,
        /// Peak offered rate of the profile, requests/s.
        #[arg(long, default_value_t = 10_000.0, value_parser = positive_rate)]
        peak_rps: f64,
    },
    /// Paper 000 Figs. 9-10: answered requests/s against 1..10,000 clients
    /// (10 NON GETs/s each) for mintgate VTA, mintgate with a fixed pool of
    /// one handler per core, and libcoap; when each first loses requests.
    /// Writes `clients.csv` and `clients.svg`.
    Clients {
        #[command(flatten)]
        compare: CompareArgs,
    },
    /// Paper 000 Fig. 11: answered requests/s against the answer's size
    /// (8..1000 payload bytes), averaged over 1,000..10,000 clients, for the
    /// same three servers. Writes `blocksize.csv` and `blocksize.svg`.
    Blocksize {
        #[command(flatten)]
        compare: CompareArgs,
        /// Answer payload sizes in bytes, comma-separated [8,64,128,256,512,1000;
        /// quick: 8,256,1000].
        #[arg(long, value_delimiter = ',')]
        sizes: Option<Vec<usize>>,
    },
    /// Paper 004 Fig. 5: 1,000 MQTT messages of 26 bytes, 5 runs each,
    /// through the publish queue (QoS 1, window 1; and window N with the
    /// receiver reordering) vs plain QoS 2 (one in flight) and plain QoS 1
    /// (100 in flight; and one in flight, for reference), against the
    /// embedded broker and a private mosquitto (when installed) or
    /// --broker. Writes `mqtt.csv` and `mqtt.svg`.
    Mqtt {
        /// Short settings: 2 runs per method instead of 5.
        #[arg(long)]
        quick: bool,
        /// Output folder for the CSV and SVG files.
        #[arg(long, default_value = "lab-out/")]
        out: PathBuf,
        /// Measure this broker (mqtt://HOST:PORT) instead of a private
        /// mosquitto; the embedded broker is always measured.
        #[arg(long)]
        broker: Option<mintgate_mqtt::BrokerUrl>,
        /// Runs per method and broker [5; quick 2].
        #[arg(long, value_parser = crate::common::at_least::<1>)]
        runs: Option<usize>,
        /// Window of the extra windowed publish-queue method (at least 2).
        #[arg(long, default_value_t = 16, value_parser = crate::common::at_least::<2>)]
        window: usize,
        /// The paper's client, Eclipse Paho (Java, peers/paho, built with
        /// Maven on first use), run beside ours: with Paho's default file
        /// persistence, with memory persistence, or off.
        #[arg(long, default_value = "file", value_parser = ["file", "memory", "off"])]
        paho: String,
        /// One-way delay of a modelled network link between every client
        /// and every broker (mintgate's TCP delay relay in front of each
        /// broker; the paper's broker and clients were three hosts): `1`
        /// (ms), `0.5ms`, `250us`. Default: bare loopback.
        #[arg(long, default_value = "0", value_parser = crate::common::parse_ms)]
        link_delay: std::time::Duration,
        /// Instead of Fig. 5: the bounded queue through a broker outage of
        /// this length (`10m`: the target case). Publishes --outage-rate
        /// messages/s to a private mosquitto for 5 s, stops it for the
        /// outage, starts it again, publishes 5 s more; checks arrived +
        /// dropped = enqueued, order, the newest --outage-max all arrived,
        /// and VmRSS flat while the queue is full. Writes `outage.csv`.
        #[arg(long, value_parser = parse_duration)]
        outage: Option<Duration>,
        /// Messages per second of the outage case.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=10000))]
        outage_rate: u64,
        /// `mqtt.queue.max_messages` (drop-oldest) of the outage case.
        #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(17..=10000000))]
        outage_max: u64,
    },
    /// Paper 003 Tables 3-5: bytes allocated, bytes copied and ns per
    /// message for n = 128..1024 on the echo, coap, coap-static and http
    /// (through the HTTP -> CoAP proxy) paths, mintgate vs a copy-per-layer
    /// baseline.
    Buffers {
        #[command(flatten)]
        out: OutArgs,
    },
    /// Paper 001 Fig. 4: one read -> compare -> write cycle, 10,000 cycles
    /// each, through the user API (open/read/write/close), the optimized
    /// user path (pread/pwrite), the direct path inside its worker, and the
    /// direct path end to end while a load saturates the gateway. Writes
    /// `directpath.csv`, `directpath_waits.csv` and `directpath.svg`.
    Directpath {
        #[command(flatten)]
        out: OutArgs,
    },
    /// Resident memory of `mintgate serve` (default configuration) idle and
    /// under saturating load, and its pool's outstanding blocks after the
    /// load stops; libcoap's server and Californium (peers/californium,
    /// built with Maven when needed) measured alike when available.
    Footprint {
        #[command(flatten)]
        out: OutArgs,
    },
    /// `mintgate serve` (fixed:2 handler threads, 1 ms blocking handler) at
    /// ten times its closed-loop capacity (11x asked for, at least 10x read
    /// by the gateway): open loop, 10 NON GETs/s per client from 127.0.0.1
    /// for 60 s (--quick 30 s), while a probe sends a CON GET each second
    /// from 127.0.0.2. Targets: offered >= 10x, every probe answered
    /// 2.05 within its first two RFC 7252 retransmissions (14 s), every
    /// datagram handled or counted shed, VmRSS under --rss-limit and not
    /// growing after the first minute (the first half of shorter runs). Writes `overload.csv` (per second: offered, handled, shed,
    /// RSS, probe latency) and `overload.svg`.
    Overload {
        #[command(flatten)]
        out: OutArgs,
        /// Length of the overload [60s; quick: 30s].
        #[arg(long, value_parser = parse_duration)]
        duration: Option<Duration>,
        /// Memory bound, MiB of VmRSS.
        #[arg(long, default_value_t = 64)]
        rss_limit: u64,
        /// Each client sends from a loopback address of its own
        /// (127.1.0.1, 127.1.0.2, ...): a flood of distinct message IDs
        /// from thousands of sources, instead of from 127.0.0.1's ports.
        #[arg(long)]
        many_sources: bool,
    },
    /// Paper 002 Tables 4-6: HTTP/1.1 (TCP) and HTTP/3 (QUIC) proxies in
    /// front of a CoAP server at 5, 10 and 15 % loss; persistent and
    /// new-connection modes (TCP handshake vs QUIC 0-RTT); CoAP, total and
    /// Internet RTT per interval. The Internet leg is a TUN link between two
    /// network namespaces (needs root) impairing TCP and UDP alike. Also the
    /// proxy's overhead and throughput on loopback. Writes `proxy.csv` and
    /// `proxy.svg` (and `proxy_shared.csv`: 4 requests sharing one
    /// connection, h1/h2/h3). About 40 minutes; --quick about 5.
    Proxy(ProxyLabArgs),
    /// Paper 002 Tables 1-3: CoAP Basic, CoCoA and Adaptive RTO at 5, 10
    /// and 15 % loss, 1,000 CON GETs per case as 10 intervals of 100, in
    /// the virtual-time simulator of the paper's 4-node chain (default) or
    /// end to end through the impairment relay (`--real`). Writes
    /// `congestion.csv`, `congestion.svg` and `congestion_clients.csv`.
    Congestion {
        /// Short settings: 100 requests per case with --real, and 100
        /// instead of 250 requests per client in the shared-chain study
        /// (the simulator's 10 runs per case stay: they take half a
        /// second).
        #[arg(long)]
        quick: bool,
        /// Output folder for the CSV and SVG files.
        #[arg(long, default_value = "lab-out/")]
        out: PathBuf,
        /// First seed; run k of a case uses seed + k.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Runs (seeds) per case [simulator: 10; --real: 1].
        #[arg(long, value_parser = crate::common::at_least::<1>)]
        runs: Option<usize>,
        /// Requests per case, at least 10 (reported as 10 intervals) [1000; --real --quick: 100].
        #[arg(long, value_parser = crate::common::at_least::<10>)]
        requests: Option<usize>,
        /// End to end over loopback UDP: an in-process gateway behind the
        /// impairment relay with the simulated chain's base RTT and loss
        /// placement (half the lossless RTT, about 97 ms, each way with the
        /// chain's jitter, and the loss split over the two directions).
        /// Slow: every exchange takes about 0.2 s and Basic waits out 2-3 s
        /// timeouts: about 55 min for the nine cases at 1000 requests.
        #[arg(long)]
        real: bool,
    },
}

#[derive(clap::Args)]
struct CompareArgs {
    // --quick and --out as in ProxyLabArgs and Common: the help of each says
    // what that lab shortens and writes, so the flags stay per command.
    /// Short settings: few steps, 4 s each, one run, 1 s cool-down.
    #[arg(long)]
    quick: bool,
    /// Output folder for the CSV and SVG files.
    #[arg(long, default_value = "lab-out/")]
    out: PathBuf,
    /// Measured time per step [60s; quick: 4s].
    #[arg(long, value_parser = parse_duration)]
    duration: Option<Duration>,
    /// Client counts, comma-separated (spaces allowed) [clients:
    /// 1,10,100,500,1000,2000,3000,5000,7500,10000, quick: 100,1000,3000,6000;
    /// blocksize: 1000..10000 by 1000, quick: 1000,5000].
    #[arg(long, value_delimiter = ',', value_parser = crate::common::at_least::<1>)]
    clients: Option<Vec<usize>>,
    /// Runs per step [3; quick: 1].
    #[arg(long, value_parser = crate::common::at_least::<1>)]
    runs: Option<usize>,
    /// Pause between steps [60s; quick: 1s].
    #[arg(long, value_parser = parse_duration)]
    cooldown: Option<Duration>,
    /// What answering costs mintgate: none, block:D or spin:D [none: the
    /// peer's handler costs nothing either].
    #[arg(long, default_value = "none")]
    handler_cost: HandlerCost,
    /// Leave libcoap out even where it is installed.
    #[arg(long)]
    no_libcoap: bool,
}

impl CompareArgs {
    fn options(self, sizes: Option<Vec<usize>>) -> mintgate_lab::CompareOptions {
        mintgate_lab::CompareOptions {
            common: LabOptions {
                out: self.out,
                quick: self.quick,
                duration: self.duration,
                handler_cost: self.handler_cost,
                ..LabOptions::default()
            },
            clients: self.clients,
            runs: self.runs,
            cooldown: self.cooldown,
            sizes,
            no_libcoap: self.no_libcoap,
        }
    }
}

/// Options of `mintgate lab proxy`.
#[derive(clap::Args)]
struct ProxyLabArgs {
    /// Short settings: 100 requests per case instead of 1000, shorter benchmark.
    #[arg(long)]
    quick: bool,
    /// Output folder for proxy.csv, proxy_shared.csv and proxy.svg.
    #[arg(long, default_value = "lab-out/")]
    out: PathBuf,
    /// Requests per case, at least 10 (reported as 10 intervals) [1000; quick 100].
    #[arg(long, value_parser = crate::common::at_least::<10>)]
    requests: Option<usize>,
    /// Seed of the impairments.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Internet leg: one-way delay, each way: `20` (ms, as every link
    /// delay flag), `20ms`, `500us`.
    #[arg(long, default_value = "20ms", value_parser = crate::common::parse_ms)]
    internet_delay: Duration,
    /// Internet leg: uniform jitter around the delay: `2` (ms) or `2ms`.
    #[arg(long, default_value = "2ms", value_parser = crate::common::parse_ms)]
    internet_jitter: Duration,
    /// Internet leg: loss per packet, percent, each way.
    #[arg(long, default_value_t = 1.0)]
    internet_loss: f64,
    /// Skip the loopback overhead and throughput measurement.
    #[arg(long)]
    no_bench: bool,
}

#[derive(clap::Args)]
struct Common {
    /// Short settings (a few tens of seconds).
    #[arg(long)]
    quick: bool,
    /// Output folder for the CSV and SVG files.
    #[arg(long, default_value = "lab-out/")]
    out: PathBuf,
    /// threads: measured time per thread count [default: 60s, quick: 5s];
    /// vta: length of the load profile [default: 120s, quick: 30s].
    #[arg(long, value_parser = parse_duration)]
    duration: Option<Duration>,
    /// What answering GET /request costs: none, block:DURATION (a blocking
    /// sensor read) or spin:DURATION (CPU).
    #[arg(long, default_value = "block:200us")]
    handler_cost: HandlerCost,
}

/// Options of the labs that take only an output folder and --quick.
#[derive(clap::Args)]
struct OutArgs {
    /// Short settings: fewer messages and shorter runs, for a first look
    /// in a minute or two (the figures are noisier than a full run's).
    #[arg(long)]
    quick: bool,
    /// Output folder for the lab's CSV files (and its SVG plot, where it
    /// draws one).
    #[arg(long, default_value = "lab-out/")]
    out: PathBuf,
}

/// Options of `lab dtls`.
#[derive(clap::Args)]
struct DtlsLabArgs {
    #[command(flatten)]
    out: OutArgs,
    /// Length of each measurement (handshakes PSK, handshakes certificate,
    /// plain throughput, coaps throughput) [3s; quick: 1.5s].
    #[arg(long, value_parser = parse_duration)]
    duration: Option<Duration>,
    /// Client threads opening sessions in the handshake measurements.
    #[arg(long, default_value_t = 2, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    handshake_clients: u32,
    /// Client sessions (one thread each) in the throughput measurements.
    #[arg(long, default_value_t = 8, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=256))]
    sessions: u32,
    /// Requests each session keeps in flight.
    #[arg(long, default_value_t = 16, value_name = "W", value_parser = clap::value_parser!(u32).range(1..=256))]
    window: u32,
    /// Handler threads of the gateway (a fixed pool, the same for both).
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = crate::common::at_least::<1>)]
    threads: usize,
    /// ClientHellos per second of the flood measurement (0 = none); the
    /// default is the target's rate.
    #[arg(long, default_value_t = 10_000, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=10_000_000))]
    flood_rate: u32,
    /// Loopback source addresses of the flood (127.6.0.0 on, a socket each).
    #[arg(long, default_value_t = 2048, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=65536))]
    flood_sources: u32,
    /// Requests the real client (coap-client-openssl) makes during the
    /// flood, a new session each.
    #[arg(long, default_value_t = 10, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    flood_requests: u32,
}

/// Options of `lab fieldbus`.
#[derive(clap::Args)]
struct FieldbusLabArgs {
    /// Output folder for fieldbus.csv, fieldbus.svg and the run's logs
    /// (fieldbus-work/).
    #[arg(long, default_value = "lab-out/")]
    out: PathBuf,
    /// Simulated Modbus TCP devices (pymodbus servers in one process).
    #[arg(long, default_value_t = 20, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=200))]
    devices: u32,
    /// Holding registers polled per device (contiguous: one request per
    /// 125).
    #[arg(long, default_value_t = 50, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    points: u32,
    /// Polls per second of every device.
    #[arg(long, default_value_t = 10.0, value_name = "HZ", value_parser = poll_rate)]
    hz: f64,
    /// The measured window (after a 2 s warm-up), 1s..=1h.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    duration: Duration,
    /// Seed of the instants at which the probe register changes.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// A Python with pymodbus [default: target/py-venv/bin/python, as
    /// scripts/test.sh installs it].
    #[arg(long, default_value = "target/py-venv/bin/python")]
    python: PathBuf,
    /// The MQTT broker: auto (a private mosquitto when installed, else the
    /// embedded one), mosquitto, or embedded (its CPU then counts in the
    /// gateway's).
    #[arg(long, default_value = "auto")]
    broker: mintgate_lab::FieldbusBroker,
}

/// A poll rate of 0.1..=1000 per second.
fn poll_rate(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if (0.1..=1000.0).contains(&v) => Ok(v),
        _ => Err(format!("'{s}' is not a poll rate of 0.1..=1000 per second")),
    }
}

impl OutArgs {
    fn options(&self) -> LabOptions {
        LabOptions {
            out: self.out.clone(),
            quick: self.quick,
            ..LabOptions::default()
        }
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    mintgate_gateway::config::parse_duration(s)
}

impl Common {
    fn options(&self) -> LabOptions {
        LabOptions {
            out: self.out.clone(),
            quick: self.quick,
            duration: self.duration,
            handler_cost: self.handler_cost,
            ..LabOptions::default()
        }
    }
}

/// A rate above 0.
fn positive_rate(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("'{s}' is not a rate above 0")),
    }
}

/// The processes whose parent is this one (read from `/proc`).
fn children() -> Vec<i32> {
    let me = std::process::id().to_string();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            // /proc/PID/stat: "PID (comm) STATE PPID ..."; comm may hold
            // spaces and parentheses, so read after the last ')'
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|st| {
                    let rest = &st[st.rfind(')')? + 1..];
                    rest.split_whitespace().nth(1).map(|pp| pp == me)
                })
                .unwrap_or(false)
        })
        .collect()
}

/// SIGINT and SIGTERM end a lab with the servers and peers it started
/// (a private mosquitto, libcoap, a `mintgate serve`, Paho's JVM): they
/// are stopped first, where otherwise a `kill` of the lab alone (not its
/// process group, as a terminal's Ctrl-C is) would leave them running.
/// Exits 128 + the signal.
///
/// The signals are caught by a handler, not blocked and waited for as
/// `serve` does: a blocked signal stays blocked in every process a lab
/// starts (the mask is inherited through fork and exec), so a mosquitto
/// started by the lab ignored its SIGTERM, was killed after the grace
/// period without saving its sessions, and the outage lab lost the
/// messages its persistent subscriber should have had queued.
fn stop_children_on_signal() {
    let Some(caught) = catch_signals() else {
        return;
    };
    let _ = std::thread::Builder::new()
        .name("lab-signals".into())
        .spawn(move || {
            let sig = caught();
            let kids = children();
            for &pid in &kids {
                // SAFETY: signalling a child of ours by its pid.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
            eprintln!(
                "lab: stopped by signal {sig}; {} process(es) it started were stopped too; \
                 results not written",
                kids.len()
            );
            std::process::exit(128 + sig);
        });
}

/// Write end of the pipe the signal handler writes a caught signal to.
static SIGNAL_PIPE: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

extern "C" fn on_signal(sig: libc::c_int) {
    let fd = SIGNAL_PIPE.load(std::sync::atomic::Ordering::Relaxed);
    let b = sig as u8;
    // SAFETY: write(2) is async-signal-safe; one byte from a live local.
    unsafe {
        libc::write(fd, (&b as *const u8).cast(), 1);
    }
}

/// Installs a handler for SIGINT and SIGTERM that writes the signal to a
/// pipe (the self-pipe pattern: the handler does nothing else); returns
/// what waits for the first one. Handlers, unlike a blocked mask, are
/// reset to the default in a process that execs. `None` when the pipe or
/// the handler cannot be had (the signals then keep their default action).
fn catch_signals() -> Option<impl FnOnce() -> i32> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return None;
    }
    SIGNAL_PIPE.store(fds[1], std::sync::atomic::Ordering::Relaxed);
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction with a plain handler and an empty
        // mask is valid; the handler only calls write(2).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
                return None;
            }
        }
    }
    let rd = fds[0];
    Some(move || loop {
        let mut b = 0u8;
        // SAFETY: reading one byte into a live local from our pipe.
        let n = unsafe { libc::read(rd, (&mut b as *mut u8).cast(), 1) };
        if n == 1 {
            return i32::from(b);
        }
    })
}

/// Runs `mintgate lab ...`.
pub fn run(args: LabArgs) -> anyhow::Result<ExitCode> {
    stop_children_on_signal();
    let summary = match args.lab {
        Lab::All { quick, out } => return run_all(quick, out),
        Lab::Fleet(a) => return crate::fleet::run_fleet(a),
        Lab::Threads {
            common,
            max_threads,
            clients,
        } => mintgate_lab::lab_threads(&LabOptions {
            max_threads,
            clients,
            ..common.options()
        })?,
        Lab::Clients { compare } => mintgate_lab::lab_clients(&compare.options(None))?,
        Lab::Blocksize { compare, sizes } => mintgate_lab::lab_blocksize(&compare.options(sizes))?,
        Lab::Congestion {
            quick,
            out,
            seed,
            runs,
            requests,
            real,
        } => mintgate_lab::lab_congestion(&mintgate_lab::CongestionOptions {
            common: LabOptions {
                out,
                quick,
                ..LabOptions::default()
            },
            seed,
            runs,
            real,
            requests,
        })?,
        Lab::Vta { common, peak_rps } => mintgate_lab::lab_vta(&LabOptions {
            peak_rps: Some(peak_rps),
            ..common.options()
        })?,
        Lab::Mqtt {
            quick,
            out,
            outage: Some(outage),
            outage_rate,
            outage_max,
            ..
        } => mintgate_lab::lab_mqtt_outage(&mintgate_lab::OutageOptions {
            common: LabOptions {
                out,
                quick,
                ..LabOptions::default()
            },
            rate: outage_rate,
            outage,
            max_messages: outage_max,
            ..mintgate_lab::OutageOptions::default()
        })?,
        Lab::Mqtt {
            quick,
            out,
            broker,
            runs,
            window,
            paho,
            link_delay,
            ..
        } => mintgate_lab::lab_mqtt(&mintgate_lab::MqttLabOptions {
            common: LabOptions {
                out,
                quick,
                ..LabOptions::default()
            },
            broker,
            runs,
            messages: None,
            window,
            paho: paho.parse().map_err(anyhow::Error::msg)?,
            link_delay,
        })?,
        Lab::Proxy(p) => mintgate_lab::lab_proxy(&mintgate_lab::ProxyLabOptions {
            common: LabOptions {
                out: p.out,
                quick: p.quick,
                ..LabOptions::default()
            },
            requests: p.requests,
            seed: p.seed,
            internet: mintgate_lab::proxy::netns::LinkImpairment {
                delay: p.internet_delay,
                jitter: p.internet_jitter,
                loss: (p.internet_loss / 100.0).clamp(0.0, 1.0),
            },
            bench: !p.no_bench,
        })?,
        Lab::Buffers { out } => mintgate_lab::lab_buffers(&out.options())?,
        Lab::Directpath { out } => mintgate_lab::lab_directpath(&out.options())?,
        Lab::Overload {
            out,
            duration,
            rss_limit,
            many_sources,
        } => {
            let exe = std::env::current_exe()
                .map_err(|e| anyhow::anyhow!("cannot find the mintgate executable: {e}"))?;
            mintgate_lab::lab_overload(
                &LabOptions {
                    duration,
                    ..out.options()
                },
                &exe,
                Some(rss_limit << 20),
                many_sources,
            )?
        }
        Lab::Dtls(a) => mintgate_lab::lab_dtls(
            &a.out.options(),
            &mintgate_lab::DtlsOptions {
                duration: a.duration,
                handshake_clients: a.handshake_clients,
                sessions: a.sessions,
                window: a.window,
                threads: a.threads,
                flood_rate: a.flood_rate,
                flood_sources: a.flood_sources,
                flood_requests: a.flood_requests,
                exe: Some(
                    std::env::current_exe()
                        .map_err(|e| anyhow::anyhow!("cannot find the mintgate executable: {e}"))?,
                ),
            },
        )?,
        Lab::Fieldbus(a) => {
            let exe = std::env::current_exe()
                .map_err(|e| anyhow::anyhow!("cannot find the mintgate executable: {e}"))?;
            mintgate_lab::lab_fieldbus(&mintgate_lab::FieldbusOptions {
                python: a.python,
                devices: a.devices as usize,
                points: a.points as usize,
                hz: a.hz,
                duration: a.duration,
                seed: a.seed,
                broker: a.broker,
                ..mintgate_lab::FieldbusOptions::new(
                    LabOptions {
                        out: a.out,
                        ..LabOptions::default()
                    },
                    exe,
                )
            })?
        }
        Lab::Footprint { out } => {
            let exe = std::env::current_exe()
                .map_err(|e| anyhow::anyhow!("cannot find the mintgate executable: {e}"))?;
            mintgate_lab::lab_footprint(&out.options(), &exe)?
        }
    };
    print_summary(&summary);
    Ok(ExitCode::SUCCESS)
}

fn run_all(quick: bool, out: PathBuf) -> anyhow::Result<ExitCode> {
    use mintgate_lab::report;
    let exe = std::env::current_exe()
        .map_err(|e| anyhow::anyhow!("cannot find the mintgate executable: {e}"))?;
    let opts = LabOptions {
        out: out.clone(),
        quick,
        ..LabOptions::default()
    };
    let started = std::time::Instant::now();
    let results = report::run_labs(report::all_labs(&opts, &exe), &opts.progress);
    let title = format!(
        "mintgate lab all{} — {}",
        if quick { " --quick" } else { "" },
        report::utc_now()
    );
    let path = report::write_report(&out, &results, &title)?;
    println!();
    // Columns as wide as their longest entry, so no row runs into the next.
    let name_w = results.iter().map(|r| r.name.len()).fold(3, usize::max);
    let paper_w = results
        .iter()
        .map(|r| r.paper.chars().count())
        .fold(10, usize::max);
    println!(
        "{:<name_w$} {:<paper_w$} {:<9} {:>8}",
        "lab", "reproduces", "result", "time"
    );
    for r in &results {
        println!(
            "{:<name_w$} {:<paper_w$} {:<9} {:>7.1}s",
            r.name,
            r.paper,
            r.verdict(),
            r.elapsed.as_secs_f64()
        );
    }
    println!(
        "all labs in {:.1} s; wrote {}",
        started.elapsed().as_secs_f64(),
        path.display()
    );
    let failed = results.iter().any(|r| r.verdict() == "failed");
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

fn print_summary(s: &Summary) {
    println!();
    print!("{}", s.table);
    for f in &s.files {
        println!("wrote {}", f.display());
    }
}
