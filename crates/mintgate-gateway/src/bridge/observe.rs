//! Observed resources -> topics: each `[[mqtt.observe]]` entry registers
//! with its CoAP resource (RFC 7641) on a thread of its own and offers every
//! notification to the publishing channel.
//!
//! An observation that fails, is reset, goes unanswered or falls silent for
//! longer than its Max-Age (plus a margin) is registered again after a
//! backoff doubling from one second to a minute; a resource that answers
//! without Observe is read again once a minute. Stopping deregisters.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mintgate_coap::uri::CoapUri;
use mintgate_coap::wire::ContentFormat;

use super::publish::{Hub, Item};
use super::{unix_ms, BridgeError};
use crate::bridge_format::Format;
use crate::config::MqttSection;
use crate::observe_client::{resolve, Observation, ObserveEvent};

/// One `[[mqtt.observe]]` entry, ready.
pub(super) struct Observed {
    text: Arc<str>,
    uri: CoapUri,
    accept: Option<ContentFormat>,
    pub(super) topic: String,
    format: Format,
    /// The resource's path, `sensors/temp0`.
    path: Arc<str>,
}

/// The `[[mqtt.observe]]` entries of `cfg`, parsed (URI, `accept`) and
/// ready; their topics still hold `{gateway}`.
pub(super) fn observed_entries(cfg: &MqttSection) -> Result<Vec<Observed>, BridgeError> {
    let bad = |key, why: String| BridgeError::Config { key, why };
    let mut observes = Vec::new();
    for o in &cfg.observe {
        let uri: CoapUri =
            mintgate_coap::uri::parse(&o.uri).map_err(|e| bad("mqtt.observe", e.to_string()))?;
        let accept = o
            .accept
            .as_deref()
            .map(|a| {
                ContentFormat::parse(a)
                    .ok_or_else(|| bad("mqtt.observe", format!("accept: unknown {a:?}")))
            })
            .transpose()?;
        let path = uri
            .options
            .iter()
            .filter(|(n, _)| *n == mintgate_coap::wire::OptionNumber::URI_PATH)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            .collect::<Vec<_>>()
            .join("/");
        observes.push(Observed {
            text: o.uri.as_str().into(),
            uri,
            accept,
            topic: o.topic.clone(),
            format: cfg.format_of(o.format.as_deref()),
            path: path.into(),
        });
    }
    Ok(observes)
}

/// Sleeps `d` in short steps; false when asked to stop meanwhile.
fn sleep_running(stop: &AtomicBool, d: Duration) -> bool {
    let end = Instant::now() + d;
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        if stop.load(Relaxed) {
            return false;
        }
        std::thread::sleep(left.min(Duration::from_millis(100)));
    }
    !stop.load(Relaxed)
}

/// How long past a notification's Max-Age the observation may stay silent
/// before it is registered again (the server may have forgotten us).
const SILENCE_MARGIN: Duration = Duration::from_secs(10);
const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(60);

pub(super) fn observe_loop(hub: &Hub, stop: &AtomicBool, o: &Observed) {
    let (text, uri, accept) = (&o.text, &o.uri, o.accept);
    let topic: Arc<str> = o.topic.as_str().into();
    let c = &hub.counters;
    let mut backoff = BACKOFF_MIN;
    while !stop.load(Relaxed) {
        let registered =
            resolve(uri).and_then(|dest| Observation::register(dest, uri.options.clone(), accept));
        let mut obs = match registered {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(uri = %text, "observing: {e}; trying again in {backoff:?}");
                if !sleep_running(stop, backoff) {
                    break;
                }
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        c.observe_registrations.fetch_add(1, Relaxed);
        let mut heard = Instant::now();
        let mut max_age = Duration::from_secs(60);
        let mut count = 0u64;
        // Some(wait): register again after it; None: stop
        let again: Option<Duration> = loop {
            if stop.load(Relaxed) {
                break None;
            }
            let ev = match obs.next_event(Instant::now() + Duration::from_millis(200)) {
                Ok(ev) => ev,
                Err(e) => {
                    tracing::warn!(uri = %text, "observing: {e}");
                    break Some(backoff);
                }
            };
            match ev {
                None => {
                    if obs.answered() && heard.elapsed() > max_age + SILENCE_MARGIN {
                        tracing::debug!(uri = %text, "no notification for {max_age:?}: registering again");
                        break Some(Duration::ZERO);
                    }
                }
                Some(ObserveEvent::Notification(n)) => {
                    count += 1;
                    heard = n.at;
                    max_age = Duration::from_secs(n.max_age.unwrap_or(60).into());
                    backoff = BACKOFF_MIN;
                    c.observe_notifications.fetch_add(1, Relaxed);
                    hub.offer(Item::Observed {
                        topic: topic.clone(),
                        format: o.format,
                        path: o.path.clone(),
                        uri: text.clone(),
                        observe: n.observe,
                        content_format: n.content_format,
                        payload: n.payload,
                        unix_ms: unix_ms(),
                    });
                    if n.observe.is_none() {
                        if count == 1 {
                            tracing::warn!(uri = %text, "answered without Observe: not observable; reading it again in {BACKOFF_MAX:?}");
                            break Some(BACKOFF_MAX);
                        }
                        tracing::info!(uri = %text, "the server ended the observation; registering again");
                        break Some(BACKOFF_MIN);
                    }
                }
                Some(ObserveEvent::Failed(n)) => {
                    tracing::warn!(uri = %text, code = %n.code, "observing: error answer; trying again in {backoff:?}");
                    break Some(backoff);
                }
                Some(ObserveEvent::NoAnswer) => {
                    tracing::warn!(uri = %text, "observing: no answer; trying again in {backoff:?}");
                    break Some(backoff);
                }
                Some(ObserveEvent::Reset) => {
                    tracing::warn!(uri = %text, "observing: registration reset; trying again in {backoff:?}");
                    break Some(backoff);
                }
                Some(ObserveEvent::Unreachable) => {
                    tracing::warn!(uri = %text, "observing: port unreachable (nothing listens); trying again in {backoff:?}");
                    break Some(backoff);
                }
            }
        };
        if obs.answered() {
            obs.deregister(Duration::from_millis(200));
        }
        match again {
            None => break,
            Some(d) => {
                if !sleep_running(stop, d) {
                    break;
                }
                if !d.is_zero() {
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
    }
}
