//! GPIO character-device drivers against the kernel's gpio-sim.
//!
//! gpio-sim needs configfs and the gpio-sim module (and root to create a
//! chip). Where the kernel lacks them the tests are skipped with a message
//! saying why, unless `MINTGATE_REQUIRE_GPIO_SIM` is set, then they fail.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::unreachable
)] // test code

use std::sync::Arc;
use std::time::{Duration, Instant};

use mintgate_devices::clock::now_ns;
use mintgate_devices::directpath::DirectPathConfig;
use mintgate_devices::gpio::{gpio_sim_unavailable, GpioIn, GpioOut};
use mintgate_devices::{DeviceKind, DeviceManager, DeviceSpec, Driver};

fn sim_or_skip(test: &str) -> Option<gpiosim::Sim> {
    if let Some(why) = gpio_sim_unavailable() {
        if std::env::var_os("MINTGATE_REQUIRE_GPIO_SIM").is_some() {
            panic!("{test}: gpio-sim is required but unavailable: {why}");
        }
        eprintln!("skipping {test}: gpio-sim unavailable here: {why}");
        return None;
    }
    let sim = gpiosim::builder()
        .with_bank(
            gpiosim::Bank::new(8, "mintgate-test")
                .name(3, "BUTTON")
                .name(5, "LAMP"),
        )
        .live()
        .expect("creating a gpio-sim chip");
    Some(sim)
}

fn wait_for(mut f: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    false
}

#[test]
fn edges_arrive_with_kernel_timestamps() {
    let Some(sim) = sim_or_skip("edges_arrive_with_kernel_timestamps") else {
        return;
    };
    let chip = &sim.chips()[0];
    let input = GpioIn::open(chip.dev_path(), 3, None).unwrap();
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let run = input
        .start(Arc::new(move |v, t| s2.lock().push((v, t, now_ns()))))
        .unwrap()
        .expect("an input line delivers edges");
    chip.set_pull(3, gpiosim::Level::High).unwrap();
    assert!(wait_for(|| seen.lock().len() == 1));
    chip.set_pull(3, gpiosim::Level::Low).unwrap();
    assert!(wait_for(|| seen.lock().len() == 2));
    drop(run);
    let s = seen.lock().clone();
    assert_eq!((s[0].0, s[1].0), (1.0, 0.0), "rising then falling");
    for (_, kernel, user) in &s {
        assert!(
            kernel <= user,
            "the kernel stamp is on CLOCK_MONOTONIC, before we saw it"
        );
        assert!(user - kernel < 1_000_000_000);
    }
    assert_eq!(input.read().unwrap(), 0.0);

    let out = GpioOut::open(chip.dev_path(), 5).unwrap();
    out.write(1.0).unwrap();
    assert_eq!(chip.get_level(5).unwrap(), gpiosim::Level::High);
    out.write(0.0).unwrap();
    assert_eq!(chip.get_level(5).unwrap(), gpiosim::Level::Low);
}

#[test]
fn a_button_drives_a_lamp_through_the_direct_path() {
    let Some(sim) = sim_or_skip("a_button_drives_a_lamp_through_the_direct_path") else {
        return;
    };
    let chip = &sim.chips()[0];
    let m = DeviceManager::new(&DirectPathConfig::default()).unwrap();
    let mut b = DeviceSpec::new("button", DeviceKind::GpioIn);
    b.chip = Some(chip.dev_path().display().to_string());
    b.line = Some(mintgate_devices::gpio::LineRef::Name("BUTTON".into()));
    m.add(b).unwrap();
    let mut l = DeviceSpec::new("lamp", DeviceKind::GpioOut);
    l.chip = Some(chip.dev_path().display().to_string());
    l.line = Some(mintgate_devices::gpio::LineRef::Offset(5));
    m.add(l).unwrap();
    m.add_link("button -> actuator(lamp)").unwrap();
    chip.set_pull(3, gpiosim::Level::High).unwrap();
    assert!(wait_for(
        || chip.get_level(5).ok() == Some(gpiosim::Level::High)
    ));
    chip.set_pull(3, gpiosim::Level::Low).unwrap();
    assert!(wait_for(
        || chip.get_level(5).ok() == Some(gpiosim::Level::Low)
    ));
    let s = m.directpath().snapshot();
    assert_eq!(s.overflow, 0);
    assert!(s.fired >= 2);
}
