//! Mapping etcd-client errors to `LockError`.

use lock_core::LockError;

pub(crate) const BACKEND: &str = "etcd";

/// gRPC status codes that mean "try again later": CANCELLED (1),
/// DEADLINE_EXCEEDED (4), UNAVAILABLE (14).
const TRANSIENT_CODES: [i32; 3] = [1, 4, 14];

/// Transport failures, timeouts and "no leader" are `Unavailable` (retry
/// later); anything else is `Backend`. etcd-client errors do not carry the
/// password (it travels in an auth request, not in the endpoint).
pub(crate) fn map_etcd(doing: &str, e: etcd_client::Error) -> LockError {
    use etcd_client::Error as E;
    let transient = match &e {
        E::TransportError(_)
        | E::IoError(_)
        | E::EndpointError(_)
        | E::LeaseKeepAliveError(_)
        | E::WatchError(_) => true,
        E::GRpcStatus(status) => {
            TRANSIENT_CODES.contains(&(status.code() as i32))
                || status.message().contains("no leader")
                // A connection reset or refused under the request (gRPC
                // reports it as UNKNOWN "transport error").
                || status.message().contains("transport error")
        }
        _ => false,
    };
    if transient {
        LockError::unavailable(BACKEND, doing.to_string(), e)
    } else {
        LockError::backend(BACKEND, doing.to_string(), e)
    }
}

/// Whether `e` means the request never reached a server (the connection to
/// the member it was routed to was refused or could not be made), so that
/// sending it again, perhaps to another member, cannot apply it twice.
pub(crate) fn never_sent(e: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    match e {
        E::TransportError(_) => true,
        E::GRpcStatus(status) => status.code() as i32 == 14 && status.message().contains("connect"),
        _ => false,
    }
}
