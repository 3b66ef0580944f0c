//! `mintgate get|put|post|delete`: one CoAP request from the command line.
//!
//! The gateway's outbound client ([`Outbound`]): the sans-IO client on one
//! UDP socket connected to the destination, the chosen retransmission
//! controller, block-wise transfers (a large payload goes up with Block1, a
//! large answer comes back whole through Block2), and with `--cache` the
//! network cache in front (useful with `--count`). Prints the response and
//! exits with a code that tells scripts what happened (see [`EXIT_CODES`]).

use std::fmt::Write as _;
use std::io::{self, IsTerminal, Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use mintgate_coap::cache::Cache;
use mintgate_coap::client::blockwise::BlockConfig;
use mintgate_coap::client::tcp::ClientConnection;
use mintgate_coap::client::{ClientConfig, Request};
use mintgate_coap::rto::{Adaptive, Basic, Cocoa, RtoController, TransmissionParams};
use mintgate_coap::uri::{Host, Scheme};
use mintgate_coap::wire::{
    decode_uint, encode_uint, Code, ContentFormat, OptionDef, OptionFormat, OptionNumber,
};
use mintgate_gateway::outbound::{Outbound, OutboundError, Source};

use crate::common::{json_string, parse_positive_duration, resolve};

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
  7  coaps: the DTLS handshake failed (wrong pre-shared key or identity,
     untrusted or wrong-name certificate)

Large payloads go block-wise (RFC 7959): a request payload over the block
size is sent with Block1 (in the size the server's 2.31 asks for, if
smaller), and a block-wise answer is fetched whole through Block2, its
ETag checked on every block.

coap+tcp://HOST[:PORT]/PATH (port 5683 by default) runs the request over
CoAP over TCP (RFC 8323): one connection, CSM first, no retransmissions;
--count repeats it on the same connection. coaps+tcp://HOST[:PORT]/PATH
(port 5684) does the same over TLS 1.2/1.3 with ALPN \"coap\": --coaps-ca
is required (the server's certificate must chain to it and name HOST),
--coaps-cert/--coaps-key add a client certificate; no pre-shared keys.
coap+ws://HOST[:PORT]/PATH (port 80) and coaps+ws://... (port 443, TLS as
for coaps+tcp) run it over WebSockets (RFC 8323 section 4): the connection
is upgraded at /.well-known/coap with the subprotocol \"coap\" (mintgate
serve listens for them on `coap.ws_bind` and `coaps.ws_bind`).

coaps://HOST[:PORT]/PATH (port 5684 by default) runs the request over
DTLS 1.2 (RFC 7252 section 9): with --psk-identity and --psk-key
(pre-shared key), or with --coaps-ca (the server's certificate must chain
to it and name HOST) and optionally --coaps-cert/--coaps-key (a client
certificate).

Output: the response payload goes to stdout; for a response other than 2.xx
the code (e.g. \"4.04 Not Found\") also goes to stderr. --verbose adds the
message type, code, options and round-trip time on stderr; --json prints one
JSON object with code, type, options and payload on stdout instead.";

/// How long a coaps handshake may take without --timeout.
const DTLS_HANDSHAKE_WAIT: Duration = Duration::from_secs(15);

// 3 to 6 mean the same for `observe`, which takes them from here.
pub(crate) const EXIT_CLIENT_ERROR: u8 = 3;
pub(crate) const EXIT_SERVER_ERROR: u8 = 4;
pub(crate) const EXIT_TIMEOUT: u8 = 5;
pub(crate) const EXIT_RESET: u8 = 6;
const EXIT_OTHER: u8 = 1;
const EXIT_HANDSHAKE: u8 = 7;

/// Default time to wait for a TCP connection and for each response over it.
const TCP_TIMEOUT: Duration = Duration::from_secs(15);
/// The Max-Message-Size our CSM announces over TCP.
const TCP_MAX_MESSAGE_SIZE: u32 = 65000;

/// Default overall timeout of a NON request.
const NON_TIMEOUT: Duration = Duration::from_secs(5);

/// Arguments of the request commands.
#[derive(clap::Args)]
#[command(after_help = EXIT_CODES)]
pub struct RequestArgs {
    /// coap://host[:port]/path?query, coaps://..., coap+tcp://...,
    /// coaps+tcp://..., coap+ws://... or coaps+ws://... — host is an IPv4
    /// address, an IPv6 address in brackets or a name; port defaults to
    /// 5683 (coaps, coaps+tcp: 5684; coap+ws: 80; coaps+ws: 443); path
    /// segments and query parameters are percent-decoded.
    #[arg(value_name = "URI")]
    uri: String,
    #[command(flatten)]
    dtls: DtlsArgs,
    /// Request payload, as given (may start with '-': `-e -3.5`).
    #[arg(
        short = 'e',
        long,
        value_name = "TEXT",
        allow_hyphen_values = true,
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
    #[arg(long, value_name = "DUR", value_parser = parse_positive_duration)]
    timeout: Option<Duration>,
    /// Extra option, repeatable. NUM is a number or a registered name
    /// (e.g. If-None-Match); VALUE is a decimal integer for uint options
    /// (or a Content-Format name for Accept and Content-Format), 0x-prefixed
    /// hex for raw bytes (sent as given), otherwise text; a registered
    /// option's value must fit its length. `-O 5` gives an empty value.
    #[arg(short = 'O', long = "option", value_name = "NUM,VALUE", value_parser = parse_option)]
    options: Vec<ExtraOption>,
    // Declared like http's --token and --token-file: clap flags whose names,
    // variables and help differ per command, so each stays with its command.
    /// Access token for writes to a gateway with `access.write = "token"`,
    /// sent in the Access-Token option (65002); also read from
    /// MINTGATE_ACCESS_TOKEN.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "MINTGATE_ACCESS_TOKEN",
        hide_env_values = true
    )]
    access_token: Option<String>,
    /// File holding the access token (one line); replaces --access-token.
    #[arg(long, value_name = "FILE")]
    access_token_file: Option<PathBuf>,
    /// Protect the request with OSCORE (RFC 8613): a context file in TOML
    /// with the keys of one `[[oscore.contexts]]` (docs/config.md); its
    /// sender sequence number is kept in NAME.seq beside the file (locked
    /// while in use). Over every scheme (coap, coaps, coap+tcp, coaps+tcp,
    /// coap+ws, coaps+ws); an answer larger than a block comes in inner
    /// blocks, each protected on its own (RFC 8613 4.1.3.4.1), and so does
    /// a large body over coap and coaps (over TCP and WebSockets it goes in
    /// one message).
    #[arg(long, value_name = "CONTEXT-FILE")]
    oscore: Option<PathBuf>,
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
    /// Block size for block-wise transfers: 16, 32, ... 1024 bytes. Given,
    /// it is also asked for in the answer (Block2 from the first request)
    /// [default: 1024, the server picks the answer's].
    #[arg(long, value_name = "BYTES", value_parser = parse_block_size)]
    block_size: Option<usize>,
    /// Keep answers in the network cache (RFC 7252 5.6): a GET repeated
    /// with --count is answered from a fresh entry, and revalidated with
    /// its ETag when stale.
    #[arg(long)]
    cache: bool,
    /// Send the request this many times (each as above; the exit status is
    /// the last one's). Each answer's payload then ends a line.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    count: u32,
    /// Time between repeated requests, e.g. 500ms, 2s [default: none, each
    /// request sent as soon as the one before is answered].
    #[arg(long, value_name = "DUR", value_parser = parse_positive_duration)]
    interval: Option<Duration>,
}

