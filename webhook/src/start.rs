//! The webhook's start-up in types (issue 42): [`Tls::load`] → [`Tls`] → [`Tls::bind`] →
//! [`Bound`] → [`Bound::serve`]. Each phase has private fields and is made only by the
//! previous one, so the order cannot be broken by an edit: the serving certificate and the TLS
//! policy are checked before anything listens (a bad certificate or `--tls-min-version` fails
//! the start, never a handshake), and only a bound listener with that configuration is served.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_rustls::rustls::ServerConfig;

use crate::error::Error;
use crate::server::{self, App, Limits};
use crate::tls::{ReloadingCert, TlsPolicy};

/// Why the webhook could not start serving.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// `--tls-min-version` or `--tls-cipher-suites` is not valid (the text says what is).
    #[error("--tls-min-version/--tls-cipher-suites: {0}")]
    TlsPolicy(String),
    /// The serving certificate cannot be loaded, or the TLS configuration built.
    #[error(transparent)]
    Certificate(#[from] Error),
    /// The HTTPS address cannot be listened on.
    #[error("bind {address}")]
    Bind {
        /// The address of `--listen`.
        address: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// The serving certificate loaded (and re-read when its files change) and the TLS
/// configuration that offers it with the policy's versions and suites. Made only by
/// [`Tls::load`].
///
/// ```compile_fail,E0451
/// use std::sync::Arc;
/// use das_webhook::start::Tls;
/// use das_webhook::tls::ReloadingCert;
/// use tokio_rustls::rustls::ServerConfig;
/// // A TLS phase without loading and checking the certificate does not compile: the fields
/// // are private.
/// fn unchecked(cert: Arc<ReloadingCert>, config: Arc<ServerConfig>) -> Tls {
///     Tls { cert, config }
/// }
/// ```
pub struct Tls {
    cert: Arc<ReloadingCert>,
    config: Arc<ServerConfig>,
}

impl Tls {
    /// Loads the certificate chain `cert` and its key `key` (PEM), and builds the server
    /// configuration with the lowest version `min_version` and the cipher `suites` of
    /// [`TlsPolicy::parse`]; listed suites the TLS library lacks are logged, not offered.
    ///
    /// # Errors
    /// [`StartError::Certificate`]: the files are missing or hold no usable key pair;
    /// [`StartError::TlsPolicy`]: the version or suites are not valid.
    pub fn load(
        cert: &Path,
        key: &Path,
        min_version: &str,
        suites: &[String],
    ) -> Result<Self, StartError> {
        let cert = ReloadingCert::new(cert, key)?;
        let policy = TlsPolicy::parse(min_version, suites).map_err(StartError::TlsPolicy)?;
        if !policy.not_offered.is_empty() {
            tracing::warn!(suites = ?policy.not_offered, "listed TLS cipher suites the TLS library does not implement are not offered");
        }
        let config = cert.server_config(&policy)?;
        Ok(Self { cert, config })
    }

    /// Re-reads the certificate files every `every`, for ever (spawn it): a rotated
    /// certificate is served without a restart.
    pub fn reload_every(&self, every: Duration) -> impl Future<Output = ()> + Send + 'static {
        self.cert.clone().watch(every)
    }

    /// Listens on `address` for connections to be served with this configuration.
    ///
    /// # Errors
    /// [`StartError::Bind`]: the address is taken or not this host's.
    pub async fn bind(self, address: SocketAddr) -> Result<Bound, StartError> {
        let listener = TcpListener::bind(address)
            .await
            .map_err(|source| StartError::Bind { address, source })?;
        Ok(Bound {
            listener,
            config: self.config,
        })
    }
}

/// A listener bound with a checked TLS configuration: the one thing [`Bound::serve`] serves.
/// Made only by [`Tls::bind`].
///
/// ```compile_fail,E0451
/// use std::sync::Arc;
/// use das_webhook::start::Bound;
/// use tokio::net::TcpListener;
/// use tokio_rustls::rustls::ServerConfig;
/// // Serving a listener bound without the TLS phase does not compile: the fields are private.
/// fn bound(listener: TcpListener, config: Arc<ServerConfig>) -> Bound {
///     Bound { listener, config }
/// }
/// ```
pub struct Bound {
    listener: TcpListener,
    config: Arc<ServerConfig>,
}

impl Bound {
    /// The address listened on (the port the system chose for port 0).
    ///
    /// # Errors
    /// The socket's address cannot be read.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves `app`'s routes ([`server::router`]) over HTTPS within `limits`, for ever
    /// ([`server::serve`]).
    pub async fn serve(self, app: Arc<App>, limits: Limits) -> Infallible {
        let routes = server::router(app, limits);
        server::serve(self.listener, self.config, routes, limits).await
    }
}
