//! `mintgate observe URI`: registers as an observer (RFC 7641) and prints
//! each notification until a count or a duration is reached, then
//! deregisters (a GET with `Observe: 1`).
//!
//! The registration is a CON GET with `Observe: 0`, retransmitted per RFC
//! 7252 until answered. Confirmable notifications are acknowledged;
//! notifications older than the last one printed (RFC 7641 3.4's rule) are
//! acknowledged but not printed; a notification for a token we do not hold
//! is answered with a Reset, which ends that stale observation on the
//! server.

use std::io::{self, Write};
use std::net::{IpAddr, Ipv6Addr, SocketAddr, UdpSocket};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use mintgate_coap::server::observe::fresher;
use mintgate_coap::wire::{
    empty_message, Code, ContentFormat, MessageType, MessageWriter, OptionNumber, Packet,
};

use crate::client::{parse_uri, resolve};

/// Arguments of `mintgate observe`.
#[derive(clap::Args)]
#[command(
    after_help = "Exit status: 0 when the count or duration is reached (or the server ended \
the observation with 2.xx), 3 for a 4.xx answer, 4 for a 5.xx answer, 5 when the registration got \
no answer, 6 when it was Reset, 7 when the server answered without Observe (not observable), \
1 for other errors."
)]
pub struct ObserveArgs {
    /// coap://host[:port]/path?query of an observable resource.
    #[arg(value_name = "URI")]
    uri: String,
    /// Stop after this many representations (the registration's answer
    /// counts as the first).
    #[arg(long, short = 'n', value_name = "N")]
    count: Option<u64>,
    /// Stop after this long, e.g. 30s, 5m [default: until Ctrl-C].
    #[arg(long, value_name = "D", value_parser = parse_positive)]
    duration: Option<Duration>,
    /// Accept option: the Content-Format wanted (text, json, 50, ...).
    #[arg(long, value_name = "CF", value_parser = parse_cf)]
    accept: Option<ContentFormat>,
    /// Print each notification with its Observe value, type and time.
    #[arg(short, long)]
    verbose: bool,
    /// One JSON object per notification.
    #[arg(long)]
    json: bool,
}

fn parse_positive(s: &str) -> Result<Duration, String> {
    let d = mintgate_gateway::config::parse_duration(s)?;
    if d.is_zero() {
        return Err(format!("duration '{s}' must be positive"));
    }
    Ok(d)
}

fn parse_cf(s: &str) -> Result<ContentFormat, String> {
    ContentFormat::parse(s).ok_or_else(|| format!("unknown Content-Format '{s}'"))
}

const EXIT_CLIENT_ERROR: u8 = 3;
const EXIT_SERVER_ERROR: u8 = 4;
const EXIT_TIMEOUT: u8 = 5;
const EXIT_RESET: u8 = 6;
const EXIT_NOT_OBSERVABLE: u8 = 7;

/// Builds the GET with `Observe: obs`.
fn get(
    mid: u16,
    token: &[u8],
    obs: u32,
    opts: &[(OptionNumber, Vec<u8>)],
    accept: Option<ContentFormat>,
) -> anyhow::Result<Vec<u8>> {
    let mut all: Vec<(OptionNumber, Vec<u8>)> = opts.to_vec();
    let mut b = [0u8; 4];
    all.push((
        OptionNumber::OBSERVE,
        mintgate_coap::wire::encode_uint(obs, &mut b).to_vec(),
    ));
    if let Some(cf) = accept {
        all.push((
            OptionNumber::ACCEPT,
            mintgate_coap::wire::encode_uint(cf.0.into(), &mut b).to_vec(),
        ));
    }
    all.sort_by_key(|(n, _)| n.0); // stable: repeated options keep their order
    let mut buf = vec![0u8; 2048];
    let mut w = MessageWriter::new(&mut buf, MessageType::Con, Code::GET, mid, token)
        .map_err(|e| anyhow::anyhow!("forming the request: {e:?}"))?;
    for (n, v) in &all {
        w.option(*n, v)
            .map_err(|e| anyhow::anyhow!("forming the request: {e:?}"))?;
    }
    let n = w.finish();
    buf.truncate(n);
    Ok(buf)
}

