//! Who may read `/metrics`: anyone who reaches the port (`--metrics-auth=none`, the default), or
//! only a caller whose bearer token the API server authenticates (TokenReview) and authorizes for
//! `get` on the non-resource URL `/metrics` (SubjectAccessReview): `--metrics-auth=tokenreview`.
//! `/healthz` and `/readyz` are never guarded (the kubelet's probes carry no token).
//!
//! This is what kube-rbac-proxy and controller-runtime's `WithAuthenticationAndAuthorization`
//! metrics filter do, and what kube-scheduler and kube-controller-manager do for their own
//! `/metrics` (delegated authentication and authorization, "Authenticating with TokenReview" and
//! "Checking API access" in <https://kubernetes.io/docs/reference/access-authn-authz/>): the same
//! ClusterRole rule (`nonResourceURLs: [/metrics]`, `verbs: [get]`) that lets Prometheus scrape
//! those lets it scrape DAS.
//!
//! Answers: no token, a malformed `Authorization` header or a token the API server does not
//! authenticate: 401 (with `WWW-Authenticate: Bearer`); authenticated but not authorized: 403;
//! a review that fails (API server unreachable, our own RBAC missing): 503. A caller that passed
//! both reviews is remembered for [`ALLOWED_TTL`] under an HMAC-SHA256 of its token (a key drawn
//! at start-up), never the token itself: the token is only held while its request is answered.
//! Refusals are not remembered, so a token revoked or a binding removed takes effect within the
//! TTL, and a flood of bad tokens cannot fill the memory.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use clap::{Args, ValueEnum};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

/// The path guarded, and the non-resource URL the SubjectAccessReview asks about.
pub const METRICS_PATH: &str = "/metrics";
/// The verb the SubjectAccessReview asks about (an HTTP GET of a non-resource URL).
pub const METRICS_VERB: &str = "get";
/// How long a caller that passed both reviews is let in without asking again. Short, so that a
/// revoked token or a removed binding stops working within a minute; long enough that a
/// Prometheus scraping every 30 s costs the API server two reviews a minute per target at most.
pub const ALLOWED_TTL: Duration = Duration::from_secs(60);
/// Most callers remembered at once (one per Prometheus replica and token in practice). Past it a
/// new caller is still let in, only not remembered until expired entries make room.
pub const MAX_REMEMBERED: usize = 1024;

/// How `/metrics` is protected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum MetricsAuth {
    /// Served to anyone who reaches the port.
    #[default]
    None,
    /// A bearer token the API server authenticates (TokenReview) and authorizes for `get` on
    /// `/metrics` (SubjectAccessReview).
    #[value(name = "tokenreview")]
    TokenReview,
}

/// The `--metrics-auth` flag.
#[derive(Args, Debug, Clone, Default)]
pub struct MetricsAuthArgs {
    /// Who may read /metrics: `none` (anyone who reaches the port) or `tokenreview` (a bearer
    /// token that the API server authenticates (TokenReview) and authorizes for `get` on the
    /// non-resource URL /metrics (SubjectAccessReview); the service account needs `create` on
    /// tokenreviews and subjectaccessreviews). /healthz and /readyz stay open.
    #[arg(
        long = "metrics-auth",
        env = "DAS_METRICS_AUTH",
        value_enum,
        default_value_t
    )]
    pub metrics_auth: MetricsAuth,
}

impl MetricsAuthArgs {
    /// The access rule of the flag; `client` makes the reviews (`tokenreview` only).
    pub fn access(&self, client: &kube::Client) -> MetricsAccess {
        match self.metrics_auth {
            MetricsAuth::None => MetricsAccess::Open,
            MetricsAuth::TokenReview => {
                MetricsAccess::reviewed(Arc::new(KubeReviewer::new(client.clone())))
            }
        }
    }
}

/// The future of one review.
pub type Review<'a, T> = Pin<Box<dyn Future<Output = anyhow::Result<T>> + Send + 'a>>;

/// Asks who a token belongs to and what they may do: the API server ([`KubeReviewer`]), or a
/// fake in tests.
pub trait Reviewer: Send + Sync {
    /// The user of `token`, or `None` when it is not authenticated.
    ///
    /// # Errors
    /// The review could not be made.
    fn authenticate<'a>(&'a self, token: &'a str) -> Review<'a, Option<UserInfo>>;

