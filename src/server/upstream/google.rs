//! A Google service account's OAuth access token for Vertex AI: the JWT bearer grant (RFC
//! 7523) that Google's client libraries run. The key file's private key signs (RS256, by
//! `jsonwebtoken`) a one-hour assertion for the scope; its `token_uri` trades it for an
//! access token and its `expires_in`.

use std::time::{Duration, SystemTime};

/// Vertex AI's scope.
const CLOUD_PLATFORM: &str = "https://www.googleapis.com/auth/cloud-platform";

pub(super) struct ServiceAccount {
    email: String,
    key: jsonwebtoken::EncodingKey,
    key_id: Option<String>,
    token_uri: String,
    scope: String,
    path: String,
}

#[derive(serde::Deserialize)]
struct KeyFile {
    #[serde(rename = "type")]
    kind: String,
    client_email: String,
    private_key: String,
    #[serde(default)]
    private_key_id: Option<String>,
    token_uri: String,
}

#[derive(serde::Serialize)]
struct Claims<'a> {
    iss: &'a str,
    scope: &'a str,
    aud: &'a str,
    iat: u64,
    exp: u64,
}

impl ServiceAccount {
    /// The service account of a key file (JSON, `"type": "service_account"`).
    pub(super) fn read(path: &std::path::Path, scope: Option<&str>) -> Result<Self, String> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("the service account file {shown} cannot be read: {e}"))?;
        let f: KeyFile = serde_json::from_str(&text)
            .map_err(|e| format!("the service account file {shown} is not a key file: {e}"))?;
        if f.kind != "service_account" {
            return Err(format!(
                "the service account file {shown} is of type {:?}, not service_account",
                f.kind
            ));
        }
        let key = jsonwebtoken::EncodingKey::from_rsa_pem(f.private_key.as_bytes())
            .map_err(|e| format!("the service account file {shown}: its private key: {e}"))?;
        Ok(ServiceAccount {
            email: f.client_email,
            key,
            key_id: f.private_key_id,
            token_uri: f.token_uri,
            scope: scope.unwrap_or(CLOUD_PLATFORM).to_string(),
            path: shown,
        })
    }

    /// A fresh access token and its lifetime.
    pub(super) async fn token(
        &self,
        client: &reqwest::Client,
    ) -> Result<(String, Option<Duration>), String> {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
        header.kid = self.key_id.clone();
        let claims = Claims {
            iss: &self.email,
            scope: &self.scope,
            aud: &self.token_uri,
            iat: now,
            exp: now + 3600,
        };
        let assertion = jsonwebtoken::encode(&header, &claims, &self.key)
            .map_err(|e| format!("the service account {}: signing: {e}", self.email))?;
        let form = format!(
            "grant_type={}&assertion={assertion}",
            "urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer"
        );
        let resp = client
            .post(&self.token_uri)
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(form)
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .map_err(|e| {
                format!(
                    "the token endpoint {} cannot be reached: {e}",
                    self.token_uri
                )
            })?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        if !status.is_success() {
            return Err(format!(
                "the token endpoint refused the service account {} of {} ({status}): {}",
                self.email,
                self.path,
                text.chars().take(300).collect::<String>()
            ));
        }
        super::token::parse_token(&text).map_err(|e| format!("the token endpoint's answer: {e}"))
    }
}
