//! `[metrics]` and `[dashboard]`: where the gateway shows what it does.

use super::*;

/// `[metrics]`
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// TCP address of the metrics endpoint (Prometheus text at `/metrics`,
    /// Observer samples as JSON at `/api/observer`); off when absent. Keep it
    /// on loopback unless something else guards it.
    pub bind: Option<SocketAddr>,
}

/// `[dashboard]`: the live dashboard (`/`) and its JSON state
/// (`/api/state`), served on the HTTP proxy's listener (`proxy.http`) and
/// on the metrics endpoint (`metrics.bind`).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct DashboardConfig {
    /// Serve the dashboard at all.
    pub enabled: bool,
    /// Answer clients that are not on loopback too (otherwise 403): the
    /// dashboard shows the gateway's internals, and the proxy's listener
    /// may face the network.
    pub allow_remote: bool,
}

impl Default for DashboardConfig {
    fn default() -> Self {
        DashboardConfig {
            enabled: true,
            allow_remote: false,
        }
    }
}