/// The DTLS options of a coaps request.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct DtlsArgs {
    /// coaps: the PSK identity to use with --psk-key (or with the key in
    /// the MINTGATE_PSK_KEY variable, which does not show in `ps`).
    #[arg(long, value_name = "ID")]
    pub psk_identity: Option<String>,
    /// coaps: the pre-shared key of --psk-identity, as text or 0x and hex
    /// digits.
    #[arg(long, value_name = "KEY", requires = "psk_identity")]
    pub psk_key: Option<String>,
    /// coaps: PEM CA certificates the server's certificate must chain to
    /// (its subjectAltName must name the URI's host).
    #[arg(long, value_name = "FILE")]
    pub coaps_ca: Option<PathBuf>,
    /// coaps: PEM client certificate chain to present.
    #[arg(long, value_name = "FILE", requires = "coaps_key")]
    pub coaps_cert: Option<PathBuf>,
    /// coaps: PEM private key of --coaps-cert.
    #[arg(long, value_name = "FILE", requires = "coaps_cert")]
    pub coaps_key: Option<PathBuf>,
}

impl DtlsArgs {
    /// The client settings for a session with `host`.
    pub fn settings(&self, host: &Host) -> anyhow::Result<mintgate_dtls::ClientSettings> {
        let psk = match &self.psk_identity {
            Some(id) => {
                let k = crate::psk_key_or_env(self.psk_key.as_deref()).ok_or_else(|| {
                    crate::UsageError(format!(
                        "--psk-identity needs a key: --psk-key KEY or the {} variable",
                        crate::PSK_KEY_VAR
                    ))
                })?;
                Some(
                    mintgate_dtls::parse_key(&k)
                        .and_then(|key| mintgate_dtls::Psk::new(id, key))
                        .context("--psk-identity/--psk-key")?,
                )
            }
            None => None,
        };
        Ok(mintgate_dtls::ClientSettings {
            psk,
            certs: mintgate_dtls::CertFiles {
                chain: self.coaps_cert.clone(),
                key: self.coaps_key.clone(),
                ca: self.coaps_ca.clone(),
            },
            server_name: Some(match host {
                Host::Ip(ip) => ip.to_string(),
                Host::Name(n) => n.clone(),
            }),
            mtu: 0,
        })
    }

    /// Whether any DTLS option was given.
    pub fn any(&self) -> bool {
        self.psk_identity.is_some() || self.coaps_ca.is_some() || self.coaps_cert.is_some()
    }
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
    let (uri, scheme) = mintgate_coap::uri::parse_scheme(&args.uri)
        .with_context(|| format!("bad URI '{}'", args.uri))?;
    let secure = scheme == Scheme::Coaps;
    let dest = resolve(&uri)?;
    if matches!(scheme, Scheme::CoapsTcp | Scheme::CoapsWs) {
        let name = if scheme == Scheme::CoapsTcp {
            "coaps+tcp"
        } else {
            "coaps+ws"
        };
        if args.dtls.psk_identity.is_some() {
            anyhow::bail!(
                "{name}:// takes certificates only (--coaps-ca, --coaps-cert/--coaps-key): \
                 the TLS library has no pre-shared keys"
            );
        }
        if args.dtls.coaps_ca.is_none() {
            return Err(crate::UsageError(format!(
                "{name}:// needs --coaps-ca FILE: the CA the server's certificate must chain to"
            ))
            .into());
        }
    } else if !secure && args.dtls.any() {
        anyhow::bail!(
            "--psk-identity, --coaps-ca and --coaps-cert are for coaps://, coaps+tcp:// and \
             coaps+ws:// URIs only"
        );
    }

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
    let access_token = match &args.access_token_file {
        Some(f) => Some(crate::secret_from_file(f, "--access-token-file")?),
        None => args.access_token.clone(),
    };
    if let Some(t) = &access_token {
        options.push((
            mintgate_gateway::access::ACCESS_TOKEN,
            t.as_bytes().to_vec(),
        ));
    }

