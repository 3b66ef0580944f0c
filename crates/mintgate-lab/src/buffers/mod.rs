//! `lab buffers`: paper 003, Tables 3-5. Bytes allocated, bytes copied and
//! time per message for payloads of n = 128, 256, ... 1024 bytes, through
//! mintgate's pooled buffers and through a naive copy-per-layer baseline,
//! over real loopback UDP sockets.
//!
//! Paths:
//! - `echo`: a UDP echo. mintgate receives the datagram into a pool block
//!   sized to it (its length is read first with `MSG_PEEK | MSG_TRUNC`) and
//!   sends that same block back (`recvmmsg`/`sendmmsg` of the gateway's
//!   `udp` module): no byte is copied in user space.
//! - `coap`: a NON GET answered with an n-byte payload that the application
//!   holds in its own buffer, through the server code the gateway runs
//!   (the server endpoint: classify, de-duplication, a router and a
//!   resource, the response builder; `sendmmsg` of head + payload). The
//!   handler writes the payload once into the response block (n copied).
//! - `coap-static`: the same with a payload in static memory, sent by
//!   reference (no payload byte copied).
//! - `http`: an HTTP/1.1 GET through mintgate's HTTP -> CoAP proxy, the n
//!   bytes coming back as the HTTP body; heap allocations counted by the
//!   counting global allocator (see [`http`] for what is counted).
//!
//! The naive baseline does the same socket calls and the same parsing, but
//! every layer takes a fresh `Vec` and copies what it got from the layer
//! above (app -> CoAP -> UDP -> socket), as the paper found Zephyr doing.
//!
//! What is counted, per message, on the server: every allocation and copy
//! recorded in an [`Accounting`] (mintgate: the pool's own; naive: the lab
//! records each `Vec` and each copy). `alloc_bytes` is the scope of the
//! paper's measurement, the buffers of the message that carries the n bytes:
//! for `echo` the block it arrives in (it is also the one sent); for `coap`
//! the response's blocks. The CoAP request's receive buffer (a max-size
//! block or `Vec`, independent of n) is listed per layer in
//! `buffers_layers.csv` and not in `alloc_bytes`. `copy_bytes` counts every
//! user-space copy of every layer, header bytes included. The kernel's own
//! copy to and from the socket buffers is the same for both and not
//! counted. `ns_per_msg` is the server's time per message from the start
//! of the receive call to the return of the send call, less the time spent
//! inside the socket calls: the paper's measure (the stack's own work, not
//! the wire). The socket calls cost 10-20 us on loopback here, two orders
//! of magnitude more than the buffer work, and vary too much between runs
//! to leave the difference visible; the table gives the total as well.
//!
//! The parts: `servers` (one step per path and implementation, the serving
//! loop, the lab's resources and pool), `measure` (the clients, the
//! per-size runs and the check through a running gateway), `report` (the
//! fitted lines, the tables beside the paper's, the targets), `plot`
//! (`buffers.svg`) and [`http`] (the proxy path); [`lab_buffers`] here
//! runs them in order.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use mintgate_buf::Layer;

use crate::{line, LabOptions, Summary};

pub mod http;
mod measure;
mod plot;
mod report;
mod servers;

pub use measure::{measure, BufRow, GatewayCheck};
pub use report::{fit, Fit};
pub use servers::{lab_partitions, lab_router};

use measure::gateway_check;
use plot::buffers_svg;
use report::table;
use servers::query_n;

/// Payload sizes, as in the paper (the 802.15.4 MTU is 127 bytes).
pub const SIZES: [usize; 8] = [128, 256, 384, 512, 640, 768, 896, 1024];

/// Largest request datagram the servers accept (the gateway's default
/// `coap.max_datagram`).
const MAX_DGRAM: usize = 1280;

/// Largest payload the lab resources produce.
const MAX_N: usize = 1024;

/// A server gives up on a message after this; a client after this.
const IO_TIMEOUT: Duration = Duration::from_secs(1);

/// The bytes every payload is made of (deterministic, so that clients can
/// check what came back). Static, so that `coap-static` can send it by
/// reference.
static PATTERN: [u8; MAX_N] = pattern();

const fn pattern() -> [u8; MAX_N] {
    let mut p = [0u8; MAX_N];
    let mut i = 0;
    while i < MAX_N {
        p[i] = (i * 31 + 7) as u8;
        i += 1;
    }
    p
}

