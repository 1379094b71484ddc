//! TLS for the webhook: a rustls server whose certificate is re-read from its files when they
//! change (cert-manager and kubelet-projected secrets rotate files in place), offering the
//! versions and suites of a [`TlsPolicy`].
//!
//! Source: rustls `ResolvesServerCert` (<https://docs.rs/rustls/latest/rustls/server/trait.ResolvesServerCert.html>).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;

use crate::error::{Error, Result};

mod policy;
pub use policy::{MinVersion, TlsPolicy};

/// The certificate in use and the modification times of the files it came from.
struct Loaded {
    key: Arc<CertifiedKey>,
    stamp: (Option<SystemTime>, Option<SystemTime>),
}

/// Serves the certificate from `cert`/`key` (PEM) and reloads it when either file changes.
pub struct ReloadingCert {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<Loaded>,
}

impl fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadingCert")
            .field("cert", &self.cert)
            .finish()
    }
}

impl ReloadingCert {
    /// Loads the pair; fails when the files are missing or do not hold a usable key pair.
    pub fn new(cert: &Path, key: &Path) -> Result<Arc<Self>> {
        let loaded = load(cert, key)?;
        Ok(Arc::new(Self {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            current: RwLock::new(loaded),
        }))
    }

    /// Re-reads the files if their modification time changed. A broken new pair is logged and
    /// the old one kept (a rotation may write the two files one after the other).
    pub fn reload_if_changed(&self) -> bool {
        let stamp = stamps(&self.cert, &self.key);
        if self.current.read().expect("lock").stamp == stamp {
            return false;
        }
        match load(&self.cert, &self.key) {
            Ok(l) => {
                *self.current.write().expect("lock") = l;
                tracing::info!(cert = %self.cert.display(), "serving certificate reloaded");
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "certificate files changed but do not load; keeping the old pair");
                false
            }
        }
    }

    /// The certificate served now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current.read().expect("lock").key.clone()
    }

    /// Polls the files every `every` for ever.
    pub async fn watch(self: Arc<Self>, every: Duration) {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            self.reload_if_changed();
        }
    }

    /// A rustls server configuration (HTTP/1.1 over ALPN) that serves this certificate with the
    /// versions and suites of `policy`.
    pub fn server_config(self: &Arc<Self>, policy: &TlsPolicy) -> Result<Arc<ServerConfig>> {
        let mut cfg = ServerConfig::builder_with_provider(Arc::new(policy.provider()))
            .with_protocol_versions(policy.versions())
            .map_err(Error::TlsConfig)?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(cfg))
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

fn stamps(cert: &Path, key: &Path) -> (Option<SystemTime>, Option<SystemTime>) {
    let m = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    (m(cert), m(key))
}

fn load(cert: &Path, key: &Path) -> Result<Loaded> {
    let stamp = stamps(cert, key);
    let pem = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::ReadPem { path, source }
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(pem(cert))?
        .collect::<Result<_, _>>()
        .map_err(pem(cert))?;
    if chain.is_empty() {
        return Err(Error::NoCertificate(cert.to_path_buf()));
    }
    let der = PrivateKeyDer::from_pem_file(key).map_err(pem(key))?;
    let signing = ring::sign::any_supported_type(&der).map_err(Error::UnusableKey)?;
    let ck = CertifiedKey::new(chain, signing);
    ck.keys_match().map_err(Error::KeyMismatch)?;
    Ok(Loaded {
        key: Arc::new(ck),
        stamp,
    })
}

#[cfg(test)]
mod tests;
