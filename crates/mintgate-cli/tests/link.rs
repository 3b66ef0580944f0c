//! The `mintgate` executable is linked with packed relative relocations
//! (DT_RELR, see build.rs): without them the loader reads 1.5 MB of RELA
//! entries at every start of the release build and keeps them resident.
#![cfg(all(target_os = "linux", target_env = "gnu"))]

use std::process::Command;

#[test]
fn executable_has_packed_relative_relocations() {
    let exe = env!("CARGO_BIN_EXE_mintgate");
    let out = Command::new("readelf")
        .args(["--dynamic", "--wide", exe])
        .output()
        .expect("readelf (binutils, which the linker comes with) runs");
    assert!(out.status.success(), "readelf failed: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("(RELR)"),
        "no DT_RELR in the dynamic section of {exe}:\n{text}"
    );
    // What is left as RELA is the few relocations DT_RELR cannot express
    // (none of them relative); the release build had 64,673 relative ones
    // before (2026-11-27, with the labs).
    let relacount = text
        .lines()
        .find(|l| l.contains("(RELACOUNT)"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(relacount < 100, "{relacount} relative RELA entries left");
}
