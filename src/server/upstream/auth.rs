//! How an upstream's requests are authorized: a bearer key from an environment variable
//! (read once, at start), a bearer token from a command, kept until shortly before the
//! expiry its output states (Vertex AI's hour-long OAuth tokens: `gcloud auth
//! print-access-token`, or a service-account JWT flow behind a script), or AWS SigV4.

use super::aws;
use super::config::{Kind, UpstreamConfig};
use super::google::ServiceAccount;
use super::token::parse_token;
use std::time::{Duration, Instant};

pub(super) enum Auth {
    None,
    Bearer(String),
    /// A token fetched (from a command, or a service account's OAuth exchange) and kept.
    Fetched(Fetched),
    /// SigV4 for `service` in `region`, with the credentials of `profile` (or the
    /// environment's).
    SigV4 {
        service: &'static str,
        region: String,
        profile: Option<String>,
    },
}

pub(super) struct Fetched {
    source: Source,
    /// How long a token without a stated expiry is kept.
    ttl: Duration,
    /// The token and when to fetch again; one caller refreshes, the others wait.
    kept: tokio::sync::Mutex<Option<(String, Instant)>>,
}

enum Source {
    Command(Vec<String>),
    ServiceAccount(ServiceAccount),
}

/// How long a command may take to hand out a token.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

impl Auth {
    /// An upstream's auth: its `api_key_env`, `token_command` or `service_account_file` as a
    /// bearer; else SigV4 for the AWS kinds; else none.
    pub(super) fn new(cfg: &UpstreamConfig) -> Result<Self, String> {
        if let Some(v) = &cfg.api_key_env {
            return Ok(Auth::Bearer(std::env::var(v).unwrap_or_default()));
        }
        let source = match (&cfg.token_command, &cfg.service_account_file) {
            (Some(c), _) => Some(Source::Command(c.argv())),
            (None, Some(f)) => Some(Source::ServiceAccount(ServiceAccount::read(
                f,
                cfg.scope.as_deref(),
            )?)),
            (None, None) => None,
        };
        if let Some(source) = source {
            return Ok(Auth::Fetched(Fetched {
                source,
                ttl: Duration::from_secs_f64(cfg.token_ttl_s.unwrap_or(300.0)),
                kept: tokio::sync::Mutex::new(None),
            }));
        }
        let service = match cfg.kind {
            Kind::Openai => return Ok(Auth::None),
            Kind::Sagemaker => "sagemaker",
            Kind::Bedrock => "bedrock",
        };
        Ok(Auth::SigV4 {
            service,
            region: aws::region(cfg.region.as_deref()).unwrap_or_default(),
            profile: cfg.profile.clone(),
        })
    }

    /// Authorize `req`: its bearer header, or its SigV4 signature (over the body it holds).
    pub(super) async fn authorize(
        &self,
        req: &mut reqwest::Request,
        client: &reqwest::Client,
    ) -> Result<(), String> {
        let token = match self {
            Auth::None => return Ok(()),
            Auth::Bearer(k) => k.clone(),
            Auth::Fetched(f) => f.token(client).await?,
            Auth::SigV4 {
                service,
                region,
                profile,
            } => {
                let creds = aws::credentials(profile.as_deref())?;
                return aws::sign(req, &creds, region, service);
            }
        };
        let v = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| "the token is not a valid header value".to_string())?;
        req.headers_mut().insert(reqwest::header::AUTHORIZATION, v);
        Ok(())
    }

    /// The upstream refused the token (401): the next request fetches it again.
    pub(super) async fn refused(&self) -> bool {
        match self {
            Auth::Fetched(c) => {
                *c.kept.lock().await = None;
                true
            }
            _ => false,
        }
    }
}

impl Fetched {
    async fn token(&self, client: &reqwest::Client) -> Result<String, String> {
        let mut kept = self.kept.lock().await;
        if let Some((t, until)) = kept.as_ref() {
            if Instant::now() < *until {
                return Ok(t.clone());
            }
        }
        let (token, lifetime) = match &self.source {
            Source::Command(argv) => run(argv).await?,
            Source::ServiceAccount(sa) => sa.token(client).await?,
        };
        let lifetime = lifetime.unwrap_or(self.ttl);
        // Refreshed a little before it expires: a minute, or a quarter of a short lifetime.
        let margin = (lifetime / 4).min(Duration::from_secs(60));
        *kept = Some((token.clone(), Instant::now() + lifetime - margin));
        Ok(token)
    }
}

/// Run a token command: its token, and its lifetime where its output states one.
async fn run(argv: &[String]) -> Result<(String, Option<Duration>), String> {
    let shown = argv.join(" ");
    let mut cmd = tokio::process::Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(COMMAND_TIMEOUT, cmd.output())
        .await
        .map_err(|_| format!("the token command `{shown}` took longer than 30 s"))?
        .map_err(|e| format!("the token command `{shown}` did not run: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: String = err
            .trim()
            .chars()
            .rev()
            .take(300)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        return Err(format!(
            "the token command `{shown}` failed ({}): {tail}",
            out.status
        ));
    }
    parse_token(&String::from_utf8_lossy(&out.stdout))
        .map_err(|e| format!("the token command `{shown}`: {e}"))
}
