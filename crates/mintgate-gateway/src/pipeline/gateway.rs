//! Starting and stopping the gateway: binding the listeners, the threads
//! around the endpoint, and the read-only handle the CLI, dashboard and
//! metrics use.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mintgate_buf::Pool;
use mintgate_coap::server::{Endpoint, PathTaken, Request, Resource, Router};
use mintgate_sched::{
    Decision, Observer, PipelineCounters, Sample, ThreadPool, ThreadPoolManager, Vta,
};
use parking_lot::{Mutex, RwLock};

use crate::config::{Config, PoolMode};
use crate::observe::{Notifier, ObserveState};
use crate::queue::HtpQueue;
use crate::udp::{self};
use mintgate_dtls::DtlsServer;

use super::endpoint_metrics::{collect_block1, collect_dedup};
use super::receive::receive_loop;
use super::timers::{notify_loop, timer_loop};
use super::workers::{handler_loop, serve_reliable};
use super::{fatal_on_panic, MetricsSource, Shared, StartError, StateSource, MAX_HTP_THREADS};
use crate::exposition::Exposition;

/// A running gateway. Dropping it stops every thread.
pub struct Gateway {
    shared: Arc<Shared>,
    receivers: Vec<JoinHandle<()>>,
    timer: Option<JoinHandle<()>>,
    htp: Arc<ThreadPool>,
    observer: Observer,
    decision: Arc<Mutex<Option<Decision>>>,
    manager: ThreadPoolManager,
    /// The CoAP-over-TCP listeners, when `coap.tcp_bind` names any.
    tcp: Option<crate::coap_tcp::TcpServer>,
    /// `coaps+tcp` (`coaps.tcp_bind`).
    tls_tcp: Option<crate::coap_tcp::TcpServer>,
    /// `coap+ws` (`coap.ws_bind`).
    ws: Option<crate::coap_tcp::TcpServer>,
    /// `coaps+ws` (`coaps.ws_bind`).
    tls_ws: Option<crate::coap_tcp::TcpServer>,
}

