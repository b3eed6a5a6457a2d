//! Classification: a text → `[{ label, score }]`, sorted, the scores summing to 1.
//!
//! - **Zero-shot** (encoder): the text's embedding against each label's (its name or a
//!   description), cosine similarities → softmax at `temperature`. One encoder pass per text
//!   whatever the label count: label embeddings are computed once and kept by the session.
//! - **Few-shot** (encoder): label → example texts; nearest centroid (the normalised mean of
//!   the examples' embeddings, scored like zero-shot) or a multinomial logistic regression
//!   trained on the examples at call time (full-batch gradient descent in f64, fixed steps:
//!   deterministic, so a Python twin decides the same).
//! - **Generative** (decoder): each label's log-likelihood as the continuation of a prompt
//!   that shows the text and the labels; the prompt's KV is computed once and all the labels
//!   continue from it in one batched pass (branches that share the prompt's KV: see
//!   [`crate::score`]). Calibrated by the same scores after a content-free text ("contextual
//!   calibration"): a label the model likes whatever the text loses that bias.
//!
//! The math here is backend-free; a [`Session`](crate::session::Session) runs the model.
//!
//! The files: `call.rs` (labels, options, results), `math.rs` (the scoring math),
//! `session.rs` (the classification run on a session's model).

mod call;
mod math;
mod session;

pub use call::{
    labels_from_json, prompt, Classified, ClassifyOptions, ClassifyUsage, FewShot, Labels, Scored,
    CONTENT_FREE, DEFAULT_PROMPT, DEFAULT_TEMPERATURE,
};
pub use math::{
    by_similarity, centroid, ranked, Logistic, LOGISTIC_L2, LOGISTIC_RATE, LOGISTIC_STEPS,
};
