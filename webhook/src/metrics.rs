//! Prometheus metrics of the webhook (docs/operations.md lists them), OpenMetrics text on
//! `/metrics`.
//!
//! Source: prometheus-client (<https://docs.rs/prometheus-client>).

use prometheus_client::encoding::{EncodeLabel, EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Labels of the request counter: how the review was answered and, for an error, why.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Outcome {
    /// `unchanged`, `patched`, `denied` or `error`.
    pub outcome: String,
    /// For `error` only: the error's label (`crate::error::Error::metric_label`). The other
    /// outcomes have no `cause` label at all, so their series are what they were before it.
    pub cause: Option<&'static str>,
}

impl EncodeLabelSet for Outcome {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        ("outcome", self.outcome.as_str()).encode(encoder.encode_label())?;
        if let Some(cause) = self.cause {
            ("cause", cause).encode(encoder.encode_label())?;
        }
        Ok(())
    }
}

/// Labels of the device-config review counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct ConfigReview {
    /// `ResourceClaim` or `ResourceClaimTemplate`.
    pub kind: String,
    /// `allowed`, `denied` or `error` (a review that could not be read).
    pub outcome: &'static str,
}

/// Labels of the shared-claim review counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct SharedClaimReview {
    /// `patched` (the namespace selector added), `unchanged`, `denied` or `error` (a review
    /// that could not be read).
    pub outcome: &'static str,
}

/// Every metric the webhook exports.
pub struct Metrics {
    /// The registry every metric below is in, prefixed `das_webhook`.
    pub registry: Registry,
    /// `das_webhook_admission_requests_total{outcome}` (and `cause` when `outcome="error"`).
    pub requests: Family<Outcome, Counter>,
    /// `das_webhook_denials_total`.
    pub denials: Counter,
    /// `das_webhook_device_config_reviews_total{kind,outcome}`: ResourceClaims and
    /// ResourceClaimTemplates whose configs for `mig.das.com` were checked (only those with such
    /// a config are sent, see the chart's matchConditions).
    pub config_reviews: Family<ConfigReview, Counter>,
    /// `das_webhook_shared_claim_reviews_total{outcome}`: ResourceClaims that ask for a shared
    /// class, reviewed for the selector that keeps shared slices within a namespace (only
    /// those are sent, see the chart's matchConditions).
    pub shared_claim_reviews: Family<SharedClaimReview, Counter>,
    /// `das_webhook_templates_created_total`.
    pub templates_created: Counter,
    /// `das_webhook_admission_duration_seconds`.
    pub latency: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("das_webhook");
        let requests = Family::<Outcome, Counter>::default();
        let denials = Counter::default();
        let config_reviews = Family::<ConfigReview, Counter>::default();
        let shared_claim_reviews = Family::<SharedClaimReview, Counter>::default();
        let templates_created = Counter::default();
        let latency = Histogram::new([
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
        ]);
        registry.register(
            "admission_requests",
            "Admission reviews answered, by outcome",
            requests.clone(),
        );
        registry.register("denials", "Pods denied", denials.clone());
        registry.register(
            "device_config_reviews",
            "ResourceClaims and templates whose device configs for mig.das.com were checked, by kind and outcome",
            config_reviews.clone(),
        );
        registry.register(
            "shared_claim_reviews",
            "ResourceClaims for a shared class reviewed for the namespace selector, by outcome",
            shared_claim_reviews.clone(),
        );
        registry.register(
            "templates_created",
            "ResourceClaimTemplates created",
            templates_created.clone(),
        );
        registry.register(
            "admission_duration_seconds",
            "Time to answer one admission review",
            latency.clone(),
        );
        Self {
            registry,
            requests,
            denials,
            config_reviews,
            shared_claim_reviews,
            templates_created,
            latency,
        }
    }
}

impl Metrics {
    /// Counts one review with `outcome`.
    pub fn count(&self, outcome: &str) {
        self.requests
            .get_or_create(&Outcome {
                outcome: outcome.to_string(),
                cause: None,
            })
            .inc();
    }

    /// Counts one review answered with an error, by `cause` (the error's `metric_label`).
    pub fn count_error(&self, cause: &'static str) {
        self.requests
            .get_or_create(&Outcome {
                outcome: "error".to_string(),
                cause: Some(cause),
            })
            .inc();
    }

    /// Counts one device-config review of `kind` with `outcome`.
    pub fn count_config_review(&self, kind: &str, outcome: &'static str) {
        self.config_reviews
            .get_or_create(&ConfigReview {
                kind: kind.to_string(),
                outcome,
            })
            .inc();
    }

    /// Counts one shared-claim review with `outcome`.
    pub fn count_shared_claim_review(&self, outcome: &'static str) {
        self.shared_claim_reviews
            .get_or_create(&SharedClaimReview { outcome })
            .inc();
    }

    /// The registry in OpenMetrics text format.
    pub fn encode(&self) -> String {
        das_runtime::probes::encode(&self.registry)
    }
}

#[cfg(test)]
mod tests;
