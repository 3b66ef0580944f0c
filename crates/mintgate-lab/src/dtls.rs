//! `mintgate lab dtls`: what coaps costs on this machine, measured in one
//! run against one in-process gateway that has a plain CoAP and a coaps
//! listener on loopback:
//!
//! 1. the handshake rate: full DTLS 1.2 handshakes per second (cookie
//!    exchange included), with a pre-shared key and with certificates
//!    (ECDHE-ECDSA P-256, a throwaway CA), each client closing its session;
//! 2. the throughput over established sessions vs plain CoAP: the same
//!    closed-loop clients (N sessions, each keeping W confirmable GETs of
//!    `/request` in flight) over each listener in turn;
//! 3. a ClientHello flood (the denial-of-service case of RFC 6347's
//!    stateless cookie exchange): a gateway in its own process (so
//!    that its resident memory is its own), N established coaps sessions
//!    measured without and then under a flood of cookieless ClientHellos
//!    from many loopback source addresses (127.6.x.y, one socket each),
//!    while a real PSK client (libcoap's `coap-client-openssl`, else
//!    mintgate's own) opens a session and makes one request at a time.
//!    Target: every such request answered, the sessions' throughput down by
//!    less than 20 %, the gateway's VmRSS under 64 MiB, at 10,000 hellos
//!    per second or the most the generator reaches here (printed).
//!
//! Every loop is bounded by its duration and a request cap.
//!
//! Writes `dtls.csv` (`measurement,mode,rate_per_s,lost,p50_ms,detail`),
//! `dtls_flood.csv` (`figure,value,unit,detail`) and a table; the targets
//! are the product's own: coaps throughput at least 50 % of plain CoAP's,
//! and the flood's above. There is no paper figure: coaps is not in the
//! papers.

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use mintgate_coap::wire::{Code, MessageType, MessageWriter, OptionNumber, Packet};
use mintgate_dtls::{ClientContext, ClientSettings, DtlsClient, Psk};
use mintgate_gateway::config::PoolMode;
use mintgate_gateway::{resources, Config, Gateway};

use crate::{LabOptions, Summary};

/// Settings of the DTLS lab beyond [`LabOptions`].
#[derive(Clone, Debug)]
pub struct DtlsOptions {
    /// Length of each of the four measurements (handshakes PSK, handshakes
    /// certificate, plain throughput, coaps throughput); default 3 s,
    /// `--quick` 1.5 s.
    pub duration: Option<Duration>,
    /// Client threads opening sessions in the handshake measurements.
    pub handshake_clients: u32,
    /// Client sessions (one thread each) in the throughput measurements.
    pub sessions: u32,
    /// Requests each session keeps in flight.
    pub window: u32,
    /// Handler threads of the gateway (a fixed pool, the same for both).
    pub threads: usize,
    /// ClientHellos per second the flood generator aims at; 0 = no flood
    /// measurement.
    pub flood_rate: u32,
    /// Source addresses of the flood (one socket each).
    pub flood_sources: u32,
    /// Requests the real client makes during the flood, one session each.
    pub flood_requests: u32,
    /// The mintgate executable, to run the gateway of the flood
    /// measurement in its own process; without it there is none.
    pub exe: Option<PathBuf>,
}

impl Default for DtlsOptions {
    fn default() -> Self {
        DtlsOptions {
            duration: None,
            handshake_clients: 2,
            sessions: 8,
            window: 16,
            threads: 1,
            flood_rate: 10_000,
            flood_sources: 2048,
            flood_requests: 10,
            exe: None,
        }
    }
}

/// The least coaps/coap throughput ratio, in percent (the product's own
/// target; no paper measures coaps).
pub const RATIO_TARGET: f64 = 50.0;
/// Largest fall of the established sessions' throughput under the flood,
/// in percent (the product's own target).
pub const FLOOD_DROP_TARGET: f64 = 20.0;
/// Largest resident memory of the gateway under the flood, MiB.
pub const FLOOD_RSS_TARGET_MIB: f64 = 64.0;
/// Flood rate the target asks for, hellos per second.
pub const FLOOD_RATE_TARGET: f64 = 10_000.0;

