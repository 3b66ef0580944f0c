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
    /// A user nkey seed file (`SU...`, its first line): the server sends a
    /// nonce and the client signs it (instead of a user or a token).
    pub nkey_seed_file: PathBuf,
    /// A `.creds` file (a user JWT and its nkey seed, as `nsc` writes it):
    /// decentralised authentication (operator mode).
    pub credentials_file: PathBuf,
    /// PEM file of the CA the servers' certificates must chain to (TLS
    /// required then; empty: TLS only for `tls://` URLs, system roots).
    pub ca_file: PathBuf,
    /// PEM client certificate (mutual TLS; needs `key_file`; TLS required).
    pub cert_file: PathBuf,
    /// PEM private key of `cert_file`.
    pub key_file: PathBuf,
    /// The JetStream domain of the stream (empty: none): its API is then
    /// `$JS.DOMAIN.API`, e.g. the hub's JetStream reached through a leaf
    /// node on the gateway's host.
    pub domain: String,
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
            nkey_seed_file: PathBuf::new(),
            credentials_file: PathBuf::new(),
            ca_file: PathBuf::new(),
            cert_file: PathBuf::new(),
            key_file: PathBuf::new(),
            domain: String::new(),
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
    /// A user nkey seed.
    Nkey(Secret),
    /// The text of a `.creds` file (user JWT and nkey seed).
    Credentials(Secret),
}

impl Auth {
    /// For logs: the kind, never the secret.
    pub fn kind(&self) -> &'static str {
        match self {
            Auth::None => "anonymous",
            Auth::UserPassword(..) => "user and password",
            Auth::Token(_) => "token",
            Auth::Nkey(_) => "nkey",
            Auth::Credentials(_) => "credentials file",
        }
    }
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
    /// Client certificate and key (TLS required).
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// The JetStream domain (empty: none).
    pub domain: String,
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
        if !self.domain.is_empty() {
            check_stream_name(&self.domain)
                .map_err(|e| format!("nats.domain: {e} (a domain name has the same rules)"))?;
        }
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
        let nkey = file_secret(&self.nkey_seed_file, "nkey_seed_file", 4096)?
            .map(|s| {
                let seed = s.expose().lines().next().unwrap_or("").trim();
                // Its own words: nkeys' errors could quote the seed.
                match nkeys::KeyPair::from_seed(seed) {
                    Ok(kp) if kp.key_pair_type() == nkeys::KeyPairType::User => {
                        Ok(Secret::new(seed))
                    }
                    Ok(_) => Err(format!(
                        "nats.nkey_seed_file {}: not a user seed (SU...)",
                        self.nkey_seed_file.display()
                    )),
                    Err(_) => Err(format!(
                        "nats.nkey_seed_file {}: the first line is not an nkey seed",
                        self.nkey_seed_file.display()
                    )),
                }
            })
            .transpose()?;
        let creds = file_secret(&self.credentials_file, "credentials_file", 65_536)?;
        if let Some(c) = &creds {
            async_nats::ConnectOptions::new()
                .credentials(c.expose())
                .map_err(|e| {
                    // async-nats' own words when the blocks are missing;
                    // ours for a bad seed (nkeys' could quote it).
                    let why = e.to_string();
                    let why = if why.starts_with("cannot parse") {
                        why
                    } else {
                        "the user nkey seed in it is not valid".into()
                    };
                    format!(
                        "nats.credentials_file {}: {why}",
                        self.credentials_file.display()
                    )
                })?;
        }
        let given: Vec<&str> = [
            (!self.user.is_empty() || password.is_some(), "user/password"),
            (token.is_some(), "token"),
            (nkey.is_some(), "nkey_seed_file"),
            (creds.is_some(), "credentials_file"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, name)| *name)
        .collect();
        if given.len() > 1 {
            return Err(format!(
                "nats: one way to authenticate, not {}",
                given.join(" and ")
            ));
        }
        let auth = match (self.user.is_empty(), password, token, nkey, creds) {
            (false, Some(p), ..) => Auth::UserPassword(self.user.clone(), p),
            (false, None, ..) => {
                return Err("nats.user needs nats.password_file or nats.password_env".into())
            }
            (true, Some(_), ..) => {
                return Err("nats.password_file/password_env needs nats.user".into())
            }
            (true, None, Some(t), ..) => Auth::Token(t),
            (true, None, None, Some(k), _) => Auth::Nkey(k),
            (true, None, None, None, Some(c)) => Auth::Credentials(c),
            (true, None, None, None, None) => Auth::None,
        };
        let ca_file = (!self.ca_file.as_os_str().is_empty()).then(|| self.ca_file.clone());
        if let Some(f) = &ca_file {
            check_pem(f, "ca_file", "CERTIFICATE")?;
        }
        let client_cert = match (
            self.cert_file.as_os_str().is_empty(),
            self.key_file.as_os_str().is_empty(),
        ) {
            (true, true) => None,
            (false, false) => {
                check_pem(&self.cert_file, "cert_file", "CERTIFICATE")?;
                check_pem(&self.key_file, "key_file", "PRIVATE KEY")?;
                Some((self.cert_file.clone(), self.key_file.clone()))
            }
            (false, true) => return Err("nats.cert_file needs nats.key_file".into()),
            (true, false) => return Err("nats.key_file needs nats.cert_file".into()),
        };
        Ok(Target {
            servers: self.servers.clone(),
            auth,
            ca_file,
            client_cert,
            domain: self.domain.clone(),
            stream: self.stream.clone(),
            subject: self.subject.clone(),
            create_stream: self.create_stream,
            replicas: self.replicas,
            duplicate_window: Duration::from_secs(self.duplicate_window_s),
            ack_timeout: Duration::from_millis(self.ack_timeout_ms),
        })
    }
}

