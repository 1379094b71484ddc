//! Test PKI for the local control plane: one CA, serving and client certificates, and the
//! service-account signing key, written as PEM files (rcgen).

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// A certificate and its private key on disk (PEM).
#[derive(Clone, Debug)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The cluster CA: signs every serving and client certificate of a test cluster.
pub struct Pki {
    dir: PathBuf,
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate (PEM file), for `--client-ca-file`, kubeconfigs and webhook caBundles.
    pub ca: CertFiles,
}

/// What a leaf certificate is for.
pub enum Usage {
    /// TLS server; SANs are DNS names or IP addresses.
    Server { sans: Vec<String> },
    /// TLS client; Kubernetes maps CN to the user and O to groups.
    Client { groups: Vec<String> },
}

impl Pki {
    /// Creates a new CA in `dir` (created if missing).
    pub fn create(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, "das-e2e-ca");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key)?;
        let ca = CertFiles {
            cert: dir.join("ca.crt"),
            key: dir.join("ca.key"),
        };
        write_private(&ca.key, &key.serialize_pem())?;
        std::fs::write(&ca.cert, cert.pem())?;
        Ok(Self {
            dir: dir.to_path_buf(),
            issuer: Issuer::new(params, key),
            ca,
        })
    }

    /// Issues `<name>.crt` / `<name>.key` signed by the CA, with common name `cn`.
    pub fn issue(&self, name: &str, cn: &str, usage: Usage) -> Result<CertFiles> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, cn);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        match usage {
            Usage::Server { sans } => {
                params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
                for san in sans {
                    params.subject_alt_names.push(match san.parse::<IpAddr>() {
                        Ok(ip) => SanType::IpAddress(ip),
                        Err(_) => {
                            SanType::DnsName(san.try_into().context("SAN is not a DNS name")?)
                        }
                    });
                }
            }
            Usage::Client { groups } => {
                params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
                for g in groups {
                    params.distinguished_name.push(DnType::OrganizationName, g);
                }
            }
        }
        let cert = params.signed_by(&key, &self.issuer)?;
        let files = CertFiles {
            cert: self.dir.join(format!("{name}.crt")),
            key: self.dir.join(format!("{name}.key")),
        };
        write_private(&files.key, &key.serialize_pem())?;
        std::fs::write(&files.cert, cert.pem())?;
        Ok(files)
    }

    /// Writes a service-account signing key pair: `sa.key` (private) and `sa.pub` (public).
    pub fn service_account_keys(&self) -> Result<CertFiles> {
        let key = KeyPair::generate()?;
        let files = CertFiles {
            cert: self.dir.join("sa.pub"),
            key: self.dir.join("sa.key"),
        };
        write_private(&files.key, &key.serialize_pem())?;
        std::fs::write(&files.cert, key.public_key_pem())?;
        Ok(files)
    }
}

/// A CA of its own in `dir` and a serving certificate from it for `127.0.0.1`, as a webhook on
/// loopback needs (the API server calls it by URL and checks the certificate against the CA).
pub fn loopback_serving(dir: &Path, cn: &str) -> Result<(Pki, CertFiles)> {
    let pki = Pki::create(dir)?;
    let serving = pki.issue(
        "serving",
        cn,
        Usage::Server {
            sans: vec!["127.0.0.1".into()],
        },
    )?;
    Ok((pki, serving))
}

/// SANs of the kube-apiserver serving certificate: loopback plus the in-cluster names.
pub fn apiserver_sans() -> Vec<String> {
    [
        &Ipv4Addr::LOCALHOST.to_string(),
        "10.0.0.1",
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn write_private(path: &Path, pem: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("write {}", path.display()))?;
    f.write_all(pem.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_certificates_are_pem_files_with_private_keys() {
        let dir = std::env::temp_dir().join(format!("das-pki-{}", std::process::id()));
        let pki = Pki::create(&dir).unwrap();
        let server = pki
            .issue(
                "srv",
                "kube-apiserver",
                Usage::Server {
                    sans: apiserver_sans(),
                },
            )
            .unwrap();
        let client = pki
            .issue(
                "cli",
                "system:node:n0",
                Usage::Client {
                    groups: vec!["system:nodes".into()],
                },
            )
            .unwrap();
        let sa = pki.service_account_keys().unwrap();
        for f in [&pki.ca, &server, &client] {
            assert!(
                std::fs::read_to_string(&f.cert)
                    .unwrap()
                    .starts_with("-----BEGIN CERTIFICATE-----")
            );
            assert!(
                std::fs::read_to_string(&f.key)
                    .unwrap()
                    .contains("PRIVATE KEY")
            );
        }
        assert!(
            std::fs::read_to_string(&sa.cert)
                .unwrap()
                .starts_with("-----BEGIN PUBLIC KEY-----")
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&client.key).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "private keys are not readable by others");
        // A SAN that is not IA5 (ASCII) is refused with an error, not a panic.
        assert!(
            pki.issue(
                "bad",
                "x",
                Usage::Server {
                    sans: vec!["gpü.example".into()]
                }
            )
            .is_err()
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
