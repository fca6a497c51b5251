//! One request's grammar state: a llguidance matcher over the answer's decided tokens, in order.
//! The constrained decoder feeds it tokens left to right and rolls it back when an edit changes
//! a token it had already accepted.

use llguidance::toktrie::SimpleVob;
use llguidance::Matcher;

/// The parser state after the tokens fed so far ([`TokenMatcher::tokens`]).
#[derive(Clone)]
pub struct TokenMatcher {
    matcher: Matcher,
    /// The tokens accepted so far, in order: the parser's state is a function of them, so a mask
    /// computed after one sequence is the mask of every moment with the same sequence (a
    /// rollback followed by the same tokens included).
    tokens: Vec<u32>,
    /// The grammar's end ids (the checkpoint's stop tokens).
    stop_ids: Vec<u32>,
    /// Stop ids accepted after the grammar had ended on its own (the parser takes none then).
    trailing_stops: usize,
}

impl std::fmt::Debug for TokenMatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenMatcher")
            .field("consumed", &self.tokens.len())
            .finish()
    }
}

impl TokenMatcher {
    pub(crate) fn new(matcher: Matcher) -> Self {
        let stop_ids = matcher
            .tok_env()
            .map(|env| env.tok_trie().eos_tokens().to_vec())
            .unwrap_or_default();
        Self {
            matcher,
            tokens: Vec::new(),
            stop_ids,
            trailing_stops: 0,
        }
    }

    /// Tokens accepted so far.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The tokens accepted so far: they identify the state ([`TokenMatcher::mask`] depends on
    /// nothing else).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Feeds `token` if the grammar allows it here; `Ok(false)` leaves the state unchanged. An
    /// error means the matcher itself failed (the request cannot go on).
    pub fn try_consume(&mut self, token: u32) -> Result<bool, String> {
        if self.matcher.is_stopped() {
            // A complete sentence: only the end of the answer may follow.
            if self.stop_ids.contains(&token) {
                self.tokens.push(token);
                self.trailing_stops += 1;
                return Ok(true);
            }
            return Ok(false);
        }
        let n = self
            .matcher
            .try_consume_tokens(&[token])
            .map_err(|e| format!("grammar matcher: {e}"))?;
        if n == 1 {
            self.tokens.push(token);
        }
        Ok(n == 1)
    }

    /// Forgets the last `n` accepted tokens.
    pub fn rollback(&mut self, n: usize) -> Result<(), String> {
        if n == 0 {
            return Ok(());
        }
        if n > self.tokens.len() {
            return Err(format!(
                "grammar matcher: rollback of {n} tokens past the {} accepted",
                self.tokens.len()
            ));
        }
        let trailing = n.min(self.trailing_stops);
        self.trailing_stops -= trailing;
        self.matcher
            .rollback(n - trailing)
            .map_err(|e| format!("grammar matcher: {e}"))?;
        self.tokens.truncate(self.tokens.len() - n);
        Ok(())
    }

    /// The ids allowed next: the stop ids exactly where the grammar accepts (only they, once the
    /// grammar is complete).
    pub fn mask(&mut self) -> Result<SimpleVob, String> {
        let mask = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| format!("grammar matcher: {e}"))?;
        if mask.is_zero() {
            return Err("grammar matcher: no token can continue the answer".into());
        }
        Ok(mask)
    }

    /// Whether the tokens so far are a complete sentence of the grammar.
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }

    /// Whether the grammar has ended (a stop id was accepted, or nothing can follow).
    pub fn is_stopped(&self) -> bool {
        self.matcher.is_stopped()
    }
}