const ID: &str = "lab";
const KEY: &[u8] = b"lab-pre-shared-key";
/// Upper bound of requests per measurement, whatever the duration.
const MAX_REQUESTS: u64 = 20_000_000;
/// Upper bound of handshakes per measurement.
const MAX_HANDSHAKES: u64 = 1_000_000;

/// Runs the lab: writes `dtls.csv` into `opts.out` and returns the table.
pub fn lab_dtls(opts: &LabOptions, d: &DtlsOptions) -> anyhow::Result<Summary> {
    let dur = d
        .duration
        .unwrap_or(Duration::from_millis(if opts.quick { 1500 } else { 3000 }));
    if !(Duration::from_millis(200)..=Duration::from_secs(600)).contains(&dur) {
        anyhow::bail!("the duration of each measurement must be within 0.2 s..=600 s");
    }
    crate::create_out(&opts.out)?;
    let progress = &opts.progress;
    let threads = d.threads.max(1);
    let dir = std::env::temp_dir().join(format!("mintgate-lab-dtls-{}", std::process::id()));
    let pki = mintgate_dtls::pki::generate(&dir, "lab-client").context("making a test PKI")?;
    let mut cfg = Config::default();
    cfg.coap.bind = vec!["127.0.0.1:0".parse()?];
    cfg.coaps.bind = vec!["127.0.0.1:0".parse()?];
    cfg.coaps.psk_identity = Some(ID.into());
    cfg.coaps.psk_key = Some(String::from_utf8_lossy(KEY).into_owned());
    cfg.coaps.cert = Some(pki.server_cert.clone());
    cfg.coaps.key = Some(pki.server_key.clone());
    cfg.coaps.max_sessions = 4096;
    cfg.pipeline.pool = PoolMode::Fixed(threads);
    cfg.devices.list.clear();
    let gw =
        Gateway::start(cfg.clone(), resources::router_for(&cfg)).context("starting the gateway")?;
    let plain = gw.local_addrs()[0];
    let secure = gw.coaps_addrs()[0];
    progress(&format!(
        "lab dtls: gateway with coap on {plain} and coaps on {secure}, {threads} handler thread(s), {:.1} s per measurement",
        dur.as_secs_f64()
    ));

    let psk_ctx = ClientContext::new(ClientSettings {
        psk: Some(Psk::new(ID, KEY.to_vec())?),
        ..ClientSettings::default()
    })?;
    let cert_ctx = ClientContext::new(ClientSettings {
        certs: mintgate_dtls::CertFiles {
            ca: Some(pki.ca.clone()),
            ..Default::default()
        },
        server_name: Some("127.0.0.1".into()),
        ..ClientSettings::default()
    })?;
    progress("lab dtls: handshakes (PSK)...");
    let (hs_psk, psk_cipher) = handshakes(&psk_ctx, secure, d.handshake_clients, dur)?;
    progress("lab dtls: handshakes (certificate)...");
    let (hs_cert, cert_cipher) = handshakes(&cert_ctx, secure, d.handshake_clients, dur)?;

    progress("lab dtls: throughput over plain CoAP...");
    let coap = throughput(None, plain, d.sessions, d.window, dur)?;
    progress("lab dtls: throughput over coaps (PSK sessions)...");
    let coaps = throughput(Some(&psk_ctx), secure, d.sessions, d.window, dur)?;
    let st = gw.dtls_servers()[0].stats().clone();
    gw.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
    let flood = match (&d.exe, d.flood_rate) {
        (Some(exe), rate) if rate > 0 => {
            progress("lab dtls: ClientHello flood...");
            Some(flood(opts, d, exe, &psk_ctx, dur)?)
        }
        _ => None,
    };

    let ratio = if coap.rate > 0.0 {
        coaps.rate / coap.rate * 100.0
    } else {
        0.0
    };
    let met = ratio >= RATIO_TARGET && flood.as_ref().is_none_or(Flood::met);

    let mut csv = String::from("measurement,mode,rate_per_s,lost,p50_ms,detail\n");
    let _ = writeln!(csv, "handshake,psk,{hs_psk:.1},,,{psk_cipher}");
    let _ = writeln!(csv, "handshake,certificate,{hs_cert:.1},,,{cert_cipher}");
    for (name, r) in [("coap", &coap), ("coaps", &coaps)] {
        let _ = writeln!(
            csv,
            "throughput,{name},{:.1},{},{:.3},{} sessions x {} in flight",
            r.rate, r.lost, r.p50_ms, d.sessions, d.window
        );
    }
    let csv_path = opts.out.join("dtls.csv");
    crate::write_file(&csv_path, &csv)?;
    let mut files = vec![csv_path];
    if let Some(f) = &flood {
        let mut c = String::from("figure,value,unit,detail\n");
        let rows: [(&str, f64, &str, String); 12] = [
            ("hello_rate", f.hellos_per_s, "per_s", format!("cookieless ClientHellos from {} loopback sources, {} in all", f.sources, f.hellos)),
            ("throughput_before", f.before.rate, "per_s", format!("{} established PSK sessions x {} CON GETs, p50 {:.3} ms, {} lost", d.sessions, d.window, f.before.p50_ms, f.before.lost)),
            ("throughput_during", f.during.rate, "per_s", format!("the same sessions under the flood, p50 {:.3} ms, {} lost", f.during.p50_ms, f.during.lost)),
            ("throughput_drop", f.drop_pct(), "percent", format!("target < {FLOOD_DROP_TARGET:.0}")),
            ("real_client_answered", f64::from(f.answered), "requests", format!("of {} by {}, one new session each", f.requests, f.client)),
            ("real_client_p50", f.request_p50_ms, "ms", "handshake and request".into()),
            ("real_client_max", f.request_max_ms, "ms", "handshake and request".into()),
            ("rss_idle", f.rss_idle_mib, "MiB", "gateway VmRSS before the flood".into()),
            ("rss_max", f.rss_max_mib, "MiB", format!("gateway VmRSS, most sampled during the flood, target < {FLOOD_RSS_TARGET_MIB:.0}")),
            ("hello_verify_requests", f.hello_verify_requests, "count", "mintgate_coaps_hello_verify_requests_total".into()),
            ("handshakes", f.handshakes, "count", "mintgate_coaps_handshakes_total".into()),
            ("evicted_or_refused", f.evicted + f.refused, "count", "mintgate_coaps_sessions_evicted_total + handshakes_refused_total".into()),
        ];
        for (name, v, unit, detail) in rows {
            let _ = writeln!(c, "{name},{v:.3},{unit},\"{detail}\"");
        }
        let p = opts.out.join("dtls_flood.csv");
        crate::write_file(&p, &c)?;
        files.push(p);
    }

    let mut t = String::new();
    let _ = writeln!(
        t,
        "DTLS 1.2 handshakes ({} client threads, new session each, cookie exchange included):",
        d.handshake_clients
    );
    let _ = writeln!(
        t,
        "  {:<12} {:<26} {:>12}",
        "mode", "cipher suite", "handshakes/s"
    );
    let _ = writeln!(t, "  {:<12} {:<26} {:>12.0}", "psk", psk_cipher, hs_psk);
    let _ = writeln!(
        t,
        "  {:<12} {:<26} {:>12.0}",
        "certificate", cert_cipher, hs_cert
    );
    let _ = writeln!(
        t,
        "throughput ({} sessions x {} CON GET /request in flight, {:.1} s each):",
        d.sessions,
        d.window,
        dur.as_secs_f64()
    );
    let _ = writeln!(
        t,
        "  {:<12} {:>12} {:>10} {:>10}",
        "transport", "requests/s", "lost", "p50 ms"
    );
    for (name, r) in [("coap", &coap), ("coaps", &coaps)] {
        let _ = writeln!(
            t,
            "  {:<12} {:>12.0} {:>10} {:>10.3}",
            name, r.rate, r.lost, r.p50_ms
        );
    }
    let _ = writeln!(
        t,
        "coaps/coap throughput: {ratio:.0} % (target >= {RATIO_TARGET:.0} %: {})",
        if ratio >= RATIO_TARGET {
            "met"
        } else {
            "NOT met"
        }
    );
    let _ = writeln!(
        t,
        "server counters: {} handshakes, {} failed, {} evicted, {} dropped records, {} decrypted, {} encrypted",
        st.handshakes.load(Relaxed),
        st.handshake_failures.load(Relaxed) + st.handshake_timeouts.load(Relaxed),
        st.evicted.load(Relaxed),
        st.dropped_records.load(Relaxed),
        st.decrypted.load(Relaxed),
        st.encrypted.load(Relaxed)
    );
    match &flood {
        Some(f) => {
            let _ = writeln!(
                t,
                "ClientHello flood ({} loopback sources, cookieless hellos; gateway in its own process):",
                f.sources
            );
            // within 1 % of the rate asked: the pacing's rounding, not a
            // limit of the generator
            let reached_asked = f.hellos_per_s >= 0.99 * f.asked_per_s;
            let rate_note = match (reached_asked, f.hellos_per_s >= 0.99 * FLOOD_RATE_TARGET) {
                (true, true) => String::new(),
                (true, false) => format!(" (below the target's {FLOOD_RATE_TARGET:.0})"),
                (false, _) => format!(
                    " (asked {:.0}: the most the generator reached here; the target asks {FLOOD_RATE_TARGET:.0})",
                    f.asked_per_s
                ),
            };
            let _ = writeln!(
                t,
                "  flood rate           {:>10.0} hellos/s{rate_note}",
                f.hellos_per_s
            );
            let _ = writeln!(
                t,
                "  sessions alone       {:>10.0} requests/s (p50 {:.3} ms)",
                f.before.rate, f.before.p50_ms
            );
            let _ = writeln!(
                t,
                "  sessions under flood {:>10.0} requests/s (p50 {:.3} ms): {:+.1} % (target: a fall of less than {FLOOD_DROP_TARGET:.0} %)",
                f.during.rate,
                f.during.p50_ms,
                -f.drop_pct()
            );
            let _ = writeln!(
                t,
                "  real client          {:>10} of {} requests answered, new session each ({}), p50 {:.0} ms, max {:.0} ms",
                f.answered, f.requests, f.client, f.request_p50_ms, f.request_max_ms
            );
            let _ = writeln!(
                t,
                "  gateway VmRSS        {:>10.1} MiB at most during the flood ({:.1} before; target < {FLOOD_RSS_TARGET_MIB:.0} MiB)",
                f.rss_max_mib, f.rss_idle_mib
            );
            let _ = writeln!(
                t,
                "  gateway counters: {:.0} HelloVerifyRequests, {:.0} handshakes, {:.0} sessions held, {:.0} evicted, {:.0} refused",
                f.hello_verify_requests, f.handshakes, f.sessions, f.evicted, f.refused
            );
            let _ = writeln!(
                t,
                "flood target: {}",
                if f.met() { "met" } else { "NOT met" }
            );
        }
        None => {
            let _ = writeln!(t, "ClientHello flood: not measured (--flood-rate 0)");
        }
    }
    Ok(Summary {
        lab: "dtls",
        table: t,
        files,
        target_met: Some(met),
    })
}

