//! The bridges to the wasm modules the browser's engine loads on first use (the browser
//! builds leave both compilers out of the engine's module):
//!
//! - chat templates: the template module (src/jinja/, kerze-jinja's `module` feature) hands
//!   its `render` over with `setTemplateRenderer`; [`render_template`] calls it;
//! - constraints: the constraint module (src/guide/) hands its exports over with
//!   `setGuideModule`; [`guide::Vocabulary`] and [`guide::Matcher`] hold its numbers, with the
//!   interface kerze-guide's own types have natively.
//!
//! A leaf: it imports nothing of the crate. `chat/template.rs` and `constrain.rs` reach the
//! modules through here, never through the wasm boundary (src/wasm.rs) above them.

#[cfg(not(feature = "jinja"))]
use js_sys::Function;
#[cfg(not(feature = "jinja"))]
use std::cell::RefCell;
use wasm_bindgen::prelude::*;

/// A string property of a JS value (an `Error`'s `name` or `message`).
#[cfg(any(not(feature = "jinja"), not(feature = "guide")))]
fn js_field(v: &JsValue, key: &str) -> Option<String> {
    js_sys::Reflect::get(v, &JsValue::from_str(key))
        .ok()
        .and_then(|f| f.as_string())
}

/// What a lazily loaded module threw: its `Error`'s message, or the string it threw.
#[cfg(any(not(feature = "jinja"), not(feature = "guide")))]
fn thrown_message(e: &JsValue) -> Option<String> {
    js_field(e, "message").or_else(|| e.as_string())
}

#[cfg(not(feature = "jinja"))]
thread_local! {
    /// The template module's `render` (src/jinja/), handed over by the package.
    static TEMPLATE_RENDERER: RefCell<Option<Function>> = const { RefCell::new(None) };
}

/// The engine's module without the template engine (the browser builds): the package hands
/// it the template module's `render(source, contextJson, today)` once that module is loaded
/// (at the first chat that needs a template); `undefined` takes it back. Chat prompts with a
/// file's template fail with an `InvalidArgumentError` until then.
#[cfg(not(feature = "jinja"))]
#[wasm_bindgen(js_name = setTemplateRenderer)]
pub fn set_template_renderer(render: Option<Function>) {
    TEMPLATE_RENDERER.with(|r| *r.borrow_mut() = render);
}

/// Render through the template module (see [`set_template_renderer`]).
#[cfg(not(feature = "jinja"))]
pub(crate) fn render_template(
    source: &str,
    context: &serde_json::Value,
    today: kerze_jinja::Date,
) -> std::result::Result<String, kerze_jinja::RenderError> {
    use kerze_jinja::RenderError;
    let render = TEMPLATE_RENDERER
        .with(|r| r.borrow().clone())
        .ok_or_else(|| {
            RenderError::Failed(
                "the template module is not loaded (the package loads it before a chat)".into(),
            )
        })?;
    let text = render
        .call3(
            &JsValue::NULL,
            &JsValue::from_str(source),
            &JsValue::from_str(&context.to_string()),
            &JsValue::from_str(&today.to_string()),
        )
        .map_err(|e| {
            let message = thrown_message(&e).unwrap_or_else(|| "the template module failed".into());
            RenderError::from_name(&js_field(&e, "name").unwrap_or_default(), message)
        })?;
    text.as_string()
        .ok_or_else(|| RenderError::Failed("the template module returned no text".into()))
}

/// The engine's module without the constraint compiler (the browser builds): vocabularies
/// and matchers live in the constraint module (src/guide/), which the package loads at the
/// first constrained request and hands over (`setGuideModule`); these hold its numbers, with
/// the interface `constrain.rs` uses natively (kerze-guide's `Vocabulary` and `Matcher`).
#[cfg(not(feature = "guide"))]
pub(crate) mod guide {
    use js_sys::{Array, Function, Reflect, Uint32Array, Uint8Array};
    use std::cell::RefCell;
    use wasm_bindgen::prelude::*;

    thread_local! {
        /// The constraint module's exports.
        static MODULE: RefCell<Option<JsValue>> = const { RefCell::new(None) };
    }

    /// Hand over the constraint module's exports (`vocabulary`, `compile`, `mask`, `forced`,
    /// `consume`, `stopped`, `fork`, `free`, `freeVocabulary`); `undefined` takes them back.
    /// Constrained requests fail with an error until then.
    #[wasm_bindgen(js_name = setGuideModule)]
    pub fn set_guide_module(module: JsValue) {
        let module = (!module.is_undefined() && !module.is_null()).then_some(module);
        MODULE.with(|m| *m.borrow_mut() = module);
    }

