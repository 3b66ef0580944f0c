//! `mintgate lab all`: every lab in turn, and one self-contained
//! `report.html` with each lab's figures (SVG inlined as data URIs), its
//! table of our figures beside the paper's, its CSV data, and a summary of
//! the targets met or missed.
//!
//! A lab that fails (an error or a panic) is reported as failed and the
//! others still run; a lab whose needs are missing (root for network
//! namespaces, a peer program) is reported as skipped, with why.
//! [`run_labs`] and [`write_report`] take any list of [`LabJob`]s, so a test
//! can put a cheap subset through the same code as [`all_labs`].

use std::fmt::Write as _;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use crate::{LabOptions, ProgressFn, Summary};

/// One lab to run.
pub struct LabJob {
    /// Its name (`threads`, `proxy`).
    pub name: &'static str,
    /// What it reproduces (`paper 000, Figs. 2-5`).
    pub paper: &'static str,
    /// Why it cannot run here, if it cannot.
    pub skip: Option<String>,
    /// Runs it.
    pub run: Box<dyn FnOnce() -> anyhow::Result<Summary>>,
}

/// How one lab ended.
#[derive(Debug)]
pub enum Outcome {
    /// It ran; its summary.
    Ran(Summary),
    /// It returned an error or panicked; the message.
    Failed(String),
    /// It did not run; why.
    Skipped(String),
}

/// One lab's result.
#[derive(Debug)]
pub struct LabResult {
    /// The lab's name.
    pub name: &'static str,
    /// What it reproduces.
    pub paper: &'static str,
    /// How it ended.
    pub outcome: Outcome,
    /// How long it took.
    pub elapsed: Duration,
}

impl LabResult {
    /// `met`, `missed`, `no target`, `failed` or `skipped`.
    pub fn verdict(&self) -> &'static str {
        match &self.outcome {
            Outcome::Ran(s) => match s.target_met {
                Some(true) => "met",
                Some(false) => "missed",
                None => "no target",
            },
            Outcome::Failed(_) => "failed",
            Outcome::Skipped(_) => "skipped",
        }
    }
}

/// Runs `jobs` in order, printing progress; a failing or panicking lab is
/// recorded and the next one runs.
pub fn run_labs(jobs: Vec<LabJob>, progress: &ProgressFn) -> Vec<LabResult> {
    let n = jobs.len();
    let mut out = Vec::with_capacity(n);
    for (i, job) in jobs.into_iter().enumerate() {
        let t0 = Instant::now();
        let outcome = match job.skip {
            Some(why) => {
                progress(&format!("[{}/{n}] lab {}: skipped: {why}", i + 1, job.name));
                Outcome::Skipped(why)
            }
            None => {
                progress(&format!("[{}/{n}] lab {} ({})", i + 1, job.name, job.paper));
                match std::panic::catch_unwind(AssertUnwindSafe(job.run)) {
                    Ok(Ok(s)) => Outcome::Ran(s),
                    Ok(Err(e)) => Outcome::Failed(format!("{e:#}")),
                    Err(p) => Outcome::Failed(format!(
                        "panicked: {}",
                        p.downcast_ref::<String>()
                            .map(String::as_str)
                            .or_else(|| p.downcast_ref::<&str>().copied())
                            .unwrap_or("(no message)")
                    )),
                }
            }
        };
        let r = LabResult {
            name: job.name,
            paper: job.paper,
            outcome,
            elapsed: t0.elapsed(),
        };
        if !matches!(r.outcome, Outcome::Skipped(_)) {
            let why = match &r.outcome {
                Outcome::Failed(e) => format!(": {e}"),
                _ => String::new(),
            };
            progress(&format!(
                "[{}/{n}] lab {}: {} in {:.1} s{why}",
                i + 1,
                r.name,
                r.verdict(),
                r.elapsed.as_secs_f64()
            ));
        }
        out.push(r);
    }
    out
}

/// Why the proxy lab cannot run here, if it cannot: it builds two network
/// namespaces joined by TUN devices.
pub fn proxy_lab_skip() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (two network namespaces joined by TUN devices)".into());
    }
    if !Path::new("/dev/net/tun").exists() {
        return Some("needs /dev/net/tun (no TUN device on this machine)".into());
    }
    None
}

