//! `mintgate serve`: run the gateway until SIGINT or SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use anyhow::Context;
use mintgate_gateway::{resources, Config, Gateway};

/// Arguments of `mintgate serve`.
#[derive(clap::Args)]
#[command(
    after_help = "With no --config, the embedded defaults are used: CoAP on udp [::]:5683 \
(IPv4 and IPv6), one handler thread per core, GET /request answering `hello world`.\n\
Every config key is documented in docs/config.md; --print-config shows the effective values."
)]
pub struct ServeArgs {
    /// TOML configuration file (every key optional).
    #[arg(long, short = 'c', value_name = "FILE")]
    config: Option<PathBuf>,
    /// CoAP UDP address to listen on, e.g. 127.0.0.1:5683 or [::]:5683 (repeatable; replaces coap.bind).
    #[arg(long, value_name = "ADDR")]
    coap: Vec<SocketAddr>,
    /// CoAP over TCP (RFC 8323, coap+tcp) address to listen on, e.g.
    /// 127.0.0.1:5683 (repeatable; replaces coap.tcp_bind).
    #[arg(long, value_name = "ADDR")]
    coap_tcp: Vec<SocketAddr>,
    /// CoAP over WebSockets (RFC 8323, coap+ws, path /.well-known/coap)
    /// address to listen on, e.g. 127.0.0.1:8683 (repeatable; replaces
    /// coap.ws_bind).
    #[arg(long, value_name = "ADDR")]
    coap_ws: Vec<SocketAddr>,
    /// coaps (CoAP over DTLS 1.2) UDP address to listen on, e.g.
    /// 127.0.0.1:5684 (repeatable; replaces coaps.bind). Needs a pre-shared
    /// key (--psk-identity and --psk-key) or a certificate (--coaps-cert
    /// and --coaps-key).
    #[arg(long, value_name = "ADDR")]
    coaps: Vec<SocketAddr>,
    /// PSK identity clients use with --psk-key (replaces coaps.psk_identity).
    /// Without --psk-key its key comes from the MINTGATE_PSK_KEY variable.
    #[arg(long, value_name = "ID")]
    psk_identity: Option<String>,
    /// Pre-shared key of --psk-identity: the text as given, or 0x and hex
    /// digits (replaces coaps.psk_key; prefer the config file or the
    /// MINTGATE_PSK_KEY variable, which do not show in `ps`). The variable
    /// is read only for an identity (flag or coaps.psk_identity) without a
    /// key.
    #[arg(long, value_name = "KEY", requires = "psk_identity")]
    psk_key: Option<String>,
    /// PEM certificate chain for coaps (replaces coaps.cert).
    #[arg(long, value_name = "FILE", requires = "coaps_key")]
    coaps_cert: Option<PathBuf>,
    /// PEM private key of --coaps-cert (replaces coaps.key).
    #[arg(long, value_name = "FILE", requires = "coaps_cert")]
    coaps_key: Option<PathBuf>,
    /// PEM CA certificates client certificates must chain to; clients then
    /// need a valid certificate (replaces coaps.client_ca).
    #[arg(long, value_name = "FILE")]
    coaps_client_ca: Option<PathBuf>,
    /// Handler threads (replaces pipeline.threads; 0 = cores).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// How the handler pool is sized: `vta` (resized every second by the
    /// VTA controller; the default) or `fixed:N` (replaces pipeline.pool).
    #[arg(long, value_name = "vta|fixed:N")]
    pool: Option<mintgate_gateway::config::PoolMode>,
    /// Simulated cost of GET /request, for experiments: `none`, `block:200us`
    /// (waits, like a sensor read) or `spin:20us` (burns CPU); replaces
    /// resources.request_cost.
    #[arg(long, value_name = "COST")]
    handler_cost: Option<mintgate_gateway::config::HandlerCost>,
    /// Serve metrics on this TCP address: Prometheus text (OpenMetrics when
    /// the scraper asks for it) at /metrics, the Observer's samples and the
    /// VTA decision as JSON at /api/observer (replaces metrics.bind), e.g.
    /// 127.0.0.1:9464.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<SocketAddr>,
    /// Serve the HTTP/1.1 and HTTP/2 proxy to CoAP on this TCP address
    /// (replaces proxy.http), e.g. 127.0.0.1:8080: /hc/coap://HOST/PATH.
    #[arg(long, value_name = "ADDR")]
    http: Option<SocketAddr>,
    /// Serve the HTTP/3 (QUIC) proxy to CoAP on this UDP address (replaces
    /// proxy.h3), e.g. 127.0.0.1:8443; a self-signed certificate is made on
    /// first use unless proxy.tls_cert/tls_key are set.
    #[arg(long, value_name = "ADDR")]
    h3: Option<SocketAddr>,
    /// Run the MQTT bridges (sets mqtt.enabled): device values, direct-path
    /// `mqtt(TOPIC)` outputs and observed resources to topics, command
    /// topics to actuators; the embedded broker unless mqtt.broker names one.
    #[arg(long)]
    mqtt: bool,
    /// The MQTT broker of the bridges, mqtt://HOST[:PORT] (3.1.1),
    /// mqtt5://HOST[:PORT] (5) or `embedded` (replaces mqtt.broker; implies
    /// --mqtt).
    #[arg(long, value_name = "URL")]
    mqtt_broker: Option<String>,
    /// Publish the bridges' messages into NATS JetStream at these servers
    /// (comma-separated nats://HOST:PORT; replaces nats.servers, sets
    /// nats.enabled, implies --mqtt) instead of an MQTT broker: the same
    /// persistent queue and topics, `[nats]` for stream and subjects.
    #[arg(long, value_name = "URL[,URL...]")]
    nats: Option<String>,
    /// MQTT 3.1.1 listener of the embedded broker (replaces
    /// mqtt.embedded_listen, default 127.0.0.1:1883; port 0: any free port).
    #[arg(long, value_name = "ADDR")]
    mqtt_listen: Option<SocketAddr>,
    /// MQTT 5 listener of the embedded broker (replaces
    /// mqtt.embedded_listen5, default 127.0.0.1:1884; port 0: any free port).
    #[arg(long, value_name = "ADDR")]
    mqtt_listen5: Option<SocketAddr>,
    /// Check the configuration (every section, as the start would, short
    /// of binding sockets and opening devices), print it as TOML (keys
    /// and tokens shown as "<redacted>") and exit: 0 when valid, 1 with
    /// an error naming the key.
    #[arg(long)]
    print_config: bool,
    /// Log the Performance Observer's last sample this often while there is traffic, e.g. 10s, 1m (a bare number is seconds, whole seconds are used; 0 = never).
    #[arg(long, default_value = "10s", value_name = "D", value_parser = mintgate_gateway::config::parse_duration)]
    stats_every: Duration,
}

