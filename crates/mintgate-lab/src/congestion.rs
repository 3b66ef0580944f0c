//! `mintgate lab congestion`: paper 002's Tables 1-3, CoAP Basic, CoCoA and
//! Adaptive RTO at 5, 10 and 15 % loss.
//!
//! By default in mintgate's virtual-time simulator
//! (`mintgate_netsim::sim::chain`: the paper's border router and three CoAP
//! servers in a multi-hop chain, running mintgate's real sans-IO client and
//! server); with `real`, end to end over loopback UDP: an in-process
//! gateway behind the impairment relay, and the same client driven by real
//! sockets and the real clock.
//!
//! Per case, 1,000 sequential CON GETs, each repeated until it succeeds (as
//! the paper did), reported as 10 intervals of 100: the mean RTT of each
//! interval, the retransmissions made in it, its p99 and, for Adaptive RTO,
//! the mean alpha. The paper ran each case once; the simulator is cheap, so
//! the lab runs each case over `runs` seeds (`seed`, `seed + 1`, ...) and
//! reports the mean over runs.
//!
//! The output puts the calibration first: each of the nine cells (three
//! controllers at three loss levels) beside the paper's total, within 15 %
//! or reported as missed (with the reason, for the cells the model is known
//! not to match: [`UNMATCHED`]). The chain's parameters, and which of the
//! paper's figures fixes each, are in `mintgate_netsim::sim::chain`. Only
//! then come the gains (Adaptive vs Basic and vs CoCoA), which are findings
//! on that model, not targets. `real` mode runs the same base RTT and loss
//! placement through the impairment relay. Beyond the paper, several
//! clients share the chain (NSTART, blind RTO, queueing at the radio hops),
//! and spurious retransmissions (sent after the copy that got through) are
//! counted.

use std::fmt::Write as _;
use std::net::UdpSocket;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use mintgate_coap::client::{Client, ClientConfig, Event, Request};
use mintgate_coap::rto::{Algorithm, TransmissionParams};
use mintgate_coap::wire::{Code, OptionNumber};
use mintgate_gateway::config::{HandlerCost, PoolMode};
use mintgate_netsim::relay::{Impairment, Relay, RelayConfig};
use mintgate_netsim::sim::chain::{self, ChainConfig};
use plotters::prelude::*;

use crate::{create_out, lab_config, line, write_file, LabGateway, LabOptions, Summary};

/// Paper 002's Tables 1-3: per loss level, the ten interval means (ms) of
/// Basic, CoCoA and Adaptive RTO, and Adaptive's alpha per interval.
///
/// A defect of the paper, carried over as printed: Table 3's Adaptive RTO
/// column (15 % loss) repeats Table 1's Basic column (5 % loss) value for
/// value, and its total 3320.89 is Table 1's Basic total; the true 15 %
/// Adaptive intervals are not in the paper. The totals and the improvement
/// percentages the text states are used as given.
pub mod paper {
    /// One table.
    pub struct Table {
        /// Loss, percent.
        pub loss_pct: u32,
        /// Interval means, ms: Basic, CoCoA, Adaptive.
        pub rtt: [[f64; 10]; 3],
        /// Adaptive RTO's alpha per interval.
        pub alpha: [f64; 10],
        /// The table's printed totals: Basic, CoCoA, Adaptive.
        pub totals: [f64; 3],
    }

    /// Tables 1, 2 and 3.
    // Rows of one shape: the paper's numbers as printed, kept literal so that
    // they can be checked against it.
    pub const TABLES: [Table; 3] = [
        Table {
            loss_pct: 5,
            rtt: [
                [
                    293.06, 302.28, 310.61, 282.44, 314.6, 349.33, 392.3, 348.04, 396.09, 332.14,
                ],
                [
                    198.21, 214.27, 230.49, 208.61, 219.69, 198.81, 224.32, 180.14, 228.37, 223.34,
                ],
                [
                    210.13, 214.53, 233.63, 193.53, 211.03, 203.29, 193.24, 195.1, 216.59, 205.98,
                ],
            ],
            alpha: [0.05, 0.04, 0.06, 0.07, 0.05, 0.04, 0.08, 0.04, 0.04, 0.06],
            totals: [3320.8, 2126.2, 2077.0],
        },
        Table {
            loss_pct: 10,
            rtt: [
                [
                    580.09, 570.36, 652.76, 578.21, 425.01, 476.53, 374.8, 490.19, 437.86, 514.07,
                ],
                [
                    310.8, 246.73, 270.02, 297.48, 255.72, 337.25, 239.18, 285.85, 302.83, 291.0,
                ],
                [
                    309.46, 245.64, 297.14, 264.83, 219.88, 315.34, 271.18, 245.47, 234.73, 234.95,
                ],
            ],
            alpha: [0.1, 0.08, 0.11, 0.07, 0.09, 0.09, 0.08, 0.09, 0.14, 0.07],
            totals: [5099.8, 2836.8, 2638.6],
        },
        Table {
            loss_pct: 15,
            rtt: [
                [
                    577.97, 768.6, 757.22, 810.54, 1270.95, 720.07, 554.18, 922.89, 861.26, 732.95,
                ],
                [
                    313.85, 341.16, 323.99, 323.87, 435.44, 307.57, 365.65, 451.82, 400.06, 383.35,
                ],
                [
                    293.06, 302.28, 310.61, 282.44, 314.6, 349.33, 392.3, 348.04, 396.09, 332.14,
                ],
            ],
            alpha: [0.15, 0.14, 0.2, 0.16, 0.14, 0.11, 0.09, 0.12, 0.17, 0.19],
            totals: [7976.63, 3646.76, 3320.89],
        },
    ];

