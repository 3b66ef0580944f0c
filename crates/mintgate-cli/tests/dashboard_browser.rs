//! The dashboard in a real browser: headless Chromium (Debian's `chromium`,
//! installed by scripts/test.sh) loads `/` from a running `mintgate serve`
//! while `mintgate bench` loads it, and the page's live figures are read
//! from the DOM Chromium rendered. They must change between two reads and
//! match what the metrics endpoint says (the Observer samples once a second:
//! the page's per-second figures are compared with the sample of the same
//! time, its totals with /metrics read just before and just after). A
//! screenshot is saved under target/ (`target/tmp/dashboard.png`).
//!
//! Without Chromium the test is skipped with a message, unless
//! MINTGATE_REQUIRE_PEERS is set, in which case it fails.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_mintgate");

fn chromium() -> Option<PathBuf> {
    for name in ["chromium", "chromium-browser"] {
        for dir in std::env::var("PATH").unwrap_or_default().split(':') {
            let p = Path::new(dir).join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
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

/// A child process killed on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One HTTP/1.0 GET (no chunked encoding); the body.
fn http_get(port: u16, path: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read the answer");
    let (head, body) = out.split_once("\r\n\r\n").expect("a complete answer");
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    body.to_owned()
}

/// The value of a Prometheus sample without labels.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} "))?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} is not in /metrics"))
}

/// Attribute `name` of the element whose id is `id`, in serialized HTML.
fn attr(dom: &str, id: &str, name: &str) -> Option<String> {
    let at = dom.find(&format!("id=\"{id}\""))?;
    let start = dom[..at].rfind('<')?;
    let end = at + dom[at..].find('>')?;
    let tag = &dom[start..end];
    let k = tag.find(&format!(" {name}=\""))? + name.len() + 3;
    Some(tag[k..k + tag[k..].find('"')?].to_owned())
}

fn num(dom: &str, id: &str, name: &str) -> f64 {
    attr(dom, id, name)
        .unwrap_or_else(|| panic!("#{id} has no {name} in the page:\n{dom}"))
        .parse()
        .unwrap_or_else(|e| panic!("#{id} {name}: {e}"))
}

/// The text inside the element whose id is `id` (tags stripped).
fn text(dom: &str, id: &str) -> String {
    let at = dom.find(&format!("id=\"{id}\"")).expect("the element");
    let from = at + dom[at..].find('>').unwrap() + 1;
    let mut out = String::new();
    let mut in_tag = false;
    let mut depth = 0i32;
    let rest = &dom[from..];
    let mut i = 0;
    while i < rest.len() {
        let c = rest[i..].chars().next().unwrap();
        if c == '<' {
            if rest[i..].starts_with("</") {
                if depth == 0 {
                    break;
                }
                depth -= 1;
            } else {
                depth += 1;
            }
            in_tag = true;
        } else if c == '>' {
            in_tag = false;
            out.push(' ');
        } else if !in_tag {
            out.push(c);
        }
        i += c.len_utf8();
    }
    out
}

/// Runs Chromium headless on `url` with `args`, giving the page's script
/// `budget_ms` of virtual time; returns stdout. Bounded to 30 s.
fn run_chromium(bin: &Path, profile: &Path, url: &str, args: &[&str], budget_ms: u32) -> String {
    let mut child = Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            "--hide-scrollbars",
            "--window-size=1280,1100",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--virtual-time-budget={budget_ms}"))
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting chromium");
    let mut out = String::new();
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let _ = stdout.read_to_string(&mut out);
        out
    });
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            assert!(st.success(), "chromium exited with {st}");
            break;
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium took over 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    reader.join().unwrap()
}

/// The page's figures in one read, with /metrics just before and after.
struct PageRead {
    dom: String,
    handled_before: f64,
    handled_after: f64,
    observer: serde_json::Value,
}

