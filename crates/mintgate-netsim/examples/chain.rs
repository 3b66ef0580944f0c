//! Runs the paper's chain for each loss level and algorithm over a few
//! seeds and prints mean RTTs: `cargo run --release -p mintgate-netsim
//! --example chain [SEEDS] [REQUESTS]`.

use mintgate_coap::rto::Algorithm;
use mintgate_netsim::sim::chain::{self, ChainConfig};

fn main() {
    let mut args = std::env::args().skip(1);
    let seeds: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(5);
    let requests: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(1000);
    for loss in [0.05, 0.10, 0.15] {
        for seed in 1..=seeds {
            let mut line = format!("loss {:>2}% seed {seed:>3}:", (loss * 100.0) as u32);
            let mut means = Vec::new();
            for alg in Algorithm::ALL {
                let t = std::time::Instant::now();
                let run = chain::run(&ChainConfig {
                    loss,
                    algorithm: alg,
                    requests,
                    seed,
                    ..ChainConfig::default()
                });
                let m = run.mean_rtt().as_secs_f64() * 1e3;
                means.push(m);
                line += &format!(
                    "  {alg:>8} {m:7.1} ms (re {:4}, sp {:4}, {:.0} ms wall)",
                    run.retransmissions[0],
                    run.spurious[0],
                    t.elapsed().as_secs_f64() * 1e3
                );
            }
            line += &format!(
                "  | A/B {:+.1}% A/C {:+.1}%",
                (means[2] / means[0] - 1.0) * 100.0,
                (means[2] / means[1] - 1.0) * 100.0
            );
            println!("{line}");
        }
    }
}
