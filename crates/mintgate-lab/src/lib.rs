//! The labs: reproduce the papers' experiments against an in-process
//! gateway on loopback and put our figures beside the papers'.
//!
//! Each lab is a library function taking [`LabOptions`] and returning a
//! [`Summary`] (the printed table, the files written, whether the lab's
//! target was met), so that `mintgate lab <name>` and a later `lab all` can
//! call them alike. Every run is bounded in time, uses loopback only, and
//! reports progress through [`LabOptions::progress`] (stderr by default).
//!
//! - [`lab_threads`]: paper 000, Figs. 2-5, NR vs HTP throughput for fixed
//!   handler pools of 1..N threads under a saturating open-loop load.
//! - [`lab_vta`]: paper 000, Figs. 6-7, the VTA-sized pool tracking a varying
//!   open-loop load: NR, HTP and threads over time, cumulative NR - HTP.
//! - [`lab_clients`], [`lab_blocksize`]: paper 000, Figs. 9-11, throughput
//!   against the number of clients and the answer's size, mintgate VTA vs a
//!   fixed pool vs libcoap.
//! - [`lab_congestion`]: paper 002, Tables 1-3, CoAP Basic, CoCoA and
//!   Adaptive RTO at 5, 10 and 15 % loss in the simulated multi-hop chain
//!   (or end to end through the impairment relay).
//! - [`lab_mqtt`]: paper 004, Fig. 5, 1,000 MQTT messages through the
//!   publish queue (QoS 1, window 1 and window N) vs plain QoS 2 and QoS 1,
//!   against the embedded broker and mosquitto, every message checked.
//! - [`lab_buffers`]: paper 003, Tables 3-5, bytes allocated and copied and
//!   time per message for echo and CoAP, mintgate vs a copy-per-layer
//!   baseline.
//! - [`lab_footprint`]: resident memory of `mintgate serve` idle and under
//!   load, and the pool's outstanding blocks after the load stops.
//! - [`lab_directpath`]: paper 001, Fig. 4, one read -> compare -> write
//!   cycle through the user API, the optimized user path and the direct
//!   path (inside the worker and end to end under load).
//! - [`lab_overload`]: a `mintgate serve` process at ten times its
//!   capacity: a probe from another source still answered, memory bounded,
//!   sheds counted.
//! - [`lab_fieldbus`]: issue 26, Modbus polling of 20 pymodbus devices
//!   (10,000 points/s): the gateway's CPU beside the simulators', poll
//!   lateness, and a register change's latency to an Observe client, an
//!   MQTT subscriber and, through the direct path, a Modbus coil.
//! - [`report`]: `lab all`, every lab in turn and one self-contained
//!   `report.html` with a summary of the targets met or missed.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use mintgate_gateway::config::{HandlerCost, PoolMode};
use mintgate_gateway::{resources, Config, Gateway};
use mintgate_sched::Sample;

pub mod buffers;
mod clients;
pub mod congestion;
pub mod directpath;
pub mod dtls;
pub mod fieldbus;
pub mod footprint;
pub mod mqtt;
pub mod mqtt_outage;
pub mod overload;
mod paho;
mod paper;
mod peers;
mod plot;
pub mod proxy;
pub mod report;
mod threads;
mod vta;

pub use buffers::lab_buffers;
pub use clients::{lab_blocksize, lab_clients, CompareOptions};
pub use congestion::{lab_congestion, CongestionOptions};
pub use directpath::lab_directpath;
pub use dtls::{lab_dtls, DtlsOptions};
pub use fieldbus::{lab_fieldbus, FieldbusBroker, FieldbusOptions};
pub use footprint::lab_footprint;
pub use mqtt::{lab_mqtt, MqttLabOptions, PahoMode};
pub use mqtt_outage::{lab_mqtt_outage, OutageOptions};
pub use overload::lab_overload;
pub use plot::{fleet_svg, FleetSeries};
pub use proxy::{lab_proxy, ProxyLabOptions};
pub use threads::lab_threads;
pub use vta::lab_vta;

/// Where progress lines go (one line per call, no trailing newline).
pub type ProgressFn = Arc<dyn Fn(&str) + Send + Sync>;

