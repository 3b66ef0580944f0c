//! `mintgate publish`, `mintgate subscribe` and `mintgate broker`: ordered
//! MQTT publishing through the persistent publish queue, the de-duplicating
//! and reordering receiver, and the embedded broker (rumqttd).
//!
//! Broker URLs are `mqtt://HOST[:PORT]` (MQTT 3.1.1) or `mqtt5://HOST[:PORT]`
//! (MQTT 5); the default, `mqtt://127.0.0.1:1883`, is where `mintgate broker`
//! listens, so nothing external is needed.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use mintgate_mqtt::broker::EmbeddedBroker;
use mintgate_mqtt::publisher::Status;
use mintgate_mqtt::reorder::ReorderConfig;
use mintgate_mqtt::{
    BrokerUrl, Publisher, PublisherConfig, Qos, Secret, Security, SubEvent, Subscriber,
    SubscriberConfig,
};

const DEFAULT_BROKER: &str = "mqtt://127.0.0.1:1883";

fn parse_duration(s: &str) -> Result<Duration, String> {
    mintgate_gateway::config::parse_duration(s)
}

/// MQTT 5's session expiry interval is a u32 of seconds.
fn parse_session_expiry(s: &str) -> Result<Duration, String> {
    mintgate_gateway::config::parse_duration_upto(s, u64::from(u32::MAX))
}

fn parse_qos(s: &str) -> Result<Qos, String> {
    match s {
        "1" => Ok(Qos::AtLeastOnce),
        "2" => Ok(Qos::ExactlyOnce),
        _ => Err(format!("`{s}`: QoS must be 1 or 2")),
    }
}

fn parse_sub_qos(s: &str) -> Result<Qos, String> {
    s.parse::<u8>()
        .ok()
        .and_then(Qos::from_level)
        .ok_or_else(|| format!("`{s}`: QoS must be 0, 1 or 2"))
}

/// How `publish` and `subscribe` authenticate to the broker.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct BrokerAuthArgs {
    /// PEM file of the CA that signed the broker's certificate (mqtts://;
    /// default: the system's roots).
    #[arg(long, value_name = "FILE")]
    ca_file: Option<PathBuf>,
    /// PEM file of our client certificate (mutual TLS; needs --key-file).
    #[arg(long, value_name = "FILE", requires = "key_file")]
    cert_file: Option<PathBuf>,
    /// PEM file of the client certificate's private key.
    #[arg(long, value_name = "FILE", requires = "cert_file")]
    key_file: Option<PathBuf>,
    /// User name of the CONNECT.
    #[arg(long)]
    username: Option<String>,
    /// File whose first line is the password (never given on the command
    /// line itself).
    #[arg(
        long,
        value_name = "FILE",
        requires = "username",
        conflicts_with = "password_env"
    )]
    password_file: Option<PathBuf>,
    /// Environment variable holding the password.
    #[arg(long, value_name = "VAR", requires = "username")]
    password_env: Option<String>,
}

impl BrokerAuthArgs {
    /// `url` with these credentials, checked (files read, TLS set up).
    pub fn apply(&self, url: BrokerUrl) -> anyhow::Result<BrokerUrl> {
        let password = match (&self.password_file, &self.password_env) {
            (Some(f), _) => Some(Secret::from_file(f).map_err(anyhow::Error::msg)?),
            (None, Some(v)) => Some(Secret::from_env(v).map_err(anyhow::Error::msg)?),
            (None, None) => None,
        };
        let url = url.with_security(Security {
            ca_file: self.ca_file.clone(),
            cert_file: self.cert_file.clone(),
            key_file: self.key_file.clone(),
            username: self.username.clone(),
            password,
        });
        url.check()
            .map_err(|e| anyhow::anyhow!("broker {url}: {e}"))?;
        Ok(url)
    }
}

