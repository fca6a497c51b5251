//! Tensor maps: the descriptors through which the Tensor Memory Accelerator (sm_90+) copies
//! boxes of a 2D tensor into shared memory with one instruction. minnow's kernels read them from
//! global memory (`TensorMaps`), so one descriptor per weight matrix serves every launch and a
//! captured graph needs no per-launch parameters beyond its address.

use cudarc::driver::sys;

use super::buffer::DeviceBuffer;
use super::error::{Context, CudaResult};
use super::gpu::Gpu;

/// Columns of every box: 64 BF16 = 128 bytes, the widest row the 128-byte swizzle takes.
pub const BOX_COLS: u32 = 64;

/// One 2D BF16 tensor that a kernel reads through a tensor map: the map's device address and
/// the address of the tensor's first element (kernels find a row from an address inside it).
#[derive(Clone, Copy, Debug)]
pub struct MappedTensor {
    pub map: u64,
    pub base: u64,
}

/// What one map describes: a row-major BF16 matrix at `base` with `cols` columns (the row pitch)
/// and `rows` rows, copied in boxes of `box_rows` x [`BOX_COLS`] with the 128-byte swizzle.
#[derive(Clone, Copy, Debug)]
pub struct Bf16Rows {
    pub base: u64,
    pub cols: usize,
    pub rows: usize,
    pub box_rows: u32,
}

/// Tensor maps uploaded to device memory (128 bytes each, 64-byte aligned as TMA requires).
pub struct TensorMaps {
    maps: DeviceBuffer<u64>,
    bases: Vec<u64>,
}

impl TensorMaps {
    pub fn new(gpu: &Gpu, tensors: &[Bf16Rows]) -> CudaResult<Self> {
        let mut words = Vec::with_capacity(16 * tensors.len());
        for t in tensors {
            words.extend_from_slice(&encode(t)?);
        }
        Ok(Self {
            maps: gpu.upload(&words)?,
            bases: tensors.iter().map(|t| t.base).collect(),
        })
    }

    /// Maps of row-major BF16 matrices `(base, cols, rows)` in boxes of `box_rows` rows, or `None`
    /// (with a warning) when the driver refuses one: callers then run kernels without TMA.
    pub fn try_rows(gpu: &Gpu, box_rows: u32, tensors: &[(u64, usize, usize)]) -> Option<Self> {
        let rows: Vec<Bf16Rows> = tensors
            .iter()
            .map(|&(base, cols, rows)| Bf16Rows {
                base,
                cols,
                rows,
                box_rows,
            })
            .collect();
        Self::new(gpu, &rows)
            .inspect_err(|e| tracing::warn!("no tensor maps ({e}): using kernels without TMA"))
            .ok()
    }

    /// Re-points the `i`-th map at another tensor, in place and in stream order: launches after
    /// it copy from `tensor` through the same map address. The kernels acquire each map before
    /// their first copy through it (`tensormap_acquire`), so the copy engine never reads a map
    /// it cached before the rewrite.
    pub fn set(&mut self, gpu: &Gpu, i: usize, tensor: &Bf16Rows) -> CudaResult<()> {
        gpu.write(&self.maps, 16 * i, &encode(tensor)?)?;
        self.bases[i] = tensor.base;
        Ok(())
    }

    /// The `i`-th tensor, in the order given to [`TensorMaps::new`].
    pub fn get(&self, i: usize) -> MappedTensor {
        MappedTensor {
            map: self.maps.ptr_at(16 * i),
            base: self.bases[i],
        }
    }
}

fn encode(t: &Bf16Rows) -> CudaResult<[u64; 16]> {
    let mut map = sys::CUtensorMap { opaque: [0; 16] };
    let dims = [t.cols as u64, t.rows as u64];
    let strides = [2 * t.cols as u64]; // bytes between rows (the first dimension is packed)
    let boxes = [BOX_COLS, t.box_rows];
    let element_strides = [1u32, 1];
    // SAFETY: every pointer refers to a live local array of the rank the call is given.
    unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            2,
            t.base as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            element_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
        .result()
        .ctx(|| format!("encoding a tensor map of {} x {} BF16", t.rows, t.cols))?;
    }
    Ok(map.opaque)
}
