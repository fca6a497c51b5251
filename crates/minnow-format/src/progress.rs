//! A tensor source that reports how many of its bytes have been handed out, so a loader that
//! copies weights somewhere (the GPU upload) can drive a progress bar without knowing about it.

use std::collections::HashSet;
use std::sync::Mutex;

use crate::source::{TensorRef, TensorSource};

/// Bytes of a checkpoint handed out so far, out of all of its tensors' bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadProgress {
    pub bytes_done: u64,
    pub bytes_total: u64,
}

/// The stored bytes of every tensor of a source.
pub fn total_bytes(source: &dyn TensorSource) -> u64 {
    source
        .names()
        .iter()
        .filter_map(|name| source.tensor(name))
        .map(|t| t.data.len() as u64)
        .sum()
}

/// The stored bytes of a source's tensors (data and scales) per encoding name (`bf16`,
/// `i4_mma`, ...; the container's spelling for a type minnow cannot compute with), sorted by
/// name: what a load log line reports.
pub fn bytes_by_encoding(source: &dyn TensorSource) -> Vec<(String, u64)> {
    let mut out = std::collections::BTreeMap::<String, u64>::new();
    for t in source.names().iter().filter_map(|name| source.tensor(name)) {
        let name = t
            .encoding()
            .map_or_else(|| t.dtype_name.to_string(), |e| e.name().to_string());
        *out.entry(name).or_default() +=
            (t.data.len() + t.quant.map_or(0, |q| q.scales.len())) as u64;
    }
    out.into_iter().collect()
}

/// Wraps a source; every first lookup of a tensor adds its bytes and calls `report`.
pub struct ProgressSource<'a> {
    inner: &'a dyn TensorSource,
    report: &'a (dyn Fn(LoadProgress) + Sync),
    bytes_total: u64,
    /// Names already counted (loaders may look a tensor up more than once) and the running sum.
    counted: Mutex<(HashSet<String>, u64)>,
}

impl<'a> ProgressSource<'a> {
    pub fn new(inner: &'a dyn TensorSource, report: &'a (dyn Fn(LoadProgress) + Sync)) -> Self {
        Self {
            inner,
            report,
            bytes_total: total_bytes(inner),
            counted: Mutex::new((HashSet::new(), 0)),
        }
    }
}

impl TensorSource for ProgressSource<'_> {
    fn tensor(&self, name: &str) -> Option<TensorRef<'_>> {
        let tensor = self.inner.tensor(name)?;
        let mut counted = self.counted.lock().unwrap_or_else(|e| e.into_inner());
        if counted.0.insert(name.to_string()) {
            counted.1 += tensor.data.len() as u64;
            (self.report)(LoadProgress {
                bytes_done: counted.1,
                bytes_total: self.bytes_total,
            });
        }
        Some(tensor)
    }

    fn names(&self) -> Vec<&str> {
        self.inner.names()
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    struct Fixed(BTreeMap<String, Vec<u8>>);

    impl TensorSource for Fixed {
        fn tensor(&self, name: &str) -> Option<TensorRef<'_>> {
            self.0.get(name).map(|data| TensorRef {
                dtype: None,
                dtype_name: "U8",
                shape: &[],
                data,
                quant: None,
            })
        }
        fn names(&self) -> Vec<&str> {
            self.0.keys().map(String::as_str).collect()
        }
        fn describe(&self) -> String {
            "fixed".into()
        }
    }

    #[test]
    fn reports_each_tensor_once_up_to_the_total() {
        let source = Fixed(BTreeMap::from([
            ("a".to_string(), vec![0; 10]),
            ("b".to_string(), vec![0; 30]),
        ]));
        let seen = Mutex::new(Vec::new());
        let report = |p: LoadProgress| seen.lock().unwrap().push(p);
        let progress = ProgressSource::new(&source, &report);
        assert_eq!(total_bytes(&source), 40);
        assert_eq!(bytes_by_encoding(&source), [("U8".to_string(), 40)]);
        assert!(progress.tensor("b").is_some());
        assert!(progress.tensor("b").is_some());
        assert!(progress.tensor("missing").is_none());
        assert!(progress.tensor("a").is_some());
        let seen = seen.into_inner().unwrap();
        let done: Vec<u64> = seen.iter().map(|p| p.bytes_done).collect();
        assert_eq!(done, [30, 40]);
        assert!(seen.iter().all(|p| p.bytes_total == 40));
    }
}
