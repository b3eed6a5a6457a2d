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
    use wasm_bindgen::JsCast;
    let global = js_sys::global();
    if let Some(w) = global.dyn_ref::<web_sys::Window>() {
        if let Some(p) = w.performance() {
            return p.now();
        }
    }
    if let Some(w) = global.dyn_ref::<web_sys::WorkerGlobalScope>() {
        if let Some(p) = w.performance() {
            return p.now();
        }
    }
    js_sys::Date::now()
}