/// Full handshakes per second from `clients` threads; and the suite used.
fn handshakes(
    ctx: &ClientContext,
    server: SocketAddr,
    clients: u32,
    dur: Duration,
) -> anyhow::Result<(f64, String)> {
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let cipher: Arc<std::sync::OnceLock<String>> = Arc::default();
    let t0 = Instant::now();
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let (ctx, stop, count, cipher) =
                (ctx.clone(), stop.clone(), count.clone(), cipher.clone());
            std::thread::spawn(move || -> anyhow::Result<()> {
                while !stop.load(Relaxed) && count.load(Relaxed) < MAX_HANDSHAKES {
                    let s = UdpSocket::bind("127.0.0.1:0")?;
                    s.connect(server)?;
                    let c = ctx.connect(s, Instant::now() + Duration::from_secs(5))?;
                    if let Some(name) = c.cipher() {
                        let _ = cipher.set(name.to_string());
                    }
                    c.close();
                    count.fetch_add(1, Relaxed);
                }
                Ok(())
            })
        })
        .collect();
    std::thread::sleep(dur);
    stop.store(true, Relaxed);
    for t in threads {
        t.join()
            .map_err(|_| anyhow::anyhow!("a handshake thread panicked"))??;
    }
    let secs = t0.elapsed().as_secs_f64();
    Ok((
        count.load(Relaxed) as f64 / secs,
        cipher.get().cloned().unwrap_or_else(|| "?".into()),
    ))
}

