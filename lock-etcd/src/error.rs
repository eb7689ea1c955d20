//! Mapping etcd-client errors to `LockError`.

use lock_core::LockError;

pub(crate) const BACKEND: &str = "etcd";

/// gRPC status codes that mean "try again later": CANCELLED (1),
/// DEADLINE_EXCEEDED (4), UNAVAILABLE (14).
const TRANSIENT_CODES: [i32; 3] = [1, 4, 14];

/// gRPC NOT_FOUND (5).
const NOT_FOUND: i32 = 5;

/// Transport failures, timeouts and "no leader" are `Unavailable` (retry
/// later); anything else is `Backend`. etcd-client errors do not carry the
/// password (it travels in an auth request, not in the endpoint).
pub(crate) fn map_etcd(doing: &str, e: etcd_client::Error) -> LockError {
    use etcd_client::Error as E;
    // A wrong user or password: asking again unchanged cannot help.
    if let E::GRpcStatus(status) = &e
        && status.message().contains("authentication failed")
    {
        return LockError::invalid_options(format!(
            "{doing}: the server refused the user name and password ({}); check them",
            status.message()
        ));
    }
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
                // reports it as UNKNOWN "transport error"), or a stream cut
                // by the server's death (UNKNOWN "h2 protocol error").
                || status.message().contains("transport error")
                || status.message().contains("h2 protocol error")
        }
        _ => false,
    };
    if transient {
        LockError::unavailable(BACKEND, doing.to_string(), e)
    } else {
        LockError::backend(BACKEND, doing.to_string(), e)
    }
}

/// Whether `e` is etcd refusing a key for a lease that no longer exists
/// (revoked, or expired while the client could not renew it).
pub(crate) fn lease_not_found(e: &LockError) -> bool {
    let source = match e {
        LockError::Backend { source, .. } | LockError::Unavailable { source, .. } => source,
        _ => return false,
    };
    source
        .as_deref()
        .and_then(|s| s.downcast_ref::<etcd_client::Error>())
        .is_some_and(|e| match e {
            etcd_client::Error::GRpcStatus(status) => {
                status.code() as i32 == NOT_FOUND && status.message().contains("lease not found")
            }
            _ => false,
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn unknown(message: &str) -> etcd_client::Error {
        etcd_client::Error::GRpcStatus(tonic::Status::new(tonic::Code::Unknown, message))
    }

    #[test]
    fn refused_credentials_are_a_configuration_error() {
        let refused = etcd_client::Error::GRpcStatus(tonic::Status::new(
            tonic::Code::InvalidArgument,
            "etcdserver: authentication failed, invalid user ID or password",
        ));
        let e = map_etcd("connecting to etcd://127.0.0.1:2379", refused);
        assert!(e.is_config() && !e.is_transient(), "{e:?}");
    }

    /// A watch or request whose connection the server's death cut is
    /// transient, as a refused connection is; an UNKNOWN status that says
    /// nothing of the connection is not.
    #[test]
    fn a_stream_cut_by_the_servers_death_is_transient() {
        let cut = unknown("h2 protocol error: error reading a body from connection");
        assert!(map_etcd("watching", cut).is_transient());
        assert!(map_etcd("watching", unknown("transport error")).is_transient());
        assert!(!map_etcd("watching", unknown("etcdserver: bad request")).is_transient());
    }
}
