//! Third-party clients against `mintgate serve --http ADDR --h3 ADDR`:
//! curl for HTTP/1.1 and HTTP/2 (prior knowledge), and aioquic (Python,
//! installed by scripts/test.sh into target/py-venv) for HTTP/3 with 0-RTT.
//!
//! Each test starts its own gateway with the proxy in a temporary working
//! folder (where the self-signed certificate is generated) and kills it when
//! done. Without curl (or its HTTP/2 support) or the aioquic venv the tests
//! are skipped with a message, unless MINTGATE_REQUIRE_PEERS is set, in
//! which case they fail.

use std::net::{TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_mintgate");

fn require_or_skip(what: &str, why: &str) -> bool {
    if std::env::var_os("MINTGATE_REQUIRE_PEERS").is_some() {
        panic!("{what} is unavailable and MINTGATE_REQUIRE_PEERS is set: {why}");
    }
    eprintln!("skipping: {what} is unavailable ({why})");
    false
}

/// A running `mintgate serve` with the proxy, killed on drop.
struct Gateway {
    child: Child,
    coap: u16,
    http: u16,
    h3: u16,
    dir: PathBuf,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_udp() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn free_tcp() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Gateway {
    fn start(tag: &str) -> Gateway {
        let dir =
            std::env::temp_dir().join(format!("mintgate-interop-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // an open gateway: curl writes through the proxy, which counts as
        // remote (by default only loopback clients may write)
        let cfg = dir.join("open.toml");
        std::fs::write(&cfg, "[access]\nwrite = \"open\"\n").unwrap();
        // A port found free may be taken before the gateway binds it: retry.
        for _ in 0..5 {
            let (coap, http, h3) = (free_udp(), free_tcp(), free_udp());
            let child = Command::new(BIN)
                .current_dir(&dir)
                .args([
                    "serve",
                    "--config",
                    cfg.to_str().unwrap(),
                    "--coap",
                    &format!("127.0.0.1:{coap}"),
                    "--http",
                    &format!("127.0.0.1:{http}"),
                    "--h3",
                    &format!("127.0.0.1:{h3}"),
                    "--log",
                    "warn",
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawning mintgate serve");
            let mut g = Gateway {
                child,
                coap,
                http,
                h3,
                dir: dir.clone(),
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if g.child.try_wait().ok().flatten().is_some() {
                    break;
                }
                if std::net::TcpStream::connect(("127.0.0.1", http)).is_ok()
                    && dir.join("mintgate-tls/cert.pem").exists()
                {
                    return g;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = g.child.kill();
            // Keep the folder for the next attempt.
            g.dir = PathBuf::from("/nonexistent-mintgate-dir");
        }
        panic!("mintgate serve with the proxy did not come up");
    }

    fn url(&self, path: &str) -> String {
        format!(
            "http://127.0.0.1:{}/hc/coap://127.0.0.1:{}{path}",
            self.http, self.coap
        )
    }

    fn cert(&self) -> PathBuf {
        self.dir.join("mintgate-tls/cert.pem")
    }
}

fn curl_features() -> Option<String> {
    let out = Command::new("curl").arg("--version").output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs curl; returns (status line, headers+body text).
fn curl(args: &[&str]) -> String {
    let out = Command::new("curl")
        .args(["-s", "-i", "--max-time", "10"])
        .args(args)
        .output()
        .expect("running curl");
    assert!(out.status.success(), "curl {args:?} failed: {out:?}");
    String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n")
}

#[test]
fn curl_http1_and_http2() {
    let Some(features) = curl_features() else {
        require_or_skip("curl", "not on PATH (apt-get install curl)");
        return;
    };
    let gw = Gateway::start("curl");
    // HTTP/1.1: GET, PUT then GET on /echo, a forbidden upstream, a bad target.
    let r = curl(&[&gw.url("/request")]);
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(r.contains("content-type: text/plain; charset=utf-8"), "{r}");
    assert!(r.contains("server-timing: coap;dur="), "{r}");
    assert!(r.ends_with("\nhello world"), "{r}");
    let r = curl(&[
        "-X",
        "PUT",
        "-H",
        "content-type: text/plain",
        "--data-binary",
        "stored by curl",
        &gw.url("/echo"),
    ]);
    assert!(
        r.starts_with("HTTP/1.1 204") || r.starts_with("HTTP/1.1 200"),
        "{r}"
    );
    let r = curl(&["-H", "cache-control: no-cache", &gw.url("/echo")]);
    assert!(r.ends_with("\nstored by curl"), "{r}");
    // a stale If-Match: 412, and nothing is stored
    let r = curl(&[
        "-X",
        "PUT",
        "-H",
        "if-match: \"00000000\"",
        "-H",
        "content-type: text/plain",
        "--data-binary",
        "not stored",
        &gw.url("/echo"),
    ]);
    assert!(r.starts_with("HTTP/1.1 412"), "{r}");
    // larger than one CoAP message both ways: up in Block1, back in Block2
    let big: String = (0..5000).map(|i| (b'a' + (i % 26) as u8) as char).collect();
    let file = gw.dir.join("big.txt");
    std::fs::write(&file, &big).unwrap();
    let r = curl(&[
        "-X",
        "PUT",
        "-H",
        "content-type: text/plain",
        "--data-binary",
        &format!("@{}", file.display()),
        &gw.url("/echo"),
    ]);
    assert!(
        r.starts_with("HTTP/1.1 204") || r.starts_with("HTTP/1.1 200"),
        "{r}"
    );
    let r = curl(&["-H", "cache-control: no-cache", &gw.url("/echo")]);
    assert!(r.starts_with("HTTP/1.1 200"), "{}", &r[..r.len().min(300)]);
    assert!(
        r.ends_with(&format!("\n{big}")),
        "{}",
        &r[..r.len().min(300)]
    );
    let other = format!(
        "http://127.0.0.1:{}/hc/coap://127.0.0.1:{}/request",
        gw.http,
        gw.coap + 1
    );
    let r = curl(&[&other]);
    assert!(r.starts_with("HTTP/1.1 403"), "{r}");
    let r = curl(&[&format!(
        "http://127.0.0.1:{}/hc/coaps://127.0.0.1/x",
        gw.http
    )]);
    assert!(r.starts_with("HTTP/1.1 501"), "{r}");
    let r = curl(&[&gw.url("/no-such-resource")]);
    assert!(r.starts_with("HTTP/1.1 404"), "{r}");

    // HTTP/2 with prior knowledge (h2c).
    if !features.contains("HTTP2") {
        require_or_skip(
            "curl --http2-prior-knowledge",
            "this curl was built without HTTP/2",
        );
        return;
    }
    let r = curl(&["--http2-prior-knowledge", &gw.url("/request")]);
    assert!(r.starts_with("HTTP/2 200"), "{r}");
    assert!(r.ends_with("\nhello world"), "{r}");
    let r = curl(&[
        "--http2-prior-knowledge",
        "-X",
        "POST",
        "-H",
        "content-type: text/plain",
        "--data-binary",
        "ping",
        &gw.url("/echo"),
    ]);
    assert!(r.starts_with("HTTP/2 200"), "{r}");
    assert!(r.ends_with("\nping"), "{r}");
}

fn venv_python() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("MINTGATE_PYTHON") {
        return Some(PathBuf::from(p));
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let p = root.join("target/py-venv/bin/python");
    p.exists().then_some(p)
}

#[test]
fn aioquic_http3_with_0rtt() {
    let Some(py) = venv_python() else {
        require_or_skip("aioquic", "no target/py-venv (scripts/test.sh installs it: python3 -m venv target/py-venv && target/py-venv/bin/pip install aioquic)");
        return;
    };
    let ok = Command::new(&py)
        .args(["-c", "import aioquic"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        require_or_skip("aioquic", "the venv's python cannot import aioquic");
        return;
    }
    let gw = Gateway::start("aioquic");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/h3_aioquic_client.py");
    let path = format!("/hc/coap://127.0.0.1:{}/request", gw.coap);
    let out = Command::new(&py)
        .arg(&script)
        .args(["127.0.0.1", &gw.h3.to_string()])
        .arg(gw.cert())
        .arg(&path)
        .output()
        .expect("running the aioquic client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "aioquic client failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line {l:?}: {e}")))
        .collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    // 1: full handshake, GET served.
    assert_eq!(lines[0]["status"], 200, "{stdout}");
    assert_eq!(lines[0]["body"], "hello world");
    // 2: resumed, GET as 0-RTT early data, accepted and served.
    assert_eq!(lines[1]["status"], 200, "{stdout}");
    assert_eq!(lines[1]["body"], "hello world");
    assert_eq!(
        lines[1]["early_data"], true,
        "the server should accept 0-RTT: {stdout}"
    );
    // 3: resumed, POST as early data: 425 Too Early.
    assert_eq!(lines[2]["early_data"], true, "{stdout}");
    assert_eq!(
        lines[2]["status"], 425,
        "an unsafe method in early data: {stdout}"
    );
}
