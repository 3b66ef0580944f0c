//! The metrics endpoint (`mintgate serve --metrics ADDR`): Prometheus text
//! at `/metrics`, the Performance Observer's samples and the VTA controller's
//! last decision as JSON at `/api/observer`, `/healthz` and `/readyz`
//! ([`crate::health`]), and the dashboard
//! ([`crate::dashboard`]) at `/` and `/api/state`.
//!
//! It runs on its own thread with a single-threaded tokio runtime, so that
//! it never competes with the CoAP pipeline's threads for a worker.

use std::future::Future;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::thread::JoinHandle;

use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use mintgate_buf::Layer;
use mintgate_sched::Sample;
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::exposition::{Exposition, Format};
use crate::pipeline::GatewayHandle;

/// A running metrics endpoint; dropping it stops it.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// Serves a router on a listener until the future it is given completes:
/// how [`MetricsServer::start_with`] runs its HTTP side (the CLI passes the
/// HTTP proxy's accept loop, with its connection limits and timeouts).
pub type ServeFn = Box<
    dyn FnOnce(
            tokio::net::TcpListener,
            Router,
            Pin<Box<dyn Future<Output = ()> + Send>>,
        ) -> Pin<Box<dyn Future<Output = ()> + Send>>
        + Send,
>;

impl MetricsServer {
    /// Binds `addr` (errors are returned here, not later) and serves with
    /// axum's own accept loop (no connection limits: for tests and labs;
    /// `mintgate serve` uses [`start_with`](Self::start_with)).
    pub fn start(addr: SocketAddr, gw: GatewayHandle) -> io::Result<MetricsServer> {
        Self::start_with(
            addr,
            gw,
            Box::new(|listener, app, stopped| {
                Box::pin(async move {
                    let served = axum::serve(
                        listener,
                        app.into_make_service_with_connect_info::<SocketAddr>(),
                    )
                    .with_graceful_shutdown(stopped);
                    if let Err(e) = served.await {
                        tracing::error!(error = %e, "metrics endpoint stopped");
                    }
                })
            }),
        )
    }

