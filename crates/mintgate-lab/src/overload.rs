//! `lab overload`: a `mintgate serve` process at ten times its capacity
//! (the product's own target; no paper measures overload). It must stay responsive, keep its memory bounded and
//! count what it sheds.
//!
//! 1. The gateway runs as a child process (the same executable) with a
//!    capacity small and stable enough for the load generator on the same
//!    machine to offer ten times as much: two handler threads (`--pool
//!    fixed:2`) and a 1 ms blocking handler (`--handler-cost block:1ms`, a
//!    sensor read), so about 2,000 answers/s. Everything else is the default
//!    configuration (so the HTP queue is its default size, and one source may
//!    hold half of it: `pipeline.peer_queue_share`).
//! 2. Capacity: the answers/s of a closed-loop load (64 clients x 8).
//! 3. Overload: open loop, NON GETs, 10 requests/s per client (the paper's
//!    rate) from `11 x capacity / 10` clients, for 60 s (`--quick`: 30 s):
//!    11x asked for, so that what reaches the gateway is at least 10x
//!    after the generator's pacing and the kernel's socket buffer.
//!    The load generator's clients all send from 127.0.0.1.
//! 4. Meanwhile a probe sends a CON GET every second from 127.0.0.2
//!    ([`mintgate_loadgen::probe`]), and every second the gateway's
//!    counters (`/metrics`) and VmRSS (`/proc/PID/status`) are read.
//!
//! Targets (each printed as met / NOT met):
//! - the offered load, counted as the datagrams the gateway read, was at
//!   least 10 x capacity;
//! - every probe answered 2.05 within its first two retransmissions: RFC
//!   7252 timing with ACK_TIMEOUT = 2 s and ACK_RANDOM_FACTOR = 1
//!   (retransmissions at 2 s and 6 s), so before the third would be due,
//!   14 s after the first transmission;
//! - every datagram the gateway read is either handled or counted as shed
//!   (`mintgate_dropped_total`), within 0.1 %;
//! - VmRSS stays at most 64 MiB (the footprint lab's loaded bound, or
//!   `rss_limit`) and does not grow once settled: the peak after the
//!   first minute (or the first half, for runs shorter than two minutes)
//!   is within 1 MiB of VmRSS at that moment. (It rises for the first
//!   10-15 s of an overload, about 12 MiB in all, then stays flat; hence
//!   30 s even with `--quick`.)
//!
//! With `many_sources` every client sends from a loopback address of its
//! own (127.1.0.1, 127.1.0.2, ...: the load generator's shared socket), so
//! the flood is of distinct message IDs from thousands of sources: every
//! per-source table (de-duplication, fair queue, validation) sees a new
//! source per client, and must stay bounded all the same.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use mintgate_loadgen::probe::{run_probes, ProbeResult, ProbeSpec};
use mintgate_loadgen::{LoadSpec, Mode};
use plotters::prelude::*;

use crate::footprint::{
    free_tcp_port, free_udp_port, mib, proc_mem, scrape, sum_family, wait_answering, Proc,
    LOAD_TARGET,
};
use crate::{line, LabOptions, Summary};

/// How many times capacity is offered.
pub const OVERLOAD_FACTOR: f64 = 11.0;
/// Requests/s per client in the overload (the paper's rate).
const RATE: f64 = 10.0;
/// The least offered/capacity ratio, as the gateway read it, that counts as
/// "ten times" (the target).
const FACTOR_TARGET: f64 = 10.0;

/// One second of the overload.
#[derive(Clone, Debug, Default)]
pub struct OverloadRow {
    /// Seconds since the overload started (end of the second).
    pub t: f64,
    /// Datagrams the gateway read in the second.
    pub offered: f64,
    /// Requests it handled.
    pub handled: f64,
    /// Requests it shed (all reasons).
    pub shed: f64,
    /// Of those, shed at the per-source limit.
    pub peer_limited: f64,
    /// VmRSS at the end of the second, bytes.
    pub rss: u64,
    /// The probe sent in this second: latency (ms) and code.
    pub probe: Option<ProbeResult>,
}

