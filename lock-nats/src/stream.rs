//! The bucket's stream: made on first use, checked when it exists, and
//! the server version it needs.

use std::time::Duration;

use async_nats::jetstream::context::{CreateStreamErrorKind, GetStreamErrorKind};
use async_nats::jetstream::stream::{Config, DiscardPolicy, StorageType, Stream};
use async_nats::jetstream::{self, ErrorCode};
use lock_core::LockError;

use crate::config::NatsConfig;
use crate::error::BACKEND;
use crate::keys;

/// The oldest server with per-message TTLs, which every lock's lease is.
const OLDEST_SERVER: (u64, u64) = (2, 11);

/// Refuse a server older than [`OLDEST_SERVER`]: it would store the TTL
/// header and never expire the message, so a crashed holder's lock would
/// never be freed.
pub(crate) fn check_server_version(version: &str) -> Result<(), LockError> {
    let mut parts = version
        .trim_start_matches('v')
        .split(['.', '-'])
        .map(|p| p.parse::<u64>().ok());
    let found = match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor),
        _ => {
            return Err(LockError::Backend {
                backend: BACKEND,
                reason: format!("the server reported version {version:?}, which is not a version"),
                source: None,
            });
        }
    };
    if found < OLDEST_SERVER {
        return Err(LockError::Backend {
            backend: BACKEND,
            reason: format!(
                "nats-server {version} has no per-message TTLs, which the locks' leases are: \
                 {}.{} or later is needed",
                OLDEST_SERVER.0, OLDEST_SERVER.1
            ),
            source: None,
        });
    }
    Ok(())
}

/// The configuration a bucket's stream is made with: one message per
/// subject (a lock's latest), per-message TTLs, deletes by sequence (a
/// release), and no markers when a message expires (a free lock's subject
/// is empty, so a grant is one conditional publish).
fn stream_config(config: &NatsConfig) -> Config {
    Config {
        name: keys::stream_name(&config.bucket),
        description: Some("distlock: one message per held lock".to_string()),
        subjects: vec![keys::stream_subjects(&config.bucket)],
        max_messages_per_subject: 1,
        allow_message_ttl: true,
        allow_direct: true,
        allow_rollup: true,
        deny_delete: false,
        discard: DiscardPolicy::New,
        storage: StorageType::File,
        num_replicas: config.replicas,
        ..Default::default()
    }
}

/// What an existing stream lacks that the locks need, if anything.
fn unfit(found: &Config, config: &NatsConfig) -> Option<String> {
    let subjects = keys::stream_subjects(&config.bucket);
    if !found.subjects.contains(&subjects) {
        Some(format!("it does not take {subjects}"))
    } else if !found.allow_message_ttl {
        Some("it does not allow per-message TTLs (allow_msg_ttl)".to_string())
    } else if found.max_messages_per_subject != 1 {
        Some(format!(
            "it keeps {} messages per subject, not 1",
            found.max_messages_per_subject
        ))
    } else if found.deny_delete {
        Some("it denies deletes (deny_delete)".to_string())
    } else if found.subject_delete_marker_ttl.is_some() {
        Some("it leaves markers where messages expire (subject_delete_marker_ttl)".to_string())
    } else {
        None
    }
}

/// The bucket's stream, made if missing (by any number of clients at
/// once), and the number of servers that keep it.
pub(crate) async fn open(
    js: &jetstream::Context,
    config: &NatsConfig,
    display: &str,
) -> Result<(Stream, usize), LockError> {
    let name = keys::stream_name(&config.bucket);
    let doing = format!("opening the bucket's stream {name} on {display}");
    for _ in 0..3 {
        match js.get_stream(&name).await {
            Ok(stream) => {
                let found = &stream.cached_info().config;
                if let Some(why) = unfit(found, config) {
                    return Err(LockError::Backend {
                        backend: BACKEND,
                        reason: format!("{doing}: the stream exists, but {why}"),
                        source: None,
                    });
                }
                let replicas = found.num_replicas.max(1);
                return Ok((stream, replicas));
            }
            Err(e) => match e.kind() {
                GetStreamErrorKind::JetStream(api)
                    if api.error_code() == ErrorCode::STREAM_NOT_FOUND => {}
                GetStreamErrorKind::Request => {
                    return Err(LockError::unavailable(BACKEND, doing, e));
                }
                _ => return Err(LockError::backend(BACKEND, doing, e)),
            },
        }
        match js.create_stream(stream_config(config)).await {
            Ok(_) => {
                tracing::info!(target: "distlock", backend = BACKEND, stream = %name, replicas = config.replicas, "made the bucket's stream");
            }
            // Made by another client meanwhile: read it again.
            Err(e)
                if matches!(e.kind(), CreateStreamErrorKind::JetStream(ref api)
                if api.error_code() == ErrorCode::STREAM_NAME_EXIST) => {}
            Err(e) => {
                return Err(match e.kind() {
                    CreateStreamErrorKind::TimedOut
                    | CreateStreamErrorKind::JetStreamUnavailable => {
                        LockError::unavailable(BACKEND, doing, e)
                    }
                    _ => LockError::backend(BACKEND, doing, e),
                });
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(LockError::Unavailable {
        backend: BACKEND,
        reason: format!("{doing}: made, but not found when read back"),
        source: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_before_per_message_ttls_are_refused() {
        for ok in ["2.11.0", "2.15.1", "v2.12.3-beta", "3.0.0"] {
            assert!(check_server_version(ok).is_ok(), "{ok}");
        }
        for old in ["2.9.10", "2.10.29", "1.4.1", "", "two"] {
            assert!(check_server_version(old).is_err(), "{old:?}");
        }
    }

    #[test]
    fn an_unfit_stream_is_named() {
        let config = NatsConfig::default();
        assert_eq!(unfit(&stream_config(&config), &config), None);
        let mut kv = stream_config(&config);
        kv.max_messages_per_subject = 5;
        assert!(unfit(&kv, &config).is_some_and(|w| w.contains("5 messages")));
        kv = stream_config(&config);
        kv.allow_message_ttl = false;
        assert!(unfit(&kv, &config).is_some_and(|w| w.contains("TTL")));
    }
}
