//! kerze's constraint compiler: a grammar (a JSON schema, a regex or a Lark grammar) compiled
//! by llguidance against a vocabulary into a matcher that gives, step by step, the tokens that
//! may come next, the tokens the grammar forces, and whether it is complete. What a
//! constraint means (its checks, `choices`, tool calls, the end tokens, the sampling step) is
//! kerze's `constrain.rs`; this crate only compiles and matches.
//!
//! Natively kerze links it (the `compile` feature). In the browser it is a wasm module of its
//! own (the `module` feature, built as a cdylib; pkg/core.js loads it at the first
//! constrained request or `prepareConstraints`): the engine's module, which every page loads,
//! does not carry llguidance. Without `compile` this crate holds only [`Grammar`], the part
//! the engine needs to hand a grammar over.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

/// What a matcher is compiled from (kerze's constraints, after their checks).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Grammar {
    /// JSON valid against this schema (with llguidance's `x-guidance` options in it).
    JsonSchema(serde_json::Value),
    /// A whole match of this regex.
    Regex(String),
    /// A sentence of this Lark grammar (llguidance's dialect).
    Lark(String),
}

/// How the vocabulary's tokenizer writes bytes a grammar forces: the model's own tokens for
/// them (`None`: it cannot). Where those tokens are not exactly these bytes (a tokenizer that
/// adds a space before text, bytes that are not whole UTF-8), the trie's longest match is
/// taken instead.
pub type Tokenize = std::sync::Arc<dyn Fn(&[u8]) -> Option<Vec<u32>> + Send + Sync>;

#[cfg(feature = "compile")]
pub use compile::{Matcher, Vocabulary};

#[cfg(feature = "compile")]
mod compile {
    use super::{Grammar, Tokenize};
    use std::sync::Arc;

    /// The vocabulary as llguidance sees it: the token trie, and the model's tokenizer for the
    /// bytes a grammar forces (so forced tokens are the ones the model would read).
    struct Env {
        trie: toktrie::TokTrie,
        tokenize: Tokenize,
    }

    impl toktrie::TokenizerEnv for Env {
        fn tok_trie(&self) -> &toktrie::TokTrie {
            &self.trie
        }

        fn tokenize_bytes(&self, s: &[u8]) -> Vec<toktrie::TokenId> {
            (self.tokenize)(s)
                .filter(|ids| {
                    let mut b = Vec::with_capacity(s.len());
                    ids.iter()
                        .for_each(|&id| b.extend_from_slice(self.trie.token(id)));
                    b == s
                })
                .unwrap_or_else(|| self.trie.greedy_tokenize(s))
        }
    }

    /// A vocabulary's compiler: its token trie (for Gemma's 262 144 tokens ~1 s natively and
    /// ~120 MB) and llguidance's parser factory.
    pub struct Vocabulary {
        factory: Arc<llguidance::ParserFactory>,
    }

    impl Vocabulary {
        /// The vocabulary of `words` (each token's bytes, by id) with end of sequence `eos`.
        pub fn new(words: &[Vec<u8>], eos: u32, tokenize: Tokenize) -> Result<Self, String> {
            let info = toktrie::TokRxInfo::new(words.len() as u32, eos);
            let trie = toktrie::TokTrie::from(&info, words);
            let env: toktrie::TokEnv = Arc::new(Env { trie, tokenize });
            let mut f = llguidance::ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
            f.quiet();
            Ok(Self {
                factory: Arc::new(f),
            })
        }

        /// The vocabulary's size (the mask's bits).
        pub fn len(&self) -> usize {
            self.factory.tok_env().tok_trie().vocab_size()
        }

        pub fn is_empty(&self) -> bool {
            self.len() == 0
        }

        /// A matcher of `grammar` before its first token; the error says why it does not
        /// compile.
        pub fn compile(&self, grammar: &Grammar) -> Result<Matcher, String> {
            use llguidance::api::TopLevelGrammar;
            let g = match grammar {
                Grammar::JsonSchema(s) => TopLevelGrammar::from_json_schema(s.clone()),
                Grammar::Regex(r) => TopLevelGrammar::from_regex(r),
                Grammar::Lark(l) => TopLevelGrammar::from_lark(l.clone()),
            };
            let parser = self.factory.create_parser(g).map_err(|e| e.to_string())?;
            let m = llguidance::Matcher::new(Ok(parser));
            match m.get_error() {
                Some(e) => Err(e),
                None => Ok(Matcher(m)),
            }
        }
    }

