//! What paper 000 (MinT-I, VTA) says about its Figs. 2-7, as far as its text
//! gives numbers. The figures themselves are images that the text version of
//! the paper does not carry; only the values the prose states are here, and
//! where it gives only a shape, that is said instead of a number.
//!
//! Setting (sec. 3.3, 4.4): a MinT server on a Raspberry Pi (quad-core),
//! clients over Ethernet; Figs. 2-4 fix the HTP at 1, 2 and 4 threads; Fig. 5
//! varies it from 1 to 200; Figs. 6-7 send 40-50 K packets/s for 20 minutes.

/// One fixed pool size's values from the text, requests/s.
#[derive(Clone, Copy, Debug)]
pub struct PaperPoint {
    /// HTP threads.
    pub threads: usize,
    /// NR, the client requests the Network Receiver saw (text: average), or
    /// `None` where the text gives none.
    pub nr: Option<(f64, f64)>,
    /// HTP throughput (text: average), as a (low, high) range.
    pub htp: Option<(f64, f64)>,
    /// Where in the paper.
    pub source: &'static str,
}

/// The paper's stated values for fixed thread counts (Figs. 2-5 prose).
/// Single values are given as equal low and high.
pub const THREADS: &[PaperPoint] = &[
    // "Fig. 2 ... on average 12000 Request/Sec of client requests (NR) ...
    //  the throughput (HTP) averages 6000 Request/Sec"
    PaperPoint {
        threads: 1,
        nr: Some((12_000.0, 12_000.0)),
        htp: Some((6_000.0, 6_000.0)),
        source: "Fig. 2",
    },
    // "Fig. 3 ... the clients' average request rate of 10000 Request/Sec
    //  against a throughput of only 6000 Request/Sec on average"
    PaperPoint {
        threads: 2,
        nr: Some((10_000.0, 10_000.0)),
        htp: Some((6_000.0, 6_000.0)),
        source: "Fig. 3",
    },
    // "Fig. 5 ... with 3-4 threads the throughput rises to
    //  16000-18000 Request/Sec and every request is handled" (no NR value)
    PaperPoint {
        threads: 3,
        nr: None,
        htp: Some((16_000.0, 18_000.0)),
        source: "Fig. 5 (3-4 thr.)",
    },
    // "Fig. 4 ... requests (about 10000 Request/Sec) against a throughput
    //  of about 16000 Request/Sec"
    PaperPoint {
        threads: 4,
        nr: Some((10_000.0, 10_000.0)),
        htp: Some((16_000.0, 16_000.0)),
        source: "Fig. 4",
    },
];

/// The rest of Fig. 5, which the text gives only as ranges or a shape.
pub const FIG5_TEXT: &[&str] = &[
    "paper 000 Fig. 5 (1-200 threads), text only: 1-2 threads: NR 10000-14000, HTP 6000-8000 req/s;",
    "  3-4 threads: HTP 16000-18000 req/s, all requests handled;",
    "  beyond 4: HTP falls as threads grow, sharply once past 7 threads; NR falls too",
    "  (the HTP takes the CPU from the Network Receiver). No numbers for 5-200 threads.",
];

/// Figs. 6-7, which the text gives only as shapes.
pub const VTA_TEXT: &[&str] = &[
    "paper 000, Figs. 6-7 (text gives shapes only, no numbers): 20 min at 40-50 K packets/s",
    "  on a Raspberry Pi. Fig. 6: cumulative NR - HTP difference per fixed pool grows",
    "  positive with 1-2 threads (HTP slower than NR) and negative with 3-7 threads.",
    "  Fig. 7: with VTA the thread count follows NR, HTP stays close to NR and the",
    "  cumulative difference stays close to 0 throughout.",
];

/// The paper's point for `threads`, if the text gives one.
pub fn point(threads: usize) -> Option<&'static PaperPoint> {
    THREADS.iter().find(|p| p.threads == threads)
}

/// One method of paper 001's Fig. 4 (Raspberry Pi 2, 900 MHz, OpenWrt;
/// the text's values, microseconds per read -> compare -> write cycle,
/// averaged over 1000 repetitions).
#[derive(Clone, Copy, Debug)]
pub struct DirectPathPoint {
    /// Our method name in `directpath.csv`.
    pub method: &'static str,
    /// Microseconds per cycle.
    pub us: f64,
    /// What the paper timed.
    pub what: &'static str,
}

/// Paper 001, sec. 5: "about 126 usec", "11 usec", "about 0.72 usec".
pub const DIRECTPATH: &[DirectPathPoint] = &[
    DirectPathPoint {
        method: "user_api",
        us: 126.0,
        what: "User: open, read, compare, write, close on /sys/class/gpio",
    },
    DirectPathPoint {
        method: "user_optimized",
        us: 11.0,
        what: "User Optimization: file kept open, read + write",
    },
    DirectPathPoint {
        method: "direct_path",
        us: 0.72,
        what: "Kernel: gpio_get_value, compare, gpio_set_value in a kernel thread",
    },
];

/// The paper's figure for a `directpath.csv` method, if it has one.
pub fn directpath(method: &str) -> Option<&'static DirectPathPoint> {
    DIRECTPATH.iter().find(|p| p.method == method)
}