/// The plain CoAP listeners (the proxy's own upstream must not be a coaps one).
fn plain_addrs(gw: &Gateway) -> Vec<SocketAddr> {
    let coaps = gw.coaps_addrs();
    gw.local_addrs()
        .into_iter()
        .filter(|a| !coaps.contains(a))
        .collect()
}

pub fn run(a: ServeArgs) -> anyhow::Result<ExitCode> {
    let mut cfg = match &a.config {
        // checked below, once the flags and the key variable are applied
        Some(p) => Config::read(p)?,
        None => Config::default(),
    };
    if !a.coap.is_empty() {
        cfg.coap.bind = a.coap.clone();
    }
    if !a.coap_tcp.is_empty() {
        cfg.coap.tcp_bind = a.coap_tcp.clone();
    }
    if !a.coap_ws.is_empty() {
        cfg.coap.ws_bind = a.coap_ws.clone();
    }
    if !a.coaps.is_empty() {
        cfg.coaps.bind = a.coaps.clone();
    }
    if let Some(id) = &a.psk_identity {
        cfg.coaps.psk_identity = Some(id.clone());
        cfg.coaps.psk_key = a.psk_key.clone();
        // the flag gives this identity's key: it replaces one in the file
        cfg.coaps.psk_keys.remove(id);
    }
    if cfg.coaps.psk_identity.is_some() && cfg.coaps.psk_key.is_none() {
        cfg.coaps.psk_key = crate::psk_key_or_env(None);
    }
    if a.coaps_cert.is_some() {
        cfg.coaps.cert = a.coaps_cert.clone();
        cfg.coaps.key = a.coaps_key.clone();
    }
    if a.coaps_client_ca.is_some() {
        cfg.coaps.client_ca = a.coaps_client_ca.clone();
    }
    if let Some(t) = a.threads {
        cfg.pipeline.threads = t;
    }
    if let Some(p) = a.pool {
        cfg.pipeline.pool = p;
    }
    if let Some(c) = a.handler_cost {
        cfg.resources.request_cost = c;
    }
    if let Some(m) = a.metrics {
        cfg.metrics.bind = Some(m);
    }
    if let Some(h) = a.http {
        cfg.proxy.http = Some(h);
    }
    if let Some(h) = a.h3 {
        cfg.proxy.h3 = Some(h);
    }
    if let Some(b) = &a.mqtt_broker {
        cfg.mqtt.broker = b.clone();
        cfg.mqtt.enabled = true;
    }
    if a.mqtt {
        cfg.mqtt.enabled = true;
    }
    if let Some(n) = &a.nats {
        cfg.nats.servers = n.split(',').map(|s| s.trim().to_owned()).collect();
        cfg.nats.enabled = true;
        cfg.mqtt.enabled = true;
    }
    if let Some(l) = a.mqtt_listen {
        cfg.mqtt.embedded_listen = l;
    }
    if let Some(l) = a.mqtt_listen5 {
        cfg.mqtt.embedded_listen5 = l;
    }
    cfg.validate_to_start()?;
    // [proxy] is checked even when --http/--h3 are not given, so a bad
    // section shows now and not on the day the proxy is switched on
    crate::proxy::proxy_config(&cfg.proxy, &crate::proxy::own_endpoints(&cfg.coap.bind))?;
    if a.print_config {
        print!("{}", cfg.to_toml_redacted());
        return Ok(ExitCode::SUCCESS);
    }
    let nofile = crate::raise_nofile_limit();
    tracing::debug!(nofile, "open descriptor limit");
    // a read-only or full state folder is an error now, not a failed write later
    mintgate_gateway::state::check_all(&cfg)?;
    let set = crate::common::block_signals();
    let gw =
        Gateway::start(cfg.clone(), resources::router_for(&cfg)).context("starting the gateway")?;
    let devices =
        mintgate_gateway::devices::DeviceHost::start(&cfg, &gw).context(if cfg.mqtt.enabled {
            "starting the devices, the direct path and the MQTT bridges"
        } else {
            "starting the devices and the direct path"
        })?;
    {
        let m = devices.manager();
        let names: Vec<String> = m
            .list()
            .iter()
            .map(|d| mintgate_gateway::devices::resource_path(d))
            .collect();
        let dp = m.directpath();
        tracing::info!(
            resources = %names.join(", "),
            links = m.links().len(),
            worker_priority = ?dp.applied_priority(),
            worker_wait = %dp.wait_mode(),
            "devices served (observe with: mintgate observe coap://HOST/{})",
            names
                .iter()
                .find(|n| n.starts_with("sensors/"))
                .map(String::as_str)
                .unwrap_or("sensors/NAME")
        );
    }
    // The proxy's default upstream is this gateway's own CoAP endpoint.
    // Its HTTP listener also answers /healthz and /readyz (and the
    // dashboard when enabled).
    let mut extra = mintgate_gateway::health::router(gw.handle());
    if cfg.dashboard.enabled {
        extra = extra.merge(mintgate_gateway::dashboard::router(gw.handle()));
    }
    // Requests the proxy forwards come from its upstream socket, on
    // loopback: the gateway takes them as remote (they carry their HTTP
    // client's origin), registered before the proxy serves anyone.
    let handle = gw.handle();
    let proxy = crate::proxy::start(
        &cfg.proxy,
        &crate::proxy::own_endpoints(&plain_addrs(&gw)),
        &cfg.access,
        Some(extra),
        &|a| handle.access().add_proxy_source(a),
        gw.ws_adopter(),
        &cfg.oscore.state,
    )?;
    if let Some(p) = &proxy {
        // The dashboard's proxy section and /metrics read the same counters.
        let stats = std::sync::Arc::new((
            p.proxy().clone(),
            p.conn_stats().clone(),
            p.http_addr(),
            p.h3_addr(),
        ));
        let st = stats.clone();
        gw.add_state_source(
            "proxy",
            std::sync::Arc::new(move || crate::proxy::proxy_state(&st.0, Some(&st.1), st.2, st.3)),
        );
        gw.add_metrics_source(std::sync::Arc::new(move |m| {
            crate::proxy::collect_proxy_metrics(m, &stats.0, Some(&stats.1))
        }));
        if cfg.dashboard.enabled {
            if let Some(a) = p.http_addr() {
                tracing::info!("dashboard on http://{a}/");
            }
        }
    }
    let metrics = match cfg.metrics.bind {
        Some(addr) => {
            // the proxy's accept loop, with [proxy]'s connection limits
            // and timeouts (the dashboard is served here too)
            let limits = mintgate_proxy::server::ConnLimits::from(&crate::proxy::proxy_config(
                &cfg.proxy,
                &crate::proxy::own_endpoints(&cfg.coap.bind),
            )?);
            let m = mintgate_gateway::metrics::MetricsServer::start_with(
                addr,
                gw.handle(),
                Box::new(move |listener, app, stop| {
                    Box::pin(mintgate_proxy::server::serve(listener, app, limits, stop))
                }),
            )
            .with_context(|| format!("starting the metrics endpoint on tcp {addr}"))?;
            tracing::info!(
                "metrics on http://{0}/metrics and http://{0}/api/observer{1}",
                m.local_addr(),
                if cfg.dashboard.enabled {
                    format!(", dashboard on http://{}/", m.local_addr())
                } else {
                    String::new()
                }
            );
            Some(m)
        }
        None => None,
    };
    let coaps = gw.coaps_addrs();
    let addrs: Vec<String> = gw
        .local_addrs()
        .iter()
        .map(|a| {
            if coaps.contains(a) {
                format!("coaps udp {a}")
            } else {
                format!("udp {a}")
            }
        })
        .collect();
    let pool_bytes: usize = cfg
        .buffers
        .partitions
        .iter()
        .map(|p| p.block_size * p.blocks as usize)
        .sum();
    tracing::info!(
        listen = %addrs.join(", "),
        htp_threads = gw.htp_threads(),
        pool = %cfg.pipeline.pool,
        request_cost = %cfg.resources.request_cost,
        queue_bytes = gw.queue_bytes(),
        pool_bytes,
        "mintgate serving CoAP (coap://{}/request answers `hello world`); Ctrl-C to stop",
        gw.local_addrs().first().map(|a| a.to_string()).unwrap_or_default()
    );
    // every listener is bound: ready for /readyz and the service manager
    gw.mark_serving();
    crate::systemd::ready(&format!("serving CoAP on {}", addrs.join(", ")));
    let watchdog = crate::systemd::Watchdog::start(gw.handle())?;
    // every listener that takes writes: the CoAP ones and the proxy's
    let mut writable = gw.local_addrs();
    if let Some(p) = &proxy {
        writable.extend(p.http_addr().into_iter().chain(p.h3_addr()));
    }
    if let Some(w) = mintgate_gateway::access::unset_warning(&cfg.access, &writable) {
        tracing::warn!("{w}");
    }
    let every = a.stats_every.max(Duration::from_secs(1));
    let sig = crate::common::wait_for_signal(&set, every, || {
        if a.stats_every.is_zero() {
            return;
        }
        if let Some(s) = gw.samples().last().filter(|s| s.datagrams > 0 || s.qs > 0) {
            tracing::info!(
                r = s.r,
                h = s.h,
                threads = s.n,
                queue = s.qs,
                dropped = s.dropped,
                malformed = s.malformed,
                duplicates = s.duplicates,
                sent = s.sent,
                "last second"
            );
        }
    });
    tracing::info!(signal = sig, "stopping");
    crate::systemd::stopping();
    drop(watchdog);
    let c = gw.counters().clone();
    drop(metrics);
    drop(proxy);
    drop(devices);
    gw.shutdown();
    tracing::info!(
        datagrams = c.nr_datagrams.load(Relaxed),
        handled = c.htp_handled.load(Relaxed),
        dropped = c.nr_dropped.load(Relaxed),
        rejected = c.nr_rejected.load(Relaxed),
        malformed = c.nr_malformed.load(Relaxed),
        "stopped"
    );
    Ok(ExitCode::SUCCESS)
}
