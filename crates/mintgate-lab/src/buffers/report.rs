//! The lab's report: least-squares lines through the rows, the printed
//! tables beside paper 003's Tables 3-5, and the targets checked point by
//! point.
//!
//! Invariant: pure functions of the rows and gateway checks this run
//! measured: nothing here measures, reads a clock or writes a file, so the
//! same rows always give the same tables and verdicts.

use mintgate_buf::Layer;

use super::{BufRow, GatewayCheck, Impl, PathKind, ALL_PATHS, HTTP_MIN_MSGS};
use crate::{line, paper};

/// A least-squares line `a * n + c`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fit {
    /// Slope.
    pub a: f64,
    /// Intercept.
    pub c: f64,
}

/// Fits `y = a * x + c` by least squares; `None` with fewer than two
/// distinct x.
pub fn fit(points: &[(f64, f64)]) -> Option<Fit> {
    let k = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / k;
    let my = points.iter().map(|p| p.1).sum::<f64>() / k;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx == 0.0 {
        return None;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let a = sxy / sxx;
    Some(Fit { a, c: my - a * mx })
}

fn rows_of(rows: &[BufRow], path: PathKind, imp: Impl) -> Vec<&BufRow> {
    rows.iter()
        .filter(|r| r.path == path && r.imp == imp)
        .collect()
}

fn fit_of(rows: &[&BufRow], f: fn(&BufRow) -> f64) -> Option<Fit> {
    fit(&rows.iter().map(|r| (r.n as f64, f(r))).collect::<Vec<_>>())
}

/// The largest `f(r) - n` of `rows` (`f64::MIN` when there are none).
fn most_over_n(rows: &[&BufRow], f: fn(&BufRow) -> f64) -> f64 {
    rows.iter()
        .map(|r| f(r) - r.n as f64)
        .fold(f64::MIN, f64::max)
}

fn pct(naive: f64, ours: f64) -> f64 {
    if naive > 0.0 {
        100.0 * (naive - ours) / naive
    } else {
        0.0
    }
}

/// The printed table and whether every target held.
pub(super) fn table(
    rows: &[BufRow],
    checks: &[GatewayCheck],
    http_note: &str,
    msgs: usize,
) -> (String, bool) {
    let mut t = String::new();
    line(
        &mut t,
        format_args!(
            "lab buffers (paper 003, Tables 3-5): per message, {msgs} messages per point ({} on \
             http), loopback UDP, one outstanding",
            msgs.max(HTTP_MIN_MSGS)
        ),
    );
    line(
        &mut t,
        format_args!(
            "alloc = buffers of the message carrying the n bytes (echo: its receive block; coap: \
             the response; the request's receive buffer is in buffers_layers.csv), copy = every \
             user-space copy incl. header bytes, ns = server time from receive call to send \
             return less the time inside socket calls"
        ),
    );
    line(
        &mut t,
        format_args!(
            "{:<11} | {:>5} | {:>9} {:>9} {:>8} | {:>9} {:>9} {:>8} | {:>6} {:>6} {:>6} || paper \
             Zephyr improvement (Tables 3/4/5)",
            "path",
            "n",
            "mg alloc",
            "mg copy",
            "mg ns",
            "nv alloc",
            "nv copy",
            "nv ns",
            "-alloc",
            "-copy",
            "-time"
        ),
    );
    for path in ALL_PATHS {
        let ours = rows_of(rows, path, Impl::Mintgate);
        let naive = rows_of(rows, path, Impl::Naive);
        for (m, v) in ours.iter().zip(&naive) {
            let p = |tab: &[paper::ReductionRow]| -> String {
                tab.iter()
                    .find(|r| r.n == m.n)
                    .map(|r| match path {
                        PathKind::Echo => format!("{:.1}%", r.echo),
                        PathKind::Http => format!("{:.1}%", r.http),
                        _ => format!("{:.1}%", r.coap),
                    })
                    .unwrap_or_else(|| "-".into())
            };
            line(
                &mut t,
                format_args!(
                    "{:<11} | {:>5} | {:>9.0} {:>9.0} {:>8.0} | {:>9.0} {:>9.0} {:>8.0} | {:>5.1}% \
                     {:>5.1}% {:>5.1}% || {} / {} / {}",
                    path.name(),
                    m.n,
                    m.alloc_bytes,
                    m.copy_bytes,
                    m.ns_per_msg,
                    v.alloc_bytes,
                    v.copy_bytes,
                    v.ns_per_msg,
                    pct(v.alloc_bytes, m.alloc_bytes),
                    pct(v.copy_bytes, m.copy_bytes),
                    pct(v.ns_per_msg, m.ns_per_msg),
                    p(paper::TABLE3_ALLOC),
                    p(paper::TABLE4_COPY),
                    p(paper::TABLE5_TIME),
                ),
            );
        }
    }
    let avg = |path: PathKind, f: fn(&BufRow) -> f64| -> f64 {
        let m = rows_of(rows, path, Impl::Mintgate);
        let v = rows_of(rows, path, Impl::Naive);
        let k = m.len().max(1) as f64;
        m.iter().zip(&v).map(|(m, v)| pct(f(v), f(m))).sum::<f64>() / k
    };
    for (path, pa) in [
        (PathKind::Echo, paper::AVG_ECHO),
        (PathKind::Coap, paper::AVG_COAP),
        (PathKind::CoapStatic, paper::AVG_COAP),
        (PathKind::Http, paper::AVG_HTTP),
    ] {
        if rows_of(rows, path, Impl::Mintgate).is_empty() {
            continue;
        }
        line(
            &mut t,
            format_args!(
                "average reduction {:<11}: alloc {:.1}%  copy {:.1}%  time {:.1}%   (paper {}: {:.1}% \
                 / {:.1}% / {:.1}%)",
                path.name(),
                avg(path, |r| r.alloc_bytes),
                avg(path, |r| r.copy_bytes),
                avg(path, |r| r.ns_per_msg),
                match path {
                    PathKind::Echo => "echo",
                    PathKind::Http => "http",
                    _ => "coap",
                },
                pa.0,
                pa.1,
                pa.2
            ),
        );
    }
    for path in [PathKind::Echo, PathKind::Coap, PathKind::CoapStatic] {
        let tot = |imp| {
            let rs = rows_of(rows, path, imp);
            rs.iter().map(|r| r.total_ns_per_msg).sum::<f64>() / rs.len().max(1) as f64
        };
        line(
            &mut t,
            format_args!(
                "server time with the socket calls, {:<11}: mintgate {:.0} ns, naive {:.0} ns per \
                 message (average over n; the kernel's share dominates)",
                path.name(),
                tot(Impl::Mintgate),
                tot(Impl::Naive)
            ),
        );
    }
    let rt = |imp| {
        let rs = rows_of(rows, PathKind::Http, imp);
        (!rs.is_empty()).then(|| rs.iter().map(|r| r.ns_per_msg).sum::<f64>() / rs.len() as f64)
    };
    if let (Some(m), Some(v)) = (rt(Impl::Mintgate), rt(Impl::Naive)) {
        line(
            &mut t,
            format_args!(
                "http time is the client's round trip through the proxy and the CoAP leg: mintgate \
                 {m:.0} ns, naive {v:.0} ns per message (average over n); http alloc is every heap \
                 byte of the process per message, copy the proxy's own copies"
            ),
        );
    }
    line(
        &mut t,
        format_args!("fitted lines (least squares over n = 128..1024), ours:"),
    );
    for path in ALL_PATHS {
        for imp in [Impl::Mintgate, Impl::Naive] {
            let rs = rows_of(rows, path, imp);
            let (Some(a), Some(c), Some(ns)) = (
                fit_of(&rs, |r| r.alloc_bytes),
                fit_of(&rs, |r| r.copy_bytes),
                fit_of(&rs, |r| r.ns_per_msg),
            ) else {
                continue;
            };
            line(
                &mut t,
                format_args!(
                    "  {:<11} {:<8}: alloc {:.2}n {:+.0}   copy {:.2}n {:+.0}   time {:.2}n {:+.0} ns",
                    path.name(),
                    imp.name(),
                    a.a,
                    a.c,
                    c.a,
                    c.c,
                    ns.a,
                    ns.c
                ),
            );
        }
    }
    for l in paper::P003_FITS {
        line(&mut t, format_args!("{l}"));
    }
    {
        if !http_note.is_empty() {
            line(&mut t, format_args!("{http_note}"));
        }
        let (a, c, tm) = paper::AVG_HTTP;
        let last = paper::TABLE3_ALLOC.last().map(|r| r.http).unwrap_or(0.0);
        line(
            &mut t,
            format_args!(
                "  (paper HTTP: average reduction alloc {a:.1}% copy {c:.1}% time {tm:.1}%, alloc \
                 {last:.1}% at 1024 bytes; target alloc <= 1.2n + c, copy <= n)"
            ),
        );
    }
    line(
        &mut t,
        format_args!("the same through a running gateway (receiver, HTP queue, handler thread):"),
    );
    for c in checks {
        let lab = rows
            .iter()
            .find(|r| r.path == c.path && r.imp == Impl::Mintgate && r.n == c.n);
        line(
            &mut t,
            format_args!(
                "  {:<11} n={:<5}: alloc {:.0} copy {:.0} per message over {} ({})",
                c.path.name(),
                c.n,
                c.alloc_bytes,
                c.copy_bytes,
                c.msgs,
                match lab {
                    Some(r)
                        if (r.alloc_bytes - c.alloc_bytes).abs() < 0.5
                            && (r.copy_bytes - c.copy_bytes).abs() < 0.5 =>
                        "same as the lab loop".to_string(),
                    Some(r) => format!(
                        "lab loop: alloc {:.0} copy {:.0}: DIFFERENT",
                        r.alloc_bytes, r.copy_bytes
                    ),
                    None => "no lab row".into(),
                }
            ),
        );
    }
    let (verdicts, met) = targets(rows, checks);
    for v in verdicts {
        line(&mut t, format_args!("{v}"));
    }
    (t, met)
}

/// The targets, checked point by point: echo and coap allocate at
/// most n + 128 with a fitted slope of about 1 and intercept at most 128,
/// copy at most n; coap-static copies 0 payload bytes and 0 bytes at all.
fn targets(rows: &[BufRow], checks: &[GatewayCheck]) -> (Vec<String>, bool) {
    let mut out = Vec::new();
    let mut all = true;
    let mut verdict = |ok: bool, what: String| {
        all &= ok;
        out.push(format!(
            "target {}: {what}",
            if ok { "met" } else { "NOT met" }
        ));
    };
    for path in [PathKind::Echo, PathKind::Coap] {
        let rs = rows_of(rows, path, Impl::Mintgate);
        let worst_c = most_over_n(&rs, |r| r.alloc_bytes);
        let f = fit_of(&rs, |r| r.alloc_bytes);
        let ok = worst_c <= 128.0 && f.is_some_and(|f| (f.a - 1.0).abs() <= 0.1 && f.c <= 128.0);
        verdict(
            ok,
            format!(
                "{}: allocated = n + c, c <= 128 (largest alloc - n: {worst_c:.0}; fit {})",
                path.name(),
                f.map(|f| format!("{:.2}n {:+.0}", f.a, f.c))
                    .unwrap_or_default()
            ),
        );
        let worst = most_over_n(&rs, |r| r.copy_bytes);
        let payload = most_over_n(&rs, |r| r.layers[Layer::Handler as usize].1);
        verdict(
            worst <= 0.0,
            format!(
                "{}: copied <= n (largest copy - n: {worst:+.0} bytes, of which payload: \
                 {payload:+.0}{})",
                path.name(),
                if worst > payload.max(0.0) {
                    "; the rest is the CoAP header, encoded on the stack and copied into the \
                     block's headroom"
                } else {
                    ""
                }
            ),
        );
    }
    let st = rows_of(rows, PathKind::CoapStatic, Impl::Mintgate);
    let most = st.iter().map(|r| r.copy_bytes).fold(0.0, f64::max);
    let payload = st
        .iter()
        .map(|r| r.layers[Layer::Handler as usize].1)
        .fold(0.0, f64::max);
    verdict(
        payload == 0.0,
        format!("coap-static: 0 payload bytes copied (most: {payload:.0})"),
    );
    verdict(
        most == 0.0,
        format!(
            "coap-static: 0 bytes copied at all (most: {most:.0}{})",
            if most > payload {
                ", the CoAP header encoded on the stack and copied into its block"
            } else {
                ""
            }
        ),
    );
    let worst_c = most_over_n(&st, |r| r.alloc_bytes);
    verdict(
        worst_c <= 128.0,
        format!("coap-static: allocated <= n + 128 (largest alloc - n: {worst_c:.0})"),
    );
    let h = rows_of(rows, PathKind::Http, Impl::Mintgate);
    if !h.is_empty() {
        let f = fit_of(&h, |r| r.alloc_bytes);
        verdict(
            f.is_some_and(|f| f.a <= 1.2),
            format!(
                "http: allocated <= 1.2n + c (fit {})",
                f.map(|f| format!("{:.2}n {:+.0}", f.a, f.c))
                    .unwrap_or_default()
            ),
        );
        let worst = most_over_n(&h, |r| r.copy_bytes);
        verdict(
            worst <= 0.0,
            format!(
                "http: copied <= n (largest copy - n: {worst:+.0} bytes{})",
                if worst > 0.0 {
                    ": copied by the upstream client out of received datagrams"
                } else {
                    ""
                }
            ),
        );
    }
    let consistent = checks.iter().all(|c| {
        rows.iter()
            .find(|r| r.path == c.path && r.imp == Impl::Mintgate && r.n == c.n)
            .is_some_and(|r| {
                (r.alloc_bytes - c.alloc_bytes).abs() < 0.5
                    && (r.copy_bytes - c.copy_bytes).abs() < 0.5
            })
    });
    verdict(
        consistent,
        "the running gateway allocates and copies what the lab loop does".into(),
    );
    (out, all)
}
