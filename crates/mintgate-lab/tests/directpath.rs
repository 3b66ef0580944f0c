//! `lab directpath` end to end with few cycles: files, headers, rows, and
//! the orderings that hold on any machine (no timing targets: those are
//! the lab's to show, not a test's to assert on a shared box).

use std::sync::Arc;
use std::time::{Duration, Instant};

use mintgate_devices::directpath::WaitMode;
use mintgate_lab::directpath::{lab_directpath_with, Settings};
use mintgate_lab::LabOptions;

#[test]
fn directpath_lab_writes_its_table_and_files() {
    let started = Instant::now();
    let out = std::env::temp_dir().join(format!("mintgate-lab-dp-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let opts = LabOptions {
        out: out.clone(),
        quick: true,
        progress: Arc::new(|l: &str| eprintln!("{l}")),
        ..LabOptions::default()
    };
    let s = lab_directpath_with(
        &opts,
        &Settings {
            cycles: 300,
            waits: vec![WaitMode::Park],
        },
    )
    .expect("the lab runs");
    assert_eq!(s.lab, "directpath");
    assert!(s.target_met.is_some());
    assert!(
        s.table.contains("126.00") && s.table.contains("0.72"),
        "{}",
        s.table
    );

    let csv = std::fs::read_to_string(out.join("directpath.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("method,cycles,p50_us,p99_us"));
    let rows: Vec<(String, usize, f64, f64)> = lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            assert_eq!(f.len(), 4, "{l}");
            (
                f[0].to_string(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
                f[3].parse().unwrap(),
            )
        })
        .collect();
    let names: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "user_api",
            "user_optimized",
            "direct_path",
            "direct_path_e2e"
        ]
    );
    for (m, cycles, p50, p99) in &rows {
        assert_eq!(*cycles, 300, "{m}");
        assert!(*p50 > 0.0 && p99 >= p50, "{m}: {p50} {p99}");
    }
    let p50 = |m: &str| rows.iter().find(|r| r.0 == m).unwrap().2;
    // open+read+close+open+write+close costs more than pread+pwrite, and
    // both more than a compare and a store in memory
    assert!(p50("user_api") > p50("user_optimized"), "{rows:?}");
    assert!(p50("user_optimized") > p50("direct_path"), "{rows:?}");

    let waits = std::fs::read_to_string(out.join("directpath_waits.csv")).unwrap();
    let wl: Vec<&str> = waits.lines().collect();
    assert!(
        wl[0].starts_with("wait,loaded,worker_p50_us,e2e_p50_us"),
        "{}",
        wl[0]
    );
    assert!(wl.iter().any(|l| l.starts_with("spin,true,")), "{waits}");
    assert!(wl.iter().any(|l| l.starts_with("park,false,")), "{waits}");
    // overflow accounting is exact
    assert!(
        s.table.contains("pushed = processed + overflow: met"),
        "{}",
        s.table
    );
    assert!(
        !s.table.contains("pushed = processed + overflow: NOT met"),
        "{}",
        s.table
    );
    let svg = std::fs::read_to_string(out.join("directpath.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.len() > 1000);
    let _ = std::fs::remove_dir_all(&out);
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
}
