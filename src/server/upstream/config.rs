//! An `[[upstream]]` table of `kerze serve --config FILE`, as typed fields: an unknown key is
//! refused with its line and the known keys (serde's `deny_unknown_fields` through `toml`).
//! Secrets never go in the file: it names an environment variable or a token command.

use crate::server::route::Reason;
use serde::Deserialize;
use std::collections::BTreeMap;

/// The kinds of upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Any OpenAI-compatible `…/v1`: OpenAI, Azure OpenAI's v1 API, Vertex AI's and
    /// Bedrock's OpenAI-compatible endpoints, the Gemini API, vLLM, llama-server, another
    /// `kerze serve`.
    Openai,
    /// A SageMaker endpoint (`/endpoints/{endpoint}/invocations`) whose container takes the
    /// OpenAI chat shape (LMI, TGI's Messages API); SigV4, service `sagemaker`.
    Sagemaker,
    /// Bedrock's Converse API (`/model/{id}/converse`); SigV4, service `bedrock`, or a
    /// Bedrock API key as bearer (`api_key_env`).
    Bedrock,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Openai => "openai",
            Kind::Sagemaker => "sagemaker",
            Kind::Bedrock => "bedrock",
        }
    }
}

/// A token command: a shell line (`sh -c`) or an argument vector.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Command {
    Shell(String),
    Argv(Vec<String>),
}

impl Command {
    pub fn argv(&self) -> Vec<String> {
        match self {
            Command::Shell(s) => vec!["sh".into(), "-c".into(), s.clone()],
            Command::Argv(a) => a.clone(),
        }
    }
}

fn default_when() -> Vec<Reason> {
    vec![Reason::Model, Reason::Busy, Reason::Context, Reason::Error]
}

fn default_timeout() -> f64 {
    120.0
}

fn default_breaker_failures() -> u32 {
    5
}

fn default_breaker_cooldown() -> f64 {
    30.0
}

/// One `[[upstream]]` table.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    /// What the route names (`upstream:NAME`), the metrics and the errors say.
    pub name: String,
    pub kind: Kind,
    /// `openai`: the base URL, up to and with `/v1` (`…/chat/completions` is appended). The
    /// AWS kinds: their runtime's base URL (default: the region's).
    #[serde(default)]
    pub url: Option<String>,
    /// The model name sent upstream (default: the request's own).
    #[serde(default)]
    pub model: Option<String>,
    /// The request `model` names that go to this upstream (reason `model`); `/v1/models`
    /// lists them.
    #[serde(default)]
    pub serves: Vec<String>,
    /// The reasons it takes (default: model, busy, context, error).
    #[serde(default = "default_when")]
    pub when: Vec<Reason>,
    /// The AWS kinds: the region their default URL and signature name (default:
    /// `$AWS_REGION`, `$AWS_DEFAULT_REGION`).
    #[serde(default)]
    pub region: Option<String>,
    /// `sagemaker`: the endpoint's name.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// The AWS kinds: the shared files' profile whose credentials sign (default: the
    /// environment's `AWS_ACCESS_KEY_ID`…, then `$AWS_PROFILE` or `default`).
    #[serde(default)]
    pub profile: Option<String>,
    /// The environment variable that holds the bearer key.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// A command whose output is the bearer token: the token alone, or OAuth's JSON
    /// (`access_token` or `token`, with `expires_in` seconds or `expires_at` epoch seconds).
    /// Kept until shortly before it expires.
    #[serde(default)]
    pub token_command: Option<Command>,
    /// A Google service account's key file (JSON): its OAuth token (the JWT bearer grant,
    /// kept until shortly before it expires) is the bearer, as Vertex AI wants.
    #[serde(default)]
    pub service_account_file: Option<std::path::PathBuf>,
    /// The service account token's scope (default: cloud-platform).
    #[serde(default)]
    pub scope: Option<String>,
    /// How long a token command's plain output is kept (it states no expiry).
    #[serde(default)]
    pub token_ttl_s: Option<f64>,
    /// Headers sent with every request (not secrets: e.g. Azure's `api-version`).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Seconds a request may take upstream (whole answer, or the whole stream).
    #[serde(default = "default_timeout")]
    pub timeout_s: f64,
    #[serde(default)]
    pub requests_per_minute: Option<u32>,
    /// Requests per UTC day.
    #[serde(default)]
    pub requests_per_day: Option<u32>,
    /// Tokens (prompt and completion, as the upstream's usage counts them) per UTC day.
    #[serde(default)]
    pub tokens_per_day: Option<u64>,
    /// Failures in a row that open the circuit breaker (0: never).
    #[serde(default = "default_breaker_failures")]
    pub breaker_failures: u32,
    /// Seconds the breaker stays open before it lets one request try again.
    #[serde(default = "default_breaker_cooldown")]
    pub breaker_cooldown_s: f64,
}

