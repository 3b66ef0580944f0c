//! The Interaction pipeline (SPEC section 1) over UDP:
//!
//! ```text
//! socket --recvmmsg--> Network Receiver --batch--> HTP queue --batch--> handler pool --sendmmsg--> socket
//!                         |  classify, de-duplicate,                      route, handle, encode
//!                         |  Reset/5.03/replay at once                    (Send Handler runs on the
//!                                                                          handler thread: no extra hop)
//! ```
//!
//! The CoAP message layer (de-duplication, message IDs, empty ACKs and
//! separate responses, CON retransmissions, Observe relations, Block1
//! reassembly, address validation) is the sans-IO server endpoint,
//! [`mintgate_coap::server::Endpoint`]; this module is the sockets and
//! threads around it. One Network Receiver thread per listening socket; a
//! resizable pool of handler threads; one timer thread that drives the
//! endpoint's timeouts (empty ACKs, retransmissions) and the coaps
//! sessions' sweeps; the notifier thread; the Performance Observer thread.
//! Datagrams are received straight into pool blocks and responses are
//! encoded in pool blocks; nothing on the way allocates from the heap.
//!
//! A handler that panics answers 5.00 and its thread goes on (counted in
//! `mintgate_handler_panics_total`); a receiver, timer or notifier thread
//! that dies ends the process with a log line and exit status 70, so that a
//! service manager restarts it.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mintgate_buf::{BlockMut, Layer, Pool};
use mintgate_coap::server::{
    finish_response, Answer, Block1Stats, Datagram, DedupSize, DedupStats, Endpoint, Handled,
    Incoming, PathTaken, Request, Resource, Responded, Router, Transmit,
};
use mintgate_coap::wire::{Code, MessageType, Packet};
use mintgate_sched::priority::{self, Applied, Priority};
use mintgate_sched::{
    BatchSwitch, Decision, Observer, PipelineCounters, Sample, ThreadPool, ThreadPoolManager, Vta,
    Worker,
};
use parking_lot::{Mutex, RwLock};

use crate::config::{Config, PoolMode};
use crate::observe::{Notifier, ObserveState};
use crate::queue::{HtpQueue, Job, Shed};
use crate::udp::{self, RecvBatch, SendBatch};
use mintgate_dtls::DtlsServer;

/// Most HTP threads the pool may have.
pub const MAX_HTP_THREADS: usize = 256;
/// Cached responses evicted per shard when the receiver finds no block.
const EVICT_CHUNK: usize = 64;
/// Exit status of a process whose pipeline thread died (EX_SOFTWARE).
const EXIT_THREAD_DIED: i32 = 70;

/// Why the gateway could not start. The I/O cause is the error's source,
/// not part of its message: `{:#}` (anyhow's chain) prints it once.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A listener could not be bound.
    #[error("cannot bind udp {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: io::Error,
    },
    /// A thread could not be started.
    #[error("cannot start thread")]
    Thread(#[from] io::Error),
    /// The `coaps+tcp` TLS configuration could not be built.
    #[error("coaps+tcp: {0}")]
    Tls(String),
    /// A CoAP-over-TCP listener could not be bound.
    #[error("cannot bind coap+tcp {addrs:?}")]
    BindTcp {
        /// The addresses (`coap.tcp_bind`).
        addrs: Vec<SocketAddr>,
        /// The cause.
        source: io::Error,
    },
    /// The configuration is not valid.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The coaps keys or certificates cannot be used.
    #[error("coaps: {0}")]
    Dtls(mintgate_dtls::DtlsError),
    /// An OSCORE context cannot be used (its Master Secret or sequence
    /// file).
    #[error("oscore: {0}")]
    Oscore(String),
}

struct Shared {
    cfg: Config,
    pool: Pool,
    router: RwLock<Arc<Router>>,
    listeners: Vec<UdpSocket>,
    /// Per listener: its DTLS sessions when it serves coaps.
    dtls: Vec<Option<Arc<DtlsServer>>>,
    queue: HtpQueue,
    counters: Arc<PipelineCounters>,
    /// The CoAP message layer.
    endpoint: Arc<Endpoint>,
    stop: AtomicBool,
    /// Observe (RFC 7641): changed resources (the relations are the
    /// endpoint's).
    observe: Arc<ObserveState>,
    /// Handlers that panicked (answered 5.00).
    handler_panics: AtomicU64,
    /// Extra Prometheus text from other parts of the gateway (devices,
    /// direct path), appended to `/metrics`.
    metrics_sources: RwLock<Vec<MetricsSource>>,
    /// Named sections of the dashboard's state (`/api/state`) from other
    /// parts of the process (devices, direct path, proxy, MQTT).
    state_sources: RwLock<Vec<(String, StateSource)>>,
    /// When the gateway started (uptime on the dashboard).
    started: Instant,
    /// Who may write (`[access]`).
    access: crate::access::AccessPolicy,
    /// Requests the dashboard refused.
    dashboard_refused: crate::dashboard::Refusals,
    /// CoAP over TCP (`coap.tcp_bind`): its counters, rendered when it
    /// serves.
    tcp_stats: Option<Arc<crate::coap_tcp::TcpStats>>,
    /// OSCORE contexts (`[oscore]`), when any.
    oscore: Option<crate::oscore::OscoreServer>,
}

