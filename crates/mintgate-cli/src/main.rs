//! `mintgate`: one binary for the gateway and its tools.

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

/// The system allocator, counting only while a lab asks (`lab buffers`
/// measures the HTTP proxy's heap use with it); otherwise one relaxed load
/// per allocation. Only in builds with the labs: the gateway alone uses the
/// system allocator as it is.
#[cfg(feature = "labs")]
#[global_allocator]
static ALLOC: mintgate_buf::heap::CountingAlloc = mintgate_buf::heap::CountingAlloc;

#[cfg(feature = "labs")]
mod bench;
mod client;
mod common;
#[cfg(feature = "labs")]
mod fleet;
mod generate;
#[cfg(test)]
mod help_doc;
mod http;
#[cfg(feature = "labs")]
mod lab;
mod mqtt;
mod netem;
mod observe;
mod proxy;
mod serve;
mod systemd;
#[cfg(not(feature = "labs"))]
mod without_labs;

/// mintgate: an IoT middleware and edge gateway (CoAP, HTTP/QUIC proxies, MQTT).
#[derive(Parser)]
#[command(name = "mintgate", version, about, long_about = None, propagate_version = true)]
struct Cli {
    /// Log filter, e.g. `info`, `debug`, `mintgate_gateway=trace`. Without
    /// it (or MINTGATE_LOG), RUST_LOG when set, else `info`.
    #[arg(long, global = true, value_name = "FILTER", env = "MINTGATE_LOG")]
    log: Option<String>,
    /// Log line format: text for people, json for journald or a log
    /// shipper.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the gateway: CoAP over UDP with the embedded defaults or a config file.
    ///
    /// Runs until SIGINT or SIGTERM (exit 0). Besides CoAP over UDP it serves,
    /// when asked: the HTTP/1.1, HTTP/2 and HTTP/3 proxy and the live dashboard
    /// (--http, --h3), coaps (--coaps), CoAP over TCP (--coap-tcp) and over
    /// WebSockets (--coap-ws), the MQTT bridges (--mqtt) or NATS JetStream
    /// (--nats), and Prometheus metrics (--metrics). A receiver, timer or notifier thread that dies ends the
    /// process with exit status 70, for a supervisor to restart it.
    Serve(serve::ServeArgs),
    /// Send a CoAP GET and print the response.
    Get(client::RequestArgs),
    /// Send a CoAP PUT and print the response.
    Put(client::RequestArgs),
    /// Send a CoAP POST and print the response.
    Post(client::RequestArgs),
    /// Send a CoAP DELETE and print the response.
    Delete(client::RequestArgs),
    /// Load-generate against one or more CoAP servers and report throughput and latency.
    #[cfg(feature = "labs")]
    Bench(bench::BenchArgs),
    /// The CoAP load generator: not in this build (cargo feature `labs`).
    #[cfg(not(feature = "labs"))]
    Bench(without_labs::NotBuilt),
    /// Relay UDP with loss, delay and jitter, or TCP with delay, in each direction (no tc netem or root needed).
    Netem(netem::NetemArgs),
    /// Observe a resource (RFC 7641): print each notification until a count or duration.
    Observe(observe::ObserveArgs),
    /// Reproduce the papers' experiments and put our figures beside theirs.
    ///
    /// Each lab writes CSV files and SVG figures into --out and prints a table
    /// of our figures beside the paper's; --quick shortens it (without it, the
    /// papers' own settings: some labs take hours). Exit code 0 when the lab
    /// ran (a missed target is reported in its table), 1 on an error. The
    /// labs and their figures are described in docs/labs.md.
    #[cfg(feature = "labs")]
    Lab(lab::LabArgs),
    /// The labs (the papers' experiments): not in this build (cargo feature `labs`).
    #[cfg(not(feature = "labs"))]
    Lab(without_labs::NotBuilt),
    /// Publish messages 1..N in order through the persistent MQTT publish queue.
    Publish(mqtt::PublishArgs),
    /// Subscribe to an MQTT topic; print messages de-duplicated and in order.
    Subscribe(mqtt::SubscribeArgs),
    /// Run the embedded MQTT broker (rumqttd).
    ///
    /// Listens on 127.0.0.1:1883 (MQTT 3.1.1) and 127.0.0.1:1884 (MQTT 5)
    /// unless told otherwise, until Ctrl-C. Keep it on loopback where clients
    /// you do not control connect: rumqttd 0.20 stops taking connections on a
    /// listener after a client reconnects under a client id it refused (see
    /// docs/operations.md); an external broker (mosquitto) avoids that.
    Broker(mqtt::BrokerArgs),
    /// Run the HTTP/1.1, HTTP/2 and HTTP/3 proxy to CoAP on its own (RFC 8075).
    Proxy(proxy::ProxyArgs),
    /// Send HTTP requests (HTTP/1.1, HTTP/2 or HTTP/3) and print status, headers, body and timing.
    Http(http::HttpArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(generate::CompletionsArgs),
    /// Print the manual page, or write one for every command into a folder.
    Man(generate::ManArgs),
}

/// A mistake in how a command was called that only shows once its
/// arguments are combined with the environment: exits with 2, as clap's own
/// usage errors do.
#[derive(Debug)]
pub(crate) struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Raises this process's soft limit on open descriptors to the hard limit:
/// every HTTP connection, held or being refused, takes one, and a listener
/// that runs out cannot even accept a connection to close it. Returns the
/// limit now in force.
pub(crate) fn raise_nofile_limit() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: r is a valid rlimit for getrlimit/setrlimit to read and write.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 0;
        }
        if r.rlim_cur < r.rlim_max {
            let want = libc::rlimit {
                rlim_cur: r.rlim_max,
                rlim_max: r.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                r.rlim_cur = r.rlim_max;
            }
        }
    }
    r.rlim_cur
}

