//! The gateway's route policy: why an answer comes from an upstream instead of the local
//! model, and the tag every answer carries. It follows the page's table (pkg/route-policy.js);
//! the reasons the gateway can see are these (the page's `unsupported`, `loading` and `slow`
//! belong to a visitor's device):
//!
//! | reason           | an upstream takes a request when …                              |
//! |------------------|------------------------------------------------------------------|
//! | `model`          | the request names one of its `serves` names                      |
//! | `busy`           | every slot and the queue are taken (instead of a 429)            |
//! | `context`        | the prompt is longer than the local context window               |
//! | `error`          | the local engine failed, also midway (the upstream continues it) |
//! | `low-confidence` | (the cascade's quality signal: not decided here yet)             |
//!
//! Every answer says where it came from: the header `x-kerze-route` (`local` or
//! `upstream:NAME`) and `kerze: { route, reason }` in the body or the stream's first chunk.

use serde::{Deserialize, Serialize};

/// Why a request goes to an upstream (an upstream's `when` lists those it takes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    Model,
    Busy,
    Context,
    Error,
    /// The seam for the cascade's quality signal (the local answer's confidence); nothing
    /// decides it yet, so a config that lists it is refused.
    LowConfidence,
}

impl Reason {
    pub const ALL: [Reason; 5] = [
        Reason::Model,
        Reason::Busy,
        Reason::Context,
        Reason::Error,
        Reason::LowConfidence,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Model => "model",
            Reason::Busy => "busy",
            Reason::Context => "context",
            Reason::Error => "error",
            Reason::LowConfidence => "low-confidence",
        }
    }
}

/// Where an answer came from, and why: `kerze: { route, reason }` in its body.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Tag {
    /// `local` or `upstream:NAME`.
    pub route: String,
    /// For a local answer `local`; else the [`Reason`].
    pub reason: String,
}

impl Tag {
    pub fn local() -> Self {
        Tag {
            route: "local".into(),
            reason: "local".into(),
        }
    }

    pub fn upstream(name: &str, reason: Reason) -> Self {
        Tag {
            route: format!("upstream:{name}"),
            reason: reason.as_str().into(),
        }
    }

    /// The route's label in `/metrics` and the header: `local` or `upstream:NAME`.
    pub fn route(&self) -> &str {
        &self.route
    }

    /// `v` (an answer or a stream chunk) with `kerze` set to this tag (an object's; anything
    /// else is left as it is).
    pub fn mark(&self, v: &mut serde_json::Value) {
        if let Some(m) = v.as_object_mut() {
            m.insert("kerze".into(), serde_json::json!(self));
        }
    }

    /// `json` (an answer or a stream chunk, serialized) with `kerze` set to this tag.
    pub fn stamp(&self, json: &str) -> String {
        match serde_json::from_str::<serde_json::Value>(json) {
            Ok(mut v @ serde_json::Value::Object(_)) => {
                self.mark(&mut v);
                v.to_string()
            }
            _ => json.to_string(),
        }
    }
}
