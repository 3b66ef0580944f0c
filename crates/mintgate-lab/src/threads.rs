//! `lab threads`: paper 000, Figs. 2-5. NR vs HTP throughput for fixed
//! handler pools of 1..N threads under a saturating open-loop load.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use mintgate_gateway::config::{HandlerCost, PoolMode};
use mintgate_loadgen::{LoadSpec, Mode};
use mintgate_sched::Sample;

use crate::{line, paper, plot, LabGateway, LabOptions, Summary, RATE_PER_CLIENT};

/// One thread count's measurement.
#[derive(Clone, Copy, Debug)]
pub struct ThreadsRow {
    /// HTP threads (fixed).
    pub threads: usize,
    /// R: requests the Network Receiver accepted onto the HTP queue, per s.
    pub nr_rps: f64,
    /// H: requests the HTP completed, per s.
    pub htp_rps: f64,
    /// Requests dropped (queue full, no buffer), per s.
    pub dropped_per_s: f64,
    /// Successful responses the clients got, per s.
    pub answered_rps: f64,
    /// Observer samples averaged.
    pub seconds: usize,
}

/// The offered load when no client count is given: 1.25x the largest pool's
/// nominal capacity (one request per handler cost per thread), between 100
/// and 5000 clients.
fn default_clients(cost: HandlerCost, max_threads: usize) -> usize {
    let per_thread = match cost {
        HandlerCost::Block(d) | HandlerCost::Spin(d) if !d.is_zero() => 1.0 / d.as_secs_f64(),
        _ => 20_000.0,
    };
    let rate = 1.25 * max_threads as f64 * per_thread;
    ((rate / RATE_PER_CLIENT).ceil() as usize).clamp(100, 5000)
}

/// Runs the lab: for each fixed pool of 1..=N threads, a fresh gateway under
/// the same open-loop load; R and H are averaged over the Observer's samples
/// inside the measured period. Writes `threads.csv` and `threads.svg`.
pub fn lab_threads(opts: &LabOptions) -> anyhow::Result<Summary> {
    let max_threads = opts
        .max_threads
        .unwrap_or(if opts.quick { 4 } else { 8 })
        .clamp(1, 256);
    let duration = opts
        .duration
        .unwrap_or(Duration::from_secs(if opts.quick { 5 } else { 60 }));
    anyhow::ensure!(
        duration >= Duration::from_secs(2),
        "the duration per step must be at least 2 s"
    );
    let warmup = opts
        .warmup
        .unwrap_or(Duration::from_secs(if opts.quick { 1 } else { 2 }));
    let clients = opts
        .clients
        .unwrap_or_else(|| default_clients(opts.handler_cost, max_threads))
        .max(1);
    let offered = clients as f64 * RATE_PER_CLIENT;
    crate::create_out(&opts.out)?;
    let progress = &opts.progress;
    progress(&format!(
        "lab threads: fixed pools 1..={max_threads}, {clients} clients x {RATE_PER_CLIENT} req/s \
         = {offered:.0} req/s offered (NON, open loop), handler {}, {warmup:?} warm-up + \
         {duration:?} measured per step",
        opts.handler_cost
    ));

    let mut rows = Vec::new();
    for n in 1..=max_threads {
        let row = run_step(opts, n, clients, warmup, duration)?;
        progress(&format!(
            "lab threads: {n} thread(s): R {:.0}/s  H {:.0}/s  dropped {:.0}/s  answered {:.0}/s \
             ({} samples)",
            row.nr_rps, row.htp_rps, row.dropped_per_s, row.answered_rps, row.seconds
        ));
        rows.push(row);
    }

    let csv_path = opts.out.join("threads.csv");
    let mut csv = String::from("threads,nr_rps,htp_rps,dropped_per_s\n");
    for r in &rows {
        line(
            &mut csv,
            format_args!(
                "{},{:.1},{:.1},{:.1}",
                r.threads, r.nr_rps, r.htp_rps, r.dropped_per_s
            ),
        );
    }
    crate::write_file(&csv_path, &csv)?;
    let svg_path = opts.out.join("threads.svg");
    plot::threads_svg(&svg_path, &rows, offered, &opts.handler_cost.to_string())?;

    let table = table(&rows, clients, offered, opts.handler_cost, duration);
    Ok(Summary {
        lab: "threads",
        table,
        files: vec![csv_path, svg_path],
        target_met: None,
    })
}