impl Gateway {
    /// Binds the listeners and starts the threads.
    pub fn start(cfg: Config, router: Router) -> Result<Gateway, StartError> {
        cfg.validate()?;
        // Master Secrets and sequence files are relative to the working
        // folder
        let oscore = cfg
            .oscore
            .enabled()
            .then(|| crate::oscore::OscoreServer::open(&cfg.oscore, std::path::Path::new("")))
            .transpose()
            .map_err(StartError::Oscore)?
            .map(Arc::new);
        // plain CoAP listeners first, then the coaps ones
        let coaps = cfg.coaps.settings()?;
        let mut dtls: Vec<Option<Arc<DtlsServer>>> = vec![None; cfg.coap.bind.len()];
        for _ in &cfg.coaps.bind {
            let server = DtlsServer::new(coaps.clone()).map_err(StartError::Dtls)?;
            dtls.push(Some(Arc::new(server)));
        }
        let listeners = cfg
            .coap
            .bind
            .iter()
            .chain(cfg.coaps.bind.iter())
            .map(|a| {
                udp::bind(*a, cfg.coap.socket_recv_buffer, cfg.coap.socket_send_buffer)
                    .map_err(|source| StartError::Bind { addr: *a, source })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let thread_names: Vec<String> = (0..listeners.len())
            .map(|i| format!("nr-{i}"))
            .chain(["coap-notify".into(), "coap-timer".into()])
            .collect();
        let counters = Arc::new(PipelineCounters::default());
        let pool = Pool::new(&cfg.partitions());
        let endpoint = Arc::new(Endpoint::new(
            cfg.endpoint_config(),
            pool.clone(),
            Instant::now(),
        ));
        let tcp_stats: Option<Arc<crate::coap_tcp::TcpStats>> = ([
            &cfg.coap.tcp_bind,
            &cfg.coap.ws_bind,
            &cfg.coaps.tcp_bind,
            &cfg.coaps.ws_bind,
        ]
        .iter()
        .any(|b| !b.is_empty())
            || ws_on_http(&cfg))
        .then(Arc::default);
        // a connection that closes ends its Observe relations
        let outboxes = tcp_stats.as_ref().map(|st| {
            let ep = endpoint.clone();
            Arc::new(crate::coap_tcp::Outboxes::new(st.clone(), move |conn| {
                ep.end_connection(conn);
            }))
        });
        let shared = Arc::new(Shared {
            pool,
            router: RwLock::new(Arc::new(router)),
            listeners,
            dtls,
            queue: HtpQueue::new(cfg.queue_bytes(), counters.clone())
                .with_spin(Duration::from_micros(cfg.pipeline.spin_us))
                .with_peer_share(cfg.pipeline.peer_queue_share),
            counters: counters.clone(),
            observe: Arc::new(ObserveState::new(endpoint.clone())),
            endpoint,
            stop: AtomicBool::new(false),
            handler_panics: AtomicU64::new(0),
            metrics_sources: RwLock::new(Vec::new()),
            state_sources: RwLock::new(Vec::new()),
            started: Instant::now(),
            access: crate::access::AccessPolicy::new(cfg.access.clone()),
            dashboard_refused: Default::default(),
            tcp_stats,
            outboxes,
            oscore,
            health: crate::health::Health::new(thread_names),
            cfg,
        });
        {
            let weak = Arc::downgrade(&shared);
            shared
                .pool
                .set_reclaimer(move || weak.upgrade().map_or(0, |sh| sh.reclaim()));
        }
        // The pool is created after the observer (whose baseline must come
        // before any traffic), so the controller finds it through a cell.
        let manager = ThreadPoolManager::with_defaults();
        manager.set_profile_threads(1);
        let pool_cell: Arc<OnceLock<Arc<ThreadPool>>> = Arc::new(OnceLock::new());
        let decision: Arc<Mutex<Option<Decision>>> = Arc::default();
        let hook = {
            let cell = pool_cell.clone();
            let decision = decision.clone();
            let counters = counters.clone();
            let manager = manager.clone();
            let mut vta = match shared.cfg.pipeline.pool {
                PoolMode::Vta => Some(Vta::new(shared.cfg.vta_config())),
                PoolMode::Fixed(_) => None,
            };
            move |history: &std::collections::VecDeque<Sample>| {
                let (Some(vta), Some(pool)) = (vta.as_mut(), cell.get()) else {
                    return;
                };
                let hist: Vec<Sample> = history.iter().copied().collect();
                let d = vta.decide(&hist);
                if d.n_next != pool.size() {
                    if let Err(e) = pool.resize(d.n_next) {
                        tracing::warn!(error = %e, "cannot resize the handler pool");
                    } else {
                        counters.htp_threads.store(d.n_next as u64, Relaxed);
                        manager.set_interaction_threads(d.n_next);
                    }
                }
                tracing::debug!(
                    r_t = d.r_t, h_t = d.h_t, n_t = d.n_t, qs_t = d.qs_t, ht_t = d.ht_t, pd_t = d.pd_t,
                    e_t = d.e_t, q_t = d.q_t, p_next = d.p_next, nt_max = d.nt_max, n_next = d.n_next,
                    saturated = d.saturated, climb = ?d.climb, trial = ?d.trial, "vta"
                );
                *decision.lock() = Some(d);
            }
        };
        let observer = Observer::start(
            counters.clone(),
            Duration::from_secs(1),
            shared.cfg.pipeline.observer_samples,
            hook,
        )?;
        let threads = shared.cfg.threads().min(MAX_HTP_THREADS);
        let sh = shared.clone();
        let sh2 = shared.clone();
        let htp = Arc::new(ThreadPool::new(
            "htp",
            threads,
            move |w| handler_loop(&sh, w),
            move || sh2.queue.wake_all(),
        )?);
        counters.htp_threads.store(threads as u64, Relaxed);
        manager.set_interaction_threads(threads);
        let _ = pool_cell.set(htp.clone());
        let mut receivers = Vec::new();
        for i in 0..shared.listeners.len() {
            let sh = shared.clone();
            receivers.push(
                std::thread::Builder::new()
                    .name(format!("nr-{i}"))
                    .spawn(move || fatal_on_panic("network receiver", || receive_loop(&sh, i)))?,
            );
        }
        // the Observe notifier; joined with the receivers on stop
        let sh = shared.clone();
        receivers.push(
            std::thread::Builder::new()
                .name("coap-notify".into())
                .spawn(move || fatal_on_panic("notifier", || notify_loop(&sh)))?,
        );
        let (mut tcp, mut tls_tcp, mut ws, mut tls_ws) = (None, None, None, None);
        if let Some(outboxes) = &shared.outboxes {
            let c = &shared.cfg.coap;
            let settings = crate::coap_tcp::TcpSettings {
                max_connections: c.tcp_max_connections,
                max_per_source: c.tcp_max_per_source,
                connection: mintgate_coap::server::tcp::ConnectionConfig {
                    max_message_size: c.tcp_max_message_size,
                    max_payload: c.max_payload,
                    frame_timeout: Duration::from_millis(c.tcp_frame_timeout_ms),
                    bert: true,
                },
                idle_timeout: Duration::from_secs(c.tcp_idle_timeout_s),
                allowed_hosts: shared.cfg.proxy.allowed_hosts.clone(),
            };
            let sh = shared.clone();
            let serve: crate::coap_tcp::Serve =
                Arc::new(move |req: &Request<'_>, _max, conn| serve_reliable(&sh, req, conn));
            use crate::coap_tcp::Transport;
            let start = |binds: &[SocketAddr], transport| {
                crate::coap_tcp::TcpServer::start(
                    binds,
                    settings.clone(),
                    transport,
                    serve.clone(),
                    outboxes.clone(),
                )
                .map_err(|source| StartError::BindTcp {
                    addrs: binds.to_vec(),
                    source,
                })
            };
            if !c.tcp_bind.is_empty() {
                tcp = Some(start(&c.tcp_bind, Transport::Tcp)?);
            }
            // with no ws_bind of its own, a coap+ws server that only takes
            // what the HTTP listener hands over
            if !c.ws_bind.is_empty() || ws_on_http(&shared.cfg) {
                ws = Some(start(&c.ws_bind, Transport::Ws)?);
            }
            let s = &shared.cfg.coaps;
            if !s.tcp_bind.is_empty() {
                let tls = s.tcp_tls().map_err(StartError::Tls)?;
                tls_tcp = Some(start(&s.tcp_bind, Transport::Tls(tls))?);
            }
            if !s.ws_bind.is_empty() {
                let tls = s.ws_tls().map_err(StartError::Tls)?;
                tls_ws = Some(start(&s.ws_bind, Transport::Wss(tls))?);
            }
        }
        let sh = shared.clone();
        let timer = Some(
            std::thread::Builder::new()
                .name("coap-timer".into())
                .spawn(move || fatal_on_panic("coap timer", || timer_loop(&sh)))?,
        );
        Ok(Gateway {
            shared,
            receivers,
            timer,
            htp,
            decision,
            manager,
            observer,
            tcp,
            tls_tcp,
            ws,
            tls_ws,
        })
    }

    /// The bound CoAP-over-TCP addresses (`coap.tcp_bind`, with the ports
    /// the OS chose for `:0`).
    pub fn tcp_addrs(&self) -> Vec<SocketAddr> {
        addrs_of(&self.tcp)
    }

    /// The bound `coaps+tcp` addresses (`coaps.tcp_bind`).
    pub fn tls_tcp_addrs(&self) -> Vec<SocketAddr> {
        addrs_of(&self.tls_tcp)
    }

    /// The bound `coap+ws` addresses (`coap.ws_bind`).
    pub fn ws_addrs(&self) -> Vec<SocketAddr> {
        addrs_of(&self.ws)
    }

    /// The bound `coaps+ws` addresses (`coaps.ws_bind`).
    pub fn tls_ws_addrs(&self) -> Vec<SocketAddr> {
        addrs_of(&self.tls_ws)
    }

    /// What takes the WebSocket upgrades to `/.well-known/coap` that the
    /// HTTP listener hands over (`proxy.coap_ws`), when it is on.
    pub fn ws_adopter(&self) -> Option<crate::coap_tcp::Adopter> {
        ws_on_http(&self.shared.cfg)
            .then(|| self.ws.as_ref().map(|w| w.adopter()))
            .flatten()
    }

    /// The bound listener addresses (with the ports the OS chose for `:0`).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.shared
            .listeners
            .iter()
            .filter_map(|s| s.local_addr().ok())
            .collect()
    }

    /// The pipeline counters.
    pub fn counters(&self) -> &Arc<PipelineCounters> {
        &self.shared.counters
    }

    /// The DTLS session tables of the coaps listeners, in `coaps.bind`
    /// order (their addresses follow the plain ones in [`local_addrs`]).
    ///
    /// [`local_addrs`]: Gateway::local_addrs
    pub fn dtls_servers(&self) -> Vec<Arc<DtlsServer>> {
        self.shared.dtls.iter().flatten().cloned().collect()
    }

    /// The bound coaps listener addresses.
    pub fn coaps_addrs(&self) -> Vec<SocketAddr> {
        self.shared
            .listeners
            .iter()
            .zip(&self.shared.dtls)
            .filter(|(_, d)| d.is_some())
            .filter_map(|(s, _)| s.local_addr().ok())
            .collect()
    }

    /// The Performance Observer's samples, oldest first.
    pub fn samples(&self) -> Vec<Sample> {
        self.observer.samples()
    }

    /// The buffer pool.
    pub fn pool(&self) -> &Pool {
        &self.shared.pool
    }

    /// The HTP queue bound in bytes.
    pub fn queue_bytes(&self) -> usize {
        self.shared.queue.max_bytes()
    }

    /// A cloneable, read-only view of the running gateway (for the metrics
    /// endpoint and other observers).
    pub fn handle(&self) -> GatewayHandle {
        GatewayHandle {
            shared: self.shared.clone(),
            observer: self.observer.handle(),
            decision: self.decision.clone(),
            htp: self.htp.clone(),
            manager: self.manager.clone(),
        }
    }

    /// The VTA controller's last decision (`None` with a fixed pool or
    /// before the first second).
    pub fn vta_decision(&self) -> Option<Decision> {
        *self.decision.lock()
    }

    /// The Thread Pool Manager: Resource Management tasks and Application
    /// Services run here; it counts the threads of every group.
    pub fn manager(&self) -> &ThreadPoolManager {
        &self.manager
    }

    /// HTP threads now.
    pub fn htp_threads(&self) -> usize {
        self.htp.size()
    }

    /// Resizes the handler pool (clamped to 1..=[`MAX_HTP_THREADS`]). With
    /// `pipeline.pool = "vta"` the controller sizes it again at its next
    /// decision (within a second); use a fixed pool to size it by hand.
    pub fn resize_htp(&self, n: usize) -> io::Result<()> {
        let n = n.clamp(1, MAX_HTP_THREADS);
        self.htp.resize(n)?;
        self.shared.counters.htp_threads.store(n as u64, Relaxed);
        self.manager.set_interaction_threads(n);
        Ok(())
    }

    /// Adds a resource while running.
    pub fn add_resource(&self, r: Resource) -> Result<(), PathTaken> {
        let mut g = self.shared.router.write();
        let mut next = (**g).clone();
        next.add(r)?;
        *g = Arc::new(next);
        Ok(())
    }

    /// Removes a resource while running. Its observers get a final 4.04
    /// notification and are dropped.
    pub fn remove_resource(&self, path: &str) -> Option<Resource> {
        let mut g = self.shared.router.write();
        let mut next = (**g).clone();
        let r = next.remove(path)?;
        *g = Arc::new(next);
        drop(g);
        self.shared.observe.mark(path);
        Some(r)
    }

    /// Adds Prometheus text to what the metrics endpoint serves.
    pub fn add_metrics_source(&self, f: MetricsSource) {
        self.shared.metrics_sources.write().push(f);
    }

    /// Adds (or replaces) the section `name` of the dashboard's state
    /// (`/api/state`). A part that is not running adds no section, and the
    /// dashboard shows it as not enabled.
    pub fn add_state_source(&self, name: &str, f: StateSource) {
        let mut v = self.shared.state_sources.write();
        v.retain(|(n, _)| n != name);
        v.push((name.to_owned(), f));
    }

    /// Removes the section `name` of the dashboard's state.
    pub fn remove_state_source(&self, name: &str) {
        self.shared.state_sources.write().retain(|(n, _)| n != name);
    }

    /// The handle that tells the gateway a resource changed, so that its
    /// observers get a notification.
    pub fn notifier(&self) -> Notifier {
        Notifier {
            state: self.shared.observe.clone(),
        }
    }

    /// Adds (or replaces) the readiness check `name` (`/readyz`,
    /// `mintgate_ready`): the MQTT or NATS uplink, for one.
    pub fn add_ready_check(&self, name: &str, f: crate::health::ReadyCheck) {
        self.shared.health.add_check(name, f);
    }

    /// Says that the process has bound every listener it was asked for
    /// (the proxy's and the metrics endpoint's too): until then `/readyz`
    /// answers 503 `startup`.
    pub fn mark_serving(&self) {
        self.shared.health.mark_serving();
    }

    /// Stops every thread and waits for them.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        for mut t in [
            self.tcp.take(),
            self.tls_tcp.take(),
            self.ws.take(),
            self.tls_ws.take(),
        ]
        .into_iter()
        .flatten()
        {
            t.stop();
        }
        self.shared.stop.store(true, Relaxed);
        self.htp.shutdown();
        for r in self.receivers.drain(..) {
            let _ = r.join();
        }
        if let Some(t) = self.timer.take() {
            let _ = t.join();
        }
        self.observer.stop();
        self.manager.shutdown();
    }
}

