//! `lab clients` (paper 000, Figs. 9-10) and `lab blocksize` (Fig. 11):
//! throughput against the number of clients, and against the size of the
//! answer, for mintgate with the VTA pool (the paper's MinT-I), mintgate
//! with a fixed pool of one handler per core (the paper's MinT) and libcoap
//! (the peer here; the paper's was Californium).
//!
//! Each client sends 10 NON GETs per second, open loop, from its own
//! socket, as in the paper. Every measurement starts fresh servers, and the
//! order of the servers alternates between runs so that none always runs
//! first on a shared machine.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use mintgate_gateway::config::HandlerCost;
use mintgate_loadgen::{LoadSpec, Mode};
use plotters::prelude::*;

use crate::peers::{self, ServerKind};
use crate::{create_out, line, write_file, LabOptions, Summary, RATE_PER_CLIENT};

/// Loss above this share of the offered requests counts as "losing
/// requests".
const LOSS_THRESHOLD: f64 = 0.001;

/// Settings of the two comparison labs.
#[derive(Clone)]
pub struct CompareOptions {
    /// Output folder, `quick`, progress; `duration` is the measured time per
    /// step [60 s; quick 4 s]; `handler_cost` what `/request` costs
    /// [default none here: the peers' handlers cost nothing either].
    pub common: LabOptions,
    /// Client counts [clients: 1, 10, 100, 500, 1000, 2000, 3000, 5000,
    /// 7500, 10000; quick: 100, 1000, 3000, 6000. blocksize: 1000 to
    /// 10000 by 1000; quick: 1000, 5000].
    pub clients: Option<Vec<usize>>,
    /// Runs per step [3; quick 1].
    pub runs: Option<usize>,
    /// Pause between steps [60 s; quick 1 s].
    pub cooldown: Option<Duration>,
    /// `blocksize`: answer payload sizes in bytes [8, 64, 128, 256, 512,
    /// 1000; quick 8, 256, 1000].
    pub sizes: Option<Vec<usize>>,
    /// Leave libcoap out even where it is installed.
    pub no_libcoap: bool,
}

impl Default for CompareOptions {
    fn default() -> Self {
        CompareOptions {
            common: LabOptions {
                handler_cost: HandlerCost::None,
                ..LabOptions::default()
            },
            clients: None,
            runs: None,
            cooldown: None,
            sizes: None,
            no_libcoap: false,
        }
    }
}

impl CompareOptions {
    fn duration(&self) -> Duration {
        self.common
            .duration
            .unwrap_or(Duration::from_secs(if self.common.quick { 4 } else { 60 }))
    }

    fn runs(&self) -> usize {
        self.runs
            .unwrap_or(if self.common.quick { 1 } else { 3 })
            .max(1)
    }

    fn cooldown(&self) -> Duration {
        self.cooldown
            .unwrap_or(Duration::from_secs(if self.common.quick { 1 } else { 60 }))
    }

    fn servers(&self) -> Vec<ServerKind> {
        let mut v = vec![ServerKind::MintgateVta, ServerKind::MintgateFixed];
        if !self.no_libcoap {
            if peers::libcoap_available() {
                v.push(ServerKind::Libcoap);
            } else {
                (self.common.progress)(
                    "libcoap (coap-server-notls, Debian libcoap3-bin) not found: comparing mintgate only",
                );
            }
        }
        v
    }
}

/// One measurement.
#[derive(Clone, Debug)]
struct Point {
    server: ServerKind,
    clients: usize,
    size: usize,
    run: usize,
    offered_rps: f64,
    answered_rps: f64,
    loss: f64,
    p99_ms: f64,
}

/// Measures one server under `clients` x 10/s for the duration.
fn measure(
    opts: &CompareOptions,
    server: ServerKind,
    clients: usize,
    resource: &str,
    payload: &[u8],
    run: usize,
) -> anyhow::Result<Point> {
    let (running, addr) = peers::start(server, opts.common.handler_cost, resource, payload)?;
    let mut spec = LoadSpec::new(
        addr,
        format!("/{resource}"),
        Mode::Open {
            clients,
            rate_per_client: RATE_PER_CLIENT,
        },
    );
    spec.duration = opts.duration();
    spec.warmup = Duration::from_secs(if opts.common.quick { 1 } else { 2 });
    spec.timeout = Duration::from_secs(2);
    let r = mintgate_loadgen::run(&spec, |_| {})
        .with_context(|| format!("load against {}", server.name()))?;
    drop(running);
    let offered = r.sent + r.skipped;
    Ok(Point {
        server,
        clients,
        size: payload.len(),
        run,
        offered_rps: offered as f64 / r.measured.as_secs_f64().max(1e-9),
        answered_rps: r.requests_per_sec,
        loss: if offered == 0 {
            0.0
        } else {
            (r.lost + r.skipped + r.errors) as f64 / offered as f64
        },
        p99_ms: r.latency.p99.as_secs_f64() * 1e3,
    })
}

