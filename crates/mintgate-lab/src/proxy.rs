//! `mintgate lab proxy`: paper 002's Tables 4-6, HTTP (TCP) and QUIC
//! (HTTP/3) proxies in front of a CoAP server on a lossy link.
//!
//! Set-up, everything on this machine:
//!
//! ```text
//!  client ==[Internet: TUN link between two network namespaces]== proxy
//!  (h1 or h3)    delay ± jitter, small loss, TCP and UDP alike     |
//!                                                                  | CoAP, Adaptive RTO
//!                                     [CoAP leg: UDP impairment relay, 5/10/15 % loss]
//!                                                                  |
//!                                                          mintgate gateway (/request)
//! ```
//!
//! Per loss level, protocol (h1 = HTTP/1.1 over TCP, h3 = HTTP/3 over QUIC)
//! and mode (persistent: one connection for all requests; new: a new
//! connection per request, a TCP handshake for h1 and a 0-RTT resumption
//! for h3), `requests` sequential GETs, each repeated until it succeeds (as
//! the paper did). For each request: the CoAP RTT (the proxy's exchange
//! time, reported in `Server-Timing: coap;dur=`), the total RTT (the
//! client's, from before connecting or sending to the last body byte) and
//! the Internet RTT = total - CoAP. Reported as 10 intervals.
//!
//! The Internet leg is [`netns::ImpairedLink`]: real kernel TCP and real
//! QUIC over one impaired IP path (see that module for what it models).
//! The CoAP leg is mintgate's UDP impairment relay (the congestion lab's
//! `--real` settings: 15 ± 5 ms and the loss, each way), and the proxy's
//! upstream uses Adaptive RTO as the paper's did. The proxy's cache is off,
//! so every request reaches the CoAP server.
//!
//! Also measured (on loopback, no impairment; `bench`): the proxy's added
//! latency over a raw CoAP request and HTTP/1.1 keep-alive and HTTP/3
//! throughput.

pub mod netns;
pub mod paper;

use std::fmt::Write as _;
use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};
use mintgate_coap::client::{Client, ClientConfig, Event, Request};
use mintgate_coap::rto::{Algorithm, TransmissionParams};
use mintgate_coap::wire::{Code, OptionNumber};
use mintgate_gateway::config::{HandlerCost, PoolMode};
use mintgate_netsim::relay::{Impairment, Relay, RelayConfig};
use mintgate_proxy::client::{ClientOptions, HttpClient, Proto};
use mintgate_proxy::http::{HeaderMap, HeaderValue, Method, StatusCode};
use mintgate_proxy::mapping::Authority;
use mintgate_proxy::tls::Roots;
use mintgate_proxy::{ProxyConfig, ProxyServer, Sockets};
use plotters::prelude::*;

use crate::{create_out, lab_config, line, write_file, LabGateway, LabOptions, Summary};
use netns::{ImpairedLink, LinkImpairment, SERVER_IP};

/// Settings of the proxy lab.
#[derive(Clone)]
pub struct ProxyLabOptions {
    /// Output folder, progress sink, `quick`.
    pub common: LabOptions,
    /// Requests per case [1000; quick 100].
    pub requests: Option<usize>,
    /// Seed of the impairments.
    pub seed: u64,
    /// Internet leg, each way.
    pub internet: LinkImpairment,
    /// Also measure the proxy's overhead and throughput on loopback.
    pub bench: bool,
}

impl Default for ProxyLabOptions {
    fn default() -> Self {
        ProxyLabOptions {
            common: LabOptions::default(),
            requests: None,
            seed: 1,
            internet: LinkImpairment {
                delay: Duration::from_millis(20),
                jitter: Duration::from_millis(2),
                loss: 0.01,
            },
            bench: true,
        }
    }
}

const LOSSES: [u32; 3] = [5, 10, 15];
const INTERVALS: usize = 10;
const PROTOS: [Proto; 2] = [Proto::H1, Proto::H3];

/// Connection handling of a case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// One connection for every request.
    Persistent,
    /// A new connection per request.
    New,
    /// [`SHARED`] requests at a time on one connection (HTTP/2 and HTTP/3
    /// multiplex them; HTTP/1.1 sends them one after the other).
    Shared,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Persistent => "persistent",
            Mode::New => "new",
            Mode::Shared => "shared4",
        }
    }
}

/// Requests in flight at once in the shared-connection cases.
pub const SHARED: usize = 4;
const SHARED_PROTOS: [Proto; 3] = [Proto::H1, Proto::H2, Proto::H3];

const MODES: [Mode; 2] = [Mode::Persistent, Mode::New];

/// One successful request.
#[derive(Clone, Copy, Debug)]
struct Sample {
    coap_ms: f64,
    total_ms: f64,
    early: bool,
}