    /// Binds `addr` and serves with `serve`, which must give handlers the
    /// peer address as `ConnectInfo<SocketAddr>` (the dashboard answers
    /// loopback only by default).
    pub fn start_with(
        addr: SocketAddr,
        gw: GatewayHandle,
        serve: ServeFn,
    ) -> io::Result<MetricsServer> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                rt.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => {
                            tracing::error!(error = %e, "metrics listener");
                            return;
                        }
                    };
                    let mut app = Router::new()
                        .route("/metrics", get(metrics))
                        .route("/api/observer", get(observer))
                        .with_state(gw.clone())
                        .merge(crate::health::router(gw.clone()));
                    if gw.config().dashboard.enabled {
                        app = app.merge(crate::dashboard::router(gw));
                    }
                    serve(
                        listener,
                        app,
                        Box::pin(async {
                            let _ = stopped.await;
                        }),
                    )
                    .await;
                });
            })?;
        Ok(MetricsServer {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn metrics(State(gw): State<GatewayHandle>, headers: HeaderMap) -> impl IntoResponse {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let format = Format::from_accept(accept);
    (
        [(header::CONTENT_TYPE, format.content_type())],
        render(&gw, format),
    )
}

async fn observer(State(gw): State<GatewayHandle>) -> Json<Value> {
    Json(observer_json(&gw))
}

/// The whole exposition in the Prometheus text format 0.0.4.
pub fn render_prometheus(gw: &GatewayHandle) -> String {
    render(gw, Format::Prometheus)
}

/// The whole exposition in `format`.
pub fn render(gw: &GatewayHandle, format: Format) -> String {
    let gw = gw.clone();
    crate::exposition::render(format, move |m| collect(&gw, m))
}

/// Every family of the gateway, read from its counters now. One call per
/// family: the calls are rows of one shape (name, help, value), data rather
/// than repeated logic, like the tables in observe.rs and bridge/running.rs.
fn collect(gw: &GatewayHandle, m: &mut Exposition) {
    let c = gw.counters();
    crate::health::collect(gw.readiness().ready, m);
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Relaxed);
    m.gauge(
        "mintgate_htp_threads",
        "Handler Thread Pool threads (N).",
        gw.htp_threads(),
    );
    m.counter(
        "mintgate_nr_datagrams_total",
        "Datagrams read by the Network Receiver.",
        get(&c.nr_datagrams),
    );
    m.gauge(
        "mintgate_pipeline_batch_threads",
        "Network Receiver and handler threads running as SCHED_BATCH now (pipeline.batch_sched_above).",
        get(&c.pipeline_batch_threads),
    );
    m.counter(
        "mintgate_pipeline_batch_switches_total",
        "Times a Network Receiver or handler thread switched to SCHED_BATCH.",
        get(&c.pipeline_batch_switches),
    );
    m.counter(
        "mintgate_nr_requests_total",
        "Requests put on the HTP queue (R).",
        get(&c.nr_requests),
    );
    m.counter(
        "mintgate_htp_handled_total",
        "Requests the HTP completed (H).",
        get(&c.htp_handled),
    );
    m.counter(
        "mintgate_htp_busy_seconds_total",
        "Thread-seconds the HTP spent handling.",
        get(&c.htp_busy_ns) as f64 / 1e9,
    );
    m.gauge(
        "mintgate_htp_queue_length",
        "Requests in the HTP queue (QS).",
        get(&c.queue_len),
    );
    m.gauge(
        "mintgate_htp_queue_bytes",
        "Buffer bytes held by the HTP queue.",
        get(&c.queue_bytes),
    );
    m.gauge(
        "mintgate_htp_queue_limit_bytes",
        "Bound of the HTP queue in bytes.",
        gw.queue_bytes(),
    );
    m.counters(
        "mintgate_dropped_total",
        "Requests shed, by reason.",
        "reason",
        [
            ("queue_full_non", get(&c.nr_dropped)),
            ("queue_full_con_503", get(&c.nr_rejected)),
            ("peer_limit", get(&c.nr_peer_limited)),
            ("pool_exhausted", get(&c.htp_shed)),
        ],
    );
    m.families(&[
        (
            "mintgate_malformed_total",
            "Malformed datagrams (answered with Reset or dropped).",
            get(&c.nr_malformed),
        ),
        (
            "mintgate_duplicates_total",
            "Duplicates replayed or dropped by de-duplication.",
            get(&c.nr_duplicates),
        ),
        (
            "mintgate_ignored_total",
            "Datagrams ignored (misplaced, unexpected, truncated, pings).",
            get(&c.nr_ignored),
        ),
        (
            "mintgate_sent_total",
            "Datagrams the Send Handler transmitted.",
            get(&c.sh_sent),
        ),
        (
            "mintgate_send_errors_total",
            "Datagrams that could not be sent.",
            get(&c.sh_errors),
        ),
        (
            "mintgate_dedup_evicted_total",
            "Cached responses given back early to free buffers.",
            get(&c.dedup_evicted),
        ),
    ]);
    if let Some(d) = gw.vta_decision() {
        m.gauge(
            "mintgate_vta_target_threads",
            "VTA: N_{t+1}, the pool size decided last.",
            d.n_next,
        );
        m.gauge(
            "mintgate_vta_nt_max",
            "VTA: NT_max, the thread cap found by hill climbing.",
            d.nt_max,
        );
        m.gauge(
            "mintgate_vta_threads_wanted",
            "VTA: P_{t+1}, the threads the arrivals and backlog ask for.",
            d.p_next,
        );
        m.gauge(
            "mintgate_vta_completions_per_thread_second",
            "VTA: HT_t, completions per busy thread-second.",
            d.ht_t,
        );
        m.gauge(
            "mintgate_vta_backlog_growth_threads",
            "VTA: PD_t = (R_t - H_t) / HT_t, the threads' worth of requests the backlog grew by.",
            d.pd_t,
        );
        m.gauge(
            "mintgate_vta_queue_threads",
            "VTA: Q_t = (QS_t + e_t) / (HT_t * W), the threads that would drain the queue within W.",
            d.q_t,
        );
        m.gauge(
            "mintgate_vta_saturated",
            "VTA: 1 when the pool was the bottleneck last second.",
            d.saturated,
        );
    }
    m.gauges(
        "mintgate_threads",
        "Threads per Thread Pool Manager group.",
        "group",
        mintgate_sched::Group::ALL
            .iter()
            .map(|g| (g.name(), gw.manager().stats(*g).threads)),
    );
    let rm = gw
        .manager()
        .stats(mintgate_sched::Group::ResourceManagement);
    m.gauge(
        "mintgate_resource_queue_length",
        "Tasks waiting in the Resource Management group.",
        rm.queued,
    );
    m.counter(
        "mintgate_resource_rejected_total",
        "Tasks the full Resource Management queue refused.",
        rm.rejected,
    );
    let parts = gw.pool().stats();
    let by_size = |f: &dyn Fn(&mintgate_buf::PartitionStats) -> u64| {
        parts
            .iter()
            .map(|p| (p.block_size.to_string(), f(p)))
            .collect::<Vec<_>>()
    };
    m.gauges(
        "mintgate_pool_blocks",
        "Blocks per buffer partition.",
        "block_size",
        by_size(&|p| p.blocks as u64),
    );
    m.gauges(
        "mintgate_pool_free_blocks",
        "Free blocks per buffer partition.",
        "block_size",
        by_size(&|p| p.free as u64),
    );
    m.gauges(
        "mintgate_pool_outstanding_blocks",
        "Blocks allocated and not yet returned, per buffer partition.",
        "block_size",
        by_size(&|p| (p.blocks - p.free) as u64),
    );
    m.gauges(
        "mintgate_pool_min_free_blocks",
        "The fewest blocks ever free at once, per buffer partition.",
        "block_size",
        by_size(&|p| p.min_free as u64),
    );
    m.counters(
        "mintgate_pool_exhausted_total",
        "Allocations a partition could not serve.",
        "block_size",
        by_size(&|p| p.exhausted),
    );
    let acc = gw.pool().accounting();
    let by_layer = |f: &dyn Fn(&mintgate_buf::LayerSnapshot) -> u64| {
        Layer::ALL
            .iter()
            .map(|l| (l.name(), f(&acc.snapshot(*l))))
            .collect::<Vec<_>>()
    };
    m.counters(
        "mintgate_bytes_allocated_total",
        "Buffer bytes allocated, by layer.",
        "layer",
        by_layer(&|s| s.alloc_bytes),
    );
    m.counters(
        "mintgate_bytes_copied_total",
        "Bytes copied, by layer.",
        "layer",
        by_layer(&|s| s.copy_bytes),
    );
    m.counters(
        "mintgate_buf_allocs_total",
        "Buffer blocks allocated, by layer.",
        "layer",
        by_layer(&|s| s.allocs),
    );
    m.counters(
        "mintgate_buf_copies_total",
        "Copy operations, by layer.",
        "layer",
        by_layer(&|s| s.copies),
    );
    if let Some((rss, hwm)) = own_memory() {
        m.gauge(
            "mintgate_resident_bytes",
            "Resident memory of the process (VmRSS).",
            rss,
        );
        m.gauge(
            "mintgate_resident_peak_bytes",
            "The most resident memory the process ever had (VmHWM).",
            hwm,
        );
    }
    // Observe, devices and the direct path (pipeline::Gateway::add_metrics_source)
    gw.extra_metrics(m);
    crate::process_metrics::collect(m);
}

/// (VmRSS, VmHWM) of this process in bytes, from `/proc/self/status`;
/// `None` where there is no such file.
pub fn own_memory() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = |key: &str| -> Option<u64> {
        let l = text.lines().find(|l| l.starts_with(key))?;
        l[key.len()..]
            .split_whitespace()
            .next()?
            .parse::<u64>()
            .ok()
    };
    Some((kib("VmRSS:")? * 1024, kib("VmHWM:")? * 1024))
}

