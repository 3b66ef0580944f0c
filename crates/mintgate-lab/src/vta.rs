//! `lab vta`: paper 000, Figs. 6-7. One gateway whose handler pool is sized
//! by VTA under a varying open-loop load; per second: offered rate, R, H,
//! threads, queue and the cumulative R - H difference.
//!
//! The load profile is a staircase of `LEVELS` levels of the peak rate. It is
//! laid as horizontal layers: layer k is one open-loop run (peak/LEVELS
//! requests/s from its own clients, 10 requests/s each) for every stretch of
//! time where the profile is at level k or above. Layers overlap freely, so a
//! change of rate never pauses the others (a run's own start-up and drain
//! only touch its layer).

use std::time::{Duration, Instant};

use mintgate_gateway::config::PoolMode;
use mintgate_loadgen::{LoadReport, LoadSpec, Mode};

use crate::{line, paper, plot, LabGateway, LabOptions, Summary, RATE_PER_CLIENT};

/// Levels of the load profile (the peak is level `LEVELS`).
pub const LEVELS: u32 = 10;
/// Seconds recorded after the profile ends (the queue drains, the pool
/// shrinks).
const TAIL_S: f64 = 3.0;

/// The profile's phases, in order, with the fraction of the run where each
/// ends.
const PHASES: [(&str, f64); 6] = [
    ("ramp up", 0.2),
    ("plateau", 0.4),
    ("step down", 0.55),
    ("step up", 0.7),
    ("ramp down", 0.9),
    ("low", 1.0),
];

/// The profile: (level 0..=LEVELS, phase index) during second `s` of a run
/// of `d` seconds. Ramp up 1 -> 10, plateau at 10, step down to 3, step up
/// to 8, ramp down 8 -> 1, stay at 1.
pub fn level_at(s: u64, d: u64) -> (u32, usize) {
    if s >= d {
        return (0, PHASES.len());
    }
    let f = (s as f64 + 0.5) / d as f64;
    let phase = PHASES
        .iter()
        .position(|&(_, end)| f < end)
        .unwrap_or(PHASES.len() - 1);
    let start = if phase == 0 { 0.0 } else { PHASES[phase - 1].1 };
    let within = (f - start) / (PHASES[phase].1 - start); // 0..1
    let level = match phase {
        0 => 1 + (within * (LEVELS - 1) as f64).floor() as u32,
        1 => LEVELS,
        2 => 3,
        3 => 8,
        4 => 8 - (within * 8.0).floor() as u32,
        _ => 1,
    };
    (level.clamp(1, LEVELS), phase)
}

/// Stretches `[start, end)` (seconds) where the profile is at `k` or above.
fn layer_runs(k: u32, d: u64) -> Vec<(u64, u64)> {
    let mut runs = Vec::new();
    let mut open: Option<u64> = None;
    for s in 0..=d {
        let on = s < d && level_at(s, d).0 >= k;
        match (on, open) {
            (true, None) => open = Some(s),
            (false, Some(a)) => {
                runs.push((a, s));
                open = None;
            }
            _ => {}
        }
    }
    runs
}

/// The nominal offered rate averaged over `[a, b]` seconds of the profile.
fn offered_between(a: f64, b: f64, d: u64, unit_rps: f64) -> f64 {
    if b <= a {
        return 0.0;
    }
    const STEPS: usize = 20;
    let step = (b - a) / STEPS as f64;
    let sum: f64 = (0..STEPS)
        .map(|i| {
            let t = a + (i as f64 + 0.5) * step;
            if t < 0.0 {
                0.0
            } else {
                level_at(t as u64, d).0 as f64 * unit_rps
            }
        })
        .sum();
    sum / STEPS as f64
}

/// One second of the run.
#[derive(Clone, Copy, Debug)]
pub struct VtaRow {
    /// End of the sample, seconds since the load profile started.
    pub t: f64,
    /// Nominal offered rate during the sample.
    pub offered_rps: f64,
    /// R_t per second.
    pub nr_rps: f64,
    /// H_t per second.
    pub htp_rps: f64,
    /// N_t, HTP threads.
    pub threads: u64,
    /// QS_t, queue length.
    pub queue: u64,
    /// Sum of R - H (requests) up to this sample.
    pub cum_diff: i64,
    /// Requests R in the sample.
    pub r: u64,
    /// Requests H in the sample.
    pub h: u64,
    /// Dropped in the sample.
    pub dropped: u64,
    /// Phase index into the profile's phases (6 = after the profile).
    pub phase: usize,
}