/// One client's way to the server: plain UDP or a DTLS session.
enum Link {
    Plain(UdpSocket),
    Dtls(Box<DtlsClient>),
}

impl Link {
    fn send(&mut self, b: &[u8]) -> anyhow::Result<()> {
        match self {
            Link::Plain(s) => {
                s.send(b)?;
            }
            Link::Dtls(c) => c.send(b)?,
        }
        Ok(())
    }

    fn recv(&mut self, out: &mut [u8], t: Duration) -> anyhow::Result<Option<usize>> {
        match self {
            Link::Plain(s) => {
                s.set_read_timeout(Some(t))?;
                match s.recv(out) {
                    Ok(n) => Ok(Some(n)),
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) =>
                    {
                        Ok(None)
                    }
                    Err(e) => Err(e.into()),
                }
            }
            Link::Dtls(c) => Ok(c.recv(out, t)?),
        }
    }
}

struct Rate {
    rate: f64,
    lost: u64,
    p50_ms: f64,
}

/// Closed loop: `sessions` threads, each with `window` CON GETs in flight.
fn throughput(
    ctx: Option<&ClientContext>,
    server: SocketAddr,
    sessions: u32,
    window: u32,
    dur: Duration,
) -> anyhow::Result<Rate> {
    // every session is set up before the clock starts
    let links = connect_links(ctx, server, sessions)?;
    Ok(run_links(links, window, dur)?.0)
}