const ALL_PATHS: [PathKind; 4] = [
    PathKind::Echo,
    PathKind::Coap,
    PathKind::CoapStatic,
    PathKind::Http,
];

/// Which exchange is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathKind {
    /// UDP echo.
    Echo,
    /// CoAP GET, payload produced from the application's buffer.
    Coap,
    /// CoAP GET, payload in static memory.
    CoapStatic,
    /// HTTP -> CoAP through the proxy.
    Http,
}

impl PathKind {
    /// The `path` column.
    pub fn name(self) -> &'static str {
        match self {
            PathKind::Echo => "echo",
            PathKind::Coap => "coap",
            PathKind::CoapStatic => "coap-static",
            PathKind::Http => "http",
        }
    }

    /// The lab resource's path (CoAP paths only).
    fn resource(self) -> &'static str {
        match self {
            PathKind::CoapStatic => "lab/static",
            _ => "lab/inline",
        }
    }
}

/// Which implementation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Impl {
    /// mintgate's pooled, zero-copy buffers.
    Mintgate,
    /// A fresh `Vec` and a copy per layer.
    Naive,
}

impl Impl {
    /// The `impl` column.
    pub fn name(self) -> &'static str {
        match self {
            Impl::Mintgate => "mintgate",
            Impl::Naive => "naive",
        }
    }
}

/// Messages per point on the http path, at least: the proxy's upstream
/// client takes its receive buffers 64 KiB at a time, which over few
/// messages lands as steps of 64 KiB / messages per point.
const HTTP_MIN_MSGS: usize = 2000;

/// Runs the lab: every path and implementation at every size, then a check
/// of the `coap` figures through a running [`Gateway`]. Writes
/// `buffers.csv`, `buffers_layers.csv` and `buffers.svg`.
pub fn lab_buffers(opts: &LabOptions) -> anyhow::Result<Summary> {
    let msgs = if opts.quick { 300 } else { 2000 };
    let warm = if opts.quick { 20 } else { 100 };
    let http_msgs = msgs.max(HTTP_MIN_MSGS);
    crate::create_out(&opts.out)?;
    let progress = &opts.progress;
    progress(&format!(
        "lab buffers: n = {:?}, {msgs} messages per point ({http_msgs} on http) after {warm} \
         unmeasured, one outstanding, loopback UDP",
        SIZES
    ));
    let mut rows = Vec::new();
    for path in [PathKind::Echo, PathKind::Coap, PathKind::CoapStatic] {
        for imp in [Impl::Mintgate, Impl::Naive] {
            let t0 = Instant::now();
            let got = measure(path, imp, &SIZES, msgs, warm)
                .with_context(|| format!("path {} impl {}", path.name(), imp.name()))?;
            if let (Some(first), Some(last)) = (got.first(), got.last()) {
                progress(&format!(
                    "lab buffers: {:<11} {:<8} n={}: alloc {:.0} copy {:.0} {:.0} ns | n={}: \
                     alloc {:.0} copy {:.0} {:.0} ns ({:.1} s)",
                    path.name(),
                    imp.name(),
                    first.n,
                    first.alloc_bytes,
                    first.copy_bytes,
                    first.ns_per_msg,
                    last.n,
                    last.alloc_bytes,
                    last.copy_bytes,
                    last.ns_per_msg,
                    t0.elapsed().as_secs_f64()
                ));
            }
            rows.extend(got);
        }
    }
    let http_note = match http::unavailable() {
        Some(why) => {
            progress(&format!("lab buffers: http: {why}"));
            format!("http: {why}")
        }
        None => {
            for imp in [Impl::Mintgate, Impl::Naive] {
                let t0 = Instant::now();
                let got = http::measure(imp, &SIZES, http_msgs, warm)
                    .with_context(|| format!("path http impl {}", imp.name()))?;
                if let (Some(first), Some(last)) = (got.first(), got.last()) {
                    progress(&format!(
                        "lab buffers: http        {:<8} n={}: alloc {:.0} copy {:.0} | n={}: \
                         alloc {:.0} copy {:.0} ({:.1} s)",
                        imp.name(),
                        first.n,
                        first.alloc_bytes,
                        first.copy_bytes,
                        last.n,
                        last.alloc_bytes,
                        last.copy_bytes,
                        t0.elapsed().as_secs_f64()
                    ));
                }
                rows.extend(got);
            }
            String::new()
        }
    };
    progress("lab buffers: cross-check of the coap rows through a running gateway");
    let checks = gateway_check(if opts.quick { 100 } else { 500 })?;

    let csv_path = opts.out.join("buffers.csv");
    let mut csv = String::from("path,impl,n,alloc_bytes,copy_bytes,ns_per_msg\n");
    for r in &rows {
        line(
            &mut csv,
            format_args!(
                "{},{},{},{:.1},{:.1},{:.0}",
                r.path.name(),
                r.imp.name(),
                r.n,
                r.alloc_bytes,
                r.copy_bytes,
                r.ns_per_msg
            ),
        );
    }
    crate::write_file(&csv_path, &csv)?;
    let layers_path = opts.out.join("buffers_layers.csv");
    let mut lc = String::from("path,impl,n,layer,alloc_bytes,copy_bytes\n");
    for r in &rows {
        for (l, (a, c)) in Layer::ALL.iter().zip(r.layers) {
            if a > 0.0 || c > 0.0 {
                line(
                    &mut lc,
                    format_args!(
                        "{},{},{},{},{a:.1},{c:.1}",
                        r.path.name(),
                        r.imp.name(),
                        r.n,
                        l.name()
                    ),
                );
            }
        }
    }
    crate::write_file(&layers_path, &lc)?;
    let svg_path = opts.out.join("buffers.svg");
    buffers_svg(&svg_path, &rows)?;

    let (table, met) = table(&rows, &checks, &http_note, msgs);
    Ok(Summary {
        lab: "buffers",
        table,
        files: vec![csv_path, layers_path, svg_path],
        target_met: Some(met),
    })
}

