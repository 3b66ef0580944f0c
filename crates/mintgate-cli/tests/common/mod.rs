//! Helpers shared by the tests that run `mintgate serve` as a process
//! (access.rs, faults.rs, listeners.rs).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_mintgate");

pub fn free_udp() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn free_tcp() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A loopback port where nothing listens (UDP or TCP), chosen below the
/// kernel's ephemeral range: a test that binds port 0 elsewhere in the
/// suite, running at the same time, cannot be handed it.
pub fn closed_port(tcp: bool) -> u16 {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    // spread over the range below it, away from the well-known ports
    let span = low.saturating_sub(20_000).max(1);
    let start = 20_000 + (std::process::id() as u16 % span);
    (0..span)
        .map(|i| 20_000 + (start - 20_000 + i) % span)
        .find(|&p| {
            if tcp {
                TcpListener::bind(("127.0.0.1", p)).is_ok()
            } else {
                UdpSocket::bind(("127.0.0.1", p)).is_ok()
            }
        })
        .expect("a free port below the ephemeral range")
}

/// A fresh, empty folder under the temporary directory.
pub fn tmp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mintgate-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Writes `DIR/gw.toml`: CoAP on 127.0.0.1:`coap`, then `rest`.
pub fn write_config(dir: &Path, coap: u16, rest: &str) -> PathBuf {
    let p = dir.join("gw.toml");
    std::fs::write(&p, format!("[coap]\nbind = [\"127.0.0.1:{coap}\"]\n{rest}")).unwrap();
    p
}

/// A `mintgate serve` child, killed (SIGKILL) on drop.
pub struct Serve {
    pub child: Child,
    pub log: PathBuf,
}

impl Serve {
    /// Starts `mintgate serve -c config` with its log in `log`.
    pub fn start(config: &Path, log: &Path, extra: &[&str]) -> Serve {
        let child = Command::new(BIN)
            .args(["--log", "info", "serve", "-c"])
            .arg(config)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .expect("start mintgate serve");
        Serve {
            child,
            log: log.to_path_buf(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until GET /request on `coap` is answered; panics with the log
    /// if the process exits or `limit` passes first.
    pub fn wait_coap(&mut self, coap: SocketAddr, limit: Duration) {
        let end = Instant::now() + limit;
        while Instant::now() < end {
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("serve exited ({st}) early:\n{}", self.log_text());
            }
            if coap_get(coap, "request").is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "serve did not answer within {limit:?}:\n{}",
            self.log_text()
        );
    }

    /// Waits until the log holds `needle`; panics with the log otherwise.
    pub fn wait_log(&mut self, needle: &str, limit: Duration) {
        let end = Instant::now() + limit;
        while Instant::now() < end {
            if self.log_text().contains(needle) {
                return;
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("serve exited ({st}) early:\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "no {needle:?} in the log within {limit:?}:\n{}",
            self.log_text()
        );
    }

    /// SIGKILL, and reaps it.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM; true when it exited cleanly within `limit`.
    pub fn terminate(&mut self, limit: Duration) -> bool {
        // SAFETY: signalling our own child by its pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let end = Instant::now() + limit;
        while Instant::now() < end {
            if let Ok(Some(st)) = self.child.try_wait() {
                return st.success();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One CON GET of `path` (a single segment or `a/b`); the payload of a
/// 2.xx answer.
pub fn coap_get(to: SocketAddr, path: &str) -> Option<Vec<u8>> {
    let s = UdpSocket::bind("127.0.0.1:0").ok()?;
    s.connect(to).ok()?;
    s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
    let mut m = vec![0x42, 0x01, 0x12, 0x34, 0xAB, 0xCD];
    let mut last = 0u8;
    for seg in path.split('/') {
        let delta = 11 - last;
        last = 11;
        assert!(seg.len() < 13, "short segments only");
        m.push((delta << 4) | seg.len() as u8);
        m.extend_from_slice(seg.as_bytes());
    }
    s.send(&m).ok()?;
    let mut b = [0u8; 2048];
    let n = s.recv(&mut b).ok()?;
    let code = b[1];
    if n < 4 || code >> 5 != 2 {
        return None;
    }
    let pl = b[..n].iter().position(|&x| x == 0xFF).map(|i| i + 1)?;
    Some(b[pl..n].to_vec())
}

/// Runs `mintgate ARGS`.
pub fn mintgate(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run mintgate")
}

/// One HTTP/1.1 request with `Connection: close`; (status, head, body).
pub fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // Host: 127.0.0.1 unless the caller gives one
    let host = if headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        ""
    } else {
        "Host: 127.0.0.1\r\n"
    };
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\n{host}Connection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let out = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, head.to_owned(), body.to_owned())
}

/// The value of the Prometheus sample `name` (with its labels, as written).
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} "))?.trim().parse().ok())
}

/// target/py-venv's Python (scripts/test.sh makes it) when `module`
/// imports in it; else `None` (the caller skips), or a failure under
/// MINTGATE_REQUIRE_PEERS.
pub fn venv_python(module: &str) -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/py-venv/bin/python");
    let ok = Command::new(&p)
        .args(["-c", &format!("import {module}")])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("MINTGATE_REQUIRE_PEERS").is_none(),
            "{module} is required (MINTGATE_REQUIRE_PEERS is set) but target/py-venv has none"
        );
        eprintln!("skipping: {module} is not in target/py-venv (scripts/test.sh installs it)");
        return None;
    }
    Some(p)
}

