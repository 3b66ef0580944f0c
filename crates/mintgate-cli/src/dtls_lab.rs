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

use std::net::{SocketAddr, UdpSocket};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use mintgate_coap::wire::{Code, MessageType, MessageWriter, OptionNumber, Packet};
use mintgate_dtls::{ClientContext, ClientSettings, DtlsClient, Psk};
use mintgate_gateway::config::PoolMode;
use mintgate_gateway::{resources, Config, Gateway};

/// Options of the DTLS lab.
#[derive(clap::Args, Clone, Debug)]
pub struct DtlsLabArgs {
    /// Seconds of each measurement (handshakes PSK, handshakes
    /// certificate, plain throughput, coaps throughput).
    #[arg(long, default_value_t = 3.0, value_name = "SECS")]
    secs: f64,
    /// Client threads opening sessions in the handshake measurements.
    #[arg(long, default_value_t = 2, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    handshake_clients: u32,
    /// Client sessions (one thread each) in the throughput measurements.
    #[arg(long, default_value_t = 8, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=256))]
    sessions: u32,
    /// Requests each session keeps in flight.
    #[arg(long, default_value_t = 16, value_name = "W", value_parser = clap::value_parser!(u32).range(1..=256))]
    window: u32,
    /// Handler threads of the gateway (a fixed pool, the same for both).
    #[arg(long, default_value_t = 1, value_name = "N")]
    threads: usize,
}

const ID: &str = "lab";
const KEY: &[u8] = b"lab-pre-shared-key";
/// Upper bound of requests per measurement, whatever the duration.
const MAX_REQUESTS: u64 = 20_000_000;
/// Upper bound of handshakes per measurement.
const MAX_HANDSHAKES: u64 = 1_000_000;

/// Runs the lab and prints its figures.
pub fn run(a: DtlsLabArgs) -> anyhow::Result<ExitCode> {
    if !(0.2..=600.0).contains(&a.secs) {
        anyhow::bail!("--secs must be within 0.2..=600");
    }
    let dur = Duration::from_secs_f64(a.secs);
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
    cfg.pipeline.pool = PoolMode::Fixed(a.threads.max(1));
    cfg.devices.list.clear();
    let gw =
        Gateway::start(cfg.clone(), resources::router_for(&cfg)).context("starting the gateway")?;
    let plain = gw.local_addrs()[0];
    let secure = gw.coaps_addrs()[0];
    eprintln!(
        "lab dtls: gateway with coap on {plain} and coaps on {secure}, {} handler thread(s), {:.1} s per measurement",
        a.threads.max(1),
        a.secs
    );

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
    eprintln!("lab dtls: handshakes (PSK)...");
    let (hs_psk, psk_cipher) = handshakes(&psk_ctx, secure, a.handshake_clients, dur)?;
    eprintln!("lab dtls: handshakes (certificate)...");
    let (hs_cert, cert_cipher) = handshakes(&cert_ctx, secure, a.handshake_clients, dur)?;

    eprintln!("lab dtls: throughput over plain CoAP...");
    let coap = throughput(None, plain, a.sessions, a.window, dur)?;
    eprintln!("lab dtls: throughput over coaps (PSK sessions)...");
    let coaps = throughput(Some(&psk_ctx), secure, a.sessions, a.window, dur)?;
    let st = gw.dtls_servers()[0].stats().clone();
    gw.shutdown();
    let _ = std::fs::remove_dir_all(&dir);

    println!(
        "DTLS 1.2 handshakes ({} client threads, new session each, cookie exchange included):",
        a.handshake_clients
    );
    println!(
        "  {:<12} {:<26} {:>12}",
        "mode", "cipher suite", "handshakes/s"
    );
    println!("  {:<12} {:<26} {:>12.0}", "psk", psk_cipher, hs_psk);
    println!(
        "  {:<12} {:<26} {:>12.0}",
        "certificate", cert_cipher, hs_cert
    );
    println!(
        "throughput ({} sessions x {} CON GET /request in flight, {:.1} s each):",
        a.sessions, a.window, a.secs
    );
    println!(
        "  {:<12} {:>12} {:>10} {:>10}",
        "transport", "requests/s", "lost", "p50 ms"
    );
    for (name, r) in [("coap", &coap), ("coaps", &coaps)] {
        println!(
            "  {:<12} {:>12.0} {:>10} {:>10.3}",
            name, r.rate, r.lost, r.p50_ms
        );
    }
    let ratio = if coap.rate > 0.0 {
        coaps.rate / coap.rate * 100.0
    } else {
        0.0
    };
    println!(
        "coaps/coap throughput: {ratio:.0} % (target >= 50 %: {})",
        if ratio >= 50.0 { "met" } else { "missed" }
    );
    println!(
        "server counters: {} handshakes, {} failed, {} evicted, {} dropped records, {} decrypted, {} encrypted",
        st.handshakes.load(Relaxed),
        st.handshake_failures.load(Relaxed) + st.handshake_timeouts.load(Relaxed),
        st.evicted.load(Relaxed),
        st.dropped_records.load(Relaxed),
        st.decrypted.load(Relaxed),
        st.encrypted.load(Relaxed)
    );
    Ok(ExitCode::SUCCESS)
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