    /// Adaptive RTO's improvement over Basic the paper reports, percent, at
    /// 5, 10, 15 % loss.
    pub const ADAPTIVE_VS_BASIC: [f64; 3] = [37.4, 48.2, 58.3];
    /// ... and over CoCoA.
    pub const ADAPTIVE_VS_COCOA: [f64; 3] = [2.3, 6.9, 8.9];
}

/// Settings of the congestion lab.
#[derive(Clone)]
pub struct CongestionOptions {
    /// Output folder, progress sink, `quick`.
    pub common: LabOptions,
    /// First seed; run `k` uses `seed + k`.
    pub seed: u64,
    /// Runs (seeds) per case [simulator: 10, quick too; real: 1].
    pub runs: Option<usize>,
    /// End to end over loopback UDP through the impairment relay instead of
    /// the simulator.
    pub real: bool,
    /// Requests per case [1000; real with quick: 100].
    pub requests: Option<usize>,
}

impl Default for CongestionOptions {
    fn default() -> Self {
        CongestionOptions {
            common: LabOptions::default(),
            seed: 1,
            runs: None,
            real: false,
            requests: None,
        }
    }
}

/// Loss levels of the paper.
const LOSSES: [u32; 3] = [5, 10, 15];
/// Intervals per case.
const INTERVALS: usize = 10;

/// One completed request, as the lab sees it.
#[derive(Clone, Copy, Debug)]
struct Done {
    rtt: Duration,
    /// Retransmissions of all its exchanges (timed-out ones included).
    retransmissions: u32,
    spurious: u32,
    alpha: Option<f64>,
}

/// One interval's figures, averaged over runs.
#[derive(Clone, Copy, Debug, Default)]
struct IntervalRow {
    mean_rtt_ms: f64,
    alpha: Option<f64>,
    retransmissions: f64,
    p99_ms: f64,
}

/// One (loss, algorithm) case.
struct Case {
    loss_pct: u32,
    algorithm: Algorithm,
    intervals: Vec<IntervalRow>,
    /// Mean RTT of each run, ms.
    run_means: Vec<f64>,
    spurious: f64,
    wall: Duration,
}

impl Case {
    fn total(&self) -> f64 {
        self.intervals.iter().map(|i| i.mean_rtt_ms).sum()
    }
}

fn split_intervals(runs: &[Vec<Done>]) -> Vec<IntervalRow> {
    let mut rows = vec![IntervalRow::default(); INTERVALS];
    for (k, row) in rows.iter_mut().enumerate() {
        let mut means = Vec::new();
        let mut alphas = Vec::new();
        let mut retrans = 0.0;
        let mut rtts: Vec<f64> = Vec::new();
        for run in runs {
            let per = run.len() / INTERVALS;
            if per == 0 {
                continue;
            }
            let chunk = &run[k * per..(k + 1) * per];
            let ms: Vec<f64> = chunk.iter().map(|d| d.rtt.as_secs_f64() * 1e3).collect();
            means.push(ms.iter().sum::<f64>() / ms.len() as f64);
            rtts.extend(ms);
            retrans += chunk.iter().map(|d| d.retransmissions as f64).sum::<f64>();
            let a: Vec<f64> = chunk.iter().filter_map(|d| d.alpha).collect();
            if !a.is_empty() {
                alphas.push(a.iter().sum::<f64>() / a.len() as f64);
            }
        }
        let n = means.len().max(1) as f64;
        row.mean_rtt_ms = means.iter().sum::<f64>() / n;
        row.retransmissions = retrans / n;
        row.alpha = (!alphas.is_empty()).then(|| alphas.iter().sum::<f64>() / alphas.len() as f64);
        rtts.sort_by(f64::total_cmp);
        row.p99_ms = rtts
            .get(((rtts.len() as f64 * 0.99).ceil() as usize).saturating_sub(1))
            .copied()
            .unwrap_or(0.0);
    }
    rows
}

