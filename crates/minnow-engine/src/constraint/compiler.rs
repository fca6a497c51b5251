//! Compiles output constraints with llguidance: once per grammar text (requests that repeat a
//! schema reuse the compiled parser and its warm lexer), with errors that name the problem.

use std::sync::{Arc, Mutex, OnceLock};

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};

use super::json_style::json_options;
use super::matcher::TokenMatcher;
use super::tools::tool_call_constraint;
use super::vocabulary::token_env;
use crate::api::OutputConstraint;
use crate::text::tool_format::ToolCallFormat;

/// Compiled grammars kept for reuse, least recently used dropped first.
const CACHE_ENTRIES: usize = 64;

/// Why a constraint cannot be used: the client's grammar is wrong (a 400 naming the problem), or
/// this checkpoint's vocabulary cannot be read for structured outputs.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    #[error("invalid {kind} grammar: {message}")]
    Invalid { kind: &'static str, message: String },
    #[error("structured outputs are not available for this checkpoint: {0}")]
    Unavailable(String),
}

/// The checkpoint's grammar compiler. The vocabulary trie is built on first use, so engines that
/// never see a constrained request do not pay for it.
pub struct GrammarCompiler {
    tokenizer_json: Arc<[u8]>,
    model_vocab: usize,
    stop_ids: Vec<u32>,
    tool_format: ToolCallFormat,
    factory: OnceLock<Result<ParserFactory, String>>,
    /// `(cache key, a fresh matcher)`, most recently used last.
    cache: Mutex<Vec<(String, Matcher)>>,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler")
            .field("model_vocab", &self.model_vocab)
            .field("stop_ids", &self.stop_ids)
            .finish()
    }
}

impl GrammarCompiler {
    /// `tokenizer_json` is the text of the checkpoint's `tokenizer.json`; `model_vocab` the
    /// model's vocabulary rows; `stop_ids` the ids that end an answer; `tool_format` how the
    /// checkpoint writes tool calls (for strict tools).
    pub fn new(
        tokenizer_json: Arc<[u8]>,
        model_vocab: usize,
        stop_ids: Vec<u32>,
        tool_format: ToolCallFormat,
    ) -> Self {
        Self {
            tokenizer_json,
            model_vocab,
            stop_ids,
            tool_format,
            factory: OnceLock::new(),
            cache: Mutex::new(Vec::new()),
        }
    }

    fn factory(&self) -> Result<&ParserFactory, GrammarError> {
        self.factory
            .get_or_init(|| {
                let env = token_env(&self.tokenizer_json, self.model_vocab, &self.stop_ids)?;
                let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
                // Grammar problems are reported to the client, not printed on the server's stderr.
                factory.quiet();
                Ok(factory)
            })
            .as_ref()
            .map_err(|e| GrammarError::Unavailable(e.clone()))
    }