/// `sessions` links to `server`, over DTLS with `ctx`.
fn connect_links(
    ctx: Option<&ClientContext>,
    server: SocketAddr,
    sessions: u32,
) -> anyhow::Result<Vec<Link>> {
    let mut links = Vec::new();
    for _ in 0..sessions {
        let s = UdpSocket::bind("127.0.0.1:0")?;
        s.connect(server)?;
        links.push(match ctx {
            Some(c) => Link::Dtls(Box::new(
                c.connect(s, Instant::now() + Duration::from_secs(5))?,
            )),
            None => Link::Plain(s),
        });
    }
    Ok(links)
}

/// One thread per link, each with `window` CON GETs in flight, for `dur`;
/// gives the links back for another run.
fn run_links(links: Vec<Link>, window: u32, dur: Duration) -> anyhow::Result<(Rate, Vec<Link>)> {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let threads: Vec<_> = links
        .into_iter()
        .map(|mut link| {
            let (stop, done) = (stop.clone(), done.clone());
            std::thread::spawn(move || -> anyhow::Result<(u64, Vec<u32>, Link)> {
                let mut mid: u16 = 0;
                let mut sent_at = vec![Instant::now(); 65536];
                let mut buf = [0u8; 64];
                let mut out = [0u8; 1500];
                let mut lost = 0u64;
                let mut rtts_us: Vec<u32> = Vec::new();
                let mut send = |link: &mut Link,
                                mid: &mut u16,
                                sent_at: &mut [Instant]|
                 -> anyhow::Result<()> {
                    *mid = mid.wrapping_add(1);
                    let mut w = MessageWriter::new(
                        &mut buf,
                        MessageType::Con,
                        Code::GET,
                        *mid,
                        &mid.to_be_bytes(),
                    )
                    .map_err(|e| anyhow::anyhow!("{e:?}"))?;
                    w.path_options(OptionNumber::URI_PATH, "request")
                        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
                    let n = w.finish();
                    sent_at[*mid as usize] = Instant::now();
                    link.send(&buf[..n])
                };
                for _ in 0..window {
                    send(&mut link, &mut mid, &mut sent_at)?;
                }
                while !stop.load(Relaxed) && done.load(Relaxed) < MAX_REQUESTS {
                    match link.recv(&mut out, Duration::from_millis(200))? {
                        Some(n) => {
                            if let Ok(p) = Packet::new_checked(&out[..n]) {
                                let m = p.message_id() as usize;
                                if rtts_us.len() < 200_000 {
                                    rtts_us.push(sent_at[m].elapsed().as_micros() as u32);
                                }
                            }
                            done.fetch_add(1, Relaxed);
                        }
                        // an answer lost: put the window back to full
                        None => {
                            lost += 1;
                        }
                    }
                    send(&mut link, &mut mid, &mut sent_at)?;
                }
                // let the answers still on their way arrive (and be dropped)
                for _ in 0..window * 2 {
                    if link.recv(&mut out, Duration::from_millis(50))?.is_none() {
                        break;
                    }
                }
                Ok((lost, rtts_us, link))
            })
        })
        .collect();
    std::thread::sleep(dur);
    let n = done.load(Relaxed);
    let secs = t0.elapsed().as_secs_f64();
    stop.store(true, Relaxed);
    let mut lost = 0;
    let mut rtts = Vec::new();
    let mut links = Vec::new();
    for t in threads {
        let (l, r, link) = t
            .join()
            .map_err(|_| anyhow::anyhow!("a client thread panicked"))??;
        lost += l;
        rtts.extend(r);
        links.push(link);
    }
    rtts.sort_unstable();
    let p50_ms = rtts.get(rtts.len() / 2).map_or(0.0, |v| *v as f64 / 1000.0);
    Ok((
        Rate {
            rate: n as f64 / secs,
            lost,
            p50_ms,
        },
        links,
    ))
}

