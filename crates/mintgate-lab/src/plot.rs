//! SVG charts (plotters' SVG backend: no fonts needed).

use std::path::Path;

use plotters::prelude::*;

use crate::paper;
use crate::threads::ThreadsRow;
use crate::vta::VtaRow;

// The figures' ChartBuilder chains here and in the labs (overload.rs,
// clients.rs, ...) look alike, but each sets its own caption, sizes,
// ranges and axis text; what is the same in all (err, legend) is shared.
/// A plotters error as the labs report it (every lab's charts use this).
pub(crate) fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("drawing the chart: {e}")
}

/// Draws a chart's legend at `pos` in the labs' one style: a white box,
/// mostly opaque, with a black border. `labels` may be styled further
/// first (a font).
pub(crate) fn legend<'a, DB, CT>(
    labels: &mut plotters::chart::SeriesLabelStyle<'a, '_, DB, CT>,
    pos: SeriesLabelPosition,
) -> anyhow::Result<()>
where
    DB: DrawingBackend + 'a,
    CT: plotters::coord::CoordTranslate,
{
    labels
        .position(pos)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)
}

const NR: RGBColor = RGBColor(0x1f, 0x77, 0xb4);
const HTP: RGBColor = RGBColor(0xd6, 0x27, 0x28);
const ARRIVED: RGBColor = RGBColor(0x7f, 0x7f, 0x7f);
const THREADS: RGBColor = RGBColor(0x2c, 0xa0, 0x2c);
const OFFERED: RGBColor = RGBColor(0xbc, 0xbd, 0x22);

/// A tick label for a count axis: integers only.
fn integer_label(v: f64) -> String {
    if (v - v.round()).abs() < 1e-6 {
        format!("{v:.0}")
    } else {
        String::new()
    }
}

fn nice_max(v: f64) -> f64 {
    if v <= 0.0 {
        1.0
    } else {
        v * 1.1
    }
}

/// `threads.svg`: R, H and R + dropped against the thread count, with the
/// values the paper's text gives as markers.
pub fn threads_svg(
    path: &Path,
    rows: &[ThreadsRow],
    offered: f64,
    cost: &str,
) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let xmax = rows.iter().map(|r| r.threads).max().unwrap_or(1).max(4) as f64 + 0.5;
    let ymax = nice_max(
        rows.iter()
            .map(|r| r.nr_rps + r.dropped_per_s)
            .chain(rows.iter().map(|r| r.htp_rps))
            .chain(paper::THREADS.iter().filter_map(|p| p.htp.map(|h| h.1)))
            .chain(paper::THREADS.iter().filter_map(|p| p.nr.map(|h| h.1)))
            .fold(offered, f64::max),
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("NR vs HTP by fixed thread count (handler {cost}; paper 000 Figs. 2-5)"),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.5f64..xmax, 0f64..ymax)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("HTP threads (fixed)")
        .y_desc("requests/s")
        .x_label_formatter(&|x| integer_label(*x))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(err)?;
    let series = |f: fn(&ThreadsRow) -> f64| -> Vec<(f64, f64)> {
        rows.iter().map(|r| (r.threads as f64, f(r))).collect()
    };
    for (label, color, pts) in [
        ("ours: R (NR, accepted)", NR, series(|r| r.nr_rps)),
        ("ours: H (HTP, handled)", HTP, series(|r| r.htp_rps)),
        (
            "ours: R + dropped (reached the receiver)",
            ARRIVED,
            series(|r| r.nr_rps + r.dropped_per_s),
        ),
    ] {
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart
            .draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled())))
            .map_err(err)?;
    }
    let mid = |r: (f64, f64)| (r.0 + r.1) / 2.0;
    chart
        .draw_series(paper::THREADS.iter().filter_map(|p| {
            p.nr.map(|r| TriangleMarker::new((p.threads as f64, mid(r)), 7, NR.filled()))
        }))
        .map_err(err)?
        .label("paper (text): NR")
        .legend(|(x, y)| TriangleMarker::new((x + 10, y), 7, NR.filled()));
    chart
        .draw_series(paper::THREADS.iter().filter_map(|p| {
            p.htp
                .map(|r| TriangleMarker::new((p.threads as f64, mid(r)), 7, HTP.filled()))
        }))
        .map_err(err)?
        .label("paper (text): HTP")
        .legend(|(x, y)| TriangleMarker::new((x + 10, y), 7, HTP.filled()));
    chart
        .draw_series(std::iter::once(PathElement::new(
            vec![(0.5, offered), (xmax, offered)],
            OFFERED.stroke_width(1),
        )))
        .map_err(err)?
        .label("offered load")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], OFFERED));
    legend(
        &mut chart.configure_series_labels(),
        SeriesLabelPosition::UpperRight,
    )?;
    root.present().map_err(err)?;
    Ok(())
}

