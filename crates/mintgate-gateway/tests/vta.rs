//! VTA over real sockets, in a test binary of its own so that no other test
//! competes for the two cores while the controller measures.

use std::time::{Duration, Instant};

use mintgate_gateway::config::{HandlerCost, PoolMode};
use mintgate_gateway::{resources, Config, Gateway};

#[test]
fn vta_grows_the_pool_past_the_cores_for_blocking_handlers_and_shrinks_it_when_idle() {
    let mut c = Config::default();
    c.coap.bind = vec!["127.0.0.1:0".parse().unwrap()];
    c.pipeline.pool = PoolMode::Vta;
    c.pipeline.threads = 2;
    c.vta.max_threads = 32;
    c.resources.request_cost = HandlerCost::Block(Duration::from_micros(500));
    let gw = Gateway::start(c.clone(), resources::router_for(&c)).expect("gateway starts");
    let addr = gw.local_addrs()[0];
    let mut spec = mintgate_loadgen::LoadSpec::new(
        addr,
        "/request",
        mintgate_loadgen::Mode::Closed {
            clients: 8,
            window: 8,
        },
    );
    spec.duration = Duration::from_secs(10);
    spec.warmup = Duration::from_millis(500);
    let report = mintgate_loadgen::run(&spec, |_| {}).expect("load runs");
    let grown = gw.htp_threads();
    let d = gw.vta_decision().expect("a decision every second");
    assert!(
        grown > 2,
        "blocking handlers got {grown} threads (decision {d:?})"
    );
    // 2 threads x 500 us can do at most 4000/s; once grown, the pool does more
    let late = report
        .per_second
        .iter()
        .rev()
        .take(3)
        .copied()
        .max()
        .unwrap_or(0);
    assert!(
        late as f64 > 4_000.0 * 1.25,
        "{late} req/s in the last seconds with {grown} threads: {:?}",
        report.per_second
    );
    // idle: back to one thread within 10 s
    let end = Instant::now() + Duration::from_secs(10);
    while gw.htp_threads() > 1 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(gw.htp_threads(), 1, "idle pool shrinks to one thread");
}