struct Counters {
    datagrams: f64,
    handled: f64,
    shed: f64,
    peer_limited: f64,
    /// Duplicates, ignored and malformed datagrams (neither handled nor shed).
    other: f64,
}

fn read_counters(metrics: SocketAddr) -> anyhow::Result<Counters> {
    let text = scrape(metrics)?;
    let f = |name: &str| sum_family(&text, name).unwrap_or(0.0);
    let peer_limited = text
        .lines()
        .find_map(|l| l.strip_prefix("mintgate_dropped_total{reason=\"peer_limit\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    Ok(Counters {
        datagrams: f("mintgate_nr_datagrams_total"),
        handled: f("mintgate_htp_handled_total"),
        shed: f("mintgate_dropped_total"),
        peer_limited,
        other: f("mintgate_duplicates_total")
            + f("mintgate_ignored_total")
            + f("mintgate_malformed_total"),
    })
}

/// Runs the lab with `exe` as the `mintgate` executable. `rss_limit`: the
/// memory bound in bytes (`None`: 64 MiB); `many_sources`: each client
/// from a loopback address of its own. Writes `overload.csv`,
/// `overload.svg` and `overload-serve.log`.
pub fn lab_overload(
    opts: &LabOptions,
    exe: &Path,
    rss_limit: Option<u64>,
    many_sources: bool,
) -> anyhow::Result<Summary> {
    crate::create_out(&opts.out)?;
    let progress = &opts.progress;
    let rss_limit = rss_limit.unwrap_or(LOAD_TARGET);
    let duration = opts
        .duration
        .unwrap_or(Duration::from_secs(if opts.quick { 30 } else { 60 }));
    let log = opts.out.join("overload-serve.log");
    let coap: SocketAddr = format!("127.0.0.1:{}", free_udp_port()?).parse()?;
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_tcp_port()?).parse()?;
    let child = Command::new(exe)
        .args([
            "--log",
            "warn",
            "serve",
            "--pool",
            "fixed:2",
            "--handler-cost",
            "block:1ms",
        ])
        .arg("--coap")
        .arg(coap.to_string())
        .arg("--metrics")
        .arg(metrics.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?)
        .spawn()
        .with_context(|| format!("starting {} serve", exe.display()))?;
    let mut p = Proc(child);
    let pid = p.0.id();
    wait_answering(coap, Duration::from_secs(15))?;

    // capacity, closed loop
    let mut cap_spec = LoadSpec::new(
        coap,
        "/request",
        Mode::Closed {
            clients: 64,
            window: 8,
        },
    );
    cap_spec.duration = Duration::from_secs(if opts.quick { 3 } else { 5 });
    cap_spec.warmup = Duration::from_secs(1);
    cap_spec.timeout = Duration::from_secs(2);
    let cap = mintgate_loadgen::run(&cap_spec, |_| {}).context("measuring capacity")?;
    let capacity = cap.requests_per_sec;
    anyhow::ensure!(
        capacity > 0.0,
        "the gateway answered nothing in the capacity run"
    );
    let clients = ((OVERLOAD_FACTOR * capacity / RATE).ceil() as usize).max(1);
    progress(&format!(
        "lab overload: capacity {capacity:.0} answers/s (closed loop 64 x 8, fixed:2, block:1ms); \
         now {clients} clients x {RATE}/s = {:.0} requests/s for {} s from {}, probe from 127.0.0.2",
        clients as f64 * RATE,
        duration.as_secs(),
        if many_sources {
            "an address each (127.1.x.y)"
        } else {
            "127.0.0.1"
        }
    ));
    // let the queue drain before the overload
    std::thread::sleep(Duration::from_secs(2));

    let mut load = LoadSpec::new(
        coap,
        "/request",
        Mode::Open {
            clients,
            rate_per_client: RATE,
        },
    );
    load.duration = duration;
    load.warmup = Duration::ZERO;
    load.timeout = Duration::from_secs(2);
    load.threads = 2;
    load.shared_socket = many_sources;
    let probe_spec = ProbeSpec::new(coap, "127.0.0.2:0".parse()?, "/request", duration);
    let deadline = probe_spec.deadline();

    let stop = Arc::new(AtomicBool::new(false));
    let rows: Arc<Mutex<Vec<OverloadRow>>> = Arc::default();
    let start_counts = read_counters(metrics)?;
    let t0 = Instant::now();
    let sampler = {
        let (stop, rows) = (stop.clone(), rows.clone());
        std::thread::spawn(move || -> anyhow::Result<()> {
            let mut last = start_counts;
            let mut k = 1u32;
            while !stop.load(Ordering::Relaxed) {
                let at = t0 + Duration::from_secs(k.into());
                while Instant::now() < at && !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                let now = read_counters(metrics)?;
                let rss = proc_mem(pid).map(|m| m.rss).unwrap_or(0);
                let dt = t0.elapsed().as_secs_f64() - f64::from(k - 1);
                let dt = dt.max(0.1);
                let mut r = rows.lock().unwrap_or_else(|e| e.into_inner());
                r.push(OverloadRow {
                    t: t0.elapsed().as_secs_f64(),
                    offered: (now.datagrams - last.datagrams) / dt,
                    handled: (now.handled - last.handled) / dt,
                    shed: (now.shed - last.shed) / dt,
                    peer_limited: (now.peer_limited - last.peer_limited) / dt,
                    rss,
                    probe: None,
                });
                last = now;
                k += 1;
            }
            Ok(())
        })
    };
    let prober = std::thread::spawn(move || run_probes(&probe_spec));
    let report = mintgate_loadgen::run(&load, |_| {});
    // the last probes may still be waiting: the sampler keeps going with them
    let probes = prober
        .join()
        .map_err(|_| anyhow::anyhow!("the probe thread panicked"))?
        .context("probing")?;
    // a little drain time, so that every accepted request is handled
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    sampler
        .join()
        .map_err(|_| anyhow::anyhow!("the sampler thread panicked"))??;
    let report = report.context("the overload")?;
    let end_counts = read_counters(metrics)?;
    let clean_exit = p.terminate(Duration::from_secs(10));

    let mut rows = std::mem::take(&mut *rows.lock().unwrap_or_else(|e| e.into_inner()));
    for pr in &probes {
        let sec = pr.sent_at.as_secs() as usize;
        if let Some(r) = rows.get_mut(sec) {
            r.probe = Some(*pr);
        }
    }
    // the overload's seconds (not the drain after it)
    let loaded: Vec<&OverloadRow> = rows
        .iter()
        .filter(|r| r.t <= duration.as_secs_f64() + 0.5)
        .collect();
    let mean = |f: fn(&OverloadRow) -> f64| {
        loaded.iter().map(|r| f(r)).sum::<f64>() / loaded.len().max(1) as f64
    };
    let offered = mean(|r| r.offered);
    let factor = offered / capacity;
    let (handled, shed, other) = (end_counts.handled, end_counts.shed, end_counts.other);

    // CSV
    let csv_path = opts.out.join("overload.csv");
    let mut csv = String::from(
        "t_s,offered_per_s,handled_per_s,shed_per_s,peer_limit_per_s,rss_bytes,probe_latency_ms,probe_code,probe_transmissions\n",
    );
    for r in &rows {
        let (lat, code, tx) = match &r.probe {
            Some(p) => (
                p.latency
                    .map(|l| format!("{:.1}", l.as_secs_f64() * 1e3))
                    .unwrap_or_default(),
                p.code
                    .map(|c| c.to_string())
                    .unwrap_or_else(|| "lost".into()),
                p.transmissions.to_string(),
            ),
            None => Default::default(),
        };
        line(
            &mut csv,
            format_args!(
                "{:.2},{:.0},{:.0},{:.0},{:.0},{},{lat},{code},{tx}",
                r.t, r.offered, r.handled, r.shed, r.peer_limited, r.rss
            ),
        );
    }
    crate::write_file(&csv_path, &csv)?;
    let svg_path = opts.out.join("overload.svg");
    svg(&svg_path, &rows, &probes, capacity, deadline)?;

    // the verdicts
    let mut t = String::new();
    line(
        &mut t,
        format_args!(
            "lab overload: mintgate serve (fixed:2, block:1ms) at {OVERLOAD_FACTOR}x its capacity, \
             {clients} clients x {RATE} NON GET/s from {} for {} s; a CON GET probe each \
             second from 127.0.0.2",
            if many_sources {
                "an address each (127.1.x.y)"
            } else {
                "127.0.0.1"
            },
            duration.as_secs()
        ),
    );
    line(
        &mut t,
        format_args!(
            "capacity (closed loop 64 x 8): {capacity:.0} answers/s; overload: offered {offered:.0}/s \
             ({factor:.1}x), handled {:.0}/s, shed {:.0}/s (peer_limit {:.0}/s); load generator: \
             sent {}, answered {}",
            mean(|r| r.handled),
            mean(|r| r.shed),
            mean(|r| r.peer_limited),
            report.sent,
            report.received
        ),
    );
    let answered: Vec<&ProbeResult> = probes.iter().filter(|p| p.latency.is_some()).collect();
    let worst = answered
        .iter()
        .filter_map(|p| p.latency)
        .max()
        .unwrap_or_default();
    let retransmitted = probes.iter().filter(|p| p.transmissions > 1).count();
    line(
        &mut t,
        format_args!(
            "probe: {} sent, {} answered ({} 2.05), {} needed a retransmission, worst latency {:.0} ms",
            probes.len(),
            answered.len(),
            probes.iter().filter(|p| p.ok()).count(),
            retransmitted,
            worst.as_secs_f64() * 1e3
        ),
    );
    let rss_max = rows.iter().map(|r| r.rss).max().unwrap_or(0);
    // settled after the first minute (or half, for short runs)
    let settle = (duration.as_secs_f64() / 2.0).min(60.0);
    let at_settle = loaded.iter().find(|r| r.t >= settle).map_or(0, |r| r.rss);
    let peak_after = loaded
        .iter()
        .filter(|r| r.t >= settle)
        .map(|r| r.rss)
        .max()
        .unwrap_or(0);
    line(
        &mut t,
        format_args!(
            "VmRSS: peak {:.1} MiB; {:.1} MiB at {settle:.0} s, peak after {:.1} MiB",
            mib(rss_max),
            mib(at_settle),
            mib(peak_after)
        ),
    );
    let unaccounted = (end_counts.datagrams - handled - shed - other).abs();
    line(
        &mut t,
        format_args!(
            "since the gateway started: datagrams read {:.0}, handled {handled:.0}, shed \
             {shed:.0}, duplicates/ignored/malformed {other:.0}, unaccounted {unaccounted:.0}",
            end_counts.datagrams,
        ),
    );
    let mut met = true;
    let mut verdict = |ok: bool, what: String| crate::target_line(&mut t, &mut met, ok, &what);
    verdict(
        factor >= FACTOR_TARGET,
        format!("offered load {factor:.1}x capacity, as read by the gateway (>= {FACTOR_TARGET}x; {OVERLOAD_FACTOR}x asked for)"),
    );
    verdict(
        !probes.is_empty() && probes.iter().all(|p| p.ok() && p.latency.is_some_and(|l| l < deadline)),
        format!(
            "every probe answered 2.05 within its first two retransmissions (before {} s: RFC 7252, \
             ACK_TIMEOUT 2 s, factor 1, retransmissions at 2 s and 6 s)",
            deadline.as_secs()
        ),
    );
    verdict(
        shed > 0.0 && unaccounted <= 0.001 * end_counts.datagrams.max(1.0),
        format!(
            "sheds counted: every datagram read handled or counted shed within 0.1 % ({unaccounted:.0} \
             of {:.0} not)",
            end_counts.datagrams
        ),
    );
    verdict(
        rss_max <= rss_limit,
        format!(
            "VmRSS peak {:.1} MiB <= {:.0} MiB",
            mib(rss_max),
            mib(rss_limit)
        ),
    );
    verdict(
        at_settle > 0 && peak_after <= at_settle + (1 << 20),
        format!(
            "no memory growth: VmRSS peak after {settle:.0} s {:.1} MiB within 1 MiB of VmRSS at \
             {settle:.0} s ({:.1} MiB)",
            mib(peak_after),
            mib(at_settle)
        ),
    );
    verdict(
        clean_exit,
        "clean exit on SIGTERM after the overload".into(),
    );
    Ok(Summary {
        lab: "overload",
        table: t,
        files: vec![csv_path, svg_path, log],
        target_met: Some(met),
    })
}