/// `vta.svg`: top, offered, R and H rates with the thread count on a second
/// axis (the paper's Fig. 7); bottom, the cumulative R - H (Fig. 6's
/// measure, for the VTA pool).
pub fn vta_svg(path: &Path, rows: &[VtaRow], cost: &str) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (1000, 760)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (top, bottom) = root.split_vertically(480);
    let tmax = rows.iter().map(|r| r.t).fold(1.0, f64::max);
    let ymax = nice_max(
        rows.iter()
            .flat_map(|r| [r.offered_rps, r.nr_rps, r.htp_rps])
            .fold(0.0, f64::max),
    );
    let nmax = rows.iter().map(|r| r.threads).max().unwrap_or(1) as f64 + 1.0;
    let mut chart = ChartBuilder::on(&top)
        .caption(
            format!("VTA: NR and HTP throughput and threads over time (handler {cost}; paper 000 Fig. 7)"),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .right_y_label_area_size(50)
        .build_cartesian_2d(0f64..tmax, 0f64..ymax)
        .map_err(err)?
        .set_secondary_coord(0f64..tmax, 0f64..nmax);
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc("requests/s")
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(err)?;
    chart
        .configure_secondary_axes()
        .y_desc("HTP threads")
        .y_label_formatter(&|y| integer_label(*y))
        .draw()
        .map_err(err)?;
    let series =
        |f: fn(&VtaRow) -> f64| -> Vec<(f64, f64)> { rows.iter().map(|r| (r.t, f(r))).collect() };
    for (label, color, width, pts) in [
        ("offered", OFFERED, 1, series(|r| r.offered_rps)),
        ("R (NR)", NR, 2, series(|r| r.nr_rps)),
        ("H (HTP)", HTP, 1, series(|r| r.htp_rps)),
    ] {
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(width)))
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .draw_secondary_series(LineSeries::new(
            series(|r| r.threads as f64),
            THREADS.stroke_width(2),
        ))
        .map_err(err)?
        .label("threads (right axis)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], THREADS));
    legend(
        &mut chart.configure_series_labels(),
        SeriesLabelPosition::UpperRight,
    )?;

    let cmax = rows
        .iter()
        .map(|r| r.cum_diff.unsigned_abs())
        .max()
        .unwrap_or(0)
        .max(10) as f64
        * 1.2;
    let mut c2 = ChartBuilder::on(&bottom)
        .caption(
            "cumulative R - H (requests; paper 000 Fig. 6's measure)",
            ("sans-serif", 16),
        )
        .margin(12)
        .margin_right(62)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..tmax, -cmax..cmax)
        .map_err(err)?;
    c2.configure_mesh()
        .x_desc("time (s)")
        .y_desc("requests")
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(err)?;
    c2.draw_series(LineSeries::new(
        series(|r| r.cum_diff as f64),
        BLACK.stroke_width(2),
    ))
    .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// One run of `lab fleet` for [`fleet_svg`]: per second of the run
/// (seconds, messages that reached the end, their p99 latency in ms).
pub struct FleetSeries {
    /// The run's name (JetStream, nats-server MQTT, mosquitto).
    pub label: String,
    /// (second, messages, p99 ms).
    pub points: Vec<(f64, f64, f64)>,
}