    // over WebSockets: the authority the upgrade request names
    let ws = matches!(scheme, Scheme::CoapWs | Scheme::CoapsWs).then(|| {
        let host = match &uri.host {
            Host::Ip(std::net::IpAddr::V6(ip)) => format!("[{ip}]"),
            Host::Ip(ip) => ip.to_string(),
            Host::Name(n) => n.clone(),
        };
        (scheme == Scheme::CoapsWs, format!("{host}:{}", uri.port))
    });
    // the Uri-Host of a name: the WebSocket's Host header carries it
    if ws.is_some() {
        options.retain(|(n, _)| *n != OptionNumber::URI_HOST);
    }
    let link = |ws: &Option<(bool, String)>| match ws {
        Some((_, authority)) => Framed::WebSocket(authority.clone()),
        None => Framed::Stream,
    };
    match scheme {
        Scheme::CoapTcp | Scheme::CoapWs => {
            return run_tcp(method, &args, dest, None, link(&ws), &options, &payload)
        }
        Scheme::CoapsTcp | Scheme::CoapsWs => {
            let ca = args
                .dtls
                .coaps_ca
                .as_deref()
                .unwrap_or(std::path::Path::new(""));
            let key = args
                .dtls
                .coaps_cert
                .as_deref()
                .zip(args.dtls.coaps_key.as_deref());
            let mut cfg = mintgate_gateway::coap_tcp::client_tls_config(ca, key)
                .map_err(anyhow::Error::msg)
                .context("TLS")?;
            if ws.is_some() {
                // a WebSocket starts as HTTP/1.1 (RFC 8323 section 4.1)
                let mut c = (*cfg).clone();
                c.alpn_protocols = vec![b"http/1.1".to_vec()];
                cfg = std::sync::Arc::new(c);
            }
            let name = match &uri.host {
                Host::Ip(ip) => rustls::pki_types::ServerName::IpAddress((*ip).into()),
                Host::Name(n) => rustls::pki_types::ServerName::try_from(n.clone())
                    .with_context(|| format!("'{n}' is not a TLS server name"))?,
            };
            return run_tcp(
                method,
                &args,
                dest,
                Some((cfg, name)),
                link(&ws),
                &options,
                &payload,
            );
        }
        Scheme::Coap | Scheme::Coaps => {}
    }

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
    let block = BlockConfig {
        block_size: args.block_size.unwrap_or(1024),
        ask_block2: args.block_size.is_some(),
        ..BlockConfig::default()
    };
    let mut out = if secure {
        let settings = args.dtls.settings(&uri.host)?;
        // A handshake the server does not answer (a wrong key: DTLS drops
        // what it cannot authenticate, without an alert) is given up after
        // 15 s unless --timeout says otherwise; a server drops an unfinished
        // handshake sooner (mintgate: coaps.handshake_timeout_s, 10 s).
        let handshake = match args.timeout {
            Some(t) => t,
            None => overall.min(DTLS_HANDSHAKE_WAIT),
        };
        match Outbound::new_dtls(
            dest,
            settings,
            Instant::now() + handshake,
            config,
            rto,
            seed,
            block,
        ) {
            Ok(o) => {
                if args.verbose {
                    eprintln!(
                        "-- DTLS session with {dest}, {}",
                        o.dtls_cipher().unwrap_or("?")
                    );
                }
                o
            }
            Err(OutboundError::Unreachable) => return Ok(unreachable(dest)),
            Err(OutboundError::Dtls(mintgate_dtls::DtlsError::Timeout)) => {
                eprintln!(
                    "mintgate: no DTLS handshake with {dest} within {}{}",
                    fmt_duration(handshake),
                    if args.dtls.psk_identity.is_some() {
                        " (a wrong pre-shared key goes unanswered)"
                    } else {
                        ""
                    }
                );
                return Ok(ExitCode::from(EXIT_TIMEOUT));
            }
            Err(OutboundError::Dtls(e @ mintgate_dtls::DtlsError::Handshake(_))) => {
                eprintln!("mintgate: {dest}: {e}");
                return Ok(ExitCode::from(EXIT_HANDSHAKE));
            }
            Err(e) => return Err(e).with_context(|| format!("coaps session with {dest}")),
        }
    } else {
        Outbound::new(dest.is_ipv6(), config, rto, seed, block).context("binding a UDP socket")?
    };
    if args.cache {
        out = out.with_cache(Cache::new(64, 16 << 20).with_max_bytes(64 << 20));
    }

    let request = Request {
        confirmable: !args.non,
        code: method,
        options,
        payload,
    };
    let mut oscore = match &args.oscore {
        Some(f) => Some(oscore_context(
            f,
            mintgate_gateway::oscore::DEFAULT_SEQ_STEP,
        )?),
        None => None,
    };
    let mut status = ExitCode::SUCCESS;
    for i in 0..args.count {
        if i > 0 {
            if let Some(d) = args.interval {
                std::thread::sleep(d);
            }
        }
        status = one(
            &args,
            &mut out,
            dest,
            request.clone(),
            overall,
            oscore.as_mut(),
        )?;
    }
    Ok(status)
}

/// The OSCORE context of `--oscore FILE`, its sequence number in
/// NAME.seq beside the file, reserved `step` numbers at a time.
pub(crate) fn oscore_context(
    f: &std::path::Path,
    step: u64,
) -> anyhow::Result<mintgate_coap::oscore::Context> {
    let cfg = mintgate_gateway::oscore::ContextConfig::from_file(f)
        .map_err(|e| anyhow::anyhow!("--oscore: {e}"))?;
    let dir = match f.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    let (ctx, _) = mintgate_gateway::oscore::open_context(&cfg, dir, dir, step)
        .map_err(|e| anyhow::anyhow!("--oscore {}: {e}", f.display()))?;
    Ok(ctx)
}

