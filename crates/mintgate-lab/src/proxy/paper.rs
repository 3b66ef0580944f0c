//! Paper 002's Tables 4-6: per loss level and interval, QUIC's and HTTP's
//! CoAP RTT, total RTT and Internet RTT (the tables' "UDP" and "TCP"
//! columns), ms; and the report's comparison of our cases with them.
//!
//! The figures are the paper's as printed (one misprint resolved, said at
//! [`TABLES`]); the comparison computes our gain the way the paper does,
//! (HTTP - QUIC) / QUIC, so the two columns can be read side by side.

use super::{find, line, Case, Mode, Proto};

/// One table.
pub struct Table {
    /// Loss on the CoAP leg, percent.
    pub loss_pct: u32,
    /// QUIC: (CoAP RTT, total RTT, Internet RTT) per interval.
    pub quic: [[f64; 3]; 10],
    /// HTTP: the same.
    pub http: [[f64; 3]; 10],
    /// The Internet RTT means the text gives: QUIC, HTTP.
    pub means: [f64; 2],
    /// QUIC's advantage the text gives, percent ((HTTP - QUIC) / QUIC).
    pub better_pct: f64,
}

/// Tables 4, 5 and 6 (Table 4's interval 8 QUIC total is printed as
/// "297."; taken as 297.0).
pub const TABLES: [Table; 3] = [
    Table {
        loss_pct: 5,
        quic: [
            [202.0, 283.0, 80.9],
            [260.3, 342.9, 82.6],
            [247.2, 329.8, 82.6],
            [211.4, 295.4, 84.0],
            [238.8, 317.1, 78.3],
            [213.8, 297.5, 83.7],
            [237.5, 319.0, 81.5],
            [214.4, 297.0, 82.9],
            [235.1, 317.4, 82.2],
            [229.3, 318.9, 89.6],
        ],
        http: [
            [206.7, 297.0, 90.3],
            [211.9, 302.2, 90.2],
            [214.4, 304.4, 90.0],
            [221.2, 311.5, 90.3],
            [230.5, 321.0, 90.4],
            [220.1, 310.7, 90.5],
            [192.8, 282.9, 90.0],
            [243.6, 334.4, 90.8],
            [285.2, 375.3, 90.1],
            [229.4, 320.0, 90.5],
        ],
        means: [82.87, 90.37],
        better_pct: 9.05,
    },
    Table {
        loss_pct: 10,
        quic: [
            [345.1, 421.5, 76.4],
            [332.9, 408.1, 75.2],
            [297.4, 381.0, 83.5],
            [347.3, 431.2, 83.9],
            [309.4, 388.5, 79.0],
            [364.1, 443.8, 79.6],
            [265.8, 348.4, 82.5],
            [311.4, 393.0, 81.6],
            [275.6, 357.0, 81.4],
            [283.2, 365.3, 82.1],
        ],
        http: [
            [268.2, 358.6, 90.4],
            [241.4, 331.6, 90.2],
            [331.5, 421.0, 89.5],
            [287.5, 376.9, 89.4],
            [291.6, 381.2, 89.5],
            [312.8, 402.5, 89.6],
            [228.4, 319.5, 91.0],
            [232.7, 321.9, 89.2],
            [242.9, 332.8, 89.9],
            [264.4, 353.9, 89.5],
        ],
        means: [80.56, 89.87],
        better_pct: 11.5,
    },
    Table {
        loss_pct: 15,
        quic: [
            [356.3, 434.4, 78.1],
            [448.5, 517.5, 69.0],
            [437.2, 515.3, 78.1],
            [483.1, 551.8, 68.6],
            [443.0, 519.7, 76.2],
            [430.0, 506.7, 76.6],
            [411.4, 490.2, 78.8],
            [543.0, 621.5, 78.3],
            [429.0, 499.8, 70.7],
            [376.0, 455.8, 79.7],
        ],
        http: [
            [376.9, 467.5, 90.6],
            [427.8, 517.4, 89.5],
            [319.5, 409.9, 90.4],
            [298.1, 387.7, 89.5],
            [322.4, 412.3, 89.8],
            [336.2, 425.2, 89.0],
            [285.5, 375.0, 89.5],
            [386.4, 477.2, 90.8],
            [315.7, 406.1, 90.3],
            [292.8, 381.9, 89.0],
        ],
        means: [75.46, 89.88],
        better_pct: 19.1,
    },
];

/// The comparison table of the report: per loss level, the paper's Internet
/// RTT means and gain beside ours, persistent and with a new connection per
/// request, and the share of 0-RTT requests.
pub(super) fn comparison(t: &mut String, cases: &[Case]) {
    line(
        t,
        format_args!(
            "{:>5} | {:>22} | {:>27} | {:>27} | {:>7}",
            "loss",
            "paper QUIC / HTTP (gain)",
            "ours persistent h3 / h1",
            "ours new-conn h3 / h1",
            "0-RTT"
        ),
    );
    for p in &TABLES {
        let l = p.loss_pct;
        let get = |pr, m| find(cases, l, pr, m).map(|c| c.mean(2)).unwrap_or(f64::NAN);
        let (p3, p1) = (
            get(Proto::H3, Mode::Persistent),
            get(Proto::H1, Mode::Persistent),
        );
        let (n3, n1) = (get(Proto::H3, Mode::New), get(Proto::H1, Mode::New));
        let early = find(cases, l, Proto::H3, Mode::New)
            .map(|c| {
                c.samples.iter().filter(|s| s.early).count() as f64 / c.samples.len().max(1) as f64
                    * 100.0
            })
            .unwrap_or(0.0);
        line(
            t,
            format_args!(
                "{:>4}% | {:>6.1} / {:>5.1} ({:>4.1}%) | {:>7.1} / {:>7.1} ({:>+6.1}%) | {:>7.1} / {:>7.1} ({:>+6.1}%) | {:>6.0}%",
                l,
                p.means[0],
                p.means[1],
                p.better_pct,
                p3,
                p1,
                (p1 - p3) / p3 * 100.0,
                n3,
                n1,
                (n1 - n3) / n3 * 100.0,
                early
            ),
        );
    }
    line(
        t,
        format_args!(
            "(gain) = (HTTP - QUIC) / QUIC, as the paper computes it; 0-RTT: share of new-conn h3 requests the server accepted as early data"
        ),
    );
}