/// Runs [`sim_case`] for every (loss, algorithm, requests, seed) of
/// `jobs` on as many threads as there are cores, each simulation on its
/// own (a run is a function of its configuration and seed, so the figures
/// do not depend on the threads); returns each job's exchanges and wall
/// time, in the order of `jobs`.
fn sim_cases(jobs: &[(u32, Algorithm, usize, u64)]) -> Vec<(Vec<Done>, Duration)> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(jobs.len())
        .max(1);
    let mut done: Vec<(usize, (Vec<Done>, Duration))> = std::thread::scope(|sc| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                sc.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&(loss, alg, requests, seed)) = jobs.get(i) else {
                            break mine;
                        };
                        let t = Instant::now();
                        let d = sim_case(loss, alg, requests, seed);
                        mine.push((i, (d, t.elapsed())));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a simulation thread panicked"))
            .collect()
    });
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, r)| r).collect()
}

/// Runs the chain in the simulator for one case and seed.
fn sim_case(loss_pct: u32, algorithm: Algorithm, requests: usize, seed: u64) -> Vec<Done> {
    let run = chain::run(&ChainConfig {
        loss: f64::from(loss_pct) / 100.0,
        algorithm,
        requests,
        seed,
        ..ChainConfig::default()
    });
    let max_re = TransmissionParams::default().max_retransmit;
    let mut v: Vec<(usize, Done)> = run.outcomes[0]
        .iter()
        .map(|o| {
            (
                o.index,
                Done {
                    rtt: o.rtt,
                    retransmissions: o.retransmissions + o.timeouts * max_re,
                    spurious: o.spurious,
                    alpha: o.alpha,
                },
            )
        })
        .collect();
    v.sort_by_key(|(i, _)| *i);
    v.into_iter().map(|(_, d)| d).collect()
}

/// One case end to end: an in-process gateway on loopback behind the
/// impairment relay, the client on a real socket with the real clock.
fn real_case(
    loss_pct: u32,
    algorithm: Algorithm,
    requests: usize,
    seed: u64,
    progress: &dyn Fn(&str),
) -> anyhow::Result<Vec<Done>> {
    let gw = LabGateway::start(lab_config(PoolMode::Fixed(1), HandlerCost::None, 120))?;
    // the simulated chain's base RTT and loss placement: half the base RTT
    // each way, the exchange's loss split evenly over the two directions
    let model = ChainConfig::default();
    let imp = Impairment {
        loss: chain::direction_loss(f64::from(loss_pct) / 100.0),
        burst: 1.0,
        delay: chain::base_rtt(&model) / 2,
        jitter: model.host_jitter,
    };
    let relay = Relay::start(RelayConfig {
        listen: "127.0.0.1:0".parse().expect("literal address"),
        forward: gw.addr,
        up: imp,
        down: imp,
        seed,
    })
    .context("starting the impairment relay")?;
    let dest = relay.local_addr();
    let sock = UdpSocket::bind("127.0.0.1:0").context("binding the client socket")?;
    let params = TransmissionParams::default();
    let mut client = Client::new(
        ClientConfig::new(params),
        algorithm.controller(params, seed ^ 0x5eed),
        seed,
    );
    let req = || Request {
        confirmable: true,
        code: Code::GET,
        options: vec![(OptionNumber::URI_PATH, b"request".to_vec())],
        payload: Vec::new(),
    };
    let mut out = Vec::with_capacity(requests);
    let mut retrans_before = 0u32;
    let mut buf = [0u8; 1500];
    let started = Instant::now();
    let mut last_report = Instant::now();
    client
        .request(Instant::now(), dest, req())
        .map_err(|e| anyhow::anyhow!("request: {e}"))?;
    while out.len() < requests {
        let now = Instant::now();
        while let Some(t) = client.poll_transmit(now) {
            sock.send_to(&t.bytes, t.dest).context("sending")?;
        }
        let mut next = false;
        while let Some(ev) = client.poll_event() {
            match ev {
                Event::Response {
                    rtt,
                    retransmissions,
                    ..
                } => {
                    out.push(Done {
                        rtt,
                        retransmissions: retransmissions + retrans_before,
                        spurious: 0,
                        alpha: client.rto_controller().ewma_weight(dest),
                    });
                    retrans_before = 0;
                }
                Event::Timeout { .. } | Event::Reset { .. } => {
                    retrans_before += params.max_retransmit;
                }
            }
            next = true;
        }
        if next {
            if out.len() >= requests {
                break;
            }
            client
                .request(Instant::now(), dest, req())
                .map_err(|e| anyhow::anyhow!("request: {e}"))?;
            continue;
        }
        let wait = client
            .poll_timeout()
            .map(|t| t.saturating_duration_since(Instant::now()))
            .unwrap_or(Duration::from_millis(100))
            .clamp(Duration::from_micros(100), Duration::from_millis(100));
        sock.set_read_timeout(Some(wait))?;
        match sock.recv_from(&mut buf) {
            Ok((n, from)) => client.handle_datagram(Instant::now(), from, &buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                client.handle_timeout(Instant::now());
            }
            Err(e) => return Err(e).context("receiving"),
        }
        if last_report.elapsed() >= Duration::from_secs(5) {
            last_report = Instant::now();
            progress(&format!(
                "  {loss_pct}% {algorithm}: {}/{requests} requests, {:.0} s",
                out.len(),
                started.elapsed().as_secs_f64()
            ));
        }
    }
    drop(relay);
    drop(gw);
    Ok(out)
}

