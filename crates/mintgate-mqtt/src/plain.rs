//! Plain publishing without the queue: the lab's baselines (paper 004
//! Fig. 5). One connection, the messages handed to rumqttc as fast as its
//! in-flight limit allows, no persistence and no recovery: a connection
//! failure ends the run with an error.
//!
//! - QoS 2 with one message in flight is how the earlier work got ordering.
//! - QoS 1 with the client's default in-flight limit (rumqttc: 100) is fast,
//!   and in order only while nothing fails.

use std::time::{Duration, Instant};

use crate::conn::{BrokerUrl, Conn, ConnOptions, LinkEvent, Qos};
use crate::payload::{now_ms, Envelope};

/// rumqttc's default in-flight limit.
pub const CLIENT_DEFAULT_INFLIGHT: u16 = 100;

/// What a plain run did.
#[derive(Clone, Copy, Debug)]
pub struct PlainReport {
    /// Messages acknowledged (PUBACK / PUBCOMP).
    pub acked: u64,
    /// When the first PUBLISH was handed over (after CONNACK).
    pub started: Instant,
    /// From `started` to the last acknowledgement.
    pub elapsed: Duration,
}

/// Publishes `bodies` as envelopes of `publisher` with sequences 1..=n to
/// `topic` at `qos` with at most `inflight` unacknowledged, and waits for
/// every acknowledgement (at most `timeout` in all).
pub fn publish_plain(
    url: &BrokerUrl,
    topic: &str,
    qos: Qos,
    inflight: u16,
    publisher: &str,
    bodies: &[String],
    timeout: Duration,
) -> Result<PlainReport, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting a runtime: {e}"))?;
    rt.block_on(async {
        let mut o = ConnOptions::new(format!("{publisher}-plain"));
        o.inflight = inflight.max(1);
        let mut conn = Conn::start(url, &o);
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match next(&mut conn, deadline, timeout).await? {
                LinkEvent::Connected { .. } => break,
                _ => continue,
            }
        }
        let n = bodies.len() as u64;
        let (mut handed, mut acked) = (0u64, 0u64);
        let t0 = Instant::now();
        while acked < n {
            while handed < n && handed - acked < u64::from(o.inflight) {
                let env = Envelope {
                    publisher: publisher.to_owned(),
                    seq: handed + 1,
                    ts: now_ms(),
                    msg: bodies[handed as usize].clone(),
                };
                conn.publish(topic, qos, env.encode())?;
                handed += 1;
            }
            match next(&mut conn, deadline, timeout).await? {
                LinkEvent::Acked(_, Ok(())) => acked += 1,
                LinkEvent::Acked(pkid, Err(e)) => {
                    return Err(format!("packet {pkid} refused: {e}"))
                }
                _ => {}
            }
        }
        let elapsed = t0.elapsed();
        conn.disconnect();
        let _ = tokio::time::timeout(Duration::from_millis(200), async {
            while conn.next().await.is_ok() {}
        })
        .await;
        Ok(PlainReport {
            acked,
            started: t0,
            elapsed,
        })
    })
}

async fn next(
    conn: &mut Conn,
    deadline: tokio::time::Instant,
    timeout: Duration,
) -> Result<LinkEvent, String> {
    tokio::time::timeout_at(deadline, conn.next())
        .await
        .map_err(|_| format!("timed out after {timeout:?}"))?
}

/// Publishes each of `payloads` as is (no envelope) to `topic` at QoS 1,
/// one at a time, and waits for each PUBACK (at most `timeout` in all):
/// what an ordinary MQTT client sends, e.g. a command to the gateway's
/// bridge.
pub fn publish_raw(
    url: &BrokerUrl,
    topic: &str,
    payloads: &[Vec<u8>],
    timeout: Duration,
) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting a runtime: {e}"))?;
    rt.block_on(async {
        let o = ConnOptions::new(format!("mg-raw-{:08x}", rand::random::<u32>()));
        let mut conn = Conn::start(url, &o);
        let deadline = tokio::time::Instant::now() + timeout;
        while !matches!(
            next(&mut conn, deadline, timeout).await?,
            LinkEvent::Connected { .. }
        ) {}
        for p in payloads {
            conn.publish(topic, Qos::AtLeastOnce, p.clone())?;
            loop {
                match next(&mut conn, deadline, timeout).await? {
                    LinkEvent::Acked(_, Ok(())) => break,
                    LinkEvent::Acked(pkid, Err(e)) => {
                        return Err(format!("packet {pkid} refused: {e}"))
                    }
                    _ => {}
                }
            }
        }
        conn.disconnect();
        let _ = tokio::time::timeout(Duration::from_millis(200), async {
            while conn.next().await.is_ok() {}
        })
        .await;
        Ok(())
    })
}
