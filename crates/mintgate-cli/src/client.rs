//! `mintgate get|put|post|delete`: one CoAP request from the command line.
//!
//! A blocking loop around the sans-IO [`Client`]: one UDP socket connected to
//! the destination, the RFC 7252 Basic retransmission controller, and the
//! wall clock fed in as `Instant`s. Prints the response and exits with a code
//! that tells scripts what happened (see [`EXIT_CODES`]).

use std::fmt::Write as _;
use std::io::{self, IsTerminal, Read, Write};
use std::net::{IpAddr, Ipv6Addr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use mintgate_coap::client::{Client, ClientConfig, Event, Request};
use mintgate_coap::rto::{Adaptive, Basic, Cocoa, RtoController, TransmissionParams};
use mintgate_coap::uri::CoapUri;
use mintgate_coap::wire::{
    decode_uint, encode_uint, Code, ContentFormat, MessageType, OptionDef, OptionFormat,
    OptionNumber,
};

/// The `--help` text on exit codes; [`run`] returns exactly these.
const EXIT_CODES: &str = "\
Exit status:
  0  a 2.xx response
  1  any other error: bad URI, unresolvable host, unreadable payload file,
     socket error, a response of another class
  2  usage error (unknown flag, bad flag value)
  3  a 4.xx response
  4  a 5.xx response
  5  no response within the timeout (or the destination port is unreachable)
  6  the server rejected the request with a Reset

Output: the response payload goes to stdout; for a response other than 2.xx
the code (e.g. \"4.04 Not Found\") also goes to stderr. --verbose adds the
message type, code, options and round-trip time on stderr; --json prints one
JSON object with code, type, options and payload on stdout instead.";

const EXIT_CLIENT_ERROR: u8 = 3;
const EXIT_SERVER_ERROR: u8 = 4;
const EXIT_TIMEOUT: u8 = 5;
const EXIT_RESET: u8 = 6;
const EXIT_OTHER: u8 = 1;

/// Default overall timeout of a NON request.
const NON_TIMEOUT: Duration = Duration::from_secs(5);

/// Arguments of the request commands.
#[derive(clap::Args)]
#[command(after_help = EXIT_CODES)]
pub struct RequestArgs {
    /// coap://host[:port]/path?query — host is an IPv4 address, an IPv6
    /// address in brackets or a name; port defaults to 5683; path segments
    /// and query parameters are percent-decoded.
    #[arg(value_name = "URI")]
    uri: String,
    /// Request payload, as given.
    #[arg(
        short = 'e',
        long,
        value_name = "TEXT",
        conflicts_with = "payload_file"
    )]
    payload: Option<String>,
    /// Read the request payload from a file (`-` for stdin).
    #[arg(long, value_name = "PATH")]
    payload_file: Option<PathBuf>,
    /// Send a non-confirmable request (no retransmission).
    #[arg(long)]
    non: bool,
    /// Content-Format of the payload: a number or a name (text, json, cbor,
    /// link, xml, octet, or a media type such as application/json).
    #[arg(long, value_name = "CF", value_parser = parse_content_format)]
    format: Option<ContentFormat>,
    /// Accept option: the Content-Format wanted in the response.
    #[arg(long, value_name = "CF", value_parser = parse_content_format)]
    accept: Option<ContentFormat>,
    /// Overall time to wait for the response, e.g. 5s, 500ms, 2m [default:
    /// 93s (RFC 7252 MAX_TRANSMIT_WAIT) for CON, 5s for NON].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    timeout: Option<Duration>,
    /// Extra option, repeatable. NUM is a number or a registered name
    /// (e.g. If-None-Match); VALUE is a decimal integer for uint options,
    /// 0x-prefixed hex for raw bytes, otherwise text. `-O 5` gives an empty
    /// value.
    #[arg(short = 'O', long = "option", value_name = "NUM,VALUE", value_parser = parse_option)]
    options: Vec<ExtraOption>,
    /// Print the message type, code, options, round-trip time and
    /// retransmissions to stderr.
    #[arg(short, long)]
    verbose: bool,
    /// Print the response as one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Retransmission-timeout controller for CON: `basic` (RFC 7252),
    /// `cocoa` (draft-ietf-core-cocoa-03) or `adaptive` (Adaptive RTO).
    #[arg(long, value_enum, default_value_t = Cc::Basic)]
    cc: Cc,
}