    /// One grammar's state: which tokens may come next.
    pub struct Matcher(llguidance::Matcher);

    impl Matcher {
        /// The tokens that may come next, as bits (bit `i % 32` of word `i / 32`).
        pub fn mask(&mut self) -> Result<Vec<u32>, String> {
            self.0
                .compute_mask()
                .map(|m| m.as_slice().to_vec())
                .map_err(|e| e.to_string())
        }

        /// The tokens the grammar forces next (none where there is a choice), as the
        /// vocabulary's tokenizer writes them; not consumed.
        pub fn forced(&mut self) -> Vec<u32> {
            self.0.compute_ff_tokens()
        }

        /// Move past `ids`.
        pub fn consume(&mut self, ids: &[u32]) -> Result<(), String> {
            self.0.consume_tokens(ids).map_err(|e| e.to_string())
        }

        /// Whether the grammar is complete and nothing may follow.
        pub fn is_stopped(&self) -> bool {
            self.0.is_stopped()
        }

        /// An independent copy in the same state.
        pub fn fork(&self) -> Self {
            Self(self.0.deep_clone())
        }
    }
}

/// The browser module's exports: vocabularies and matchers held here by number, the engine's
/// module holding the numbers (src/wasm.rs `GuideVocabulary`, `GuideMatcher`). Errors are
/// `Error`s with the message as llguidance gives it.
#[cfg(all(feature = "module", target_arch = "wasm32"))]
mod module {
    use super::{Grammar, Matcher, Vocabulary};
    use std::cell::RefCell;
    use std::collections::HashMap;
    use wasm_bindgen::prelude::*;

    #[derive(Default)]
    struct Held {
        next: u32,
        vocabularies: HashMap<u32, Vocabulary>,
        matchers: HashMap<u32, Matcher>,
        /// Each vocabulary's tokenizer (a function of the engine's module), by number: kept
        /// here, since llguidance's vocabulary must be `Send` and a JS function is not.
        tokenizers: HashMap<u32, js_sys::Function>,
    }

    thread_local! {
        static HELD: RefCell<Held> = RefCell::new(Held::default());
    }

    fn err(m: impl std::fmt::Display) -> JsValue {
        js_sys::Error::new(&m.to_string()).into()
    }

    fn next(h: &mut Held) -> u32 {
        h.next = h.next.wrapping_add(1);
        h.next
    }

    /// The tokenizer of vocabulary `id` on `bytes` (see [`super::Tokenize`]).
    fn tokenize(id: u32, bytes: &[u8]) -> Option<Vec<u32>> {
        let f = HELD.with(|h| h.borrow().tokenizers.get(&id).cloned())?;
        let out = f
            .call1(&JsValue::NULL, &js_sys::Uint8Array::from(bytes))
            .ok()?;
        out.dyn_ref::<js_sys::Uint32Array>().map(|a| a.to_vec())
    }

    /// A vocabulary from its tokens' bytes laid end to end (`offsets`: where each token
    /// starts, and the end), its end of sequence and its tokenizer (`bytes → Uint32Array |
    /// undefined`). Returns its number.
    #[wasm_bindgen]
    pub fn vocabulary(
        bytes: &[u8],
        offsets: &[u32],
        eos: u32,
        tokenize: js_sys::Function,
    ) -> Result<u32, JsValue> {
        let mut words = Vec::with_capacity(offsets.len().saturating_sub(1));
        for w in offsets.windows(2) {
            let (a, b) = (w[0] as usize, w[1] as usize);
            let word = bytes
                .get(a..b)
                .ok_or_else(|| err("vocabulary: offsets out of range"))?;
            words.push(word.to_vec());
        }
        // The tokenizer is held first: the vocabulary may be asked to tokenize while built.
        let id = HELD.with(|h| {
            let mut h = h.borrow_mut();
            let id = next(&mut h);
            h.tokenizers.insert(id, tokenize);
            id
        });
        let tok: super::Tokenize = std::sync::Arc::new(move |b: &[u8]| self::tokenize(id, b));
        match Vocabulary::new(&words, eos, tok) {
            Ok(v) => {
                HELD.with(|h| h.borrow_mut().vocabularies.insert(id, v));
                Ok(id)
            }
            Err(e) => {
                HELD.with(|h| h.borrow_mut().tokenizers.remove(&id));
                Err(err(e))
            }
        }
    }