/// One case's results.
struct Case {
    loss_pct: u32,
    proto: Proto,
    mode: Mode,
    samples: Vec<Sample>,
    /// Attempts that failed (error or non-200) and were repeated.
    failures: usize,
    wall: Duration,
}

impl Case {
    /// (CoAP, total, Internet) means per interval.
    fn intervals(&self) -> Vec<[f64; 3]> {
        let per = (self.samples.len() / INTERVALS).max(1);
        self.samples
            .chunks(per)
            .take(INTERVALS)
            .map(|c| {
                let n = c.len() as f64;
                let coap = c.iter().map(|s| s.coap_ms).sum::<f64>() / n;
                let total = c.iter().map(|s| s.total_ms).sum::<f64>() / n;
                [coap, total, total - coap]
            })
            .collect()
    }

    fn mean(&self, k: usize) -> f64 {
        let v = self.intervals();
        v.iter().map(|r| r[k]).sum::<f64>() / v.len().max(1) as f64
    }

    fn median_internet(&self) -> f64 {
        let mut v: Vec<f64> = self
            .samples
            .iter()
            .map(|s| s.total_ms - s.coap_ms)
            .collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    }

    /// The figures of its progress line.
    fn figures(&self) -> String {
        format!(
            "CoAP {:7.1} ms, total {:7.1} ms, Internet {:6.1} ms (median {:5.1}), {} repeated, {:.0} s",
            self.mean(0),
            self.mean(1),
            self.mean(2),
            self.median_internet(),
            self.failures,
            self.wall.as_secs_f64()
        )
    }
}

/// Runs the lab.
pub fn lab_proxy(o: &ProxyLabOptions) -> anyhow::Result<Summary> {
    let c = &o.common;
    create_out(&c.out)?;
    let requests = o
        .requests
        .unwrap_or(if c.quick { 100 } else { 1000 })
        .max(INTERVALS);
    let progress = c.progress.clone();
    progress(&format!(
        "lab proxy: {requests} requests per case, Internet leg {} ms ± {} ms and {:.1} % loss each way, CoAP leg 15 ± 5 ms each way",
        o.internet.delay.as_millis(),
        o.internet.jitter.as_millis(),
        o.internet.loss * 100.0
    ));
    let link = ImpairedLink::start(o.internet, o.internet, o.seed).map_err(|e| {
        anyhow!(
            "cannot build the impaired Internet link (two network namespaces joined by TUN \
             devices; needs root and /dev/net/tun): {e}"
        )
    })?;
    let gw = LabGateway::start(lab_config(PoolMode::Fixed(1), HandlerCost::None, 120))?;
    let tls_dir = c.out.join("tls");
    let mut cases = Vec::new();
    let mut shared = Vec::new();
    for (li, &loss) in LOSSES.iter().enumerate() {
        let relay = Relay::start(RelayConfig {
            listen: "127.0.0.1:0".parse().expect("literal address"),
            forward: gw.addr,
            up: Impairment {
                loss: f64::from(loss) / 100.0,
                burst: 1.0,
                delay: Duration::from_millis(15),
                jitter: Duration::from_millis(5),
            },
            down: Impairment {
                loss: f64::from(loss) / 100.0,
                burst: 1.0,
                delay: Duration::from_millis(15),
                jitter: Duration::from_millis(5),
            },
            seed: o.seed.wrapping_add(li as u64 * 1000),
        })
        .context("starting the CoAP leg's impairment relay")?;
        let coap = relay.local_addr();
        let mut cfg = ProxyConfig {
            allow: vec![Authority::from(coap)],
            congestion: Algorithm::Adaptive,
            // Room for the shared cases' concurrent requests; the sequential
            // cases have one in flight at a time anyway.
            nstart: SHARED,
            cache_entries: 0,
            request_timeout: Duration::from_secs(120),
            ..ProxyConfig::default()
        };
        cfg.tls.self_signed_dir = tls_dir.clone();
        let sockets = link
            .spawn_in(true, || -> std::io::Result<Sockets> {
                let http = std::net::TcpListener::bind((SERVER_IP, 0))?;
                http.set_nonblocking(true)?;
                let h3 = UdpSocket::bind((SERVER_IP, 0))?;
                h3.set_nonblocking(true)?;
                Ok(Sockets {
                    http: Some(http),
                    h3: Some(h3),
                    upstream: None,
                    ws_handoff: None,
                })
            })?
            .join()
            .map_err(|_| anyhow!("the namespace thread panicked"))???;
        let srv = ProxyServer::start_with(cfg, sockets, 1, None).context("starting the proxy")?;
        let cert = srv
            .cert()
            .map(|(p, _)| p.to_path_buf())
            .ok_or_else(|| anyhow!("the proxy has no certificate"))?;
        let roots = Roots::Certs(mintgate_proxy::tls::load_certs(&cert)?);
        // One case by `run` in the client namespace, timed.
        let measure =
            |proto: Proto, mode: Mode, label: String, run: RunCase| -> anyhow::Result<Case> {
                let addr = match proto {
                    Proto::H3 => srv.h3_addr(),
                    _ => srv.http_addr(),
                }
                .ok_or_else(|| anyhow!("no listener"))?;
                let opts = ClientOptions {
                    proto,
                    new_conn: mode == Mode::New,
                    roots: roots.clone(),
                    server_name: "localhost".into(),
                    client_cert: None,
                    timeout: Duration::from_secs(120),
                };
                let target = format!("/hc/coap://{coap}/request");
                let prog = progress.clone();
                let t0 = Instant::now();
                let (samples, failures) = link
                    .spawn_in(false, move || {
                        run(opts, addr, &target, requests, &label, &prog)
                    })?
                    .join()
                    .map_err(|_| anyhow!("the client thread panicked"))???;
                Ok(Case {
                    loss_pct: loss,
                    proto,
                    mode,
                    samples,
                    failures,
                    wall: t0.elapsed(),
                })
            };
        for mode in MODES {
            for proto in PROTOS {
                let label = format!("{loss}% {} {}", proto.name(), mode.name());
                let case = measure(proto, mode, label, run_case)?;
                progress(&format!(
                    "  {loss:>2}% {} {:<10}: {}",
                    proto.name(),
                    mode.name(),
                    case.figures()
                ));
                cases.push(case);
            }
        }
        for proto in SHARED_PROTOS {
            let label = format!("{loss}% {} shared x{SHARED}", proto.name());
            let case = measure(proto, Mode::Shared, label, run_shared_case)?;
            progress(&format!(
                "  {loss:>2}% {} shared x{SHARED} : {}",
                proto.name(),
                case.figures()
            ));
            shared.push(case);
        }
        drop(srv);
        drop(relay);
    }
    let link_stats = (
        link.stats().up.packets.load(Relaxed) + link.stats().down.packets.load(Relaxed),
        link.stats().up.dropped.load(Relaxed) + link.stats().down.dropped.load(Relaxed),
    );
    drop(link);

    let bench = if o.bench {
        progress("proxy overhead and throughput on loopback (no impairment)");
        Some(bench(c.quick, &progress)?)
    } else {
        None
    };

    let csv = c.out.join("proxy.csv");
    write_file(&csv, &intervals_csv(&cases))?;
    let shared_csv = c.out.join("proxy_shared.csv");
    write_file(&shared_csv, &intervals_csv(&shared))?;
    let svg = c.out.join("proxy.svg");
    plot(&svg, &cases)?;
    let (table, met) = report(&cases, &shared, requests, o, link_stats, bench.as_ref());
    Ok(Summary {
        lab: "proxy",
        table,
        files: vec![csv, shared_csv, svg],
        target_met: Some(met),
    })
}