    /// A matcher at the start of `constraint`'s language. Compiles the grammar unless the same
    /// text was compiled recently.
    pub fn matcher(&self, constraint: &OutputConstraint) -> Result<TokenMatcher, GrammarError> {
        let factory = self.factory()?;
        if let OutputConstraint::ToolCalls { tools, choice } = constraint {
            let lark = tool_call_constraint(self.tool_format, tools, choice);
            return self.matcher(&lark);
        }
        let (key, grammar) = grammar_of(constraint)?;
        if let Some(matcher) = self.cached(&key) {
            return Ok(TokenMatcher::new(matcher));
        }
        let kind = constraint.kind();
        let invalid = |message: String| GrammarError::Invalid { kind, message };
        let parser = factory
            .create_parser(grammar)
            .map_err(|e| invalid(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(message) = matcher.get_error() {
            return Err(invalid(message));
        }
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= CACHE_ENTRIES {
            cache.remove(0);
        }
        cache.push((key, matcher.clone()));
        Ok(TokenMatcher::new(matcher))
    }

    fn cached(&self, key: &str) -> Option<Matcher> {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let at = cache.iter().position(|(k, _)| k == key)?;
        let entry = cache.remove(at);
        let matcher = entry.1.clone();
        cache.push(entry);
        Some(matcher)
    }

    /// Compiled grammars in the cache (tests).
    pub fn cached_grammars(&self) -> usize {
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// The cache key and the llguidance grammar of a constraint.
fn grammar_of(constraint: &OutputConstraint) -> Result<(String, TopLevelGrammar), GrammarError> {
    let kind = constraint.kind();
    Ok(match constraint {
        OutputConstraint::JsonSchema(schema) => {
            let serde_json::Value::Object(map) = schema else {
                return Err(GrammarError::Invalid {
                    kind,
                    message: "the schema must be a JSON object".into(),
                });
            };
            if map.contains_key("x-guidance") {
                return Err(GrammarError::Invalid {
                    kind,
                    message: "the key x-guidance is reserved".into(),
                });
            }
            let mut map = map.clone();
            map.insert("x-guidance".into(), json_options());
            let text = serde_json::to_string(schema).unwrap_or_default();
            (
                format!("{kind}\n{text}"),
                TopLevelGrammar::from_json_schema(serde_json::Value::Object(map)),
            )
        }
        OutputConstraint::JsonObject => {
            let schema = serde_json::json!({"type": "object", "x-guidance": json_options()});
            (kind.to_string(), TopLevelGrammar::from_json_schema(schema))
        }
        OutputConstraint::Regex(rx) => (format!("{kind}\n{rx}"), TopLevelGrammar::from_regex(rx)),
        OutputConstraint::Lark(text) => (
            format!("{kind}\n{text}"),
            TopLevelGrammar::from_lark(text.clone()),
        ),
        OutputConstraint::ToolCalls { .. } => {
            return Err(GrammarError::Invalid {
                kind,
                message: "tool calls are compiled through their Lark grammar".into(),
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::tokenizer::tests_support::fixture;
    use serde_json::json;

    const EOS: u32 = 481;

    fn compiler() -> GrammarCompiler {
        let json = std::fs::read(fixture("llada2-tiny-v21/tokenizer.json")).unwrap();
        GrammarCompiler::new(json.into(), 512, vec![EOS], ToolCallFormat::TaggedJson)
    }

    /// Feeds `text` byte by byte (every byte is a token of the fixture vocabulary: id = the
    /// GPT-2 byte alphabet's order, which for printable ASCII is `byte - 33`).
    fn feed(m: &mut TokenMatcher, text: &str) -> bool {
        text.bytes().all(|b| {
            assert!((b'!'..=b'~').contains(&b), "printable ASCII only");
            m.try_consume(u32::from(b - b'!')).unwrap()
        })
    }

    #[test]
    fn a_schema_compiles_once_and_its_matcher_follows_the_language() {
        let c = compiler();
        let schema = OutputConstraint::JsonSchema(json!({
            "type": "object",
            "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
            "required": ["n"],
            "additionalProperties": false
        }));
        let mut m = c.matcher(&schema).unwrap();
        assert!(
            !m.try_consume(EOS).unwrap(),
            "EOS before the document is complete"
        );
        assert!(feed(&mut m, "{\"n\":"));
        assert!(!feed(&mut m.clone(), "12"), "9 is the maximum");
        assert!(!m.is_accepting());
        assert!(feed(&mut m, "7}"));
        assert!(m.is_accepting());
        assert!(m.try_consume(EOS).unwrap());
        assert_eq!(m.len(), 8);
        // Rolling back over the EOS and the brace reopens the document.
        m.rollback(2).unwrap();
        assert!(!m.is_accepting());
        // The same text again is served from the cache: a fresh matcher at the start.
        let again = c.matcher(&schema).unwrap();
        assert_eq!(again.len(), 0);
        assert_eq!(c.cached_grammars(), 1);
    }

    #[test]
    fn json_object_regex_and_lark_compile() {
        let c = compiler();
        let mut m = c.matcher(&OutputConstraint::JsonObject).unwrap();
        assert!(!feed(&mut m.clone(), "[1]"), "an object, not an array");
        assert!(feed(&mut m, "{}") && m.is_accepting());
        let mut m = c
            .matcher(&OutputConstraint::Regex("[0-9]{3}".into()))
            .unwrap();
        assert!(feed(&mut m, "123") && m.is_accepting());
        let lark = "start: \"yes\" | \"no\"".to_string();
        let mut m = c.matcher(&OutputConstraint::Lark(lark)).unwrap();
        assert!(!feed(&mut m.clone(), "maybe"));
        assert!(feed(&mut m, "no") && m.is_accepting());
    }

    #[test]
    fn grammar_errors_name_the_kind_and_the_problem() {
        let c = compiler();
        let cases = [
            (
                OutputConstraint::JsonSchema(json!({"type": "nonsense"})),
                "json_schema",
            ),
            (OutputConstraint::JsonSchema(json!([1])), "json_schema"),
            (
                OutputConstraint::JsonSchema(json!({"$ref": "#/$defs/missing"})),
                "json_schema",
            ),
            (OutputConstraint::Regex("(unclosed".into()), "regex"),
            (
                OutputConstraint::Lark("start: undefined_rule".into()),
                "lark",
            ),
        ];
        for (constraint, kind) in cases {
            match c.matcher(&constraint) {
                Err(GrammarError::Invalid { kind: k, message }) => {
                    assert_eq!(k, kind);
                    assert!(!message.is_empty());
                }
                other => panic!("{constraint:?}: {other:?}"),
            }
        }
        assert_eq!(c.cached_grammars(), 0, "failures are not cached");
    }

    #[test]
    fn an_unreadable_vocabulary_is_reported_not_panicked() {
        let c = GrammarCompiler::new(
            b"{}".to_vec().into(),
            512,
            vec![EOS],
            ToolCallFormat::TaggedJson,
        );
        let err = c.matcher(&OutputConstraint::JsonObject).unwrap_err();
        assert!(matches!(err, GrammarError::Unavailable(_)), "{err:?}");
    }
}