/// Secrets (tokens, keys) read from `path`: one a line, surrounding
/// spaces trimmed, blank lines and lines starting with `#` skipped. At
/// least one is needed. A file others may read is used, with a warning.
/// Errors name `flag` and the file, never its content.
pub(crate) fn secrets_from_file(path: &std::path::Path, flag: &str) -> anyhow::Result<Vec<String>> {
    use std::os::unix::fs::PermissionsExt as _;
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("{flag} {}: {e}", path.display()))?;
    if let Ok(m) = std::fs::metadata(path) {
        if m.permissions().mode() & 0o077 != 0 {
            tracing::warn!(
                "{flag} {}: the file may be read by others (chmod 600 it)",
                path.display()
            );
        }
    }
    let v: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect();
    if v.is_empty() {
        anyhow::bail!("{flag} {}: no secret in the file", path.display());
    }
    Ok(v)
}

/// The one secret of `path` (see [`secrets_from_file`]).
pub(crate) fn secret_from_file(path: &std::path::Path, flag: &str) -> anyhow::Result<String> {
    let mut v = secrets_from_file(path, flag)?;
    if v.len() > 1 {
        anyhow::bail!(
            "{flag} {}: one secret expected, {} lines found",
            path.display(),
            v.len()
        );
    }
    Ok(v.remove(0))
}

/// The variable a coaps pre-shared key can come from, so that it does not
/// show in `ps`.
pub(crate) const PSK_KEY_VAR: &str = "MINTGATE_PSK_KEY";

/// The key given on the command line, else the one in [`PSK_KEY_VAR`] (if
/// set and not empty). Callers ask only where an identity needs a key, so
/// an exported variable never gets in the way of plain CoAP.
pub(crate) fn psk_key_or_env(flag: Option<&str>) -> Option<String> {
    flag.map(str::to_owned)
        .or_else(|| std::env::var(PSK_KEY_VAR).ok().filter(|k| !k.is_empty()))
}

/// The log filter: `--log` (or MINTGATE_LOG), else RUST_LOG, else `info`.
fn log_filter(flag: Option<&str>, rust_log: Option<&str>) -> String {
    let filter = flag.or(rust_log).unwrap_or("info");
    // The embedded MQTT broker (rumqttd) logs every client disconnect as an
    // error: silent unless asked for by name. The NATS client says every
    // connection at info (the JetStream output logs its own): warnings only
    // unless asked for by name. The OPC UA client (async-opcua) logs every
    // failed connect attempt at error level, several lines each; the OPC UA
    // driver logs each new error of a server once (and keeps it on the
    // dashboard): silent unless asked for by name (`opcua_client=debug`).
    let mut f = filter.to_owned();
    if !filter.contains("rumqttd") {
        f.push_str(",rumqttd=off");
    }
    if !filter.contains("async_nats") {
        f.push_str(",async_nats=warn");
    }
    if !filter.contains("opcua_") {
        f.push_str(OPCUA_OFF);
    }
    f
}

/// The OPC UA client's crates, silenced.
const OPCUA_OFF: &str = ",opcua_client=off,opcua_core=off,opcua_crypto=off,opcua_types=off";