/// The JetStream side of `publish` and `subscribe` (`--nats`).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct NatsArgs {
    /// Publish into (or consume from) a NATS JetStream stream instead of
    /// MQTT: server URLs, comma-separated, nats://HOST:PORT or
    /// tls://HOST:PORT (any nodes of the cluster). --username,
    /// --password-file/--password-env, --ca-file and --cert-file/--key-file
    /// apply to it.
    #[arg(long, value_name = "URL[,URL...]")]
    nats: Option<String>,
    /// The JetStream stream (created when missing, subjects PREFIX>).
    #[arg(long, default_value = "mintgate", requires = "nats")]
    stream: String,
    /// Subject of a message, PREFIX{topic} (the topic's levels become
    /// tokens); default: STREAM.{topic}.
    #[arg(long, value_name = "TEMPLATE", requires = "nats")]
    subject: Option<String>,
    /// Replicas of the stream if it is created (3 on a 3-node cluster).
    #[arg(long, default_value_t = 1, requires = "nats")]
    replicas: usize,
    // Like --password-file and --password-env above, for the NATS token:
    // other flags, with their own names and conflicts.
    /// File whose first line is the NATS token (instead of a user).
    #[arg(
        long,
        value_name = "FILE",
        requires = "nats",
        conflicts_with = "token_env"
    )]
    token_file: Option<PathBuf>,
    /// Environment variable holding the NATS token.
    #[arg(long, value_name = "VAR", requires = "nats")]
    token_env: Option<String>,
    /// File whose first line is a NATS user nkey seed (SU...).
    #[arg(long, value_name = "FILE", requires = "nats")]
    nkey_seed_file: Option<PathBuf>,
    /// A NATS .creds file (user JWT and nkey seed, as nsc writes it).
    #[arg(long, value_name = "FILE", requires = "nats")]
    creds_file: Option<PathBuf>,
    /// The stream's JetStream domain (its API at $JS.DOMAIN.API; e.g. the
    /// hub's, through a leaf node).
    #[arg(long, value_name = "DOMAIN", requires = "nats")]
    domain: Option<String>,
}

impl NatsArgs {
    /// The checked target of `--nats`, with the credentials of `auth`.
    pub fn target(&self, auth: &BrokerAuthArgs) -> anyhow::Result<Option<mintgate_nats::Target>> {
        let Some(servers) = &self.nats else {
            return Ok(None);
        };
        let path = |p: &Option<PathBuf>| p.clone().unwrap_or_default();
        let s = mintgate_nats::NatsSection {
            enabled: true,
            servers: servers.split(',').map(|s| s.trim().to_owned()).collect(),
            user: auth.username.clone().unwrap_or_default(),
            password_file: path(&auth.password_file),
            password_env: auth.password_env.clone().unwrap_or_default(),
            token_file: path(&self.token_file),
            token_env: self.token_env.clone().unwrap_or_default(),
            nkey_seed_file: path(&self.nkey_seed_file),
            credentials_file: path(&self.creds_file),
            ca_file: path(&auth.ca_file),
            cert_file: path(&auth.cert_file),
            key_file: path(&auth.key_file),
            domain: self.domain.clone().unwrap_or_default(),
            stream: self.stream.clone(),
            subject: self
                .subject
                .clone()
                .unwrap_or_else(|| format!("{}.{{topic}}", self.stream)),
            replicas: self.replicas,
            ..mintgate_nats::NatsSection::default()
        };
        Ok(Some(s.target().map_err(anyhow::Error::msg)?))
    }
}

