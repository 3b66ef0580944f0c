//! The `[nats]` config section and the [`Target`] it resolves to.

use std::path::PathBuf;
use std::time::Duration;

use mintgate_mqtt::Secret;
use serde::{Deserialize, Serialize};

use crate::subject;

/// `[nats]`: the JetStream output of the bridges (`serve --nats URL`) and
/// the defaults of `publish --nats` / `subscribe --nats`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct NatsSection {
    /// The bridges publish into JetStream instead of MQTT (the `[mqtt]`
    /// queue settings still apply: state, window, `[mqtt.queue]`).
    pub enabled: bool,
    /// Server URLs, `nats://HOST:PORT` or `tls://HOST:PORT`: any node of
    /// the cluster; the client moves to another when one fails.
    pub servers: Vec<String>,
    /// User name (with `password_file` or `password_env`; empty: none).
    pub user: String,
    /// File whose first line is the password.
    pub password_file: PathBuf,
    /// Environment variable holding the password (if no `password_file`).
    pub password_env: String,
    /// File whose first line is the token (instead of user and password).
    pub token_file: PathBuf,
    /// Environment variable holding the token (if no `token_file`).
    pub token_env: String,
    /// PEM file of the CA the servers' certificates must chain to (TLS
    /// required then; empty: TLS only for `tls://` URLs, system roots).
    pub ca_file: PathBuf,
    /// The JetStream stream the messages are stored in.
    pub stream: String,
    /// Subject of a message: `PREFIX{topic}` (the topic's `/` levels
    /// become `.` tokens).
    pub subject: String,
    /// Create the stream when it does not exist (subjects `PREFIX>`, file
    /// storage, `replicas`, `duplicate_window`).
    pub create_stream: bool,
    /// Replicas of a created stream (1..=5; 3 on a 3-node cluster).
    pub replicas: usize,
    /// The created stream's de-duplication window: how long a message id
    /// is remembered, so a resend within it is stored once.
    pub duplicate_window_s: u64,
    /// A publish not acknowledged within this is given up on with the
    /// whole window and sent again over a new connection.
    pub ack_timeout_ms: u64,
}

impl Default for NatsSection {
    fn default() -> Self {
        NatsSection {
            enabled: false,
            servers: vec!["nats://127.0.0.1:4222".into()],
            user: String::new(),
            password_file: PathBuf::new(),
            password_env: String::new(),
            token_file: PathBuf::new(),
            token_env: String::new(),
            ca_file: PathBuf::new(),
            stream: "mintgate".into(),
            subject: "mintgate.{topic}".into(),
            create_stream: true,
            replicas: 1,
            duplicate_window_s: 120,
            ack_timeout_ms: 2000,
        }
    }
}

/// How to authenticate.
#[derive(Clone, Debug, Default)]
pub enum Auth {
    /// Anonymous.
    #[default]
    None,
    /// User and password.
    UserPassword(String, Secret),
    /// A token.
    Token(Secret),
}

/// Where and how to publish or consume: the checked `[nats]` section.
#[derive(Clone, Debug)]
pub struct Target {
    /// Server URLs.
    pub servers: Vec<String>,
    /// Credentials.
    pub auth: Auth,
    /// CA file (TLS required).
    pub ca_file: Option<PathBuf>,
    /// The stream.
    pub stream: String,
    /// The subject template.
    pub subject: String,
    /// Create the stream when missing.
    pub create_stream: bool,
    /// Replicas of a created stream.
    pub replicas: usize,
    /// Duplicate window of a created stream.
    pub duplicate_window: Duration,
    /// Publish acknowledgement timeout.
    pub ack_timeout: Duration,
}

impl NatsSection {
    /// Checks the keys (files and variables read); `key` errors name the
    /// dotted key.
    pub fn target(&self) -> Result<Target, String> {
        if self.servers.is_empty() {
            return Err("nats.servers: at least one server URL".into());
        }
        for s in &self.servers {
            check_server(s).map_err(|e| format!("nats.servers: {e}"))?;
        }
        check_stream_name(&self.stream).map_err(|e| format!("nats.stream: {e}"))?;
        subject::check_template(&self.subject).map_err(|e| format!("nats.subject: {e}"))?;
        if !(1..=5).contains(&self.replicas) {
            return Err(format!("nats.replicas: 1..=5, got {}", self.replicas));
        }
        if !(1..=86_400).contains(&self.duplicate_window_s) {
            return Err(format!(
                "nats.duplicate_window_s: 1..=86400, got {}",
                self.duplicate_window_s
            ));
        }
        if !(100..=60_000).contains(&self.ack_timeout_ms) {
            return Err(format!(
                "nats.ack_timeout_ms: 100..=60000, got {}",
                self.ack_timeout_ms
            ));
        }
        let secret = |file: &PathBuf, env: &str, what: &str| -> Result<Option<Secret>, String> {
            if !file.as_os_str().is_empty() {
                Secret::from_file(file)
                    .map(Some)
                    .map_err(|e| format!("nats.{what}_file: {e}"))
            } else if !env.is_empty() {
                Secret::from_env(env)
                    .map(Some)
                    .map_err(|e| format!("nats.{what}_env: {e}"))
            } else {
                Ok(None)
            }
        };
        let password = secret(&self.password_file, &self.password_env, "password")?;
        let token = secret(&self.token_file, &self.token_env, "token")?;
        let auth = match (self.user.is_empty(), password, token) {
            (true, None, None) => Auth::None,
            (false, Some(p), None) => Auth::UserPassword(self.user.clone(), p),
            (true, None, Some(t)) => Auth::Token(t),
            (false, None, _) => {
                return Err("nats.user needs nats.password_file or nats.password_env".into())
            }
            (true, Some(_), _) => {
                return Err("nats.password_file/password_env needs nats.user".into())
            }
            (false, Some(_), Some(_)) => {
                return Err("nats: a token or a user and password, not both".into())
            }
        };
        let ca_file = (!self.ca_file.as_os_str().is_empty()).then(|| self.ca_file.clone());
        if let Some(f) = &ca_file {
            std::fs::metadata(f).map_err(|e| format!("nats.ca_file {}: {e}", f.display()))?;
        }
        Ok(Target {
            servers: self.servers.clone(),
            auth,
            ca_file,
            stream: self.stream.clone(),
            subject: self.subject.clone(),
            create_stream: self.create_stream,
            replicas: self.replicas,
            duplicate_window: Duration::from_secs(self.duplicate_window_s),
            ack_timeout: Duration::from_millis(self.ack_timeout_ms),
        })
    }
}

