//! The interface through which the model reads stored tensors, whatever the container.

use minnow_runtime::quant::{Encoding, QuantEncoding, QuantMat};
use minnow_runtime::DType;

/// A borrowed stored tensor: its element type or encoding, shape and raw little-endian bytes.
#[derive(Clone, Copy, Debug)]
pub struct TensorRef<'a> {
    /// The floating-point element type; `None` for element types the CPU operators cannot
    /// compute with (I64, U8, ...) and for quantized tensors (see `quant`).
    pub dtype: Option<DType>,
    /// The container's spelling of the element type or encoding ("BF16", "I64", "i4_mma", ...).
    pub dtype_name: &'a str,
    pub shape: &'a [usize],
    /// The element bytes, or a quantized tensor's codes.
    pub data: &'a [u8],
    /// The rest of a quantized tensor: encoding, group size, scales.
    pub quant: Option<QuantParts<'a>>,
}

/// What a quantized tensor has beyond its codes.
#[derive(Clone, Copy, Debug)]
pub struct QuantParts<'a> {
    pub encoding: QuantEncoding,
    /// Values per scale along K (the manifest's `group_size`).
    pub group_size: usize,
    pub scales: &'a [u8],
    /// NVFP4's per-matrix scale; 1 for other encodings.
    pub global_scale: f32,
}

impl<'a> TensorRef<'a> {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// How the tensor is stored, when minnow can compute with it.
    pub fn encoding(&self) -> Option<Encoding> {
        match (&self.quant, self.dtype) {
            (Some(q), _) => Some(Encoding::Quant(q.encoding)),
            (None, Some(d)) => Some(Encoding::Float(d)),
            (None, None) => None,
        }
    }

    /// A quantized 2-D tensor as a matrix (its lengths were checked when the container opened).
    pub fn quant_mat(&self) -> Option<QuantMat<'a>> {
        let q = self.quant?;
        let [rows, cols] = *self.shape else {
            return None;
        };
        QuantMat::new(
            q.encoding,
            rows,
            cols,
            q.group_size,
            self.data,
            q.scales,
            q.global_scale,
        )
        .ok()
    }
}

/// A set of named tensors (a safetensors directory or a `.mnw` container).
pub trait TensorSource: Send + Sync {
    /// The tensor called `name`, if present.
    fn tensor(&self, name: &str) -> Option<TensorRef<'_>>;
    /// Every tensor name, sorted.
    fn names(&self) -> Vec<&str>;
    /// Where the tensors come from, for messages ("/models/x (3 shards)").
    fn describe(&self) -> String;
    /// A hint that the caller is done reading `name`: a memory-mapped source drops the tensor's
    /// pages from this process (they stay in the page cache), so that streaming once over a
    /// checkpoint larger than memory (the converter) keeps a small resident set. A tensor read
    /// again afterwards faults its pages back in, with the same bytes. Default: nothing.
    fn release(&self, _name: &str) {}
}

/// Drops `map[range]`'s pages from the process (see [`TensorSource::release`]).
pub(crate) fn release_pages(map: &memmap2::Mmap, range: std::ops::Range<usize>) {
    if range.is_empty() {
        return;
    }
    // SAFETY: `map` is a read-only shared file mapping: MADV_DONTNEED only unmaps its pages,
    // and the next access reads the same file bytes back (the sources assume, as every
    // mmap-based loader does, that nobody modifies the file while it is open). No byte any
    // borrower sees changes. A failure only means the pages stay resident.
    let _ = unsafe {
        map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, range.start, range.len())
    };
}