/// Arguments of `mintgate publish`.
#[derive(clap::Args)]
#[command(after_help = "Publishes messages 1..=N, each a JSON envelope \
{\"pub\":ID,\"seq\":n,\"ts\":ms,\"msg\":\"000n\"}, through the publish queue: QoS 1 and the next \
message only after the previous PUBACK (window 1), in order, at least once.\n\
With --state DIR the queue is persistent: killed (even kill -9) and run again with the same \
DIR and arguments, it resumes where it stopped and completes 1..=N, in order.\n\
Example: mintgate broker &  mintgate subscribe --topic t --count 100 &  \
mintgate publish --topic t --count 100 --state /tmp/q")]
pub struct PublishArgs {
    /// Broker URL: mqtt://HOST[:PORT] (MQTT 3.1.1), mqtt5://HOST[:PORT] (MQTT 5),
    /// mqtts://HOST[:PORT] or mqtts5://HOST[:PORT] (the same over TLS, port 8883),
    /// ws://HOST[:PORT][/PATH] or wss://... (WebSockets, plain or TLS; ws5://,
    /// wss5:// for MQTT 5).
    #[arg(long, default_value = DEFAULT_BROKER)]
    broker: BrokerUrl,
    #[command(flatten)]
    auth: BrokerAuthArgs,
    #[command(flatten)]
    nats: NatsArgs,
    /// Topic to publish to.
    #[arg(long)]
    topic: String,
    /// Messages to publish (sequence numbers 1..=N).
    #[arg(long)]
    count: u64,
    /// Messages per second to enqueue (default: as fast as the queue drains).
    #[arg(long)]
    rate: Option<f64>,
    /// QoS of every publish: 1 (the paper's Pub Queue) or 2.
    #[arg(long, default_value = "1", value_parser = parse_qos)]
    qos: Qos,
    /// Messages in flight at once; above 1 the receiver must reorder
    /// (`mintgate subscribe` does).
    #[arg(long, default_value_t = 1)]
    window: usize,
    /// Folder of the persistent queue (created); without it the queue is in
    /// memory and a restart starts again from 1.
    #[arg(long)]
    state: Option<PathBuf>,
    /// Publisher id for a new state folder (default: random; a state
    /// folder keeps its own).
    #[arg(long)]
    publisher_id: Option<String>,
    /// Give up (exit 1) if not every message is acknowledged by then.
    #[arg(long, value_parser = parse_duration)]
    timeout: Option<Duration>,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

/// Arguments of `mintgate subscribe`.
#[derive(clap::Args)]
#[command(
    after_help = "Prints each message once, in order per publisher and topic (by its \
sequence number, which publishers count per topic): `PUBLISHER SEQ MSG`, or one JSON object per \
line with --json (which also names the topic). Duplicates are dropped; a message arriving ahead \
of a missing one is held until the gap fills, for at most --gap-timeout. A stream is picked up \
wherever it is when the subscriber joins (see --first-seq)."
)]
pub struct SubscribeArgs {
    /// Broker URL: mqtt://HOST[:PORT] (MQTT 3.1.1), mqtt5://HOST[:PORT] (MQTT 5),
    /// mqtts://HOST[:PORT] or mqtts5://HOST[:PORT] (the same over TLS, port 8883),
    /// ws://HOST[:PORT][/PATH] or wss://... (WebSockets, plain or TLS; ws5://,
    /// wss5:// for MQTT 5).
    #[arg(long, default_value = DEFAULT_BROKER)]
    broker: BrokerUrl,
    #[command(flatten)]
    auth: BrokerAuthArgs,
    #[command(flatten)]
    nats: NatsArgs,
    /// Topic filter to subscribe to (with --nats: a subject filter of the
    /// stream, NATS wildcards; default: the whole stream).
    #[arg(long, required_unless_present = "nats")]
    topic: Option<String>,
    /// With --nats: the durable consumer's name; a later run with the same
    /// name resumes after the last message delivered (default: a consumer
    /// of this run only, from the stream's first message).
    #[arg(long, value_name = "NAME", requires = "nats")]
    durable: Option<String>,
    /// Exit after this many in-order messages.
    #[arg(long)]
    count: Option<u64>,
    /// Print JSON lines: {"pub","topic","seq","ts","msg","skipped_before"}.
    #[arg(long)]
    json: bool,
    /// Subscription QoS: 0, 1 or 2.
    #[arg(long, default_value = "1", value_parser = parse_sub_qos)]
    qos: Qos,
    /// Client id (default: random).
    #[arg(long)]
    client_id: Option<String>,
    /// Keep the session on the broker while disconnected (clean session
    /// off): the broker queues for us across our reconnections and runs.
    /// Needs --client-id: the session is found again by it.
    #[arg(long, requires = "client_id")]
    persistent: bool,
    /// With --persistent over MQTT 5 (mqtt5://, mqtts5://, ws5://, wss5://):
    /// how long the broker keeps the session, and queues for it, after we
    /// disconnect (e.g. 1h, 7d). Over MQTT 3.1.1 the broker's own setting
    /// decides, so it is refused there. Default: 1d.
    #[arg(long, value_parser = parse_session_expiry, requires = "persistent")]
    session_expiry: Option<Duration>,
    /// Longest wait for a missing sequence before skipping it.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    gap_timeout: Duration,
    /// Expect every stream (publisher and topic) to start at this sequence,
    /// e.g. 1 when subscribed before the publisher starts, to hear of
    /// anything lost before the first arrival (skipped after
    /// --gap-timeout). Default: start at the first sequence seen (held 100 ms
    /// for lower ones arriving just after it), for joining a running stream.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    first_seq: Option<u64>,
    /// Exit after this long: code 1 if --count is not reached or the
    /// broker was never reached.
    #[arg(long, value_parser = parse_duration)]
    timeout: Option<Duration>,
}