/// Writes metric families in the Prometheus text format.
pub type MetricsSource = Arc<dyn Fn(&mut String) + Send + Sync>;

/// Returns one section of the dashboard's state as JSON, read from the same
/// counters the section's metrics come from.
pub type StateSource = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;

impl Shared {
    /// Gives back buffers held by cached responses (oldest first) after an
    /// allocation failed; returns how many entries went. The cache is the
    /// only holder of blocks that can let go on demand. The pool calls this
    /// on the allocating thread, which may hold a shard's lock: shards that
    /// are busy are skipped, never waited for.
    fn reclaim(&self) -> usize {
        let freed = self.endpoint.reclaim(EVICT_CHUNK);
        self.counters.dedup_evicted.fetch_add(freed as u64, Relaxed);
        freed
    }

    /// Sends what each listener's batch holds, counting sent datagrams and
    /// send errors.
    fn flush(&self, sbs: &mut [SendBatch]) {
        for (i, sb) in sbs.iter_mut().enumerate() {
            let (s, f) = sb.flush(&self.listeners[i]);
            self.counters.sh_sent.fetch_add(s as u64, Relaxed);
            self.counters.sh_errors.fetch_add(f as u64, Relaxed);
        }
    }

    /// Sends one of the endpoint's transmissions through `sb` (a message)
    /// or at once (an empty ACK or Reset).
    fn transmit(&self, sb: &mut SendBatch, t: Transmit) {
        let Some(sock) = self.listeners.get(t.listener) else {
            return;
        };
        match t.datagram {
            Datagram::Message(o) => {
                let (s, f) = sb.push(sock, t.peer, o);
                self.counters.sh_sent.fetch_add(s as u64, Relaxed);
                self.counters.sh_errors.fetch_add(f as u64, Relaxed);
            }
            Datagram::Empty(e) => {
                let d = self.dtls[t.listener].as_deref();
                if udp::send_small(sock, d, t.peer, &e).is_ok() {
                    self.counters.sh_sent.fetch_add(1, Relaxed);
                }
            }
        }
    }
}

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
            .map_err(StartError::Oscore)?;
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
        let counters = Arc::new(PipelineCounters::default());
        let pool = Pool::new(&cfg.partitions());
        let endpoint = Arc::new(Endpoint::new(
            cfg.endpoint_config(),
            pool.clone(),
            Instant::now(),
        ));
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
            tcp_stats: (!cfg.coap.tcp_bind.is_empty() || !cfg.coaps.tcp_bind.is_empty())
                .then(Arc::default),
            oscore,
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
        let (mut tcp, mut tls_tcp) = (None, None);
        if let Some(stats) = &shared.tcp_stats {
            let c = &shared.cfg.coap;
            let settings = crate::coap_tcp::TcpSettings {
                max_connections: c.tcp_max_connections,
                max_per_source: c.tcp_max_per_source,
                connection: mintgate_coap::server::tcp::ConnectionConfig {
                    max_message_size: c.tcp_max_message_size,
                    max_payload: c.max_payload,
                    frame_timeout: Duration::from_millis(c.tcp_frame_timeout_ms),
                },
                idle_timeout: Duration::from_secs(c.tcp_idle_timeout_s),
            };
            let sh = shared.clone();
            let serve: crate::coap_tcp::Serve =
                Arc::new(move |req: &Request<'_>, _max| serve_reliable(&sh, req));
            let start = |binds: &[SocketAddr], tls| {
                crate::coap_tcp::TcpServer::start(
                    binds,
                    settings.clone(),
                    tls,
                    serve.clone(),
                    stats.clone(),
                )
                .map_err(|source| StartError::BindTcp {
                    addrs: binds.to_vec(),
                    source,
                })
            };
            if !c.tcp_bind.is_empty() {
                tcp = Some(start(&c.tcp_bind, None)?);
            }
            let s = &shared.cfg.coaps;
            if !s.tcp_bind.is_empty() {
                let tls = s.tcp_tls().map_err(StartError::Tls)?;
                tls_tcp = Some(start(&s.tcp_bind, Some(tls))?);
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
        })
    }

    /// The bound CoAP-over-TCP addresses (`coap.tcp_bind`, with the ports
    /// the OS chose for `:0`).
    pub fn tcp_addrs(&self) -> Vec<SocketAddr> {
        self.tcp
            .as_ref()
            .map(|t| t.local_addrs().to_vec())
            .unwrap_or_default()
    }

    /// The bound `coaps+tcp` addresses (`coaps.tcp_bind`).
    pub fn tls_tcp_addrs(&self) -> Vec<SocketAddr> {
        self.tls_tcp
            .as_ref()
            .map(|t| t.local_addrs().to_vec())
            .unwrap_or_default()
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

    /// Stops every thread and waits for them.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        for mut t in [self.tcp.take(), self.tls_tcp.take()].into_iter().flatten() {
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

    /// Appends the Observe counters and every added metrics source, in the
    /// Prometheus text format.
    pub fn extra_metrics(&self, out: &mut String) {
        crate::observe::render_metrics(&self.shared.observe, out);
        crate::observe::render_endpoint_metrics(&self.shared.endpoint, out);
        {
            use std::fmt::Write as _;
            let _ = writeln!(
                out,
                "# HELP mintgate_handler_panics_total Handlers that panicked (answered 5.00; the thread goes on).\n# TYPE mintgate_handler_panics_total counter\nmintgate_handler_panics_total {}",
                self.shared.handler_panics.load(Relaxed)
            );
        }
        let (stats, held, bytes) = self.shared.endpoint.block1();
        render_block1_metrics(&stats, held, bytes, out);
        let (size, dd) = self.shared.endpoint.dedup_summary();
        render_dedup_metrics(&size, &dd, out);
        let dtls: Vec<&mintgate_dtls::DtlsStats> = self
            .shared
            .dtls
            .iter()
            .flatten()
            .map(|d| &**d.stats())
            .collect();
        crate::dtls::render_metrics(&dtls, out);
        self.shared.access.render_metrics(out);
        self.shared.dashboard_refused.render_metrics(out);
        if let Some(t) = &self.shared.tcp_stats {
            t.render(out);
        }
        if let Some(o) = &self.shared.oscore {
            crate::oscore::render_metrics(o.stats(), out);
        }
        for f in self.shared.metrics_sources.read().iter() {
            f(out);
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
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs a pipeline thread's loop; if it panics, the process cannot go on
/// without it: log and exit non-zero, so that a service manager restarts
/// the gateway (a process that lives on without its receiver serves
/// nothing and is never restarted).
fn fatal_on_panic(what: &str, f: impl FnOnce()) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
        tracing::error!(thread = what, "a pipeline thread panicked; exiting");
        std::process::exit(EXIT_THREAD_DIED);
    }
}

/// The Network Receiver stage for one listener: read a batch, classify,
/// de-duplicate, queue. The dedicated `nr-N` thread runs it blocking; an
/// idle handler thread runs it once without blocking before it sleeps
/// (`pipeline.handler_receives`), which saves the hand-off (a futex wake and
/// a context switch) whenever requests already wait in the socket. Either
/// way the requests go through the HTP queue and are counted the same.
struct Receiver {
    li: usize,
    batch: usize,
    rb: RecvBatch,
    blocks: Vec<BlockMut>,
    got: Vec<udp::Received>,
    jobs: Vec<Job>,
    rejected: Vec<(Job, Shed)>,
    sb: SendBatch,
    scratch: Vec<u8>,
    /// coaps: decrypted datagrams of the batch, with sender and identity.
    plain: Vec<(BlockMut, SocketAddr, Option<Arc<str>>)>,
}

impl Receiver {
    fn new(sh: &Shared, li: usize, batch: usize) -> Receiver {
        Receiver {
            li,
            batch,
            rb: RecvBatch::new(batch),
            blocks: Vec::with_capacity(batch),
            got: Vec::with_capacity(batch),
            jobs: Vec::with_capacity(batch),
            rejected: Vec::with_capacity(batch),
            sb: SendBatch::new(batch)
                .with_gso(sh.cfg.pipeline.send_gso)
                .with_dtls(sh.dtls[li].clone()),
            plain: Vec::with_capacity(batch),
            // a coaps listener decrypts into it: room for the largest record
            scratch: vec![
                0u8;
                if sh.dtls[li].is_some() {
                    sh.cfg.coap.max_datagram.max(16 * 1024 + 256)
                } else {
                    sh.cfg.coap.max_datagram
                }
            ],
        }
    }

    /// One receive call and its processing; returns the datagrams read.
    /// Without `blocking`, spare blocks go back to the pool afterwards, so an
    /// idle handler does not sit on receive buffers.
    fn receive_once(&mut self, sh: &Shared, blocking: bool) -> usize {
        let sock = &sh.listeners[self.li];
        let c = &sh.counters;
        let max_dgram = sh.cfg.coap.max_datagram;
        // The receiver holds no block while nothing arrives: with none in
        // hand it waits for a datagram (up to 100 ms) before taking any, so
        // an idle gateway has no block outstanding.
        if blocking && self.blocks.is_empty() && !wait_readable(sock, Duration::from_millis(100)) {
            return 0;
        }
        // Blocks are counted (Layer::Receive) when a datagram lands in them.
        while self.blocks.len() < self.batch {
            match sh.pool.alloc_uncounted(max_dgram, 0) {
                Ok(bl) => self.blocks.push(bl),
                Err(_) => break,
            }
        }
        if self.blocks.is_empty() {
            if !blocking {
                return 0;
            }
            // Pool exhausted, even after the pool asked the de-duplication
            // cache to give blocks back: shed one datagram so the socket
            // drains visibly.
            if sock.recv_from(&mut self.scratch).is_ok() {
                c.nr_datagrams.fetch_add(1, Relaxed);
                c.nr_dropped.fetch_add(1, Relaxed);
            }
            return 1;
        }
        self.got.clear();
        let n = match self
            .rb
            .recv(sock, &mut self.blocks, &mut self.got, blocking)
        {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                0
            }
            Err(e) => {
                tracing::warn!(error = %e, "receive failed");
                if blocking {
                    std::thread::sleep(Duration::from_millis(10));
                }
                0
            }
        };
        if n > 0 {
            self.process(sh, n);
        }
        if !blocking || n == 0 {
            self.blocks.clear();
        }
        n
    }

    fn process(&mut self, sh: &Shared, n: usize) {
        let c = &sh.counters;
        let now = Instant::now();
        c.nr_datagrams.fetch_add(n as u64, Relaxed);
        let mut blocks = std::mem::take(&mut self.blocks);
        let mut got = std::mem::take(&mut self.got);
        match sh.dtls[self.li].clone() {
            None => {
                let max_dgram = sh.cfg.coap.max_datagram;
                for (block, info) in blocks.drain(..n).zip(got.drain(..)) {
                    block.count_alloc(Layer::Receive);
                    // cut by the kernel, or longer than the limit although
                    // the block (the smallest that holds the limit) had room
                    if info.truncated || info.len > max_dgram {
                        c.nr_ignored.fetch_add(1, Relaxed);
                        continue;
                    }
                    self.one(sh, now, block, info.peer, None);
                }
            }
            Some(dtls) => {
                // records in, CoAP datagrams out: each decrypted datagram
                // gets a block of its own and goes the same way as a plain one
                let sock = &sh.listeners[self.li];
                let max_dgram = sh.cfg.coap.max_datagram;
                let mut plain = std::mem::take(&mut self.plain);
                for (block, info) in blocks.drain(..n).zip(got.drain(..)) {
                    // a record may exceed the plaintext limit by its own
                    // overhead; the decrypted datagram is held to it below
                    if info.truncated {
                        c.nr_ignored.fetch_add(1, Relaxed);
                        continue;
                    }
                    dtls.handle_datagram(
                        now,
                        info.peer,
                        block.as_slice(),
                        &mut self.scratch,
                        &mut |pt, id| {
                            if pt.len() > max_dgram {
                                c.nr_ignored.fetch_add(1, Relaxed);
                                return;
                            }
                            match sh.pool.alloc_uncounted(max_dgram, 0) {
                                Ok(mut b) => {
                                    b.whole_block_mut()[..pt.len()].copy_from_slice(pt);
                                    b.set_data(0..pt.len());
                                    b.count_alloc(Layer::Receive);
                                    plain.push((b, info.peer, id.cloned()));
                                }
                                Err(_) => {
                                    c.nr_dropped.fetch_add(1, Relaxed);
                                }
                            }
                        },
                        &mut |rec| {
                            if sock.send_to(rec, info.peer).is_ok() {
                                c.sh_sent.fetch_add(1, Relaxed);
                            }
                        },
                    );
                }
                for (block, peer, id) in plain.drain(..) {
                    self.one(sh, now, block, peer, id);
                }
                self.plain = plain;
            }
        }
        self.blocks = blocks;
        self.got = got;
        let sock = &sh.listeners[self.li];
        sh.queue.push_batch(&mut self.jobs, &mut self.rejected);
        for (job, why) in self.rejected.drain(..) {
            shed_at_queue(sh, &mut self.sb, job, why);
        }
        let (sent, failed) = self.sb.flush(sock);
        c.sh_sent.fetch_add(sent as u64, Relaxed);
        c.sh_errors.fetch_add(failed as u64, Relaxed);
    }

    /// Classifies and de-duplicates one CoAP datagram; a new request goes
    /// to `self.jobs`.
    fn one(
        &mut self,
        sh: &Shared,
        now: Instant,
        block: BlockMut,
        peer: SocketAddr,
        identity: Option<Arc<str>>,
    ) {
        let c = &sh.counters;
        let answer = match sh
            .endpoint
            .handle_datagram(now, peer, self.li, block.as_slice())
        {
            Incoming::Request { .. } => {
                self.jobs.push(Job {
                    peer,
                    block,
                    listener: self.li,
                    received: now,
                    identity,
                });
                return;
            }
            Incoming::Duplicate(t) => {
                c.nr_duplicates.fetch_add(1, Relaxed);
                t
            }
            Incoming::Malformed(t) => {
                c.nr_malformed.fetch_add(1, Relaxed);
                t
            }
            Incoming::Ignored(t) => {
                c.nr_ignored.fetch_add(1, Relaxed);
                t
            }
            Incoming::Consumed => None,
        };
        if let Some(t) = answer {
            sh.transmit(&mut self.sb, t);
        }
    }
}

