//! `mintgate observe URI`: registers as an observer (RFC 7641) and prints
//! each notification until a count or a duration is reached, then
//! deregisters (a GET with `Observe: 1`).
//!
//! The observation itself is [`mintgate_gateway::observe_client`]: the
//! registration is a CON GET with `Observe: 0`, retransmitted per RFC 7252
//! until answered. Confirmable notifications are acknowledged;
//! notifications older than the last one printed (RFC 7641 3.4's rule) are
//! acknowledged but not printed; a notification for a token we do not hold
//! is answered with a Reset, which ends that stale observation on the
//! server.
//!
//! With `--oscore FILE` (RFC 8613 4.1.3.5) the registration and the
//! deregistration are protected and only notifications that verify, in
//! the order of their Partial IVs, are printed (their inner payloads);
//! unprotected, unverifiable, replayed and older ones are dropped (counted
//! with --verbose).

use std::io::{self, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use mintgate_coap::wire::ContentFormat;
use mintgate_gateway::observe_client::{Observation, ObserveEvent};

use crate::client::{EXIT_CLIENT_ERROR, EXIT_RESET, EXIT_SERVER_ERROR, EXIT_TIMEOUT};
use crate::common::{json_string, parse_positive_duration, parse_uri, resolve};

/// Arguments of `mintgate observe`.
#[derive(clap::Args)]
#[command(
    after_help = "Exit status: 0 when the count or duration is reached (or the server ended \
the observation with 2.xx), 3 for a 4.xx answer, 4 for a 5.xx answer, 5 when the registration got \
no answer (or the port was unreachable), 6 when it was Reset, 7 when the server answered without \
Observe (not observable), 1 for other errors. Ctrl-C (SIGINT) or SIGTERM ends it like --count: \
it deregisters and exits 0, or 130 / 143 if the registration was not answered yet."
)]
pub struct ObserveArgs {
    /// coap://host[:port]/path?query of an observable resource.
    #[arg(value_name = "URI")]
    uri: String,
    /// Stop after this many representations (the registration's answer
    /// counts as the first).
    #[arg(long, short = 'n', value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    count: Option<u64>,
    /// Stop after this long, e.g. 30s, 5m [default: until Ctrl-C].
    #[arg(long, value_name = "D", value_parser = parse_positive_duration)]
    duration: Option<Duration>,
    /// Give up when the registration is not answered within this long,
    /// e.g. 5s. At most, and by default, RFC 7252's retransmissions: about
    /// 62 s. Once answered, the observation runs until --count or
    /// --duration.
    #[arg(long, value_name = "D", value_parser = parse_positive_duration)]
    timeout: Option<Duration>,
    /// Accept option: the Content-Format wanted (text, json, 50, ...).
    #[arg(long, value_name = "CF", value_parser = parse_cf)]
    accept: Option<ContentFormat>,
    /// Print each notification with its Observe value, type and time.
    #[arg(short, long)]
    verbose: bool,
    /// One JSON object per notification.
    #[arg(long)]
    json: bool,
    /// Protect the observation with OSCORE (RFC 8613): a context file as
    /// `get --oscore` takes it; only notifications that verify, in order,
    /// are printed.
    #[arg(long, value_name = "CONTEXT-FILE")]
    oscore: Option<std::path::PathBuf>,
}

fn parse_cf(s: &str) -> Result<ContentFormat, String> {
    ContentFormat::parse(s).ok_or_else(|| format!("unknown Content-Format '{s}'"))
}

/// How long `observe` waits for an event before it looks for a signal.
const SIGNAL_POLL: Duration = Duration::from_millis(200);

const EXIT_NOT_OBSERVABLE: u8 = 7;

