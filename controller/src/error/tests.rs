use std::collections::HashSet;

use super::*;

/// A 403 from the API server, as kube returns it.
fn forbidden() -> kube::Error {
    kube::Error::Api(Box::new(
        kube::core::Status::failure("forbidden", "Forbidden").with_code(403),
    ))
}

#[test]
fn every_kind_has_its_own_fixed_label_and_says_what_failed() {
    let name = || "c-gpu-0-mig-1g-10gb-6".to_string();
    let serde = serde_json::from_str::<u8>("x").unwrap_err();
    let all = [
        Error::MissingField {
            claim: "ns/c".into(),
            field: "metadata.uid",
        },
        Error::Serialize {
            name: name(),
            source: serde,
        },
        Error::Apply {
            name: name(),
            source: forbidden(),
        },
        Error::ApplyStatus {
            name: name(),
            source: forbidden(),
        },
        Error::Delete {
            name: name(),
            source: forbidden(),
        },
        Error::Lease(forbidden()),
        Error::LeaseTimeout(Duration::from_secs(10)),
    ];
    let labels: HashSet<_> = all.iter().map(Error::metric_label).collect();
    assert_eq!(labels.len(), all.len(), "{labels:?}");
    for e in &all {
        let label = e.metric_label();
        assert!(
            label.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
            "{label}"
        );
    }
    let apply = all[2].to_string();
    assert!(
        apply.starts_with("apply AllocationClaim c-gpu-0-mig-1g-10gb-6: ")
            && apply.contains("forbidden"),
        "the message names the object, then the API's error: {apply}"
    );
    assert!(std::error::Error::source(&all[2]).is_some());
    assert_eq!(all[0].to_string(), "ResourceClaim ns/c has no metadata.uid");
}
