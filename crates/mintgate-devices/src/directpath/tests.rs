use std::sync::atomic::AtomicUsize;

use super::output::ActuatorOut;
use super::*;
use crate::driver::Driver;
use crate::sim::SimActuator;

fn cfg(wait: WaitMode, cap: usize) -> DirectPathConfig {
    DirectPathConfig {
        ring_capacity: cap,
        wait,
        priority: 0,
        links: vec![],
        max_links: 256,
    }
}

fn actuator(name: &str) -> (Arc<SimActuator>, Arc<dyn OutputSink>) {
    let a = Arc::new(SimActuator::new());
    let out: Arc<dyn OutputSink> = Arc::new(ActuatorOut {
        name: name.into(),
        driver: a.clone() as Arc<dyn Driver>,
        after: None,
    });
    (a, out)
}

fn filters(specs: &[&str]) -> Vec<Filter> {
    specs
        .iter()
        .map(|s| Filter::spec(s.parse().unwrap()).unwrap())
        .collect()
}

#[test]
fn every_wait_mode_delivers_read_compare_write() {
    for wait in [
        WaitMode::Spin,
        WaitMode::Park,
        WaitMode::SpinThenPark(Duration::from_micros(20)),
        WaitMode::Predict(Duration::from_micros(20)),
    ] {
        // A ring larger than the 201 events: delivery is what is tested
        // here, not keeping pace (a busy machine may delay the wake-up).
        let dp = DirectPath::start(&cfg(wait, 256)).unwrap();
        let (a, out) = actuator("led0");
        dp.add_link(
            3,
            "in3 | compare(==, 0) -> actuator(led0)".into(),
            filters(&["compare(==, 0)", "expr(x + 7)"]),
            vec![out],
        );
        let inj = dp.injector();
        for i in 0..200u32 {
            assert!(inj.push(3, (i % 2) as f64, now_ns()));
            if i % 16 == 0 {
                std::thread::sleep(Duration::from_micros(300));
            }
        }
        assert!(inj.push(9, 1.0, now_ns()), "an input with no link");
        assert!(dp.drain(Duration::from_secs(10)), "{wait}");
        let s = dp.snapshot();
        assert_eq!(
            s.pushed, 200,
            "{wait}: the unlinked event never enters the ring"
        );
        assert_eq!(s.processed, 200);
        assert_eq!(s.overflow, 0);
        assert_eq!(s.unlinked, 1);
        assert_eq!(s.passed, 100, "the even events pass compare(==, 0)");
        assert_eq!(s.filtered, 100);
        assert_eq!(s.fired, 100);
        assert_eq!(a.writes(), 100);
        assert_eq!(a.value(), 7.0);
        assert_eq!(dp.stats().worker_ns.count(), 200);
        assert!(s.e2e_p99_ns >= s.worker_p50_ns);
        if wait == WaitMode::Spin {
            assert_eq!(s.parks, 0);
        }
        assert!(dp.worker_cpu().is_some());
        assert!(dp.applied_priority().is_some());
    }
}

#[test]
fn a_full_ring_counts_every_overflow() {
    let dp = DirectPath::start(&cfg(WaitMode::Park, 8)).unwrap();
    let gate = Arc::new(AtomicBool::new(false));
    let g = gate.clone();
    let seen = Arc::new(AtomicUsize::new(0));
    let s2 = seen.clone();
    // a filter that holds the worker until the producer is done
    let slow = Filter::callback("hold", move |v, _| {
        let until = now_ns() + 5_000_000_000;
        while !g.load(Ordering::Acquire) && now_ns() < until {
            std::thread::sleep(Duration::from_micros(100));
        }
        s2.fetch_add(1, Ordering::Relaxed);
        Some(v)
    });
    let (_a, out) = actuator("a");
    dp.add_link(0, "in0 -> actuator(a)".into(), vec![slow], vec![out]);
    let inj = dp.injector();
    let mut accepted = 0;
    for i in 0..1000 {
        if inj.push(0, i as f64, now_ns()) {
            accepted += 1;
        }
    }
    gate.store(true, Ordering::Release);
    assert!(dp.drain(Duration::from_secs(10)));
    let s = dp.snapshot();
    assert_eq!(s.pushed, 1000);
    assert!(s.overflow >= 1000 - 9, "{s:?}");
    assert_eq!(s.pushed, s.processed + s.overflow, "nothing lost silently");
    assert_eq!(s.processed, accepted);
    assert_eq!(seen.load(Ordering::Relaxed) as u64, accepted);
}

#[test]
fn links_change_at_run_time_and_keep_their_filter_state() {
    let dp =
        DirectPath::start(&cfg(WaitMode::SpinThenPark(Duration::from_micros(10)), 64)).unwrap();
    let (a, out) = actuator("fan");
    let id = dp.add_link(
        1,
        "t | threshold(25, 23) -> actuator(fan)".into(),
        filters(&["threshold(25, 23)"]),
        vec![out],
    );
    let inj = dp.injector();
    let step = |v: f64| {
        inj.push(1, v, now_ns());
        assert!(dp.drain(Duration::from_secs(5)));
    };
    step(26.0);
    assert_eq!((a.value(), a.writes()), (1.0, 1));
    // another link comes and goes: the threshold remembers it is on
    let (b, out_b) = actuator("b");
    let other = dp.add_link(1, "t -> actuator(b)".into(), vec![], vec![out_b]);
    step(24.0);
    assert_eq!(
        (a.value(), a.writes()),
        (1.0, 1),
        "24 is inside the hysteresis band"
    );
    assert_eq!(b.value(), 24.0);
    assert!(dp.remove_link(other));
    assert!(!dp.remove_link(other));
    step(22.0);
    assert_eq!((a.value(), a.writes()), (0.0, 2));
    assert_eq!(b.writes(), 1, "removed links fire no more");
    assert!(dp.remove_link(id));
    step(30.0);
    assert_eq!(a.writes(), 2);
    assert_eq!(dp.snapshot().unlinked, 1);
    assert!(dp.links().is_empty());
}

