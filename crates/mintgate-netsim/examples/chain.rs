//! Runs the paper's chain for each loss level and algorithm over seeds
//! 1..=SEEDS and prints the mean total of interval means (10 x the mean
//! RTT) beside paper 002's Tables 1-3: `cargo run --release -p
//! mintgate-netsim --example chain [SEEDS] [REQUESTS]`. `HOST_MS` and
//! `JITTER_MS` in the environment override the host path's one-way delay
//! and jitter (for exploring the model; the lab uses the defaults).

use std::time::Duration;

use mintgate_coap::rto::Algorithm;
use mintgate_netsim::sim::chain::{self, ChainConfig};

const PAPER: [[f64; 3]; 3] = [
    [3320.8, 2126.2, 2077.0],
    [5099.8, 2836.8, 2638.6],
    [7976.63, 3646.76, 3320.89],
];

fn env_ms(name: &str) -> Option<Duration> {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .map(|ms| Duration::from_secs_f64(ms / 1e3))
}

fn main() {
    let mut args = std::env::args().skip(1);
    let seeds: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(10);
    let requests: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(1000);
    let mut base = ChainConfig::default();
    if let Some(d) = env_ms("HOST_MS") {
        base.host_delay = d;
    }
    if let Some(j) = env_ms("JITTER_MS") {
        base.host_jitter = j;
    }
    println!(
        "base RTT {:.1} ms (host {:?} +- {:?})",
        chain::base_rtt(&base).as_secs_f64() * 1e3,
        base.host_delay,
        base.host_jitter
    );
    for (li, loss) in [0.05, 0.10, 0.15].into_iter().enumerate() {
        let mut line = format!("loss {:>2}%:", (loss * 100.0_f64).round() as u32);
        let mut totals = Vec::new();
        for (ai, alg) in Algorithm::ALL.into_iter().enumerate() {
            let mut sum = 0.0;
            let mut spread = 0.0;
            for seed in 1..=seeds {
                let run = chain::run(&ChainConfig {
                    loss,
                    algorithm: alg,
                    requests,
                    seed,
                    ..base.clone()
                });
                sum += run.mean_rtt().as_secs_f64() * 1e4;
                // standard deviation of the 10 interval means
                let mut o = run.outcomes[0].clone();
                o.sort_by_key(|o| o.index);
                let per = o.len() / 10;
                let means: Vec<f64> = o
                    .chunks(per.max(1))
                    .take(10)
                    .map(|c| {
                        c.iter().map(|x| x.rtt.as_secs_f64() * 1e3).sum::<f64>() / c.len() as f64
                    })
                    .collect();
                let m = means.iter().sum::<f64>() / means.len() as f64;
                spread += (means.iter().map(|x| (x - m).powi(2)).sum::<f64>()
                    / (means.len() - 1) as f64)
                    .sqrt();
            }
            let spread = spread / seeds as f64;
            let total = sum / seeds as f64;
            totals.push(total);
            line += &format!(
                "  {alg:>8} {total:7.1} ({:+5.1}%, sd {spread:4.1})",
                (total / PAPER[li][ai] - 1.0) * 100.0
            );
        }
        line += &format!(
            "  | A/B {:+.1}% A/C {:+.1}%",
            (totals[2] / totals[0] - 1.0) * 100.0,
            (totals[2] / totals[1] - 1.0) * 100.0
        );
        println!("{line}");
    }
}