/// Waits up to `timeout` for `sock` to have a datagram; false on timeout.
fn wait_readable(sock: &UdpSocket, timeout: Duration) -> bool {
    let mut p = libc::pollfd {
        fd: std::os::fd::AsRawFd::as_raw_fd(sock),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut p, 1, timeout.as_millis() as libc::c_int) > 0 }
}

/// The dedicated Network Receiver thread of listener `li`.
fn receive_loop(sh: &Shared, li: usize) {
    let mut r = Receiver::new(sh, li, sh.cfg.pipeline.receive_batch);
    let mut policy = ThreadPolicy::new(sh, RECEIVER);
    while !sh.stop.load(Relaxed) {
        r.receive_once(sh, true);
        policy.update();
    }
}

const RECEIVER: &str = "network receiver";

/// A pipeline thread's scheduling policy: `SCHED_BATCH` above
/// `pipeline.batch_sched_above` datagrams per second (all listeners
/// together), back to `SCHED_OTHER` at the thread's own nice value below;
/// see [`BatchSwitch`] for why. A thread that did not start at
/// `SCHED_OTHER` (an operator ran it under `chrt`, say) is left alone, and
/// one the kernel refuses batch stops trying. Counted in the
/// `pipeline_batch_threads` gauge only while the kernel has granted it; a
/// thread leaves batch when its loop ends (a pool thread may run the loop
/// again later).
struct ThreadPolicy<'a> {
    counters: &'a PipelineCounters,
    switch: BatchSwitch,
    in_batch: bool,
    /// False once refused, or when the thread started at another policy.
    enabled: bool,
    what: &'static str,
}

