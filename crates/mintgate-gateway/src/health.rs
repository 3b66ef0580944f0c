//! Liveness and readiness, for service managers and load balancers.
//!
//! - `/healthz` (liveness): 200 while the process answers HTTP at all.
//! - `/readyz` (readiness): 200 when every check passes, else 503 with the
//!   first failing check's reason. The checks: `startup` (the process has
//!   bound every listener it was asked for: [`crate::Gateway::mark_serving`]),
//!   `pipeline` (every Network Receiver, the timer and the notifier thread
//!   ran within [`STALL_AFTER`], and the gateway is not stopping), and those
//!   other parts add ([`crate::Gateway::add_ready_check`]): the MQTT or NATS
//!   uplink of the bridges, when configured.
//! - `mintgate_up` (always 1 in an answer) and `mintgate_ready` (1 or 0) on
//!   `/metrics`.
//!
//! Both paths answer any client: a probe comes from wherever the service
//! manager or balancer runs. The reasons name a check and its state, never
//! an address, a credential or a peer's error text (those are on the
//! loopback-only dashboard and in the log).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use parking_lot::RwLock;
use serde::Serialize;

use crate::pipeline::GatewayHandle;

/// A readiness check: `Ok` while its part is ready, else why not (a short
/// sentence for an operator, without addresses or secrets).
pub type ReadyCheck = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// How long a pipeline thread may go without finishing a loop before the
/// gateway counts as not ready (and `serve`'s watchdog stops pinging). Its
/// loops come round at least every 250 ms when idle.
pub const STALL_AFTER: Duration = Duration::from_secs(5);

/// The pipeline threads' last loops and the readiness checks.
pub(crate) struct Health {
    started: Instant,
    /// Per pipeline thread: milliseconds since `started` at its last loop.
    beats: Box<[AtomicU64]>,
    names: Vec<String>,
    serving: AtomicBool,
    checks: RwLock<Vec<(String, ReadyCheck)>>,
}

impl Health {
    /// Tracks the threads `names` (indexes as given), all beating now.
    pub(crate) fn new(names: Vec<String>) -> Health {
        Health {
            started: Instant::now(),
            beats: names.iter().map(|_| AtomicU64::new(0)).collect(),
            names,
            serving: AtomicBool::new(false),
            checks: RwLock::new(Vec::new()),
        }
    }

    /// Thread `i` finished a loop.
    pub(crate) fn beat(&self, i: usize) {
        if let Some(b) = self.beats.get(i) {
            b.store(self.started.elapsed().as_millis() as u64, Relaxed);
        }
    }

    /// The first pipeline thread that has not looped within [`STALL_AFTER`].
    fn stalled(&self) -> Option<(&str, Duration)> {
        let now = self.started.elapsed();
        self.beats.iter().zip(&self.names).find_map(|(b, n)| {
            let since = now.saturating_sub(Duration::from_millis(b.load(Relaxed)));
            (since > STALL_AFTER).then_some((n.as_str(), since))
        })
    }

    pub(crate) fn mark_serving(&self) {
        self.serving.store(true, Relaxed);
    }

    pub(crate) fn add_check(&self, name: &str, f: ReadyCheck) {
        let mut v = self.checks.write();
        v.retain(|(n, _)| n != name);
        v.push((name.to_owned(), f));
    }

    /// `Ok` while the pipeline's threads run, else why not.
    pub(crate) fn pipeline(&self, stopping: bool) -> Result<(), String> {
        if stopping {
            return Err("the gateway is stopping".into());
        }
        match self.stalled() {
            Some((name, since)) => Err(format!(
                "pipeline thread {name} has not run for {} s",
                since.as_secs()
            )),
            None => Ok(()),
        }
    }