    /// Whether `user` may `verb` the non-resource URL `path`.
    ///
    /// # Errors
    /// The review could not be made.
    fn authorize<'a>(
        &'a self,
        user: &'a UserInfo,
        verb: &'a str,
        path: &'a str,
    ) -> Review<'a, bool>;
}

/// Reviews through the API server: `authentication.k8s.io/v1` TokenReview and
/// `authorization.k8s.io/v1` SubjectAccessReview (both `create`).
pub struct KubeReviewer {
    client: kube::Client,
}

impl KubeReviewer {
    /// Reviews made with `client`.
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

impl Reviewer for KubeReviewer {
    fn authenticate<'a>(&'a self, token: &'a str) -> Review<'a, Option<UserInfo>> {
        Box::pin(async move {
            let review = TokenReview {
                // No audiences: the API server checks the token against its own, as for a
                // request to itself (a pod's projected service-account token carries them).
                spec: TokenReviewSpec {
                    audiences: None,
                    token: token.to_string(),
                },
                ..Default::default()
            };
            let answer = Api::<TokenReview>::all(self.client.clone())
                .create(&PostParams::default(), &review)
                .await
                .context("create a TokenReview (needs create on tokenreviews)")?;
            let status = answer.status.unwrap_or_default();
            if let Some(error) = status.error.filter(|e| !e.is_empty()) {
                tracing::debug!(%error, "token not authenticated");
            }
            Ok(status
                .authenticated
                .unwrap_or(false)
                .then_some(status.user)
                .flatten())
        })
    }

    fn authorize<'a>(
        &'a self,
        user: &'a UserInfo,
        verb: &'a str,
        path: &'a str,
    ) -> Review<'a, bool> {
        Box::pin(async move {
            let review = SubjectAccessReview {
                spec: SubjectAccessReviewSpec {
                    user: user.username.clone(),
                    uid: user.uid.clone(),
                    groups: user.groups.clone(),
                    extra: user.extra.clone(),
                    non_resource_attributes: Some(NonResourceAttributes {
                        path: Some(path.to_string()),
                        verb: Some(verb.to_string()),
                    }),
                    resource_attributes: None,
                },
                ..Default::default()
            };
            let answer = Api::<SubjectAccessReview>::all(self.client.clone())
                .create(&PostParams::default(), &review)
                .await
                .context("create a SubjectAccessReview (needs create on subjectaccessreviews)")?;
            let status = answer.status.unwrap_or_default();
            if let Some(error) = status.evaluation_error.filter(|e| !e.is_empty()) {
                tracing::debug!(%error, "SubjectAccessReview evaluation error");
            }
            Ok(status.allowed && !status.denied.unwrap_or(false))
        })
    }
}

/// Who may read `/metrics`; cheap to clone.
#[derive(Clone, Default)]
pub enum MetricsAccess {
    /// Anyone.
    #[default]
    Open,
    /// Callers the reviews let in.
    Reviewed(Arc<AccessReviews>),
}

impl std::fmt::Debug for MetricsAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Open => "Open",
            Self::Reviewed(_) => "Reviewed",
        })
    }
}

impl MetricsAccess {
    /// Callers `reviewer` lets in, remembered for [`ALLOWED_TTL`].
    pub fn reviewed(reviewer: Arc<dyn Reviewer>) -> Self {
        Self::Reviewed(Arc::new(AccessReviews::new(reviewer, ALLOWED_TTL)))
    }

    /// Whether the request with `headers` may read `/metrics`: `Ok`, or the refusal to answer.
    pub async fn check(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        match self {
            Self::Open => Ok(()),
            Self::Reviewed(reviews) => reviews.check(headers).await,
        }
    }
}

/// Why a request for `/metrics` is refused; its response says so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No bearer token, or one the API server does not authenticate: 401.
    Unauthenticated,
    /// Authenticated as this user, who may not get `/metrics`: 403.
    Forbidden(String),
    /// A review could not be made: 503.
    Unavailable,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Self::Unauthenticated => (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                "Unauthorized",
            )
                .into_response(),
            Self::Forbidden(user) => (
                StatusCode::FORBIDDEN,
                format!("Forbidden: user {user:?} may not {METRICS_VERB} {METRICS_PATH}"),
            )
                .into_response(),
            Self::Unavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "cannot review the request's token now",
            )
                .into_response(),
        }
    }
}

