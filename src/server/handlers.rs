//! The POST endpoints: chat completions, completions and embeddings, each body read within
//! the size limit and answered whole or as a stream. A generation goes to an upstream
//! ([`relay`]) where its model is one an upstream serves, or where the local route fails
//! for a reason an upstream takes; a local answer that fails midway is continued there.

use super::api_error::{ApiError, ApiResult};
use super::relay::{self, json_with, Ask};
use super::route::{Reason, Tag};
use super::slots::{Event, Input};
use super::state::{Answer, AppState};
use super::stream::{collect, sse, sse_json, Piece, Routing, Takeover};
use super::upstream::Endpoint;
use crate::openai::{self, ChatStream};
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::sync::Arc;
use std::time::Instant;

/// The body as JSON: 413 past the size limit, 400 when it does not parse, 408 when it has not
/// arrived within the body timeout (a `content-length` that promises more than is sent held
/// the connection until the client gave up). A body past the limit is read on (and dropped)
/// up to [`DRAIN_FACTOR`] × the limit, so that the client, still sending, gets the 413 rather
/// than a reset connection.
async fn read_json(st: &AppState, body: Body) -> ApiResult<serde_json::Value> {
    let wait = st.opts.body_timeout;
    tokio::time::timeout(wait, read_json_now(st, body))
        .await
        .unwrap_or_else(|_| {
            Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within {} s (the server's body timeout)",
                    wait.as_secs_f64()
                ),
            ))
        })
}

async fn read_json_now(st: &AppState, body: Body) -> ApiResult<serde_json::Value> {
    use futures_util::StreamExt;
    let limit = st.opts.max_body;
    let mut stream = body.into_data_stream();
    let mut bytes = Vec::new();
    let mut seen = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("the request body could not be read: {e}"),
            )
        })?;
        seen = seen.saturating_add(chunk.len());
        if seen <= limit {
            bytes.extend_from_slice(&chunk);
        } else if seen > limit.saturating_mul(DRAIN_FACTOR) {
            break;
        }
    }
    if seen > limit {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than {limit} bytes"),
        ));
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("the body is not valid JSON: {e}"),
        )
    })
}

/// How far past the limit a body is read (and dropped) before the 413.
const DRAIN_FACTOR: usize = 16;

pub(super) async fn chat_completions(
    State(st): State<Arc<AppState>>,
    body: Body,
) -> ApiResult<Response> {
    let arrived = Instant::now();
    let v = read_json(&st, body).await?;
    let ask = Ask::new(Endpoint::Chat, &v, arrived);
    if let Some(up) = relay::model_route(&st, &v) {
        return relay::answer(&st, Reason::Model, vec![up], &ask).await;
    }
    st.ready()?;
    let req = openai::parse_chat(&v).map_err(|e| ApiError::from_engine(&e))?;
    st.check_model(req.model.as_deref())?;
    let input = Input::Chat {
        messages: req.messages,
        chat: req.chat,
    };
    let Answer { rx, hit, seed } = match st.answer("chat", &v, input, &req.generate, arrived).await
    {
        Ok(a) => a,
        Err(e) => return relay::instead(&st, e, &ask).await,
    };
    let meta = st.meta("chatcmpl");
    let takeover = relay::takeover(&st, &ask);
    if !req.stream {
        let (text, finish, usage, took) = collect(rx, st.opts.timeout, takeover).await?;
        let answer = openai::chat_completion(&meta, &text, finish, &usage, req.tool_calls);
        let tag = took.unwrap_or_else(Tag::local);
        st.metrics.answered_with(&tag, &usage, arrived);
        return Ok(tagged(
            json_with(serde_json::to_value(answer).unwrap_or_default(), &tag),
            &tag,
            hit,
            seed,
        ));
    }
    let frames = ChatStream::new(meta, req.include_usage).with_tool_calls(req.tool_calls);
    let first = vec![sse_json(&frames.start())];
    let r = sse(
        first,
        rx,
        frames,
        st.opts.timeout,
        routing(&st, takeover, arrived),
        |f, ev| match ev {
            Piece::Text(t) => f.push(&t).iter().map(sse_json).collect(),
            Piece::End(finish, usage) => f.finish(finish, &usage).iter().map(sse_json).collect(),
        },
    );
    Ok(tagged(r, &Tag::local(), hit, seed))
}

