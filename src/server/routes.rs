//! The router: the routes, the fallbacks (404, 405), `/health` and `/v1/models`.

use super::access::{auth, cors};
use super::api_error::{ApiError, ApiResult};
use super::handlers::{chat_completions, completions, embeddings};
use super::state::AppState;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub(super) fn router(state: Arc<AppState>) -> Router {
    let v1 = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model))
        .route("/metrics", get(metrics))
        .route_layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            auth,
        ));
    let mut app = Router::new()
        .route("/health", get(health))
        .merge(v1)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(Arc::clone(&state));
    if let Some(cors) = cors(&state.opts.cors_origins) {
        app = app.layer(cors);
    }
    app
}

async fn not_found(req: Request<Body>) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no route {} {}", req.method(), req.uri().path()),
    )
}

async fn method_not_allowed(req: Request<Body>) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    match st.loaded.get() {
        None => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "Loading model").into_response(),
        Some(_) if st.draining.load(Ordering::SeqCst) => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "Shutting down").into_response()
        }
        Some(l) => Json(serde_json::json!({
            "status": "ok",
            "model": st.opts.model_id,
            "backend": l.info.backend,
            "slots": st.opts.slots.max(1),
            "queue": st.opts.queue,
            "requests": st.admission.in_house(),
        }))
        .into_response(),
    }
}

fn model_object(st: &AppState, id: &str, owner: &str) -> serde_json::Value {
    serde_json::json!({
        "id": id,
        "object": "model",
        "created": st.created,
        "owned_by": owner,
    })
}

/// The local model (owned by `kerze`), then each upstream's `serves` names (owned by
/// `upstream:NAME`).
async fn models(State(st): State<Arc<AppState>>) -> Json<serde_json::Value> {
    let mut data = vec![model_object(&st, &st.opts.model_id, "kerze")];
    for (m, u) in st.upstreams.models() {
        data.push(model_object(&st, m, &format!("upstream:{u}")));
    }
    Json(serde_json::json!({ "object": "list", "data": data }))
}

async fn model(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    if let Some((m, u)) = st.upstreams.models().find(|(m, _)| *m == id) {
        return Ok(Json(model_object(&st, m, &format!("upstream:{u}"))));
    }
    st.check_model(Some(&id))?;
    Ok(Json(model_object(&st, &st.opts.model_id, "kerze")))
}

/// The Prometheus text format, the gauges read now.
async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    let m = &st.metrics;
    m.in_house.set(st.admission.in_house() as i64);
    for u in st.upstreams.all() {
        m.breaker_open
            .with_label_values(&[u.name()])
            .set(i64::from(u.breaker_open()));
    }
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        m.render(),
    )
        .into_response()
}