/// One request through `out`; prints the outcome and returns the exit code.
fn one(
    args: &RequestArgs,
    out: &mut Outbound,
    dest: SocketAddr,
    request: Request,
    overall: Duration,
    oscore: Option<&mut mintgate_coap::oscore::Context>,
) -> anyhow::Result<ExitCode> {
    let method = request.code;
    if args.verbose {
        eprintln!(
            "-> {} {} {} ({dest}, {} byte payload)",
            if args.non { "NON" } else { "CON" },
            method.name().unwrap_or("?"),
            args.uri,
            request.payload.len(),
        );
    }
    let start = Instant::now();
    // with OSCORE, the answer is the verified inner one, put together from
    // inner blocks (a server's Echo challenge is answered on the way)
    let result = match oscore {
        Some(ctx) => out.request_sealed(
            dest,
            request,
            &mut mintgate_coap::oscore::client::Sealer::new(ctx),
            start + overall,
        ),
        None => out.request(dest, request, start + overall),
    };
    let fetched = match result {
        Ok(f) => f,
        Err(OutboundError::Timeout) => {
            eprintln!(
                "mintgate: no response from {dest} within {}",
                fmt_duration(overall.min(start.elapsed()))
            );
            return Ok(ExitCode::from(EXIT_TIMEOUT));
        }
        Err(OutboundError::Unreachable) => return Ok(unreachable(dest)),
        Err(OutboundError::Reset) => {
            eprintln!("mintgate: {dest} rejected the request with a Reset");
            return Ok(ExitCode::from(EXIT_RESET));
        }
        Err(OutboundError::Block(e)) => {
            eprintln!("mintgate: {dest}: {e}");
            return Ok(ExitCode::from(EXIT_OTHER));
        }
        Err(OutboundError::Request(e)) => return Err(e.into()),
        Err(OutboundError::Io(e)) => return Err(e).with_context(|| format!("talking to {dest}")),
        Err(OutboundError::Dtls(e)) => {
            eprintln!("mintgate: {dest}: {e}");
            return Ok(ExitCode::from(EXIT_OTHER));
        }
        Err(OutboundError::Oscore(e)) => {
            eprintln!("mintgate: {dest}: OSCORE: {e}");
            return Ok(ExitCode::from(EXIT_OTHER));
        }
        Err(OutboundError::Refused { code, payload }) => return Ok(refused(dest, code, &payload)),
    };
    let r = fetched.response;
    let via = match fetched.source {
        Source::Network if r.exchanges > 1 => format!(", {} exchanges", r.exchanges),
        Source::Network => String::new(),
        Source::Cache { age } => format!(", from the cache, {age} s old"),
        Source::Revalidated => ", from the cache, revalidated".to_string(),
    };
    print_response(
        args,
        r.code,
        r.msg_type.name(),
        &r.options,
        &r.payload,
        (r.rtt, r.retransmissions),
        &via,
    )
}

/// Says that `dest` answered a protected request unprotected (`code`, with
/// its diagnostic `why`): it refused it. The exit code of the class.
fn refused(dest: SocketAddr, code: Code, why: &[u8]) -> ExitCode {
    eprintln!(
        "mintgate: {dest} refused the OSCORE request: {code} {}",
        String::from_utf8_lossy(why)
    );
    ExitCode::from(match code.class() {
        4 => EXIT_CLIENT_ERROR,
        5 => EXIT_SERVER_ERROR,
        _ => EXIT_OTHER,
    })
}

/// Prints a response as the flags ask; returns the exit code of its class.
fn print_response<V: AsRef<[u8]>>(
    args: &RequestArgs,
    code: Code,
    ty: &str,
    options: &[(OptionNumber, V)],
    payload: &[u8],
    (rtt, retransmissions): (Duration, u32),
    via: &str,
) -> anyhow::Result<ExitCode> {
    if args.verbose {
        eprintln!(
            "<- {ty} {code} ({}, {retransmissions} retransmission{}{via})",
            fmt_duration(rtt),
            if retransmissions == 1 { "" } else { "s" },
        );
        for (n, v) in options {
            eprintln!(
                "   {}: {}",
                option_name(*n),
                option_value_text(*n, v.as_ref())
            );
        }
    }
    let mut stdout = io::stdout().lock();
    if args.json {
        let j = json_response(code, ty, options, payload, rtt, retransmissions);
        writeln!(stdout, "{j}").context("writing to stdout")?;
    } else {
        if code.class() != 2 && !args.verbose {
            eprintln!("{code}");
        }
        stdout.write_all(payload).context("writing to stdout")?;
        // byte for byte into a pipe or file, unless --count puts several
        // answers there: then each ends a line
        if !payload.is_empty()
            && !payload.ends_with(b"\n")
            && (stdout.is_terminal() || args.count > 1)
        {
            stdout.write_all(b"\n").context("writing to stdout")?;
        }
    }
    stdout.flush().context("writing to stdout")?;
    Ok(ExitCode::from(match code.class() {
        2 => 0,
        4 => EXIT_CLIENT_ERROR,
        5 => EXIT_SERVER_ERROR,
        _ => EXIT_OTHER,
    }))
}

/// A TCP connection to talk CoAP over, with or without TLS.
trait TcpLike: Read + Write {
    fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()>;
}

impl TcpLike for std::net::TcpStream {
    fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        std::net::TcpStream::set_read_timeout(self, d)
    }
}

impl TcpLike for rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream> {
    fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        self.sock.set_read_timeout(d)
    }
}

/// How CoAP frames travel on the connection (RFC 8323).
enum Framed {
    /// Length-prefixed on the byte stream (coap+tcp, coaps+tcp).
    Stream,
    /// One per WebSocket message, after an upgrade at `/.well-known/coap`
    /// naming this authority (coap+ws, coaps+ws).
    WebSocket(String),
}

