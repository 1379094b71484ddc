//! Kubeconfig files with embedded credentials, and kube clients built from them.

use std::path::Path;

use anyhow::{Context, Result};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::pki::CertFiles;

/// Writes a kubeconfig for `server` authenticating with the client certificate `creds`.
/// Credentials are embedded, so the file can be copied elsewhere.
pub fn write(path: &Path, server: &str, ca: &Path, creds: &CertFiles, user: &str) -> Result<()> {
    let b64 = |p: &Path| -> Result<String> {
        Ok(STANDARD.encode(std::fs::read(p).with_context(|| format!("read {}", p.display()))?))
    };
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "das-e2e", "cluster": {
            "server": server,
            "certificate-authority-data": b64(ca)?,
        }}],
        "users": [{"name": user, "user": {
            "client-certificate-data": b64(&creds.cert)?,
            "client-key-data": b64(&creds.key)?,
        }}],
        "contexts": [{"name": "das-e2e", "context": {"cluster": "das-e2e", "user": user}}],
        "current-context": "das-e2e",
    });
    // JSON is valid YAML: kubectl and kube-rs read it as a kubeconfig.
    std::fs::write(path, serde_json::to_vec_pretty(&doc)?)?;
    Ok(())
}

/// Writes to `out` a copy of the kubeconfig `base` (as [`write`] wrote it: same server and CA)
/// that authenticates as `user` with the bearer `token`, e.g. a service-account token from the
/// TokenRequest API.
pub fn with_token(base: &Path, out: &Path, token: &str, user: &str) -> Result<()> {
    let mut doc: serde_json::Value = serde_json::from_slice(
        &std::fs::read(base).with_context(|| format!("read {}", base.display()))?,
    )
    .with_context(|| format!("{} is not a kubeconfig written by das-e2e", base.display()))?;
    doc["users"] = serde_json::json!([{"name": user, "user": {"token": token}}]);
    doc["contexts"][0]["context"]["user"] = user.into();
    std::fs::write(out, serde_json::to_vec_pretty(&doc)?)?;
    Ok(())
}

/// A client for the kubeconfig at `path`.
pub async fn client(path: &Path) -> Result<Client> {
    let kc = Kubeconfig::read_from(path)
        .with_context(|| format!("read kubeconfig {}", path.display()))?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(cfg)?)
}