impl<'a> ThreadPolicy<'a> {
    fn new(sh: &'a Shared, what: &'static str) -> ThreadPolicy<'a> {
        let c = &*sh.counters;
        ThreadPolicy {
            counters: c,
            switch: BatchSwitch::new(
                sh.cfg.pipeline.batch_sched_above,
                Instant::now(),
                c.nr_datagrams.load(Relaxed),
            ),
            in_batch: false,
            enabled: sh.cfg.pipeline.batch_sched_above > 0
                && matches!(priority::current_thread_priority(), Applied::Nice(_)),
            what,
        }
    }

    /// Looks at the datagram rate and switches the calling thread if due.
    fn update(&mut self) {
        if !self.enabled {
            return;
        }
        let c = self.counters;
        let Some(on) = self
            .switch
            .update(Instant::now(), c.nr_datagrams.load(Relaxed))
        else {
            return;
        };
        let rate = self.switch.last_rate().round() as u64;
        if on {
            match priority::set_current_thread_priority(Priority::Batch) {
                Applied::Batch(_) => {
                    self.in_batch = true;
                    c.pipeline_batch_threads.fetch_add(1, Relaxed);
                    c.pipeline_batch_switches.fetch_add(1, Relaxed);
                    self.log(rate, "to SCHED_BATCH");
                }
                other => {
                    self.enabled = false;
                    tracing::warn!(
                        thread = self.what,
                        applied = ?other,
                        "SCHED_BATCH refused; the thread stays at its policy"
                    );
                }
            }
        } else {
            self.leave();
            self.log(rate, "back to SCHED_OTHER");
        }
    }

    /// Receivers (one per listener) at info, handlers (up to
    /// [`MAX_HTP_THREADS`], switching together) at debug.
    fn log(&self, rate: u64, what: &str) {
        if self.what == RECEIVER {
            tracing::info!(datagrams_per_s = rate, "network receiver {what}");
        } else {
            tracing::debug!(datagrams_per_s = rate, "{} {what}", self.what);
        }
    }

    fn leave(&mut self) {
        if self.in_batch {
            // whatever the kernel says, the thread is no longer counted
            priority::set_current_thread_priority(Priority::Other);
            self.in_batch = false;
            self.counters.pipeline_batch_threads.fetch_sub(1, Relaxed);
        }
    }
}