/// A read-only view of a running [`Gateway`]; cheap to clone.
#[derive(Clone)]
pub struct GatewayHandle {
    shared: Arc<Shared>,
    observer: mintgate_sched::ObserverHandle,
    decision: Arc<Mutex<Option<Decision>>>,
    manager: ThreadPoolManager,
    htp: Arc<ThreadPool>,
}

impl GatewayHandle {
    /// The pipeline counters.
    pub fn counters(&self) -> &PipelineCounters {
        &self.shared.counters
    }

    /// The Performance Observer's samples, oldest first.
    pub fn samples(&self) -> Vec<Sample> {
        self.observer.samples()
    }

    /// The VTA controller's last decision.
    pub fn vta_decision(&self) -> Option<Decision> {
        *self.decision.lock()
    }

    /// The buffer pool.
    pub fn pool(&self) -> &Pool {
        &self.shared.pool
    }

    /// HTP threads now.
    pub fn htp_threads(&self) -> usize {
        self.htp.size()
    }

    /// The HTP queue bound in bytes.
    pub fn queue_bytes(&self) -> usize {
        self.shared.queue.max_bytes()
    }

    /// The Thread Pool Manager (threads per group).
    pub fn manager(&self) -> &ThreadPoolManager {
        &self.manager
    }

    /// The configuration the gateway runs with.
    pub fn config(&self) -> &Config {
        &self.shared.cfg
    }