/// Arguments of `mintgate broker`.
#[derive(clap::Args)]
pub struct BrokerArgs {
    /// Address of the MQTT 3.1.1 listener (mqtt://).
    #[arg(long, default_value = "127.0.0.1:1883")]
    listen: std::net::SocketAddr,
    /// Address of the MQTT 5 listener (mqtt5://).
    #[arg(long, default_value = "127.0.0.1:1884")]
    listen_v5: std::net::SocketAddr,
}

/// Runs `mintgate broker` until the process is stopped.
pub fn run_broker(a: BrokerArgs) -> anyhow::Result<ExitCode> {
    let b = EmbeddedBroker::start(a.listen, a.listen_v5).context("starting the embedded broker")?;
    println!(
        "embedded broker (rumqttd): {} (MQTT 3.1.1), {} (MQTT 5); Ctrl-C to stop",
        b.url(),
        b.url_v5()
    );
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

fn body(seq: u64, count: u64) -> String {
    let w = count.to_string().len().max(4);
    format!("{seq:0w$}")
}

/// Runs `mintgate publish`.
pub fn run_publish(a: PublishArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(a.count >= 1, "--count must be at least 1");
    if let Some(r) = a.rate {
        anyhow::ensure!(r > 0.0 && r.is_finite(), "--rate must be positive");
    }
    let mut a = a;
    let nats = a.nats.target(&a.auth)?;
    if nats.is_none() {
        a.broker = a.auth.apply(a.broker.clone())?;
    }
    let mut cfg = PublisherConfig::new(a.broker.clone());
    let target = match nats {
        Some(t) => {
            let d = t.describe();
            cfg.uplink = Some(std::sync::Arc::new(mintgate_nats::JetStream::new(t)));
            d
        }
        None => a.broker.to_string(),
    };
    cfg.qos = a.qos;
    cfg.window = a.window;
    cfg.state = a.state.clone();
    cfg.publisher_id = a.publisher_id.clone();
    let p = Publisher::start(cfg).context("starting the publish queue")?;
    let st0 = p.status();
    let first_new = p.next_seq(&a.topic)?;
    if st0.resumed > 0 || first_new > 1 {
        eprintln!(
            "publish: resuming {}: {} unacknowledged message(s) to resend, next new seq {}",
            a.state
                .as_deref()
                .map_or("-".into(), |d| d.display().to_string()),
            st0.resumed,
            first_new
        );
    }
    if first_new > a.count + 1 {
        eprintln!(
            "publish: the state already holds seq up to {} (> --count {}); only draining it",
            first_new - 1,
            a.count
        );
    }
    eprintln!(
        "publish: {} messages to {:?} via {} (QoS {}, window {}), publisher {}",
        a.count,
        a.topic,
        target,
        a.qos.level(),
        a.window,
        p.publisher_id()
    );
    let t0 = Instant::now();
    let deadline = a.timeout.map(|d| t0 + d);
    let mut next = first_new;
    let mut last_line = Instant::now();
    // Keep at most this many enqueued ahead of the acknowledgements.
    let ahead: u64 = (a.window as u64 * 4).max(256);
    let chunk: u64 = 256;
    loop {
        let st = p.status();
        if st.stopped {
            anyhow::bail!(
                "the publish queue stopped: {}",
                st.last_error.unwrap_or_default()
            );
        }
        if next > a.count && st.unacked == 0 {
            break;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            summary(&a, &target, &p.status(), t0.elapsed(), first_new, false);
            return Ok(ExitCode::from(1));
        }
        if next <= a.count {
            let due = match a.rate {
                Some(r) => {
                    let since = (t0.elapsed().as_secs_f64() * r) as u64 + 1;
                    (first_new - 1 + since).min(a.count)
                }
                None => a.count,
            };
            let room = ahead.saturating_sub(st.unacked as u64).min(chunk);
            let upto = due.min((next + room).saturating_sub(1));
            if room > 0 && upto >= next {
                let bodies: Vec<String> = (next..=upto).map(|s| body(s, a.count)).collect();
                let seqs = p.enqueue_many(&a.topic, bodies)?;
                anyhow::ensure!(
                    *seqs.start() == next,
                    "the queue assigned seq {} where {} was expected (state folder used with other arguments?)",
                    seqs.start(),
                    next
                );
                next = seqs.end() + 1;
            }
        }
        if last_line.elapsed() >= Duration::from_secs(1) {
            last_line = Instant::now();
            let st = p.status();
            eprintln!(
                "publish: {:>6.1}s enqueued up to {} of {}, unacked {}, acked {} this run, {}{}",
                t0.elapsed().as_secs_f64(),
                next - 1,
                a.count,
                st.unacked,
                st.queue.acked,
                if st.connected {
                    "connected"
                } else {
                    "NOT connected"
                },
                st.last_error
                    .as_deref()
                    .filter(|_| !st.connected)
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default()
            );
        }
        // Wait for progress (an ack) or the next rate tick.
        let tick = match a.rate {
            Some(r) if next <= a.count => Duration::from_secs_f64((1.0 / r).clamp(0.001, 0.1)),
            _ => Duration::from_millis(100),
        };
        let unacked = st.unacked;
        p.wait_until(tick, |s| s.unacked < unacked || s.unacked == 0);
    }
    let st = p.close(Duration::from_secs(1));
    summary(&a, &target, &st, t0.elapsed(), first_new, true);
    Ok(ExitCode::SUCCESS)
}

fn summary(
    a: &PublishArgs,
    target: &str,
    st: &Status,
    took: Duration,
    first_new: u64,
    complete: bool,
) {
    let acked = st.queue.acked;
    let rate = acked as f64 / took.as_secs_f64().max(1e-9);
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "complete": complete,
                "count": a.count,
                "topic": a.topic,
                "broker": target,
                "qos": a.qos.level(),
                "window": a.window,
                "acked_this_run": acked,
                "unacked": st.unacked,
                "resumed": st.resumed,
                "first_new_seq": first_new,
                "retransmitted": st.queue.retransmitted,
                "connects": st.connects,
                "seconds": took.as_secs_f64(),
                "msgs_per_s": rate,
            })
        );
    } else {
        println!(
            "publish {}: seq 1..={} to {:?}: {} acknowledged this run in {:.3} s ({:.0} msg/s), \
             {} unacknowledged, {} resumed from the state, {} retransmitted, {} connection(s)",
            if complete {
                "complete"
            } else {
                "INCOMPLETE (timeout)"
            },
            a.count,
            a.topic,
            acked,
            took.as_secs_f64(),
            rate,
            st.unacked,
            st.resumed,
            st.queue.retransmitted,
            st.connects
        );
        if let (false, Some(e)) = (complete, &st.last_error) {
            println!("last connection error: {e}");
        }
    }
}