impl Drop for ThreadPolicy<'_> {
    fn drop(&mut self) {
        self.leave();
    }
}

/// The queue is full, in all or for the request's source: a NON is
/// dropped, a CON gets 5.03 with Max-Age.
fn shed_at_queue(sh: &Shared, sb: &mut SendBatch, job: Job, why: Shed) {
    let Ok(p) = Packet::new_checked(job.block.as_slice()) else {
        return;
    };
    let con = p.msg_type() == MessageType::Con;
    match (why, con) {
        (Shed::PeerLimit, _) => &sh.counters.nr_peer_limited,
        (Shed::QueueFull, false) => &sh.counters.nr_dropped,
        (Shed::QueueFull, true) => &sh.counters.nr_rejected,
    }
    .fetch_add(1, Relaxed);
    if let Some(t) = sh
        .endpoint
        .shed(job.peer, job.listener, &p, sh.cfg.coap.overload_max_age_s)
    {
        sh.transmit(sb, t);
    }
}

/// One send batch per listener, encrypting on the coaps ones.
fn send_batches(sh: &Shared) -> Vec<SendBatch> {
    sh.dtls
        .iter()
        .map(|d| {
            SendBatch::new(sh.cfg.pipeline.send_batch)
                .with_gso(sh.cfg.pipeline.send_gso)
                .with_dtls(d.clone())
        })
        .collect()
}

