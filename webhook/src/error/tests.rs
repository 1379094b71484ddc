use std::collections::HashSet;

use super::*;

fn unavailable() -> kube::Error {
    kube::Error::Api(Box::new(
        kube::core::Status::failure("away", "ServiceUnavailable").with_code(503),
    ))
}

#[test]
fn every_kind_has_its_own_fixed_label() {
    // `Patch` is left out: kube gives no way to build a `SerializePatchError`.
    let tls = || rustls::Error::General("test".into());
    let template = |source| Error::CreateTemplate {
        namespace: "ns".into(),
        name: "t".into(),
        source,
    };
    let all = [
        Error::BadReview(ConvertAdmissionReviewError),
        Error::ListClasses(unavailable()),
        Error::ListSlices(unavailable()),
        template(unavailable()),
        Error::ReadTemplate {
            namespace: "ns".into(),
            name: "t".into(),
            source: unavailable(),
        },
        Error::TemplateMismatch {
            namespace: "ns".into(),
            name: "t".into(),
            why: "it asks for 2g.20gb".into(),
        },
        Error::ReadPem {
            path: "/x.crt".into(),
            source: rustls_pki_types::pem::Error::NoItemsFound,
        },
        Error::NoCertificate("/x.crt".into()),
        Error::UnusableKey(tls()),
        Error::KeyMismatch(tls()),
        Error::TlsConfig(tls()),
    ];
    let labels: HashSet<_> = all.iter().map(Error::metric_label).collect();
    assert_eq!(labels.len(), all.len(), "{labels:?}");
    assert!(
        labels
            .iter()
            .all(|l| l.chars().all(|c| c.is_ascii_lowercase() || c == '_')),
        "{labels:?}"
    );
}

#[test]
fn messages_name_what_failed() {
    let m = Error::TemplateMismatch {
        namespace: "ns".into(),
        name: "das-mig-1g-10gb-x2".into(),
        why: "it asks for 2g.20gb".into(),
    }
    .to_string();
    assert!(
        m.starts_with("ResourceClaimTemplate ns/das-mig-1g-10gb-x2 exists but it asks for")
            && m.contains("delete it"),
        "{m}"
    );
    let m = Error::BadReview(ConvertAdmissionReviewError).to_string();
    assert!(m.starts_with("bad AdmissionReview: "), "{m}");
    let e = Error::ListSlices(unavailable());
    assert!(e.to_string().starts_with("list ResourceSlices: "), "{e}");
    assert!(std::error::Error::source(&e).is_some());
}