/// Runs `mintgate subscribe`.
pub fn run_subscribe(a: SubscribeArgs) -> anyhow::Result<ExitCode> {
    let mut a = a;
    let nats = a.nats.target(&a.auth)?;
    if nats.is_none() {
        a.broker = a.auth.apply(a.broker.clone())?;
    }
    let topic = a.topic.clone().unwrap_or_default();
    let mut cfg = SubscriberConfig::new(a.broker.clone(), topic.clone());
    let target = match nats {
        Some(t) => {
            let d = t.describe();
            cfg.uplink = Some(std::sync::Arc::new(
                mintgate_nats::Consumer::new(t, a.durable.clone()).map_err(anyhow::Error::msg)?,
            ));
            // what this run does not print stays unacknowledged for the next
            cfg.limit = a.count;
            d
        }
        None => a.broker.to_string(),
    };
    cfg.qos = a.qos;
    cfg.client_id = a.client_id.clone();
    cfg.persistent_session = a.persistent;
    if let Some(e) = a.session_expiry {
        anyhow::ensure!(
            a.broker.version == mintgate_mqtt::conn::Version::V5 && cfg.uplink.is_none(),
            "--session-expiry is an MQTT 5 setting: use an mqtt5://, mqtts5://, ws5:// or wss5:// \
             broker URL (over MQTT 3.1.1 the broker's own configuration decides how long it keeps \
             a session)"
        );
        cfg.session_expiry = e;
    }
    cfg.reorder = ReorderConfig {
        first_seq: a.first_seq,
        gap_timeout: Some(a.gap_timeout),
        ..ReorderConfig::default()
    };
    if cfg.uplink.is_some() && a.durable.is_some() {
        // A durable consumer resumes at its first message not
        // acknowledged, but what the last run had received and not
        // delivered comes again only after the ack wait: a stream's first
        // arrival waits that long for lower numbers.
        cfg.reorder.join_wait = mintgate_nats::consumer::ACK_WAIT + Duration::from_secs(1);
    }
    let mut sub = Subscriber::start(cfg).context("starting the subscriber")?;
    let t0 = Instant::now();
    let deadline = a.timeout.map(|d| t0 + d);
    let mut got = 0u64;
    // Failed connection attempts: said once they have gone on for a second
    // (a broker started beside us is usually up by then), then once per
    // 10 s.
    let (mut failed, mut failing_since, mut failed_said) = (0u64, None::<Instant>, None::<Instant>);
    // The broker was reached: a SUBACK, or a message (a persistent session's
    // queued messages can come before the SUBACK and fill --count).
    let mut subscribed = false;
    let mut last_failure = None::<String>;
    let mut out = std::io::stdout().lock();
    let reached = |got: u64| a.count.is_some_and(|n| got >= n);
    while !reached(got) {
        let wait = match deadline {
            Some(d) => match d.checked_duration_since(Instant::now()) {
                Some(w) => w.min(Duration::from_secs(1)),
                None => break,
            },
            None => Duration::from_secs(1),
        };
        match sub.recv_timeout(wait) {
            Some(SubEvent::Subscribed) => {
                subscribed = true;
                (failed, failing_since, failed_said) = (0, None, None);
                eprintln!("subscribe: subscribed to {topic:?} at {target}")
            }
            Some(SubEvent::Disconnected(e)) => {
                eprintln!("subscribe: disconnected ({e}); reconnecting")
            }
            Some(SubEvent::ConnectFailed(e)) => {
                failed += 1;
                last_failure = Some(e.clone());
                let since = *failing_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= Duration::from_secs(1)
                    && failed_said.is_none_or(|t| t.elapsed() >= Duration::from_secs(10))
                {
                    failed_said = Some(Instant::now());
                    eprintln!(
                        "subscribe: NOT connected to {} ({e}); {failed} attempt(s) so far, \
                         retrying at most 2 s apart{}",
                        target,
                        if deadline.is_none() {
                            " (--timeout D gives up)"
                        } else {
                            ""
                        }
                    );
                }
            }
            Some(SubEvent::Undecodable(topic, len, why)) => {
                subscribed = true;
                eprintln!("subscribe: {len}-byte message on {topic:?} skipped: {why}")
            }
            Some(SubEvent::Delivery(d)) => {
                subscribed = true;
                got += 1;
                if d.skipped_before > 0 {
                    eprintln!(
                        "subscribe: {} message(s) of {} on {:?} before seq {} never arrived; skipped",
                        d.skipped_before, d.env.publisher, d.topic, d.env.seq
                    );
                }
                let line = if a.json {
                    serde_json::json!({
                        "pub": d.env.publisher,
                        "topic": d.topic,
                        "seq": d.env.seq,
                        "ts": d.env.ts,
                        "msg": d.env.msg_value(),
                        "skipped_before": d.skipped_before,
                    })
                    .to_string()
                } else {
                    format!("{} {} {}", d.env.publisher, d.env.seq, d.env.msg)
                };
                if writeln!(out, "{line}").and_then(|_| out.flush()).is_err() {
                    break; // stdout closed
                }
            }
            Some(SubEvent::Arrival(..)) | None => {}
        }
    }
    let s = sub.stats();
    eprintln!(
        "subscribe: {} delivered in order; received {}, duplicates dropped {}, arrived early {}, \
         skipped {}",
        got, s.received, s.duplicates, s.reordered, s.skipped
    );
    if !subscribed {
        match &last_failure {
            Some(e) => eprintln!(
                "subscribe: never subscribed at {}: NOT connected ({e}; {failed} attempt(s))",
                target
            ),
            None => eprintln!("subscribe: never subscribed at {}", target),
        }
    }
    // a broker never reached is a failure even without --count: a script
    // must tell it from a quiet topic
    Ok(if !subscribed || (a.count.is_some() && !reached(got)) {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
