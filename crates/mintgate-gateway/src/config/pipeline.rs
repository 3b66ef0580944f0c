//! `[pipeline]`, `[buffers]`, `[vta]` and `[resources]`: the receive
//! pipeline, its handler pool and how it is sized, and the buffers it
//! uses.

use super::*;

/// `[pipeline]`
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct PipelineConfig {
    /// HTP queue bound in bytes (datagram blocks held); 0 = 1 % of RAM,
    /// clamped to 256 KiB..8 MiB.
    pub queue_bytes: usize,
    /// Share of the HTP queue one source may hold (an IPv4 address or an
    /// IPv6 /64), 0 < share <= 1; beyond it its requests are shed like on a
    /// full queue and counted as `peer_limit`. 1 = no per-source limit.
    pub peer_queue_share: f64,
    /// How the Handler Thread Pool is sized: `"vta"` (the controller resizes
    /// it every second from the Observer's samples), `"fixed:N"` or
    /// `"fixed"` (= `threads`).
    pub pool: PoolMode,
    /// HTP threads at start (and for `pool = "fixed"`); 0 = the number of cores.
    pub threads: usize,
    /// Datagrams per recvmmsg call.
    pub receive_batch: usize,
    /// Datagrams per sendmmsg call.
    pub send_batch: usize,
    /// Send the datagrams of one flush that go to the same peer with the
    /// same length as one `UDP_SEGMENT` message (generic segmentation
    /// offload, Linux 4.18+): the same datagrams on the wire, one walk
    /// through the kernel's stack. Turned off by itself where the kernel
    /// refuses it.
    pub send_gso: bool,
    /// Requests a handler thread takes from the queue at once.
    pub handler_batch: usize,
    /// Samples the Performance Observer keeps (one per second, at least 10).
    pub observer_samples: usize,
    /// Microseconds an idle handler thread polls the queue before sleeping.
    pub spin_us: u64,
    /// An idle handler thread first reads what waits in the socket (the
    /// Network Receiver stage, run without blocking) before it sleeps.
    pub handler_receives: bool,
    /// Datagrams per second (over 100 ms) from which the Network Receiver
    /// and handler threads run as `SCHED_BATCH` (no wake-up preemption, so
    /// senders finish their batches and the receiver reads them whole);
    /// back to the normal policy below three quarters of it. 0 = never.
    pub batch_sched_above: u64,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig {
            queue_bytes: 0,
            peer_queue_share: 0.5,
            pool: PoolMode::Vta,
            threads: 0,
            receive_batch: 32,
            send_batch: 32,
            send_gso: true,
            handler_batch: 32,
            observer_samples: 120,
            spin_us: 0,
            handler_receives: true,
            batch_sched_above: 50_000,
        }
    }
}

/// `[buffers]`
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct BufferConfig {
    /// Partitions of the pool: `{ block_size = BYTES, blocks = COUNT }`.
    /// Received datagrams take blocks of at least `coap.max_datagram` bytes;
    /// responses take the smallest block that fits.
    pub partitions: Vec<Partition>,
}

/// One pool partition.
#[derive(Clone, Copy, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Partition {
    /// Bytes per block.
    pub block_size: usize,
    /// Number of blocks.
    pub blocks: u32,
}

impl Default for BufferConfig {
    fn default() -> Self {
        BufferConfig {
            partitions: vec![
                Partition {
                    block_size: 192,
                    blocks: 32768,
                },
                Partition {
                    block_size: 1280,
                    blocks: 8192,
                },
            ],
        }
    }
}

/// `[vta]`: tuning of the Variable Thread Adjustment controller (used when
/// `pipeline.pool = "vta"`).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct VtaSection {
    /// Samples averaged for HT_t and e_t (the paper's n).
    pub n: usize,
    /// W, the minimum retransmission wait in seconds (CoAP ACK_TIMEOUT).
    pub w_s: f64,
    /// Most handler threads the controller may use.
    pub max_threads: usize,
    /// Relative throughput gain that justifies one more thread.
    pub improve: f64,
    /// Saturated seconds at a new cap before it is judged; also the length
    /// of a trial below saturation.
    pub hold_s: u32,
    /// Saturated seconds at a settled cap before one more thread is tried;
    /// also the wait between trials below saturation.
    pub reprobe_after_s: u32,
    /// Relative change of the per-thread rate that restarts the climb.
    pub workload_change: f64,
    /// Queueing delay, second after second, that marks the pool as the
    /// bottleneck even when arrivals do not exceed it (closed-loop clients).
    pub queue_delay_ms: f64,
    /// Highest share of the handler threads' time the arrivals may take
    /// before the pool grows (it shrinks below half of it); 1.0 sizes the
    /// pool exactly as the paper's equation 6.
    pub util_high: f64,
    /// Busy share from which a pool below the core count tries one thread
    /// more and keeps it only if throughput rises; 1.0 or more: never.
    pub trial_util: f64,
}

