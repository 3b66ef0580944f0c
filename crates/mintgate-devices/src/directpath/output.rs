//! Outputs a link fires.

use std::fmt;
use std::sync::Arc;

use parking_lot::RwLock;

use super::Event;
use crate::driver::Driver;

/// Something a link's value goes to. Runs on the direct path's worker at
/// high priority: it must not block (a device write is fine; a network
/// send should be handed to another thread).
pub trait OutputSink: Send + Sync {
    /// How it is written in the link syntax (for listings).
    fn describe(&self) -> String;
    /// Delivers `value` (the filtered value of `ev`).
    fn fire(&self, value: f64, ev: &Event) -> Result<(), String>;
}

impl fmt::Debug for dyn OutputSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.describe())
    }
}

/// Writes an actuator, then tells `after` (the device manager's record of
/// the new value: history and watchers), if any.
pub struct ActuatorOut {
    /// The device name.
    pub name: String,
    /// Its driver.
    pub driver: Arc<dyn Driver>,
    /// Called after a successful write.
    pub after: Option<Arc<dyn Fn(f64) + Send + Sync>>,
}

impl OutputSink for ActuatorOut {
    fn describe(&self) -> String {
        format!("actuator({})", self.name)
    }

    #[inline]
    fn fire(&self, value: f64, _ev: &Event) -> Result<(), String> {
        self.driver.submit(value).map_err(|e| e.to_string())?;
        if let Some(a) = &self.after {
            a(value);
        }
        Ok(())
    }
}

/// Where Observe notifications go: (device name, value). The gateway sets
/// it to its notifier, which only marks the resource changed and wakes its
/// own sending thread.
pub type NotifyHook = Arc<dyn Fn(&str, f64) + Send + Sync>;

/// Hands the value to the notification hook (nothing happens while no hook
/// is set: there is no CoAP server to notify).
pub struct NotifyOut {
    /// The device name whose observers hear of it.
    pub name: String,
    /// The hook slot shared with the [`super::DirectPath`].
    pub hook: Arc<RwLock<Option<NotifyHook>>>,
}

impl OutputSink for NotifyOut {
    fn describe(&self) -> String {
        format!("notify({})", self.name)
    }

    fn fire(&self, value: f64, _ev: &Event) -> Result<(), String> {
        if let Some(h) = self.hook.read().as_ref() {
            h(&self.name, value);
        }
        Ok(())
    }
}

/// Logs the value (through `tracing`, target `mintgate::directpath`).
pub struct LogOut {
    /// The link's input, for the log line.
    pub input: String,
}

impl OutputSink for LogOut {
    fn describe(&self) -> String {
        "log".into()
    }

    fn fire(&self, value: f64, ev: &Event) -> Result<(), String> {
        tracing::info!(target: "mintgate::directpath", input = %self.input, value, sensed_ns = ev.src_ns, "link fired");
        Ok(())
    }
}

/// Builds an output of a registered kind from its argument (`mqtt(topic)`
/// gives the factory registered for `mqtt` the argument `topic`).
pub type OutputFactory = Arc<dyn Fn(&str) -> Result<Arc<dyn OutputSink>, String> + Send + Sync>;
