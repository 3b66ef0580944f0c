//! Link options for the `mintgate` executable.
//!
//! On GNU/Linux the executable is linked with packed relative relocations
//! (DT_RELR, `-z pack-relative-relocs`, GNU ld 2.38 or newer, glibc 2.36 or
//! newer at run time). A position-independent executable has one relative
//! relocation per pointer in its read-only data (vtables, string tables);
//! as RELA entries they took 1.5 MB of the file, and the loader reads all of
//! them at every start, so they were resident for the life of the process.
//! As DT_RELR bitmaps they take a few kilobytes. An older linker ignores the
//! option with a warning.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}