/// Runs `mintgate observe`.
pub fn run(a: ObserveArgs) -> anyhow::Result<ExitCode> {
    let uri = parse_uri(&a.uri)?;
    let dest = resolve(&uri)?;
    let start = Instant::now();
    let end = a.duration.map(|d| start + d);
    let reg_end = a.timeout.map(|d| start + d);
    // Ctrl-C (SIGINT) and SIGTERM end the observation like --count does,
    // deregistering first; they are taken between events.
    let signals = crate::common::block_signals();
    let mut obs = match &a.oscore {
        Some(f) => Observation::register_oscore(
            dest,
            uri.options.clone(),
            a.accept,
            crate::client::oscore_context(f, mintgate_gateway::oscore::DEFAULT_SEQ_STEP)?,
        ),
        None => Observation::register(dest, uri.options.clone(), a.accept),
    }
    .with_context(|| format!("sending the registration to {dest}"))?;
    let mut count = 0u64;
    let mut out = io::stdout().lock();
    let status: u8 = loop {
        if let Some(sig) = crate::common::take_signal(&signals) {
            // the normal end without --count or --duration; before any
            // answer, an interruption
            break if obs.answered() { 0 } else { 128 + sig as u8 };
        }
        // wake up often enough to see a signal
        let mut until = Instant::now() + SIGNAL_POLL;
        if let Some(e) = end {
            until = until.min(e);
        }
        if let (Some(r), false) = (reg_end, obs.answered()) {
            until = until.min(r);
        }
        let note = match obs.next_event(until).context("receiving")? {
            None if !obs.answered() && reg_end.is_some_and(|r| Instant::now() >= r) => {
                eprintln!(
                    "mintgate: no answer to the registration from {dest} within {:?}",
                    a.timeout.unwrap_or_default()
                );
                return Ok(ExitCode::from(EXIT_TIMEOUT));
            }
            None if end.is_some_and(|e| Instant::now() >= e) => {
                if !obs.answered() {
                    eprintln!(
                        "mintgate: no answer to the registration from {dest} within --duration {:?}",
                        a.duration.unwrap_or_default()
                    );
                    return Ok(ExitCode::from(EXIT_TIMEOUT));
                }
                break 0;
            }
            None => continue,
            Some(ObserveEvent::NoAnswer) => {
                eprintln!("mintgate: no answer to the registration from {dest}");
                return Ok(ExitCode::from(EXIT_TIMEOUT));
            }
            Some(ObserveEvent::Unreachable) => {
                eprintln!(
                    "mintgate: no response from {dest}: port unreachable (nothing listens there)"
                );
                return Ok(ExitCode::from(EXIT_TIMEOUT));
            }
            Some(ObserveEvent::Reset) => {
                eprintln!("mintgate: {dest} rejected the registration with a Reset");
                return Ok(ExitCode::from(EXIT_RESET));
            }
            Some(ObserveEvent::Failed(n)) => {
                eprintln!("{}", n.code);
                let _ = out.write_all(&n.payload);
                let _ = out.flush();
                break if n.code.class() == 4 {
                    EXIT_CLIENT_ERROR
                } else {
                    EXIT_SERVER_ERROR
                };
            }
            Some(ObserveEvent::Notification(n)) => n,
        };
        count += 1;
        let payload = String::from_utf8_lossy(&note.payload);
        let t = note.at.duration_since(start);
        let line = if a.json {
            format!(
                "{{\"observe\":{},\"type\":\"{}\",\"code\":\"{}.{:02}\",\"t_ms\":{:.1},\"payload\":{}}}",
                note.observe.map_or("null".to_string(), |v| v.to_string()),
                note.msg_type.name(),
                note.code.class(),
                note.code.detail(),
                t.as_secs_f64() * 1e3,
                json_string(&payload)
            )
        } else if a.verbose {
            format!(
                "[{:>8.3}s obs {} {}] {payload}",
                t.as_secs_f64(),
                note.observe.map_or("-".to_string(), |v| v.to_string()),
                note.msg_type.name()
            )
        } else {
            payload.into_owned()
        };
        writeln!(out, "{line}").context("writing to stdout")?;
        out.flush().context("writing to stdout")?;
        if note.observe.is_none() {
            if count == 1 {
                eprintln!(
                    "mintgate: {dest} answered without Observe: the resource is not observable"
                );
                return Ok(ExitCode::from(EXIT_NOT_OBSERVABLE));
            }
            // a 2.xx without Observe ends the observation
            break 0;
        }
        if a.count.is_some_and(|c| count >= c) {
            break 0;
        }
    };
    drop(out);
    if a.verbose && obs.dropped() > 0 {
        eprintln!(
            "mintgate: {} message(s) with our token dropped (unprotected, not verified, replayed or older)",
            obs.dropped()
        );
    }
    if obs.answered() && status == 0 {
        obs.deregister(Duration::from_secs(1));
    }
    Ok(ExitCode::from(status))
}
