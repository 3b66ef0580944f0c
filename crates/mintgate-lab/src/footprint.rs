//! `lab footprint`: the resident memory of a `mintgate serve` process with
//! the default configuration, idle and under saturating `mintgate bench`
//! loads, and the pool's outstanding blocks after the load stops (issue
//! targets: at most 16 MiB idle, at most 64 MiB loaded, no block
//! outstanding 10 s after the load).
//!
//! The gateway runs as a child process (the same `mintgate` executable), so
//! that its `/proc/PID/status` holds nothing but the gateway: VmRSS (resident
//! now) is sampled every 100 ms and VmHWM (the kernel's resident high-water
//! mark) read at the end of each phase. The pool is read from the child's
//! metrics endpoint (`mintgate_pool_outstanding_blocks`). The load comes
//! from the load generator behind `mintgate bench`, in this process.
//! libcoap's `coap-server-notls`, when installed, is measured the same way
//! for comparison.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use mintgate_coap::wire::{Code, MessageType, MessageWriter, OptionNumber, Packet};
use mintgate_loadgen::{LoadSpec, Mode};

use crate::{line, LabOptions, Summary};

/// Target: resident memory of an idle `mintgate serve`, bytes.
pub const IDLE_TARGET: u64 = 16 << 20;
/// Target: resident memory under saturating load, bytes.
pub const LOAD_TARGET: u64 = 64 << 20;
/// Target: seconds after the load within which no block is outstanding.
pub const DRAIN_TARGET: Duration = Duration::from_secs(10);

/// Memory figures of a process from `/proc/PID/status`, bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcMem {
    /// VmRSS: resident now.
    pub rss: u64,
    /// VmHWM: the most ever resident.
    pub hwm: u64,
    /// RssAnon: resident anonymous memory (heap, stacks, the pool's touched
    /// pages), the part of VmRSS that is not file pages (the executable's
    /// code, shared libraries).
    pub anon: u64,
    /// Threads.
    pub threads: u64,
}

/// Reads `/proc/PID/status`.
pub fn proc_mem(pid: u32) -> std::io::Result<ProcMem> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    Ok(parse_status(&text))
}

/// The VmRSS, VmHWM, RssAnon (kB in the file) and Threads lines of a
/// status file.
pub fn parse_status(text: &str) -> ProcMem {
    let mut m = ProcMem::default();
    for l in text.lines() {
        let mut it = l.split_whitespace();
        let (Some(k), Some(v)) = (it.next(), it.next()) else {
            continue;
        };
        let v: u64 = v.parse().unwrap_or(0);
        match k {
            "VmRSS:" => m.rss = v * 1024,
            "VmHWM:" => m.hwm = v * 1024,
            "RssAnon:" => m.anon = v * 1024,
            "Threads:" => m.threads = v,
            _ => {}
        }
    }
    m
}

/// GETs `http://addr/metrics` and returns the sum of every sample of
/// `family` (all label sets), or `None` when the family is absent.
pub fn metric_sum(addr: SocketAddr, family: &str) -> anyhow::Result<Option<f64>> {
    Ok(sum_family(&scrape(addr)?, family))
}