/// Runs the lab. Writes `vta.csv` and `vta.svg`.
pub fn lab_vta(opts: &LabOptions) -> anyhow::Result<Summary> {
    let d = opts
        .duration
        .unwrap_or(Duration::from_secs(if opts.quick { 30 } else { 120 }))
        .as_secs();
    anyhow::ensure!(d >= 4, "the vta profile needs at least 4 s");
    let peak = opts.peak_rps.unwrap_or(10_000.0);
    let unit_clients = ((peak / LEVELS as f64 / RATE_PER_CLIENT).round() as usize).max(1);
    let unit_rps = unit_clients as f64 * RATE_PER_CLIENT;
    crate::create_out(&opts.out)?;
    let progress = &opts.progress;
    progress(&format!(
        "lab vta: VTA pool, {d} s profile (ramp up, plateau, step down, step up, ramp down, low), \
         peak {:.0} req/s in {LEVELS} layers of {unit_clients} clients x {RATE_PER_CLIENT} req/s, \
         handler {}",
        unit_rps * LEVELS as f64,
        opts.handler_cost
    ));

    let cfg = crate::lab_config(PoolMode::Vta, opts.handler_cost, d as usize + 60);
    let lg = LabGateway::start(cfg)?;
    let layers: Vec<(u64, u64)> = (1..=LEVELS).flat_map(|k| layer_runs(k, d)).collect();
    // Time for the layer threads to open their sockets before the first send.
    let t0 = Instant::now() + Duration::from_millis(300);
    let off = lg.obs_time(t0);
    let end = off + d as f64 + TAIL_S;

    let mut rows: Vec<VtaRow> = Vec::new();
    let reports = std::thread::scope(|scope| -> anyhow::Result<Vec<LoadReport>> {
        let handles: Vec<_> = layers
            .iter()
            .map(|&(a, b)| {
                let addr = lg.addr;
                scope.spawn(move || -> anyhow::Result<LoadReport> {
                    // the loadgen's first send is 20 ms after the call
                    let at = t0 + Duration::from_secs(a);
                    let at = at.checked_sub(Duration::from_millis(20)).unwrap_or(at);
                    std::thread::sleep(at.saturating_duration_since(Instant::now()));
                    let mut spec = LoadSpec::new(
                        addr,
                        "/request",
                        Mode::Open {
                            clients: unit_clients,
                            rate_per_client: RATE_PER_CLIENT,
                        },
                    );
                    spec.warmup = Duration::ZERO;
                    spec.duration = Duration::from_secs(b - a);
                    spec.timeout = Duration::from_secs(1);
                    Ok(mintgate_loadgen::run(&spec, |_| {})?)
                })
            })
            .collect();
        // Record the Observer's samples as they come.
        let mut last_t = f64::NEG_INFINITY;
        let mut cum: i64 = 0;
        let give_up = Instant::now()
            + Duration::from_secs_f64(end - lg.obs_time(Instant::now()))
            + Duration::from_secs(5);
        loop {
            for s in lg.gw.samples() {
                if s.t <= last_t {
                    continue;
                }
                last_t = s.t;
                let (ts, te) = (s.t - s.dt - off, s.t - off);
                let mid = (ts + te) / 2.0;
                if mid < 0.0 || mid >= d as f64 + TAIL_S || s.dt <= 0.0 {
                    continue;
                }
                cum += s.r as i64 - s.h as i64;
                let row = VtaRow {
                    t: te,
                    offered_rps: offered_between(ts, te, d, unit_rps),
                    nr_rps: s.r as f64 / s.dt,
                    htp_rps: s.h as f64 / s.dt,
                    threads: s.n,
                    queue: s.qs,
                    cum_diff: cum,
                    r: s.r,
                    h: s.h,
                    dropped: s.dropped,
                    phase: level_at(mid.max(0.0) as u64, d).1,
                };
                progress(&format!(
                    "lab vta: t {:>5.1} s  offered {:>6.0}/s  R {:>6.0}/s  H {:>6.0}/s  \
                     threads {:>2}  queue {:>5}  cum R-H {:>+6}",
                    row.t,
                    row.offered_rps,
                    row.nr_rps,
                    row.htp_rps,
                    row.threads,
                    row.queue,
                    row.cum_diff
                ));
                rows.push(row);
            }
            if last_t >= end || Instant::now() >= give_up {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("a load layer panicked"))?
            })
            .collect()
    })?;
    drop(lg);
    anyhow::ensure!(!rows.is_empty(), "the Observer gave no samples");

    let csv_path = opts.out.join("vta.csv");
    let mut csv = String::from("t,offered_rps,nr_rps,htp_rps,threads,queue,cum_diff\n");
    for r in &rows {
        line(
            &mut csv,
            format_args!(
                "{:.1},{:.1},{:.1},{:.1},{},{},{}",
                r.t, r.offered_rps, r.nr_rps, r.htp_rps, r.threads, r.queue, r.cum_diff
            ),
        );
    }
    crate::write_file(&csv_path, &csv)?;
    let svg_path = opts.out.join("vta.svg");
    plot::vta_svg(&svg_path, &rows, &opts.handler_cost.to_string())?;

    let (table, met) = table(&rows, &reports, d, unit_rps, opts);
    Ok(Summary {
        lab: "vta",
        table,
        files: vec![csv_path, svg_path],
        target_met: Some(met),
    })
}

