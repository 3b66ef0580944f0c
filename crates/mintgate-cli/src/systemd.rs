//! The service manager's notification protocol (systemd's `sd_notify`:
//! datagrams to the socket named by `NOTIFY_SOCKET`), for `serve` under a
//! `Type=notify` unit: `READY=1` once every listener is bound, `STOPPING=1`
//! on a signal, and `WATCHDOG=1` while the pipeline runs when the unit sets
//! `WatchdogSec=`. Without `NOTIFY_SOCKET` every call does nothing.

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use mintgate_gateway::GatewayHandle;
use sd_notify::NotifyState;

/// Tells the service manager the gateway serves, with a status line.
pub(crate) fn ready(status: &str) {
    if let Err(e) = sd_notify::notify(false, &[NotifyState::Ready, NotifyState::Status(status)]) {
        tracing::warn!(error = %e, "cannot tell the service manager the gateway is ready (NOTIFY_SOCKET)");
    }
}

/// Tells the service manager the gateway is stopping.
pub(crate) fn stopping() {
    let _ = sd_notify::notify(false, &[NotifyState::Stopping]);
}

/// The thread that pings the service manager's watchdog at half its
/// interval, but only while every pipeline thread loops: a gateway whose
/// receiver or timer is stuck stops pinging, and the manager restarts it.
/// Dropping it stops the thread.
pub(crate) struct Watchdog {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// Starts the thread when the manager asks for pings
    /// (`WATCHDOG_USEC`, for this process's `WATCHDOG_PID`).
    pub(crate) fn start(gw: GatewayHandle) -> anyhow::Result<Option<Watchdog>> {
        let mut usec = 0u64;
        if !sd_notify::watchdog_enabled(false, &mut usec) || usec == 0 {
            return Ok(None);
        }
        let every = Duration::from_micros(usec / 2).max(Duration::from_millis(100));
        tracing::info!(every = ?every, "service manager watchdog: pinging while the pipeline runs");
        let (tx, rx) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("watchdog".into())
            .spawn(move || {
                let mut was_alive = true;
                while let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(every) {
                    match gw.pipeline_alive() {
                        Ok(()) => {
                            let _ = sd_notify::notify(false, &[NotifyState::Watchdog]);
                            was_alive = true;
                        }
                        Err(why) => {
                            if was_alive {
                                tracing::error!(
                                    "{why}: not pinging the service manager's watchdog"
                                );
                            }
                            was_alive = false;
                        }
                    }
                }
            })?;
        Ok(Some(Watchdog {
            stop: Some(tx),
            thread: Some(thread),
        }))
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
