//! Both labs end to end with very short settings: files, headers, one row
//! per step or second, sane numbers.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mintgate_lab::{lab_threads, lab_vta, LabOptions};

fn rows(path: &Path, header: &str) -> Vec<Vec<f64>> {
    let text = std::fs::read_to_string(path).expect("the CSV exists");
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(header), "{}", path.display());
    lines
        .map(|l| {
            l.split(',')
                .map(|v| {
                    v.parse::<f64>()
                        .unwrap_or_else(|_| panic!("`{v}` in `{l}`"))
                })
                .collect::<Vec<f64>>()
        })
        .inspect(|r| assert_eq!(r.len(), header.split(',').count()))
        .collect()
}

fn svg_ok(path: &Path) {
    let text = std::fs::read_to_string(path).expect("the SVG exists");
    assert!(text.len() > 1000, "{} is too small", path.display());
    assert!(text.starts_with("<svg"), "{}", path.display());
    assert!(text.trim_end().ends_with("</svg>"), "{}", path.display());
}

#[test]
fn threads_and_vta_labs_write_sane_csvs_and_plots() {
    let started = Instant::now();
    let out = std::env::temp_dir().join(format!("mintgate-lab-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let lines = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = lines.clone();
    let base = LabOptions {
        out: out.clone(),
        quick: true,
        progress: Arc::new(move |l: &str| {
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            eprintln!("{l}");
        }),
        ..LabOptions::default()
    };

    // lab threads: 1..=2 threads, 3 s measured per step
    let s = lab_threads(&LabOptions {
        max_threads: Some(2),
        duration: Some(Duration::from_secs(3)),
        warmup: Some(Duration::from_secs(1)),
        clients: Some(1000),
        ..base.clone()
    })
    .expect("lab threads runs");
    assert_eq!(s.lab, "threads");
    assert!(s.table.contains("Fig. 2"), "{}", s.table);
    let t = rows(
        &out.join("threads.csv"),
        "threads,nr_rps,htp_rps,dropped_per_s",
    );
    assert_eq!(t.len(), 2, "one row per thread count: {t:?}");
    for (i, r) in t.iter().enumerate() {
        let (n, nr, htp, dropped) = (r[0], r[1], r[2], r[3]);
        assert_eq!(n as usize, i + 1);
        assert!(nr > 100.0, "thread count {n}: R {nr}");
        assert!(htp > 100.0, "thread count {n}: H {htp}");
        assert!(
            htp <= nr * 1.05 + 50.0,
            "thread count {n}: H {htp} > R {nr}"
        );
        assert!(dropped >= 0.0);
        // 1000 clients x 10 req/s: what reached the receiver is about that
        assert!(nr + dropped < 10_000.0 * 1.2, "{r:?}");
    }
    svg_ok(&out.join("threads.svg"));

    // lab vta: an 8 s profile
    let d = 8;
    let s = lab_vta(&LabOptions {
        duration: Some(Duration::from_secs(d)),
        peak_rps: Some(4000.0),
        ..base.clone()
    })
    .expect("lab vta runs");
    assert_eq!(s.lab, "vta");
    assert!(s.target_met.is_some());
    assert!(s.table.contains("final cumulative"), "{}", s.table);
    let v = rows(
        &out.join("vta.csv"),
        "t,offered_rps,nr_rps,htp_rps,threads,queue,cum_diff",
    );
    // one row per second of the profile, plus the recorded tail (3 s)
    assert!(
        (d as usize..=d as usize + 4).contains(&v.len()),
        "{} rows: {v:?}",
        v.len()
    );
    let mut prev_t = f64::NEG_INFINITY;
    let (mut sum_r, mut sum_h) = (0.0, 0.0);
    for r in &v {
        let (t, offered, nr, htp, threads, queue, cum) = (r[0], r[1], r[2], r[3], r[4], r[5], r[6]);
        assert!(
            t > prev_t && t - prev_t < 2.5 || prev_t.is_infinite(),
            "{v:?}"
        );
        prev_t = t;
        assert!((0.0..=4_000.0 * 1.01).contains(&offered), "{r:?}");
        assert!(nr >= 0.0 && htp >= 0.0 && queue >= 0.0, "{r:?}");
        assert!(threads >= 1.0, "{r:?}");
        sum_r += nr;
        sum_h += htp;
        // nothing is handled before it was accepted
        assert!(cum >= -50.0, "{r:?}");
    }
    assert!(sum_r > 1000.0, "the load arrived: {v:?}");
    assert!(sum_h <= sum_r * 1.02 + 50.0, "H {sum_h} > R {sum_r}");
    svg_ok(&out.join("vta.svg"));
    assert!(lines.load(std::sync::atomic::Ordering::Relaxed) >= 2 + d as usize);

    let _ = std::fs::remove_dir_all(&out);
    assert!(
        started.elapsed() < Duration::from_secs(40),
        "took {:?}",
        started.elapsed()
    );
}