/// Sends the request over CoAP over TCP (RFC 8323) `--count` times on one
/// connection (TLS with `tls`: coaps+tcp; WebSockets over it with
/// `framed`); prints each answer.
fn run_tcp(
    method: Code,
    args: &RequestArgs,
    dest: SocketAddr,
    tls: Option<(
        std::sync::Arc<rustls::ClientConfig>,
        rustls::pki_types::ServerName<'static>,
    )>,
    framed: Framed,
    options: &[(OptionNumber, Vec<u8>)],
    payload: &[u8],
) -> anyhow::Result<ExitCode> {
    use std::net::TcpStream;
    if args.non || args.cache || args.block_size.is_some() {
        return Err(crate::UsageError(
            "--non, --cache and --block-size are for coap:// and coaps:// URIs only".into(),
        )
        .into());
    }
    let overall = args.timeout.unwrap_or(TCP_TIMEOUT);
    let timed_out = |what: &str, t: Instant| tcp_timed_out(dest, overall, what, t);
    let start = Instant::now();
    let mut s = match TcpStream::connect_timeout(&dest, overall) {
        Ok(s) => s,
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            eprintln!("mintgate: {dest}: connection refused (nothing listens there)");
            return Ok(ExitCode::from(EXIT_TIMEOUT));
        }
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
            ) =>
        {
            return timed_out("connection", start)
        }
        Err(e) => return Err(e).with_context(|| format!("connecting to {dest}")),
    };
    let _ = s.set_nodelay(true);
    let Some((cfg, name)) = tls else {
        return framed_requests(method, args, dest, s, framed, options, payload, start);
    };
    let mut conn = rustls::ClientConnection::new(cfg, name).context("starting TLS")?;
    let _ = s.set_read_timeout(Some(overall));
    while conn.is_handshaking() {
        if let Err(e) = conn.complete_io(&mut s) {
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) {
                return timed_out("TLS handshake", start);
            }
            eprintln!("mintgate: the TLS handshake with {dest} failed: {e}");
            return Ok(ExitCode::from(EXIT_HANDSHAKE));
        }
    }
    if matches!(framed, Framed::Stream) && conn.alpn_protocol() != Some(b"coap") {
        eprintln!("mintgate: {dest} did not agree to ALPN \"coap\" (RFC 8323 4.1); going on");
    }
    framed_requests(
        method,
        args,
        dest,
        rustls::StreamOwned::new(conn, s),
        framed,
        options,
        payload,
        start,
    )
}

/// [`tcp_requests`] on `s` as it is, or after a WebSocket upgrade.
#[allow(clippy::too_many_arguments)]
fn framed_requests<S: TcpLike>(
    method: Code,
    args: &RequestArgs,
    dest: SocketAddr,
    s: S,
    framed: Framed,
    options: &[(OptionNumber, Vec<u8>)],
    payload: &[u8],
    start: Instant,
) -> anyhow::Result<ExitCode> {
    let Framed::WebSocket(authority) = framed else {
        let link = StreamLink {
            s,
            buf: vec![0u8; 16 << 10],
        };
        return tcp_requests(method, args, dest, link, options, payload);
    };
    use tungstenite::client::IntoClientRequest;
    let overall = args.timeout.unwrap_or(TCP_TIMEOUT);
    // the scheme only picks the handshake's form; TLS is already under `s`
    let mut req = format!("ws://{authority}/.well-known/coap")
        .into_client_request()
        .context("the WebSocket upgrade request")?;
    req.headers_mut().insert(
        "sec-websocket-protocol",
        tungstenite::http::HeaderValue::from_static("coap"),
    );
    s.set_read_timeout(Some(overall))
        .with_context(|| format!("talking to {dest}"))?;
    let ws = match tungstenite::client(req, s) {
        Ok((ws, _)) => ws,
        Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(r))) => {
            eprintln!(
                "mintgate: {dest} refused the WebSocket upgrade at /.well-known/coap: {}",
                r.status()
            );
            return Ok(ExitCode::from(EXIT_OTHER));
        }
        Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Io(e)))
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            return tcp_timed_out(dest, overall, "WebSocket upgrade", start)
        }
        Err(e) => {
            eprintln!("mintgate: the WebSocket upgrade with {dest} failed: {e}");
            return Ok(ExitCode::from(EXIT_OTHER));
        }
    };
    tcp_requests(method, args, dest, WsLink { ws }, options, payload)
}

/// Why waiting for input on a [`Link`] ended without any.
enum LinkError {
    /// Nothing came in time.
    Timeout,
    /// The server broke the protocol or ended the connection.
    Coap(mintgate_coap::client::tcp::ConnectionError),
    /// The transport failed.
    Io(anyhow::Error),
}

/// What carries a CoAP-over-TCP client connection: a byte stream (TCP,
/// TLS) or WebSocket messages.
trait Link {
    /// Frames travel as WebSocket messages (no length field).
    const WEBSOCKET: bool;
    /// Sends everything the connection has queued.
    fn send(&mut self, c: &mut ClientConnection) -> anyhow::Result<()>;
    /// Waits up to `left` for input and feeds it to the connection;
    /// `Ok(false)` when the server closed.
    fn recv(
        &mut self,
        c: &mut ClientConnection,
        left: Duration,
        got: &mut Vec<mintgate_coap::client::tcp::TcpResponse>,
    ) -> Result<bool, LinkError>;
}