/// Every lab with `--quick`-or-not settings, in the order `lab all` runs
/// them. `exe` is the `mintgate` binary (`lab footprint` runs it).
pub fn all_labs(opts: &LabOptions, exe: &Path) -> Vec<LabJob> {
    let o = opts.clone();
    let mut jobs: Vec<LabJob> = Vec::new();
    let q = opts.quick;
    {
        let o = o.clone();
        jobs.push(LabJob {
            name: "threads",
            paper: "paper 000, Figs. 2-5",
            skip: None,
            run: Box::new(move || crate::lab_threads(&o)),
        });
    }
    {
        let o = o.clone();
        jobs.push(LabJob {
            name: "vta",
            paper: "paper 000, Figs. 6-7",
            skip: None,
            run: Box::new(move || {
                crate::lab_vta(&LabOptions {
                    peak_rps: Some(10_000.0),
                    ..o
                })
            }),
        });
    }
    // `lab all --quick` must stay within a few minutes: the two comparison
    // labs, the longest, get fewer steps than their own --quick.
    let compare = |o: &LabOptions| crate::CompareOptions {
        common: LabOptions {
            handler_cost: mintgate_gateway::config::HandlerCost::None,
            duration: q.then_some(Duration::from_secs(3)),
            ..o.clone()
        },
        ..crate::CompareOptions::default()
    };
    {
        let c = crate::CompareOptions {
            clients: q.then(|| vec![100, 1000, 5000]),
            ..compare(&o)
        };
        jobs.push(LabJob {
            name: "clients",
            paper: "paper 000, Figs. 9-10",
            skip: None,
            run: Box::new(move || crate::lab_clients(&c)),
        });
    }
    {
        let c = crate::CompareOptions {
            clients: q.then(|| vec![3000]),
            ..compare(&o)
        };
        jobs.push(LabJob {
            name: "blocksize",
            paper: "paper 000, Fig. 11",
            skip: None,
            run: Box::new(move || crate::lab_blocksize(&c)),
        });
    }
    {
        let o = o.clone();
        jobs.push(LabJob {
            name: "congestion",
            paper: "paper 002, Tables 1-3",
            skip: None,
            run: Box::new(move || {
                crate::lab_congestion(&crate::CongestionOptions {
                    common: o,
                    seed: 1,
                    runs: None,
                    real: false,
                    requests: None,
                })
            }),
        });
    }
    {
        let o = o.clone();
        jobs.push(LabJob {
            name: "mqtt",
            paper: "paper 004, Fig. 5",
            skip: None,
            run: Box::new(move || {
                crate::lab_mqtt(&crate::MqttLabOptions {
                    common: o,
                    broker: None,
                    runs: None,
                    messages: None,
                    // the ratio target is judged over a modelled link (1 ms
                    // each way); bare loopback is run beside it
                    link_delay: Duration::from_millis(1),
                    ..crate::MqttLabOptions::default()
                })
            }),
        });
    }
    {
        let o = o.clone();
        jobs.push(LabJob {
            name: "proxy",
            paper: "paper 002, Tables 4-6",
            skip: proxy_lab_skip(),
            run: Box::new(move || {
                crate::lab_proxy(&crate::ProxyLabOptions {
                    common: o,
                    requests: if q { Some(50) } else { None },
                    seed: 1,
                    internet: crate::proxy::netns::LinkImpairment {
                        delay: Duration::from_millis(20),
                        jitter: Duration::from_millis(2),
                        loss: 0.01,
                    },
                    bench: true,
                })
            }),
        });
    }
    {
        let o = o.clone();
        jobs.push(LabJob {
            name: "buffers",
            paper: "paper 003, Tables 3-5",
            skip: None,
            run: Box::new(move || crate::lab_buffers(&o)),
        });
    }
    {
        let o = o.clone();
        jobs.push(LabJob {
            name: "directpath",
            paper: "paper 001, Fig. 4",
            skip: None,
            run: Box::new(move || crate::lab_directpath(&o)),
        });
    }
    {
        let o = o.clone();
        let exe = exe.to_path_buf();
        let skip = (!exe.is_file()).then(|| format!("{} not found", exe.display()));
        jobs.push(LabJob {
            name: "footprint",
            paper: "memory footprint (no paper figure)",
            skip,
            run: Box::new(move || crate::lab_footprint(&o, &exe)),
        });
    }
    {
        let o = o.clone();
        let exe = exe.to_path_buf();
        let skip = (!exe.is_file()).then(|| format!("{} not found", exe.display()));
        jobs.push(LabJob {
            name: "overload",
            paper: "own target: 10x capacity (no paper figure)",
            skip,
            run: Box::new(move || crate::lab_overload(&o, &exe, None, false)),
        });
    }
    {
        let o = o.clone();
        jobs.push(LabJob {
            name: "dtls",
            paper: "own target: coaps cost (no paper figure)",
            skip: None,
            run: Box::new(move || crate::lab_dtls(&o, &crate::DtlsOptions::default())),
        });
    }
    jobs
}