fn init_logging(flag: Option<&str>, format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let rust_log = std::env::var("RUST_LOG").ok().filter(|v| !v.is_empty());
    let text = log_filter(flag, rust_log.as_deref());
    let filter = match EnvFilter::try_new(&text) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("mintgate: warning: bad log filter '{text}' ({e}); logging at info");
            EnvFilter::new(format!("info,rumqttd=off,async_nats=warn{OPCUA_OFF}"))
        }
    };
    // colours only for a terminal (and not under NO_COLOR): a log file or a
    // pipe gets plain text
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => b.init(),
        LogFormat::Json => b.json().init(),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log.as_deref(), cli.log_format);
    use mintgate_coap::wire::Code;
    let res = match cli.cmd {
        Cmd::Serve(a) => serve::run(a),
        Cmd::Get(a) => client::run(Code::GET, a),
        Cmd::Put(a) => client::run(Code::PUT, a),
        Cmd::Post(a) => client::run(Code::POST, a),
        Cmd::Delete(a) => client::run(Code::DELETE, a),
        #[cfg(feature = "labs")]
        Cmd::Bench(a) => bench::run(a),
        #[cfg(feature = "labs")]
        Cmd::Lab(a) => lab::run(a),
        #[cfg(not(feature = "labs"))]
        Cmd::Bench(a) => without_labs::run("bench", a),
        #[cfg(not(feature = "labs"))]
        Cmd::Lab(a) => without_labs::run("lab", a),
        Cmd::Netem(a) => netem::run(a),
        Cmd::Observe(a) => observe::run(a),
        Cmd::Publish(a) => mqtt::run_publish(a),
        Cmd::Subscribe(a) => mqtt::run_subscribe(a),
        Cmd::Broker(a) => mqtt::run_broker(a),
        Cmd::Proxy(a) => proxy::run(a),
        Cmd::Http(a) => http::run(a),
        Cmd::Completions(a) => generate::completions(a),
        Cmd::Man(a) => generate::man(a),
    };
    match res {
        Ok(code) => code,
        Err(e) => {
            eprintln!("mintgate: error: {e:#}");
            if e.downcast_ref::<UsageError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::from(1)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{log_filter, OPCUA_OFF};

    #[test]
    fn durations_take_units_where_the_help_says_so() {
        use clap::Parser as _;
        for args in [
            &["mintgate", "serve", "--stats-every", "5s"][..],
            &["mintgate", "serve", "--stats-every", "7"],
            &["mintgate", "serve", "--stats-every", "0"],
        ] {
            assert!(super::Cli::try_parse_from(args).is_ok(), "{args:?}");
        }
        assert!(
            super::Cli::try_parse_from(["mintgate", "serve", "--stats-every", "soon"]).is_err()
        );
        // counts that mean nothing are refused, not quietly replaced
        for args in [
            &["mintgate", "lab", "congestion", "--requests", "5"][..],
            &["mintgate", "lab", "congestion", "--runs", "0"],
            &["mintgate", "lab", "mqtt", "--window", "1"],
            &["mintgate", "lab", "threads", "--max-threads", "0"],
            &["mintgate", "lab", "vta", "--peak-rps", "0"],
            &[
                "mintgate",
                "bench",
                "coap://127.0.0.1/request",
                "--threads",
                "0",
            ],
        ] {
            assert!(super::Cli::try_parse_from(args).is_err(), "{args:?}");
        }
        // the --clients default as the help prints it can be pasted
        assert!(
            super::Cli::try_parse_from(["mintgate", "lab", "clients", "--clients", "10, 20"])
                .is_ok()
        );
        // a payload may be a negative number
        assert!(super::Cli::try_parse_from([
            "mintgate",
            "put",
            "coap://127.0.0.1/actuators/led0",
            "-e",
            "-3.5"
        ])
        .is_ok());
    }

    #[test]
    fn the_log_flag_wins_over_rust_log() {
        assert_eq!(
            log_filter(Some("debug"), Some("error")),
            format!("debug,rumqttd=off,async_nats=warn{OPCUA_OFF}")
        );
        assert_eq!(
            log_filter(None, Some("error")),
            format!("error,rumqttd=off,async_nats=warn{OPCUA_OFF}")
        );
        assert_eq!(
            log_filter(None, None),
            format!("info,rumqttd=off,async_nats=warn{OPCUA_OFF}")
        );
        assert_eq!(
            log_filter(Some("rumqttd=warn"), None),
            format!("rumqttd=warn,async_nats=warn{OPCUA_OFF}")
        );
        assert_eq!(
            log_filter(Some("async_nats=debug"), None),
            format!("async_nats=debug,rumqttd=off{OPCUA_OFF}")
        );
        assert_eq!(
            log_filter(Some("info,opcua_client=debug"), None),
            "info,opcua_client=debug,rumqttd=off,async_nats=warn"
        );
    }
}
