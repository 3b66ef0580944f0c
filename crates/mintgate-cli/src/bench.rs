//! `mintgate bench`: load-generate against one CoAP server, or against
//! several in turn (`--compare NAME=URI ...`) and print their ratios.
//! The URI's scheme picks the transport: `coap://` UDP, `coap+tcp://` one
//! TCP connection per client (RFC 8323); `--oscore` protects every
//! request with OSCORE (RFC 8613) over UDP.
//!
//! The load itself is [`mintgate_loadgen::run`]; this module parses the
//! command line, shows progress on stderr (only when it is a terminal) and
//! prints the report on stdout, readable or as JSON (`--json`). The exit
//! code is 0 when every server answered, 2 when one answered nothing at all,
//! 1 on an error (bad URI, too many clients, ...).

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use mintgate_coap::uri::Scheme;
use mintgate_coap::wire::OptionNumber;
use mintgate_loadgen::{LoadReport, LoadSpec, Mode, Phase, Progress, Transport};
use serde_json::json;

/// Arguments of `mintgate bench`.
#[derive(clap::Args)]
#[command(
    after_help = "Exit status: 0 when every target answered, 5 when one never answered (nothing \
listens, or everything was lost), 3 when one answered only with errors (4.xx/5.xx: the path is \
wrong), 1 for other errors, 2 for usage errors."
)]
pub struct BenchArgs {
    /// The resource to GET, e.g. coap://127.0.0.1:5683/request (not with
    /// --compare). coap+tcp://HOST[:PORT]/PATH loads CoAP over TCP (RFC
    /// 8323): each client is one connection, which sends its CSM and waits
    /// for the server's before its requests; closed loop only, and --con,
    /// --rate, --gso, --gro and --shared-socket do not apply.
    #[arg(required_unless_present = "compare", conflicts_with = "compare")]
    uri: Option<String>,
    /// Non-confirmable requests (the default).
    #[arg(long, conflicts_with = "con")]
    non: bool,
    /// Confirmable requests. Never retransmitted: a request unanswered within
    /// --timeout counts as lost.
    #[arg(long)]
    con: bool,
    /// Logical clients, each with its own UDP socket (source port), or its
    /// own TCP connection.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Closed loop: requests each client keeps outstanding.
    #[arg(long, default_value_t = 16, conflicts_with = "rate")]
    window: usize,
    /// Open loop: requests per second sent by each client, whatever the
    /// responses (the paper: 10).
    #[arg(long)]
    rate: Option<f64>,
    /// Measured period (e.g. 10s, 500ms, 1m).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
    /// Load before the measured period, not counted.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    warmup: Duration,
    /// After this an unanswered request counts as lost.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    timeout: Duration,
    /// Load-generator threads, each owning a share of the clients.
    #[arg(long, default_value_t = 1, value_parser = crate::common::at_least::<1>)]
    threads: usize,
    /// Closed loop: send each client's window as one UDP GSO train, so its
    /// requests land in the server's socket back to back (burst arrivals)
    /// rather than one by one. Changes the load's shape: compare servers
    /// with the same setting.
    #[arg(long)]
    gso: bool,
    /// Receive responses with UDP GRO: a train of equal responses a server
    /// sends with segmentation offload (mintgate does by default) arrives as
    /// one message and the generator splits it, which costs the generator
    /// and the loopback delivery less CPU. Responses sent one by one arrive
    /// as without it.
    #[arg(long)]
    gro: bool,
    /// All clients of a generator thread share one UDP socket, each sending
    /// from a loopback address of its own (127.1.0.1, 127.1.0.2, ...), so
    /// the server still sees one endpoint per client while the generator
    /// moves many clients' datagrams per system call. Much cheaper with
    /// many clients and few requests outstanding each. IPv4 loopback
    /// servers only; the shared socket listens on the wildcard address
    /// (0.0.0.0, an ephemeral port) for the run, to receive what is sent to
    /// all of the clients' addresses.
    #[arg(long)]
    shared_socket: bool,
    /// Protect every request with OSCORE (RFC 8613) and verify every
    /// answer, coap:// only: a context file as `mintgate get --oscore`
    /// takes it (its sequence number kept in NAME.seq beside it, reserved
    /// 65536 at a time). Repeat the flag for several contexts: the clients take
    /// them round robin (each thread needs one of its own). Clients that
    /// share a context share its sequence numbers, which the server's
    /// replay window takes only while they arrive no further out of order
    /// than its width (mintgate's 1,024; other servers' as little as 32):
    /// one context per client is the safe load. An answer that does not
    /// verify (or comes unprotected, e.g. a 4.01) is an error, counted as
    /// undecryptable. A server that lost its replay window (restarted)
    /// first wants an Echo round trip: run `mintgate get --oscore` once
    /// per context before. Several files may also be given comma-separated.
    #[arg(long, value_name = "CONTEXT-FILE", value_delimiter = ',')]
    oscore: Vec<PathBuf>,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Run the same load against each server in turn (repeat the flag) and
    /// print each one's ratio to the first, e.g. --compare libcoap=coap://127.0.0.1:5684/request.
    #[arg(long, value_name = "NAME=URI")]
    compare: Vec<String>,
    /// Pause between two compared runs, so one server's load does not spill
    /// into the next measurement.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pause: Duration,
}