/// target/py-venv/bin/NAME, an aiocoap command, when aiocoap has its
/// OSCORE extra there; else as [`venv_python`] says.
pub fn aiocoap_bin(name: &str) -> Option<PathBuf> {
    let py = venv_python("aiocoap.oscore, cbor2, filelock")?;
    let bin = py.with_file_name(name);
    if bin.exists() {
        return Some(bin);
    }
    assert!(
        std::env::var_os("MINTGATE_REQUIRE_PEERS").is_none(),
        "{name} is required (MINTGATE_REQUIRE_PEERS is set) but not in target/py-venv"
    );
    eprintln!("skipping: {name} is not in target/py-venv (scripts/test.sh installs it)");
    None
}

/// A peer server written in Python (tests/SCRIPT with the port and
/// `args`), killed on drop. It prints `ready` once it serves, then answers
/// each command line with one line.
pub struct PyPeer {
    child: Child,
    stdin: std::process::ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
    pub port: u16,
}

impl PyPeer {
    /// On `port`, or on a free one (tried a few times: a port found free
    /// may be taken before the server binds it).
    pub fn start(py: &Path, script: &str, port: Option<u16>, args: &[&str]) -> PyPeer {
        use std::io::BufRead;
        for _ in 0..5 {
            let port = port.unwrap_or_else(free_tcp);
            let mut child = Command::new(py)
                .arg(
                    Path::new(env!("CARGO_MANIFEST_DIR"))
                        .join("tests")
                        .join(script),
                )
                .arg(port.to_string())
                .args(args)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("start {script}: {e}"));
            let out = child.stdout.take().unwrap();
            let (tx, lines) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                    if tx.send(l).is_err() {
                        break;
                    }
                }
            });
            let stdin = child.stdin.take().unwrap();
            let p = PyPeer {
                child,
                stdin,
                lines,
                port,
            };
            if p.lines.recv_timeout(Duration::from_secs(20)).as_deref() == Ok("ready") {
                return p;
            }
        }
        panic!("{script} did not start");
    }

    /// Sends one command; its answer.
    pub fn cmd(&mut self, c: &str) -> String {
        writeln!(self.stdin, "{c}").unwrap();
        self.lines
            .recv_timeout(Duration::from_secs(10))
            .expect("an answer from the peer")
    }
}

impl Drop for PyPeer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `f`'s first `Some`, tried every 20 ms for at most `limit`.
pub fn wait_until<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if let Some(v) = f() {
            return Some(v);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// A payload as text.
pub fn text(b: Option<Vec<u8>>) -> Option<String> {
    b.map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// `mintgate observe URI --json` for at most 15 s; its lines with the
/// instants they came (kill the child when done).
pub fn observe(uri: &str) -> (Child, std::sync::mpsc::Receiver<(Instant, String)>) {
    use std::io::BufRead;
    let mut obs = Command::new(BIN)
        .args(["observe", uri, "--json", "--duration", "15s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, notes) = std::sync::mpsc::channel();
    let out = obs.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send((Instant::now(), l));
        }
    });
    (obs, notes)
}

/// The dashboard's `link` (field-device connection state) of device
/// `name`, from `/api/state` on the metrics listener.
pub fn field_link(metrics: u16, name: &str) -> serde_json::Value {
    let (_, _, state) = http(metrics, "GET", "/api/state", &[], b"");
    let v: serde_json::Value = serde_json::from_str(&state).unwrap();
    v["devices"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == name)
        .unwrap_or_else(|| panic!("no device {name} in {v}"))["link"]
        .clone()
}

/// Whether `cmd` (a peer no one here wrote, `what` says which package)
/// runs; when it does not, the test is skipped, unless
/// MINTGATE_REQUIRE_PEERS is set: then it fails.
pub fn have_command(cmd: &str, what: &str) -> bool {
    let found = Command::new(cmd)
        .arg("-h")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !found {
        assert!(
            std::env::var_os("MINTGATE_REQUIRE_PEERS").is_none(),
            "{cmd} is required (MINTGATE_REQUIRE_PEERS is set) but not on PATH"
        );
        eprintln!("skipping: {cmd} ({what}) is not on PATH");
    }
    found
}

/// Waits until something accepts TCP connections on loopback `port`;
/// panics after `limit`.
pub fn wait_tcp(port: u16, limit: Duration) {
    let end = Instant::now() + limit;
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < end, "nothing listens on tcp {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A child process killed and reaped when dropped (a peer server a test
/// started).
pub struct Kill(pub Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A finished command's status, stdout and stderr, for assertion messages.
pub fn output_text(o: &Output) -> String {
    format!(
        "status {:?}, stdout {:?}, stderr {:?}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
