use super::*;

fn names(p: &TlsPolicy) -> Vec<String> {
    p.cipher_suites.iter().flatten().map(iana).collect()
}

#[test]
fn versions_take_openshifts_names_and_refuse_what_is_not_offered() {
    for (given, want) in [
        ("", MinVersion::Tls12),
        ("VersionTLS12", MinVersion::Tls12),
        ("1.2", MinVersion::Tls12),
        ("VersionTLS13", MinVersion::Tls13),
        ("1.3", MinVersion::Tls13),
    ] {
        assert_eq!(
            TlsPolicy::parse(given, &[]).unwrap().min_version,
            want,
            "{given}"
        );
    }
    let e = TlsPolicy::parse("VersionTLS10", &[]).unwrap_err();
    assert!(
        e.contains("TLS 1.2 and 1.3 only") && e.contains("VersionTLS13"),
        "{e}"
    );
    let e = TlsPolicy::parse("TLSv1.3", &[]).unwrap_err();
    assert!(e.contains("unknown TLS minimum version \"TLSv1.3\""), "{e}");
    assert_eq!(TlsPolicy::parse("1.3", &[]).unwrap().versions().len(), 1);
}

#[test]
fn suites_by_iana_or_openssl_name_in_order_and_unimplemented_ones_skipped() {
    // OpenShift's Intermediate profile, as its API lists it.
    let intermediate: Vec<String> = [
        "TLS_AES_128_GCM_SHA256",
        "TLS_AES_256_GCM_SHA384",
        "TLS_CHACHA20_POLY1305_SHA256",
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        "ECDHE-RSA-AES128-GCM-SHA256",
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        "ECDHE-RSA-AES256-GCM-SHA384",
        "ECDHE-ECDSA-CHACHA20-POLY1305",
        "ECDHE-RSA-CHACHA20-POLY1305",
        "DHE-RSA-AES128-GCM-SHA256",
        "DHE-RSA-AES256-GCM-SHA384",
    ]
    .map(String::from)
    .to_vec();
    let p = TlsPolicy::parse("VersionTLS12", &intermediate).unwrap();
    assert_eq!(names(&p).len(), 9);
    assert_eq!(names(&p)[0], "TLS_AES_128_GCM_SHA256");
    assert_eq!(names(&p)[3], "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256");
    assert_eq!(
        p.not_offered,
        ["DHE-RSA-AES128-GCM-SHA256", "DHE-RSA-AES256-GCM-SHA384"]
    );
    // IANA names, duplicates once.
    let iana_list = [
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        "ECDHE-RSA-AES128-GCM-SHA256",
    ]
    .map(String::from)
    .to_vec();
    let p = TlsPolicy::parse("", &iana_list).unwrap();
    assert_eq!(names(&p), ["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"]);
    // A TLS 1.2 list keeps TLS 1.3 working: its suites are added to the provider.
    let provider = p.provider();
    assert!(
        provider
            .cipher_suites
            .iter()
            .any(|s| matches!(s, SupportedCipherSuite::Tls13(_)))
    );
    assert_eq!(
        provider
            .cipher_suites
            .iter()
            .filter(|s| matches!(s, SupportedCipherSuite::Tls12(_)))
            .count(),
        1
    );
}

#[test]
fn a_list_with_nothing_offerable_is_an_error_naming_the_valid_suites() {
    let cbc = ["ECDHE-RSA-AES128-SHA256", "AES128-SHA"]
        .map(String::from)
        .to_vec();
    let e = TlsPolicy::parse("VersionTLS12", &cbc).unwrap_err();
    assert!(
        e.contains("none of the TLS cipher suites listed")
            && e.contains("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"),
        "{e}"
    );
    // TLS 1.2 suites only, with TLS 1.3 the minimum: nothing usable either.
    let twelve = ["ECDHE-RSA-AES128-GCM-SHA256"].map(String::from).to_vec();
    let e = TlsPolicy::parse("VersionTLS13", &twelve).unwrap_err();
    assert!(e.contains("with TLS 1.3 and up"), "{e}");
}