#[test]
fn dashboard_shows_live_figures_that_match_the_metrics() {
    let Some(chrome) = chromium() else {
        if std::env::var_os("MINTGATE_REQUIRE_PEERS").is_some() {
            panic!("chromium is not installed and MINTGATE_REQUIRE_PEERS is set (scripts/test.sh installs it)");
        }
        eprintln!(
            "skipping: chromium is not installed (apt-get install chromium; scripts/test.sh does)"
        );
        return;
    };
    let started = Instant::now();
    let work = std::env::temp_dir().join(format!("mintgate-dashboard-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();

    // the gateway, with the HTTP proxy (and so the dashboard) and metrics
    let (mut coap, mut http, mut metrics) = (0, 0, 0);
    let mut gw = None;
    for _ in 0..5 {
        (coap, http, metrics) = (free_udp(), free_tcp(), free_tcp());
        let mut p = Proc(
            Command::new(BIN)
                .current_dir(&work)
                .args(["serve", "--log", "warn"])
                .args(["--coap", &format!("127.0.0.1:{coap}")])
                .args(["--http", &format!("127.0.0.1:{http}")])
                .args(["--metrics", &format!("127.0.0.1:{metrics}")])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawning mintgate serve"),
        );
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end && p.0.try_wait().unwrap().is_none() {
            if TcpStream::connect(("127.0.0.1", http)).is_ok()
                && TcpStream::connect(("127.0.0.1", metrics)).is_ok()
            {
                gw = Some(p);
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if gw.is_some() {
            break;
        }
    }
    let _gw = gw.expect("mintgate serve came up");

    // one request through the proxy, so that its section has a count
    let body = http_get(http, &format!("/hc/coap://127.0.0.1:{coap}/sensors/temp0"));
    assert!(
        body.trim().parse::<f64>().is_ok(),
        "temp0 through the proxy: {body}"
    );

    // load: 20 clients x 250 requests/s, open loop, bounded to 25 s
    let _bench = Proc(
        Command::new(BIN)
            .args(["bench", &format!("coap://127.0.0.1:{coap}/request")])
            .args(["--non", "--clients", "20", "--rate", "250"])
            .args(["--duration", "25s", "--warmup", "0s", "--log", "warn"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawning mintgate bench"),
    );
    // wait (bounded) for a second of samples with the load in it
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let o: serde_json::Value =
            serde_json::from_str(&http_get(metrics, "/api/observer")).unwrap();
        let r = o["samples"]
            .as_array()
            .and_then(|s| s.last())
            .map_or(0, |s| s["r"].as_u64().unwrap_or(0));
        if r > 0 {
            break;
        }
        assert!(Instant::now() < end, "no load reached the gateway: {o}");
        std::thread::sleep(Duration::from_millis(100));
    }

    let url = format!("http://127.0.0.1:{http}/");
    let read = || {
        let handled_before = metric(&http_get(metrics, "/metrics"), "mintgate_htp_handled_total");
        let dom = run_chromium(&chrome, &work.join("profile"), &url, &["--dump-dom"], 2500);
        let handled_after = metric(&http_get(metrics, "/metrics"), "mintgate_htp_handled_total");
        let observer = serde_json::from_str(&http_get(metrics, "/api/observer")).unwrap();
        PageRead {
            dom,
            handled_before,
            handled_after,
            observer,
        }
    };
    let check = |r: &PageRead| {
        let dom = &r.dom;
        // the page polled more than once without being reloaded
        let body_updates: f64 = dom
            .split("data-updates=\"")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .and_then(|s| s.parse().ok())
            .expect("body data-updates");
        assert!(
            body_updates >= 2.0,
            "the page updated {body_updates} time(s)"
        );
        // totals: between /metrics read before and after the page's read
        let handled = num(dom, "handled-total", "data-raw");
        assert!(
            r.handled_before <= handled && handled <= r.handled_after,
            "page says {handled} handled; /metrics said {} before, {} after",
            r.handled_before,
            r.handled_after
        );
        // per-second figures: the Observer's sample of the same second
        let t = num(dom, "nr-rate", "data-t");
        let sample = r.observer["samples"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| (s["t"].as_f64().unwrap() - t).abs() < 1e-6)
            .unwrap_or_else(|| panic!("no Observer sample at t = {t}: {}", r.observer));
        for (id, key) in [("nr-rate", "r"), ("htp-rate", "h"), ("drops", "dropped")] {
            assert_eq!(
                num(dom, id, "data-raw"),
                sample[key].as_f64().unwrap(),
                "#{id} against the Observer's sample at t = {t}"
            );
        }
        assert!(num(dom, "nr-rate", "data-raw") > 0.0, "the load shows");
        assert!(num(dom, "threads", "data-raw") >= 1.0);
        // sections: devices with a value, the proxy's count, MQTT absent
        let devices = text(dom, "devices");
        assert!(devices.contains("/sensors/temp0"), "{devices}");
        assert!(devices.contains("Cel"), "temp0's latest value: {devices}");
        assert_eq!(num(dom, "proxy-table", "data-requests"), 1.0);
        assert!(text(dom, "mqtt").contains("not enabled"));
        (handled, t)
    };

    let first = read();
    let (h1, t1) = check(&first);
    // The second read must come after a newer Observer sample: two reads
    // can fall within one sampling second on a fast machine.
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let o: serde_json::Value =
            serde_json::from_str(&http_get(metrics, "/api/observer")).unwrap();
        let last = o["samples"]
            .as_array()
            .and_then(|s| s.last())
            .map_or(0.0, |s| s["t"].as_f64().unwrap_or(0.0));
        if last > t1 + 0.5 {
            break;
        }
        assert!(
            Instant::now() < end,
            "no new Observer sample after t = {t1}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let second = read();
    let (h2, t2) = check(&second);
    assert!(h2 > h1, "handled in all did not change: {h1} then {h2}");
    assert!(
        t2 > t1,
        "the per-second figures did not move on: t {t1} then {t2}"
    );
    assert_eq!(
        metric(
            &http_get(metrics, "/metrics"),
            "mintgate_proxy_requests_total"
        ),
        1.0
    );

    // the same page, as a person sees it
    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png");
    let _ = std::fs::remove_file(&shot);
    run_chromium(
        &chrome,
        &work.join("profile"),
        &url,
        &[&format!("--screenshot={}", shot.display())],
        3000,
    );
    let png = std::fs::read(&shot).expect("the screenshot was written");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 20_000,
        "{} bytes",
        png.len()
    );
    eprintln!(
        "dashboard: {h1} then {h2} handled, screenshot {} ({:.1} s)",
        shot.display(),
        started.elapsed().as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&work);
}
