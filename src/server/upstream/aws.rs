//! What the AWS kinds (SageMaker, Bedrock) share: credentials from the standard environment
//! variables and shared files (session tokens included), the region, and SigV4 by the AWS
//! SDK's own signer (`aws-sigv4`). Their streams' framing: `eventstream.rs`.
//!
//! Credentials are read for every request, so rotated keys (a new session token in the
//! environment of a restarted sidecar, a refreshed credentials file) are picked up.

use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings};
use aws_sigv4::sign::v4;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::SystemTime;

/// One set of AWS credentials.
pub(super) struct Credentials {
    access_key: String,
    secret_key: String,
    session_token: Option<String>,
}

fn env(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.is_empty())
}

fn home_file(var: &str, rest: &str) -> Option<PathBuf> {
    env(var)
        .map(PathBuf::from)
        .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".aws").join(rest)))
}

/// An INI file's sections: name → key → value.
fn ini(text: &str) -> HashMap<String, HashMap<String, String>> {
    let mut out: HashMap<String, HashMap<String, String>> = HashMap::new();
    let mut section = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = s.trim().to_string();
            continue;
        }
        if let Some((k, v)) = line.split_once('=') {
            out.entry(section.clone())
                .or_default()
                .insert(k.trim().to_lowercase(), v.trim().to_string());
        }
    }
    out
}

/// The credentials to sign with: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and
/// `AWS_SESSION_TOKEN` where no profile is named; else (or without them) the profile
/// (`profile`, `$AWS_PROFILE`, `default`) of the shared credentials file
/// (`$AWS_SHARED_CREDENTIALS_FILE`, `~/.aws/credentials`), then of the config file
/// (`$AWS_CONFIG_FILE`, `~/.aws/config`, section `[profile NAME]`).
pub(super) fn credentials(profile: Option<&str>) -> Result<Credentials, String> {
    if profile.is_none() {
        if let (Some(a), Some(s)) = (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
            return Ok(Credentials {
                access_key: a,
                secret_key: s,
                session_token: env("AWS_SESSION_TOKEN"),
            });
        }
    }
    let name = profile
        .map(str::to_string)
        .or_else(|| env("AWS_PROFILE"))
        .unwrap_or_else(|| "default".into());
    let files = [
        (
            home_file("AWS_SHARED_CREDENTIALS_FILE", "credentials"),
            name.clone(),
        ),
        (
            home_file("AWS_CONFIG_FILE", "config"),
            if name == "default" {
                name.clone()
            } else {
                format!("profile {name}")
            },
        ),
    ];
    for (path, section) in files {
        let Some(text) = path.and_then(|p| std::fs::read_to_string(p).ok()) else {
            continue;
        };
        let sections = ini(&text);
        let Some(s) = sections.get(&section) else {
            continue;
        };
        if let (Some(a), Some(k)) = (s.get("aws_access_key_id"), s.get("aws_secret_access_key")) {
            return Ok(Credentials {
                access_key: a.clone(),
                secret_key: k.clone(),
                session_token: s.get("aws_session_token").cloned(),
            });
        }
    }
    Err(format!(
        "no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), or give profile '{name}' in ~/.aws/credentials"
    ))
}

/// The region: the upstream's own, else `$AWS_REGION` or `$AWS_DEFAULT_REGION`.
pub(super) fn region(own: Option<&str>) -> Option<String> {
    own.map(str::to_string)
        .or_else(|| env("AWS_REGION"))
        .or_else(|| env("AWS_DEFAULT_REGION"))
}

/// Sign `req` (its method, URL, headers and body) for `service` in `region`: the SDK's
/// signer gives the `authorization`, `x-amz-date` and (with a session) `x-amz-security-token`
/// headers.
pub(super) fn sign(
    req: &mut reqwest::Request,
    creds: &Credentials,
    region: &str,
    service: &str,
) -> Result<(), String> {
    let identity = aws_credential_types::Credentials::new(
        &creds.access_key,
        &creds.secret_key,
        creds.session_token.clone(),
        None,
        "kerze",
    )
    .into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(service)
        .time(SystemTime::now())
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| format!("SigV4: {e}"))?
        .into();
    let headers: Vec<(String, String)> = req
        .headers()
        .iter()
        .filter_map(|(k, v)| Some((k.as_str().to_string(), v.to_str().ok()?.to_string())))
        .collect();
    let body = req.body().and_then(|b| b.as_bytes()).unwrap_or(&[]);
    let signable = SignableRequest::new(
        req.method().as_str(),
        req.url().as_str(),
        headers.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        SignableBody::Bytes(body),
    )
    .map_err(|e| format!("SigV4: {e}"))?;
    let (instructions, _) = aws_sigv4::http_request::sign(signable, &params)
        .map_err(|e| format!("SigV4: {e}"))?
        .into_parts();
    let (add, _) = instructions.into_parts();
    for h in add {
        let name = reqwest::header::HeaderName::from_static(h.name());
        let value = reqwest::header::HeaderValue::from_str(h.value())
            .map_err(|e| format!("SigV4 header {}: {e}", h.name()))?;
        req.headers_mut().insert(name, value);
    }
    Ok(())
}

/// `s` as one URL path segment: every byte but the unreserved ones percent-encoded (a
/// Bedrock model id's `:`, an inference profile's ARN).
pub(super) fn path_segment(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments() {
        assert_eq!(
            path_segment("anthropic.claude-3-haiku-20240307-v1:0"),
            "anthropic.claude-3-haiku-20240307-v1%3A0"
        );
        assert_eq!(path_segment("a/b c"), "a%2Fb%20c");
    }

    #[test]
    fn shared_files() {
        let s =
            ini("[default]\naws_access_key_id = A\n# c\n[profile x]\nAWS_Secret_Access_Key=B\n");
        assert_eq!(s["default"]["aws_access_key_id"], "A");
        assert_eq!(s["profile x"]["aws_secret_access_key"], "B");
    }
}