    /// Every check, in order: `startup`, `pipeline`, then those added.
    pub(crate) fn readiness(&self, stopping: bool) -> Readiness {
        let mut results: Vec<(String, Result<(), String>)> = vec![
            (
                "startup".into(),
                if self.serving.load(Relaxed) {
                    Ok(())
                } else {
                    Err("starting: not every listener is bound yet".into())
                },
            ),
            ("pipeline".into(), self.pipeline(stopping)),
        ];
        let checks: Vec<(String, ReadyCheck)> = self.checks.read().clone();
        results.extend(checks.into_iter().map(|(n, f)| (n, f())));
        Readiness::from_results(results)
    }
}

/// The answer of `/readyz`.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Readiness {
    /// Every check passed.
    pub ready: bool,
    /// The first failing check, as `NAME: why` (absent when ready).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Each check: `ok` or why not.
    pub checks: BTreeMap<String, String>,
}

impl Readiness {
    fn from_results(results: Vec<(String, Result<(), String>)>) -> Readiness {
        let reason = results
            .iter()
            .find_map(|(n, r)| r.as_ref().err().map(|e| format!("{n}: {e}")));
        Readiness {
            ready: reason.is_none(),
            reason,
            checks: results
                .into_iter()
                .map(|(n, r)| (n, r.err().unwrap_or_else(|| "ok".into())))
                .collect(),
        }
    }
}

/// `/healthz` and `/readyz` for the gateway behind `gw`.
pub fn router(gw: GatewayHandle) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(gw)
}

async fn healthz(State(gw): State<GatewayHandle>) -> impl IntoResponse {
    Json(serde_json::json!({
        "alive": true,
        "uptime_seconds": gw.uptime().as_secs(),
    }))
}

async fn readyz(State(gw): State<GatewayHandle>) -> impl IntoResponse {
    let r = gw.readiness();
    let code = if r.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(r))
}

/// `mintgate_up` and `mintgate_ready`.
pub(crate) fn collect(ready: bool, m: &mut crate::exposition::Exposition) {
    m.families(&[
        ("mintgate_up", "1 while the gateway answers.", 1),
        (
            "mintgate_ready",
            "1 while /readyz answers 200 (every readiness check passes).",
            u64::from(ready),
        ),
    ]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_ready_until_serving_then_the_first_failing_check_is_the_reason() {
        let h = Health::new(vec!["nr-0".into(), "coap-timer".into()]);
        let r = h.readiness(false);
        assert!(!r.ready);
        assert_eq!(
            r.reason.as_deref(),
            Some("startup: starting: not every listener is bound yet")
        );
        assert_eq!(r.checks["pipeline"], "ok");
        h.mark_serving();
        assert!(h.readiness(false).ready);
        h.add_check("mqtt", Arc::new(|| Err("not connected".into())));
        let r = h.readiness(false);
        assert!(!r.ready);
        assert_eq!(r.reason.as_deref(), Some("mqtt: not connected"));
        assert_eq!(r.checks["startup"], "ok");
        // a check added again under its name replaces the first
        h.add_check("mqtt", Arc::new(|| Ok(())));
        assert!(h.readiness(false).ready);
        assert_eq!(h.checks.read().len(), 1);
        let r = h.readiness(true);
        assert_eq!(
            r.reason.as_deref(),
            Some("pipeline: the gateway is stopping")
        );
    }

    #[test]
    fn a_thread_that_stops_looping_makes_the_pipeline_not_ready() {
        let mut h = Health::new(vec!["nr-0".into(), "coap-timer".into()]);
        // as if started STALL_AFTER + 1 s ago, the timer beating now
        h.started -= STALL_AFTER + Duration::from_secs(1);
        h.beat(1);
        let e = h.pipeline(false).unwrap_err();
        assert!(
            e.starts_with("pipeline thread nr-0 has not run for 6 s"),
            "{e}"
        );
        h.beat(0);
        assert_eq!(h.pipeline(false), Ok(()));
    }

    #[test]
    fn metrics_say_up_and_ready() {
        let out =
            crate::exposition::render(crate::exposition::Format::Prometheus, |m| collect(false, m));
        assert!(out.contains("\nmintgate_up 1\n"), "{out}");
        assert!(
            out.contains("# TYPE mintgate_ready gauge\nmintgate_ready 0\n"),
            "{out}"
        );
    }
}
