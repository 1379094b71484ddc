use super::*;

/// A certificate and its private key on disk (PEM).
struct CertFiles {
    cert: PathBuf,
    key: PathBuf,
}

/// Writes a new self-signed serving certificate for `127.0.0.1` with common name `cn`, and its
/// key, as `serving.crt` and `serving.key` in `dir` (the same files each time: a rotation).
fn issue(dir: &Path, cn: &str) -> CertFiles {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    let cert = params.self_signed(&key).unwrap();
    let files = CertFiles {
        cert: dir.join("serving.crt"),
        key: dir.join("serving.key"),
    };
    std::fs::write(&files.cert, cert.pem()).unwrap();
    std::fs::write(&files.key, key.serialize_pem()).unwrap();
    files
}

/// Bumps both files' modification times so the change is seen whatever the clock granularity.
fn touch_later(files: &CertFiles, secs: u64) {
    let t = SystemTime::now() + Duration::from_secs(secs);
    for p in [&files.cert, &files.key] {
        std::fs::File::options()
            .write(true)
            .open(p)
            .unwrap()
            .set_modified(t)
            .unwrap();
    }
}

#[test]
fn a_rotated_pair_is_served_and_a_broken_one_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let files = issue(dir.path(), "first");
    let cert = ReloadingCert::new(&files.cert, &files.key).unwrap();
    let first = cert.current().cert[0].clone();
    assert!(
        !cert.reload_if_changed(),
        "unchanged files are not reloaded"
    );

    issue(dir.path(), "second");
    touch_later(&files, 10);
    assert!(cert.reload_if_changed());
    let second = cert.current().cert[0].clone();
    assert_ne!(first, second);

    std::fs::write(&files.key, "not a key").unwrap();
    touch_later(&files, 20);
    assert!(!cert.reload_if_changed(), "a broken pair is not taken");
    assert_eq!(cert.current().cert[0], second);
    assert!(cert.server_config(&TlsPolicy::default()).is_ok());
}

#[test]
fn missing_files_fail_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("none.crt");
    assert!(ReloadingCert::new(&p, &p).is_err());
}

/// Runs a TLS handshake in memory between `server` and a client offering `versions` (and, when
/// given, only `suite`); the negotiated version and suite, or the handshake's error.
fn handshake(
    server: Arc<ServerConfig>,
    ca: &CertFiles,
    versions: &[&'static tokio_rustls::rustls::SupportedProtocolVersion],
    suite: Option<tokio_rustls::rustls::SupportedCipherSuite>,
) -> std::result::Result<(String, String), String> {
    use tokio_rustls::rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConnection};
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&ca.cert).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let mut provider = ring::default_provider();
    if let Some(s) = suite {
        provider.cipher_suites = vec![s];
    }
    let client = ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut c = ClientConnection::new(Arc::new(client), name).unwrap();
    let mut s = ServerConnection::new(server).unwrap();
    for _ in 0..10 {
        let mut buf = Vec::new();
        c.write_tls(&mut buf).unwrap();
        s.read_tls(&mut buf.as_slice()).unwrap();
        s.process_new_packets().map_err(|e| e.to_string())?;
        let mut back = Vec::new();
        s.write_tls(&mut back).unwrap();
        c.read_tls(&mut back.as_slice()).unwrap();
        c.process_new_packets().map_err(|e| e.to_string())?;
        if !c.is_handshaking() && !s.is_handshaking() {
            let v = format!("{:?}", s.protocol_version().unwrap());
            let suite = format!("{:?}", s.negotiated_cipher_suite().unwrap().suite());
            return Ok((v, suite));
        }
    }
    Err("the handshake did not finish".into())
}

#[test]
fn the_policy_decides_what_a_handshake_can_negotiate() {
    use tokio_rustls::rustls::version::{TLS12, TLS13};
    let dir = tempfile::tempdir().unwrap();
    let files = issue(dir.path(), "policy");
    let cert = ReloadingCert::new(&files.cert, &files.key).unwrap();
    let modern = cert
        .server_config(&TlsPolicy::parse("VersionTLS13", &[]).unwrap())
        .unwrap();
    assert_eq!(
        handshake(modern.clone(), &files, &[&TLS13], None)
            .unwrap()
            .0,
        "TLSv1_3"
    );
    let e = handshake(modern, &files, &[&TLS12], None).unwrap_err();
    assert!(e.contains("Tls12NotOfferedOrEnabled"), "{e}");
    // TLS 1.2 with one suite: a client offering another TLS 1.2 suite is refused, and one
    // offering it gets it.
    let only = ["ECDHE-ECDSA-AES128-GCM-SHA256".to_string()];
    let server = cert
        .server_config(&TlsPolicy::parse("VersionTLS12", &only).unwrap())
        .unwrap();
    let suite = |name: &str| {
        *ring::ALL_CIPHER_SUITES
            .iter()
            .find(|s| format!("{:?}", s.suite()) == name)
            .unwrap()
    };
    let got = handshake(
        server.clone(),
        &files,
        &[&TLS12],
        Some(suite("TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256")),
    )
    .unwrap();
    assert_eq!(
        got,
        (
            "TLSv1_2".into(),
            "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256".into()
        )
    );
    assert!(
        handshake(
            server,
            &files,
            &[&TLS12],
            Some(suite("TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"))
        )
        .is_err()
    );
}