/// [`run_case`] or [`run_shared_case`].
type RunCase = fn(
    ClientOptions,
    SocketAddr,
    &str,
    usize,
    &str,
    &crate::ProgressFn,
) -> anyhow::Result<(Vec<Sample>, usize)>;

/// A client of `addr` and the `no-cache` headers its requests take, after
/// two warm-up requests, not counted: they open the persistent connection,
/// or get the first session ticket for 0-RTT.
async fn warmed_client(
    opts: &ClientOptions,
    addr: SocketAddr,
    target: &str,
) -> anyhow::Result<(HttpClient, HeaderMap)> {
    let mut client = HttpClient::new(opts.clone(), addr, None)?;
    let mut headers = HeaderMap::new();
    headers.insert("cache-control", HeaderValue::from_static("no-cache"));
    for _ in 0..2 {
        let _ = client
            .request(Method::GET, target, &headers, Default::default())
            .await;
    }
    Ok((client, headers))
}

/// The client side of one case, inside the client namespace.
fn run_case(
    opts: ClientOptions,
    addr: SocketAddr,
    target: &str,
    requests: usize,
    label: &str,
    progress: &crate::ProgressFn,
) -> anyhow::Result<(Vec<Sample>, usize)> {
    let rt = mintgate_proxy::tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let (mut client, headers) = warmed_client(&opts, addr, target).await?;
        let mut samples = Vec::with_capacity(requests);
        let mut failures = 0usize;
        let deadline = Instant::now() + Duration::from_secs(3600);
        while samples.len() < requests {
            if Instant::now() > deadline {
                return Err(anyhow!("{label}: the case took over an hour"));
            }
            if failures > requests {
                return Err(anyhow!("{label}: more failed attempts than requests"));
            }
            match client
                .request(Method::GET, target, &headers, Default::default())
                .await
            {
                Ok(r) if r.status == StatusCode::OK => {
                    let coap = r
                        .coap_rtt()
                        .ok_or_else(|| anyhow!("no Server-Timing in the answer"))?;
                    samples.push(Sample {
                        coap_ms: coap.as_secs_f64() * 1e3,
                        total_ms: r.total.as_secs_f64() * 1e3,
                        early: r.early_data,
                    });
                    if samples.len() % (requests / 5).max(1) == 0 {
                        progress(&format!("  {label}: {}/{requests}", samples.len()));
                    }
                }
                Ok(_) => failures += 1,
                Err(_) => {
                    failures += 1;
                    client.close();
                }
            }
        }
        client.shutdown().await;
        let early = samples.iter().filter(|s| s.early).count();
        if opts.proto == Proto::H3 && opts.new_conn {
            progress(&format!(
                "  {label}: {early}/{requests} requests went as 0-RTT early data"
            ));
        }
        Ok((samples, failures))
    })
}