/// The RTO controllers a request can use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Cc {
    /// RFC 7252 Basic: 2-3 s, doubling.
    Basic,
    /// CoCoA: RTT estimators, variable back-off.
    Cocoa,
    /// Adaptive RTO: windowed mean RTT, loss rate as the EWMA weight.
    Adaptive,
}

/// An `-O NUM,VALUE` option, already encoded.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ExtraOption(OptionNumber, Vec<u8>);

/// Sends one request with `method` and prints the outcome.
pub fn run(method: Code, args: RequestArgs) -> anyhow::Result<ExitCode> {
    let uri = parse_uri(&args.uri)?;
    let dest = resolve(&uri)?;

    let payload = match (&args.payload, &args.payload_file) {
        (Some(p), _) => p.clone().into_bytes(),
        (None, Some(path)) if path.as_os_str() == "-" => {
            let mut v = Vec::new();
            io::stdin()
                .read_to_end(&mut v)
                .context("reading the payload from stdin")?;
            v
        }
        (None, Some(path)) => std::fs::read(path)
            .with_context(|| format!("reading the payload file {}", path.display()))?,
        (None, None) => Vec::new(),
    };

    let mut options = uri.options.clone();
    let mut b = [0u8; 4];
    if let Some(cf) = args.format {
        options.push((
            OptionNumber::CONTENT_FORMAT,
            encode_uint(cf.0.into(), &mut b).to_vec(),
        ));
    }
    if let Some(cf) = args.accept {
        options.push((
            OptionNumber::ACCEPT,
            encode_uint(cf.0.into(), &mut b).to_vec(),
        ));
    }
    options.extend(args.options.iter().map(|o| (o.0, o.1.clone())));

    let params = TransmissionParams::default();
    let overall = args.timeout.unwrap_or(if args.non {
        NON_TIMEOUT
    } else {
        params.max_transmit_wait()
    });
    let mut config = ClientConfig::new(params);
    config.non_timeout = overall;
    config.separate_timeout = overall;
    let seed: u64 = rand::random();
    let rto: Box<dyn RtoController> = match args.cc {
        Cc::Basic => Box::new(Basic::new(params, seed.rotate_left(32))),
        Cc::Cocoa => Box::new(Cocoa::new(params, seed.rotate_left(32))),
        Cc::Adaptive => Box::new(Adaptive::new(params, seed.rotate_left(32))),
    };
    let mut client = Client::new(config, rto, seed);

    let bind: SocketAddr = if dest.is_ipv4() {
        (IpAddr::from([0u8; 4]), 0).into()
    } else {
        (IpAddr::from(Ipv6Addr::UNSPECIFIED), 0).into()
    };
    let socket =
        UdpSocket::bind(bind).with_context(|| format!("binding a UDP socket to {bind}"))?;
    socket
        .connect(dest)
        .with_context(|| format!("connecting the UDP socket to {dest}"))?;

    let request = Request {
        confirmable: !args.non,
        code: method,
        options,
        payload,
    };
    let payload_len = request.payload.len();
    let start = Instant::now();
    let deadline = start + overall;
    client.request(start, dest, request)?;
    if args.verbose {
        eprintln!(
            "-> {} {} {} ({dest}, {payload_len} byte payload)",
            if args.non { "NON" } else { "CON" },
            method.name().unwrap_or("?"),
            args.uri,
        );
    }

    let mut buf = vec![0u8; 65536];
    let event = loop {
        // Send before looking at events: a confirmable response is
        // acknowledged in the same step that completes the exchange.
        while let Some(t) = client.poll_transmit(Instant::now()) {
            match socket.send(&t.bytes) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    return Ok(unreachable(dest));
                }
                Err(e) => return Err(e).with_context(|| format!("sending to {dest}")),
            }
        }
        if let Some(ev) = client.poll_event() {
            break ev;
        }
        let now = Instant::now();
        if now >= deadline {
            eprintln!(
                "mintgate: no response from {dest} within {}",
                fmt_duration(overall)
            );
            return Ok(ExitCode::from(EXIT_TIMEOUT));
        }
        let wake = client.poll_timeout().map_or(deadline, |t| t.min(deadline));
        let wait = wake
            .saturating_duration_since(now)
            .max(Duration::from_millis(1));
        socket
            .set_read_timeout(Some(wait))
            .context("setting the socket timeout")?;
        match socket.recv(&mut buf) {
            Ok(n) => client.handle_datagram(Instant::now(), dest, &buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                client.handle_timeout(Instant::now())
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => return Ok(unreachable(dest)),
            Err(e) => return Err(e).with_context(|| format!("receiving from {dest}")),
        }
    };

    match event {
        Event::Response {
            code,
            msg_type,
            options,
            payload,
            rtt,
            retransmissions,
            ..
        } => {
            if args.verbose {
                eprintln!(
                    "<- {} {code} ({}, {retransmissions} retransmission{})",
                    msg_type.name(),
                    fmt_duration(rtt),
                    if retransmissions == 1 { "" } else { "s" },
                );
                for (n, v) in &options {
                    eprintln!("   {}: {}", option_name(*n), option_value_text(*n, v));
                }
            }
            let mut out = io::stdout().lock();
            if args.json {
                let j = json_response(code, msg_type, &options, &payload, rtt, retransmissions);
                writeln!(out, "{j}").context("writing to stdout")?;
            } else {
                if code.class() != 2 && !args.verbose {
                    eprintln!("{code}");
                }
                out.write_all(&payload).context("writing to stdout")?;
                if !payload.is_empty() && !payload.ends_with(b"\n") && out.is_terminal() {
                    out.write_all(b"\n").context("writing to stdout")?;
                }
            }
            out.flush().context("writing to stdout")?;
            Ok(ExitCode::from(match code.class() {
                2 => 0,
                4 => EXIT_CLIENT_ERROR,
                5 => EXIT_SERVER_ERROR,
                _ => EXIT_OTHER,
            }))
        }
        Event::Timeout { .. } => {
            eprintln!(
                "mintgate: no response from {dest} within {}",
                fmt_duration(overall.min(start.elapsed()))
            );
            Ok(ExitCode::from(EXIT_TIMEOUT))
        }
        Event::Reset { .. } => {
            eprintln!("mintgate: {dest} rejected the request with a Reset");
            Ok(ExitCode::from(EXIT_RESET))
        }
    }
}

