//! `cargo bench -p mintgate-lab --bench proxy`: the HTTP proxy's added
//! latency over a raw CoAP request and its HTTP/1.1 keep-alive and HTTP/3
//! throughput, on loopback against an in-process gateway. Prints the
//! figures (and whether the targets are met); `--quick` for a short run.

use std::sync::Arc;

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let progress: mintgate_lab::ProgressFn = Arc::new(|l: &str| eprintln!("{l}"));
    match mintgate_lab::proxy::bench(quick, &progress) {
        Ok(b) => {
            let mut t = String::new();
            b.report(&mut t);
            print!("{t}");
        }
        Err(e) => {
            eprintln!("proxy bench failed: {e:#}");
            std::process::exit(1);
        }
    }
}
