//! The webhook's one error type: what can fail while answering an admission review (and while
//! loading the serving certificate), each kind with a fixed metric label so failed reviews are
//! counted by cause in `das_webhook_admission_requests_total{outcome="error",cause}`.
//!
//! A denial is not an error: a pod the translation refuses is answered with
//! [`crate::translate::Denial`]'s reasons and counted as `denied`. The binary turns these
//! errors into `anyhow` at its edge; nothing in the library returns a `String` or `anyhow`
//! error.

use std::path::PathBuf;

use kube::core::admission::{ConvertAdmissionReviewError, SerializePatchError};
use tokio_rustls::rustls;

/// Something the webhook could not do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The body is an AdmissionReview without a request.
    #[error("bad AdmissionReview: {0}")]
    BadReview(#[source] ConvertAdmissionReviewError),
    /// Listing the DeviceClasses (the offered profiles) failed.
    #[error("list DeviceClasses: {0}")]
    ListClasses(#[source] kube::Error),
    /// Listing the DAS ResourceSlices (how many slices fit on a node) failed.
    #[error("list ResourceSlices: {0}")]
    ListSlices(#[source] kube::Error),
    /// Creating a ResourceClaimTemplate failed.
    #[error("create ResourceClaimTemplate {namespace}/{name}: {source}")]
    CreateTemplate {
        /// The pod's namespace.
        namespace: String,
        /// The template.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Reading a ResourceClaimTemplate that already existed failed.
    #[error("read ResourceClaimTemplate {namespace}/{name}: {source}")]
    ReadTemplate {
        /// The pod's namespace.
        namespace: String,
        /// The template.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// A ResourceClaimTemplate of the name the webhook uses asks for something else (edited,
    /// or someone else's): the webhook never puts pods on it silently.
    #[error(
        "ResourceClaimTemplate {namespace}/{name} exists but {why}; das-webhook will not put pods on it: delete it (`kubectl delete resourceclaimtemplate -n {namespace} {name}`) and das-webhook creates the right one"
    )]
    TemplateMismatch {
        /// The pod's namespace.
        namespace: String,
        /// The template.
        name: String,
        /// What it asks for that the webhook's would not.
        why: String,
    },
    /// The JSON patch of the answer could not be serialized.
    #[error("{0}")]
    Patch(#[source] SerializePatchError),
    /// A certificate or key file could not be read or parsed.
    #[error("read {path}: {source}")]
    ReadPem {
        /// The file.
        path: PathBuf,
        /// What the PEM reader said.
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    /// The certificate file holds no certificate.
    #[error("no certificate in {0}")]
    NoCertificate(PathBuf),
    /// The private key is of a kind rustls cannot sign with.
    #[error("unusable private key: {0}")]
    UnusableKey(#[source] rustls::Error),
    /// The certificate and the private key are not a pair.
    #[error("certificate and key do not match: {0}")]
    KeyMismatch(#[source] rustls::Error),
    /// The TLS configuration could not be built.
    #[error("TLS protocol versions: {0}")]
    TlsConfig(#[source] rustls::Error),
}

impl Error {
    /// The `cause` label of a failed review in `das_webhook_admission_requests_total`: one
    /// fixed value per kind of failure, so the metric's cardinality stays bounded (names and
    /// messages go to the answer and the log).
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::BadReview(_) => "bad_review",
            Self::ListClasses(_) => "list_classes",
            Self::ListSlices(_) => "list_slices",
            Self::CreateTemplate { .. } => "create_template",
            Self::ReadTemplate { .. } => "read_template",
            Self::TemplateMismatch { .. } => "template_mismatch",
            Self::Patch(_) => "patch",
            Self::ReadPem { .. } => "read_pem",
            Self::NoCertificate(_) => "no_certificate",
            Self::UnusableKey(_) => "unusable_key",
            Self::KeyMismatch(_) => "key_mismatch",
            Self::TlsConfig(_) => "tls_config",
        }
    }
}

/// A result of the webhook.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests;
