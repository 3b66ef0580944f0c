//! `/healthz` and `/readyz` of a standalone proxy (`mintgate proxy`), in
//! the same JSON shapes as the gateway's (`mintgate serve` answers them
//! from its own checks instead).
//!
//! - `/healthz` (liveness): 200 with `{"alive":true,"uptime_seconds":N}`
//!   while the process answers HTTP at all.
//! - `/readyz` (readiness): 200 with `{"ready":true,"checks":{"listening":"ok"}}`.
//!   The routes exist only once every listener of the proxy is bound, and
//!   a proxy holds no other state that must come up first: its upstream
//!   CoAP servers are many and each request says (504, 502) when one does
//!   not answer, so they are not a readiness check.
//!
//! Both answer any client, under the listener's connection, header and
//! rate limits, and say nothing about addresses or peers.

use std::collections::BTreeMap;
use std::time::Instant;

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;

#[derive(Serialize)]
struct Alive {
    alive: bool,
    uptime_seconds: u64,
}

#[derive(Serialize)]
struct Ready {
    ready: bool,
    checks: BTreeMap<&'static str, &'static str>,
}

/// The two routes, for a proxy that started at `started`.
pub fn router(started: Instant) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(started)
}

async fn healthz(State(started): State<Instant>) -> Json<Alive> {
    Json(Alive {
        alive: true,
        uptime_seconds: started.elapsed().as_secs(),
    })
}

async fn readyz() -> Json<Ready> {
    Json(Ready {
        ready: true,
        checks: BTreeMap::from([("listening", "ok")]),
    })
}
