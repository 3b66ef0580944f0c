//! `mintgate lab` and `mintgate bench` in a build without the `labs`
//! feature: the commands stay listed, and each says how to get it rather
//! than clap's "unrecognized subcommand".

use std::process::ExitCode;

/// Whatever was given after the command; not looked at.
#[derive(clap::Args)]
pub struct NotBuilt {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    rest: Vec<String>,
}

/// Refuses `what` with the build to install instead (exit 2).
pub fn run(what: &str, _args: NotBuilt) -> anyhow::Result<ExitCode> {
    Err(crate::UsageError(format!(
        "`mintgate {what}` is not in this build: the labs and the load generator are behind \
         the cargo feature `labs` (they double the binary). Build them in with \
         `cargo install --path crates/mintgate-cli --features labs` (or \
         `cargo run --release -p mintgate-cli --features labs -- {what} ...`)"
    ))
    .into())
}
