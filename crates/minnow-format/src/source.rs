//! The interface through which the model reads stored tensors, whatever the container.

use minnow_runtime::DType;

/// A borrowed stored tensor: its element type, shape and raw little-endian bytes.
#[derive(Clone, Copy, Debug)]
pub struct TensorRef<'a> {
    /// `None` for element types the CPU operators cannot compute with (I64, U8, ...).
    pub dtype: Option<DType>,
    /// The container's spelling of the element type ("BF16", "I64", ...).
    pub dtype_name: &'a str,
    pub shape: &'a [usize],
    pub data: &'a [u8],
}

impl TensorRef<'_> {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A set of named tensors (a safetensors directory today; a `.mnw` container later).
pub trait TensorSource: Send + Sync {
    /// The tensor called `name`, if present.
    fn tensor(&self, name: &str) -> Option<TensorRef<'_>>;
    /// Every tensor name, sorted.
    fn names(&self) -> Vec<&str>;
    /// Where the tensors come from, for messages ("/models/x (3 shards)").
    fn describe(&self) -> String;
}