use crate::plot::err;

/// `overload.svg`: top, offered, handled and shed per second with the
/// capacity and VmRSS (right axis); bottom, each probe's latency against
/// the 14 s criterion (log scale), lost probes at the top.
fn svg(
    path: &PathBuf,
    rows: &[OverloadRow],
    probes: &[ProbeResult],
    capacity: f64,
    deadline: Duration,
) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (1000, 760)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (top, bottom) = root.split_vertically(470);
    let tmax = rows.iter().map(|r| r.t).fold(1.0, f64::max);
    let ymax = rows
        .iter()
        .flat_map(|r| [r.offered, r.handled, r.shed])
        .fold(capacity, f64::max)
        * 1.1;
    let rss_max = rows.iter().map(|r| mib(r.rss)).fold(1.0, f64::max) * 1.3;
    // Set up like plot.rs's figures: see the note there.
    let mut chart = ChartBuilder::on(&top)
        .caption(
            "overload: offered, handled and shed per second; resident memory",
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .right_y_label_area_size(60)
        .build_cartesian_2d(0f64..tmax, 0f64..ymax)
        .map_err(err)?
        .set_secondary_coord(0f64..tmax, 0f64..rss_max);
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc("datagrams or requests / s")
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(err)?;
    chart
        .configure_secondary_axes()
        .y_desc("VmRSS (MiB)")
        .draw()
        .map_err(err)?;
    let series = |f: fn(&OverloadRow) -> f64| -> Vec<(f64, f64)> {
        rows.iter().map(|r| (r.t, f(r))).collect()
    };
    for (label, color, pts) in [
        (
            "offered (read by the gateway)",
            RGBColor(0xbc, 0xbd, 0x22),
            series(|r| r.offered),
        ),
        ("handled", RGBColor(0xd6, 0x27, 0x28), series(|r| r.handled)),
        (
            "shed (all reasons)",
            RGBColor(0x7f, 0x7f, 0x7f),
            series(|r| r.shed),
        ),
    ] {
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)))
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .draw_series(LineSeries::new(
            vec![(0.0, capacity), (tmax, capacity)],
            BLACK.stroke_width(1),
        ))
        .map_err(err)?
        .label("capacity (closed loop)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
    let rss_color = RGBColor(0x2c, 0xa0, 0x2c);
    chart
        .draw_secondary_series(LineSeries::new(
            rows.iter().map(|r| (r.t, mib(r.rss))),
            rss_color.stroke_width(2),
        ))
        .map_err(err)?
        .label("VmRSS (right axis)")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], rss_color));
    crate::plot::legend(
        &mut chart.configure_series_labels(),
        SeriesLabelPosition::MiddleRight,
    )?;

    let dl = deadline.as_secs_f64() * 1e3;
    let mut c2 = ChartBuilder::on(&bottom)
        .caption(
            format!(
                "probe (CON GET from 127.0.0.2 each second): latency; must stay under {:.0} s",
                deadline.as_secs_f64()
            ),
            ("sans-serif", 16),
        )
        .margin(12)
        .margin_right(72)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..tmax, (0.1f64..dl * 2.0).log_scale())
        .map_err(err)?;
    c2.configure_mesh()
        .x_desc("time sent (s)")
        .y_desc("latency (ms)")
        .draw()
        .map_err(err)?;
    c2.draw_series(probes.iter().filter_map(|p| {
        p.latency.map(|l| {
            Circle::new(
                (p.sent_at.as_secs_f64(), (l.as_secs_f64() * 1e3).max(0.1)),
                3,
                if p.ok() { BLUE.filled() } else { RED.filled() },
            )
        })
    }))
    .map_err(err)?;
    c2.draw_series(
        probes
            .iter()
            .filter(|p| p.latency.is_none())
            .map(|p| Cross::new((p.sent_at.as_secs_f64(), dl * 1.5), 5, RED.stroke_width(2))),
    )
    .map_err(err)?;
    c2.draw_series(LineSeries::new(
        vec![(0.0, dl), (tmax, dl)],
        RED.stroke_width(1),
    ))
    .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}