/// A local stream's routing: tagged local, taken over where an upstream takes `error`,
/// counted in `/metrics` when done.
fn routing(st: &Arc<AppState>, takeover: Option<Takeover>, arrived: Instant) -> Routing {
    let st = Arc::clone(st);
    Routing {
        tag: Tag::local(),
        takeover,
        done: Box::new(move |tag, usage| st.metrics.answered_with(tag, usage, arrived)),
    }
}

/// `x-kerze-route`, `x-kerze-cache: hit | miss` on an answer the response cache may hold
/// (none when it is off or the request is not deterministic), and `x-kerze-seed` on a
/// sampled one: the seed it ran on (the request's, or the one drawn for it), which replays it.
fn tagged(mut r: Response, tag: &Tag, hit: Option<bool>, seed: Option<u64>) -> Response {
    relay::route_headers(&mut r, tag, hit);
    if let Some(s) = seed {
        r.headers_mut().insert("x-kerze-seed", HeaderValue::from(s));
    }
    r
}

pub(super) async fn completions(
    State(st): State<Arc<AppState>>,
    body: Body,
) -> ApiResult<Response> {
    let arrived = Instant::now();
    let v = read_json(&st, body).await?;
    let ask = Ask::new(Endpoint::Completions, &v, arrived);
    if let Some(up) = relay::model_route(&st, &v) {
        return relay::answer(&st, Reason::Model, vec![up], &ask).await;
    }
    st.ready()?;
    let req = openai::parse_completion(&v).map_err(|e| ApiError::from_engine(&e))?;
    st.check_model(req.model.as_deref())?;
    let input = match req.prompt {
        openai::Prompt::Text(t) => Input::Text(t),
        openai::Prompt::Ids(ids) => Input::Ids(ids),
    };
    let Answer { rx, hit, seed } = match st
        .answer("completions", &v, input, &req.generate, arrived)
        .await
    {
        Ok(a) => a,
        Err(e) => return relay::instead(&st, e, &ask).await,
    };
    let meta = st.meta("cmpl");
    let takeover = relay::takeover(&st, &ask);
    if !req.stream {
        let (text, finish, usage, took) = collect(rx, st.opts.timeout, takeover).await?;
        let answer = openai::text_completion(&meta, Some(&text), Some(finish), Some(&usage));
        let tag = took.unwrap_or_else(Tag::local);
        st.metrics.answered_with(&tag, &usage, arrived);
        return Ok(tagged(
            json_with(serde_json::to_value(answer).unwrap_or_default(), &tag),
            &tag,
            hit,
            seed,
        ));
    }
    let include_usage = req.include_usage;
    let r = sse(
        Vec::new(),
        rx,
        meta,
        st.opts.timeout,
        routing(&st, takeover, arrived),
        move |m, ev| match ev {
            Piece::Text(t) => vec![sse_json(&openai::text_completion(m, Some(&t), None, None))],
            Piece::End(finish, usage) => {
                let mut out = vec![sse_json(&openai::text_completion(
                    m,
                    Some(""),
                    Some(finish),
                    None,
                ))];
                if include_usage {
                    out.push(sse_json(&openai::text_completion(
                        m,
                        None,
                        None,
                        Some(&usage),
                    )));
                }
                out
            }
        },
    );
    Ok(tagged(r, &Tag::local(), hit, seed))
}

pub(super) async fn embeddings(State(st): State<Arc<AppState>>, body: Body) -> ApiResult<Response> {
    let arrived = Instant::now();
    let loaded = st.ready()?;
    let v = read_json(&st, body).await?;
    let req = openai::parse_embeddings(&v).map_err(|e| ApiError::from_engine(&e))?;
    st.check_model(req.model.as_deref())?;
    if !loaded.info.family.is_encoder() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "this server runs {}, a decoder: embeddings come from an encoder model (bert)",
                st.opts.model_id
            ),
        ));
    }
    if let Some(d) = req.dimensions.filter(|&d| d != loaded.info.n_embd as u64) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "dimensions {d}: this model gives {} (no other size)",
                loaded.info.n_embd
            ),
        ));
    }
    let input = Input::Embed {
        texts: req.input,
        opts: crate::embed::EmbedOptions::default(),
    };
    let (first, _rx) = st
        .queue(input, crate::generate::GenerateOptions::default(), arrived)
        .await?;
    match first {
        Event::Embedded(e) => Ok(Json(openai::embeddings_response(
            &st.opts.model_id,
            &e.data,
            e.usage.prompt_tokens,
            req.encoding_format,
        ))
        .into_response()),
        _ => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the slot answered an embedding request with something else",
        )),
    }
}