/// Several clients sharing the chain (beyond the paper).
struct SharedRow {
    clients: usize,
    algorithm: Algorithm,
    mean_rtt_ms: f64,
    p99_ms: f64,
    retransmissions: u64,
    spurious: u64,
    queue_drops: u64,
    goodput_rps: f64,
}

fn shared_study(seed: u64, requests: usize, loss_pct: u32) -> Vec<SharedRow> {
    let mut rows = Vec::new();
    for clients in [1usize, 4, 16] {
        for algorithm in Algorithm::ALL {
            let run = chain::run(&ChainConfig {
                loss: f64::from(loss_pct) / 100.0,
                algorithm,
                requests,
                clients,
                seed,
                ..ChainConfig::default()
            });
            let mut rtts: Vec<f64> = run
                .outcomes
                .iter()
                .flatten()
                .map(|o| o.rtt.as_secs_f64() * 1e3)
                .collect();
            rtts.sort_by(f64::total_cmp);
            let n = rtts.len();
            rows.push(SharedRow {
                clients,
                algorithm,
                mean_rtt_ms: rtts.iter().sum::<f64>() / n.max(1) as f64,
                p99_ms: rtts
                    .get(((n as f64 * 0.99).ceil() as usize).saturating_sub(1))
                    .copied()
                    .unwrap_or(0.0),
                retransmissions: run.retransmissions.iter().sum(),
                spurious: run.spurious.iter().sum(),
                queue_drops: run.net.queue_drops,
                goodput_rps: n as f64 / run.elapsed.as_secs_f64().max(1e-9),
            });
        }
    }
    rows
}

