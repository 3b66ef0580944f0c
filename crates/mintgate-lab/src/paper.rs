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

/// Paper 004, Fig. 5 (Pub Queue over QoS 1 vs QoS 2, mosquitto, Eclipse
/// Paho/Java, Windows 10, Core i3-4300). The figure is an image; the text
/// states only the ratio and the ordering result.
pub const MQTT_QOS2_OVER_PUBQUEUE: f64 = 2.0;

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