impl UpstreamConfig {
    /// What is wrong with it on its own, at start (the process stops with the reason).
    pub fn check(&self) -> Result<(), String> {
        let n = &self.name;
        if n.is_empty() || n.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!(
                "upstream name {n:?}: give a name without spaces (the route says upstream:NAME)"
            ));
        }
        let bearers = [
            self.api_key_env.is_some(),
            self.token_command.is_some(),
            self.service_account_file.is_some(),
        ];
        let url = self.url.as_deref().unwrap_or("");
        let http = url.starts_with("http://") || url.starts_with("https://");
        match self.kind {
            Kind::Openai if !http => {
                return Err(format!(
                    "upstream {n}: kind 'openai' needs `url`, an http(s) base URL up to /v1 (got {url:?})"
                ));
            }
            Kind::Openai => {
                if self.profile.is_some() {
                    return Err(format!("upstream {n}: `profile` is for the AWS kinds"));
                }
            }
            Kind::Sagemaker | Kind::Bedrock => {
                let k = self.kind.as_str();
                if self.url.is_some() && !http {
                    return Err(format!("upstream {n}: `url` {url:?} is not an http(s) URL"));
                }
                if super::aws::region(self.region.as_deref()).is_none() {
                    return Err(format!(
                        "upstream {n}: kind '{k}' needs `region` (or $AWS_REGION)"
                    ));
                }
                if self.kind == Kind::Sagemaker && self.endpoint.as_deref().unwrap_or("").is_empty()
                {
                    return Err(format!(
                        "upstream {n}: kind 'sagemaker' needs `endpoint`, the endpoint's name"
                    ));
                }
                if self.kind == Kind::Bedrock && self.model.is_none() && self.serves.is_empty() {
                    return Err(format!(
                        "upstream {n}: kind 'bedrock' needs `model` (a model or inference profile id) or `serves`"
                    ));
                }
                let bearer = bearers.iter().any(|b| *b);
                if self.kind == Kind::Sagemaker && bearer {
                    return Err(format!("upstream {n}: kind 'sagemaker' signs with SigV4: no api_key_env or token_command"));
                }
                if !bearer {
                    super::aws::credentials(self.profile.as_deref())
                        .map_err(|e| format!("upstream {n}: {e}"))?;
                }
            }
        }
        if self.when.is_empty() {
            return Err(format!(
                "upstream {n}: `when` is empty: list the reasons it takes (model, busy, context, error)"
            ));
        }
        if self.when.contains(&Reason::LowConfidence) {
            return Err(format!(
                "upstream {n}: `when` lists low-confidence, which this build does not decide yet"
            ));
        }
        if self.when.contains(&Reason::Model) && self.serves.is_empty() && self.when.len() == 1 {
            return Err(format!(
                "upstream {n}: `when = [\"model\"]` needs `serves`, the model names it answers"
            ));
        }
        if bearers.iter().filter(|b| **b).count() > 1 {
            return Err(format!(
                "upstream {n}: give one of `api_key_env`, `token_command` and `service_account_file`"
            ));
        }
        if let Some(v) = &self.api_key_env {
            match std::env::var(v) {
                Ok(k) if !k.is_empty() => {}
                _ => {
                    return Err(format!(
                        "upstream {n}: the environment variable {v} (its api_key_env) is not set"
                    ))
                }
            }
        }
        if let Some(f) = &self.service_account_file {
            super::google::ServiceAccount::read(f, self.scope.as_deref())
                .map_err(|e| format!("upstream {n}: {e}"))?;
        }
        if let Some(Command::Argv(a)) = &self.token_command {
            if a.is_empty() {
                return Err(format!("upstream {n}: `token_command` is an empty list"));
            }
        }
        let positive = |what: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(format!(
                    "upstream {n}: `{what}` must be a positive number of seconds"
                ))
            }
        };
        positive("timeout_s", self.timeout_s)?;
        positive("breaker_cooldown_s", self.breaker_cooldown_s)?;
        if let Some(t) = self.token_ttl_s {
            positive("token_ttl_s", t)?;
        }
        for (k, v) in &self.headers {
            if reqwest::header::HeaderName::from_bytes(k.as_bytes()).is_err()
                || reqwest::header::HeaderValue::from_str(v).is_err()
            {
                return Err(format!(
                    "upstream {n}: the header {k:?} is not a valid header"
                ));
            }
        }
        Ok(())
    }
}