/// Options shared by the labs. Fields a lab does not use are ignored.
#[derive(Clone)]
pub struct LabOptions {
    /// Output folder for CSVs and plots (created if missing).
    pub out: PathBuf,
    /// Short settings: a run of a few tens of seconds.
    pub quick: bool,
    /// `threads`: measured time per thread count (default 60 s, the paper's
    /// per-step time; quick 5 s). `vta`: length of the load profile
    /// (default 120 s; quick 30 s).
    pub duration: Option<Duration>,
    /// `threads`: unmeasured load before each step's measurement (default
    /// 2 s; quick 1 s).
    pub warmup: Option<Duration>,
    /// What answering `GET /request` costs (default `block:200us`, a
    /// simulated sensor read, so that thread counts matter on a small box).
    pub handler_cost: HandlerCost,
    /// `threads`: the largest fixed pool; the lab runs 1..=N (default 8;
    /// quick 4).
    pub max_threads: Option<usize>,
    /// `threads`: clients at 10 requests/s each (default: enough for 1.25x
    /// the largest pool's nominal capacity, at most 5000).
    pub clients: Option<usize>,
    /// `vta`: the profile's peak offered rate in requests/s (default 10000,
    /// the paper's Figs. 2-4 arrival rate).
    pub peak_rps: Option<f64>,
    /// Progress sink.
    pub progress: ProgressFn,
}

impl Default for LabOptions {
    fn default() -> Self {
        LabOptions {
            out: PathBuf::from("lab-out"),
            quick: false,
            duration: None,
            warmup: None,
            handler_cost: default_handler_cost(),
            max_threads: None,
            clients: None,
            peak_rps: None,
            progress: Arc::new(|line: &str| eprintln!("{line}")),
        }
    }
}

/// The labs' default handler cost, `block:200us`.
pub fn default_handler_cost() -> HandlerCost {
    HandlerCost::Block(Duration::from_micros(200))
}

/// What a lab did.
#[derive(Clone, Debug)]
pub struct Summary {
    /// The lab's name (`threads`, `vta`).
    pub lab: &'static str,
    /// The table to print: our figures beside the paper's.
    pub table: String,
    /// Files written (CSV, SVG).
    pub files: Vec<PathBuf>,
    /// Whether the lab's target was met, where it has one.
    pub target_met: Option<bool>,
}

/// Requests per second each simulated client sends, as in the paper.
pub const RATE_PER_CLIENT: f64 = 10.0;

/// The gateway configuration every lab starts from: loopback, an ephemeral
/// port, the given pool and handler cost, and the whole HTP queue open to
/// one source (a lab's clients all send from 127.0.0.1, and the papers'
/// servers have no per-source share).
fn lab_config(pool: PoolMode, cost: HandlerCost, observer_samples: usize) -> Config {
    let mut c = Config::default();
    c.coap.bind = vec!["127.0.0.1:0".parse().expect("literal address")];
    c.pipeline.peer_queue_share = 1.0;
    c.pipeline.pool = pool;
    c.pipeline.observer_samples = observer_samples.max(120);
    c.resources.request_cost = cost;
    // The paper's figures compare servers doing the same work for load
    // generators on loopback, which do not run Echo (RFC 9175): answers cut
    // for unverified sources would make mintgate's larger answers (lab
    // blocksize) cheaper than libcoap's. Anti-amplification is measured by
    // its own tests and by `lab overload`'s flood.
    c.coap.amplification_factor = 0;
    c
}

/// A gateway started for a lab, with the instant its Observer's clock began
/// (taken just before the start, so within a few milliseconds).
struct LabGateway {
    gw: Gateway,
    addr: std::net::SocketAddr,
    obs0: Instant,
}

impl LabGateway {
    fn start(cfg: Config) -> anyhow::Result<LabGateway> {
        let router = resources::router_for(&cfg);
        let obs0 = Instant::now();
        let gw = Gateway::start(cfg, router).context("starting the gateway")?;
        let addr = *gw
            .local_addrs()
            .first()
            .context("the gateway has no listener")?;
        Ok(LabGateway { gw, addr, obs0 })
    }

    /// Seconds on the Observer's clock at `at`.
    fn obs_time(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.obs0).as_secs_f64()
    }

    /// Waits (at most `limit`) until the Observer has a sample ending at or
    /// after `t` on its clock; returns all samples.
    fn samples_until(&self, t: f64, limit: Duration) -> Vec<Sample> {
        let end = Instant::now() + limit;
        loop {
            let s = self.gw.samples();
            if s.last().is_some_and(|l| l.t >= t) || Instant::now() >= end {
                return s;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Creates the output folder and checks that files can be written there,
/// before a lab spends minutes on results it could not keep.
fn create_out(out: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let probe = out.join(format!(".mintgate-write-check-{}", std::process::id()));
    std::fs::write(&probe, b"")
        .with_context(|| format!("cannot write in the output folder {}", out.display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

fn write_file(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Appends `target met: WHAT` (or `target NOT met: ...`) to a table and
/// keeps `met` true only while every target is.
fn target_line(t: &mut String, met: &mut bool, ok: bool, what: &str) {
    *met &= ok;
    line(
        t,
        format_args!("target {}: {what}", if ok { "met" } else { "NOT met" }),
    );
}

/// Appends a line to a table string.
fn line(t: &mut String, args: std::fmt::Arguments<'_>) {
    let _ = t.write_fmt(args);
    t.push('\n');
}
