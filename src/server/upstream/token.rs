//! A bearer token as a token command or an OAuth token endpoint hands it out: the token
//! alone, or OAuth's JSON with its lifetime.

use std::time::{Duration, SystemTime};

/// A command's output: the token alone, or OAuth-shaped JSON (`access_token` or `token`,
/// `expires_in` seconds or `expires_at` epoch seconds), and its lifetime when stated.
pub(super) fn parse_token(out: &str) -> Result<(String, Option<Duration>), String> {
    let out = out.trim();
    if out.starts_with('{') {
        let v: serde_json::Value =
            serde_json::from_str(out).map_err(|e| format!("its JSON does not parse: {e}"))?;
        let token = v
            .get("access_token")
            .or_else(|| v.get("token"))
            .and_then(|t| t.as_str())
            .filter(|t| !t.is_empty())
            .ok_or("its JSON has no `access_token` (or `token`) string")?;
        let lifetime = if let Some(s) = v.get("expires_in").and_then(|s| s.as_f64()) {
            Some(s)
        } else if let Some(at) = v.get("expires_at").and_then(|s| s.as_f64()) {
            let now = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            Some(at - now)
        } else {
            None
        };
        let lifetime = lifetime.map(|s| Duration::from_secs_f64(s.clamp(0.0, 86_400.0 * 30.0)));
        return Ok((token.to_string(), lifetime));
    }
    if out.is_empty() || out.contains(char::is_whitespace) {
        return Err("its output is not one token (nor OAuth JSON)".into());
    }
    Ok((out.to_string(), None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_output() {
        assert_eq!(parse_token("abc\n").unwrap(), ("abc".into(), None));
        let (t, l) =
            parse_token(r#"{"access_token":"x","expires_in":3599,"token_type":"Bearer"}"#).unwrap();
        assert_eq!((t.as_str(), l), ("x", Some(Duration::from_secs(3599))));
        assert!(parse_token("two words").is_err());
        assert!(parse_token("{\"expires_in\":3}").is_err());
        assert!(parse_token("").is_err());
    }
}