/// What the flood measurement found.
struct Flood {
    /// The rate asked for, and the rate the generator reached.
    asked_per_s: f64,
    hellos_per_s: f64,
    hellos: u64,
    sources: usize,
    before: Rate,
    during: Rate,
    client: &'static str,
    requests: u32,
    answered: u32,
    request_p50_ms: f64,
    request_max_ms: f64,
    rss_idle_mib: f64,
    rss_max_mib: f64,
    /// From the gateway's metrics after the flood.
    hello_verify_requests: f64,
    handshakes: f64,
    sessions: f64,
    evicted: f64,
    refused: f64,
}

impl Flood {
    fn drop_pct(&self) -> f64 {
        if self.before.rate > 0.0 {
            (1.0 - self.during.rate / self.before.rate) * 100.0
        } else {
            100.0
        }
    }

    fn met(&self) -> bool {
        self.answered == self.requests
            && self.drop_pct() < FLOOD_DROP_TARGET
            && self.rss_max_mib < FLOOD_RSS_TARGET_MIB
    }
}

/// Sends cookieless ClientHellos from `sources` loopback addresses at
/// `rate` per second until `stop`; returns (hellos sent, sources bound).
fn flood_hellos(
    server: SocketAddr,
    sources: u32,
    rate: u32,
    stop: &AtomicBool,
    sent: &AtomicU64,
) -> usize {
    use mintgate_dtls::hello::{write_client_hello, HelloFields};
    let socks: Vec<UdpSocket> = (0..sources)
        .filter_map(|i| {
            let a = Ipv4Addr::new(127, 6 + (i >> 16) as u8, (i >> 8) as u8, i as u8);
            let s = UdpSocket::bind((a, 0)).ok()?;
            // the answers are not read: a small buffer, dropped when full
            let _ = socket2::SockRef::from(&s).set_recv_buffer_size(4096);
            Some(s)
        })
        .collect();
    if socks.is_empty() {
        return 0;
    }
    let mut hello = write_client_hello(&HelloFields::default());
    let t0 = Instant::now();
    let mut n: u64 = 0;
    let mut i = 0usize;
    while !stop.load(Relaxed) && n < MAX_HELLOS {
        // what is due by now, in bursts of at most 64
        let due = (t0.elapsed().as_secs_f64() * f64::from(rate)) as u64;
        if n >= due {
            std::thread::sleep(Duration::from_micros(500));
            continue;
        }
        for _ in 0..(due - n).min(64) {
            // a fresh random and record sequence number each time
            hello[27..35].copy_from_slice(&n.to_be_bytes());
            hello[5..11].copy_from_slice(&n.to_be_bytes()[2..]);
            let _ = socks[i].send_to(&hello, server);
            i = (i + 1) % socks.len();
            n += 1;
        }
        sent.store(n, Relaxed);
    }
    socks.len()
}