/// Now as `YYYY-MM-DD HH:MM UTC`.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // days since 1970-01-01 to a civil date (H. Hinnant's algorithm)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60
    )
}

fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            c => o.push(c),
        }
    }
    o
}

/// Standard base64 (RFC 4648) with padding.
pub fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut o = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let b = [c[0], *c.get(1).unwrap_or(&0), *c.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18u32, 12, 6, 0].into_iter().enumerate() {
            if i <= c.len() {
                o.push(A[((n >> shift) & 63) as usize] as char);
            } else {
                o.push('=');
            }
        }
    }
    o
}

/// A CSV file as an HTML table (first line the header).
fn csv_table(text: &str) -> String {
    let mut t = String::from("<table class=\"csv\">");
    for (i, line) in text.lines().enumerate() {
        let cell = if i == 0 { "th" } else { "td" };
        t.push_str("<tr>");
        for v in line.split(',') {
            let _ = write!(t, "<{cell}>{}</{cell}>", esc(v));
        }
        t.push_str("</tr>");
    }
    t.push_str("</table>");
    t
}

/// A lab table's lines that state a target: (missed, met). A line is
/// missed when it says `missed` or `not met`, met when it says `met`;
/// lines that only state a target (`target >= 100x`) without a verdict
/// are left out.
pub fn target_lines(table: &str) -> (Vec<&str>, Vec<&str>) {
    let (mut missed, mut met) = (Vec::new(), Vec::new());
    for l in table.lines().map(str::trim) {
        let low = l.to_ascii_lowercase();
        if low.contains("missed") || low.contains("not met") {
            missed.push(l);
        } else if low
            .split(|c: char| !c.is_ascii_alphanumeric())
            .any(|w| w == "met")
        {
            met.push(l);
        }
    }
    (missed, met)
}

/// A lab table's target lines that are neither met nor missed but
/// explained: a figure of the paper the lab's model cannot match, with the
/// reason (`[unmatched, explained] ...`, lab congestion).
pub fn explained_lines(table: &str) -> Vec<&str> {
    table
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("[unmatched"))
        .collect()
}

/// Writes `report.html` into `out`: the summary table, then each lab with
/// its figures beside its table of our figures and the paper's, and its
/// CSVs. Every figure is inlined; the file needs nothing else.
pub fn write_report(out: &Path, results: &[LabResult], title: &str) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut h = String::new();
    let _ = write!(
        h,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>{t}</title><style>\n{STYLE}</style></head><body>\n<h1>{t}</h1>\n",
        t = esc(title)
    );
    let count = |v: &str| results.iter().filter(|r| r.verdict() == v).count();
    let _ = write!(
        h,
        "<p class=\"lead\">{} labs: {} met their targets, {} missed, {} without a target, \
         {} failed, {} skipped.</p>\n<h2>Summary</h2>\n<table class=\"summary\">\
         <tr><th>lab</th><th>reproduces</th><th>result</th><th>time</th><th>targets</th></tr>\n",
        results.len(),
        count("met"),
        count("missed"),
        count("no target"),
        count("failed"),
        count("skipped")
    );
    for r in results {
        let detail = match &r.outcome {
            Outcome::Ran(s) => {
                let (missed, met) = target_lines(&s.table);
                let mut d: Vec<String> = missed
                    .iter()
                    .map(|l| format!("<span class=\"v missed\">{}</span>", esc(l)))
                    .collect();
                d.extend(
                    explained_lines(&s.table)
                        .iter()
                        .map(|l| format!("<span class=\"v skipped\">{}</span>", esc(l))),
                );
                if !met.is_empty() {
                    d.push(format!(
                        "{} target line(s) met{}",
                        met.len(),
                        if missed.is_empty() { "" } else { " besides" }
                    ));
                }
                d.join("<br>")
            }
            Outcome::Failed(e) => esc(e),
            Outcome::Skipped(why) => esc(why),
        };
        let _ = writeln!(
            h,
            "<tr><td><a href=\"#{n}\">{n}</a></td><td>{}</td><td class=\"v {cls}\">{}</td>\
             <td class=\"num\">{:.1} s</td><td class=\"detail\">{detail}</td></tr>",
            esc(r.paper),
            r.verdict(),
            r.elapsed.as_secs_f64(),
            n = r.name,
            cls = r.verdict().replace(' ', "-"),
        );
    }
    h.push_str("</table>\n");
    for r in results {
        let _ = writeln!(
            h,
            "<section id=\"{n}\"><h2>lab {n} <small>{} · <span class=\"v {cls}\">{}</span> · {:.1} s</small></h2>",
            esc(r.paper),
            r.verdict(),
            r.elapsed.as_secs_f64(),
            n = r.name,
            cls = r.verdict().replace(' ', "-"),
        );
        match &r.outcome {
            Outcome::Skipped(why) => {
                let _ = writeln!(h, "<p class=\"why\">Skipped: {}</p>", esc(why));
            }
            Outcome::Failed(e) => {
                let _ = writeln!(h, "<p class=\"why\">Failed: {}</p>", esc(e));
            }
            Outcome::Ran(s) => {
                h.push_str("<div class=\"pair\"><div class=\"figs\">");
                let mut csvs = Vec::new();
                for f in &s.files {
                    let name = f
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    let ext = f.extension().and_then(|e| e.to_str()).unwrap_or("");
                    match ext {
                        "svg" | "png" => match std::fs::read(f) {
                            Ok(bytes) => {
                                let mime = if ext == "svg" {
                                    "image/svg+xml"
                                } else {
                                    "image/png"
                                };
                                let _ = write!(
                                    h,
                                    "<figure><img alt=\"{n}\" src=\"data:{mime};base64,{}\">\
                                     <figcaption>{n}</figcaption></figure>",
                                    base64(&bytes),
                                    n = esc(&name)
                                );
                            }
                            Err(e) => {
                                let _ = write!(h, "<p class=\"why\">{}: {e}</p>", esc(&name));
                            }
                        },
                        "csv" => csvs.push((name, f.clone())),
                        _ => {}
                    }
                }
                h.push_str("</div><div class=\"table\"><h3>ours beside the paper's</h3><pre>");
                h.push_str(&esc(&s.table));
                h.push_str("</pre></div></div>\n");
                for (name, path) in csvs {
                    match std::fs::read_to_string(&path) {
                        Ok(text) => {
                            let rows = text.lines().count().saturating_sub(1);
                            let _ = writeln!(
                                h,
                                "<details><summary>{} ({rows} rows)</summary>{}</details>",
                                esc(&name),
                                csv_table(&text)
                            );
                        }
                        Err(e) => {
                            let _ = writeln!(h, "<p class=\"why\">{}: {e}</p>", esc(&name));
                        }
                    }
                }
            }
        }
        h.push_str("</section>\n");
    }
    h.push_str("</body></html>\n");
    let path = out.join("report.html");
    std::fs::write(&path, h).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