/// Runs every (step, run, server), alternating the server order per run.
fn sweep(
    opts: &CompareOptions,
    steps: &[(usize, usize)],
    name: &str,
) -> anyhow::Result<Vec<Point>> {
    let servers = opts.servers();
    let runs = opts.runs();
    let total = steps.len() * runs * servers.len();
    let started = Instant::now();
    let mut points = Vec::new();
    let hello = b"hello world".to_vec();
    for (si, &(clients, size)) in steps.iter().enumerate() {
        let (resource, payload) = if size == 0 {
            ("request", hello.clone())
        } else {
            ("echo", vec![b'x'; size])
        };
        for run in 0..runs {
            let mut order = servers.clone();
            if (si + run) % 2 == 1 {
                order.reverse();
            }
            for server in order {
                let p = measure(opts, server, clients, resource, &payload, run + 1)?;
                let done = points.len() + 1;
                let eta = started.elapsed().as_secs_f64() / done as f64 * (total - done) as f64;
                (opts.common.progress)(&format!(
                    "lab {name}: [{done}/{total}] {:<14} {clients:>5} clients, {} B: {:>8.0} answered/s of {:>8.0}, loss {:.2}%, p99 {:.1} ms (about {:.0} s left)",
                    server.name(),
                    payload.len(),
                    p.answered_rps,
                    p.offered_rps,
                    p.loss * 100.0,
                    p.p99_ms,
                    eta
                ));
                points.push(p);
                std::thread::sleep(opts.cooldown().min(Duration::from_secs(3600)));
            }
        }
    }
    Ok(points)
}

/// Mean answered rate and loss of `server` at (`clients`, `size`) over runs.
fn mean_of(
    points: &[Point],
    server: ServerKind,
    clients: usize,
    size: usize,
) -> Option<(f64, f64)> {
    let v: Vec<&Point> = points
        .iter()
        .filter(|p| p.server == server && p.clients == clients && p.size == size)
        .collect();
    if v.is_empty() {
        return None;
    }
    let n = v.len() as f64;
    Some((
        v.iter().map(|p| p.answered_rps).sum::<f64>() / n,
        v.iter().map(|p| p.loss).sum::<f64>() / n,
    ))
}

fn csv(points: &[Point]) -> String {
    let mut s = String::from("server,clients,size,run,offered_rps,answered_rps,loss_pct,p99_ms\n");
    for p in points {
        let _ = writeln!(
            s,
            "{},{},{},{},{:.1},{:.1},{:.3},{:.2}",
            p.server.name(),
            p.clients,
            p.size,
            p.run,
            p.offered_rps,
            p.answered_rps,
            p.loss * 100.0,
            p.p99_ms
        );
    }
    s
}

