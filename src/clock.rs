//! Milliseconds from a monotonic clock: `Instant` natively, `performance.now()` in wasm
//! (where `Instant::now()` panics).

#[cfg(not(target_arch = "wasm32"))]
pub fn now_ms() -> f64 {
    use std::sync::OnceLock;
    use std::time::Instant;
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_secs_f64() * 1000.0
}

#[cfg(target_arch = "wasm32")]
pub fn now_ms() -> f64 {
    thread_local! {
        /// The global's `performance`, found once: a failed `instanceof Window` in a worker
        /// throws and catches, tens of microseconds a call.
        static PERFORMANCE: Option<web_sys::Performance> = performance();
    }
    PERFORMANCE
        .with(|p| p.as_ref().map(web_sys::Performance::now))
        .unwrap_or_else(js_sys::Date::now)
}

#[cfg(target_arch = "wasm32")]
fn performance() -> Option<web_sys::Performance> {
    use wasm_bindgen::JsCast;
    let global = js_sys::global();
    if let Some(w) = global.dyn_ref::<web_sys::WorkerGlobalScope>() {
        return w.performance();
    }
    global.dyn_ref::<web_sys::Window>()?.performance()
}