/// Parses a `coap://` URI for a command ([`mintgate_coap::uri::parse`]).
pub(crate) fn parse_uri(s: &str) -> anyhow::Result<CoapUri> {
    mintgate_coap::uri::parse(s).with_context(|| format!("bad URI '{s}'"))
}

/// The socket address of the URI's host (the first one a name resolves to).
pub(crate) fn resolve(uri: &CoapUri) -> anyhow::Result<SocketAddr> {
    Ok(mintgate_gateway::observe_client::resolve(uri)?)
}

/// The value of one hex digit.
fn hex_digit(c: Option<&u8>) -> Option<u8> {
    c.and_then(|c| (*c as char).to_digit(16)).map(|d| d as u8)
}

/// Reports an ICMP port unreachable: nothing listens, so no response will
/// ever come.
fn unreachable(dest: SocketAddr) -> ExitCode {
    eprintln!("mintgate: no response from {dest}: port unreachable (nothing listens there)");
    ExitCode::from(EXIT_TIMEOUT)
}

fn parse_content_format(s: &str) -> Result<ContentFormat, String> {
    ContentFormat::parse(s).ok_or_else(|| {
        format!(
            "unknown Content-Format '{s}': give a number (0-65535) or one of text, link, xml, \
             octet, json, cbor, or a media type such as application/json"
        )
    })
}

