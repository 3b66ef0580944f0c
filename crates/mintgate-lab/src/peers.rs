//! The servers the comparison labs (`clients`, `blocksize`) put side by
//! side: mintgate with the VTA pool, mintgate with a fixed pool sized to the
//! cores (the paper's MinT), and libcoap's `coap-server-notls` as the
//! third-party peer (the paper compared Californium; libcoap is the C peer
//! every Debian machine has).
//!
//! Every server starts fresh for each measurement: libcoap slows down as the
//! sessions of earlier clients pile up, and a gateway's VTA history would
//! carry over between steps.

use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use mintgate_gateway::config::{HandlerCost, PoolMode};

use crate::{lab_config, LabGateway};

/// Which server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerKind {
    /// mintgate, VTA-sized handler pool (the paper's MinT-I).
    MintgateVta,
    /// mintgate, a fixed pool of as many handlers as cores (the paper's
    /// MinT).
    MintgateFixed,
    /// libcoap's coap-server-notls.
    Libcoap,
}

impl ServerKind {
    /// Name for tables and CSVs.
    pub fn name(self) -> &'static str {
        match self {
            ServerKind::MintgateVta => "mintgate_vta",
            ServerKind::MintgateFixed => "mintgate_fixed",
            ServerKind::Libcoap => "libcoap",
        }
    }
}

/// Whether libcoap's server and client are installed.
pub fn libcoap_available() -> bool {
    ["coap-server-notls", "coap-client-notls"].iter().all(|b| {
        Command::new(b)
            .arg("-h")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok()
    })
}

/// The Californium peer's jar (`peers/californium`, a Californium 3 server
/// answering GET /request with `hello world`): `MINTGATE_CALIFORNIUM_JAR`
/// when set, otherwise built from the source tree (see [`peer_jar`]).
pub fn californium_jar(progress: &crate::ProgressFn) -> anyhow::Result<PathBuf> {
    peer_jar(
        "californium",
        "cf-hello.jar",
        "MINTGATE_CALIFORNIUM_JAR",
        progress,
    )
}

/// The Eclipse Paho peer's jar (`peers/paho`, paper 004's Fig. 5 with the
/// paper's own MQTT client): `MINTGATE_PAHO_JAR` when set, otherwise built
/// from the source tree (see [`peer_jar`]).
pub fn paho_jar(progress: &crate::ProgressFn) -> anyhow::Result<PathBuf> {
    peer_jar("paho", "paho-fig5.jar", "MINTGATE_PAHO_JAR", progress)
}

/// A Java peer's jar: the file named by the environment variable `env` when
/// set, otherwise `peers/NAME/target/JAR` of the source tree found above the
/// working folder or the executable, built with `mvn -q package` when
/// missing or older than its sources. An error says why there is none (no
/// source tree, no Maven, a failed build).
fn peer_jar(
    name: &str,
    jar_name: &str,
    env: &str,
    progress: &crate::ProgressFn,
) -> anyhow::Result<PathBuf> {
    if let Some(j) = std::env::var_os(env) {
        let j = PathBuf::from(j);
        anyhow::ensure!(j.is_file(), "{env}={} is not a file", j.display());
        return Ok(j);
    }
    let starts = [
        std::env::current_dir().ok(),
        std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(Path::to_path_buf)),
    ];
    let sub = format!("peers/{name}");
    let dir = starts
        .iter()
        .flatten()
        .flat_map(|d| d.ancestors())
        .map(|d| d.join(&sub))
        .find(|d| d.join("pom.xml").is_file())
        .with_context(|| format!("no {sub}/pom.xml above the working folder or the executable"))?;
    let jar = dir.join("target").join(jar_name);
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let newest_source = walk_files(&dir.join("src"))
        .into_iter()
        .chain([dir.join("pom.xml")])
        .filter_map(|p| modified(&p))
        .max();
    if modified(&jar).is_some_and(|j| newest_source.is_none_or(|s| j >= s)) {
        return Ok(jar);
    }
    progress(&format!(
        "building the {name} peer: mvn -q -f {}/pom.xml package",
        dir.display()
    ));
    let out = Command::new("mvn")
        .args(["-q", "-B", "-f"])
        .arg(dir.join("pom.xml"))
        .arg("package")
        .stdin(Stdio::null())
        .output()
        .context("running mvn (Maven)")?;
    anyhow::ensure!(
        out.status.success() && jar.is_file(),
        "mvn package failed: {}",
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .chain(String::from_utf8_lossy(&out.stderr).lines())
            .filter(|l| l.contains("ERROR"))
            .take(3)
            .collect::<Vec<_>>()
            .join(" / ")
    );
    Ok(jar)
}

