//! NCCL conformance and bandwidth on real GPUs: start with the launcher, one rank per GPU:
//!
//! ```text
//! burn-ddp launch --standalone --nproc-per-node 2 -- target/release/examples/nccl_bench
//! ```
//!
//! Every collective is checked against known values on device buffers, then the all-reduce bus
//! bandwidth is measured for 1 MiB … 1 GiB (rank 0 prints `RESULT` lines).

#[cfg(feature = "cuda")]
fn main() {
    use burn_ddp::process_group::buffer::{DType, Memory};
    use burn_ddp::process_group::*;
    use burn_ddp::{CommBackend, RendezvousConfig, init_process_group};
    use cudarc::driver::{CudaContext, DevicePtr};
    use std::time::Instant;

    let config = RendezvousConfig::from_env().expect("launch with burn-ddp launch");
    let pg = init_process_group(CommBackend::Nccl, &config).unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(1)
    });
    let (r, w, dev) = (pg.rank(), pg.world_size(), config.local_rank);
    let ctx = CudaContext::new(dev).unwrap();
    let stream = ctx.default_stream();
    let buf = |ptr: u64, len: usize| Buffer { dtype: DType::F32, len, memory: Memory::Cuda { ptr, device: dev } };

    // The same conformance suite as the tcp tests, on device memory.
    struct CudaMemory {
        stream: std::sync::Arc<cudarc::driver::CudaStream>,
        device: usize,
    }
    impl burn_ddp::testing::SuiteMemory for CudaMemory {
        type Buf = cudarc::driver::CudaSlice<u8>;
        fn upload(&mut self, bytes: &[u8]) -> Self::Buf {
            let b = self.stream.clone_htod(bytes).unwrap();
            self.stream.synchronize().unwrap();
            b
        }
        fn buffer<'a>(&self, buf: &'a mut Self::Buf, dtype: DType) -> Buffer<'a> {
            let len = buf.len() / dtype.size();
            let ptr = buf.device_ptr(&self.stream).0;
            Buffer { dtype, len, memory: Memory::Cuda { ptr, device: self.device } }
        }
        fn download(&mut self, buf: &Self::Buf) -> Vec<u8> {
            self.stream.clone_dtoh(buf).unwrap()
        }
    }
    burn_ddp::testing::conformance(&*pg, &mut CudaMemory { stream: stream.clone(), device: dev });
    println!("RESULT rank={r} nccl_conformance=ok world={w}");

    tensor_collectives(&*pg, r, w, dev);

    // Bandwidth sweep.
    for mib in [1usize, 4, 16, 64, 256, 1024] {
        let n = mib * 1024 * 1024 / 4;
        let d = stream.alloc_zeros::<f32>(n).unwrap();
        let p = d.device_ptr(&stream).0;
        for _ in 0..5 {
            pg.all_reduce(buf(p, n), &AllReduceOptions::default()).unwrap();
        }
        let iters = if mib >= 256 { 10 } else { 30 };
        let t = Instant::now();
        for _ in 0..iters {
            pg.all_reduce(buf(p, n), &AllReduceOptions::default()).unwrap();
        }
        let s = t.elapsed().as_secs_f64() / iters as f64;
        let algbw = (n * 4) as f64 / s / 1e9;
        let busbw = algbw * 2.0 * (w as f64 - 1.0) / w as f64;
        if r == 0 {
            println!("RESULT framework=burn-ddp MiB={mib} ms={:.3} algbw_GBs={algbw:.1} busbw_GBs={busbw:.1}", s * 1e3);
        }
    }
}

/// Collectives on burn-cuda tensors, in place through the tensor helpers (pending fused work
/// must be flushed first: the inputs come out of a fused multiply).
#[cfg(feature = "cuda")]
fn tensor_collectives(pg: &dyn burn_ddp::ProcessGroup, r: usize, w: usize, dev: usize) {
    use burn::prelude::*;
    use burn_cuda::{Cuda, CudaDevice};
    use burn_ddp::ReduceOp;
    let device = CudaDevice::new(dev);
    let t = Tensor::<Cuda, 2>::from_floats([[r as f32, 1.0], [2.0, 3.0]], &device) * 2.0;
    let s = burn_ddp::tensor::all_reduce(pg, t, ReduceOp::Sum).unwrap();
    let sr = (w * (w - 1) / 2) as f32;
    assert_eq!(s.into_data().to_vec::<f32>().unwrap(), [2.0 * sr, 2.0 * w as f32, 4.0 * w as f32, 6.0 * w as f32]);
    let n = 3_000_001;
    let big = Tensor::<Cuda, 1, Int>::arange(0..n as i64, &device).float() + (r as f32);
    let big = burn_ddp::tensor::all_reduce(pg, big, ReduceOp::Mean).unwrap();
    let v = big.into_data().to_vec::<f32>().unwrap();
    let mean_r = sr / w as f32;
    for i in [0usize, 12345, n - 1] {
        assert!((v[i] - (i as f32 + mean_r)).abs() <= 1e-3 * (i as f32 + 1.0), "mean at {i}: {}", v[i]);
    }
    let b = burn_ddp::tensor::broadcast(pg, Tensor::<Cuda, 1>::from_floats([r as f32 + 5.0], &device), w - 1).unwrap();
    assert_eq!(b.into_data().to_vec::<f32>().unwrap(), [w as f32 + 4.0]);
    println!("RESULT rank={r} cuda_tensor_collectives=ok");
}

#[cfg(not(feature = "cuda"))]
fn main() {
    eprintln!(
        "nccl_bench needs the cuda feature: cargo build --release -p burn-ddp --features cuda --example nccl_bench"
    );
    std::process::exit(1);
}
