//! `mintgate completions SHELL` and `mintgate man`: shell completion
//! scripts and manual pages generated from the same clap definitions as
//! `--help`, so that they cannot drift from it.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::CommandFactory as _;

/// Arguments of `mintgate completions`.
#[derive(clap::Args)]
#[command(after_help = "Install, e.g.:\n  \
mintgate completions bash > /etc/bash_completion.d/mintgate\n  \
mintgate completions zsh > /usr/local/share/zsh/site-functions/_mintgate\n  \
mintgate completions fish > ~/.config/fish/completions/mintgate.fish\n\
The Debian package installs the bash, zsh and fish ones.")]
pub struct CompletionsArgs {
    /// The shell to write the completion script for.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

/// Arguments of `mintgate man`.
#[derive(clap::Args)]
#[command(after_help = "Read it with: mintgate man | man -l -\n\
The Debian package installs every page (man mintgate, man mintgate-serve, ...).")]
pub struct ManArgs {
    /// Write a page for every command and subcommand into this folder
    /// (mintgate.1, mintgate-serve.1, mintgate-lab-vta.1, ...) instead of
    /// mintgate(1) to standard output.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

/// Writes the completion script to standard output.
pub fn completions(a: CompletionsArgs) -> anyhow::Result<ExitCode> {
    let mut cmd = crate::Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "mintgate", &mut out);
    print(&out)
}

/// Writes `out` to standard output; a reader that stopped early (`| head`)
/// is not an error.
fn print(out: &[u8]) -> anyhow::Result<ExitCode> {
    match std::io::stdout().lock().write_all(out) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(ExitCode::SUCCESS),
    }
}

/// Writes mintgate(1) to standard output, or every page into `--dir`.
pub fn man(a: ManArgs) -> anyhow::Result<ExitCode> {
    let cmd = crate::Cli::command();
    match a.dir {
        Some(dir) => {
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("man --dir {}", dir.display()))?;
            clap_mangen::generate_to(cmd, &dir)
                .with_context(|| format!("writing manual pages into {}", dir.display()))?;
        }
        None => {
            let mut out = Vec::new();
            clap_mangen::Man::new(cmd).render(&mut out)?;
            return print(&out);
        }
    }
    Ok(ExitCode::SUCCESS)
}