fn table(
    rows: &[VtaRow],
    reports: &[LoadReport],
    d: u64,
    unit_rps: f64,
    opts: &LabOptions,
) -> (String, bool) {
    let mut t = String::new();
    line(
        &mut t,
        format_args!(
            "lab vta (paper 000, Figs. 6-7): VTA pool, {d} s varying open-loop load, peak {:.0} \
             req/s, handler {}",
            unit_rps * LEVELS as f64,
            opts.handler_cost
        ),
    );
    line(
        &mut t,
        format_args!(
            "{:>9} | {:>4} | {:>10} | {:>9} | {:>9} | {:>7} | {:>9} | {:>9}",
            "phase", "s", "offered/s", "R (NR)/s", "H (HTP)/s", "threads", "sum R-H", "dropped"
        ),
    );
    for (i, name) in PHASES
        .iter()
        .map(|p| p.0)
        .chain(std::iter::once("tail"))
        .enumerate()
    {
        let ph: Vec<&VtaRow> = rows.iter().filter(|r| r.phase == i).collect();
        if ph.is_empty() {
            continue;
        }
        let k = ph.len() as f64;
        let mean = |f: fn(&VtaRow) -> f64| ph.iter().map(|r| f(r)).sum::<f64>() / k;
        let (lo, hi) = ph.iter().fold((u64::MAX, 0), |(lo, hi), r| {
            (lo.min(r.threads), hi.max(r.threads))
        });
        line(
            &mut t,
            format_args!(
                "{:>9} | {:>4} | {:>10.0} | {:>9.0} | {:>9.0} | {:>7} | {:>+9} | {:>9}",
                name,
                ph.len(),
                mean(|r| r.offered_rps),
                mean(|r| r.nr_rps),
                mean(|r| r.htp_rps),
                format!("{lo}-{hi}"),
                ph.iter().map(|r| r.r as i64 - r.h as i64).sum::<i64>(),
                ph.iter().map(|r| r.dropped).sum::<u64>()
            ),
        );
    }
    let total_r: u64 = rows.iter().map(|r| r.r).sum();
    let total_h: u64 = rows.iter().map(|r| r.h).sum();
    let dropped: u64 = rows.iter().map(|r| r.dropped).sum();
    let final_cum = rows.last().map_or(0, |r| r.cum_diff);
    let max_cum = rows.iter().map(|r| r.cum_diff.abs()).max().unwrap_or(0);
    let sum_abs: u64 = rows.iter().map(|r| r.r.abs_diff(r.h)).sum();
    let pct = |x: f64| {
        if total_r == 0 {
            0.0
        } else {
            100.0 * x / total_r as f64
        }
    };
    let final_pct = pct(final_cum.unsigned_abs() as f64);
    let met = total_r > 0 && final_pct < 1.0;
    let (lo, hi) = rows.iter().fold((u64::MAX, 0), |(lo, hi), r| {
        (lo.min(r.threads), hi.max(r.threads))
    });
    let sent: u64 = reports.iter().map(|r| r.sent).sum();
    let lost: u64 = reports.iter().map(|r| r.lost).sum();
    line(
        &mut t,
        format_args!(
            "requests: R {total_r}, H {total_h}, dropped {dropped}; clients sent {sent}, lost \
             {lost} ({:.3} %)",
            if sent == 0 {
                0.0
            } else {
                100.0 * lost as f64 / sent as f64
            }
        ),
    );
    line(
        &mut t,
        format_args!(
            "final cumulative R - H: {final_cum:+} requests = {final_pct:.3} % of requests \
             (target < 1 %: {}); largest |cumulative| during the run {max_cum} ({:.3} %); \
             sum of per-second |R - H| {sum_abs} ({:.3} %)",
            if met { "met" } else { "NOT met" },
            pct(max_cum as f64),
            pct(sum_abs as f64)
        ),
    );
    line(
        &mut t,
        format_args!("threads used: {lo}..{hi} (VTA, started at the core count)"),
    );
    for l in paper::VTA_TEXT {
        line(&mut t, format_args!("{l}"));
    }
    (t, met)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_has_its_phases_and_layers_cover_it() {
        let d = 120;
        let levels: Vec<u32> = (0..d).map(|s| level_at(s, d).0).collect();
        assert_eq!(levels[0], 1);
        assert_eq!(levels[30], LEVELS);
        assert_eq!(levels[60], 3);
        assert_eq!(levels[80], 8);
        assert_eq!(levels[119], 1);
        assert!(levels.iter().all(|&l| (1..=LEVELS).contains(&l)));
        // the layers add up to the profile at every second
        for s in 0..d {
            let on: u32 = (1..=LEVELS)
                .map(|k| {
                    layer_runs(k, d)
                        .iter()
                        .filter(|&&(a, b)| a <= s && s < b)
                        .count() as u32
                })
                .sum();
            assert_eq!(on, levels[s as usize], "second {s}");
        }
        assert_eq!(level_at(d, d).0, 0);
        let o = offered_between(59.0, 60.0, d, 1000.0);
        assert!((o - 3000.0).abs() < 1e-6, "{o}");
        // short runs still have every level they need
        assert!((0..8).all(|s| level_at(s, 8).0 >= 1));
    }
}
