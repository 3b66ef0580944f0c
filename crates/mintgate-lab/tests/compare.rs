//! `lab clients` and `lab blocksize` with tiny settings: fresh servers per
//! step, one CSV row per (server, step, run), every request answered at a
//! load far below capacity, and the answer size honoured.

use std::sync::Arc;
use std::time::Duration;

use mintgate_lab::{lab_blocksize, lab_clients, CompareOptions, LabOptions};

fn opts(dir: &str) -> CompareOptions {
    let out = std::env::temp_dir().join(format!("mintgate-{dir}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let d = CompareOptions::default();
    CompareOptions {
        common: LabOptions {
            out,
            quick: true,
            duration: Some(Duration::from_secs(2)),
            progress: Arc::new(|_| {}),
            ..d.common
        },
        clients: Some(vec![20]),
        runs: Some(1),
        cooldown: Some(Duration::ZERO),
        // libcoap is compared in the lab itself; here only mintgate's two
        // pools, so the test does not depend on the peer
        no_libcoap: true,
        ..d
    }
}

fn rows(path: &std::path::Path) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(path).expect("the CSV exists");
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("server,clients,size,run,offered_rps,answered_rps,loss_pct,p99_ms")
    );
    lines
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect()
}

#[test]
fn clients_and_blocksize_labs_measure_each_server_once_per_step() {
    let o = opts("clients");
    let s = lab_clients(&o).expect("lab clients runs");
    let r = rows(&o.common.out.join("clients.csv"));
    assert_eq!(r.len(), 2, "{r:?}");
    for row in &r {
        assert!(["mintgate_vta", "mintgate_fixed"].contains(&row[0].as_str()));
        assert_eq!(row[1], "20");
        assert_eq!(row[2], "11", "hello world");
        let answered: f64 = row[5].parse().unwrap();
        // 20 clients x 10/s, far below capacity
        assert!((150.0..=260.0).contains(&answered), "{row:?}");
    }
    assert!(s.table.contains("first loses requests"));

    let mut o = opts("blocksize");
    o.sizes = Some(vec![100, 900]);
    lab_blocksize(&o).expect("lab blocksize runs");
    let r = rows(&o.common.out.join("blocksize.csv"));
    assert_eq!(r.len(), 4, "{r:?}");
    let sizes: Vec<&str> = r.iter().map(|row| row[2].as_str()).collect();
    assert_eq!(sizes.iter().filter(|s| **s == "100").count(), 2);
    assert_eq!(sizes.iter().filter(|s| **s == "900").count(), 2);
    for row in &r {
        let loss: f64 = row[6].parse().unwrap();
        assert!(loss < 5.0, "{row:?}");
    }
    let svg = std::fs::read_to_string(o.common.out.join("blocksize.svg")).unwrap();
    assert!(svg.starts_with("<svg"));
}