#[cfg(test)]
mod tests {
    use super::servers::make_step;
    use super::*;

    #[test]
    fn fit_recovers_a_line_and_refuses_a_point() {
        let pts: Vec<(f64, f64)> = SIZES
            .iter()
            .map(|n| (*n as f64, 2.5 * *n as f64 + 40.0))
            .collect();
        let f = fit(&pts).unwrap();
        assert!(
            (f.a - 2.5).abs() < 1e-9 && (f.c - 40.0).abs() < 1e-6,
            "{f:?}"
        );
        assert!(fit(&[(1.0, 1.0)]).is_none());
        assert!(fit(&[(1.0, 1.0), (1.0, 2.0)]).is_none());
    }

    #[test]
    fn query_n_is_bounded() {
        assert_eq!(query_n(["a=1", "n=512"].into_iter()), Some(512));
        assert_eq!(query_n(["n=2048"].into_iter()), None);
        assert_eq!(query_n(["n=x"].into_iter()), None);
    }

    /// Few messages, but real sockets and real accounting: the zero-copy
    /// echo copies nothing and allocates one block that fits the datagram;
    /// the naive one copies twice per message.
    #[test]
    fn echo_accounting_per_message() {
        let m = measure(PathKind::Echo, Impl::Mintgate, &[256, 1024], 20, 2).unwrap();
        for r in &m {
            assert_eq!(r.msgs, 20);
            assert_eq!(r.copy_bytes, 0.0, "{r:?}");
            assert!(
                r.alloc_bytes >= r.n as f64 && r.alloc_bytes < r.n as f64 + 64.0,
                "{r:?}"
            );
        }
        let v = measure(PathKind::Echo, Impl::Naive, &[256], 20, 2).unwrap();
        assert_eq!(v[0].copy_bytes, 512.0, "{:?}", v[0]);
        assert_eq!(v[0].alloc_bytes, 768.0, "{:?}", v[0]);
    }

    #[test]
    fn coap_paths_answer_and_count() {
        let m = measure(PathKind::Coap, Impl::Mintgate, &[512], 10, 2).unwrap();
        // the handler copies the n payload bytes once
        assert_eq!(m[0].layers[Layer::Handler as usize].1, 512.0, "{:?}", m[0]);
        let s = measure(PathKind::CoapStatic, Impl::Mintgate, &[512], 10, 2).unwrap();
        assert_eq!(s[0].layers[Layer::Handler as usize].1, 0.0, "{:?}", s[0]);
        assert!(s[0].alloc_bytes < 512.0, "{:?}", s[0]);
        let v = measure(PathKind::Coap, Impl::Naive, &[512], 10, 2).unwrap();
        assert!(v[0].copy_bytes >= 3.0 * 512.0, "{:?}", v[0]);
        assert!(make_step(PathKind::Http, Impl::Mintgate).is_err());
    }
}