/// One HTP thread: take a batch, handle each request, send the batch.
fn handler_loop(sh: &Shared, w: &Worker) {
    let c = &sh.counters;
    let hb = sh.cfg.pipeline.handler_batch;
    let mut jobs: Vec<Job> = Vec::with_capacity(hb);
    let mut sbs = send_batches(sh);
    let slot = w.index();
    let mut receivers: Vec<Receiver> = (0..sh.listeners.len())
        .map(|li| Receiver::new(sh, li, sh.cfg.pipeline.receive_batch))
        .collect();
    let mut policy = ThreadPolicy::new(sh, "handler");
    while !w.should_stop() {
        policy.update();
        let share = c.htp_threads.load(Relaxed).max(1) as usize;
        if sh.cfg.pipeline.handler_receives && sh.queue.is_empty_hint() {
            for r in receivers.iter_mut() {
                r.receive_once(sh, false);
            }
        }
        sh.queue
            .pop_batch(&mut jobs, hb, share, Duration::from_millis(100));
        if jobs.is_empty() {
            continue;
        }
        let t0 = Instant::now();
        let router = sh.router.read().clone();
        let n = jobs.len() as u64;
        for job in jobs.drain(..) {
            let Ok(p) = Packet::new_checked(job.block.as_slice()) else {
                continue;
            };
            // OSCORE: the router sees the inner request, the answer is
            // protected back; one that does not verify is answered here
            let mut refusal = None;
            let verified = match &sh.oscore {
                Some(os) if p.option(crate::oscore::OPTION).is_some() => {
                    let mut rb = sh.endpoint.builder();
                    let v = os.unprotect(sh.endpoint.pool(), &p, &mut rb);
                    if v.is_none() {
                        refusal = Some(rb);
                    }
                    v
                }
                _ => None,
            };
            // the receive time stands for "now": block transfers time out
            // in seconds, and no clock is read per request. A request that
            // OSCORE verified counts as from a verified address, as one over
            // DTLS does: it is fresh (its Partial IV passed the replay
            // window) and made with the peer's key, and an Echo challenge
            // of the message layer would make the client repeat the same
            // protected bytes, a replay.
            let ticket = sh.endpoint.begin(
                slot,
                job.received,
                job.peer,
                job.listener,
                &p,
                job.identity.is_some() || sh.dtls[job.listener].is_some() || verified.is_some(),
            );
            let inner = verified
                .as_ref()
                .and_then(|v| Packet::new_checked(&v.message[..]).ok());
            let req = Request {
                peer: job.peer,
                packet: inner.as_ref().unwrap_or(&p),
                identity: verified
                    .as_ref()
                    .map(|v| v.identity.as_str())
                    .or(job.identity.as_deref()),
            };
            // writes are checked against [access]; the identity is the
            // peer's DTLS identity for requests that came over coaps, the
            // OSCORE context's for protected ones. A handler that panics
            // answers 5.00; the thread goes on.
            let oscore_id = verified.as_ref().map(|v| v.identity.as_str());
            let handled = match refusal.take() {
                Some(rb) => Handled::Respond(rb),
                None => handle_guarded(
                    sh,
                    job.received,
                    &router,
                    &req,
                    job.identity.as_deref(),
                    oscore_id,
                ),
            };
            let handled = match (&sh.oscore, &verified, handled) {
                (Some(os), Some(v), Handled::Respond(plain)) => {
                    let mut rb = sh.endpoint.builder();
                    os.protect(v, plain, &mut rb);
                    Handled::Respond(rb)
                }
                (_, _, h) => h,
            };
            // the time now: a separate response's retransmission timer
            // starts when it is sent, not when the request came
            match sh
                .endpoint
                .respond(Instant::now(), ticket, &router, &req, handled)
            {
                Responded::Send(t) => sh.transmit(&mut sbs[job.listener], t),
                Responded::Silent => {}
                Responded::Exhausted => {
                    c.htp_shed.fetch_add(1, Relaxed);
                }
            }
        }
        drop(router);
        sh.flush(&mut sbs);
        c.htp_handled.fetch_add(n, Relaxed);
        c.htp_busy_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
    }
}