/// Runs the lab: Tables 1-3 (and the shared-chain study in the simulator).
pub fn lab_congestion(opts: &CongestionOptions) -> anyhow::Result<Summary> {
    let o = &opts.common;
    create_out(&o.out)?;
    let requests = opts
        .requests
        .unwrap_or(if opts.real && o.quick { 100 } else { 1000 })
        .max(INTERVALS);
    let runs = opts
        .runs
        // The simulator gets its 10 seeds in quick mode too: they cost half
        // a second, and 3 seeds were too few for the calibration check
        // (Basic's mean at 5 % over seeds 1-3 is 21 % above the paper's,
        // over 1-10 6 %), so `lab all --quick` missed a target the lab
        // meets.
        .unwrap_or(if opts.real { 1 } else { 10 })
        .max(1);
    let mode = model_summary(opts.real);
    (o.progress)(&format!(
        "congestion: {mode}; {requests} CON GETs per case, {runs} run(s) per case from seed {}",
        opts.seed
    ));
    // the simulations all at once, on every core
    let mut simulated = if opts.real {
        Vec::new()
    } else {
        let jobs: Vec<(u32, Algorithm, usize, u64)> = LOSSES
            .iter()
            .flat_map(|&l| Algorithm::ALL.iter().map(move |&a| (l, a)))
            .flat_map(|(l, a)| {
                (0..runs).map(move |r| (l, a, requests, opts.seed.wrapping_add(r as u64)))
            })
            .collect();
        sim_cases(&jobs)
    }
    .into_iter();
    let mut cases = Vec::new();
    for loss in LOSSES {
        for algorithm in Algorithm::ALL {
            let t = Instant::now();
            let mut per_run = Vec::with_capacity(runs);
            let mut sim_wall = Duration::ZERO;
            for r in 0..runs {
                let seed = opts.seed.wrapping_add(r as u64);
                let done = if opts.real {
                    real_case(loss, algorithm, requests, seed, o.progress.as_ref())?
                } else {
                    let (d, wall) = simulated
                        .next()
                        .expect("one simulation per (loss, algorithm, run)");
                    sim_wall += wall;
                    d
                };
                per_run.push(done);
            }
            let run_means: Vec<f64> = per_run
                .iter()
                .map(|r| {
                    r.iter().map(|d| d.rtt.as_secs_f64() * 1e3).sum::<f64>() / r.len().max(1) as f64
                })
                .collect();
            let spurious = per_run
                .iter()
                .map(|r| r.iter().map(|d| d.spurious as f64).sum::<f64>())
                .sum::<f64>()
                / runs as f64;
            let case = Case {
                loss_pct: loss,
                algorithm,
                intervals: split_intervals(&per_run),
                run_means,
                spurious,
                wall: if opts.real { t.elapsed() } else { sim_wall } / runs as u32,
            };
            (o.progress)(&format!(
                "  {loss:>2}% {:<8}: mean RTT {:8.1} ms (total of interval means {:8.1} ms), {:.0} ms wall per run",
                algorithm.name(),
                case.total() / INTERVALS as f64,
                case.total(),
                case.wall.as_secs_f64() * 1e3
            ));
            cases.push(case);
        }
    }

    let mut files = Vec::new();
    // the CSV
    let mut csv =
        String::from("loss_pct,algorithm,interval,mean_rtt_ms,alpha,retransmissions,p99_ms\n");
    for c in &cases {
        for (k, i) in c.intervals.iter().enumerate() {
            let _ = writeln!(
                csv,
                "{},{},{},{:.2},{},{:.1},{:.2}",
                c.loss_pct,
                c.algorithm.name(),
                k + 1,
                i.mean_rtt_ms,
                i.alpha.map(|a| format!("{a:.4}")).unwrap_or_default(),
                i.retransmissions,
                i.p99_ms
            );
        }
    }
    let csv_path = o.out.join("congestion.csv");
    write_file(&csv_path, &csv)?;
    files.push(csv_path);
    let svg_path = o.out.join("congestion.svg");
    plot(&svg_path, &cases, opts.real)?;
    files.push(svg_path);

    let shared = if opts.real {
        Vec::new()
    } else {
        (o.progress)("congestion: several clients sharing the chain at 10 % loss ...");
        let rows = shared_study(opts.seed, if o.quick { 100 } else { 250 }, 10);
        let mut csv = String::from(
            "clients,algorithm,loss_pct,mean_rtt_ms,p99_ms,retransmissions,spurious,queue_drops,goodput_rps\n",
        );
        for r in &rows {
            let _ = writeln!(
                csv,
                "{},{},10,{:.2},{:.2},{},{},{},{:.1}",
                r.clients,
                r.algorithm.name(),
                r.mean_rtt_ms,
                r.p99_ms,
                r.retransmissions,
                r.spurious,
                r.queue_drops,
                r.goodput_rps
            );
        }
        let p = o.out.join("congestion_clients.csv");
        write_file(&p, &csv)?;
        files.push(p);
        rows
    };

    let (table, met) = table(opts, &cases, &shared, requests, runs);
    Ok(Summary {
        lab: "congestion",
        table,
        files,
        target_met: Some(met),
    })
}

/// The network the lab runs, in a sentence.
fn model_summary(real: bool) -> String {
    let m = ChainConfig::default();
    let base = chain::base_rtt(&m);
    if real {
        format!(
            "end to end over loopback UDP through the impairment relay, the simulated chain's base \
             RTT ({:.1} ms: {:.1} ms +- {:.0} ms each way) and its loss split evenly over the two directions",
            base.as_secs_f64() * 1e3,
            base.as_secs_f64() * 1e3 / 2.0,
            m.host_jitter.as_secs_f64() * 1e3
        )
    } else {
        format!(
            "virtual-time simulator of the paper's 4-node chain (base RTT {:.1} ms: host path {:.0} ms +- {:.0} ms \
             each way, SLIP at 115,200 baud, {} radio hops of {:.0} ms + airtime at 250 kbit/s, no link-layer retries)",
            base.as_secs_f64() * 1e3,
            m.host_delay.as_secs_f64() * 1e3,
            m.host_jitter.as_secs_f64() * 1e3,
            m.target,
            m.hop_delay.as_secs_f64() * 1e3
        )
    }
}

fn find(cases: &[Case], loss: u32, a: Algorithm) -> &Case {
    cases
        .iter()
        .find(|c| c.loss_pct == loss && c.algorithm == a)
        .expect("every case ran")
}