/// The text of the secret file `key` (at most `max` bytes), if one is set.
fn file_secret(path: &std::path::Path, key: &str, max: u64) -> Result<Option<Secret>, String> {
    use std::io::Read as _;
    if path.as_os_str().is_empty() {
        return Ok(None);
    }
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(max + 1).read_to_string(&mut text))
        .map_err(|e| format!("nats.{key} {}: {e}", path.display()))?;
    if text.len() as u64 > max {
        return Err(format!(
            "nats.{key} {}: longer than {max} bytes",
            path.display()
        ));
    }
    if text.trim().is_empty() {
        return Err(format!("nats.{key} {}: empty", path.display()));
    }
    Ok(Some(Secret::new(text)))
}

/// A readable PEM file (at most 1 MiB) holding a `-----BEGIN ...WHAT-----`
/// block.
fn check_pem(path: &std::path::Path, key: &str, what: &str) -> Result<(), String> {
    let text = file_secret(path, key, 1 << 20)?.unwrap_or_else(|| Secret::new(""));
    let found = text
        .expose()
        .lines()
        .any(|l| l.starts_with("-----BEGIN ") && l.trim_end().ends_with(&format!("{what}-----")));
    if found {
        Ok(())
    } else {
        Err(format!(
            "nats.{key} {}: no PEM {what} in it",
            path.display()
        ))
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

    /// For logs: the servers, the stream and how we authenticate (never
    /// a secret).
    pub fn describe(&self) -> String {
        let tls = if self.client_cert.is_some() {
            ", TLS with a client certificate"
        } else if self.ca_file.is_some() {
            ", TLS"
        } else {
            ""
        };
        format!(
            "{} (stream {}, {}{tls})",
            self.servers.join(","),
            self.stream,
            self.auth.kind()
        )
    }

    /// The connect options of a client named `name`.
    pub(crate) fn connect_options(&self, name: &str) -> async_nats::ConnectOptions {
        let mut o = match &self.auth {
            Auth::None => async_nats::ConnectOptions::new(),
            Auth::UserPassword(u, p) => {
                async_nats::ConnectOptions::with_user_and_password(u.clone(), p.expose().into())
            }
            Auth::Token(t) => async_nats::ConnectOptions::with_token(t.expose().into()),
            Auth::Nkey(seed) => async_nats::ConnectOptions::with_nkey(seed.expose().into()),
            // Parsed once already when the section was checked.
            Auth::Credentials(c) => async_nats::ConnectOptions::with_credentials(c.expose())
                .unwrap_or_else(|_| async_nats::ConnectOptions::new()),
        };
        if let Some(ca) = &self.ca_file {
            o = o.add_root_certificates(ca.clone()).require_tls(true);
        }
        if let Some((cert, key)) = &self.client_cert {
            o = o
                .add_client_certificate(cert.clone(), key.clone())
                .require_tls(true);
        }
        o.name(name)
            .connection_timeout(Duration::from_secs(2))
            .ping_interval(Duration::from_secs(5))
    }

    /// A JetStream context on `client` (in the target's domain) whose
    /// requests time out after `timeout`.
    pub(crate) fn context(
        &self,
        client: async_nats::Client,
        timeout: Duration,
    ) -> async_nats::jetstream::Context {
        let b = async_nats::jetstream::ContextBuilder::new().timeout(timeout);
        if self.domain.is_empty() {
            b.build(client)
        } else {
            b.domain(self.domain.clone()).build(client)
        }
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
        bad(|s| s.domain = "hub.1".into(), "nats.domain");
        bad(|s| s.subject = "x.y".into(), "nats.subject");
        bad(|s| s.replicas = 0, "nats.replicas");
        bad(|s| s.ack_timeout_ms = 10, "nats.ack_timeout_ms");
        bad(|s| s.user = "u".into(), "nats.user");
        bad(
            |s| s.token_env = "MINTGATE_NO_SUCH_VAR_24".into(),
            "nats.token_env",
        );
        bad(|s| s.ca_file = "/nonexistent/ca.pem".into(), "nats.ca_file");
        bad(
            |s| s.cert_file = "/nonexistent/c.pem".into(),
            "nats.key_file",
        );
        bad(
            |s| s.key_file = "/nonexistent/c.key".into(),
            "nats.cert_file",
        );
    }

    #[test]
    fn credentials_files_are_checked_and_never_shown() {
        let dir = std::env::temp_dir().join(format!("mintgate-nats-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let user = nkeys::KeyPair::new_user();
        let seed = user.seed().unwrap();
        let good = file("user.nk", &format!("{seed}\n"));
        let account = file("account.nk", &nkeys::KeyPair::new_account().seed().unwrap());
        let junk = file("junk.nk", "SUNOTASEED\n");
        let not_pem = file("x.pem", "hello\n");
        let with = |f: &dyn Fn(&mut NatsSection)| {
            let mut s = NatsSection::default();
            f(&mut s);
            s.target()
        };
        let t = with(&|s| s.nkey_seed_file = good.clone()).unwrap();
        assert!(matches!(&t.auth, Auth::Nkey(k) if k.expose() == seed));
        assert!(!format!("{t:?}").contains(&seed), "the seed is printed");
        assert!(t.describe().contains("nkey"), "{}", t.describe());
        let e = with(&|s| s.nkey_seed_file = account.clone()).unwrap_err();
        assert!(e.contains("not a user seed"), "{e}");
        let e = with(&|s| s.nkey_seed_file = junk.clone()).unwrap_err();
        assert!(
            e.contains("nats.nkey_seed_file") && !e.contains("SUNOTASEED"),
            "{e}"
        );
        let e = with(&|s| {
            s.nkey_seed_file = good.clone();
            s.token_env = "PATH".into();
        })
        .unwrap_err();
        assert!(e.contains("token and nkey_seed_file"), "{e}");
        // a .creds file: the blocks nsc writes; a missing JWT is named
        let creds = file(
            "u.creds",
            &format!(
                "-----BEGIN NATS USER JWT-----\neyJhbGciOiJlZDI1NTE5LW5rZXkifQ.e30.c2ln\n------END NATS USER JWT------\n\n\
                 -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"
            ),
        );
        let t = with(&|s| s.credentials_file = creds.clone()).unwrap();
        assert!(matches!(t.auth, Auth::Credentials(_)));
        assert!(!format!("{t:?}").contains(&seed));
        let e = with(&|s| s.credentials_file = good.clone()).unwrap_err();
        assert!(
            e.contains("nats.credentials_file") && !e.contains(&seed),
            "{e}"
        );
        let e = with(&|s| {
            s.cert_file = not_pem.clone();
            s.key_file = not_pem.clone();
        })
        .unwrap_err();
        assert!(e.contains("nats.cert_file") && e.contains("no PEM"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
