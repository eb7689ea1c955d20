//! How a lock built from a URL connects to its servers: once when it is
//! made, and again for a release at shutdown, on a runtime of its own.

use lock_core::LockError;

use crate::config::{Credentials, ParsedUrl};
use crate::error::BACKEND;

impl ParsedUrl {
    /// A client connected to the servers, within the connect timeout and
    /// a request timeout. A refused login or certificate is `Backend`; a
    /// server that does not answer is `Unavailable`.
    pub(crate) async fn connect(&self) -> Result<async_nats::Client, LockError> {
        let mut options = async_nats::ConnectOptions::new()
            .name("distlock")
            .connection_timeout(self.config.connect_timeout)
            .request_timeout(Some(self.config.request_timeout));
        options = match &self.credentials {
            Some(Credentials::UserPassword(user, password)) => {
                options.user_and_password(user.clone(), password.clone())
            }
            Some(Credentials::Token(token)) => options.token(token.clone()),
            None => options,
        };
        if !self.discover {
            options = options.ignore_discovered_servers();
        }
        if self.tls {
            // async-nats builds its rustls configuration from the process's
            // default crypto provider; with more than one compiled in (an
            // application that also links aws-lc-rs) there is none until one
            // is installed, and connecting would panic. Installing fails
            // harmlessly if the application already chose.
            if rustls::crypto::CryptoProvider::get_default().is_none() {
                let _ = rustls::crypto::ring::default_provider().install_default();
            }
            options = options.require_tls(true);
            if let Some(ca) = &self.tls_ca {
                // Read when connecting; a path that is not a file is the
                // URL's mistake, not the server's.
                if !ca.is_file() {
                    return Err(LockError::invalid_options(format!(
                        "tls_ca {} is not a readable file",
                        ca.display()
                    )));
                }
                options = options.add_root_certificates(ca.clone());
            }
        }
        let doing = format!("connecting to {}", self.display);
        let limit = self.config.connect_timeout + self.config.request_timeout;
        tokio::time::timeout(limit, options.connect(self.servers.clone()))
            .await
            .map_err(|_| LockError::Unavailable {
                backend: BACKEND,
                reason: format!("{doing}: no answer within {limit:?}"),
                source: None,
            })?
            .map_err(|e| {
                use async_nats::ConnectErrorKind as K;
                match e.kind() {
                    K::Authentication | K::AuthorizationViolation | K::Tls => {
                        LockError::backend(BACKEND, doing.clone(), e)
                    }
                    // A certificate refused in the TLS handshake comes as
                    // an I/O error: not a server to wait for.
                    K::Io if refused_certificate(&e) => {
                        LockError::backend(BACKEND, doing.clone(), e)
                    }
                    _ => LockError::unavailable(BACKEND, doing.clone(), e),
                }
            })
    }
}

/// Whether a connection's failure was the TLS handshake refusing a
/// certificate (an I/O error of kind `InvalidData` somewhere in its
/// chain).
fn refused_certificate(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(err) = cause {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::InvalidData
        {
            return true;
        }
        cause = err.source();
    }
    false
}