/// Upper bound of hellos the flood sends, whatever the duration.
const MAX_HELLOS: u64 = 50_000_000;

/// One request over a new session with the real client; its time when
/// answered.
fn real_request(server: SocketAddr, libcoap: bool, ctx: &ClientContext) -> Option<Duration> {
    let t = Instant::now();
    if libcoap {
        let o = Command::new("coap-client-openssl")
            .args(["-B", "10", "-u", ID, "-k"])
            .arg(String::from_utf8_lossy(KEY).as_ref())
            .args(["-m", "get"])
            .arg(format!("coaps://{server}/request"))
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .ok()?;
        return (String::from_utf8_lossy(&o.stdout).trim() == "hello world").then(|| t.elapsed());
    }
    let s = UdpSocket::bind("127.0.0.1:0").ok()?;
    s.connect(server).ok()?;
    let mut c = ctx
        .connect(s, Instant::now() + Duration::from_secs(10))
        .ok()?;
    let mut buf = [0u8; 64];
    let mut w = MessageWriter::new(&mut buf, MessageType::Con, Code::GET, 1, &[1]).ok()?;
    w.path_options(OptionNumber::URI_PATH, "request").ok()?;
    let n = w.finish();
    let mut out = [0u8; 1500];
    for _ in 0..4 {
        c.send(&buf[..n]).ok()?;
        if let Some(k) = c.recv(&mut out, Duration::from_secs(2)).ok()? {
            let ok = Packet::new_checked(&out[..k]).is_ok_and(|p| p.payload() == b"hello world");
            c.close();
            return ok.then(|| t.elapsed());
        }
    }
    None
}

fn have_on_path(exe: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(exe).is_file()))
}

