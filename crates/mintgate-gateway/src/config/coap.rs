//! `[coap]`: the CoAP endpoint (UDP, TCP, WebSockets) and its limits.

use super::*;

/// `[coap]`
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CoapConfig {
    /// UDP addresses to serve CoAP on. `[::]` also accepts IPv4.
    pub bind: Vec<SocketAddr>,
    /// Largest datagram accepted; larger ones are dropped and counted.
    pub max_datagram: usize,
    /// A CON request whose handler runs longer than this many milliseconds
    /// gets an empty ACK and, later, a separate CON response.
    pub separate_response_after_ms: u64,
    /// (peer, message ID) pairs remembered for de-duplication, at most.
    pub dedup_capacity: usize,
    /// EXCHANGE_LIFETIME in seconds (how long a CON is remembered).
    pub exchange_lifetime_s: u64,
    /// NON_LIFETIME in seconds (how long a NON is remembered).
    pub non_lifetime_s: u64,
    /// Max-Age, in seconds, of the 5.03 sent when the HTP queue is full.
    pub overload_max_age_s: u32,
    /// Largest response payload a handler may produce.
    pub max_payload: usize,
    /// Socket receive buffer in bytes (capped by net.core.rmem_max).
    pub socket_recv_buffer: usize,
    /// Socket send buffer in bytes (capped by net.core.wmem_max).
    pub socket_send_buffer: usize,
    /// Most Observe registrations in all (RFC 7641); beyond, a GET with
    /// Observe is answered as a plain GET.
    pub observe_max: usize,
    /// A confirmable notification after this many non-confirmable ones
    /// (1: every notification is CON). An unacknowledged CON notification
    /// ends the observation.
    pub observe_con_every: u32,
    /// A confirmable notification at least every this many seconds per
    /// observer.
    pub observe_con_interval_s: u64,
    /// Most Observe registrations per source (an IPv4 address or an IPv6
    /// /64); beyond, a GET with Observe is answered as a plain GET.
    pub observe_max_per_source: usize,
    /// To a source not yet verified (RFC 9175 2.4), nothing larger than
    /// this many times its request; 0 turns the check off.
    pub amplification_factor: u32,
    /// How long, in seconds, an address verified by an Echo round trip is
    /// trusted.
    pub verified_lifetime_s: u64,
    /// Addresses remembered as verified, at most.
    pub verified_max: usize,
    /// ACK_TIMEOUT of the CONs the gateway sends (separate responses,
    /// notifications), in milliseconds (RFC 7252 4.8: 2000).
    pub ack_timeout_ms: u64,
    /// MAX_RETRANSMIT of those CONs (RFC 7252 4.8: 4).
    pub max_retransmit: u32,
    /// Largest request body a PUT or POST may send in blocks (Block1,
    /// RFC 7959); beyond it, 4.13 with Size1.
    pub block1_max_body: usize,
    /// Bytes all Block1 transfers in progress (and completed bodies kept for
    /// Block2 continuations) may hold together; beyond it, 5.03.
    pub block1_max_bytes: usize,
    /// Block1 transfers in progress at once, all clients together.
    pub block1_max_transfers: usize,
    /// Block1 transfers in progress at once per source (an IPv4 address or
    /// an IPv6 /64, whatever the ports); a further one drops that source's
    /// oldest.
    pub block1_per_peer: usize,
    /// Bytes one source's Block1 transfers may hold together; beyond it the
    /// source's own other transfers are dropped.
    pub block1_per_source_bytes: usize,
    /// A Block1 transfer with no block for this many seconds is dropped
    /// (its next block gets 4.08).
    pub block1_timeout_s: u64,
    /// TCP addresses to serve CoAP over TCP on (RFC 8323, `coap+tcp`);
    /// empty (the default) serves none. The usual port is 5683/tcp.
    pub tcp_bind: Vec<SocketAddr>,
    /// TCP addresses to serve CoAP over WebSockets on (RFC 8323 section 4,
    /// `coap+ws`, path `/.well-known/coap`, subprotocol `coap`); empty (the
    /// default) serves none. The `tcp_*` limits below apply to it too.
    pub ws_bind: Vec<SocketAddr>,
    /// CoAP-over-TCP connections open at once, all clients together;
    /// beyond, a new connection is closed at once.
    pub tcp_max_connections: usize,
    /// CoAP-over-TCP connections open at once per source (an IPv4 address
    /// or an IPv6 /64).
    pub tcp_max_per_source: usize,
    /// The Max-Message-Size our CSM announces: a larger frame aborts the
    /// connection before it is read.
    pub tcp_max_message_size: u32,
    /// A frame begun and not finished within this many milliseconds aborts
    /// the connection; a peer that takes no output for as long is
    /// disconnected.
    pub tcp_frame_timeout_ms: u64,
    /// A connection with nothing received for this many seconds gets a
    /// Release and is closed.
    pub tcp_idle_timeout_s: u64,
}