    /// A matcher of `grammar` (JSON of [`Grammar`]) for vocabulary `vocabulary`: its number.
    #[wasm_bindgen]
    pub fn compile(vocabulary: u32, grammar: &str) -> Result<u32, JsValue> {
        let g: Grammar = serde_json::from_str(grammar).map_err(err)?;
        // The vocabulary stays held while it compiles (its tokenizer may be asked meanwhile,
        // which reads `HELD` too): taken out, then put back.
        let v = HELD
            .with(|h| h.borrow_mut().vocabularies.remove(&vocabulary))
            .ok_or_else(|| err("no such vocabulary"))?;
        let m = v.compile(&g);
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            h.vocabularies.insert(vocabulary, v);
            let m = m.map_err(err)?;
            let id = next(&mut h);
            h.matchers.insert(id, m);
            Ok(id)
        })
    }

    /// Run `f` on matcher `id`, taken out of `HELD` meanwhile (llguidance may call the
    /// vocabulary's tokenizer, which reads `HELD`).
    fn with<R>(id: u32, f: impl FnOnce(&mut Matcher) -> R) -> Result<R, JsValue> {
        let mut m = HELD
            .with(|h| h.borrow_mut().matchers.remove(&id))
            .ok_or_else(|| err("no such matcher"))?;
        let r = f(&mut m);
        HELD.with(|h| h.borrow_mut().matchers.insert(id, m));
        Ok(r)
    }

    #[wasm_bindgen]
    pub fn mask(matcher: u32) -> Result<Vec<u32>, JsValue> {
        with(matcher, |m| m.mask())?.map_err(err)
    }

    #[wasm_bindgen]
    pub fn forced(matcher: u32) -> Result<Vec<u32>, JsValue> {
        with(matcher, |m| m.forced())
    }

    #[wasm_bindgen]
    pub fn consume(matcher: u32, ids: &[u32]) -> Result<(), JsValue> {
        with(matcher, |m| m.consume(ids))?.map_err(err)
    }

    #[wasm_bindgen]
    pub fn stopped(matcher: u32) -> Result<bool, JsValue> {
        with(matcher, |m| m.is_stopped())
    }

    #[wasm_bindgen]
    pub fn fork(matcher: u32) -> Result<u32, JsValue> {
        let m = with(matcher, |m| m.fork())?;
        Ok(HELD.with(|h| {
            let mut h = h.borrow_mut();
            let id = next(&mut h);
            h.matchers.insert(id, m);
            id
        }))
    }

    /// Let matcher `id` go.
    #[wasm_bindgen]
    pub fn free(matcher: u32) {
        HELD.with(|h| h.borrow_mut().matchers.remove(&matcher));
    }

    /// Let vocabulary `id` go (its matchers go with their own `free`).
    #[wasm_bindgen(js_name = freeVocabulary)]
    pub fn free_vocabulary(vocabulary: u32) {
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            h.vocabularies.remove(&vocabulary);
            h.tokenizers.remove(&vocabulary);
        });
    }
}

#[cfg(all(test, feature = "compile"))]
mod tests {
    use super::*;

    /// A vocabulary of single letters, `ab`, and an end of sequence (id 0, no bytes).
    fn vocab() -> Vocabulary {
        let mut words: Vec<Vec<u8>> = vec![Vec::new()];
        words.extend((b'a'..=b'z').map(|c| vec![c]));
        words.push(b"ab".to_vec());
        Vocabulary::new(&words, 0, std::sync::Arc::new(|_: &[u8]| None)).unwrap()
    }

    fn allowed(mask: &[u32], id: u32) -> bool {
        mask[(id / 32) as usize] >> (id % 32) & 1 == 1
    }

    #[test]
    fn a_regex_masks_forces_and_stops() {
        let v = vocab();
        assert_eq!(v.len(), 28);
        let mut m = v.compile(&Grammar::Regex("ab?c".into())).unwrap();
        let mask = m.mask().unwrap();
        let a = 1;
        let ab = 27;
        assert!(allowed(&mask, a) && allowed(&mask, ab) && !allowed(&mask, 2));
        m.consume(&[ab]).unwrap();
        // Only `c` is left: forced, and the copy is independent.
        let mut copy = m.fork();
        assert_eq!(m.forced(), vec![3]);
        m.consume(&[3]).unwrap();
        assert!(m.is_stopped(), "nothing may follow `abc`");
        assert!(!copy.is_stopped() && !allowed(&copy.mask().unwrap(), 0));
        assert!(m.consume(&[1]).is_err());
        assert!(v.compile(&Grammar::Lark("start: (".into())).is_err());
    }
}
