//! `buffers.svg`: the lab's rows drawn against n, with paper 003's
//! improved-Zephyr lines and the minimal-resource standard as references.

use std::path::Path;

use plotters::prelude::*;

use super::{BufRow, Impl, PathKind};

use crate::plot::err;

/// `buffers.svg`: allocated, copied and time per message against n, one
/// line per (path, impl); the paper's improved-Zephyr lines and the
/// minimal-resource standard as references.
pub(super) fn buffers_svg(path: &Path, rows: &[BufRow]) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (1000, 1200)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let panels = root.split_evenly((3, 1));
    let series: [(PathKind, Impl, RGBColor); 8] = [
        (PathKind::Echo, Impl::Mintgate, RGBColor(0x1f, 0x77, 0xb4)),
        (PathKind::Echo, Impl::Naive, RGBColor(0xae, 0xc7, 0xe8)),
        (PathKind::Coap, Impl::Mintgate, RGBColor(0xd6, 0x27, 0x28)),
        (PathKind::Coap, Impl::Naive, RGBColor(0xff, 0x98, 0x96)),
        (
            PathKind::CoapStatic,
            Impl::Mintgate,
            RGBColor(0x2c, 0xa0, 0x2c),
        ),
        (
            PathKind::CoapStatic,
            Impl::Naive,
            RGBColor(0x98, 0xdf, 0x8a),
        ),
        (PathKind::Http, Impl::Mintgate, RGBColor(0x94, 0x67, 0xbd)),
        (PathKind::Http, Impl::Naive, RGBColor(0xc5, 0xb0, 0xd5)),
    ];
    type Metric = fn(&BufRow) -> f64;
    let metrics: [(&str, &str, Metric); 3] = [
        ("bytes allocated per message", "bytes", |r| r.alloc_bytes),
        ("bytes copied per message", "bytes", |r| r.copy_bytes),
        ("server time per message", "ns", |r| r.ns_per_msg),
    ];
    let x = 0f64..1100f64;
    for (i, (area, (title, unit, f))) in panels.iter().zip(metrics).enumerate() {
        // http's time is a client round trip (tens of us): not on the
        // server-time panel, whose scale is the buffer work's.
        let shown = |p: PathKind| i != 2 || p != PathKind::Http;
        let ymax = rows
            .iter()
            .filter(|r| shown(r.path))
            .map(f)
            .fold(1.0, f64::max)
            * 1.1;
        let mut chart = ChartBuilder::on(area)
            .caption(
                format!("{title} (paper 003 Table {}; mintgate vs naive)", 3 + i),
                ("sans-serif", 18),
            )
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(70)
            .build_cartesian_2d(x.clone(), 0f64..ymax)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("payload n (bytes)")
            .y_desc(unit)
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()
            .map_err(err)?;
        for (p, imp, color) in series.into_iter().filter(|s| shown(s.0)) {
            let pts: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.path == p && r.imp == imp)
                .map(|r| (r.n as f64, f(r)))
                .collect();
            if pts.is_empty() {
                continue;
            }
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                .map_err(err)?
                .label(format!("{} {}", p.name(), imp.name()))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            chart
                .draw_series(pts.into_iter().map(|q| Circle::new(q, 3, color.filled())))
                .map_err(err)?;
        }
        let refs: &[(&str, f64, f64)] = match i {
            0 => &[
                ("paper: improved Zephyr UDP 1.18n + 300", 1.18, 300.0),
                ("minimal standard n + 48 (UDP headers)", 1.0, 48.0),
            ],
            1 => &[
                ("paper: improved Zephyr UDP n + 46", 1.0, 46.0),
                ("paper: Zephyr UDP 3n (+ d, not given)", 3.0, 0.0),
            ],
            _ => &[],
        };
        for (k, (label, a, c)) in refs.iter().enumerate() {
            let color = if k == 0 {
                BLACK
            } else {
                RGBColor(0x7f, 0x7f, 0x7f)
            };
            let pts: Vec<(f64, f64)> = [128.0, 1024.0].iter().map(|n| (*n, a * n + c)).collect();
            chart
                .draw_series(DashedLineSeries::new(pts, 6, 4, color.stroke_width(1)))
                .map_err(err)?
                .label(*label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
        crate::plot::legend(
            &mut chart.configure_series_labels(),
            SeriesLabelPosition::UpperLeft,
        )?;
    }
    root.present().map_err(err)?;
    Ok(())
}