impl Default for VtaSection {
    fn default() -> Self {
        let d = mintgate_sched::VtaConfig::default();
        VtaSection {
            n: d.n,
            w_s: d.w,
            max_threads: d.max_threads,
            improve: d.improve,
            hold_s: d.hold,
            reprobe_after_s: d.reprobe_after,
            workload_change: d.workload_change,
            queue_delay_ms: d.queue_delay * 1e3,
            util_high: d.util_high,
            trial_util: d.trial_util,
        }
    }
}

/// `[resources]`
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ResourcesConfig {
    /// What answering `GET /request` costs, for experiments: `"none"`,
    /// `"block:200us"` (waits, like a sensor read) or `"spin:20us"` (burns CPU).
    pub request_cost: HandlerCost,
}

/// A simulated cost of a handler.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HandlerCost {
    /// Answer at once.
    #[default]
    None,
    /// Sleep this long (a blocking sensor read).
    Block(std::time::Duration),
    /// Burn CPU this long.
    Spin(std::time::Duration),
}

impl std::str::FromStr for HandlerCost {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "none" {
            return Ok(HandlerCost::None);
        }
        let (kind, d) = s
            .split_once(':')
            .ok_or_else(|| format!("`{s}`: expected none, block:DURATION or spin:DURATION"))?;
        let d = parse_duration(d)?;
        match kind {
            "block" => Ok(HandlerCost::Block(d)),
            "spin" => Ok(HandlerCost::Spin(d)),
            _ => Err(format!("`{kind}`: expected block or spin")),
        }
    }
}

impl std::fmt::Display for HandlerCost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HandlerCost::None => write!(f, "none"),
            HandlerCost::Block(d) => write!(f, "block:{}us", d.as_micros()),
            HandlerCost::Spin(d) => write!(f, "spin:{}us", d.as_micros()),
        }
    }
}

impl Serialize for HandlerCost {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for HandlerCost {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// How the handler pool is sized.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PoolMode {
    /// By the VTA controller, every second.
    #[default]
    Vta,
    /// A fixed number of threads (0 = the number of cores).
    Fixed(usize),
}

impl std::str::FromStr for PoolMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "vta" => Ok(PoolMode::Vta),
            "fixed" => Ok(PoolMode::Fixed(0)),
            _ => match s.strip_prefix("fixed:") {
                Some(n) => n
                    .parse()
                    .map(PoolMode::Fixed)
                    .map_err(|_| format!("`{n}`: not a thread count")),
                None => Err(format!("`{s}`: expected vta, fixed or fixed:N")),
            },
        }
    }
}

impl std::fmt::Display for PoolMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PoolMode::Vta => write!(f, "vta"),
            PoolMode::Fixed(n) => write!(f, "fixed:{n}"),
        }
    }
}

impl Serialize for PoolMode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for PoolMode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl PipelineConfig {
    /// Checks the keys of `[pipeline]`.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let v = |key, why: String| Err(ConfigError::Value { key, why });
        for (key, val) in [
            ("pipeline.receive_batch", self.receive_batch),
            ("pipeline.send_batch", self.send_batch),
            ("pipeline.handler_batch", self.handler_batch),
        ] {
            if !(1..=1 << 20).contains(&val) {
                return v(key, format!("{val} is outside 1..=1048576"));
            }
        }
        let share = self.peer_queue_share;
        if !(share > 0.0 && share <= 1.0) {
            return v(
                "pipeline.peer_queue_share",
                format!("{share} is outside (0, 1]"),
            );
        }
        let most = crate::pipeline::MAX_HTP_THREADS;
        if self.threads > most {
            return v(
                "pipeline.threads",
                format!("{} is over {most}", self.threads),
            );
        }
        if self.observer_samples < 10 {
            return v(
                "pipeline.observer_samples",
                format!("{} is under 10", self.observer_samples),
            );
        }
        Ok(())
    }
}

impl VtaSection {
    /// Checks the keys of `[vta]`.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let v = |key, why: String| Err(ConfigError::Value { key, why });
        if self.n == 0 || self.max_threads == 0 || self.w_s.is_nan() || self.w_s <= 0.0 {
            return v("vta", "n, max_threads and w_s must be positive".into());
        }
        let most = crate::pipeline::MAX_HTP_THREADS;
        if self.max_threads > most {
            return v(
                "vta.max_threads",
                format!("{} is over {most}", self.max_threads),
            );
        }
        let t = self.trial_util;
        if t.is_nan() || t < 0.0 {
            return v("vta.trial_util", format!("{t} is not a share >= 0"));
        }
        Ok(())
    }
}
