//! The webhook's HTTPS server under hostile clients (issue 12): silent and slow clients are cut
//! off, connections are limited, large bodies are refused, and none of it stops the server. No
//! cluster needed: the server runs in the test with a loopback certificate.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use das_runtime::client::Clients;
use das_webhook::metrics::Metrics;
use das_webhook::profiles::Profiles;
use das_webhook::server::{self, App, Limits};
use das_webhook::templates::Templates;
use das_webhook::tls::ReloadingCert;
use rustls_pki_types::pem::PemObject;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls;

/// A CA of its own in `dir` and a serving certificate from it for `127.0.0.1` with common name
/// `cn`: returns the CA's certificate file and the serving certificate and key files (PEM).
fn loopback_serving(dir: &Path, cn: &str) -> (PathBuf, PathBuf, PathBuf) {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose, SanType,
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.distinguished_name
        .push(DnType::CommonName, "das-webhook-test-ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let mut serving = CertificateParams::new(Vec::<String>::new()).unwrap();
    serving.distinguished_name.push(DnType::CommonName, cn);
    serving.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    serving.subject_alt_names = vec![SanType::IpAddress(Ipv4Addr::LOCALHOST.into())];
    let cert = serving.signed_by(&key, &issuer).unwrap();
    let files = (
        dir.join("ca.crt"),
        dir.join("serving.crt"),
        dir.join("serving.key"),
    );
    std::fs::write(&files.0, ca_cert.pem()).unwrap();
    std::fs::write(&files.1, cert.pem()).unwrap();
    std::fs::write(&files.2, key.serialize_pem()).unwrap();
    files
}

struct Server {
    port: u16,
    ca: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

async fn start(limits: Limits) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = loopback_serving(dir.path(), "das-webhook");
    let tls = ReloadingCert::new(&cert, &key)
        .unwrap()
        .server_config(&das_webhook::tls::TlsPolicy::default())
        .unwrap();
    // An API server that is never reached: the requests here never get that far.
    let client =
        kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    let app = Arc::new(App {
        profiles: Arc::new(Profiles::new(client.clone(), Duration::from_secs(30))),
        templates: Templates::watch(&Clients {
            calls: client.clone(),
            watches: client,
        }),
        metrics: Metrics::default(),
        metrics_access: Default::default(),
        shares_across_namespaces: false,
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(server::serve(
        listener,
        tls,
        server::router(app, limits),
        limits,
    ));
    Server {
        port,
        ca,
        _dir: dir,
    }
}

async fn tls(s: &Server) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_file_iter(&s.ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", s.port))
        .await
        .unwrap();
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(name, tcp)
        .await
        .unwrap()
}

/// Sends one request and returns the status code (0 when the server closed without one).
async fn status<S: AsyncReadExt + AsyncWriteExt + Unpin>(mut s: S, head: &str, body: &[u8]) -> u16 {
    let _ = s.write_all(head.as_bytes()).await;
    let _ = s.write_all(body).await;
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf).await;
    String::from_utf8_lossy(&buf)
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

async fn healthz(s: &Server) -> u16 {
    let c = tls(s).await;
    status(
        c,
        "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"",
    )
    .await
}

fn quick() -> Limits {
    Limits {
        handshake: Duration::from_millis(300),
        header_read: Duration::from_millis(300),
        request: Duration::from_millis(500),
        max_connections: 4,
        max_body_bytes: 64 << 10,
    }
}

#[tokio::test]
async fn a_silent_client_is_cut_off_before_and_after_the_handshake() {
    let s = start(quick()).await;
    // No TLS at all: closed after the handshake limit.
    let mut raw = tokio::net::TcpStream::connect(("127.0.0.1", s.port))
        .await
        .unwrap();
    let t0 = Instant::now();
    let mut buf = [0u8; 1];
    let n = tokio::time::timeout(Duration::from_secs(5), raw.read(&mut buf))
        .await
        .expect("closed in time");
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    assert!(t0.elapsed() < Duration::from_secs(2));
    // TLS done, no request headers: closed after the header-read limit.
    let mut c = tls(&s).await;
    let t0 = Instant::now();
    let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf))
        .await
        .expect("closed in time");
    assert!(!matches!(n, Ok(1)), "{n:?}");
    assert!(t0.elapsed() < Duration::from_secs(2));
    assert_eq!(healthz(&s).await, 200, "the server goes on");
}

#[tokio::test]
async fn a_client_that_trickles_its_body_is_cut_off_and_its_slot_freed() {
    // One slot, so the health check below is served only once the trickling client's is free.
    let s = start(Limits {
        max_connections: 1,
        ..quick()
    })
    .await;
    let (mut rx, mut tx) = tokio::io::split(tls(&s).await);
    // Headers at once, then one byte of a 1 KiB body every 100 ms: 100 s for the whole body,
    // each byte well within the header-read limit.
    let trickle = tokio::spawn(async move {
        let head = "POST /mutate-pods HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1024\r\n\r\n";
        tx.write_all(head.as_bytes()).await?;
        for _ in 0..1024 {
            tx.write_all(b" ").await?;
            tx.flush().await?;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        std::io::Result::Ok(())
    });
    let t0 = Instant::now();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), rx.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "still open after 5 s");
    assert!(
        t0.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t0.elapsed()
    );
    // A 408 when it gets through before the connection is closed under the client's writes.
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
        "{answer}"
    );
    trickle.abort();
    let served = tokio::time::timeout(Duration::from_secs(5), healthz(&s)).await;
    assert_eq!(served.expect("the slot is freed"), 200);
}

#[tokio::test]
async fn a_body_over_the_limit_is_refused_with_413() {
    let s = start(quick()).await;
    let body = vec![b' '; 100 << 10];
    let head = format!(
        "POST /mutate-pods HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    assert_eq!(status(tls(&s).await, &head, &body).await, 413);
    assert_eq!(healthz(&s).await, 200);
}

#[tokio::test]
async fn connections_beyond_the_limit_wait_until_one_is_free() {
    let s = start(Limits {
        header_read: Duration::from_secs(30),
        ..quick()
    })
    .await;
    // Hold every slot with an idle connection.
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(tls(&s).await);
    }
    // One more TCP connection queues: its handshake gets no answer while the slots are full.
    let mut extra = tokio::net::TcpStream::connect(("127.0.0.1", s.port))
        .await
        .unwrap();
    let mut buf = [0u8; 1];
    assert!(
        tokio::time::timeout(Duration::from_millis(500), extra.read(&mut buf))
            .await
            .is_err(),
        "served beyond the limit"
    );
    drop(extra);
    held.clear();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(healthz(&s).await, 200, "served once slots are free");
}