/// GETs `http://addr/metrics`: the response, head and Prometheus text.
pub fn scrape(addr: SocketAddr) -> anyhow::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .with_context(|| format!("connecting to the metrics endpoint {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    Ok(body)
}

/// Sums the samples of `family` in a Prometheus text exposition.
pub fn sum_family(text: &str, family: &str) -> Option<f64> {
    let mut found = None;
    for l in text.lines() {
        let Some(rest) = l.strip_prefix(family) else {
            continue;
        };
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            continue;
        }
        if let Some(v) = rest.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}

/// A child process killed (SIGKILL) if still running when dropped.
pub(crate) struct Proc(pub(crate) Child);

impl Drop for Proc {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

impl Proc {
    /// SIGTERM, then waits up to `limit` for the exit; true on a clean exit.
    pub(crate) fn terminate(&mut self, limit: Duration) -> bool {
        // SAFETY: signalling our own child by its pid.
        unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM) };
        let end = Instant::now() + limit;
        while Instant::now() < end {
            if let Ok(Some(st)) = self.0.try_wait() {
                return st.success();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }
}

pub(crate) fn free_udp_port() -> anyhow::Result<u16> {
    Ok(UdpSocket::bind("127.0.0.1:0")?.local_addr()?.port())
}

pub(crate) fn free_tcp_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// One CON request (GET, or PUT with `payload`); true when a 2.xx came back.
fn coap_request(to: SocketAddr, code: Code, path: &str, payload: &[u8]) -> bool {
    let Ok(s) = UdpSocket::bind("127.0.0.1:0") else {
        return false;
    };
    if s.connect(to).is_err()
        || s.set_read_timeout(Some(Duration::from_millis(300)))
            .is_err()
    {
        return false;
    }
    let mut buf = [0u8; 256];
    let Ok(mut w) = MessageWriter::new(&mut buf, MessageType::Con, code, 0x1234, &[7, 7]) else {
        return false;
    };
    if w.path_options(OptionNumber::URI_PATH, path).is_err() || w.payload(payload).is_err() {
        return false;
    }
    let len = w.finish();
    if s.send(&buf[..len]).is_err() {
        return false;
    }
    let mut rx = [0u8; 1500];
    match s.recv(&mut rx) {
        Ok(n) => Packet::new_checked(&rx[..n]).is_ok_and(|p| p.code().class() == 2),
        Err(_) => false,
    }
}

pub(crate) fn wait_answering(to: SocketAddr, limit: Duration) -> anyhow::Result<()> {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if coap_request(to, Code::GET, "/request", &[]) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    anyhow::bail!("the server on {to} did not answer GET /request within {limit:?}")
}

/// One load phase's result.
#[derive(Clone, Debug)]
pub struct Phase {
    /// What load.
    pub name: String,
    /// Answers per second the clients got.
    pub rps: f64,
    /// Largest VmRSS sampled during the phase.
    pub rss_max: u64,
    /// Largest RssAnon sampled during the phase.
    pub anon_max: u64,
    /// VmHWM at the end of the phase.
    pub hwm: u64,
    /// Threads at the end of the phase.
    pub threads: u64,
}

/// Runs `spec` against the server while sampling the process's VmRSS.
fn load_phase(pid: u32, name: &str, spec: &LoadSpec) -> anyhow::Result<Phase> {
    let stop = Arc::new(AtomicBool::new(false));
    let max = Arc::new(AtomicU64::new(0));
    let anon = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (stop, max, anon) = (stop.clone(), max.clone(), anon.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Ok(m) = proc_mem(pid) {
                    max.fetch_max(m.rss, Ordering::Relaxed);
                    anon.fetch_max(m.anon, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let report = mintgate_loadgen::run(spec, |_| {});
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let report = report.with_context(|| format!("load {name}"))?;
    let end = proc_mem(pid).context("reading the server's /proc status")?;
    Ok(Phase {
        name: name.to_string(),
        rps: report.requests_per_sec,
        rss_max: max.load(Ordering::Relaxed).max(end.rss),
        anon_max: anon.load(Ordering::Relaxed).max(end.anon),
        hwm: end.hwm,
        threads: end.threads,
    })
}

/// What one server did.
#[derive(Clone, Debug)]
pub struct ServerFootprint {
    /// `mintgate`, `libcoap` or `californium`.
    pub server: &'static str,
    /// Idle, after start-up and one request.
    pub idle: ProcMem,
    /// The load phases.
    pub phases: Vec<Phase>,
    /// Outstanding pool blocks sampled after the NON load stopped:
    /// (seconds after the stop, blocks). mintgate only.
    pub drain: Vec<(f64, f64)>,
    /// Outstanding pool blocks after the CON load (held by the
    /// de-duplication cache for EXCHANGE_LIFETIME). mintgate only.
    pub after_con: Option<f64>,
    /// Exited cleanly on SIGTERM.
    pub clean_exit: bool,
}

/// The load phases: (name, CON, pacing).
fn loads() -> Vec<(&'static str, bool, Mode)> {
    vec![
        (
            "NON, closed loop 8 clients x 16 (mintgate bench's default)",
            false,
            Mode::Closed {
                clients: 8,
                window: 16,
            },
        ),
        (
            "NON, closed loop 256 clients x 32 (queue overload)",
            false,
            Mode::Closed {
                clients: 256,
                window: 32,
            },
        ),
        (
            "CON, closed loop 100 clients x 4",
            true,
            Mode::Closed {
                clients: 100,
                window: 4,
            },
        ),
    ]
}

fn spec(target: SocketAddr, con: bool, mode: Mode, quick: bool) -> LoadSpec {
    let mut s = LoadSpec::new(target, "/request", mode);
    s.confirmable = con;
    s.duration = Duration::from_secs(if quick { 4 } else { 10 });
    s.warmup = Duration::from_secs(1);
    s.timeout = Duration::from_secs(2);
    s.threads = 1;
    s
}

fn measure_mintgate(opts: &LabOptions, exe: &Path, log: &Path) -> anyhow::Result<ServerFootprint> {
    let progress = &opts.progress;
    let coap: SocketAddr = format!("127.0.0.1:{}", free_udp_port()?).parse()?;
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_tcp_port()?).parse()?;
    let child = Command::new(exe)
        .args(["--log", "warn", "serve", "--coap"])
        .arg(coap.to_string())
        .arg("--metrics")
        .arg(metrics.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?)
        .spawn()
        .with_context(|| format!("starting {} serve", exe.display()))?;
    let mut p = Proc(child);
    let pid = p.0.id();
    wait_answering(coap, Duration::from_secs(15))?;
    std::thread::sleep(Duration::from_secs(if opts.quick { 2 } else { 3 }));
    let idle = proc_mem(pid)?;
    progress(&format!(
        "lab footprint: mintgate idle: VmRSS {:.1} MiB, {} threads",
        mib(idle.rss),
        idle.threads
    ));
    let outstanding =
        || metric_sum(metrics, "mintgate_pool_outstanding_blocks").map(|v| v.unwrap_or(f64::NAN));
    let mut phases = Vec::new();
    let mut drain = Vec::new();
    let mut after_con = None;
    for (name, con, mode) in loads() {
        let ph = load_phase(pid, name, &spec(coap, con, mode, opts.quick))?;
        progress(&format!(
            "lab footprint: mintgate {name}: {:.0} answers/s, VmRSS max {:.1} MiB, VmHWM {:.1} \
             MiB, {} threads",
            ph.rps,
            mib(ph.rss_max),
            mib(ph.hwm),
            ph.threads
        ));
        phases.push(ph);
        if con {
            std::thread::sleep(Duration::from_secs(2));
            after_con = Some(outstanding()?);
        } else if drain.is_empty() {
            // after the first NON load: blocks outstanding until none are
            let t0 = Instant::now();
            loop {
                let o = outstanding()?;
                drain.push((t0.elapsed().as_secs_f64(), o));
                if o == 0.0 || t0.elapsed() > DRAIN_TARGET + Duration::from_secs(2) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        }
    }
    let clean_exit = p.terminate(Duration::from_secs(10));
    Ok(ServerFootprint {
        server: "mintgate",
        idle,
        phases,
        drain,
        after_con,
        clean_exit,
    })
}

fn measure_libcoap(opts: &LabOptions) -> anyhow::Result<Option<ServerFootprint>> {
    let port = free_udp_port()?;
    let mut cmd = Command::new("coap-server-notls");
    cmd.args(["-A", "127.0.0.1", "-p", &port.to_string(), "-d", "10"]);
    let Some(p) = spawn_peer(cmd) else {
        (opts.progress)("lab footprint: coap-server-notls (libcoap3-bin) not found: skipped");
        return Ok(None);
    };
    let to: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let end = Instant::now() + Duration::from_secs(10);
    while !coap_request(to, Code::PUT, "/request", b"hello world") {
        anyhow::ensure!(Instant::now() < end, "libcoap did not accept PUT /request");
        std::thread::sleep(Duration::from_millis(100));
    }
    measure_peer(opts, "libcoap", p, to).map(Some)
}

/// Eclipse Californium (the JVM CoAP framework the VTA paper compared),
/// as `peers/californium` builds it: GET /request answers `hello world`,
/// Californium's default configuration, the JVM's default heap settings.
fn measure_californium(opts: &LabOptions) -> anyhow::Result<Option<ServerFootprint>> {
    let jar = match crate::peers::californium_jar(&opts.progress) {
        Ok(j) => j,
        Err(why) => {
            (opts.progress)(&format!("lab footprint: Californium skipped: {why:#}"));
            return Ok(None);
        }
    };
    let port = free_udp_port()?;
    let mut cmd = Command::new("java");
    cmd.arg("-jar").arg(&jar).arg(port.to_string());
    let Some(p) = spawn_peer(cmd) else {
        (opts.progress)("lab footprint: java not found: Californium skipped");
        return Ok(None);
    };
    let to: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    // a JVM takes a few seconds to start and compile its hot paths
    wait_answering(to, Duration::from_secs(30))?;
    measure_peer(opts, "californium", p, to).map(Some)
}

fn spawn_peer(mut cmd: Command) -> Option<Proc> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
        .map(Proc)
}

/// Idle memory, then every load phase, of a third-party server answering
/// GET /request at `to`.
fn measure_peer(
    opts: &LabOptions,
    server: &'static str,
    mut p: Proc,
    to: SocketAddr,
) -> anyhow::Result<ServerFootprint> {
    let pid = p.0.id();
    wait_answering(to, Duration::from_secs(5))?;
    std::thread::sleep(Duration::from_secs(if opts.quick { 2 } else { 3 }));
    let idle = proc_mem(pid)?;
    let mut phases = Vec::new();
    for (name, con, mode) in loads() {
        let ph = load_phase(pid, name, &spec(to, con, mode, opts.quick))?;
        (opts.progress)(&format!(
            "lab footprint: {server} {name}: {:.0} answers/s, VmRSS max {:.1} MiB",
            ph.rps,
            mib(ph.rss_max)
        ));
        phases.push(ph);
    }
    let clean_exit = p.terminate(Duration::from_secs(5));
    Ok(ServerFootprint {
        server,
        idle,
        phases,
        drain: Vec::new(),
        after_con: None,
        clean_exit,
    })
}

pub(crate) fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

/// Runs the lab with `exe` as the `mintgate` executable (the CLI passes
/// its own). Writes `footprint.csv`.
pub fn lab_footprint(opts: &LabOptions, exe: &Path) -> anyhow::Result<Summary> {
    crate::create_out(&opts.out)?;
    let log = opts.out.join("footprint-serve.log");
    (opts.progress)(&format!(
        "lab footprint: {} serve (default configuration, loopback), idle then {} loads of {} s",
        exe.display(),
        loads().len(),
        if opts.quick { 4 } else { 10 }
    ));
    let mg = measure_mintgate(opts, exe, &log)?;
    let lc = measure_libcoap(opts)?;
    let cf = measure_californium(opts)?;
    let servers: Vec<&ServerFootprint> = std::iter::once(&mg)
        .chain(lc.as_ref())
        .chain(cf.as_ref())
        .collect();

    let csv_path = opts.out.join("footprint.csv");
    let mut csv =
        String::from("server,phase,answers_per_s,rss_bytes,anon_bytes,hwm_bytes,threads\n");
    for s in &servers {
        line(
            &mut csv,
            format_args!(
                "{},idle,0,{},{},{},{}",
                s.server, s.idle.rss, s.idle.anon, s.idle.hwm, s.idle.threads
            ),
        );
        for p in &s.phases {
            line(
                &mut csv,
                format_args!(
                    "{},\"{}\",{:.0},{},{},{},{}",
                    s.server, p.name, p.rps, p.rss_max, p.anon_max, p.hwm, p.threads
                ),
            );
        }
    }
    crate::write_file(&csv_path, &csv)?;

    let mut t = String::new();
    line(
        &mut t,
        format_args!(
            "lab footprint: resident memory (VmRSS; VmHWM = high-water mark) of a server process, \
             default configuration, loopback"
        ),
    );
    line(
        &mut t,
        format_args!(
            "{:<11} | {:<58} | {:>10} | {:>12} | {:>12} | {:>11} | {:>7}",
            "server", "phase", "answers/s", "VmRSS max", "RssAnon max", "VmHWM", "threads"
        ),
    );
    for s in &servers {
        line(
            &mut t,
            format_args!(
                "{:<11} | {:<58} | {:>10} | {:>8.1} MiB | {:>8.1} MiB | {:>7.1} MiB | {:>7}",
                s.server,
                "idle",
                "-",
                mib(s.idle.rss),
                mib(s.idle.anon),
                mib(s.idle.hwm),
                s.idle.threads
            ),
        );
        for p in &s.phases {
            line(
                &mut t,
                format_args!(
                    "{:<11} | {:<58} | {:>10.0} | {:>8.1} MiB | {:>8.1} MiB | {:>7.1} MiB | {:>7}",
                    s.server,
                    p.name,
                    p.rps,
                    mib(p.rss_max),
                    mib(p.anon_max),
                    mib(p.hwm),
                    p.threads
                ),
            );
        }
    }
    if cf.is_none() {
        line(
            &mut t,
            format_args!("Californium: not measured (see the progress lines for why)"),
        );
    }
    let load_max = mg.phases.iter().map(|p| p.rss_max).max().unwrap_or(0);
    let drained = mg.drain.iter().find(|(_, o)| *o == 0.0).map(|(s, _)| *s);
    line(
        &mut t,
        format_args!(
            "pool blocks outstanding after the first NON load stopped: {}",
            mg.drain
                .iter()
                .map(|(s, o)| format!("{o:.0} at {s:.1} s"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    );
    if let Some(o) = mg.after_con {
        line(
            &mut t,
            format_args!(
                "pool blocks outstanding 2 s after the CON load: {o:.0} (the responses the \
                 de-duplication cache keeps for EXCHANGE_LIFETIME, 247 s, to replay duplicates; \
                 RFC 7252 4.5)"
            ),
        );
    }
    let mut met = true;
    let mut verdict = |ok: bool, what: String| crate::target_line(&mut t, &mut met, ok, &what);
    verdict(
        mg.idle.rss <= IDLE_TARGET,
        format!("idle VmRSS {:.1} MiB <= 16 MiB", mib(mg.idle.rss)),
    );
    verdict(
        load_max <= LOAD_TARGET,
        format!("VmRSS under load {:.1} MiB <= 64 MiB", mib(load_max)),
    );
    verdict(
        drained.is_some_and(|s| s <= DRAIN_TARGET.as_secs_f64()),
        format!(
            "no pool block outstanding within 10 s of the (NON) load stopping ({})",
            drained
                .map(|s| format!("after {s:.1} s"))
                .unwrap_or_else(|| "never reached 0".into())
        ),
    );
    verdict(mg.clean_exit, "clean exit on SIGTERM".into());
    Ok(Summary {
        lab: "footprint",
        table: t,
        files: vec![csv_path, log],
        target_met: Some(met),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_and_exposition_parsing() {
        let m = parse_status(
            "Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\nRssAnon:\t 512 kB\nThreads:\t7\n",
        );
        assert_eq!(
            m,
            ProcMem {
                rss: 1 << 20,
                hwm: 2 << 20,
                anon: 1 << 19,
                threads: 7
            }
        );
        let text = "# TYPE a gauge\na{s=\"1\"} 2\na{s=\"2\"} 3.5\nab 100\na_total 9\n";
        assert_eq!(sum_family(text, "a"), Some(5.5));
        assert_eq!(sum_family(text, "zz"), None);
    }

    #[test]
    fn own_status_is_readable() {
        let m = proc_mem(std::process::id()).unwrap();
        assert!(
            m.rss > 0 && m.hwm >= m.rss && m.anon > 0 && m.anon <= m.rss && m.threads >= 1,
            "{m:?}"
        );
    }
}