    /// The Observe notifier (and its counters).
    pub fn notifier(&self) -> Notifier {
        Notifier {
            state: self.shared.observe.clone(),
        }
    }

    /// The Observe, endpoint, transport and security counters and every
    /// added metrics source.
    pub fn extra_metrics(&self, m: &mut Exposition) {
        crate::observe::collect(&self.shared.observe, m);
        crate::observe::collect_endpoint(&self.shared.endpoint, m);
        m.counter(
            "mintgate_handler_panics_total",
            "Handlers that panicked (answered 5.00; the thread goes on).",
            self.shared.handler_panics.load(Relaxed),
        );
        let (stats, held, bytes) = self.shared.endpoint.block1();
        collect_block1(&stats, held, bytes, m);
        let (size, dd) = self.shared.endpoint.dedup_summary();
        collect_dedup(&size, &dd, m);
        let dtls: Vec<&mintgate_dtls::DtlsStats> = self
            .shared
            .dtls
            .iter()
            .flatten()
            .map(|d| &**d.stats())
            .collect();
        crate::dtls::collect(&dtls, m);
        self.shared.access.collect(m);
        self.shared.dashboard_refused.collect(m);
        if let Some(t) = &self.shared.tcp_stats {
            t.collect(m);
        }
        if let Some(o) = &self.shared.oscore {
            crate::oscore::collect(o.stats(), m);
        }
        for f in self.shared.metrics_sources.read().iter() {
            f(m);
        }
    }

