//! `mintgate netem`: a UDP impairment relay in front of any UDP server, or
//! (`--tcp`) a TCP delay relay in front of any TCP server.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use anyhow::Context;
use mintgate_netsim::relay::{DirectionStats, Impairment, Relay, RelayConfig};
use mintgate_netsim::tcp_relay::{TcpDirectionStats, TcpRelay, TcpRelayConfig};

/// Arguments of `mintgate netem`.
#[derive(clap::Args)]
#[command(
    after_help = "Example: put 10 % loss and 40 ms each way in front of a CoAP server:\n  \
mintgate netem --listen 127.0.0.1:5700 --forward 127.0.0.1:5683 --loss 10% --delay 40ms\n  \
mintgate get coap://127.0.0.1:5700/request\n\
Put a 1 ms link in front of an MQTT broker:\n  \
mintgate netem --tcp --listen 127.0.0.1:1884 --forward 127.0.0.1:1883 --delay 1ms\n\
Loss and delay apply independently in each direction. Runs until Ctrl-C or --duration."
)]
pub struct NetemArgs {
    /// Relay TCP instead of UDP: each connection's bytes are held for the
    /// delay in each direction, in order (delay only: loss on a TCP path is
    /// retransmission delay, and jitter would reorder a byte stream).
    #[arg(long)]
    tcp: bool,
    /// Address clients send to.
    #[arg(long, value_name = "ADDR")]
    listen: SocketAddr,
    /// The server to relay to.
    #[arg(long, value_name = "ADDR")]
    forward: SocketAddr,
    /// Loss per direction, in percent: `10` or `10%`.
    #[arg(long, default_value = "0", value_parser = parse_pct)]
    loss: f64,
    /// One-way delay per direction: `40` (ms), `40ms` or `250us`.
    #[arg(long, default_value = "0", value_parser = crate::common::parse_ms)]
    delay: Duration,
    /// Uniform jitter around the delay: `10` (ms), `10ms` or `500us`.
    #[arg(long, default_value = "0", value_parser = crate::common::parse_ms)]
    jitter: Duration,
    /// Mean length of loss bursts (Gilbert-Elliott), at least 1; 1 = independent losses.
    #[arg(long, default_value_t = 1.0, value_parser = parse_burst)]
    burst: f64,
    /// Seed of the loss and jitter draws (runs with the same seed drop the
    /// same datagrams of the same sequence).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Stop after this long (e.g. 30s); default: until Ctrl-C.
    #[arg(long, value_parser = mintgate_gateway::config::parse_duration)]
    duration: Option<Duration>,
}

fn parse_burst(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v >= 1.0 && v.is_finite() => Ok(v),
        _ => Err(format!("'{s}' is not a mean burst length of at least 1")),
    }
}

fn parse_pct(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("`{s}`: a percentage like 10 or 10%"))?;
    if !(0.0..=100.0).contains(&v) {
        return Err(format!("`{s}`: must be between 0 and 100"));
    }
    Ok(v / 100.0)
}

fn line(name: &str, d: &DirectionStats) -> String {
    let (r, dr, f, e) = (
        d.received.load(Relaxed),
        d.dropped.load(Relaxed),
        d.forwarded.load(Relaxed),
        d.errors.load(Relaxed),
    );
    let pct = if r > 0 {
        100.0 * dr as f64 / r as f64
    } else {
        0.0
    };
    format!("{name}: received {r}, dropped {dr} ({pct:.2} %), forwarded {f}, errors {e}")
}

fn tcp_line(name: &str, d: &TcpDirectionStats) -> String {
    format!(
        "{name}: {} bytes in {} chunks",
        d.bytes.load(Relaxed),
        d.chunks.load(Relaxed)
    )
}

fn run_tcp(a: NetemArgs) -> anyhow::Result<ExitCode> {
    if a.loss > 0.0 || !a.jitter.is_zero() {
        anyhow::bail!(
            "--tcp models delay only: loss on a TCP path is retransmission delay, \
             and jitter would reorder the byte stream (drop --loss and --jitter)"
        );
    }
    let set = crate::common::block_signals();
    let relay = TcpRelay::start(TcpRelayConfig {
        listen: a.listen,
        forward: a.forward,
        up: a.delay,
        down: a.delay,
    })
    .with_context(|| format!("starting the relay on tcp {}", a.listen))?;
    eprintln!(
        "netem: tcp {} -> {}: delay {:?} each way",
        relay.local_addr(),
        a.forward,
        a.delay
    );
    let report = || {
        let s = relay.stats();
        eprintln!(
            "netem: connections {}, refused {} | {} | {}",
            s.connections.load(Relaxed),
            s.refused.load(Relaxed),
            tcp_line("up", &s.up),
            tcp_line("down", &s.down)
        );
    };
    wait(a.duration, &set, report);
    let s = relay.stats();
    println!(
        "connections: {} joined, {} refused (server unreachable)",
        s.connections.load(Relaxed),
        s.refused.load(Relaxed)
    );
    println!("{}", tcp_line("client->server", &s.up));
    println!("{}", tcp_line("server->client", &s.down));
    Ok(ExitCode::SUCCESS)
}

/// Runs `report` every 5 s until `duration` has passed or a signal came.
fn wait(duration: Option<Duration>, set: &libc::sigset_t, report: impl Fn()) {
    let start = Instant::now();
    match duration {
        Some(d) => {
            while start.elapsed() < d {
                std::thread::sleep(
                    d.saturating_sub(start.elapsed())
                        .min(Duration::from_secs(5)),
                );
                report();
            }
        }
        None => {
            crate::common::wait_for_signal(set, Duration::from_secs(5), report);
        }
    }
}

pub fn run(a: NetemArgs) -> anyhow::Result<ExitCode> {
    if a.forward == a.listen {
        return Err(crate::UsageError(format!(
            "--forward {} is --listen: the relay would send to itself",
            a.forward
        ))
        .into());
    }
    if a.tcp {
        return run_tcp(a);
    }
    let imp = Impairment {
        loss: a.loss,
        burst: a.burst,
        delay: a.delay,
        jitter: a.jitter,
    };
    let set = crate::common::block_signals();
    let relay = Relay::start(RelayConfig {
        listen: a.listen,
        forward: a.forward,
        up: imp,
        down: imp,
        seed: a.seed,
    })
    .with_context(|| format!("starting the relay on udp {}", a.listen))?;
    eprintln!(
        "netem: udp {} -> {}: loss {:.1} % (bursts of {}), delay {:?} ± {:?} each way, seed {}",
        relay.local_addr(),
        a.forward,
        a.loss * 100.0,
        a.burst,
        a.delay,
        a.jitter,
        a.seed
    );
    wait(a.duration, &set, || {
        eprintln!(
            "netem: {} | {}",
            line("up", &relay.stats().up),
            line("down", &relay.stats().down)
        )
    });
    println!("{}", line("client->server", &relay.stats().up));
    println!("{}", line("server->client", &relay.stats().down));
    Ok(ExitCode::SUCCESS)
}