impl Default for CoapConfig {
    fn default() -> Self {
        CoapConfig {
            bind: vec![std::net::SocketAddr::from((
                std::net::Ipv6Addr::UNSPECIFIED,
                5683,
            ))],
            max_datagram: 1280,
            separate_response_after_ms: 1000,
            dedup_capacity: 16384,
            exchange_lifetime_s: 247,
            non_lifetime_s: 145,
            overload_max_age_s: 2,
            max_payload: 1024,
            socket_recv_buffer: 4 << 20,
            socket_send_buffer: 4 << 20,
            observe_max: 1024,
            observe_con_every: 5,
            observe_con_interval_s: 60,
            observe_max_per_source: 64,
            amplification_factor: 3,
            verified_lifetime_s: 600,
            verified_max: 4096,
            ack_timeout_ms: 2000,
            max_retransmit: 4,
            block1_max_body: 64_000,
            block1_max_bytes: 1 << 20,
            block1_max_transfers: 256,
            block1_per_peer: 4,
            block1_per_source_bytes: 256 << 10,
            block1_timeout_s: 60,
            tcp_bind: Vec::new(),
            ws_bind: Vec::new(),
            tcp_max_connections: 256,
            tcp_max_per_source: 16,
            tcp_max_message_size: 8192,
            tcp_frame_timeout_ms: 5000,
            tcp_idle_timeout_s: 300,
        }
    }
}

impl CoapConfig {
    /// Checks the keys of `[coap]` that depend on no other section.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let v = |key, why: String| Err(ConfigError::Value { key, why });
        if self.bind.is_empty() {
            return v("coap.bind", "at least one address is needed".into());
        }
        if !(64..=65507).contains(&self.max_datagram) {
            return v(
                "coap.max_datagram",
                format!("{} is outside 64..=65507", self.max_datagram),
            );
        }
        let tcp = self;
        if tcp.tcp_max_connections == 0 || tcp.tcp_max_per_source == 0 {
            return v(
                "coap.tcp_max_connections",
                "tcp_max_connections and tcp_max_per_source must be at least 1".into(),
            );
        }
        if !(1152..=65000).contains(&tcp.tcp_max_message_size) {
            return v(
                "coap.tcp_max_message_size",
                format!(
                    "{} is outside 1152..=65000 (RFC 8323: at least the default 1152)",
                    tcp.tcp_max_message_size
                ),
            );
        }
        if !(100..=600_000).contains(&tcp.tcp_frame_timeout_ms) {
            return v(
                "coap.tcp_frame_timeout_ms",
                format!("{} is outside 100..=600000", tcp.tcp_frame_timeout_ms),
            );
        }
        if tcp.tcp_idle_timeout_s == 0 {
            return v("coap.tcp_idle_timeout_s", "must be at least 1".into());
        }
        if !(1..=1 << 20).contains(&self.dedup_capacity) {
            return v(
                "coap.dedup_capacity",
                format!("{} is outside 1..=1048576", self.dedup_capacity),
            );
        }
        // a reassembled request is one message: body plus the final block's head
        if self.block1_max_body + self.max_datagram > u16::MAX as usize {
            return v(
                "coap.block1_max_body",
                format!(
                    "{} plus coap.max_datagram ({}) exceeds 65535",
                    self.block1_max_body, self.max_datagram
                ),
            );
        }
        if self.block1_per_source_bytes < self.block1_max_body {
            return v(
                "coap.block1_per_source_bytes",
                format!(
                    "{} is below coap.block1_max_body ({}): a source could not send the largest body",
                    self.block1_per_source_bytes, self.block1_max_body
                ),
            );
        }
        if self.block1_timeout_s == 0 || self.block1_per_peer == 0 {
            return v(
                "coap.block1_timeout_s",
                "block1_timeout_s and block1_per_peer must be positive".into(),
            );
        }
        if self.observe_max_per_source == 0 {
            return v(
                "coap.observe_max_per_source",
                "must be positive (it bounds one source's share of observe_max)".into(),
            );
        }
        if self.amplification_factor > 100 {
            return v(
                "coap.amplification_factor",
                format!(
                    "{} is above 100; 3 is the usual bound, 0 turns the check off",
                    self.amplification_factor
                ),
            );
        }
        if !(100..=60_000).contains(&self.ack_timeout_ms) || self.max_retransmit > 20 {
            return v(
                "coap.ack_timeout_ms",
                format!(
                    "ack_timeout_ms {} must be 100..=60000 and max_retransmit {} at most 20",
                    self.ack_timeout_ms, self.max_retransmit
                ),
            );
        }
        if self.verified_lifetime_s == 0 || self.verified_max == 0 {
            return v(
                "coap.verified_lifetime_s",
                "verified_lifetime_s and verified_max must be positive".into(),
            );
        }
        Ok(())
    }
}
