//! The TLS versions and cipher suites the webhook offers (`--tls-min-version`,
//! `--tls-cipher-suites`; chart `webhook.tls.minVersion`, `webhook.tls.cipherSuites`), so a
//! cluster's TLS security profile reaches it (OpenShift's `tlsSecurityProfile`, docs/openshift.md).
//!
//! Names are accepted as OpenShift's API writes them (`VersionTLS12`; OpenSSL cipher names such
//! as `ECDHE-RSA-AES128-GCM-SHA256`) and as IANA names (`TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256`,
//! as Go's `crypto/tls` and Kubernetes' `--tls-cipher-suites` take them). rustls implements only
//! AEAD suites with forward secrecy: a listed suite it lacks (CBC, static RSA, DHE) is not offered,
//! and a list with none it implements is an error that names those it does.
//!
//! Sources: rustls `ring::ALL_CIPHER_SUITES`; IANA TLS Cipher Suites registry; OpenSSL
//! `openssl-ciphers(1)` for the OpenSSL names; OpenShift `config.openshift.io/v1` `TLSProfileSpec`.

use tokio_rustls::rustls::crypto::{CryptoProvider, ring};
use tokio_rustls::rustls::{SupportedCipherSuite, SupportedProtocolVersion, version};

/// The lowest TLS version offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MinVersion {
    /// TLS 1.2 and 1.3 (OpenShift's Old and Intermediate profiles).
    #[default]
    Tls12,
    /// TLS 1.3 only (OpenShift's Modern profile).
    Tls13,
}

/// What the webhook's TLS offers.
#[derive(Debug, Clone, Default)]
pub struct TlsPolicy {
    /// The lowest version.
    pub min_version: MinVersion,
    /// The suites offered, in the order given; `None`: rustls's defaults.
    pub cipher_suites: Option<Vec<SupportedCipherSuite>>,
    /// Listed suites rustls does not implement (not offered), for the log.
    pub not_offered: Vec<String>,
}

/// (IANA name, OpenSSL name) of every suite rustls's ring provider implements. TLS 1.3 suites
/// have one name in both (`TLS_AES_128_GCM_SHA256`).
const NAMES: &[(&str, &str)] = &[
    ("TLS_AES_256_GCM_SHA384", "TLS_AES_256_GCM_SHA384"),
    ("TLS_AES_128_GCM_SHA256", "TLS_AES_128_GCM_SHA256"),
    (
        "TLS_CHACHA20_POLY1305_SHA256",
        "TLS_CHACHA20_POLY1305_SHA256",
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        "ECDHE-ECDSA-AES256-GCM-SHA384",
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        "ECDHE-ECDSA-AES128-GCM-SHA256",
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        "ECDHE-ECDSA-CHACHA20-POLY1305",
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        "ECDHE-RSA-AES256-GCM-SHA384",
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        "ECDHE-RSA-AES128-GCM-SHA256",
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        "ECDHE-RSA-CHACHA20-POLY1305",
    ),
];

/// The IANA name of a rustls suite (rustls names TLS 1.3 suites `TLS13_…`).
fn iana(s: &SupportedCipherSuite) -> String {
    let name = format!("{:?}", s.suite());
    match name.strip_prefix("TLS13_") {
        Some(rest) => format!("TLS_{rest}"),
        None => name,
    }
}

impl TlsPolicy {
    /// Parses `--tls-min-version` (`VersionTLS12`, `VersionTLS13`, `1.2`, `1.3`; empty: 1.2)
    /// and `--tls-cipher-suites` (empty: rustls's defaults).
    ///
    /// # Errors
    /// An unknown version, or a suite list of which rustls implements none, with what is valid.
    pub fn parse(min_version: &str, suites: &[String]) -> Result<Self, String> {
        let min_version = match min_version.trim() {
            "" | "VersionTLS12" | "1.2" => MinVersion::Tls12,
            "VersionTLS13" | "1.3" => MinVersion::Tls13,
            "VersionTLS10" | "VersionTLS11" | "1.0" | "1.1" => {
                return Err(format!(
                    "TLS minimum version {min_version:?} is below what das-webhook offers: it serves TLS 1.2 and 1.3 only; valid: VersionTLS12, VersionTLS13"
                ));
            }
            other => {
                return Err(format!(
                    "unknown TLS minimum version {other:?}; valid: VersionTLS12 (or 1.2), VersionTLS13 (or 1.3)"
                ));
            }
        };
        let suites: Vec<&str> = suites
            .iter()
            .map(|s| s.trim())
            .filter(|s| !s.is_empty())
            .collect();
        if suites.is_empty() {
            return Ok(Self {
                min_version,
                ..Self::default()
            });
        }
        let all = ring::ALL_CIPHER_SUITES;
        let mut chosen = Vec::new();
        let mut not_offered = Vec::new();
        for name in suites {
            let iana_name = NAMES
                .iter()
                .find(|(i, o)| *i == name || *o == name)
                .map(|(i, _)| *i);
            match iana_name.and_then(|n| all.iter().find(|s| iana(s) == n)) {
                Some(s) if !chosen.contains(s) => chosen.push(*s),
                Some(_) => {}
                None => not_offered.push(name.to_string()),
            }
        }
        let usable = |s: &SupportedCipherSuite| {
            min_version == MinVersion::Tls12 || matches!(s, SupportedCipherSuite::Tls13(_))
        };
        if !chosen.iter().any(usable) {
            let valid: Vec<&str> = NAMES.iter().map(|(i, _)| *i).collect();
            return Err(format!(
                "none of the TLS cipher suites listed can be offered with TLS {} and up (das-webhook's TLS library implements only AEAD suites with forward secrecy); valid: {} (or their OpenSSL names)",
                if min_version == MinVersion::Tls13 {
                    "1.3"
                } else {
                    "1.2"
                },
                valid.join(", ")
            ));
        }
        Ok(Self {
            min_version,
            cipher_suites: Some(chosen),
            not_offered,
        })
    }

    /// The protocol versions offered.
    pub fn versions(&self) -> &'static [&'static SupportedProtocolVersion] {
        static TLS12_AND_UP: [&SupportedProtocolVersion; 2] = [&version::TLS13, &version::TLS12];
        static TLS13_ONLY: [&SupportedProtocolVersion; 1] = [&version::TLS13];
        match self.min_version {
            MinVersion::Tls12 => &TLS12_AND_UP,
            MinVersion::Tls13 => &TLS13_ONLY,
        }
    }

    /// The crypto provider: ring's, with only the listed suites when a list was given. TLS 1.3
    /// needs at least one TLS 1.3 suite: when the list names none, rustls's TLS 1.3 suites are
    /// kept (a cipher list written for TLS 1.2, as OpenSSL's are, says nothing of TLS 1.3).
    pub fn provider(&self) -> CryptoProvider {
        let mut p = ring::default_provider();
        if let Some(chosen) = &self.cipher_suites {
            let mut suites = chosen.clone();
            if !suites
                .iter()
                .any(|s| matches!(s, SupportedCipherSuite::Tls13(_)))
            {
                suites.extend(
                    ring::DEFAULT_CIPHER_SUITES
                        .iter()
                        .filter(|s| matches!(s, SupportedCipherSuite::Tls13(_))),
                );
            }
            p.cipher_suites = suites;
        }
        p
    }
}

#[cfg(test)]
mod tests;