/// `mintgate lab clients`: throughput against 1..10,000 clients.
pub fn lab_clients(opts: &CompareOptions) -> anyhow::Result<Summary> {
    let o = &opts.common;
    create_out(&o.out)?;
    let counts = opts.clients.clone().unwrap_or_else(|| {
        if o.quick {
            vec![100, 1000, 3000, 6000]
        } else {
            vec![1, 10, 100, 500, 1000, 2000, 3000, 5000, 7500, 10_000]
        }
    });
    (o.progress)(&format!(
        "lab clients: {:?} clients x 10 NON GET/s, {:?} per step, {} run(s), {:?} cool-down, handler {}",
        counts,
        opts.duration(),
        opts.runs(),
        opts.cooldown(),
        o.handler_cost
    ));
    let steps: Vec<(usize, usize)> = counts.iter().map(|&c| (c, 0)).collect();
    let points = sweep(opts, &steps, "clients")?;
    let servers: Vec<ServerKind> = opts.servers();
    let csv_path = o.out.join("clients.csv");
    write_file(&csv_path, &csv(&points))?;
    let svg_path = o.out.join("clients.svg");
    plot(
        &svg_path,
        &points,
        &servers,
        &counts,
        |p| p.clients as f64,
        0,
        "clients (10 requests/s each)",
        "Throughput by clients (paper 000 Figs. 9-10)",
    )?;

    let mut t = String::new();
    line(
        &mut t,
        format_args!(
            "lab clients (paper 000 Figs. 9-10): answered requests/s, mean of {} run(s) (loss % in brackets)",
            opts.runs()
        ),
    );
    let mut head = format!("{:>8} {:>9}", "clients", "offered");
    for s in &servers {
        let _ = write!(head, " {:>22}", s.name());
    }
    line(&mut t, format_args!("{head}"));
    for &c in &counts {
        let mut row = format!("{c:>8} {:>9.0}", c as f64 * RATE_PER_CLIENT);
        for &s in &servers {
            if let Some((rps, loss)) = mean_of(&points, s, c, 11) {
                let _ = write!(row, " {:>13.0} ({:>5.2}%)", rps, loss * 100.0);
            }
        }
        line(&mut t, format_args!("{row}"));
    }
    line(&mut t, format_args!(""));
    for &s in &servers {
        let first = counts
            .iter()
            .find(|&&c| mean_of(&points, s, c, 11).is_some_and(|(_, loss)| loss > LOSS_THRESHOLD));
        let peak = counts
            .iter()
            .filter_map(|&c| mean_of(&points, s, c, 11).map(|m| m.0))
            .fold(0.0, f64::max);
        line(
            &mut t,
            format_args!(
                "{:<14} first loses requests (> {:.1}%) at {}; peak {:.0} answered/s",
                s.name(),
                LOSS_THRESHOLD * 100.0,
                first.map_or("no step measured".to_string(), |c| format!("{c} clients")),
                peak
            ),
        );
    }
    ratios(&mut t, &points, &servers, &counts, 11);
    line(
        &mut t,
        format_args!(
            "Paper (text, no table): MinT, MinT-I and Californium alike up to 700 clients; MinT-I ahead from 800; \
             overall MinT-I +25% over MinT, +35% over Californium (Raspberry Pi 3, 4 cores)."
        ),
    );
    Ok(Summary {
        lab: "clients",
        table: t,
        files: vec![csv_path, svg_path],
        target_met: None,
    })
}

/// Ratios of mintgate VTA's mean answered rate over the other servers,
/// over the steps where every server was measured.
fn ratios(t: &mut String, points: &[Point], servers: &[ServerKind], counts: &[usize], size: usize) {
    let total = |s: ServerKind| -> f64 {
        counts
            .iter()
            .filter_map(|&c| mean_of(points, s, c, size).map(|m| m.0))
            .sum()
    };
    let vta = total(ServerKind::MintgateVta);
    for &s in servers.iter().filter(|&&s| s != ServerKind::MintgateVta) {
        let other = total(s);
        if other > 0.0 {
            line(
                t,
                format_args!(
                    "mintgate_vta vs {}: {:+.1}% (sum of the steps' mean answered rates)",
                    s.name(),
                    (vta / other - 1.0) * 100.0
                ),
            );
        }
    }
}

