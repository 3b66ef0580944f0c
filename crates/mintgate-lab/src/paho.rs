//! Paper 004's own client, Eclipse Paho (Java), as a peer of `lab mqtt`:
//! one JVM (`peers/paho`, `PahoFig5`) per broker, told over its standard
//! input to do one run at a time, so that its runs take turns with ours.
//!
//! Protocol (one line each way): `run METHOD RUN N` is answered by a JSON
//! object `{"method","run","messages","seconds","missing","out_of_order",
//! "duplicates","error"}`; `quit` ends the JVM. METHOD is `pubqueue_qos1`
//! (QoS 1, the next message after the previous one's deliveryComplete) or
//! `qos2` (QoS 2, one in flight).

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::Context as _;
use mintgate_mqtt::{BrokerUrl, Version};

/// How long one answer may take: a run is bounded on the Java side by 60 s
/// of publishing and 15 s without an arrival.
const ANSWER_LIMIT: Duration = Duration::from_secs(120);

/// One run as the Java side reports it.
#[derive(Debug, serde::Deserialize)]
pub struct PahoRun {
    /// Seconds from the first publish to the last completion or arrival.
    pub seconds: f64,
    /// Numbers that never reached the checking subscriber.
    pub missing: u64,
    /// Arrivals with a lower number than an earlier one.
    pub out_of_order: u64,
    /// Arrivals of a number already seen (or not a number).
    pub duplicates: u64,
    /// Why the run failed.
    pub error: Option<String>,
}

/// A running Paho JVM; `quit` and reaped (killed if it lingers) on drop.
pub struct PahoPeer {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

/// Paho's URI for a broker: `tcp://HOST:PORT`. Paho's v3 client speaks
/// MQTT 3.1.1 only, so an `mqtt5://` broker gets an error.
pub fn paho_uri(url: &BrokerUrl) -> anyhow::Result<String> {
    anyhow::ensure!(!url.tls, "Paho is not measured over TLS here ({url})");
    anyhow::ensure!(
        url.version == Version::V311,
        "Paho's client here speaks MQTT 3.1.1 (mqtt://), not {url}"
    );
    // the same authority as our own URL writes it, brackets and all
    Ok(url.to_string().replacen("mqtt://", "tcp://", 1))
}

impl PahoPeer {
    /// Starts `java -jar JAR URI PERSISTENCE` and waits for its `ready`.
    pub fn start(jar: &Path, url: &BrokerUrl, persistence: &str) -> anyhow::Result<PahoPeer> {
        let uri = paho_uri(url)?;
        let mut child = Command::new("java")
            .arg("-jar")
            .arg(jar)
            .arg(&uri)
            .arg(persistence)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting java (is a JDK installed?)")?;
        let stdin = child.stdin.take().context("java's stdin")?;
        let stdout = child.stdout.take().context("java's stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::Builder::new()
            .name("lab-paho-out".into())
            .spawn(move || {
                for l in BufReader::new(stdout).lines() {
                    let Ok(l) = l else { return };
                    if tx.send(l).is_err() {
                        return;
                    }
                }
            })
            .context("starting the reader of java's output")?;
        let p = PahoPeer {
            child,
            stdin,
            lines,
        };
        match p.lines.recv_timeout(Duration::from_secs(30)) {
            Ok(l) if l.trim() == "ready" => Ok(p),
            Ok(l) => anyhow::bail!("the Paho peer said {l:?} instead of ready"),
            Err(_) => anyhow::bail!("the Paho peer did not start within 30 s"),
        }
    }

    /// One run of `method` with `n` messages.
    pub fn run(&mut self, method: &str, run: usize, n: u64) -> anyhow::Result<PahoRun> {
        writeln!(self.stdin, "run {method} {run} {n}")
            .and_then(|()| self.stdin.flush())
            .context("writing to the Paho peer")?;
        let l = self
            .lines
            .recv_timeout(ANSWER_LIMIT)
            .map_err(|_| anyhow::anyhow!("no answer from the Paho peer within {ANSWER_LIMIT:?}"))?;
        serde_json::from_str(&l).with_context(|| format!("the Paho peer answered {l:?}"))
    }
}

impl Drop for PahoPeer {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "quit").and_then(|()| self.stdin.flush());
        for _ in 0..50 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_and_answers() {
        let v4: BrokerUrl = "mqtt://127.0.0.1:1883".parse().unwrap();
        assert_eq!(paho_uri(&v4).unwrap(), "tcp://127.0.0.1:1883");
        let v6: BrokerUrl = "mqtt://[::1]:1999".parse().unwrap();
        assert_eq!(paho_uri(&v6).unwrap(), "tcp://[::1]:1999");
        let v5: BrokerUrl = "mqtt5://127.0.0.1:1884".parse().unwrap();
        assert!(paho_uri(&v5).is_err());
        let r: PahoRun = serde_json::from_str(
            r#"{"method":"qos2","run":1,"messages":1000,"seconds":0.25,"missing":0,"out_of_order":0,"duplicates":0,"error":null}"#,
        )
        .unwrap();
        assert_eq!((r.seconds, r.missing, r.error), (0.25, 0, None));
        let r: PahoRun = serde_json::from_str(
            r#"{"method":"qos2","run":1,"messages":1000,"seconds":0.000000,"missing":1000,"out_of_order":0,"duplicates":0,"error":"refused"}"#,
        )
        .unwrap();
        assert_eq!(r.error.as_deref(), Some("refused"));
    }
}