/// Runs `mintgate observe`.
pub fn run(a: ObserveArgs) -> anyhow::Result<ExitCode> {
    let uri = parse_uri(&a.uri).with_context(|| format!("bad URI '{}'", a.uri))?;
    let dest = resolve(&uri)?;
    let bind: SocketAddr = if dest.is_ipv4() {
        (IpAddr::from([0u8; 4]), 0).into()
    } else {
        (IpAddr::from(Ipv6Addr::UNSPECIFIED), 0).into()
    };
    let sock = UdpSocket::bind(bind).with_context(|| format!("binding a UDP socket to {bind}"))?;
    sock.connect(dest)
        .with_context(|| format!("connecting the UDP socket to {dest}"))?;
    let token: [u8; 4] = rand::random();
    let mut mid: u16 = rand::random();
    let start = Instant::now();
    let end = a.duration.map(|d| start + d);
    let reg = get(mid, &token, 0, &uri.options, a.accept)?;
    let reg_mid = mid;

    // registration: retransmitted at 2, 4, 8, 16 s (RFC 7252 defaults)
    let mut timeout = Duration::from_secs(2);
    let mut next_tx = start;
    let mut tries = 0;
    let mut acked = false;
    let mut answered = false;
    let mut last: Option<(u32, Instant)> = None;
    let mut count = 0u64;
    let mut buf = vec![0u8; 65536];
    let mut out = io::stdout().lock();
    let status: u8 = loop {
        let now = Instant::now();
        if end.is_some_and(|e| now >= e) {
            break 0;
        }
        if !answered && !acked && now >= next_tx {
            if tries > 4 {
                eprintln!("mintgate: no answer to the registration from {dest}");
                return Ok(ExitCode::from(EXIT_TIMEOUT));
            }
            match sock.send(&reg) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {}
                Err(e) => return Err(e).context("sending the registration"),
            }
            tries += 1;
            next_tx = now + timeout;
            timeout *= 2;
        }
        let mut wait = Duration::from_millis(200);
        if !answered && !acked {
            wait = wait.min(next_tx.saturating_duration_since(now));
        }
        if let Some(e) = end {
            wait = wait.min(e.saturating_duration_since(now));
        }
        sock.set_read_timeout(Some(wait.max(Duration::from_millis(1))))
            .context("setting the socket timeout")?;
        let n = match sock.recv(&mut buf) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                        | io::ErrorKind::ConnectionRefused
                ) =>
            {
                continue
            }
            Err(e) => return Err(e).context("receiving"),
        };
        let Ok(p) = Packet::new_checked(&buf[..n]) else {
            continue; // not CoAP we can read: ignored
        };
        let ty = p.msg_type();
        if p.code().is_empty() {
            match ty {
                MessageType::Ack if p.message_id() == reg_mid => acked = true,
                MessageType::Rst if p.message_id() == reg_mid => {
                    eprintln!("mintgate: {dest} rejected the registration with a Reset");
                    return Ok(ExitCode::from(EXIT_RESET));
                }
                _ => {}
            }
            continue;
        }
        if !p.code().is_response() {
            continue;
        }
        if p.token() != token {
            // a notification of an observation we do not hold: end it
            let _ = sock.send(&empty_message(MessageType::Rst, p.message_id()));
            continue;
        }
        if ty == MessageType::Con {
            let _ = sock.send(&empty_message(MessageType::Ack, p.message_id()));
        }
        let t = Instant::now();
        let obs = p.option(OptionNumber::OBSERVE).and_then(|o| o.uint());
        let first = !answered;
        answered = true;
        let code = p.code();
        if code.class() != 2 {
            eprintln!("{code}");
            let _ = out.write_all(p.payload());
            let _ = out.flush();
            break if code.class() == 4 {
                EXIT_CLIENT_ERROR
            } else {
                EXIT_SERVER_ERROR
            };
        }
        if let (Some(v), Some((lv, lt))) = (obs, last) {
            if !fresher(lv, lt, v, t) {
                continue; // reordered: older than what was printed
            }
        }
        if let Some(v) = obs {
            last = Some((v, t));
        }
        count += 1;
        let payload = String::from_utf8_lossy(p.payload());
        let line = if a.json {
            format!(
                "{{\"observe\":{},\"type\":\"{}\",\"code\":\"{}.{:02}\",\"t_ms\":{:.1},\"payload\":{}}}",
                obs.map_or("null".to_string(), |v| v.to_string()),
                ty.name(),
                code.class(),
                code.detail(),
                t.duration_since(start).as_secs_f64() * 1e3,
                json_string(&payload)
            )
        } else if a.verbose {
            format!(
                "[{:>8.3}s obs {} {}] {payload}",
                t.duration_since(start).as_secs_f64(),
                obs.map_or("-".to_string(), |v| v.to_string()),
                ty.name()
            )
        } else {
            payload.into_owned()
        };
        writeln!(out, "{line}").context("writing to stdout")?;
        out.flush().context("writing to stdout")?;
        if obs.is_none() {
            if first {
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
    if answered && status == 0 {
        // deregister; a lost answer does no harm (the next notification
        // would get a Reset)
        mid = mid.wrapping_add(1);
        if let Ok(dereg) = get(mid, &token, 1, &uri.options, a.accept) {
            let _ = sock.send(&dereg);
            let _ = sock.set_read_timeout(Some(Duration::from_millis(500)));
            let until = Instant::now() + Duration::from_secs(1);
            while Instant::now() < until {
                match sock.recv(&mut buf) {
                    Ok(n) => {
                        if let Ok(p) = Packet::new_checked(&buf[..n]) {
                            if p.msg_type() == MessageType::Con {
                                let _ = sock.send(&empty_message(MessageType::Ack, p.message_id()));
                            }
                            if p.message_id() == mid && p.msg_type() == MessageType::Ack {
                                break;
                            }
                        }
                    }
                    Err(_) => break,
                }
            }
        }
    }
    Ok(ExitCode::from(status))
}

fn json_string(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}