/// One Observer sample as JSON (also the dashboard's series).
pub fn sample_json(s: &Sample) -> Value {
    json!({
        "t": s.t, "dt": s.dt, "r": s.r, "h": s.h, "n": s.n, "qs": s.qs,
        "queue_bytes": s.queue_bytes, "busy": s.busy, "datagrams": s.datagrams,
        "dropped": s.dropped, "malformed": s.malformed, "duplicates": s.duplicates, "sent": s.sent,
    })
}

/// The VTA controller's last decision (`null` before the first, or with a
/// fixed pool).
pub fn vta_json(gw: &GatewayHandle) -> Value {
    match gw.vta_decision() {
        Some(d) => json!({
            "r_t": d.r_t, "h_t": d.h_t, "n_t": d.n_t, "qs_t": d.qs_t, "ht_t": d.ht_t,
            "pd_t": d.pd_t, "e_t": d.e_t, "q_t": d.q_t, "p_next": d.p_next,
            "nt_max": d.nt_max, "n_next": d.n_next, "saturated": d.saturated,
            "climb": format!("{:?}", d.climb), "trial": format!("{:?}", d.trial),
        }),
        None => Value::Null,
    }
}

/// The Observer's samples (oldest first), the pool size and the VTA
/// controller's last decision.
pub fn observer_json(gw: &GatewayHandle) -> Value {
    let decision = vta_json(gw);
    json!({
        "pool": gw.config().pipeline.pool.to_string(),
        "htp_threads": gw.htp_threads(),
        "samples": gw.samples().iter().map(sample_json).collect::<Vec<_>>(),
        "vta": decision,
    })
}