    /// Call the module's `name` with `args`; its error's message.
    fn call(name: &str, args: &[JsValue]) -> Result<JsValue, String> {
        let module = MODULE.with(|m| m.borrow().clone()).ok_or_else(|| {
            "the constraint module is not loaded (the package loads it before a constrained request)"
                .to_string()
        })?;
        let f: Function = Reflect::get(&module, &JsValue::from_str(name))
            .ok()
            .and_then(|f| f.dyn_into().ok())
            .ok_or_else(|| format!("the constraint module has no `{name}`"))?;
        f.apply(&JsValue::NULL, &args.iter().collect::<Array>())
            .map_err(|e| {
                super::thrown_message(&e)
                    .unwrap_or_else(|| format!("the constraint module's `{name}` failed"))
            })
    }

    fn number(v: JsValue, what: &str) -> Result<u32, String> {
        v.as_f64()
            .map(|n| n as u32)
            .ok_or_else(|| format!("the constraint module's `{what}` gave no number"))
    }

    fn words(v: JsValue, what: &str) -> Result<Vec<u32>, String> {
        v.dyn_into::<Uint32Array>()
            .map(|a| a.to_vec())
            .map_err(|_| format!("the constraint module's `{what}` gave no Uint32Array"))
    }

    /// A vocabulary in the constraint module.
    pub struct Vocabulary {
        id: u32,
        len: usize,
        /// The tokenizer the module calls for forced bytes (alive as long as the vocabulary).
        _tokenize: Closure<dyn Fn(Uint8Array) -> JsValue>,
    }

    impl Vocabulary {
        pub fn new(
            words: &[Vec<u8>],
            eos: u32,
            tokenize: kerze_guide::Tokenize,
        ) -> Result<Self, String> {
            let total: usize = words.iter().map(Vec::len).sum();
            let mut bytes = Vec::with_capacity(total);
            let mut offsets = Vec::with_capacity(words.len() + 1);
            for w in words {
                offsets.push(bytes.len() as u32);
                bytes.extend_from_slice(w);
            }
            offsets.push(bytes.len() as u32);
            let closure =
                Closure::<dyn Fn(Uint8Array) -> JsValue>::new(move |b: Uint8Array| match tokenize(
                    &b.to_vec(),
                ) {
                    Some(ids) => Uint32Array::from(ids.as_slice()).into(),
                    None => JsValue::UNDEFINED,
                });
            let id = number(
                call(
                    "vocabulary",
                    &[
                        Uint8Array::from(bytes.as_slice()).into(),
                        Uint32Array::from(offsets.as_slice()).into(),
                        eos.into(),
                        closure.as_ref().clone(),
                    ],
                )?,
                "vocabulary",
            )?;
            Ok(Self {
                id,
                len: words.len(),
                _tokenize: closure,
            })
        }

        pub fn len(&self) -> usize {
            self.len
        }

        pub fn compile(&self, grammar: &kerze_guide::Grammar) -> Result<Matcher, String> {
            let g = serde_json::to_string(grammar).map_err(|e| e.to_string())?;
            let id = number(call("compile", &[self.id.into(), g.into()])?, "compile")?;
            Ok(Matcher { id })
        }
    }

    impl Drop for Vocabulary {
        fn drop(&mut self) {
            let _ = call("freeVocabulary", &[self.id.into()]);
        }
    }

    /// A matcher in the constraint module.
    pub struct Matcher {
        id: u32,
    }

    impl Matcher {
        pub fn mask(&mut self) -> Result<Vec<u32>, String> {
            words(call("mask", &[self.id.into()])?, "mask")
        }

        pub fn forced(&mut self) -> Vec<u32> {
            call("forced", &[self.id.into()])
                .and_then(|v| words(v, "forced"))
                .unwrap_or_default()
        }

        pub fn consume(&mut self, ids: &[u32]) -> Result<(), String> {
            call("consume", &[self.id.into(), Uint32Array::from(ids).into()]).map(|_| ())
        }

        pub fn is_stopped(&self) -> bool {
            call("stopped", &[self.id.into()]).is_ok_and(|v| v.is_truthy())
        }

        pub fn fork(&self) -> Self {
            // A failed fork (the module gone) leaves a matcher whose calls fail.
            let id = call("fork", &[self.id.into()])
                .and_then(|v| number(v, "fork"))
                .unwrap_or(0);
            Self { id }
        }
    }

    impl Drop for Matcher {
        fn drop(&mut self) {
            let _ = call("free", &[self.id.into()]);
        }
    }
}