/// The cells of Tables 1-3 the model cannot match, and why (the lab prints
/// the reason beside the miss; a test checks each is still a miss, so that
/// a stale entry is noticed).
const UNMATCHED: &[(u32, Algorithm, &str)] = &[(
    15,
    Algorithm::Adaptive,
    "the paper's Adaptive pays about 1 s per retransmission at 15 % (its total over its alpha \
     column) against about 0.45 s at 5 %: its RTO rose with the loss, which ours (Karn's rule: \
     retransmitted exchanges stay out of the window's mean RTT) does not do, and no network \
     setting moves this cell without moving the 5 % and Basic cells; and the paper's Table 3 \
     Adaptive column is its Table 1 Basic column value for value, so the total may not be a \
     measurement",
)];

/// A target's outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Met,
    /// A cell outside the tolerance that [`UNMATCHED`] explains: reported
    /// with its reason, not counted as a miss.
    Unmatched,
    Missed,
}

struct Check {
    what: String,
    status: Status,
}

/// How far a cell may be from the paper's total, percent.
pub const CALIBRATION_TOLERANCE_PCT: f64 = 15.0;

fn table(
    opts: &CongestionOptions,
    cases: &[Case],
    shared: &[SharedRow],
    requests: usize,
    runs: usize,
) -> (String, bool) {
    let mut t = String::new();
    let mut checks: Vec<Check> = Vec::new();
    line(
        &mut t,
        format_args!(
            "Paper 002, Tables 1-3, first the calibration: each cell is the total of the 10 interval \
             mean RTTs, ms ({requests} CON GETs per case, {}; ours: mean over {runs} run(s) from seed {})",
            if opts.real {
                "real UDP through the relay"
            } else {
                "simulated chain"
            },
            opts.seed
        ),
    );
    line(
        &mut t,
        format_args!(
            "{:>5}  {:<9} {:>10} {:>21} {:>10} {:>9}  {}",
            "loss", "algorithm", "ours", "runs min-max", "paper", "ours/paper", "within 15%"
        ),
    );
    for (li, &loss) in LOSSES.iter().enumerate() {
        for (ai, &alg) in Algorithm::ALL.iter().enumerate() {
            let c = find(cases, loss, alg);
            let paper_total = paper::TABLES[li].totals[ai];
            let dev = (c.total() / paper_total - 1.0) * 100.0;
            let ok = dev.abs() <= CALIBRATION_TOLERANCE_PCT;
            // a run's total of interval means is 10 x its mean (equal intervals)
            let lo = c.run_means.iter().copied().fold(f64::INFINITY, f64::min) * INTERVALS as f64;
            let hi = c.run_means.iter().copied().fold(0.0, f64::max) * INTERVALS as f64;
            line(
                &mut t,
                format_args!(
                    "{:>4}%  {:<9} {:>10.1} {:>10.1}-{:<10.1} {:>10.1} {:>+9.1}%  {}",
                    loss,
                    alg.name(),
                    c.total(),
                    lo,
                    hi,
                    paper_total,
                    dev,
                    if ok { "yes" } else { "NO" }
                ),
            );
            let why = UNMATCHED
                .iter()
                .find(|(l, a, _)| *l == loss && *a == alg)
                .map(|(_, _, w)| *w);
            checks.push(Check {
                what: format!(
                    "calibration {loss}% {}: {:.1} vs the paper's {paper_total:.1} ms ({dev:+.1}%; target: within {CALIBRATION_TOLERANCE_PCT:.0}%){}",
                    alg.name(),
                    c.total(),
                    why.map(|w| format!(": cannot be matched: {w}")).unwrap_or_default()
                ),
                status: match (ok, why) {
                    (true, _) => Status::Met,
                    (false, Some(_)) => Status::Unmatched,
                    (false, None) => Status::Missed,
                },
            });
        }
    }
    let calibrated = checks.iter().all(|c| c.status == Status::Met);
    line(&mut t, format_args!(""));
    line(
        &mut t,
        format_args!(
            "Then the gains on this model{}: how much faster Adaptive RTO is (1 - total / other's total)",
            if calibrated {
                " (all nine cells calibrated)"
            } else {
                " (NOT all nine cells calibrated: read the gains with the cells above)"
            }
        ),
    );
    line(
        &mut t,
        format_args!(
            "{:>5}  {:>17} {:>8}  {:>17} {:>8}  {}",
            "loss",
            "A vs Basic, ours",
            "paper",
            "A vs CoCoA, ours",
            "paper",
            "Adaptive beats CoCoA?"
        ),
    );
    for (li, &loss) in LOSSES.iter().enumerate() {
        let b = find(cases, loss, Algorithm::Basic);
        let c = find(cases, loss, Algorithm::Cocoa);
        let a = find(cases, loss, Algorithm::Adaptive);
        let ab = (1.0 - a.total() / b.total()) * 100.0;
        let ac = (1.0 - a.total() / c.total()) * 100.0;
        let seeds_won = c
            .run_means
            .iter()
            .zip(&a.run_means)
            .filter(|(c, a)| a < c)
            .count();
        line(
            &mut t,
            format_args!(
                "{:>4}%  {:>16.1}% {:>7.1}%  {:>16.1}% {:>7.1}%  {} (on {seeds_won} of {} run(s))",
                loss,
                ab,
                paper::ADAPTIVE_VS_BASIC[li],
                ac,
                paper::ADAPTIVE_VS_COCOA[li],
                if ac > 0.0 {
                    format!("yes, by {ac:.1}%")
                } else {
                    format!("no, slower by {:.1}%", -ac)
                },
                a.run_means.len()
            ),
        );
    }
    if !opts.real {
        let slowest = cases.iter().map(|c| c.wall).max().unwrap_or_default();
        checks.push(Check {
            what: format!(
                "speed: slowest simulated {requests}-request case {:.0} ms of wall time (under 1 s)",
                slowest.as_secs_f64() * 1e3
            ),
            status: if slowest < Duration::from_secs(1) {
                Status::Met
            } else {
                Status::Missed
            },
        });
    }
    line(&mut t, format_args!(""));
    line(
        &mut t,
        format_args!("Adaptive RTO's alpha per interval at 15% (ours / paper):"),
    );
    let a15 = find(cases, 15, Algorithm::Adaptive);
    let alphas: Vec<String> = a15
        .intervals
        .iter()
        .zip(paper::TABLES[2].alpha)
        .map(|(i, p)| {
            format!(
                "{}/{p:.2}",
                i.alpha.map(|a| format!("{a:.2}")).unwrap_or("-".into())
            )
        })
        .collect();
    line(&mut t, format_args!("  {}", alphas.join(" ")));
    if opts.real {
        line(
            &mut t,
            format_args!(
                "Spurious retransmissions: not measured end to end (the simulator tags each copy)"
            ),
        );
    } else {
        line(
            &mut t,
            format_args!(
                "Spurious retransmissions per run (sent after the copy that got through): {}",
                cases
                    .iter()
                    .map(|c| format!("{}%/{} {:.0}", c.loss_pct, c.algorithm.name(), c.spurious))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
    }
    if !shared.is_empty() {
        line(&mut t, format_args!(""));
        line(
            &mut t,
            format_args!("Beyond the paper: clients sharing the chain at 10% loss (NSTART 1 each)"),
        );
        line(
            &mut t,
            format_args!(
                "{:>7} {:<9} {:>10} {:>10} {:>8} {:>9} {:>11} {:>9}",
                "clients",
                "algorithm",
                "mean ms",
                "p99 ms",
                "retrans",
                "spurious",
                "queue drops",
                "req/s"
            ),
        );
        for r in shared {
            line(
                &mut t,
                format_args!(
                    "{:>7} {:<9} {:>10.1} {:>10.1} {:>8} {:>9} {:>11} {:>9.1}",
                    r.clients,
                    r.algorithm.name(),
                    r.mean_rtt_ms,
                    r.p99_ms,
                    r.retransmissions,
                    r.spurious,
                    r.queue_drops,
                    r.goodput_rps
                ),
            );
        }
    }
    line(&mut t, format_args!(""));
    line(&mut t, format_args!("Targets:"));
    let mut all_met = true;
    for c in &checks {
        all_met &= c.status != Status::Missed;
        line(
            &mut t,
            format_args!(
                "  [{}] {}",
                match c.status {
                    Status::Met => "met",
                    Status::Unmatched => "unmatched, explained",
                    Status::Missed => "MISSED",
                },
                c.what
            ),
        );
    }
    line(
        &mut t,
        format_args!(
            "Model: {}; \"loss\" is the chance that an exchange (request or response) is lost, as \
             the paper's Basic and alpha columns require (mintgate_netsim::sim::chain documents \
             each parameter).",
            model_summary(opts.real)
        ),
    );
    (t, all_met)
}

const COLORS: [RGBColor; 3] = [
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0x2c, 0xa0, 0x2c),
];

use crate::plot::err;

/// `congestion.svg`: per loss level, the interval means of the three
/// algorithms (solid: ours; dashed: the paper's).
fn plot(path: &Path, cases: &[Case], real: bool) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (1200, 460)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let panels = root.split_evenly((1, 3));
    for (li, (panel, &loss)) in panels.iter().zip(LOSSES.iter()).enumerate() {
        let ymax = Algorithm::ALL
            .iter()
            .flat_map(|&a| find(cases, loss, a).intervals.iter().map(|i| i.mean_rtt_ms))
            .chain(paper::TABLES[li].rtt.iter().flatten().copied())
            .fold(1.0, f64::max)
            * 1.1;
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!(
                    "{loss}% loss ({})",
                    if real { "real UDP" } else { "simulated" }
                ),
                ("sans-serif", 18),
            )
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(55)
            .build_cartesian_2d(0.5f64..10.5f64, 0f64..ymax)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("interval (100 requests)")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_desc("mean RTT, ms")
            .draw()
            .map_err(err)?;
        for (ai, &a) in Algorithm::ALL.iter().enumerate() {
            let c = find(cases, loss, a);
            let color = COLORS[ai];
            chart
                .draw_series(LineSeries::new(
                    c.intervals
                        .iter()
                        .enumerate()
                        .map(|(k, i)| ((k + 1) as f64, i.mean_rtt_ms)),
                    color.stroke_width(2),
                ))
                .map_err(err)?
                .label(format!("{} (ours)", a.name()))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
            chart
                .draw_series(DashedLineSeries::new(
                    paper::TABLES[li].rtt[ai]
                        .iter()
                        .enumerate()
                        .map(|(k, &v)| ((k + 1) as f64, v)),
                    6,
                    4,
                    color.stroke_width(1),
                ))
                .map_err(err)?
                .label(format!("{} (paper)", a.name()))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.mix(0.5)));
        }
        crate::plot::legend(
            chart
                .configure_series_labels()
                .label_font(("sans-serif", 11)),
            SeriesLabelPosition::MiddleRight,
        )?;
    }
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_split_runs_into_ten_and_average_across_runs() {
        let d = |ms: u64, re: u32| Done {
            rtt: Duration::from_millis(ms),
            retransmissions: re,
            spurious: 0,
            alpha: None,
        };
        let run_a: Vec<Done> = (0..100).map(|i| d(10 * (i / 10 + 1), 0)).collect();
        let run_b: Vec<Done> = (0..100).map(|i| d(30 * (i / 10 + 1), 1)).collect();
        let rows = split_intervals(&[run_a, run_b]);
        assert_eq!(rows.len(), 10);
        // interval k: (10 (k+1) + 30 (k+1)) / 2
        for (k, r) in rows.iter().enumerate() {
            assert!(
                (r.mean_rtt_ms - 20.0 * (k + 1) as f64).abs() < 1e-9,
                "{r:?}"
            );
            assert!((r.retransmissions - 5.0).abs() < 1e-9);
            assert!((r.p99_ms - 30.0 * (k + 1) as f64).abs() < 1e-9);
            assert!(r.alpha.is_none());
        }
    }

    /// Pins the calibration: the lab's simulated cells (seeds 1-10, as the
    /// lab runs them by default) within 15 % of the paper's totals, except
    /// the cells listed as unmatched, which must still be misses. Virtual
    /// time: 90 runs of 1,000 exchanges take a few seconds.
    #[test]
    fn the_simulated_chain_reproduces_the_papers_nine_cells() {
        let mut report = Vec::new();
        let mut bad = Vec::new();
        for (li, &loss) in LOSSES.iter().enumerate() {
            for (ai, &alg) in Algorithm::ALL.iter().enumerate() {
                let jobs: Vec<_> = (1..=10).map(|seed| (loss, alg, 1000, seed)).collect();
                let runs: Vec<Vec<Done>> = sim_cases(&jobs).into_iter().map(|r| r.0).collect();
                assert!(runs.iter().all(|r| r.len() == 1000), "{loss}% {alg}");
                let total: f64 = split_intervals(&runs).iter().map(|i| i.mean_rtt_ms).sum();
                let paper = paper::TABLES[li].totals[ai];
                let dev = (total / paper - 1.0) * 100.0;
                let listed = UNMATCHED.iter().any(|(l, a, _)| *l == loss && *a == alg);
                let within = dev.abs() <= CALIBRATION_TOLERANCE_PCT;
                report.push(format!(
                    "{loss}% {alg}: {total:.1} vs {paper:.1} ({dev:+.1}%)"
                ));
                if within == listed {
                    bad.push(report.last().cloned().unwrap_or_default());
                }
            }
        }
        assert!(
            bad.is_empty(),
            "cells off their calibration (listed as unmatched but within 15 %, or outside \
             15 % and not listed): {bad:?}; all: {report:#?}"
        );
    }

    #[test]
    fn paper_totals_match_their_intervals() {
        for t in &paper::TABLES {
            for a in 0..3 {
                let sum: f64 = t.rtt[a].iter().sum();
                assert!((sum - t.totals[a]).abs() < 1.0, "{} {a}: {sum}", t.loss_pct);
            }
        }
    }
}