#[cfg(test)]
mod tests {
    use std::net::UdpSocket;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::{resources, Config, Gateway};

    /// The sum of one family's samples whose labels contain `label`.
    fn sample(text: &str, family: &str, label: &str) -> f64 {
        text.lines()
            .filter(|l| l.starts_with(&format!("{family}{{")) && l.contains(label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    #[test]
    fn buffer_accounting_and_pool_state_are_exposed_and_consistent() {
        let mut cfg = Config::default();
        cfg.coap.bind = vec!["127.0.0.1:0".parse().unwrap()];
        let gw = Gateway::start(cfg.clone(), resources::router_for(&cfg)).unwrap();
        let addr = gw.local_addrs()[0];
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let k = 20u16;
        for mid in 0..k {
            // NON GET /request
            let mut req = vec![0x50, 0x01];
            req.extend_from_slice(&mid.to_be_bytes());
            req.push(0xB7);
            req.extend_from_slice(b"request");
            client.send_to(&req, addr).unwrap();
            let mut buf = [0u8; 256];
            let n = client.recv(&mut buf).expect("an answer");
            assert!(buf[..n].ends_with(b"hello world"));
        }
        // every block is back once the receiver has been idle a moment
        let h = gw.handle();
        let end = Instant::now() + Duration::from_secs(5);
        let text = loop {
            let text = render_prometheus(&h);
            if sample(&text, "mintgate_pool_outstanding_blocks", "block_size") == 0.0
                || Instant::now() > end
            {
                break text;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_eq!(
            sample(&text, "mintgate_pool_outstanding_blocks", "block_size"),
            0.0,
            "{text}"
        );
        let parts = gw.pool().stats();
        for p in &parts {
            let label = format!("block_size=\"{}\"", p.block_size);
            assert_eq!(
                sample(&text, "mintgate_pool_outstanding_blocks", &label),
                (p.blocks - p.free) as f64
            );
            assert!(sample(&text, "mintgate_pool_min_free_blocks", &label) <= p.blocks as f64);
        }
        // one receive block per datagram, counted when the datagram landed
        let datagrams = gw.counters().nr_datagrams.load(Relaxed) as f64;
        assert_eq!(datagrams, k as f64);
        let recv_block = parts
            .iter()
            .find(|p| p.block_size >= cfg.coap.max_datagram)
            .unwrap()
            .block_size as f64;
        assert_eq!(
            sample(&text, "mintgate_bytes_allocated_total", "layer=\"receive\""),
            datagrams * recv_block,
            "{text}"
        );
        assert_eq!(
            sample(&text, "mintgate_buf_allocs_total", "layer=\"receive\""),
            datagrams
        );
        // each response takes at least one block on the CoAP layer; the
        // static payload is not copied by the handler
        assert!(sample(&text, "mintgate_buf_allocs_total", "layer=\"coap\"") >= k as f64);
        assert_eq!(
            sample(&text, "mintgate_bytes_copied_total", "layer=\"handler\""),
            0.0
        );
        if std::path::Path::new("/proc/self/status").exists() {
            assert!(sample_plain(&text, "mintgate_resident_bytes") > 0.0);
            assert!(
                sample_plain(&text, "mintgate_resident_peak_bytes")
                    >= sample_plain(&text, "mintgate_resident_bytes")
            );
        }
    }

    fn sample_plain(text: &str, name: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} "))?.parse().ok())
            .unwrap_or(0.0)
    }
}