fn timed_out_kind(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Length-prefixed frames on a byte stream.
struct StreamLink<S> {
    s: S,
    buf: Vec<u8>,
}

impl<S: TcpLike> Link for StreamLink<S> {
    const WEBSOCKET: bool = false;

    fn send(&mut self, c: &mut ClientConnection) -> anyhow::Result<()> {
        self.s.write_all(c.output())?;
        let n = c.output().len();
        c.consume_output(n);
        Ok(())
    }

    fn recv(
        &mut self,
        c: &mut ClientConnection,
        left: Duration,
        got: &mut Vec<mintgate_coap::client::tcp::TcpResponse>,
    ) -> Result<bool, LinkError> {
        self.s
            .set_read_timeout(Some(left))
            .map_err(|e| LinkError::Io(e.into()))?;
        match self.s.read(&mut self.buf) {
            Ok(0) => Ok(false),
            Ok(n) => c
                .receive(&self.buf[..n], got)
                .map(|()| true)
                .map_err(LinkError::Coap),
            Err(e) if timed_out_kind(&e) => Err(LinkError::Timeout),
            Err(e) => Err(LinkError::Io(e.into())),
        }
    }
}

/// One frame per binary WebSocket message (RFC 8323 section 4).
struct WsLink<S> {
    ws: tungstenite::WebSocket<S>,
}

impl<S: TcpLike> Link for WsLink<S> {
    const WEBSOCKET: bool = true;

    fn send(&mut self, c: &mut ClientConnection) -> anyhow::Result<()> {
        while let Some(m) = c.next_message().map(<[u8]>::to_vec) {
            let n = m.len();
            self.ws.send(tungstenite::Message::binary(m))?;
            c.consume_output(n);
        }
        Ok(())
    }

    // The signature is Link's, as in StreamLink; the body reads WebSocket
    // messages instead of a byte stream.
    fn recv(
        &mut self,
        c: &mut ClientConnection,
        left: Duration,
        got: &mut Vec<mintgate_coap::client::tcp::TcpResponse>,
    ) -> Result<bool, LinkError> {
        self.ws
            .get_mut()
            .set_read_timeout(Some(left))
            .map_err(|e| LinkError::Io(e.into()))?;
        match self.ws.read() {
            Ok(tungstenite::Message::Binary(m)) => c
                .receive_message(&m, got)
                .map(|()| true)
                .map_err(LinkError::Coap),
            Ok(tungstenite::Message::Close(_)) => Ok(false),
            Ok(tungstenite::Message::Text(_)) => Err(LinkError::Io(anyhow::anyhow!(
                "the server sent a text WebSocket message (CoAP travels in binary ones)"
            ))),
            // pings are answered inside tungstenite
            Ok(_) => Ok(true),
            Err(tungstenite::Error::Io(e)) if timed_out_kind(&e) => Err(LinkError::Timeout),
            Err(tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed) => {
                Ok(false)
            }
            Err(e) => Err(LinkError::Io(e.into())),
        }
    }
}

/// Says that `what` did not come from `dest` within `overall` (of the
/// time since `t`); the exit status of a timeout.
fn tcp_timed_out(
    dest: SocketAddr,
    overall: Duration,
    what: &str,
    t: Instant,
) -> anyhow::Result<ExitCode> {
    eprintln!(
        "mintgate: no {what} from {dest} within {}",
        fmt_duration(overall.min(t.elapsed()))
    );
    Ok(ExitCode::from(EXIT_TIMEOUT))
}

/// The requests of [`run_tcp`] on an open connection. A block-wise answer
/// (RFC 7959) is fetched whole, in BERT blocks of several kilobytes when
/// both CSMs offered them (RFC 8323 section 6).
fn tcp_requests<L: Link>(
    method: Code,
    args: &RequestArgs,
    dest: SocketAddr,
    mut link: L,
    options: &[(OptionNumber, Vec<u8>)],
    payload: &[u8],
) -> anyhow::Result<ExitCode> {
    let overall = args.timeout.unwrap_or(TCP_TIMEOUT);
    let ws = L::WEBSOCKET;
    let mut c = if ws {
        ClientConnection::websocket(TCP_MAX_MESSAGE_SIZE, rand::random())
    } else {
        ClientConnection::new(TCP_MAX_MESSAGE_SIZE, rand::random())
    };
    let mut oscore = match &args.oscore {
        Some(f) => Some(oscore_context(
            f,
            mintgate_gateway::oscore::DEFAULT_SEQ_STEP,
        )?),
        None => None,
    };
    let mut x = TcpExchange {
        link: &mut link,
        c: &mut c,
        got: Vec::new(),
        dest,
        overall,
        transport: if ws { "WebSocket" } else { "TCP" },
        oscore: oscore.as_mut(),
    };
    let mut status = ExitCode::SUCCESS;
    for i in 0..args.count {
        if i > 0 {
            if let Some(d) = args.interval {
                std::thread::sleep(d);
            }
        }
        let t0 = Instant::now();
        if args.verbose {
            eprintln!(
                "-> {} {} ({dest}, {}, {} byte payload)",
                method.name().unwrap_or("?"),
                args.uri,
                x.transport,
                payload.len(),
            );
        }
        let mut resp = match x.exchange(method, options, payload)? {
            Ok(r) => r,
            Err(code) => return Ok(code),
        };
        let mut messages = 1;
        if let Err(code) = x.rest_of_body(method, options, payload, &mut resp, &mut messages)? {
            return Ok(code);
        }
        if args.verbose && messages > 1 {
            eprintln!(
                "   {} bytes in {messages} messages{}",
                resp.payload.len(),
                if x.bert() { " (BERT)" } else { "" }
            );
        }
        status = print_response(
            args,
            resp.code,
            x.transport,
            &resp.options,
            &resp.payload,
            (t0.elapsed(), 0),
            "",
        )?;
    }
    Ok(status)
}

/// Largest body `mintgate get` puts together from blocks.
const MAX_BLOCK_BODY: usize = 16 << 20;

/// One connection's exchanges for [`tcp_requests`].
struct TcpExchange<'a, L> {
    link: &'a mut L,
    c: &'a mut ClientConnection,
    got: Vec<mintgate_coap::client::tcp::TcpResponse>,
    dest: SocketAddr,
    overall: Duration,
    transport: &'static str,
    /// `--oscore`: every request protected, every answer verified.
    oscore: Option<&'a mut mintgate_coap::oscore::Context>,
}

