//! End-of-answer token ids (decoding doc §9): `<|endoftext|>` and `<|role_end|>`; the first
//! occurrence of either at a generated position ends the answer. MASK is never a stop token.

/// The ids that end an answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StopTokens {
    ids: Vec<u32>,
}

impl StopTokens {
    /// `eos` plus `role_end` when the tokenizer has one.
    pub fn new(eos: u32, role_end: Option<u32>) -> Self {
        let mut ids = vec![eos];
        ids.extend(role_end.filter(|&r| r != eos));
        Self { ids }
    }

    /// Any set of end ids (e.g. the tokenizer's `stop_token_ids`, which adds configured extras).
    pub fn from_ids(ids: Vec<u32>) -> Self {
        let mut unique = Vec::with_capacity(ids.len());
        for id in ids {
            if !unique.contains(&id) {
                unique.push(id);
            }
        }
        Self { ids: unique }
    }

    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Index of the first stop token in `tokens`.
    pub fn first_in(&self, tokens: &[u32]) -> Option<usize> {
        tokens.iter().position(|t| self.ids.contains(t))
    }

    /// `tokens` cut after the first stop token (kept, as the official `generate` returns it), and
    /// whether one was found.
    pub fn cut<'a>(&self, tokens: &'a [u32]) -> (&'a [u32], bool) {
        match self.first_in(tokens) {
            Some(i) => (&tokens[..=i], true),
            None => (tokens, false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_of_either_stop_token_ends_the_answer() {
        let stops = StopTokens::new(481, Some(485));
        assert_eq!(stops.cut(&[1, 2, 485, 481, 481]), (&[1, 2, 485][..], true));
        assert_eq!(stops.cut(&[1, 481, 485]), (&[1, 481][..], true));
        assert_eq!(stops.cut(&[1, 2]), (&[1, 2][..], false));
        assert_eq!(StopTokens::new(481, None).ids(), &[481]);
    }
}