/// Checks a request against `[access]` (`dtls`: the DTLS identity it came
/// with, `oscore`: the OSCORE context that verified it) and runs its
/// handler; a handler that panics answers 5.00 and is counted.
fn handle_guarded(
    sh: &Shared,
    now: Instant,
    router: &Router,
    req: &Request<'_>,
    dtls: Option<&str>,
    oscore: Option<&str>,
) -> Handled {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        match sh.access.check_with(req, dtls, oscore) {
            Ok(()) => sh.endpoint.process(now, router, req),
            Err(why) => {
                let mut rb = sh.endpoint.builder();
                sh.access.answer(why, &mut rb);
                Handled::Respond(rb)
            }
        }
    }))
    .unwrap_or_else(|_| {
        sh.handler_panics.fetch_add(1, Relaxed);
        tracing::error!(peer = %req.peer, "a handler panicked; answered 5.00");
        let mut rb = sh.endpoint.builder();
        rb.set_code(Code::INTERNAL_SERVER_ERROR);
        Handled::Respond(rb)
    })
}

/// Answers a request that came over a reliable transport (CoAP over TCP):
/// the same access rules, router and request layer (Block1 included) as
/// over UDP, without the message layer's de-duplication, message IDs and
/// retransmissions, and without Observe registration (a GET with Observe
/// is answered as a plain GET).
fn serve_reliable(sh: &Shared, req: &Request<'_>) -> Answer {
    let router = sh.router.read().clone();
    match handle_guarded(sh, Instant::now(), &router, req, req.identity, None) {
        Handled::Respond(rb) => {
            finish_response(&sh.pool, rb, MessageType::Ack, 0, req.packet.token())
        }
        Handled::Silent => Answer::Silent,
    }
}

/// Drives the endpoint's timeouts (empty ACKs for slow handlers, CON
/// retransmissions, expiry) and the coaps sessions' sweeps.
fn timer_loop(sh: &Shared) {
    let tick = (Duration::from_millis(sh.cfg.coap.separate_response_after_ms) / 4)
        .clamp(Duration::from_millis(5), Duration::from_millis(250));
    let mut sbs = send_batches(sh);
    while !sh.stop.load(Relaxed) {
        std::thread::sleep(tick);
        let now = Instant::now();
        sh.endpoint.handle_timeout(now);
        while let Some(t) = sh.endpoint.poll_transmit() {
            let li = t.listener;
            sh.transmit(&mut sbs[li], t);
        }
        sh.flush(&mut sbs);
        // coaps: handshake retransmissions, idle and stalled sessions
        for (li, d) in sh.dtls.iter().enumerate() {
            if let Some(d) = d {
                let sock = &sh.listeners[li];
                d.sweep(now, &mut |peer, rec| {
                    let _ = sock.send_to(rec, peer);
                });
            }
        }
    }
}

