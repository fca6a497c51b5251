//! Text held back at the end of a stream: the part that the next block may turn into a stop
//! string or a tool-call marker, so it cannot be shown yet.

/// Length of the longest suffix of `text` that is a proper prefix of one of `patterns`
/// (a stop string or a marker that the next block may complete).
pub(crate) fn partial_prefix_suffix<S: AsRef<str>>(text: &str, patterns: &[S]) -> usize {
    let mut best = 0;
    for pattern in patterns {
        let pattern = pattern.as_ref();
        for len in (best + 1..pattern.len().min(text.len() + 1)).rev() {
            let start = text.len() - len;
            if text.is_char_boundary(start) && pattern.starts_with(&text[start..]) {
                best = len;
                break;
            }
        }
    }
    best
}