/// `mintgate lab blocksize`: throughput against the answer's size.
pub fn lab_blocksize(opts: &CompareOptions) -> anyhow::Result<Summary> {
    let o = &opts.common;
    create_out(&o.out)?;
    let sizes = opts.sizes.clone().unwrap_or_else(|| {
        if o.quick {
            vec![8, 256, 1000]
        } else {
            vec![8, 64, 128, 256, 512, 1000]
        }
    });
    anyhow::ensure!(
        sizes.iter().all(|&s| (1..=1024).contains(&s)),
        "sizes must be 1..=1024 bytes (one CoAP datagram)"
    );
    let counts = opts.clients.clone().unwrap_or_else(|| {
        if o.quick {
            vec![1000, 5000]
        } else {
            (1..=10).map(|k| k * 1000).collect()
        }
    });
    (o.progress)(&format!(
        "lab blocksize: answers of {sizes:?} bytes, {counts:?} clients x 10 NON GET/s, {:?} per step, {} run(s)",
        opts.duration(),
        opts.runs()
    ));
    let steps: Vec<(usize, usize)> = sizes
        .iter()
        .flat_map(|&s| counts.iter().map(move |&c| (c, s)))
        .collect();
    let points = sweep(opts, &steps, "blocksize")?;
    let servers = opts.servers();
    let csv_path = o.out.join("blocksize.csv");
    write_file(&csv_path, &csv(&points))?;
    // average over the client counts, as the paper did (1,000 to 10,000)
    let averaged: Vec<Point> = servers
        .iter()
        .flat_map(|&s| sizes.iter().map(move |&z| (s, z)))
        .map(|(s, z)| {
            let v: Vec<f64> = counts
                .iter()
                .filter_map(|&c| mean_of(&points, s, c, z).map(|m| m.0))
                .collect();
            Point {
                server: s,
                clients: 0,
                size: z,
                run: 0,
                offered_rps: 0.0,
                answered_rps: v.iter().sum::<f64>() / v.len().max(1) as f64,
                loss: 0.0,
                p99_ms: 0.0,
            }
        })
        .collect();
    let svg_path = o.out.join("blocksize.svg");
    plot(
        &svg_path,
        &averaged,
        &servers,
        &sizes,
        |p| p.size as f64,
        1,
        "answer payload, bytes",
        "Throughput by answer size, averaged over client counts (paper 000 Fig. 11)",
    )?;
    let mut t = String::new();
    line(
        &mut t,
        format_args!(
            "lab blocksize (paper 000 Fig. 11): answered requests/s averaged over {counts:?} clients"
        ),
    );
    let mut head = format!("{:>6}", "bytes");
    for s in &servers {
        let _ = write!(head, " {:>15}", s.name());
    }
    line(&mut t, format_args!("{head}"));
    for &z in &sizes {
        let mut row = format!("{z:>6}");
        for &s in &servers {
            let v = averaged
                .iter()
                .find(|p| p.server == s && p.size == z)
                .map_or(0.0, |p| p.answered_rps);
            let _ = write!(row, " {v:>15.0}");
        }
        line(&mut t, format_args!("{row}"));
    }
    for &s in servers.iter().filter(|&&s| s != ServerKind::MintgateVta) {
        let mean_ratio = sizes
            .iter()
            .filter_map(|&z| {
                let a = averaged
                    .iter()
                    .find(|p| p.server == ServerKind::MintgateVta && p.size == z)?;
                let b = averaged.iter().find(|p| p.server == s && p.size == z)?;
                (b.answered_rps > 0.0).then(|| a.answered_rps / b.answered_rps)
            })
            .collect::<Vec<f64>>();
        if !mean_ratio.is_empty() {
            line(
                &mut t,
                format_args!(
                    "mintgate_vta vs {}: {:+.1}% on average over the sizes",
                    s.name(),
                    (mean_ratio.iter().sum::<f64>() / mean_ratio.len() as f64 - 1.0) * 100.0
                ),
            );
        }
    }
    line(
        &mut t,
        format_args!(
            "Paper (text): throughput falls as blocks grow for all; MinT-I +5% over MinT and +30% over Californium on average."
        ),
    );
    Ok(Summary {
        lab: "blocksize",
        table: t,
        files: vec![csv_path, svg_path],
        target_met: None,
    })
}

const COLORS: [RGBColor; 3] = [
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
];

use crate::plot::err;

/// Answered rate per server against `x` (mean over runs at each x).
#[allow(clippy::too_many_arguments)]
fn plot(
    path: &Path,
    points: &[Point],
    servers: &[ServerKind],
    xs: &[usize],
    x_of: fn(&Point) -> f64,
    _kind: u8,
    x_desc: &str,
    caption: &str,
) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let xmax = xs.iter().copied().max().unwrap_or(1) as f64 * 1.05;
    let ymax = points.iter().map(|p| p.answered_rps).fold(1.0, f64::max) * 1.15;
    // Set up like plot.rs's figures: see the note there.
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..xmax, 0f64..ymax)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc("answered requests/s")
        .draw()
        .map_err(err)?;
    for (i, &s) in servers.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let mut series: Vec<(f64, f64)> = xs
            .iter()
            .filter_map(|&x| {
                let v: Vec<f64> = points
                    .iter()
                    .filter(|p| p.server == s && (x_of(p) - x as f64).abs() < 0.5)
                    .map(|p| p.answered_rps)
                    .collect();
                (!v.is_empty()).then(|| (x as f64, v.iter().sum::<f64>() / v.len() as f64))
            })
            .collect();
        series.sort_by(|a, b| a.0.total_cmp(&b.0));
        chart
            .draw_series(LineSeries::new(series.clone(), color.stroke_width(2)))
            .map_err(err)?
            .label(s.name())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
        chart
            .draw_series(
                series
                    .iter()
                    .map(|&(x, y)| Circle::new((x, y), 3, color.filled())),
            )
            .map_err(err)?;
    }
    crate::plot::legend(
        &mut chart.configure_series_labels(),
        SeriesLabelPosition::MiddleRight,
    )?;
    root.present().map_err(err)?;
    Ok(())
}