fn walk_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// A running server; stopped on drop.
pub enum Running {
    /// In-process gateway (held only to be dropped at the end).
    Gateway(#[allow(dead_code)] Box<LabGateway>),
    /// A child process.
    Process(Child),
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Running::Process(c) = self {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The cores of this machine.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// A free UDP port on loopback (bound, read and released).
fn free_port() -> anyhow::Result<u16> {
    Ok(UdpSocket::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Starts `kind` on loopback serving `resource` (a path without the leading
/// slash) with `payload` as its GET answer; returns it and its address.
///
/// mintgate serves `request` ("hello world") and `echo` (GET returns what a
/// PUT stored) itself; other payloads go to `echo` by a PUT. libcoap
/// creates the resource from a PUT (`-d 10` allows dynamic resources).
pub fn start(
    kind: ServerKind,
    cost: HandlerCost,
    resource: &str,
    payload: &[u8],
) -> anyhow::Result<(Running, SocketAddr)> {
    let (running, addr) = match kind {
        ServerKind::MintgateVta | ServerKind::MintgateFixed => {
            let pool = if kind == ServerKind::MintgateVta {
                PoolMode::Vta
            } else {
                PoolMode::Fixed(cores())
            };
            let g = LabGateway::start(lab_config(pool, cost, 600))?;
            let a = g.addr;
            (Running::Gateway(Box::new(g)), a)
        }
        ServerKind::Libcoap => {
            let port = free_port()?;
            let child = Command::new("coap-server-notls")
                .args(["-A", "127.0.0.1", "-p", &port.to_string(), "-d", "10"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting coap-server-notls (Debian package libcoap3-bin)")?;
            (
                Running::Process(child),
                SocketAddr::from(([127, 0, 0, 1], port)),
            )
        }
    };
    let needs_put = kind == ServerKind::Libcoap || resource != "request";
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        if needs_put {
            put(addr, resource, payload);
        }
        if get(addr, resource).as_deref() == Some(payload) {
            return Ok((running, addr));
        }
        anyhow::ensure!(
            Instant::now() < end,
            "{} did not serve /{resource} within 10 s",
            kind.name()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// One CON exchange with mintgate's own client on a blocking socket.
fn exchange(
    addr: SocketAddr,
    code: mintgate_coap::wire::Code,
    path: &str,
    payload: &[u8],
) -> Option<Vec<u8>> {
    use mintgate_coap::client::{Client, ClientConfig, Event, Request};
    use mintgate_coap::rto::{Algorithm, TransmissionParams};
    use mintgate_coap::wire::OptionNumber;
    let sock = UdpSocket::bind("127.0.0.1:0").ok()?;
    let params = TransmissionParams::default();
    let mut c = Client::new(
        ClientConfig::new(params),
        Algorithm::Basic.controller(params, 1),
        1,
    );
    let options = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(|s| (OptionNumber::URI_PATH, s.as_bytes().to_vec()))
        .collect();
    c.request(
        Instant::now(),
        addr,
        Request {
            confirmable: true,
            code,
            options,
            payload: payload.to_vec(),
        },
    )
    .ok()?;
    let end = Instant::now() + Duration::from_secs(3);
    let mut buf = [0u8; 2048];
    while Instant::now() < end {
        while let Some(t) = c.poll_transmit(Instant::now()) {
            sock.send_to(&t.bytes, t.dest).ok()?;
        }
        if let Some(ev) = c.poll_event() {
            return match ev {
                Event::Response { payload, .. } => Some(payload.to_vec()),
                _ => None,
            };
        }
        sock.set_read_timeout(Some(Duration::from_millis(50)))
            .ok()?;
        match sock.recv_from(&mut buf) {
            Ok((n, from)) => c.handle_datagram(Instant::now(), from, &buf[..n]),
            Err(_) => c.handle_timeout(Instant::now()),
        }
    }
    None
}

fn put(addr: SocketAddr, path: &str, payload: &[u8]) {
    let _ = exchange(addr, mintgate_coap::wire::Code::PUT, path, payload);
}

fn get(addr: SocketAddr, path: &str) -> Option<Vec<u8>> {
    exchange(addr, mintgate_coap::wire::Code::GET, path, &[])
}
