//! The HTTPS client side the webhook benchmarks share (`admission`, `slice_scale`), included by
//! `#[path]` so das-e2e's library does not take on rustls as a dependency.

use std::path::Path;
use std::sync::Arc;

use anyhow::Result;
use rustls_pki_types::pem::PemObject;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls;

/// A TLS connector that trusts only the CA certificate (PEM) at `ca`.
pub fn connector(ca: &Path) -> Result<TlsConnector> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_file_iter(ca)? {
        roots.add(c?)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(cfg)))
}