/// A positive duration (see `mintgate_gateway::config::parse_duration`).
fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = mintgate_gateway::config::parse_duration(s)?;
    if d.is_zero() {
        return Err(format!("duration '{s}' must be positive"));
    }
    Ok(d)
}

/// Parses `NUM,VALUE` for `-O`.
fn parse_option(s: &str) -> Result<ExtraOption, String> {
    let (num, value) = s.split_once(',').unwrap_or((s, ""));
    let number = match num.trim().parse::<u16>() {
        Ok(n) => OptionNumber(n),
        Err(_) => OptionDef::all()
            .iter()
            .find(|d| d.name.eq_ignore_ascii_case(num.trim()))
            .map(|d| d.number)
            .ok_or_else(|| format!("unknown option '{num}': give a number or a registered name"))?,
    };
    let bytes = if let Some(hex) = value.strip_prefix("0x") {
        if hex.len() % 2 != 0 {
            return Err(format!("hex value '{value}' has an odd number of digits"));
        }
        hex.as_bytes()
            .chunks(2)
            .map(|d| match (hex_digit(d.first()), hex_digit(d.get(1))) {
                (Some(hi), Some(lo)) => Ok(hi << 4 | lo),
                _ => Err(format!("invalid hex value '{value}'")),
            })
            .collect::<Result<Vec<u8>, String>>()?
    } else {
        let uint = number
            .def()
            .filter(|d| d.format == OptionFormat::Uint)
            .and_then(|_| value.parse::<u32>().ok());
        match uint {
            Some(v) => encode_uint(v, &mut [0; 4]).to_vec(),
            None => value.as_bytes().to_vec(),
        }
    };
    Ok(ExtraOption(number, bytes))
}

fn option_name(n: OptionNumber) -> String {
    n.def()
        .map_or_else(|| format!("Option {}", n.0), |d| d.name.to_string())
}

/// A value for people: numbers for uint options (with the media type for
/// Content-Format and Accept), text for strings, hex for the rest.
fn option_value_text(n: OptionNumber, v: &[u8]) -> String {
    match n.def().map(|d| d.format) {
        Some(OptionFormat::Uint) => match decode_uint(v) {
            Some(u) if n == OptionNumber::CONTENT_FORMAT || n == OptionNumber::ACCEPT => {
                let mt = u16::try_from(u)
                    .ok()
                    .and_then(|u| ContentFormat(u).media_type());
                match mt {
                    Some(m) => format!("{u} ({m})"),
                    None => u.to_string(),
                }
            }
            Some(u) => u.to_string(),
            None => hex(v),
        },
        Some(OptionFormat::String) => match std::str::from_utf8(v) {
            Ok(s) => s.to_string(),
            Err(_) => hex(v),
        },
        Some(OptionFormat::Empty) if v.is_empty() => "(empty)".to_string(),
        _ => hex(v),
    }
}

