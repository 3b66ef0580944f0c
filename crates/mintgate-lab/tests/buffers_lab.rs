//! `lab buffers --quick` end to end: the files, their headers, one row per
//! (path, impl, n), and the accounting figures that do not depend on timing.

use std::sync::Arc;

use mintgate_lab::buffers::SIZES;
use mintgate_lab::{lab_buffers, LabOptions};

// The http rows need the counting allocator, as the mintgate binary has it.
#[global_allocator]
static ALLOC: mintgate_buf::heap::CountingAlloc = mintgate_buf::heap::CountingAlloc;

#[test]
fn buffers_lab_writes_the_table_csvs_and_plot() {
    let out = std::env::temp_dir().join(format!("mintgate-buffers-lab-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let s = lab_buffers(&LabOptions {
        out: out.clone(),
        quick: true,
        progress: Arc::new(|l: &str| eprintln!("{l}")),
        ..LabOptions::default()
    })
    .expect("lab buffers runs");
    eprintln!("{}", s.table);
    assert_eq!(s.lab, "buffers");

    let csv = std::fs::read_to_string(out.join("buffers.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("path,impl,n,alloc_bytes,copy_bytes,ns_per_msg")
    );
    let rows: Vec<(String, String, usize, f64, f64, f64)> = lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            assert_eq!(f.len(), 6, "{l}");
            (
                f[0].to_string(),
                f[1].to_string(),
                f[2].parse().unwrap(),
                f[3].parse().unwrap(),
                f[4].parse().unwrap(),
                f[5].parse().unwrap(),
            )
        })
        .collect();
    assert_eq!(rows.len(), 4 * 2 * SIZES.len(), "{csv}");
    let get = |path: &str, imp: &str, n: usize| {
        rows.iter()
            .find(|r| r.0 == path && r.1 == imp && r.2 == n)
            .unwrap_or_else(|| panic!("no row {path} {imp} {n}"))
    };
    for &n in &SIZES {
        let nf = n as f64;
        // echo: one block that fits, nothing copied; naive: 3 buffers, 2 copies
        let e = get("echo", "mintgate", n);
        assert!(e.3 >= nf && e.3 < nf + 64.0 && e.4 == 0.0, "{e:?}");
        let v = get("echo", "naive", n);
        assert_eq!((v.3, v.4), (3.0 * nf, 2.0 * nf), "{v:?}");
        // coap: the payload written once, the head encoded in place; one
        // block sized to the payload plus at most 128 bytes (issue targets)
        let c = get("coap", "mintgate", n);
        assert_eq!(c.4, nf, "{c:?}");
        assert!(c.3 >= nf && c.3 <= nf + 128.0, "{c:?}");
        let cv = get("coap", "naive", n);
        assert!(cv.3 > 2.5 * nf && cv.4 > 2.5 * nf, "{cv:?}");
        // static payload: sent by reference, independent of n
        let st = get("coap-static", "mintgate", n);
        assert_eq!(st.4, 0.0, "{st:?}");
        assert!(st.3 <= 128.0, "{st:?}");
        assert_eq!(st.3, get("coap-static", "mintgate", SIZES[0]).3);
        assert!(rows.iter().all(|r| r.5 > 0.0), "every point has a time");
        // http: the response reaches hyper as a slice of the received
        // datagram, the proxy copies nothing; the naive one at least three
        // times
        let h = get("http", "mintgate", n);
        assert_eq!(h.4, 0.0, "{h:?}");
        assert!(h.3 >= nf, "{h:?}");
        let hv = get("http", "naive", n);
        assert!(hv.4 >= 3.0 * nf && hv.3 >= 2.0 * nf, "{hv:?}");
    }
    let layers = std::fs::read_to_string(out.join("buffers_layers.csv")).unwrap();
    assert!(layers.starts_with("path,impl,n,layer,alloc_bytes,copy_bytes\n"));
    assert!(layers.contains("coap,mintgate,1024,receive,"), "{layers}");
    let svg = std::fs::read_to_string(out.join("buffers.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert!(s.table.contains("Tables 3-5") && s.table.contains("http: allocated <= 1.2n + c"));
    assert!(s.table.contains("same as the lab loop"), "{}", s.table);
    let _ = std::fs::remove_dir_all(&out);
}