fn run_step(
    opts: &LabOptions,
    n: usize,
    clients: usize,
    warmup: Duration,
    duration: Duration,
) -> anyhow::Result<ThreadsRow> {
    let samples_needed = (warmup + duration).as_secs() as usize + 30;
    let cfg = crate::lab_config(PoolMode::Fixed(n), opts.handler_cost, samples_needed);
    let lg = LabGateway::start(cfg)?;
    let mut spec = LoadSpec::new(
        lg.addr,
        "/request",
        Mode::Open {
            clients,
            rate_per_client: RATE_PER_CLIENT,
        },
    );
    spec.duration = duration;
    spec.warmup = warmup;
    spec.timeout = Duration::from_secs(2);
    // The loadgen starts 20 ms after the call; the measured window on the
    // Observer's clock follows from that.
    let called = Instant::now();
    let from = lg.obs_time(called) + 0.02 + warmup.as_secs_f64();
    let to = from + duration.as_secs_f64();
    let progress = opts.progress.clone();
    let mut last_line = Instant::now();
    let report = mintgate_loadgen::run(&spec, |p| {
        if last_line.elapsed() >= Duration::from_secs(5) {
            last_line = Instant::now();
            progress(&format!(
                "lab threads: {n} thread(s): {:>4.1}/{:.0} s {:?}, clients got {:.0} answers/s",
                p.elapsed.as_secs_f64(),
                p.total.as_secs_f64(),
                p.phase,
                p.rate
            ));
        }
    })
    .with_context(|| format!("load against {n} thread(s)"))?;
    let samples = lg.samples_until(to, Duration::from_secs(3));
    drop(lg);
    let win = window(&samples, from, to);
    anyhow::ensure!(
        !win.is_empty(),
        "no Observer sample fell inside the measured period of the {n}-thread step"
    );
    let dt: f64 = win.iter().map(|s| s.dt).sum();
    let sum = |f: fn(&Sample) -> u64| win.iter().map(f).sum::<u64>() as f64 / dt;
    Ok(ThreadsRow {
        threads: n,
        nr_rps: sum(|s| s.r),
        htp_rps: sum(|s| s.h),
        dropped_per_s: sum(|s| s.dropped),
        answered_rps: report.requests_per_sec,
        seconds: win.len(),
    })
}

/// The samples lying within `[from, to]` on the Observer's clock (with a
/// little slack for the start-up offsets).
pub(crate) fn window(samples: &[Sample], from: f64, to: f64) -> Vec<Sample> {
    const SLACK: f64 = 0.25;
    samples
        .iter()
        .filter(|s| s.t - s.dt >= from - SLACK && s.t <= to + SLACK)
        .copied()
        .collect()
}

fn table(
    rows: &[ThreadsRow],
    clients: usize,
    offered: f64,
    cost: HandlerCost,
    duration: Duration,
) -> String {
    let mut t = String::new();
    line(
        &mut t,
        format_args!(
            "lab threads (paper 000, Figs. 2-5): fixed HTP pools, {clients} clients x \
             {RATE_PER_CLIENT} req/s = {offered:.0} req/s offered, handler {cost}, \
             {:.0} s measured per step",
            duration.as_secs_f64()
        ),
    );
    line(
        &mut t,
        format_args!(
            "R = accepted onto the HTP queue (NR), H = handled (HTP), R+drop = what reached the \
             receiver (the paper's NR counts this)"
        ),
    );
    line(
        &mut t,
        format_args!(
            "{:>7} | {:>9} | {:>9} | {:>9} | {:>9} | {:>9} || {:>11} | {:>11} | {}",
            "threads",
            "R (NR)/s",
            "H (HTP)/s",
            "dropped/s",
            "R+drop/s",
            "answers/s",
            "paper NR/s",
            "paper HTP/s",
            "paper source"
        ),
    );
    for r in rows {
        let p = paper::point(r.threads);
        line(
            &mut t,
            format_args!(
                "{:>7} | {:>9.0} | {:>9.0} | {:>9.0} | {:>9.0} | {:>9.0} || {:>11} | {:>11} | {}",
                r.threads,
                r.nr_rps,
                r.htp_rps,
                r.dropped_per_s,
                r.nr_rps + r.dropped_per_s,
                r.answered_rps,
                paper::range(p.and_then(|p| p.nr)),
                paper::range(p.and_then(|p| p.htp)),
                p.map(|p| p.source).unwrap_or(match r.threads {
                    5..=7 => "Fig. 5: falling (shape only)",
                    8.. => "Fig. 5: falls sharply past 7 (shape only)",
                    _ => "-",
                })
            ),
        );
    }
    if let Some(best) = rows.iter().max_by(|a, b| a.htp_rps.total_cmp(&b.htp_rps)) {
        line(
            &mut t,
            format_args!(
                "ours: peak HTP {:.0} req/s at {} thread(s); paper: peak 16000-18000 at 3-4 \
                 threads (Raspberry Pi, Ethernet; absolute rates are not comparable)",
                best.htp_rps, best.threads
            ),
        );
    }
    for l in paper::FIG5_TEXT {
        line(&mut t, format_args!("{l}"));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_clients_exceed_the_nominal_capacity_and_stay_bounded() {
        let c = default_clients(HandlerCost::Block(Duration::from_micros(200)), 4);
        assert_eq!(c, 2500);
        assert_eq!(default_clients(HandlerCost::None, 8), 5000);
        assert_eq!(
            default_clients(HandlerCost::Block(Duration::from_secs(1)), 1),
            100
        );
    }

    #[test]
    fn window_keeps_the_samples_inside() {
        let s = |t: f64| Sample {
            t,
            dt: 1.0,
            ..Sample::default()
        };
        let all = [s(1.0), s(2.0), s(3.0), s(4.0), s(5.0)];
        let w = window(&all, 1.1, 4.1);
        assert_eq!(
            w.iter().map(|s| s.t).collect::<Vec<_>>(),
            vec![2.0, 3.0, 4.0],
            "{w:?}"
        );
    }
}