#[test]
fn notify_hook_custom_outputs_and_errors() {
    let dp = DirectPath::start(&cfg(WaitMode::Park, 64)).unwrap();
    let heard = Arc::new(Mutex::new(Vec::new()));
    let h = heard.clone();
    dp.set_notify_hook(Arc::new(move |name: &str, v| {
        h.lock().push((name.to_string(), v))
    }));
    struct Publish(String, Arc<Mutex<Vec<(String, f64)>>>);
    impl OutputSink for Publish {
        fn describe(&self) -> String {
            format!("mqtt({})", self.0)
        }
        fn fire(&self, value: f64, _ev: &Event) -> Result<(), String> {
            if value < 0.0 {
                return Err("negative".into());
            }
            self.1.lock().push((self.0.clone(), value));
            Ok(())
        }
    }
    let published = Arc::new(Mutex::new(Vec::new()));
    let p = published.clone();
    dp.register_output_kind(
        "mqtt",
        Arc::new(move |arg: &str| {
            Ok(Arc::new(Publish(arg.into(), p.clone())) as Arc<dyn OutputSink>)
        }),
    );
    let e = dp.custom_output("amqp", "q").err().unwrap();
    assert!(
        e.contains("no output kind `amqp`") && e.contains("mqtt"),
        "{e}"
    );
    let mq = dp.custom_output("mqtt", "sensors/t0").unwrap();
    let notify: Arc<dyn OutputSink> = Arc::new(output::NotifyOut {
        name: "t0".into(),
        hook: dp.notify_slot(),
    });
    dp.add_link(
        0,
        "t0 -> notify(t0), mqtt(sensors/t0)".into(),
        vec![],
        vec![notify, mq],
    );
    let inj = dp.injector();
    inj.push(0, 2.5, now_ns());
    inj.push(0, -1.0, now_ns());
    assert!(dp.drain(Duration::from_secs(5)));
    assert_eq!(
        *heard.lock(),
        vec![("t0".to_string(), 2.5), ("t0".to_string(), -1.0)]
    );
    assert_eq!(*published.lock(), vec![("sensors/t0".to_string(), 2.5)]);
    let s = dp.snapshot();
    assert_eq!((s.fired, s.output_errors), (3, 1));
    assert_eq!(
        dp.last_error().as_deref(),
        Some("mqtt(sensors/t0): negative")
    );
}

#[test]
fn capture_records_exact_latencies() {
    let dp = DirectPath::start(&cfg(WaitMode::Spin, 64)).unwrap();
    let (_a, out) = actuator("a");
    dp.add_link(0, "x -> actuator(a)".into(), vec![], vec![out]);
    dp.start_capture(50);
    let inj = dp.injector();
    for _ in 0..80 {
        inj.push(0, 1.0, now_ns());
        std::thread::sleep(Duration::from_micros(50));
    }
    assert!(dp.drain(Duration::from_secs(5)));
    let (w, e) = dp.take_capture();
    assert_eq!((w.len(), e.len()), (50, 50));
    assert!(
        w.iter().zip(&e).all(|(w, e)| w <= e),
        "the worker part is inside end to end"
    );
}

#[test]
fn wait_modes_parse_and_print() {
    for s in [
        "spin",
        "park",
        "spin-then-park:50us",
        "spin-then-park:2ms",
        "predict:20us",
    ] {
        let w: WaitMode = s.parse().unwrap();
        assert_eq!(w.to_string(), s);
    }
    assert!("sleep"
        .parse::<WaitMode>()
        .unwrap_err()
        .contains("expected spin"));
    let c: DirectPathConfig = toml::from_str("wait = \"park\"\nlinks = [\"a -> log\"]").unwrap();
    assert_eq!(c.wait, WaitMode::Park);
    assert_eq!(c.ring_capacity, 4096);
}

/// Events of inputs with no link stop at the injector (counted as
/// unlinked, the worker never woken), and flow again once a link names
/// their input; inputs beyond the bitmap always reach the worker.
#[test]
fn unlinked_inputs_stop_at_the_injector() {
    let dp = DirectPath::start(&cfg(WaitMode::Park, 64)).unwrap();
    let inj = dp.injector();
    assert!(inj.push(5, 1.0, now_ns()));
    assert!(inj.push(63, 1.0, now_ns()));
    assert!(dp.drain(Duration::from_secs(5)));
    let s = dp.snapshot();
    assert_eq!((s.pushed, s.processed, s.unlinked), (0, 0, 2));
    let (_a, out) = actuator("led0");
    let id = dp.add_link(5, "in5 -> actuator(led0)".into(), Vec::new(), vec![out]);
    assert!(inj.push(5, 1.0, now_ns()));
    assert!(
        inj.push(6, 1.0, now_ns()),
        "its neighbour is still unlinked"
    );
    assert!(inj.push(5000, 1.0, now_ns()), "beyond the bitmap");
    assert!(dp.drain(Duration::from_secs(5)));
    let s = dp.snapshot();
    assert_eq!((s.pushed, s.processed, s.fired), (2, 2, 1));
    assert_eq!(s.unlinked, 4, "6 at the injector, 5000 at the worker");
    assert!(dp.remove_link(id));
    assert!(inj.push(5, 1.0, now_ns()));
    assert!(dp.drain(Duration::from_secs(5)));
    assert_eq!(
        dp.snapshot().pushed,
        2,
        "removed: stopped at the injector again"
    );
}