impl<L: Link> TcpExchange<'_, L> {
    /// Sends one request and waits for its answer, protected with OSCORE
    /// when the exchange has a context (the answer is then the verified
    /// inner one, and a server's Echo challenge, RFC 8613 B.1.2, is
    /// answered once); `Err(code)` when there is none, said on stderr.
    fn exchange(
        &mut self,
        method: Code,
        options: &[(OptionNumber, Vec<u8>)],
        payload: &[u8],
    ) -> anyhow::Result<Result<mintgate_coap::client::tcp::TcpResponse, ExitCode>> {
        let Some(ctx) = self.oscore.take() else {
            return self.exchange_plain(method, options, payload);
        };
        let r = self.exchange_sealed(ctx, method, options, payload);
        self.oscore = Some(ctx);
        r
    }

    fn exchange_sealed(
        &mut self,
        ctx: &mut mintgate_coap::oscore::Context,
        method: Code,
        options: &[(OptionNumber, Vec<u8>)],
        payload: &[u8],
    ) -> anyhow::Result<Result<mintgate_coap::client::tcp::TcpResponse, ExitCode>> {
        let dest = self.dest;
        let oscore_failed = |e: mintgate_coap::oscore::Error| {
            eprintln!("mintgate: {dest}: OSCORE: {e}");
            Ok(Err(ExitCode::from(EXIT_OTHER)))
        };
        let mut req = Request {
            confirmable: true,
            code: method,
            options: options.to_vec(),
            payload: payload.to_vec(),
        };
        let mut sealer = mintgate_coap::oscore::client::Sealer::new(ctx);
        for attempt in 0..2 {
            let outer = match sealer.seal(&req) {
                Ok(o) => o,
                Err(e) => return oscore_failed(e),
            };
            let resp = match self.exchange_plain(outer.code, &outer.options, &outer.payload)? {
                Ok(r) => r,
                Err(code) => return Ok(Err(code)),
            };
            if !resp
                .options
                .iter()
                .any(|(n, _)| *n == mintgate_coap::oscore::OSCORE)
            {
                return Ok(Err(refused(dest, resp.code, &resp.payload)));
            }
            let opts: Vec<(OptionNumber, &[u8])> =
                resp.options.iter().map(|(n, v)| (*n, &v[..])).collect();
            let (code, options, payload) = match sealer.open(resp.code, &opts, &resp.payload) {
                Ok(i) => i,
                Err(e) => return oscore_failed(e),
            };
            let echo = options
                .iter()
                .find(|(n, _)| *n == OptionNumber::ECHO)
                .map(|(_, v)| v.clone());
            match echo {
                Some(e) if code == Code::UNAUTHORIZED && attempt == 0 => {
                    req.options.retain(|(n, _)| *n != OptionNumber::ECHO);
                    req.options.push((OptionNumber::ECHO, e));
                }
                _ => {
                    return Ok(Ok(mintgate_coap::client::tcp::TcpResponse {
                        token: resp.token,
                        code,
                        options,
                        payload,
                    }))
                }
            }
        }
        oscore_failed(mintgate_coap::oscore::Error::Replay)
    }

    /// Sends one request (after the server's CSM) and waits for its
    /// answer; `Err(code)` when there is none, said on stderr.
    fn exchange_plain(
        &mut self,
        method: Code,
        options: &[(OptionNumber, Vec<u8>)],
        payload: &[u8],
    ) -> anyhow::Result<Result<mintgate_coap::client::tcp::TcpResponse, ExitCode>> {
        let dest = self.dest;
        let t0 = Instant::now();
        let deadline = t0 + self.overall;
        let mut token = None;
        loop {
            // the server's CSM first: it may take more (or less) than the
            // 1152 bytes assumed before it
            if token.is_none() && self.c.peer_csm_received() {
                match self.c.request(method, options, payload) {
                    Ok(t) => token = Some(t),
                    Err(e) => {
                        eprintln!("mintgate: {dest}: {e}");
                        return Ok(Err(ExitCode::from(EXIT_OTHER)));
                    }
                }
            }
            if self.c.output().is_empty() {
                if let Some(at) = self
                    .got
                    .iter()
                    .position(|r| Some(&r.token) == token.as_ref())
                {
                    return Ok(Ok(self.got.swap_remove(at)));
                }
            } else {
                self.link
                    .send(self.c)
                    .with_context(|| format!("writing to {dest}"))?;
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return tcp_timed_out(dest, self.overall, "response", t0).map(Err);
            }
            match self.link.recv(self.c, left, &mut self.got) {
                Ok(true) => {}
                Ok(false) => {
                    eprintln!("mintgate: {dest} closed the connection");
                    return Ok(Err(ExitCode::from(EXIT_OTHER)));
                }
                Err(LinkError::Coap(e)) => {
                    eprintln!("mintgate: {dest}: {e}");
                    return Ok(Err(ExitCode::from(EXIT_OTHER)));
                }
                Err(LinkError::Timeout) => {
                    return tcp_timed_out(dest, self.overall, "response", t0).map(Err)
                }
                Err(LinkError::Io(e)) => {
                    return Err(e).with_context(|| format!("talking to {dest}"))
                }
            }
        }
    }

    /// Whether blocks are BERT blocks (RFC 8323 6): both CSMs offered them
    /// and the requests are not protected.
    fn bert(&self) -> bool {
        self.c.peer_block_wise() && self.oscore.is_none()
    }

    /// When `resp` is the first block of a block-wise answer, asks for the
    /// rest and appends it to its payload, checking that every block
    /// continues the body (its offset, its ETag); BERT blocks when both
    /// sides offered them.
    fn rest_of_body(
        &mut self,
        method: Code,
        options: &[(OptionNumber, Vec<u8>)],
        payload: &[u8],
        resp: &mut mintgate_coap::client::tcp::TcpResponse,
        messages: &mut usize,
    ) -> anyhow::Result<Result<(), ExitCode>> {
        let block2 = |r: &mintgate_coap::client::tcp::TcpResponse| {
            r.options
                .iter()
                .find(|(n, _)| *n == OptionNumber::BLOCK2)
                .and_then(|(_, v)| mintgate_coap::wire::decode_uint(v))
        };
        let etag = |r: &mintgate_coap::client::tcp::TcpResponse| {
            r.options
                .iter()
                .find(|(n, _)| *n == OptionNumber::ETAG)
                .map(|(_, v)| v.clone())
        };
        // bytes per NUM for a size exponent (7: BERT's 1024-byte units)
        let unit = |szx: u32| if szx == 7 { 1024 } else { 16usize << szx };
        let tag = etag(resp);
        let mut last = block2(resp);
        while let Some(v) = last.filter(|v| v & 8 != 0 && resp.code.class() == 2) {
            let offset = resp.payload.len();
            // BERT is the transport's: not inside OSCORE, whose inner
            // Block2 the server's router reads as RFC 7959 says
            let szx = if self.bert() { 7 } else { v & 7 };
            let dest = self.dest;
            let fail = |why: String| {
                eprintln!("mintgate: {dest}: {why}");
                Ok(Err(ExitCode::from(EXIT_OTHER)))
            };
            if !offset.is_multiple_of(unit(szx)) || offset > MAX_BLOCK_BODY {
                return fail(format!("a block-wise answer stopped at {offset} bytes"));
            }
            let mut opts: Vec<(OptionNumber, Vec<u8>)> = options
                .iter()
                .filter(|(n, _)| *n != OptionNumber::BLOCK2)
                .cloned()
                .collect();
            let mut b = [0u8; 4];
            let num = (offset / unit(szx)) as u32;
            opts.push((
                OptionNumber::BLOCK2,
                encode_uint((num << 4) | szx, &mut b).to_vec(),
            ));
            let next = match self.exchange(method, &opts, payload)? {
                Ok(r) => r,
                Err(code) => return Ok(Err(code)),
            };
            *messages += 1;
            let nv = block2(&next);
            let at = nv.map(|v| (v >> 4) as usize * unit(v & 7));
            if next.code != resp.code || at != Some(offset) {
                return fail(format!(
                    "block {num} came back as {} at {at:?}, not the body's next",
                    next.code
                ));
            }
            if etag(&next) != tag {
                return fail("the representation changed between blocks".into());
            }
            resp.payload.extend_from_slice(&next.payload);
            last = nv;
        }
        Ok(Ok(()))
    }
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