/// `fleet.svg`: top, messages per second that reached the end (stored in
/// the stream, or at the MQTT subscriber) for each run; bottom, their p99
/// latency from the sensor's sample (log scale). The failures of the
/// first run are vertical lines.
pub fn fleet_svg(
    path: &Path,
    title: &str,
    runs: &[FleetSeries],
    events: &[(f64, String)],
) -> anyhow::Result<()> {
    const COLORS: [RGBColor; 3] = [NR, HTP, THREADS];
    let root = SVGBackend::new(path, (1000, 760)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (top, bottom) = root.split_vertically(400);
    let all = || runs.iter().flat_map(|r| r.points.iter());
    let tmax = all().map(|p| p.0 + 1.0).fold(1.0, f64::max);
    let ymax = nice_max(all().map(|p| p.1).fold(0.0, f64::max));
    let lmax = all().map(|p| p.2).fold(10.0, f64::max) * 2.0;
    let mut chart = ChartBuilder::on(&top)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..tmax, 0f64..ymax)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("second of the run (by sample time)")
        .y_desc("messages/s at the end")
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(err)?;
    for (r, color) in runs.iter().zip(COLORS) {
        chart
            .draw_series(LineSeries::new(
                r.points.iter().map(|p| (p.0, p.1)),
                color.stroke_width(2),
            ))
            .map_err(err)?
            .label(r.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    for (t, _) in events {
        chart
            .draw_series(LineSeries::new(vec![(*t, 0.0), (*t, ymax)], ARRIVED))
            .map_err(err)?;
    }
    legend(
        &mut chart.configure_series_labels(),
        SeriesLabelPosition::LowerRight,
    )?;
    let mut c2 = ChartBuilder::on(&bottom)
        .caption(
            "p99 latency, sensor sample to the end, per second (grey: failures of the first run)",
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..tmax, (1f64..lmax).log_scale())
        .map_err(err)?;
    c2.configure_mesh()
        .x_desc("second of the run (by sample time)")
        .y_desc("ms (log)")
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(err)?;
    for (r, color) in runs.iter().zip(COLORS) {
        c2.draw_series(LineSeries::new(
            r.points.iter().map(|p| (p.0, p.2.max(1.0))),
            color.stroke_width(2),
        ))
        .map_err(err)?;
    }
    for (t, _) in events {
        c2.draw_series(LineSeries::new(vec![(*t, 1.0), (*t, lmax)], ARRIVED))
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// `fieldbus.svg`: for each end (the poll read, Observe, MQTT, the coil),
/// the share of register changes it saw within x ms of the change (an
/// empirical distribution), with the targets as vertical lines.
pub fn fieldbus_svg(
    path: &Path,
    title: &str,
    ends: &[(String, Vec<f64>)],
    targets: &[(String, f64)],
) -> anyhow::Result<()> {
    const COLORS: [RGBColor; 4] = [ARRIVED, NR, THREADS, HTP];
    let root = SVGBackend::new(path, (1000, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let xmax = nice_max(
        ends.iter()
            .flat_map(|(_, v)| v.iter().copied())
            .chain(targets.iter().map(|t| t.1))
            .fold(1.0, f64::max),
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..xmax, 0f64..1.02f64)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("ms from the register change in the simulator")
        .y_desc("share of changes seen")
        .y_label_formatter(&|y| format!("{:.0} %", y * 100.0))
        .draw()
        .map_err(err)?;
    for ((name, v), color) in ends.iter().zip(COLORS) {
        let mut s = v.clone();
        s.sort_by(f64::total_cmp);
        let n = s.len().max(1) as f64;
        let pts: Vec<(f64, f64)> = s
            .iter()
            .enumerate()
            .map(|(i, &x)| (x, (i + 1) as f64 / n))
            .collect();
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)))
            .map_err(err)?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    for ((label, x), color) in targets.iter().zip([OFFERED, BLACK]) {
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(*x, 0.0), (*x, 1.02)],
                color.stroke_width(1),
            )))
            .map_err(err)?
            .label(label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    legend(
        &mut chart.configure_series_labels(),
        SeriesLabelPosition::LowerRight,
    )?;
    root.present().map_err(err)?;
    Ok(())
}