const STYLE: &str = "body{font:14px/1.45 system-ui,sans-serif;color:#1d2330;margin:24px auto;max-width:1500px;padding:0 16px}
h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #e3e6ec;padding-bottom:4px}
h2 small{font-weight:normal;color:#6b7280;font-size:13px}h3{font-size:14px;margin:0 0 6px}
table{border-collapse:collapse}th,td{padding:3px 8px;border-bottom:1px solid #e3e6ec;text-align:left;vertical-align:top}
th{color:#6b7280;font-weight:normal}td.num{text-align:right;white-space:nowrap}td.v{white-space:nowrap}td.detail{font-size:12px}
.v{font-weight:600}.v.met{color:#0f9d58}.v.missed,.v.failed{color:#c62828}.v.skipped,.v.no-target{color:#6b7280}
.pair{display:flex;gap:16px;align-items:flex-start;flex-wrap:wrap}.figs{flex:1 1 640px;min-width:0}
.figs img{max-width:100%;height:auto;border:1px solid #e3e6ec}figure{margin:0 0 12px}figcaption{color:#6b7280;font-size:12px}
.table{flex:1 1 560px;min-width:0}pre{font-size:12px;background:#f5f6f8;padding:8px;overflow-x:auto;white-space:pre}
table.csv{font-size:12px;font-variant-numeric:tabular-nums}.why{color:#c62828}.lead{font-size:15px}
details{margin:6px 0}summary{cursor:pointer;color:#2563eb}
";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_lines_are_sorted_by_verdict() {
        let t = "Targets:\n  [met] a\n  [MISSED] b\nx: target >= 2x: NOT met\nfoo: met)\nmetric 3\n(target < 1 %)";
        let (missed, met) = target_lines(t);
        assert_eq!(missed, ["[MISSED] b", "x: target >= 2x: NOT met"]);
        assert_eq!(met, ["[met] a", "foo: met)"]);
        let t = "Targets:\n  [met] a\n  [unmatched, explained] cell: cannot be matched: why\n";
        assert_eq!(target_lines(t), (vec![], vec!["[met] a"]));
        assert_eq!(
            explained_lines(t),
            ["[unmatched, explained] cell: cannot be matched: why"]
        );
    }

    #[test]
    fn base64_matches_rfc4648() {
        for (i, o) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(i.as_bytes()), o);
        }
    }
}