/// A shared-connection case, inside the client namespace: [`SHARED`]
/// workers send back to back over one connection until `requests` have
/// succeeded. A request's total RTT runs from when its worker wants to send
/// it, so for HTTP/1.1 it includes waiting for the connection (its
/// head-of-line blocking); HTTP/2 and HTTP/3 send at once on a new stream.
// The signature is RunCase's, as run_case's.
fn run_shared_case(
    opts: ClientOptions,
    addr: SocketAddr,
    target: &str,
    requests: usize,
    label: &str,
    progress: &crate::ProgressFn,
) -> anyhow::Result<(Vec<Sample>, usize)> {
    use mintgate_proxy::tokio;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let (client, headers) = warmed_client(&opts, addr, target).await?;
        let handles: Vec<_> = (0..SHARED).map(|_| client.stream_handle()).collect();
        let client = Arc::new(tokio::sync::Mutex::new(client));
        let started = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(AtomicU64::new(0));
        let samples = Arc::new(std::sync::Mutex::new(Vec::with_capacity(requests)));
        let deadline = Instant::now() + Duration::from_secs(3600);
        let mut tasks = Vec::new();
        for mut handle in handles {
            let (client, started, failures, samples, headers, target) = (
                client.clone(),
                started.clone(),
                failures.clone(),
                samples.clone(),
                headers.clone(),
                target.to_owned(),
            );
            tasks.push(tokio::spawn(async move {
                // Claim a request only while fewer than `requests` are
                // claimed, so that a failure's give-back below is always
                // taken again (by this task at least).
                let claim = || {
                    started
                        .fetch_update(Relaxed, Relaxed, |n| (n < requests as u64).then_some(n + 1))
                        .is_ok()
                };
                while claim() {
                    if Instant::now() > deadline || failures.load(Relaxed) > requests as u64 {
                        return;
                    }
                    let t0 = Instant::now();
                    let r = match handle.as_mut() {
                        Some(h) => h.request(Method::GET, &target, &headers).await,
                        None => {
                            client
                                .lock()
                                .await
                                .request(Method::GET, &target, &headers, Default::default())
                                .await
                        }
                    };
                    let coap = match &r {
                        Ok(r) if r.status == StatusCode::OK => r.coap_rtt(),
                        _ => None,
                    };
                    match coap {
                        Some(coap) => {
                            let mut v = samples.lock().unwrap_or_else(|p| p.into_inner());
                            v.push(Sample {
                                coap_ms: coap.as_secs_f64() * 1e3,
                                total_ms: t0.elapsed().as_secs_f64() * 1e3,
                                early: false,
                            });
                        }
                        None => {
                            failures.fetch_add(1, Relaxed);
                            // Repeat it: give the request back.
                            started.fetch_sub(1, Relaxed);
                        }
                    }
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
        let samples = std::mem::take(&mut *samples.lock().unwrap_or_else(|p| p.into_inner()));
        let failures = failures.load(Relaxed) as usize;
        if samples.len() < requests {
            return Err(anyhow!(
                "{label}: only {} of {requests} requests succeeded ({failures} failures)",
                samples.len()
            ));
        }
        progress(&format!("  {label}: {requests}/{requests}"));
        if let Ok(c) = Arc::try_unwrap(client) {
            c.into_inner().shutdown().await;
        }
        Ok((samples, failures))
    })
}

fn find(cases: &[Case], loss: u32, proto: Proto, mode: Mode) -> Option<&Case> {
    cases
        .iter()
        .find(|c| c.loss_pct == loss && c.proto == proto && c.mode == mode)
}

fn report(
    cases: &[Case],
    shared: &[Case],
    requests: usize,
    o: &ProxyLabOptions,
    link: (u64, u64),
    bench: Option<&BenchFigures>,
) -> (String, bool) {
    let mut t = String::new();
    let mut met = true;
    line(
        &mut t,
        format_args!(
            "Paper 002 Tables 4-6: Internet RTT = total RTT - CoAP RTT (ms), mean of {INTERVALS} intervals, {requests} requests per case"
        ),
    );
    line(
        &mut t,
        format_args!(
            "Internet leg: {} ms ± {} ms and {:.1} % loss each way (TUN link between namespaces; {} packets, {} dropped); CoAP leg: 15 ± 5 ms each way, Adaptive RTO",
            o.internet.delay.as_millis(),
            o.internet.jitter.as_millis(),
            o.internet.loss * 100.0,
            link.0,
            link.1
        ),
    );
    line(&mut t, format_args!(""));
    paper::comparison(&mut t, cases);
    line(&mut t, format_args!(""));
    line(
        &mut t,
        format_args!("Per case (means over intervals; CoAP and total RTT ms, requests repeated after a failure):"),
    );
    for c in cases.iter().chain(shared) {
        line(
            &mut t,
            format_args!(
                "  {:>2}% {} {:<10} CoAP {:7.1}  total {:7.1}  Internet {:6.1} (median {:6.1})  repeated {}",
                c.loss_pct,
                c.proto.name(),
                c.mode.name(),
                c.mean(0),
                c.mean(1),
                c.mean(2),
                c.median_internet(),
                c.failures
            ),
        );
    }
    line(&mut t, format_args!(""));
    line(&mut t, format_args!("Targets:"));
    for l in LOSSES {
        let get = |pr, m| find(cases, l, pr, m).map(|c| c.mean(2));
        if let (Some(n3), Some(n1)) = (get(Proto::H3, Mode::New), get(Proto::H1, Mode::New)) {
            let below = (n1 - n3) / n1 * 100.0;
            let ok = below >= 30.0;
            met &= ok;
            line(
                &mut t,
                format_args!(
                    "  {l:>2}% new connection per request: h3 (0-RTT) Internet RTT {below:.1} % below h1 (target >= 30 %): {}",
                    if ok { "met" } else { "NOT met" }
                ),
            );
        }
        if let (Some(p3), Some(p1)) = (
            get(Proto::H3, Mode::Persistent),
            get(Proto::H1, Mode::Persistent),
        ) {
            let gain = (p1 - p3) / p3 * 100.0;
            line(
                &mut t,
                format_args!(
                    "  {l:>2}% persistent, one request at a time: h3 {gain:+.1} % vs h1 (paper's convention (HTTP-QUIC)/QUIC): reported only"
                ),
            );
        }
        let sh = |pr| find(shared, l, pr, Mode::Shared).map(|c| c.mean(2));
        if let (Some(s3), Some(s1)) = (sh(Proto::H3), sh(Proto::H1)) {
            let gain = (s1 - s3) / s3 * 100.0;
            let ok = gain >= 9.05;
            if o.internet.loss > 0.0 {
                met &= ok;
            }
            let vs2 = sh(Proto::H2)
                .map(|s2| format!("; vs h2 {:+.1} %", (s2 - s3) / s3 * 100.0))
                .unwrap_or_default();
            line(
                &mut t,
                format_args!(
                    "  {l:>2}% {SHARED} requests sharing one connection: h3 {gain:+.1} % vs h1{vs2} (target >= 9.05 % vs h1 where the Internet leg has loss): {}",
                    if o.internet.loss == 0.0 {
                        "no Internet loss, reported only"
                    } else if ok {
                        "met"
                    } else {
                        "NOT met"
                    }
                ),
            );
        }
    }
    if let Some(b) = bench {
        line(&mut t, format_args!(""));
        b.report(&mut t);
        met &= b.met();
    }
    (t, met)
}

const COLORS: [RGBColor; 4] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
];

fn plot(path: &Path, cases: &[Case]) -> anyhow::Result<()> {
    let err = |e: &dyn std::fmt::Display| anyhow!("drawing the chart: {e}");
    let root = SVGBackend::new(path, (1500, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let panels = root.split_evenly((1, 3));
    let ymax = cases
        .iter()
        .flat_map(|c| c.intervals().into_iter().map(|r| r[2]))
        .chain(
            paper::TABLES
                .iter()
                .flat_map(|p| p.http.iter().map(|r| r[2])),
        )
        .fold(1.0f64, f64::max)
        * 1.15;
    for (panel, p) in panels.iter().zip(paper::TABLES.iter()) {
        let mut ch = ChartBuilder::on(panel)
            .caption(
                format!("Internet RTT, CoAP leg at {} % loss", p.loss_pct),
                ("sans-serif", 18),
            )
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(50)
            .build_cartesian_2d(0.5f64..10.5, 0f64..ymax)
            .map_err(|e| err(&e))?;
        ch.configure_mesh()
            .x_desc("interval")
            .x_labels(10)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_desc("ms")
            .draw()
            .map_err(|e| err(&e))?;
        let mut k = 0;
        for mode in MODES {
            for proto in PROTOS {
                let Some(c) = find(cases, p.loss_pct, proto, mode) else {
                    continue;
                };
                let color = COLORS[k % COLORS.len()];
                k += 1;
                let pts: Vec<(f64, f64)> = c
                    .intervals()
                    .iter()
                    .enumerate()
                    .map(|(i, r)| (i as f64 + 1.0, r[2]))
                    .collect();
                ch.draw_series(LineSeries::new(pts, color.stroke_width(2)))
                    .map_err(|e| err(&e))?
                    .label(format!("ours {} {}", proto.name(), mode.name()))
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                    });
            }
        }
        for (label, rows, color) in [
            ("paper QUIC", &p.quic, BLACK),
            ("paper HTTP", &p.http, RGBColor(0x7f, 0x7f, 0x7f)),
        ] {
            ch.draw_series(
                rows.iter()
                    .enumerate()
                    .map(|(i, r)| TriangleMarker::new((i as f64 + 1.0, r[2]), 5, color.filled())),
            )
            .map_err(|e| err(&e))?
            .label(label)
            .legend(move |(x, y)| TriangleMarker::new((x + 9, y), 5, color.filled()));
        }
        crate::plot::legend(
            &mut ch.configure_series_labels(),
            SeriesLabelPosition::UpperRight,
        )?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// The proxy's overhead and throughput on loopback.
#[derive(Clone, Debug)]
pub struct BenchFigures {
    /// Sequential requests measured per latency figure.
    pub samples: usize,
    /// Median raw CoAP round trip (mintgate's client to the gateway), µs.
    pub coap_median_us: f64,
    /// Median HTTP/1.1 keep-alive round trip through the proxy from a
    /// blocking client as lean as the raw CoAP one, µs.
    pub h1_median_us: f64,
    /// The same with mintgate's (hyper) HTTP client, µs.
    pub h1_hyper_median_us: f64,
    /// Median HTTP/3 round trip through the proxy, µs.
    pub h3_median_us: f64,
    /// HTTP/1.1 keep-alive requests/s through the proxy (every one to CoAP).
    pub h1_rps: f64,
    /// HTTP/3 requests/s through the proxy (every one to CoAP).
    pub h3_rps: f64,
    /// HTTP/1.1 connections and HTTP/3 streams kept busy.
    pub concurrency: usize,
    /// Duration of each throughput run.
    pub duration: Duration,
}

impl BenchFigures {
    /// Whether the targets are met.
    pub fn met(&self) -> bool {
        self.h1_median_us - self.coap_median_us < 100.0 && self.h1_rps >= 10_000.0
    }

    /// Appends the figures to a table.
    pub fn report(&self, t: &mut String) {
        let over = self.h1_median_us - self.coap_median_us;
        line(
            t,
            format_args!(
                "Loopback (no impairment; proxy cache off, every request goes to CoAP; {} sequential requests each):",
                self.samples
            ),
        );
        line(
            t,
            format_args!(
                "  raw CoAP RTT median {:.1} us; via proxy: HTTP/1.1 keep-alive {:.1} us (lean blocking client; {:.1} us with the hyper client), HTTP/3 {:.1} us",
                self.coap_median_us, self.h1_median_us, self.h1_hyper_median_us, self.h3_median_us
            ),
        );
        line(
            t,
            format_args!(
                "  proxy overhead (HTTP/1.1 median - CoAP median): {:.1} us (target < 100 us): {}",
                over,
                if over < 100.0 { "met" } else { "NOT met" }
            ),
        );
        line(
            t,
            format_args!(
                "  throughput over {:.0} s, {} connections (h1) / streams (h3): HTTP/1.1 keep-alive {:.0} req/s (target >= 10,000: {}), HTTP/3 {:.0} req/s",
                self.duration.as_secs_f64(),
                self.concurrency,
                self.h1_rps,
                if self.h1_rps >= 10_000.0 { "met" } else { "NOT met" },
                self.h3_rps
            ),
        );
    }
}

/// Median round trip of `samples` sequential GETs on one HTTP/1.1
/// keep-alive connection, from a blocking client that writes the request by
/// hand and reads the response by its Content-Length.
fn h1_blocking_median(addr: SocketAddr, target: &str, samples: usize) -> anyhow::Result<f64> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let req = format!("GET {target} HTTP/1.1\r\nhost: bench\r\n\r\n");
    let mut buf = vec![0u8; 4096];
    let mut v = Vec::with_capacity(samples);
    for i in 0..samples + 100 {
        let t0 = Instant::now();
        s.write_all(req.as_bytes())?;
        let mut have = 0usize;
        loop {
            let n = s.read(&mut buf[have..])?;
            if n == 0 {
                return Err(anyhow!("the proxy closed the connection"));
            }
            have += n;
            let text = &buf[..have];
            if let Some(end) = text.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&text[..end]).to_ascii_lowercase();
                if !head.starts_with("http/1.1 200") {
                    return Err(anyhow!(
                        "the proxy answered {}",
                        head.lines().next().unwrap_or("")
                    ));
                }
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .ok_or_else(|| anyhow!("no content-length"))?;
                if have >= end + 4 + len {
                    break;
                }
            }
            if have == buf.len() {
                return Err(anyhow!("response too large"));
            }
        }
        if i >= 100 {
            v.push(t0.elapsed().as_secs_f64() * 1e6);
        }
    }
    Ok(median(v))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Measures the proxy on loopback: the raw CoAP RTT, the same request
/// through the proxy over HTTP/1.1 keep-alive and HTTP/3 (medians of
/// sequential requests), and throughput with `concurrency` HTTP/1.1
/// keep-alive connections or HTTP/3 streams. Bounded in count and time.
pub fn bench(quick: bool, progress: &crate::ProgressFn) -> anyhow::Result<BenchFigures> {
    let samples = if quick { 1000 } else { 5000 };
    let duration = Duration::from_secs(if quick { 2 } else { 5 });
    let concurrency = 32;
    let gw = LabGateway::start(lab_config(PoolMode::Fixed(1), HandlerCost::None, 120))?;
    let tls = std::env::temp_dir().join(format!("mintgate-lab-proxy-tls-{}", std::process::id()));
    let mut cfg = ProxyConfig {
        allow: vec![Authority::from(gw.addr)],
        cache_entries: 0,
        nstart: concurrency,
        max_queue_per_upstream: 4 * concurrency,
        ..ProxyConfig::default()
    };
    cfg.tls.self_signed_dir = tls.clone();
    let srv = ProxyServer::start(
        cfg,
        &mintgate_proxy::Listen {
            http: Some("127.0.0.1:0".parse()?),
            h3: Some("127.0.0.1:0".parse()?),
        },
        1,
    )?;
    let roots = Roots::Certs(mintgate_proxy::tls::load_certs(
        srv.cert()
            .map(|c| c.0)
            .ok_or_else(|| anyhow!("no certificate"))?,
    )?);
    let (http, h3) = (
        srv.http_addr().ok_or_else(|| anyhow!("no HTTP listener"))?,
        srv.h3_addr().ok_or_else(|| anyhow!("no HTTP/3 listener"))?,
    );

    // Raw CoAP: mintgate's client, one socket, sequential CON GETs.
    let coap = {
        let sock = UdpSocket::bind("127.0.0.1:0")?;
        sock.connect(gw.addr)?;
        sock.set_read_timeout(Some(Duration::from_millis(200)))?;
        let params = TransmissionParams::default();
        let mut client = Client::new(
            ClientConfig::new(params),
            Algorithm::Basic.controller(params, 7),
            7,
        );
        let mut v = Vec::with_capacity(samples);
        let mut buf = [0u8; 2048];
        for _ in 0..samples + 100 {
            client
                .request(
                    Instant::now(),
                    gw.addr,
                    Request {
                        confirmable: true,
                        code: Code::GET,
                        options: vec![(OptionNumber::URI_PATH, b"request".to_vec())],
                        payload: vec![],
                    },
                )
                .map_err(|e| anyhow!("{e}"))?;
            let ev = loop {
                while let Some(t) = client.poll_transmit(Instant::now()) {
                    sock.send(&t.bytes)?;
                }
                if let Some(ev) = client.poll_event() {
                    break ev;
                }
                match sock.recv(&mut buf) {
                    Ok(n) => client.handle_datagram(Instant::now(), gw.addr, &buf[..n]),
                    Err(_) => client.handle_timeout(Instant::now()),
                }
            };
            if let Event::Response { rtt, .. } = ev {
                v.push(rtt.as_secs_f64() * 1e6);
            }
        }
        median(v.split_off(100.min(v.len())))
    };
    progress(&format!("  raw CoAP median {coap:.1} us"));

    let rt = mintgate_proxy::tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let target = format!("/hc/coap://{}/request", gw.addr);
    let mk = |proto: Proto| ClientOptions {
        proto,
        new_conn: false,
        roots: roots.clone(),
        server_name: "localhost".into(),
        client_cert: None,
        timeout: Duration::from_secs(10),
    };
    let seq = |proto: Proto, addr: SocketAddr| -> anyhow::Result<f64> {
        rt.block_on(async {
            let mut c = HttpClient::new(mk(proto), addr, None)?;
            let h = HeaderMap::new();
            let mut v = Vec::with_capacity(samples);
            for i in 0..samples + 100 {
                let r = c
                    .request(Method::GET, &target, &h, Default::default())
                    .await?;
                if r.status != StatusCode::OK {
                    return Err(anyhow!("{} answered {}", proto.name(), r.status));
                }
                if i >= 100 {
                    v.push(r.total.as_secs_f64() * 1e6);
                }
            }
            c.shutdown().await;
            Ok(median(v))
        })
    };
    // HTTP/1.1 latency with a client as lean as the raw CoAP one (a
    // blocking socket, the request written by hand), so that the difference
    // is the proxy's and not the HTTP client library's.
    let h1_median = h1_blocking_median(http, &target, samples)?;
    let h1_hyper = seq(Proto::H1, http)?;
    progress(&format!(
        "  HTTP/1.1 keep-alive (hyper client) median {h1_hyper:.1} us"
    ));
    progress(&format!("  HTTP/1.1 keep-alive median {h1_median:.1} us"));
    let h3_median = seq(Proto::H3, h3)?;
    progress(&format!("  HTTP/3 median {h3_median:.1} us"));

    // Throughput: `concurrency` workers, each a connection (h1) or a stream
    // on shared connections (h3), sending back to back until the time is up.
    let tput = |proto: Proto, addr: SocketAddr| -> anyhow::Result<f64> {
        let done = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let errors = Arc::new(AtomicU64::new(0));
        rt.block_on(async {
            let mut tasks = Vec::new();
            // HTTP/3: 4 connections with 8 concurrent streams each.
            let conns = if proto == Proto::H3 { 4 } else { concurrency };
            let per = concurrency / conns;
            for _ in 0..conns {
                let mut c = HttpClient::new(mk(proto), addr, None)?;
                // Open the connection before the workers and the clock start.
                c.request(Method::GET, &target, &HeaderMap::new(), Default::default())
                    .await?;
                let c = Arc::new(mintgate_proxy::tokio::sync::Mutex::new(c));
                for _ in 0..per {
                    let (c, done, stop, errors, target) = (
                        c.clone(),
                        done.clone(),
                        stop.clone(),
                        errors.clone(),
                        target.clone(),
                    );
                    tasks.push(mintgate_proxy::tokio::spawn(async move {
                        let h = HeaderMap::new();
                        while !stop.load(Relaxed) {
                            let r = if proto == Proto::H3 {
                                // Streams share the connection: each worker
                                // takes its own handle on it.
                                let handle = c.lock().await.stream_handle();
                                match handle {
                                    Some(mut s) => s
                                        .request(Method::GET, &target, &h)
                                        .await
                                        .map(|r| r.status == StatusCode::OK),
                                    None => Err(anyhow!("not connected")),
                                }
                            } else {
                                c.lock()
                                    .await
                                    .request(Method::GET, &target, &h, Default::default())
                                    .await
                                    .map(|r| r.status == StatusCode::OK)
                            };
                            match r {
                                Ok(true) => done.fetch_add(1, Relaxed),
                                _ => errors.fetch_add(1, Relaxed),
                            };
                        }
                    }));
                }
            }
            let start_count = done.load(Relaxed);
            let t0 = Instant::now();
            mintgate_proxy::tokio::time::sleep(duration).await;
            let n = done.load(Relaxed) - start_count;
            let secs = t0.elapsed().as_secs_f64();
            stop.store(true, Relaxed);
            for t in tasks {
                let _ = mintgate_proxy::tokio::time::timeout(Duration::from_secs(5), t).await;
            }
            if errors.load(Relaxed) > n / 100 {
                return Err(anyhow!(
                    "{}: {} errors under load",
                    proto.name(),
                    errors.load(Relaxed)
                ));
            }
            Ok(n as f64 / secs)
        })
    };
    let h1_rps = tput(Proto::H1, http)?;
    progress(&format!("  HTTP/1.1 keep-alive {h1_rps:.0} req/s"));
    let h3_rps = tput(Proto::H3, h3)?;
    progress(&format!("  HTTP/3 {h3_rps:.0} req/s"));
    drop(srv);
    let _ = std::fs::remove_dir_all(&tls);
    Ok(BenchFigures {
        samples,
        coap_median_us: coap,
        h1_median_us: h1_median,
        h1_hyper_median_us: h1_hyper,
        h3_median_us: h3_median,
        h1_rps,
        h3_rps,
        concurrency,
        duration,
    })
}

/// One CSV row per case and one-second interval: its RTTs (CoAP, total,
/// Internet), ms.
fn intervals_csv(cases: &[Case]) -> String {
    let mut text =
        String::from("loss_pct,protocol,mode,interval,coap_rtt_ms,total_rtt_ms,internet_rtt_ms\n");
    for case in cases {
        for (k, r) in case.intervals().iter().enumerate() {
            let _ = writeln!(
                text,
                "{},{},{},{},{:.3},{:.3},{:.3}",
                case.loss_pct,
                case.proto.name(),
                case.mode.name(),
                k + 1,
                r[0],
                r[1],
                r[2]
            );
        }
    }
    text
}