fn hex(v: &[u8]) -> String {
    let mut s = String::from("0x");
    for b in v {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// One JSON object describing a response.
fn json_response(
    code: Code,
    ty: MessageType,
    options: &[(OptionNumber, Vec<u8>)],
    payload: &[u8],
    rtt: Duration,
    retransmissions: u32,
) -> String {
    let mut j = String::new();
    let _ = write!(
        j,
        "{{\"code\":\"{}.{:02}\",\"name\":{},\"type\":\"{}\",\"rtt_ms\":{:.3},\
         \"retransmissions\":{retransmissions},\"options\":[",
        code.class(),
        code.detail(),
        code.name().map_or("null".to_string(), json_string),
        ty.name(),
        rtt.as_secs_f64() * 1e3,
    );
    for (i, (n, v)) in options.iter().enumerate() {
        let value = match n.def().map(|d| d.format) {
            Some(OptionFormat::Uint) => decode_uint(v).map(|u| u.to_string()),
            Some(OptionFormat::String) => std::str::from_utf8(v).ok().map(json_string),
            _ => None,
        }
        .unwrap_or_else(|| json_string(&hex(v)));
        let _ = write!(
            j,
            "{}{{\"number\":{},\"name\":{},\"value\":{value}}}",
            if i == 0 { "" } else { "," },
            n.0,
            n.def().map_or("null".to_string(), |d| json_string(d.name)),
        );
    }
    j.push(']');
    match std::str::from_utf8(payload) {
        Ok(p) => {
            let _ = write!(j, ",\"payload\":{}", json_string(p));
        }
        Err(_) => {
            let _ = write!(
                j,
                ",\"payload\":null,\"payload_hex\":\"{}\"",
                &hex(payload)[2..]
            );
        }
    }
    j.push('}');
    j
}

/// `s` as a JSON string literal.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `1.234 ms`, `2.5 s`.
fn fmt_duration(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{:.3} ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{:.3} s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_durations_options_and_formats() {
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("").is_err());

        assert_eq!(
            parse_option("14,60"),
            Ok(ExtraOption(OptionNumber::MAX_AGE, vec![60]))
        );
        assert_eq!(
            parse_option("If-None-Match"),
            Ok(ExtraOption(OptionNumber::IF_NONE_MATCH, vec![]))
        );
        assert_eq!(
            parse_option("4,0xbeef"),
            Ok(ExtraOption(OptionNumber::ETAG, vec![0xbe, 0xef]))
        );
        assert_eq!(
            parse_option("65000,text"),
            Ok(ExtraOption(OptionNumber(65000), b"text".to_vec()))
        );
        assert!(parse_option("4,0xabc").is_err());
        assert!(parse_option("Nope,1").is_err());
        assert_eq!(parse_content_format("json"), Ok(ContentFormat::JSON));
        assert!(parse_content_format("text/html").is_err());
    }

    #[test]
    fn json_output_is_escaped() {
        let j = json_response(
            Code::CONTENT,
            MessageType::Ack,
            &[
                (OptionNumber::CONTENT_FORMAT, vec![50]),
                (OptionNumber::ETAG, vec![1, 2]),
                (OptionNumber::LOCATION_PATH, b"q\"".to_vec()),
            ],
            b"a\"b\n\x01",
            Duration::from_millis(2),
            1,
        );
        assert_eq!(
            j,
            "{\"code\":\"2.05\",\"name\":\"Content\",\"type\":\"ACK\",\"rtt_ms\":2.000,\
             \"retransmissions\":1,\"options\":[\
             {\"number\":12,\"name\":\"Content-Format\",\"value\":50},\
             {\"number\":4,\"name\":\"ETag\",\"value\":\"0x0102\"},\
             {\"number\":8,\"name\":\"Location-Path\",\"value\":\"q\\\"\"}],\
             \"payload\":\"a\\\"b\\n\\u0001\"}"
        );
        let bin = json_response(
            Code::CONTENT,
            MessageType::Non,
            &[],
            &[0xff],
            Duration::ZERO,
            0,
        );
        assert!(bin.ends_with("\"payload\":null,\"payload_hex\":\"ff\"}"));
    }

    #[test]
    fn option_values_for_people() {
        assert_eq!(
            option_value_text(OptionNumber::CONTENT_FORMAT, &[]),
            "0 (text/plain;charset=utf-8)"
        );
        assert_eq!(option_value_text(OptionNumber::MAX_AGE, &[1, 0]), "256");
        assert_eq!(option_value_text(OptionNumber::ETAG, &[0xab]), "0xab");
        assert_eq!(option_name(OptionNumber(65000)), "Option 65000");
    }
}