/// The reviews and the callers they let in recently.
pub struct AccessReviews {
    reviewer: Arc<dyn Reviewer>,
    /// HMAC-SHA256 key of the remembered tokens, drawn at start-up: a token's mark cannot be
    /// computed outside this process, and no two tokens share one in practice (a fast
    /// non-cryptographic hash such as FNV could be made to collide with a remembered token).
    key: ring::hmac::Key,
    ttl: Duration,
    /// HMAC of the token → when it must be reviewed again.
    allowed: Mutex<HashMap<[u8; 32], Instant>>,
}

impl AccessReviews {
    /// Reviews by `reviewer`; a caller let in is remembered for `ttl`.
    ///
    /// # Panics
    /// The system's random number generator fails (ring's `SystemRandom`).
    pub fn new(reviewer: Arc<dyn Reviewer>, ttl: Duration) -> Self {
        let rng = ring::rand::SystemRandom::new();
        let key = ring::hmac::Key::generate(ring::hmac::HMAC_SHA256, &rng)
            .expect("the system's random number generator works");
        Self {
            reviewer,
            key,
            ttl,
            allowed: Mutex::new(HashMap::new()),
        }
    }

    fn mark(&self, token: &str) -> [u8; 32] {
        let tag = ring::hmac::sign(&self.key, token.as_bytes());
        let mut out = [0u8; 32];
        out.copy_from_slice(tag.as_ref());
        out
    }

    fn remembered(&self, mark: &[u8; 32], now: Instant) -> bool {
        let allowed = self.allowed.lock().unwrap_or_else(|p| p.into_inner());
        allowed.get(mark).is_some_and(|until| now < *until)
    }

    fn remember(&self, mark: [u8; 32], now: Instant) {
        let mut allowed = self.allowed.lock().unwrap_or_else(|p| p.into_inner());
        allowed.retain(|_, until| now < *until);
        if allowed.len() < MAX_REMEMBERED {
            allowed.insert(mark, now + self.ttl);
        }
    }

    /// Whether the request with `headers` may read `/metrics`.
    pub async fn check(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        let Some(token) = bearer_token(headers) else {
            return Err(Refusal::Unauthenticated);
        };
        let mark = self.mark(token);
        if self.remembered(&mark, Instant::now()) {
            return Ok(());
        }
        let user = match self.reviewer.authenticate(token).await {
            Ok(Some(user)) => user,
            Ok(None) => return Err(Refusal::Unauthenticated),
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "cannot review a /metrics token");
                return Err(Refusal::Unavailable);
            }
        };
        let name = user.username.clone().unwrap_or_default();
        match self
            .reviewer
            .authorize(&user, METRICS_VERB, METRICS_PATH)
            .await
        {
            Ok(true) => {
                self.remember(mark, Instant::now());
                Ok(())
            }
            Ok(false) => {
                tracing::debug!(user = %name, "refused /metrics: not authorized");
                Err(Refusal::Forbidden(name))
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), user = %name, "cannot authorize a /metrics request");
                Err(Refusal::Unavailable)
            }
        }
    }
}

/// The token of an `Authorization: Bearer <token>` header (the scheme is case-insensitive, as
/// the API server reads it); `None` when there is none, or it is empty or not text.
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_read_as_the_api_server_reads_them() {
        let h = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, v.parse().unwrap());
            h
        };
        assert_eq!(bearer_token(&h("Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(&h("bearer  abc ")), Some("abc"));
        assert_eq!(bearer_token(&h("Basic abc")), None);
        assert_eq!(bearer_token(&h("Bearer ")), None);
        assert_eq!(bearer_token(&h("Bearer")), None);
        assert_eq!(bearer_token(&HeaderMap::new()), None);
    }

    #[test]
    fn the_flag_reads_none_and_tokenreview() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            auth: MetricsAuthArgs,
        }
        let parse = |args: &[&str]| Cli::try_parse_from(args).map(|c| c.auth.metrics_auth);
        assert_eq!(parse(&["x"]).unwrap(), MetricsAuth::None);
        assert_eq!(
            parse(&["x", "--metrics-auth=tokenreview"]).unwrap(),
            MetricsAuth::TokenReview
        );
        assert!(parse(&["x", "--metrics-auth=basic"]).is_err());
    }
}