    /// Every added state section, in the order added.
    pub fn state_sections(&self) -> Vec<(String, serde_json::Value)> {
        let sources: Vec<(String, StateSource)> = self.shared.state_sources.read().clone();
        sources.into_iter().map(|(n, f)| (n, f())).collect()
    }

    /// The write policy (`[access]`) and its refusal counters.
    pub fn access(&self) -> &crate::access::AccessPolicy {
        &self.shared.access
    }

    /// Requests the dashboard refused, by reason.
    pub fn dashboard_refusals(&self) -> &crate::dashboard::Refusals {
        &self.shared.dashboard_refused
    }

    /// Time since the gateway started.
    pub fn uptime(&self) -> Duration {
        self.shared.started.elapsed()
    }

    /// Every readiness check now (`/readyz`).
    pub fn readiness(&self) -> crate::health::Readiness {
        self.shared.health.readiness(self.shared.stop.load(Relaxed))
    }

    /// `Ok` while every pipeline thread loops and the gateway is not
    /// stopping, else why not: what a service manager's watchdog should
    /// be told.
    pub fn pipeline_alive(&self) -> Result<(), String> {
        self.shared.health.pipeline(self.shared.stop.load(Relaxed))
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The bound addresses of a TCP listener kind, none when it is off.
fn addrs_of(t: &Option<crate::coap_tcp::TcpServer>) -> Vec<SocketAddr> {
    t.as_ref()
        .map(|t| t.local_addrs().to_vec())
        .unwrap_or_default()
}

/// Whether the HTTP listener serves CoAP over WebSockets too: it runs
/// (`proxy.http`) and `proxy.coap_ws` is on.
fn ws_on_http(cfg: &Config) -> bool {
    cfg.proxy.http.is_some() && cfg.proxy.coap_ws
}
