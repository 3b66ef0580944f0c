//! `mintgate lab dtls`: what coaps costs on this machine, measured in one
//! run against one in-process gateway that has a plain CoAP and a coaps
//! listener on loopback:
//!
//! 1. the handshake rate: full DTLS 1.2 handshakes per second (cookie
//!    exchange included), with a pre-shared key and with certificates
//!    (ECDHE-ECDSA P-256, a throwaway CA), each client closing its session;
//! 2. the throughput over established sessions vs plain CoAP: the same
//!    closed-loop clients (N sessions, each keeping W confirmable GETs of
//!    `/request` in flight) over each listener in turn.
//!
//! Every loop is bounded by its duration and a request cap.
//!
//! Writes `dtls.csv` (`measurement,mode,rate_per_s,lost,p50_ms,detail`)
//! and a table; the target (issue 9) is coaps throughput at least 50 % of
//! plain CoAP's. There is no paper figure: coaps is not in the papers.

use std::fmt::Write as _;
use std::net::{SocketAddr, UdpSocket};
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
}

impl Default for DtlsOptions {
    fn default() -> Self {
        DtlsOptions {
            duration: None,
            handshake_clients: 2,
            sessions: 8,
            window: 16,
            threads: 1,
        }
    }
}

/// The least coaps/coap throughput ratio, in percent (issue 9).
pub const RATIO_TARGET: f64 = 50.0;

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

    let ratio = if coap.rate > 0.0 {
        coaps.rate / coap.rate * 100.0
    } else {
        0.0
    };
    let met = ratio >= RATIO_TARGET;

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
        if met { "met" } else { "NOT met" }
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
    Ok(Summary {
        lab: "dtls",
        table: t,
        files: vec![csv_path],
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
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let threads: Vec<_> = links
        .into_iter()
        .map(|mut link| {
            let (stop, done) = (stop.clone(), done.clone());
            std::thread::spawn(move || -> anyhow::Result<(u64, Vec<u32>)> {
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
                Ok((lost, rtts_us))
            })
        })
        .collect();
    std::thread::sleep(dur);
    let n = done.load(Relaxed);
    let secs = t0.elapsed().as_secs_f64();
    stop.store(true, Relaxed);
    let mut lost = 0;
    let mut rtts = Vec::new();
    for t in threads {
        let (l, r) = t
            .join()
            .map_err(|_| anyhow::anyhow!("a client thread panicked"))??;
        lost += l;
        rtts.extend(r);
    }
    rtts.sort_unstable();
    let p50_ms = rtts.get(rtts.len() / 2).map_or(0.0, |v| *v as f64 / 1000.0);
    Ok(Rate {
        rate: n as f64 / secs,
        lost,
        p50_ms,
    })
}
