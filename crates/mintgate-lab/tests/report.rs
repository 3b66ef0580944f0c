//! `lab all`'s runner and report on a cheap subset: the congestion lab in
//! the simulator (one seed, well under a second), a lab that fails, one that
//! panics and one that is skipped. The report must say which is which,
//! carry the lab's figure inline and its table, and keep going past the
//! failures.

use std::sync::{Arc, Mutex};

use mintgate_lab::report::{base64, run_labs, write_report, LabJob, Outcome};
use mintgate_lab::{lab_congestion, CongestionOptions, LabOptions};

#[test]
fn report_has_every_lab_its_figures_and_the_verdicts() {
    let out = std::env::temp_dir().join(format!("mintgate-report-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = lines.clone();
    let opts = LabOptions {
        out: out.clone(),
        quick: true,
        progress: Arc::new(move |l: &str| sink.lock().unwrap().push(l.to_owned())),
        ..LabOptions::default()
    };
    let o = opts.clone();
    let jobs = vec![
        LabJob {
            name: "fails",
            paper: "nothing",
            skip: None,
            run: Box::new(|| Err(anyhow::anyhow!("the peer <went> away"))),
        },
        LabJob {
            name: "panics",
            paper: "nothing",
            skip: None,
            run: Box::new(|| panic!("a bug in a lab")),
        },
        LabJob {
            name: "congestion",
            paper: "paper 002, Tables 1-3",
            skip: None,
            run: Box::new(move || {
                lab_congestion(&CongestionOptions {
                    common: o,
                    seed: 1,
                    runs: Some(1),
                    real: false,
                    requests: Some(200),
                })
            }),
        },
        LabJob {
            name: "proxy",
            paper: "paper 002, Tables 4-6",
            skip: Some("needs root".into()),
            run: Box::new(|| unreachable!("a skipped lab does not run")),
        },
    ];
    let results = run_labs(jobs, &opts.progress);
    let verdicts: Vec<&str> = results.iter().map(|r| r.verdict()).collect();
    assert_eq!(verdicts[0], "failed");
    assert_eq!(verdicts[1], "failed");
    assert!(
        verdicts[2] == "met" || verdicts[2] == "missed",
        "congestion ran: {:?}",
        results[2].outcome
    );
    assert_eq!(verdicts[3], "skipped");
    match &results[1].outcome {
        Outcome::Failed(m) => assert!(m.contains("a bug in a lab"), "{m}"),
        o => panic!("{o:?}"),
    }
    let progress = lines.lock().unwrap().join("\n");
    for want in [
        "[1/4] lab fails",
        "[3/4] lab congestion",
        "[4/4] lab proxy: skipped: needs root",
    ] {
        assert!(progress.contains(want), "{want} not in\n{progress}");
    }

    let path = write_report(&out, &results, "test report").unwrap();
    let html = std::fs::read_to_string(&path).unwrap();
    assert!(html.starts_with("<!doctype html>") && html.trim_end().ends_with("</html>"));
    // self-contained: the figure inline, nothing fetched
    let svg = std::fs::read(out.join("congestion.svg")).unwrap();
    assert!(html.contains(&format!("data:image/svg+xml;base64,{}", base64(&svg))));
    assert!(!html.contains("src=\"http") && !html.contains("href=\"http"));
    // the table beside the paper's, the CSV, the verdicts and the reasons
    let Outcome::Ran(s) = &results[2].outcome else {
        unreachable!()
    };
    let first = s.table.lines().find(|l| !l.trim().is_empty()).unwrap();
    assert!(
        html.contains(first.trim().split("  ").next().unwrap()),
        "{first}"
    );
    assert!(html.contains("congestion.csv"));
    assert!(
        html.contains("the peer &lt;went&gt; away"),
        "errors are escaped"
    );
    assert!(html.contains("Skipped: needs root"));
    assert!(html.contains("4 labs:") && html.contains("2 failed, 1 skipped"));
    // the summary row of the lab that ran counts its targets
    let row_at = html.find("<td><a href=\"#congestion\">").unwrap();
    let row = &html[row_at..row_at + html[row_at..].find("</tr>").unwrap()];
    assert!(row.contains("target line(s) met"), "{row}");
    let _ = std::fs::remove_dir_all(&out);
}
