//! Mapping async-nats errors to `LockError`.

use async_nats::jetstream::context::{
    PublishError, PublishErrorKind, RequestError, RequestErrorKind,
};
use async_nats::jetstream::stream::{RawMessageError, RawMessageErrorKind};
use lock_core::LockError;

pub(crate) const BACKEND: &str = "nats";

/// Whether a message delete's error says there was no message of that
/// sequence: "sequence N not found" (10043), "no message found" (10037),
/// or a failed delete (10057) for that reason.
pub(crate) fn no_such_message(code: u64, description: &str) -> bool {
    matches!(code, 10043 | 10037)
        || (code == 10057 && description.contains("not found"))
        || (code == 10057 && description.contains("no message found"))
}

/// JetStream's error code for "no JetStream leader" / "JetStream not
/// ready": a cluster electing a leader.
const TRANSIENT_CODES: [u64; 3] = [10008, 10076, 10077];

/// A publish's failure: timeouts and a broken connection are `Unavailable`
/// (retry later); anything else is `Backend`. async-nats errors do not
/// carry the password (it travels in the CONNECT message, not in the
/// server address).
pub(crate) fn map_publish(doing: &str, e: PublishError) -> LockError {
    match e.kind() {
        PublishErrorKind::TimedOut
        | PublishErrorKind::BrokenPipe
        | PublishErrorKind::StreamNotFound => LockError::unavailable(BACKEND, doing.to_string(), e),
        _ => LockError::backend(BACKEND, doing.to_string(), e),
    }
}

/// A JetStream API request's failure, as [`map_publish`].
pub(crate) fn map_request(doing: &str, e: RequestError) -> LockError {
    match e.kind() {
        RequestErrorKind::TimedOut | RequestErrorKind::NoResponders => {
            LockError::unavailable(BACKEND, doing.to_string(), e)
        }
        _ => LockError::backend(BACKEND, doing.to_string(), e),
    }
}

/// A message read's failure, as [`map_publish`]; "no such message" is
/// answered by the callers before.
pub(crate) fn map_read(doing: &str, e: RawMessageError) -> LockError {
    match e.kind() {
        RawMessageErrorKind::Other => LockError::unavailable(BACKEND, doing.to_string(), e),
        RawMessageErrorKind::JetStream(api) => {
            api_error(doing, api.error_code().0, &api.to_string())
        }
        _ => LockError::backend(BACKEND, doing.to_string(), e),
    }
}

/// A JetStream API error answered by the server: transient where the
/// cluster has no leader yet.
pub(crate) fn api_error(doing: &str, code: u64, description: &str) -> LockError {
    let reason = format!("{doing}: the server answered {description} (error code {code})");
    if TRANSIENT_CODES.contains(&code) {
        LockError::Unavailable {
            backend: BACKEND,
            reason,
            source: None,
        }
    } else {
        LockError::Backend {
            backend: BACKEND,
            reason,
            source: None,
        }
    }
}

/// Whether a conditional publish failed because the subject's last
/// message was another than expected, and if so, that message's sequence
/// where the server said it: one server answers `wrong last sequence: N`
/// (error code 10071), a replicated stream's leader `wrong last sequence`
/// alone (10164).
pub(crate) fn wrong_last_sequence(e: &PublishError) -> Option<Option<u64>> {
    // Shown as "wrong last sequence: wrong last sequence: N (code …)", or
    // "…: wrong last sequence (code 400, error code 10164)": the kind,
    // then the server's description.
    let text = e.to_string();
    if e.kind() != PublishErrorKind::WrongLastSequence && !text.contains("error code 10164") {
        return None;
    }
    let number = text.rfind("wrong last sequence: ").and_then(|at| {
        let digits: String = text[at + "wrong last sequence: ".len()..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    });
    Some(number)
}

/// Whether a publish was refused because a publish with the same message
/// id is still on its way into a replicated stream (error code 10158).
pub(crate) fn duplicate_in_flight(e: &PublishError) -> bool {
    e.to_string().contains("error code 10158")
}