/// A block size: a power of two from 16 to 1024.
fn parse_block_size(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n.is_power_of_two() && (16..=1024).contains(&n) => Ok(n),
        _ => Err(format!(
            "block size '{s}' must be 16, 32, 64, 128, 256, 512 or 1024"
        )),
    }
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
        let bytes = match number.def() {
            Some(d) if d.format == OptionFormat::Uint && !value.is_empty() => {
                let cf = number == OptionNumber::CONTENT_FORMAT || number == OptionNumber::ACCEPT;
                let v = value.parse::<u32>().ok().or_else(|| {
                    cf.then(|| ContentFormat::parse(value).map(|f| u32::from(f.0)))
                        .flatten()
                });
                match v {
                    Some(v) => encode_uint(v, &mut [0; 4]).to_vec(),
                    None => {
                        return Err(format!(
                            "{} takes a decimal integer (0-4294967295){}, not '{value}' \
                             (0x-prefixed hex sends raw bytes)",
                            d.name,
                            if cf { " or a Content-Format name" } else { "" }
                        ))
                    }
                }
            }
            _ => value.as_bytes().to_vec(),
        };
        // a registered option's length (raw hex bytes are sent as given)
        if let Some(d) = number.def().filter(|d| !d.len_ok(bytes.len())) {
            return Err(format!(
                "{} takes {}-{} bytes, '{value}' is {}",
                d.name,
                d.min_len,
                d.max_len,
                bytes.len()
            ));
        }
        bytes
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
fn json_response<V: AsRef<[u8]>>(
    code: Code,
    ty: &str,
    options: &[(OptionNumber, V)],
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
        ty,
        rtt.as_secs_f64() * 1e3,
    );
    for (i, (n, v)) in options.iter().enumerate() {
        let v = v.as_ref();
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
    use mintgate_coap::wire::MessageType;

    #[test]
    fn parses_durations_options_and_formats() {
        assert_eq!(parse_positive_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(
            parse_positive_duration("500ms"),
            Ok(Duration::from_millis(500))
        );
        assert_eq!(
            parse_positive_duration("1.5"),
            Ok(Duration::from_millis(1500))
        );
        assert_eq!(parse_positive_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_positive_duration("0s").is_err());
        assert!(parse_positive_duration("5 parsecs").is_err());
        assert!(parse_positive_duration("").is_err());

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
        // a uint option takes a number (Accept also a format's name)
        assert_eq!(
            parse_option("Accept,json"),
            Ok(ExtraOption(OptionNumber::ACCEPT, vec![50]))
        );
        assert_eq!(
            parse_option("17,60"),
            Ok(ExtraOption(OptionNumber::ACCEPT, vec![60]))
        );
        for bad in ["Accept,jsn", "12,json2", "Max-Age,soon", "14,99999999999"] {
            let e = parse_option(bad).unwrap_err();
            assert!(e.contains("decimal integer"), "{bad}: {e}");
        }
        // a registered option's length: Uri-Host is 1-255 bytes, If-None-Match empty
        assert!(parse_option("Uri-Host,")
            .unwrap_err()
            .contains("1-255 bytes"));
        assert!(parse_option("5,x").is_err());
        // raw hex is sent as given
        assert!(parse_option("5,0x01").is_ok());
        assert_eq!(parse_content_format("json"), Ok(ContentFormat::JSON));
        assert!(parse_content_format("text/html").is_err());
        assert_eq!(parse_block_size("64"), Ok(64));
        assert!(parse_block_size("100").is_err());
        assert!(parse_block_size("2048").is_err());
        assert!(parse_block_size("8").is_err());
    }

    #[test]
    fn json_output_is_escaped() {
        let j = json_response(
            Code::CONTENT,
            MessageType::Ack.name(),
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
        let bin = json_response::<Vec<u8>>(
            Code::CONTENT,
            MessageType::Non.name(),
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
