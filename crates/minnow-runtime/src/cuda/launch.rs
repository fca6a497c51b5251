//! One kernel launch as the kernel table (`kernels.rs`) describes it to the device: its grid and
//! block, its arguments' bits, and the device that takes it by kernel name.

use super::error::CudaResult;

/// Grid, block and dynamic shared memory of one launch.
#[derive(Clone, Copy, Debug)]
pub struct LaunchConfig {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub shared_bytes: u32,
}

impl LaunchConfig {
    pub fn new(grid: (u32, u32, u32), block: u32, shared_bytes: u32) -> Self {
        Self {
            grid,
            block: (block, 1, 1),
            shared_bytes,
        }
    }
}

/// A kernel argument as the 8 bytes the driver reads from (little-endian: 4-byte arguments are
/// the low half). Device pointers are `u64`.
pub trait KernelArg {
    /// The type a PTX entry declares for a parameter of this type (a pointer is `.u64`).
    const PTX_TYPE: &'static str;
    fn to_bits(self) -> u64;
}
impl KernelArg for u64 {
    const PTX_TYPE: &'static str = "u64";
    fn to_bits(self) -> u64 {
        self
    }
}
impl KernelArg for i64 {
    const PTX_TYPE: &'static str = "u64";
    fn to_bits(self) -> u64 {
        self as u64
    }
}
impl KernelArg for i32 {
    const PTX_TYPE: &'static str = "u32";
    fn to_bits(self) -> u64 {
        self as u32 as u64
    }
}
impl KernelArg for u32 {
    const PTX_TYPE: &'static str = "u32";
    fn to_bits(self) -> u64 {
        self as u64
    }
}
impl KernelArg for f32 {
    const PTX_TYPE: &'static str = "f32";
    fn to_bits(self) -> u64 {
        self.to_bits() as u64
    }
}

/// What runs a kernel by name with its arguments' bits, in the order the kernel declares them:
/// the device (`Gpu`). The kernel table's typed launchers are the only callers.
pub trait Launch {
    fn launch_bits(&self, name: &str, cfg: LaunchConfig, bits: &mut [u64]) -> CudaResult<()>;
}