/// The flood measurement (see the module documentation).
fn flood(
    opts: &LabOptions,
    d: &DtlsOptions,
    exe: &std::path::Path,
    psk_ctx: &ClientContext,
    dur: Duration,
) -> anyhow::Result<Flood> {
    use crate::footprint::{
        free_tcp_port, free_udp_port, metric_sum, mib, proc_mem, wait_answering, Proc,
    };
    let progress = &opts.progress;
    let plain: SocketAddr = format!("127.0.0.1:{}", free_udp_port()?).parse()?;
    let secure: SocketAddr = format!("127.0.0.1:{}", free_udp_port()?).parse()?;
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_tcp_port()?).parse()?;
    let mut cfg = Config::default();
    cfg.coap.bind = vec![plain];
    cfg.coaps.bind = vec![secure];
    cfg.coaps.psk_identity = Some(ID.into());
    cfg.coaps.max_sessions = 4096;
    cfg.pipeline.pool = PoolMode::Fixed(d.threads.max(1));
    cfg.devices.list.clear();
    cfg.metrics.bind = Some(metrics);
    let conf = opts.out.join("dtls_flood_gateway.toml");
    crate::write_file(&conf, &cfg.to_toml())?;
    let log = opts.out.join("dtls_flood_gateway.log");
    let child = Command::new(exe)
        .args(["--log", "warn", "serve", "--config"])
        .arg(&conf)
        // the key in the environment, not on the command line
        .env("MINTGATE_PSK_KEY", String::from_utf8_lossy(KEY).as_ref())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?)
        .spawn()
        .with_context(|| format!("starting {} serve", exe.display()))?;
    let gw = Proc(child);
    let pid = gw.0.id();
    wait_answering(plain, Duration::from_secs(15))?;
    let links = connect_links(Some(psk_ctx), secure, d.sessions)?;
    std::thread::sleep(Duration::from_millis(300));
    let rss_idle = proc_mem(pid)?.rss;
    progress(&format!(
        "lab dtls: flood: gateway pid {pid}, VmRSS {:.1} MiB with {} sessions; sessions alone...",
        mib(rss_idle),
        d.sessions
    ));
    let (before, links) = run_links(links, d.window, dur)?;

    let libcoap = have_on_path("coap-client-openssl");
    let client = if libcoap {
        "coap-client-openssl"
    } else {
        "mintgate (coap-client-openssl not found)"
    };
    progress(&format!(
        "lab dtls: flood: {} hellos/s from {} sources, {} requests by {client}...",
        d.flood_rate, d.flood_sources, d.flood_requests
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let generator = {
        let (stop, sent) = (stop.clone(), sent.clone());
        let (sources, rate) = (d.flood_sources, d.flood_rate);
        std::thread::spawn(move || flood_hellos(secure, sources, rate, &stop, &sent))
    };
    let sampler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut max = 0u64;
            while !stop.load(Relaxed) {
                if let Ok(m) = proc_mem(pid) {
                    max = max.max(m.rss);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            max
        })
    };
    // the flood gets going before anything is measured
    std::thread::sleep(Duration::from_millis(500));
    let f0 = (Instant::now(), sent.load(Relaxed));
    let requests = d.flood_requests;
    let real = {
        let ctx = psk_ctx.clone();
        std::thread::spawn(move || {
            (0..requests)
                .map(|_| real_request(secure, libcoap, &ctx))
                .collect::<Vec<_>>()
        })
    };
    let (during, _links) = run_links(links, d.window, dur)?;
    let times = real
        .join()
        .map_err(|_| anyhow::anyhow!("the real client's thread panicked"))?;
    let f1 = (Instant::now(), sent.load(Relaxed));
    stop.store(true, Relaxed);
    let sources = generator
        .join()
        .map_err(|_| anyhow::anyhow!("the flood generator panicked"))?;
    let rss_max = sampler
        .join()
        .map_err(|_| anyhow::anyhow!("the memory sampler panicked"))?;
    let hellos_per_s = (f1.1 - f0.1) as f64 / f1.0.duration_since(f0.0).as_secs_f64();
    let mut ok: Vec<f64> = times
        .iter()
        .flatten()
        .map(|t| t.as_secs_f64() * 1000.0)
        .collect();
    ok.sort_by(f64::total_cmp);
    std::thread::sleep(Duration::from_millis(200));
    let m = |name: &str| metric_sum(metrics, name).ok().flatten().unwrap_or(f64::NAN);
    let f = Flood {
        asked_per_s: f64::from(d.flood_rate),
        hellos_per_s,
        hellos: f1.1,
        sources,
        before,
        during,
        client,
        requests,
        answered: ok.len() as u32,
        request_p50_ms: ok.get(ok.len() / 2).copied().unwrap_or(f64::NAN),
        request_max_ms: ok.last().copied().unwrap_or(f64::NAN),
        rss_idle_mib: mib(rss_idle),
        rss_max_mib: mib(rss_max),
        hello_verify_requests: m("mintgate_coaps_hello_verify_requests_total"),
        handshakes: m("mintgate_coaps_handshakes_total"),
        sessions: m("mintgate_coaps_sessions"),
        evicted: m("mintgate_coaps_sessions_evicted_total"),
        refused: m("mintgate_coaps_handshakes_refused_total"),
    };
    let mut gw = gw;
    gw.terminate(Duration::from_secs(5));
    Ok(f)
}