/// A server URL: `nats://`, `tls://` (or none) and `HOST:PORT`.
fn check_server(s: &str) -> Result<(), String> {
    let rest = s
        .strip_prefix("nats://")
        .or_else(|| s.strip_prefix("tls://"))
        .unwrap_or(s);
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or_else(|| format!("{s:?}: HOST:PORT expected"))?;
    if host.is_empty() || rest.contains('/') || rest.contains('@') {
        return Err(format!(
            "{s:?}: nats://HOST:PORT expected (credentials go in nats.user / files)"
        ));
    }
    port.parse::<u16>()
        .map_err(|_| format!("{s:?}: bad port {port:?}"))?;
    Ok(())
}

/// A stream name: 1..=64 characters, none of `.`, `*`, `>`, white space,
/// path separators.
pub fn check_stream_name(s: &str) -> Result<(), String> {
    if s.is_empty()
        || s.len() > 64
        || s.chars().any(|c| {
            matches!(c, '.' | '*' | '>' | '/' | '\\') || c.is_whitespace() || c.is_control()
        })
    {
        return Err(format!(
            "{s:?} is not a stream name (1..=64 characters, no `.`, `*`, `>`, `/`, white space)"
        ));
    }
    Ok(())
}

impl Target {
    /// The defaults with `servers`.
    pub fn with_servers(servers: Vec<String>) -> Result<Target, String> {
        NatsSection {
            servers,
            ..NatsSection::default()
        }
        .target()
    }

    /// For logs: the servers and the stream.
    pub fn describe(&self) -> String {
        format!("{} (stream {})", self.servers.join(","), self.stream)
    }

    /// The connect options of a client named `name`.
    pub(crate) fn connect_options(&self, name: &str) -> async_nats::ConnectOptions {
        let mut o = match &self.auth {
            Auth::None => async_nats::ConnectOptions::new(),
            Auth::UserPassword(u, p) => {
                async_nats::ConnectOptions::with_user_and_password(u.clone(), p.expose().into())
            }
            Auth::Token(t) => async_nats::ConnectOptions::with_token(t.expose().into()),
        };
        if let Some(ca) = &self.ca_file {
            o = o.add_root_certificates(ca.clone()).require_tls(true);
        }
        o.name(name)
            .connection_timeout(Duration::from_secs(2))
            .ping_interval(Duration::from_secs(5))
    }

    /// The stream's configuration when it is created.
    pub(crate) fn stream_config(&self) -> async_nats::jetstream::stream::Config {
        async_nats::jetstream::stream::Config {
            name: self.stream.clone(),
            subjects: vec![subject::wildcard(&self.subject)],
            num_replicas: self.replicas,
            storage: async_nats::jetstream::stream::StorageType::File,
            duplicate_window: self.duplicate_window,
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_keys_named() {
        let t = NatsSection::default().target().unwrap();
        assert_eq!(t.stream, "mintgate");
        let bad = |f: fn(&mut NatsSection), key: &str| {
            let mut s = NatsSection::default();
            f(&mut s);
            let e = s.target().unwrap_err();
            assert!(e.contains(key), "{e}");
        };
        bad(|s| s.servers.clear(), "nats.servers");
        bad(|s| s.servers = vec!["nats://h".into()], "nats.servers");
        bad(
            |s| s.servers = vec!["nats://u:p@h:4222".into()],
            "nats.servers",
        );
        bad(|s| s.stream = "a.b".into(), "nats.stream");
        bad(|s| s.subject = "x.y".into(), "nats.subject");
        bad(|s| s.replicas = 0, "nats.replicas");
        bad(|s| s.ack_timeout_ms = 10, "nats.ack_timeout_ms");
        bad(|s| s.user = "u".into(), "nats.user");
        bad(
            |s| s.token_env = "MINTGATE_NO_SUCH_VAR_24".into(),
            "nats.token_env",
        );
        bad(|s| s.ca_file = "/nonexistent/ca.pem".into(), "nats.ca_file");
    }
}
