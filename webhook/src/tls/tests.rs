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
    assert!(cert.server_config().is_ok());
}

#[test]
fn missing_files_fail_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("none.crt");
    assert!(ReloadingCert::new(&p, &p).is_err());
}