/// The `coap-notify` thread: has the endpoint render and send the
/// notifications of the resources marked changed.
fn notify_loop(sh: &Shared) {
    let mut sbs = send_batches(sh);
    let mut out = Vec::new();
    while !sh.stop.load(Relaxed) {
        let paths = sh.observe.take_dirty(Duration::from_millis(100));
        if paths.is_empty() {
            continue;
        }
        let router = sh.router.read().clone();
        let now = Instant::now();
        for p in &paths {
            sh.endpoint.notify(now, &router, p, &mut out);
            for t in out.drain(..) {
                let li = t.listener;
                sh.transmit(&mut sbs[li], t);
            }
        }
        sh.flush(&mut sbs);
    }
}

/// The Block1 reassembly counters in the Prometheus text format.
fn render_block1_metrics(st: &Block1Stats, held: usize, bytes: usize, out: &mut String) {
    crate::metrics::write_families(
        out,
        &[
            (
                "mintgate_block1_transfers",
                "Block1 transfers held (in progress, or completed and kept for Block2).",
                held as u64,
            ),
            (
                "mintgate_block1_bytes",
                "Bytes held by Block1 transfers.",
                bytes as u64,
            ),
            (
                "mintgate_block1_started_total",
                "Block1 transfers started.",
                st.started,
            ),
            (
                "mintgate_block1_completed_total",
                "Block1 requests handled whole.",
                st.completed,
            ),
            (
                "mintgate_block1_continue_total",
                "Blocks answered 2.31 Continue.",
                st.continued,
            ),
            (
                "mintgate_block1_incomplete_total",
                "Blocks answered 4.08 Request Entity Incomplete.",
                st.incomplete,
            ),
            (
                "mintgate_block1_too_large_total",
                "Blocks answered 4.13 Request Entity Too Large.",
                st.too_large,
            ),
            (
                "mintgate_block1_busy_total",
                "Blocks answered 5.03 (no room for another transfer).",
                st.busy,
            ),
            (
                "mintgate_block1_expired_total",
                "Block1 transfers dropped after the idle timeout.",
                st.expired,
            ),
            (
                "mintgate_block1_evicted_total",
                "Block1 transfers evicted for room (the sum of the three evicted_*_total).",
                st.evicted,
            ),
            (
                "mintgate_block1_busy_source_total",
                "5.03 answers: the source's own Block1 share was full.",
                st.busy_source,
            ),
            (
                "mintgate_block1_busy_global_total",
                "5.03 answers: the budget was full and the source was not lighter than the heaviest other.",
                st.busy_global,
            ),
            (
                "mintgate_block1_bad_total",
                "Blocks answered 4.00 (a block of the wrong size).",
                st.bad,
            ),
            (
                "mintgate_block1_evicted_own_total",
                "A source's own Block1 transfers evicted for its newer ones.",
                st.evicted_own,
            ),
            (
                "mintgate_block1_evicted_kept_total",
                "Completed Block1 bodies kept for Block2 evicted for room.",
                st.evicted_kept,
            ),
            (
                "mintgate_block1_evicted_heaviest_total",
                "Unfinished transfers of the heaviest source evicted for a lighter source's.",
                st.evicted_heaviest,
            ),
        ],
    );
}

/// The de-duplication tables' gauges and counters in the Prometheus text
/// format (summed over the endpoint's shards).
fn render_dedup_metrics(z: &DedupSize, c: &DedupStats, out: &mut String) {
    crate::metrics::write_families(
        out,
        &[
            (
                "mintgate_dedup_entries",
                "Exchanges remembered for de-duplication.",
                z.entries as u64,
            ),
            (
                "mintgate_dedup_queued",
                "Slots of the de-duplication expiry queue, live and stale.",
                z.queued as u64,
            ),
            (
                "mintgate_dedup_bytes",
                "Bytes of responses cached for de-duplication.",
                z.bytes as u64,
            ),
            (
                "mintgate_dedup_evicted_early_total",
                "Exchanges forgotten before their lifetime: the table was full.",
                c.evicted_early,
            ),
            (
                "mintgate_dedup_evicted_bytes_total",
                "Exchanges forgotten before their lifetime: cached responses weighed too much.",
                c.evicted_bytes,
            ),
            (
                "mintgate_dedup_too_heavy_total",
                "Responses not cached: heavier alone than the byte budget.",
                c.too_heavy,
            ),
            (
                "mintgate_dedup_forgotten_total",
                "Exchanges forgotten on purpose (shed requests).",
                c.forgotten,
            ),
        ],
    );
}
