//! The planned dense GEMM (`plan_dense_gemms`: cuBLASLt where it is faster and sums in
//! minnow's order) gives every row the bits of minnow's own kernel at every row count (ignored:
//! needs a GPU; `cargo test -p minnow-runtime --test cuda_blaslt -- --ignored --nocapture`).
//!
//! Shapes are mini's: QKV, O, the dense MLP, the shared expert and the lm_head. The reference
//! is `own_dense_gemm` over 4,096 rows, whose rows are invariant by construction; each row
//! count's output is scrambled before the planned GEMM runs, so a GEMM that writes nothing
//! cannot pass. The test also prints, per row count, which path the plan took and both times.

use half::bf16;
use minnow_runtime::cuda::{ops, plan_dense_gemms, DenseShape, DeviceBuffer, Gpu};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const SHAPES: [(&str, usize, usize); 6] = [
    ("qkv", 3072, 2048),
    ("o", 2048, 2048),
    ("shared gate/up", 1024, 2048),
    ("shared down", 2048, 512),
    ("dense gate/up", 10240, 2048),
    ("lm_head", 157184, 2048),
];
const ROWS: [usize; 13] = [1, 7, 16, 31, 32, 33, 64, 96, 256, 500, 1024, 2048, 4096];
const MAX_ROWS: usize = 4096;

fn time_us(gpu: &Gpu, f: impl Fn()) -> f32 {
    f();
    let timer = gpu.timer().unwrap();
    timer.start().unwrap();
    for _ in 0..5 {
        f();
    }
    timer.stop_ms().unwrap() * 200.0
}

fn bits(gpu: &Gpu, y: &DeviceBuffer<bf16>, len: usize) -> Vec<u16> {
    let mut out = vec![bf16::ZERO; len];
    gpu.read(y, 0, &mut out).unwrap();
    out.iter().map(|v| v.to_bits()).collect()
}

#[test]
#[ignore]
fn planned_dense_gemm_rows_have_the_bits_of_minnows_kernel_at_every_row_count() {
    let gpu = Gpu::new(0).expect("needs a CUDA GPU");
    let mut rng = StdRng::seed_from_u64(rand::random());
    for (name, n, k) in SHAPES {
        let x: Vec<bf16> = (0..MAX_ROWS * k)
            .map(|_| bf16::from_f32(rng.gen::<f32>() * 2.0 - 1.0))
            .collect();
        let w: Vec<bf16> = (0..n * k)
            .map(|_| bf16::from_f32((rng.gen::<f32>() * 2.0 - 1.0) * 0.05))
            .collect();
        let x = gpu.upload(&x).unwrap();
        let w = gpu.upload(&w).unwrap();
        let y = gpu.alloc::<bf16>(MAX_ROWS * n).unwrap();
        let shape = DenseShape {
            name,
            n,
            k,
            w: w.ptr(),
        };
        let report = plan_dense_gemms(&gpu, &[shape], MAX_ROWS).unwrap();
        println!("plan {}", report.join("; "));
        ops::own_dense_gemm(&gpu, x.ptr(), w.ptr(), y.ptr(), MAX_ROWS, n, k).unwrap();
        let reference = bits(&gpu, &y, MAX_ROWS * n);
        let mut line = format!("{name}:");
        for m in ROWS {
            ops::fill_random_bf16(&gpu, y.ptr(), m * n, m as u64 + 1, 1.0).unwrap();
            ops::dense_gemm(&gpu, x.ptr(), w.ptr(), y.ptr(), m, n, k).unwrap();
            let got = bits(&gpu, &y, m * n);
            let differing = got
                .iter()
                .zip(&reference[..m * n])
                .filter(|(a, b)| a != b)
                .count();
            assert_eq!(
                differing, 0,
                "{name} at {m} rows: {differing} outputs differ from minnow's kernel"
            );
            let planned = gpu
                .blas_lt_if_created()
                .and_then(|lt| lt.planned(m, n, k))
                .is_some();
            let ours = time_us(&gpu, || {
                ops::own_dense_gemm(&gpu, x.ptr(), w.ptr(), y.ptr(), m, n, k).unwrap()
            });
            let now = time_us(&gpu, || {
                ops::dense_gemm(&gpu, x.ptr(), w.ptr(), y.ptr(), m, n, k).unwrap()
            });
            line += &format!(
                " m={m} {} {now:.1}us (own {ours:.1}us);",
                if planned { "lt" } else { "own" }
            );
        }
        println!("{line}");
    }
}
