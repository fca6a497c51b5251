//! The checkpoint's vocabulary as llguidance sees it: the bytes of every token id, in a token
//! trie whose end-of-sequence ids are the checkpoint's stop tokens.
//!
//! The bytes come from `tokenizer.json` itself (llguidance's reader of the Hugging Face format),
//! not from a second copy of the `tokenizers` crate: `toktrie_hf_tokenizers` 1.9 is built on
//! `tokenizers` 0.21 while the workspace uses 0.22. The trie tokenizes greedily, which is all the
//! masks need (the engine never asks llguidance to force tokens).

use std::sync::Arc;

use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

struct TrieEnv {
    trie: TokTrie,
}

impl TokenizerEnv for TrieEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

/// Builds the token environment from the text of `tokenizer.json`. `model_vocab` is the model's
/// row count (it may exceed the tokenizer's ids: the extra rows become ids no grammar allows);
/// `stop_ids` end an answer, and a grammar allows them exactly where it accepts.
pub fn token_env(
    tokenizer_json: &[u8],
    model_vocab: usize,
    stop_ids: &[u32],
) -> Result<TokEnv, String> {
    let json: serde_json::Value = serde_json::from_slice(tokenizer_json)
        .map_err(|e| format!("tokenizer.json is not JSON: {e}"))?;
    // The reader panics on a few malformed vocabularies; a bad checkpoint file must not take the
    // engine down with it.
    let bytes = std::panic::catch_unwind(|| llguidance::token_bytes_from_tokenizer_json(&json))
        .map_err(|_| "cannot read the token bytes of tokenizer.json".to_string())?
        .map_err(|e| format!("cannot read the token bytes of tokenizer.json: {e}"))?;
    let mut words = bytes;
    if words.len() > model_vocab {
        return Err(format!(
            "tokenizer.json has {} ids but the model only {model_vocab}",
            words.len()
        ));
    }
    // Ids the tokenizer does not name: special-marked placeholders, never produced by a grammar.
    while words.len() < model_vocab {
        let mut name = format!(".<[{}]>", words.len()).into_bytes();
        name[0] = TokTrie::SPECIAL_TOKEN_MARKER;
        words.push(name);
    }
    let Some((&first, _)) = stop_ids.split_first() else {
        return Err("the checkpoint has no stop token".into());
    };
    if let Some(&bad) = stop_ids.iter().find(|&&id| id as usize >= model_vocab) {
        return Err(format!("stop token id {bad} is outside the vocabulary"));
    }
    let info = TokRxInfo::new(model_vocab as u32, first);
    let trie = TokTrie::from(&info, &words).with_eos_tokens(stop_ids);
    Ok(Arc::new(TrieEnv { trie }))
}
