//! The folders the gateway writes to, checked before anything starts: a
//! read-only or full file system is a clear error at start rather than a
//! failed write (or worse) hours later.
//!
//! [`check`] creates the folder if needed, writes, syncs and removes a probe
//! file of [`PROBE_BYTES`] (so a read-only mount, a folder without write
//! permission and a full disk all fail here, with the system's reason), and
//! then wants at least [`MIN_FREE_BYTES`] free for unprivileged users.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::Config;

/// Size of the probe file written at start.
pub const PROBE_BYTES: usize = 64 << 10;
/// Free space a state folder needs at start.
pub const MIN_FREE_BYTES: u64 = 1 << 20;

/// Why a state folder cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The folder could not be created.
    #[error("cannot create the {key} folder {}", dir.display())]
    Create {
        /// The configuration key naming the folder.
        key: &'static str,
        /// The folder.
        dir: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A file could not be written (read-only, no permission, disk full).
    #[error("cannot write in the {key} folder {}", dir.display())]
    Write {
        /// The configuration key naming the folder.
        key: &'static str,
        /// The folder.
        dir: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Too little space left.
    #[error(
        "the {key} folder {} has {free} bytes free; at least {MIN_FREE_BYTES} are needed",
        dir.display()
    )]
    Space {
        /// The configuration key naming the folder.
        key: &'static str,
        /// The folder.
        dir: PathBuf,
        /// Bytes available to unprivileged users.
        free: u64,
    },
}

/// The folders `cfg` writes to, with the key that names each: the device
/// history store, the MQTT publish queue (when the bridges run and persist)
/// and where a self-signed HTTP/3 certificate is kept (when HTTP/3 runs
/// without a configured certificate).
pub fn state_dirs(cfg: &Config) -> Vec<(&'static str, PathBuf)> {
    let mut v = Vec::new();
    if let Some(d) = &cfg.devices.store {
        v.push(("devices.store", d.clone()));
    }
    if cfg.mqtt.enabled && cfg.mqtt.persist {
        v.push(("mqtt.state", cfg.mqtt.state.clone()));
    }
    if cfg.proxy.h3.is_some() && cfg.proxy.tls_cert.is_none() {
        v.push(("proxy.tls_dir", cfg.proxy.tls_dir.clone()));
    }
    v
}

/// Checks one folder (see the module's documentation); returns the bytes
/// free in it.
pub fn check(key: &'static str, dir: &Path) -> Result<u64, StateError> {
    std::fs::create_dir_all(dir).map_err(|source| StateError::Create {
        key,
        dir: dir.to_path_buf(),
        source,
    })?;
    let probe = dir.join(format!(".mintgate-probe-{}", std::process::id()));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&probe)?;
        f.write_all(&vec![0u8; PROBE_BYTES])?;
        f.sync_all()
    })();
    let _ = std::fs::remove_file(&probe);
    written.map_err(|source| StateError::Write {
        key,
        dir: dir.to_path_buf(),
        source,
    })?;
    let free = free_bytes(dir).unwrap_or(u64::MAX);
    if free < MIN_FREE_BYTES {
        return Err(StateError::Space {
            key,
            dir: dir.to_path_buf(),
            free,
        });
    }
    Ok(free)
}

/// Checks every folder of `cfg`, in order; the first failure. A full MQTT
/// queue folder is only a warning: the gateway serves, and the publish
/// queue refuses messages (counted) until there is space again.
pub fn check_all(cfg: &Config) -> Result<(), StateError> {
    for (key, dir) in state_dirs(cfg) {
        let free = match check(key, &dir) {
            Err(e) if key == "mqtt.state" && is_full(&e) => {
                let cause = match &e {
                    StateError::Write { source, .. } | StateError::Create { source, .. } => {
                        format!(": {source}")
                    }
                    StateError::Space { .. } => String::new(),
                };
                tracing::warn!(
                    "{e}{cause}; starting anyway: the MQTT publish queue refuses messages until \
                     there is space again"
                );
                continue;
            }
            r => r?,
        };
        if free < 64 * MIN_FREE_BYTES {
            tracing::warn!(
                key,
                dir = %dir.display(),
                free_bytes = free,
                "little space left for the gateway's state"
            );
        }
    }
    Ok(())
}

/// The folder is full (as opposed to read-only or not writable).
fn is_full(e: &StateError) -> bool {
    match e {
        StateError::Space { .. } => true,
        StateError::Write { source, .. } | StateError::Create { source, .. } => {
            mintgate_mqtt::store::is_full_io(source)
        }
    }
}

/// Bytes available to unprivileged users on the file system of `dir`.
pub fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: a valid NUL-terminated path and a zeroed out-struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_writable_folder_passes_and_a_file_in_the_way_fails() {
        let d = std::env::temp_dir().join(format!("mintgate-state-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let free = check("devices.store", &d.join("history")).unwrap();
        assert!(free >= MIN_FREE_BYTES);
        assert_eq!(
            std::fs::read_dir(d.join("history")).unwrap().count(),
            0,
            "the probe is removed"
        );
        std::fs::write(d.join("file"), b"x").unwrap();
        let e = check("mqtt.state", &d.join("file"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("mqtt.state") && e.contains("cannot create"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_folders_in_use_are_listed_with_their_keys() {
        let mut c = Config::default();
        assert!(state_dirs(&c).is_empty());
        c.devices.store = Some("/var/lib/mg/h".into());
        c.mqtt.enabled = true;
        c.proxy.h3 = Some("127.0.0.1:8443".parse().unwrap());
        let keys: Vec<&str> = state_dirs(&c).iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, ["devices.store", "mqtt.state", "proxy.tls_dir"]);
        c.mqtt.persist = false;
        c.proxy.tls_cert = Some("c.pem".into());
        assert_eq!(state_dirs(&c).len(), 1);
    }
}