/// One server to load.
struct Target {
    name: String,
    uri: String,
    spec: LoadSpec,
}

/// Runs the command.
pub fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    let named: Vec<(String, String)> = match &args.uri {
        Some(u) => vec![(String::new(), u.clone())],
        None => args
            .compare
            .iter()
            .map(|c| match c.split_once('=') {
                Some((n, u)) if !n.is_empty() => Ok((n.to_string(), u.to_string())),
                _ => bail!("--compare wants NAME=URI, got {c:?}"),
            })
            .collect::<anyhow::Result<_>>()?,
    };
    let mode = match args.rate {
        Some(rate_per_client) => Mode::Open {
            clients: args.clients,
            rate_per_client,
        },
        None => Mode::Closed {
            clients: args.clients,
            window: args.window,
        },
    };
    let targets = named
        .into_iter()
        .map(|(name, uri)| {
            let (target, path, transport) = parse_coap_uri(&uri)?;
            if transport == Transport::Tcp && !args.oscore.is_empty() {
                bail!("{uri:?}: --oscore is benchmarked over coap:// (UDP) only");
            }
            let mut spec = LoadSpec::new(target, path, mode);
            // Copies flag by flag, as the lab's paho_run copies a result: the
            // types are unrelated; only the assignments look alike.
            spec.transport = transport;
            spec.confirmable = args.con;
            spec.duration = args.duration;
            spec.warmup = args.warmup;
            spec.timeout = args.timeout;
            spec.threads = args.threads;
            spec.gso = args.gso;
            spec.gro = args.gro;
            spec.shared_socket = args.shared_socket;
            Ok(Target { name, uri, spec })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;

    let mut reports = Vec::with_capacity(targets.len());
    for (i, t) in targets.iter().enumerate() {
        if i > 0 && !args.pause.is_zero() {
            std::thread::sleep(args.pause);
        }
        let label = if t.name.is_empty() { &t.uri } else { &t.name };
        if !args.json {
            println!("{}", describe(label, &t.spec, args.oscore.len()));
        }
        let contexts = args
            .oscore
            .iter()
            .map(|f| crate::client::oscore_context(f, OSCORE_SEQ_STEP))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let report = run_with_progress(label, &t.spec, contexts)
            .with_context(|| format!("benchmarking {}", t.uri))?;
        if !args.json && t.name.is_empty() {
            print_report(&report);
        }
        reports.push(report);
    }

    if args.json {
        let runs: Vec<_> = targets
            .iter()
            .zip(&reports)
            .map(|(t, r)| report_json(t, r, &reports[0], args.oscore.len()))
            .collect();
        let out = if args.compare.is_empty() {
            runs.into_iter().next().unwrap_or_default()
        } else {
            json!({ "runs": runs })
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else if !args.compare.is_empty() {
        print_comparison(&targets, &reports);
    }

    // exit: 5 when a target never answered (as get), 3 when it answered
    // only with errors (nothing of the run measures the resource)
    let (mut silent, mut only_errors) = (false, false);
    for (t, r) in targets.iter().zip(&reports) {
        if r.received == 0 {
            silent = true;
            let hint = if r.io_errors > 0 {
                " (connection refused: is it running?)"
            } else {
                ""
            };
            eprintln!(
                "mintgate bench: no response at all from {} ({}){hint}",
                t.spec.target, t.uri
            );
        } else if r.errors == r.received {
            only_errors = true;
            eprintln!(
                "mintgate bench: every response from {} was an error: does it serve GET {}?",
                t.uri, t.spec.path
            );
        }
    }
    Ok(if silent {
        ExitCode::from(5)
    } else if only_errors {
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    })
}

/// Sequence numbers an OSCORE context file reserves per write: the bench
/// sends tens of thousands a second, and a write is a sync to disk.
const OSCORE_SEQ_STEP: u64 = 65536;

/// Runs one load with an indicatif bar on stderr (hidden unless a
/// terminal), protected with `contexts` unless there are none.
fn run_with_progress(
    label: &str,
    spec: &LoadSpec,
    contexts: Vec<mintgate_coap::oscore::Context>,
) -> anyhow::Result<LoadReport> {
    let total = spec.warmup + spec.duration;
    let target = if std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let bar = ProgressBar::with_draw_target(Some(total.as_millis() as u64), target);
    bar.set_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {msg}")
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_prefix(label.to_string());
    let report = mintgate_loadgen::run_protected(spec, contexts, |p: &Progress| {
        bar.set_position((p.elapsed.min(p.total)).as_millis() as u64);
        let phase = match p.phase {
            Phase::Warmup => "warm-up",
            Phase::Measure => "measure",
            Phase::Drain => "drain",
        };
        bar.set_message(format!(
            "{phase} {:>5.1}s  {:>9.0} req/s  sent {}  lost {}  errors {}",
            p.elapsed.as_secs_f64(),
            p.rate,
            p.sent,
            p.lost,
            p.errors
        ));
    });
    bar.finish_and_clear();
    Ok(report?)
}

/// One line saying what load is about to run.
fn describe(label: &str, s: &LoadSpec, oscore: usize) -> String {
    let ty = match (s.transport, oscore) {
        (Transport::Tcp, _) => "coap+tcp".to_string(),
        (_, 0) if s.confirmable => "CON".to_string(),
        (_, 0) => "NON".to_string(),
        (_, n) => format!(
            "{} OSCORE ({n} context{})",
            if s.confirmable { "CON" } else { "NON" },
            if n == 1 { "" } else { "s" }
        ),
    };
    let load = match s.mode {
        Mode::Closed { clients, window } => {
            format!("closed loop, {clients} clients x {window} outstanding")
        }
        Mode::Open {
            clients,
            rate_per_client,
        } => format!(
            "open loop, {clients} clients x {rate_per_client} req/s = {:.0} req/s offered",
            clients as f64 * rate_per_client
        ),
    };
    let mut io = String::new();
    for (on, what) in [
        (s.shared_socket, ", one shared socket"),
        (s.gso, ", GSO trains"),
        (s.gro, ", GRO receive"),
    ] {
        if on {
            io.push_str(what);
        }
    }
    format!(
        "{label}: {ty} GET {}, {load}, {} (+{} warm-up), timeout {}, {} thread(s){io}",
        s.path,
        fmt_secs(s.duration),
        fmt_secs(s.warmup),
        fmt_secs(s.timeout),
        s.threads
    )
}

fn print_report(r: &LoadReport) {
    let l = &r.latency;
    println!("  requests/s  {:.0}", r.requests_per_sec);
    println!("  sent        {}", r.sent);
    println!("  received    {}", r.received);
    println!("  lost        {} ({:.2} %)", r.lost, 100.0 * r.loss_ratio());
    println!("  errors      {}", r.errors);
    if r.undecryptable > 0 {
        println!("  of which undecryptable {}", r.undecryptable);
    }
    if r.in_trains > 0 {
        println!("  in GRO trains {} datagrams", r.in_trains);
    }
    if r.unmatched + r.skipped + r.io_errors > 0 {
        println!(
            "  unmatched   {}   skipped {}   socket errors {}",
            r.unmatched, r.skipped, r.io_errors
        );
    }
    println!(
        "  latency     p50 {}  p90 {}  p99 {}  p99.9 {}  max {}  mean {}",
        fmt_lat(l.p50),
        fmt_lat(l.p90),
        fmt_lat(l.p99),
        fmt_lat(l.p999),
        fmt_lat(l.max),
        fmt_lat(l.mean)
    );
    println!(
        "  generator   {:.2} cores ({:.2} s CPU over {:.2} s)",
        r.generator_cores(),
        r.generator_cpu.as_secs_f64(),
        r.wall.as_secs_f64()
    );
}

/// The side-by-side table: each server's figures and its ratios to the first.
fn print_comparison(targets: &[Target], reports: &[LoadReport]) {
    let Some(base) = reports.first() else {
        return;
    };
    let w = targets
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(0)
        .max(6);
    println!();
    println!(
        "{:<w$} {:>10} {:>8} {:>8} {:>7} {:>10} {:>10} {:>10} {:>10} {:>8} {:>6}",
        "server",
        "req/s",
        "ratio",
        "lost %",
        "errors",
        "p50",
        "p99",
        "p99.9",
        "max",
        "p99 rat",
        "gen"
    );
    for (t, r) in targets.iter().zip(reports) {
        println!(
            "{:<w$} {:>10.0} {:>7.2}x {:>8.2} {:>7} {:>10} {:>10} {:>10} {:>10} {:>7.2}x {:>6.2}",
            t.name,
            r.requests_per_sec,
            ratio(r.requests_per_sec, base.requests_per_sec),
            100.0 * r.loss_ratio(),
            r.errors,
            fmt_lat(r.latency.p50),
            fmt_lat(r.latency.p99),
            fmt_lat(r.latency.p999),
            fmt_lat(r.latency.max),
            ratio(r.latency.p99.as_secs_f64(), base.latency.p99.as_secs_f64()),
            r.generator_cores()
        );
    }
    println!("(ratio: req/s relative to {}; p99 rat: p99 relative to {}; gen: cores used by the load generator)",
        targets[0].name, targets[0].name);
}

/// `a / b`, or 0 when `b` is 0.
fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

fn report_json(
    t: &Target,
    r: &LoadReport,
    base: &LoadReport,
    oscore_contexts: usize,
) -> serde_json::Value {
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let (kind, clients, window, rate) = match t.spec.mode {
        Mode::Closed { clients, window } => ("closed", clients, Some(window), None),
        Mode::Open {
            clients,
            rate_per_client,
        } => ("open", clients, None, Some(rate_per_client)),
    };
    json!({
        "name": t.name,
        "uri": t.uri,
        "target": t.spec.target.to_string(),
        "transport": match t.spec.transport {
            Transport::Udp => "udp",
            Transport::Tcp => "tcp",
        },
        "oscore_contexts": oscore_contexts,
        "type": if t.spec.transport == Transport::Tcp {
            "TCP"
        } else if t.spec.confirmable {
            "CON"
        } else {
            "NON"
        },
        "mode": kind,
        "clients": clients,
        "window": window,
        "rate_per_client": rate,
        "threads": t.spec.threads,
        "gso": t.spec.gso,
        "gro": t.spec.gro,
        "shared_socket": t.spec.shared_socket,
        "duration_s": r.measured.as_secs_f64(),
        "timeout_s": t.spec.timeout.as_secs_f64(),
        "sent": r.sent,
        "received": r.received,
        "lost": r.lost,
        "loss_ratio": r.loss_ratio(),
        "errors": r.errors,
        "undecryptable": r.undecryptable,
        "unmatched": r.unmatched,
        "in_trains": r.in_trains,
        "skipped": r.skipped,
        "io_errors": r.io_errors,
        "requests_per_sec": r.requests_per_sec,
        "latency_us": {
            "p50": us(r.latency.p50),
            "p90": us(r.latency.p90),
            "p99": us(r.latency.p99),
            "p999": us(r.latency.p999),
            "max": us(r.latency.max),
            "mean": us(r.latency.mean),
        },
        "per_second": r.per_second,
        "generator_cpu_s": r.generator_cpu.as_secs_f64(),
        "generator_cores": r.generator_cores(),
        "requests_per_sec_ratio": ratio(r.requests_per_sec, base.requests_per_sec),
        "p99_ratio": ratio(r.latency.p99.as_secs_f64(), base.latency.p99.as_secs_f64()),
    })
}

/// A latency for humans: microseconds below 1 ms, else milliseconds.
fn fmt_lat(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1000.0 {
        format!("{us:.0} us")
    } else {
        format!("{:.2} ms", us / 1000.0)
    }
}

fn fmt_secs(d: Duration) -> String {
    format!("{}s", d.as_secs_f64())
}

/// Parses `coap://HOST[:PORT][/PATH]` or `coap+tcp://...` (with the one
/// URI parser, [`mintgate_coap::uri`]) into the server address, the path
/// (`/` when absent) and the transport. HOST is an IPv4 address, a
/// bracketed IPv6 address or a name (the first address it resolves to).
/// Queries are not supported by the benchmark.
fn parse_coap_uri(uri: &str) -> anyhow::Result<(SocketAddr, String, Transport)> {
    let (u, scheme) = mintgate_coap::uri::parse_scheme(uri).with_context(|| format!("{uri:?}"))?;
    let transport = match scheme {
        Scheme::Coap => Transport::Udp,
        Scheme::CoapTcp => Transport::Tcp,
        Scheme::Coaps | Scheme::CoapsTcp | Scheme::CoapWs | Scheme::CoapsWs => {
            bail!("{uri:?}: only coap:// and coap+tcp:// URIs can be benchmarked")
        }
    };
    let mut path = String::new();
    for (n, v) in &u.options {
        match *n {
            OptionNumber::URI_PATH => {
                let seg = std::str::from_utf8(v)
                    .ok()
                    .filter(|s| !s.contains('/'))
                    .with_context(|| format!("{uri:?}: a path segment bench cannot send"))?;
                path.push('/');
                path.push_str(seg);
            }
            OptionNumber::URI_QUERY => bail!("{uri:?}: queries are not supported by bench"),
            _ => {}
        }
    }
    if path.is_empty() {
        path.push('/');
    }
    let addr = crate::common::resolve(&u).with_context(|| format!("{uri:?}"))?;
    Ok((addr, path, transport))
}

/// A duration of at most one hour: every load run is bounded (see
/// `mintgate_gateway::config::parse_duration` for the forms).
fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = mintgate_gateway::config::parse_duration(s)?;
    if d > Duration::from_secs(3600) {
        return Err(format!("{s:?}: load runs are bounded to 1 hour"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_uris() {
        let (a, p, t) = parse_coap_uri("coap://127.0.0.1:5684/request").unwrap();
        assert_eq!(a, "127.0.0.1:5684".parse().unwrap());
        assert_eq!((p.as_str(), t), ("/request", Transport::Udp));
        let (a, p, _) = parse_coap_uri("coap://[::1]/a/b").unwrap();
        assert_eq!(a, "[::1]:5683".parse().unwrap());
        assert_eq!(p, "/a/b");
        let (a, p, _) = parse_coap_uri("coap://127.0.0.1").unwrap();
        assert_eq!((a.port(), p.as_str()), (5683, "/"));
        let (a, p, t) = parse_coap_uri("coap+tcp://127.0.0.1/request").unwrap();
        assert_eq!(
            (a.port(), p.as_str(), t),
            (5683, "/request", Transport::Tcp)
        );
        assert!(parse_coap_uri("coaps://127.0.0.1/").is_err());
        assert!(parse_coap_uri("coaps+tcp://127.0.0.1/").is_err());
        assert!(parse_coap_uri("http://127.0.0.1/").is_err());
        assert!(parse_coap_uri("coap://127.0.0.1:99999/").is_err());
        assert!(parse_coap_uri("coap://127.0.0.1/x?y=1").is_err());
        assert!(parse_coap_uri("coap://[::1/x").is_err());
        assert!(parse_coap_uri("coap:///x").is_err());
    }

    #[test]
    fn parses_durations() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("5h").is_err());
    }

    #[test]
    fn formats_latency() {
        assert_eq!(fmt_lat(Duration::from_micros(85)), "85 us");
        assert_eq!(fmt_lat(Duration::from_micros(12_345)), "12.35 ms");
        assert_eq!(ratio(1.0, 0.0), 0.0);
    }
}