/// Paper 004, Fig. 5 (Pub Queue over QoS 1 vs QoS 2, mosquitto, Eclipse
/// Paho/Java, Windows 10, Core i3-4300). The figure is an image; the text
/// states only the ratio and the ordering result.
pub const MQTT_QOS2_OVER_PUBQUEUE: f64 = 2.0;
/// How far the lab's ratio may be from [`MQTT_QOS2_OVER_PUBQUEUE`]
/// (each lab reproduces its paper's figure within 15 %): 1.7-2.3x.
pub const MQTT_RATIO_TOLERANCE: f64 = 0.15;

/// What paper 004's text says about Fig. 5.
pub const MQTT_FIG5_TEXT: &[&str] = &[
    "paper 004 Fig. 5 (text; the per-run times are only in the image): 1,000 messages of 26 bytes",
    "  numbered 0001-1000, 5 runs each, mosquitto + Eclipse Paho (Java) on a Core i3-4300:",
    "  Pub Queue over QoS 1 about 2x faster than QoS 2 (conclusion: 'up to 2x or more'),",
    "  0001-1000 all arrived at the broker, none missing, in order.",
];

/// A (low, high) range as text: `12000` or `16000-18000`.
pub fn range(r: Option<(f64, f64)>) -> String {
    match r {
        None => "-".into(),
        Some((lo, hi)) if lo == hi => format!("{lo:.0}"),
        Some((lo, hi)) => format!("{lo:.0}-{hi:.0}"),
    }
}

/// Paper 003 (minimal-resource network subsystem, Zephyr 1.14.1 on a
/// FRDM-K64F with 802.15.4), Tables 3-5: how much the improved Zephyr
/// subsystem reduced, per transmission size, against the original, in %.
#[derive(Clone, Copy, Debug)]
pub struct ReductionRow {
    /// Transmission size, bytes.
    pub n: usize,
    /// Echo (UDP), %.
    pub echo: f64,
    /// CoAP (UDP), %.
    pub coap: f64,
    /// HTTP (TCP), %.
    pub http: f64,
}

const fn rr(n: usize, echo: f64, coap: f64, http: f64) -> ReductionRow {
    ReductionRow {
        n,
        echo,
        coap,
        http,
    }
}

// Tables 3-5 repeat one row shape: the paper's figures as printed, kept
// as literal rows so that they can be checked against it.
/// Table 3: memory allocation reduction.
pub const TABLE3_ALLOC: &[ReductionRow] = &[
    rr(128, 21.92, 21.92, 34.62),
    rr(256, 29.63, 29.63, 41.85),
    rr(384, 33.57, 33.57, 45.80),
    rr(512, 35.96, 35.96, 48.29),
    rr(640, 37.56, 37.56, 50.00),
    rr(768, 38.71, 38.71, 51.25),
    rr(896, 39.58, 39.58, 52.20),
    rr(1024, 40.25, 40.25, 52.95),
];

/// Table 4: memory copy reduction.
pub const TABLE4_COPY: &[ReductionRow] = &[
    rr(128, 59.53, 59.53, 69.38),
    rr(256, 62.90, 62.90, 71.88),
    rr(384, 64.11, 64.11, 72.84),
    rr(512, 64.73, 64.73, 73.35),
    rr(640, 65.11, 65.11, 73.66),
    rr(768, 65.36, 65.36, 73.88),
    rr(896, 65.54, 65.54, 74.03),
    rr(1024, 65.68, 65.68, 74.15),
];

/// Table 5: execution time reduction.
pub const TABLE5_TIME: &[ReductionRow] = &[
    rr(128, 7.33, 9.52, 16.71),
    rr(256, 12.48, 16.72, 26.72),
    rr(384, 16.91, 21.45, 32.72),
    rr(512, 20.20, 25.73, 38.28),
    rr(640, 23.05, 28.16, 42.37),
    rr(768, 25.63, 30.22, 45.74),
    rr(896, 26.51, 32.86, 47.54),
    rr(1024, 28.26, 34.34, 50.63),
];

/// The tables' "Avg" rows: (allocation, copy, time) reduction in %.
pub const AVG_ECHO: (f64, f64, f64) = (34.65, 64.12, 20.04);
/// As [`AVG_ECHO`], for CoAP.
pub const AVG_COAP: (f64, f64, f64) = (34.65, 64.12, 24.87);
/// As [`AVG_ECHO`], for HTTP.
pub const AVG_HTTP: (f64, f64, f64) = (47.12, 72.89, 37.59);

/// The paper's fitted lines (sections IV.2 and IV.4), as text.
pub const P003_FITS: &[&str] = &[
    "paper 003 (Zephyr 1.14.1, Cortex-M4, 802.15.4): sending n bytes",
    "  Zephyr UDP (echo, CoAP): alloc 2.18n + c, copy 3n + d;  TCP (HTTP): 3.36n + c', 4n + d'",
    "  improved UDP: alloc 1.18n + ~300, copy n + ~46;  improved TCP: 1.36n + ~500, n + ~68",
    "  time 32n + e -> 15n + e cycles (e ~ 20000-30000); minimal standard: alloc n + c, copy n",
    "  (c >= 48 bytes of UDP/IPv6 headers); the 0.18n is Zephyr's 24-byte net_buf per 128-byte block",
];
