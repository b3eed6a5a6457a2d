//! The grammar that holds the output to the call form under a tool constraint: only calls
//! (`required`, a named function) or text without `<tool_call>` and then calls (`auto`),
//! each call's arguments valid against its function's `parameters` schema.

use super::form::{CALL_CLOSE, CALL_OPEN};
use super::request::{bad, functions, Function, ToolChoice, Tools};
use crate::error::Result;
use serde_json::Value;

impl Tools {
    /// The Lark grammar (llguidance's dialect) the output must follow.
    pub(crate) fn grammar(&self) -> Result<String> {
        let fs = functions(&self.tools)?;
        let lit = |s: &str| serde_json::to_string(s).unwrap_or_default();
        let mut g = String::from("%llguidance {}\n");
        let picked: Vec<&Function> = match &self.choice {
            ToolChoice::None => {
                return Err(bad(
                    "tool_choice 'none' makes no tool constraint: the answer is text".into(),
                ))
            }
            ToolChoice::Function(n) => {
                let f = fs.iter().find(|f| &f.name == n).ok_or_else(|| {
                    bad(format!(
                        "tool_choice names '{n}', which is not one of the tools"
                    ))
                })?;
                vec![f]
            }
            _ => fs.iter().collect(),
        };
        let more = if self.parallel {
            " (\"\\n\" call)*"
        } else {
            ""
        };
        let open = lit(CALL_OPEN);
        match self.choice {
            // Text that never opens a call, or text up to the first call and then calls.
            ToolChoice::Auto => g.push_str(&format!(
                "start: PLAIN | head body{more}\n\
                 PLAIN: /(?s:.*)/ & ~/(?s:.*){CALL_OPEN}(?s:.*)/\n\
                 head[lazy]: /(?s:.*){CALL_OPEN}/\n\
                 call: {open} body\n"
            )),
            _ => g.push_str(&format!("start: call{more}\ncall: {open} body\n")),
        }
        let bodies: Vec<String> = (0..picked.len()).map(|i| format!("body_{i}")).collect();
        g.push_str(&format!("body: {}\n", bodies.join(" | ")));
        for (i, f) in picked.iter().enumerate() {
            let mut schema = f.parameters.clone();
            if let Value::Object(m) = &mut schema {
                // The separators of Python's json.dumps, as the templates render calls.
                m.insert(
                    "x-guidance".into(),
                    serde_json::json!({
                        "whitespace_flexible": false,
                        "item_separator": ", ",
                        "key_separator": ": ",
                    }),
                );
            }
            g.push_str(&format!(
                "body_{i}: {} args_{i} {}\nargs_{i}: %json {}\n",
                lit(&format!("\n{{\"name\": {}, \"arguments\": ", lit(&f.name))),
                lit(&format!("}}\n{CALL_CLOSE}")),
                serde_json::to_string(&schema).unwrap_or_default(),
            ));
        }
        Ok(g)
    }
}
