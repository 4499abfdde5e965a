//! The process-group conformance suite, written once against `&dyn ProcessGroup` and run for
//! every implementation: the tcp tests run it on host memory, `examples/nccl_bench.rs` on CUDA
//! memory. Every rank's data is a known function of (rank, index), so each result is checked
//! exactly. It panics on the first wrong value (it is test code).

use crate::ReduceOp;
use crate::process_group::buffer::DType;
use crate::process_group::*;

/// Where the suite's buffers live.
pub trait SuiteMemory {
    /// One allocation.
    type Buf;
    /// Allocates and fills a buffer with `bytes`.
    fn upload(&mut self, bytes: &[u8]) -> Self::Buf;
    /// A view for one collective.
    fn buffer<'a>(&self, buf: &'a mut Self::Buf, dtype: DType) -> Buffer<'a>;
    /// Copies a buffer's bytes back to the host (after the collective has finished).
    fn download(&mut self, buf: &Self::Buf) -> Vec<u8>;
}

/// Host memory (`Vec<u8>`), for host-memory groups.
pub struct HostMemory;

impl SuiteMemory for HostMemory {
    type Buf = Vec<u8>;
    fn upload(&mut self, bytes: &[u8]) -> Vec<u8> {
        bytes.to_vec()
    }
    fn buffer<'a>(&self, buf: &'a mut Vec<u8>, dtype: DType) -> Buffer<'a> {
        Buffer::host(dtype, buf)
    }
    fn download(&mut self, buf: &Vec<u8>) -> Vec<u8> {
        buf.clone()
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn to_f32(b: &[u8]) -> Vec<f32> {
    b.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

/// Runs every collective with checked results: all_reduce (sum, mean, max, min; f32 at 1, 2, 7,
/// 1001 and 3 Mi+5 elements; i64, f64, bf16), broadcast from every root (including more than one
/// broadcast piece), all_gather, reduce_scatter, barrier.
///
/// # Panics
/// On any wrong value or failed collective.
pub fn conformance<M: SuiteMemory>(pg: &dyn ProcessGroup, mem: &mut M) {
    let (r, w) = (pg.rank(), pg.world_size());
    let value = |rank: usize, i: usize| ((rank * 7 + i * 3) % 23) as f32 - 11.0;
    for n in [1usize, 2, 7, 1001, 3 * 1024 * 1024 + 5] {
        for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min] {
            let mut b = mem.upload(&f32_bytes(&(0..n).map(|i| value(r, i)).collect::<Vec<_>>()));
            pg.all_reduce(mem.buffer(&mut b, DType::F32), &AllReduceOptions { op, timeout: None }).unwrap();
            let got = to_f32(&mem.download(&b));
            for i in (0..n).step_by((n / 50).max(1)).chain([n - 1]) {
                let vals: Vec<f32> = (0..w).map(|k| value(k, i)).collect();
                let expect = match op {
                    ReduceOp::Sum => vals.iter().sum(),
                    ReduceOp::Mean => vals.iter().sum::<f32>() / w as f32,
                    ReduceOp::Max => vals.iter().cloned().fold(f32::MIN, f32::max),
                    ReduceOp::Min => vals.iter().cloned().fold(f32::MAX, f32::min),
                };
                assert!(
                    (got[i] - expect).abs() <= 1e-5 * expect.abs().max(1.0),
                    "{op:?} n={n} i={i}: {} vs {expect}",
                    got[i]
                );
            }
            if n > 1000 {
                break; // the large size checks one op: streaming, not arithmetic
            }
        }
    }
    // i64, f64 and bf16 sums.
    let mut ints = mem.upload(&(0..5i64).flat_map(|i| (i * 100 + r as i64).to_le_bytes()).collect::<Vec<u8>>());
    pg.all_reduce(mem.buffer(&mut ints, DType::I64), &AllReduceOptions::default()).unwrap();
    let ints = mem.download(&ints);
    let sum_r: i64 = (0..w as i64).sum();
    for (i, c) in ints.chunks(8).enumerate() {
        assert_eq!(i64::from_le_bytes(c.try_into().unwrap()), i as i64 * 100 * w as i64 + sum_r);
    }
    let mut f64s =
        mem.upload(&[0.5f64 * (r + 1) as f64, -1.0].iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>());
    pg.all_reduce(mem.buffer(&mut f64s, DType::F64), &AllReduceOptions::default()).unwrap();
    let f64s = mem.download(&f64s);
    assert_eq!(f64::from_le_bytes(f64s[..8].try_into().unwrap()), 0.5 * (w * (w + 1) / 2) as f64);
    let mut bf = mem.upload(&half::bf16::from_f32(1.0 + r as f32).to_le_bytes());
    pg.all_reduce(mem.buffer(&mut bf, DType::BF16), &AllReduceOptions::default()).unwrap();
    let bf = mem.download(&bf);
    assert_eq!(half::bf16::from_le_bytes(bf[..2].try_into().unwrap()).to_f32(), (w * (w + 1) / 2) as f32);

    // Broadcast from every root, odd sizes, one larger than a broadcast piece.
    for root in 0..w {
        for n in [3usize, 1_500_001] {
            let mut b = mem.upload(&f32_bytes(
                &(0..n).map(|i| if r == root { value(root, i) } else { -99.0 }).collect::<Vec<_>>(),
            ));
            pg.broadcast(mem.buffer(&mut b, DType::F32), &BroadcastOptions { root, timeout: None }).unwrap();
            let got = to_f32(&mem.download(&b));
            assert!(
                got.iter().enumerate().step_by(997).all(|(i, v)| *v == value(root, i)),
                "broadcast root {root} n {n}"
            );
            assert_eq!(got[n - 1], value(root, n - 1));
        }
    }
    // All-gather: rank k contributes [k*10, k*10+1, k*10+2].
    let mut input = mem.upload(&f32_bytes(&[r as f32 * 10.0, r as f32 * 10.0 + 1.0, r as f32 * 10.0 + 2.0]));
    let mut output = mem.upload(&vec![0u8; 12 * w]);
    pg.all_gather(
        mem.buffer(&mut input, DType::F32),
        mem.buffer(&mut output, DType::F32),
        &AllGatherOptions::default(),
    )
    .unwrap();
    let output = mem.download(&output);
    let expect: Vec<f32> =
        (0..w).flat_map(|k| [k as f32 * 10.0, k as f32 * 10.0 + 1.0, k as f32 * 10.0 + 2.0]).collect();
    assert_eq!(to_f32(&output), expect);
    // Reduce-scatter: input block j on rank k is (k + j) repeated 5 times; rank r gets Σ_k (k + r).
    let mut input = mem.upload(&f32_bytes(&(0..w * 5).map(|i| (r + i / 5) as f32).collect::<Vec<_>>()));
    let mut output = mem.upload(&[0u8; 5 * 4]);
    pg.reduce_scatter(
        mem.buffer(&mut input, DType::F32),
        mem.buffer(&mut output, DType::F32),
        &ReduceScatterOptions::default(),
    )
    .unwrap();
    let output = mem.download(&output);
    let expect = (0..w).map(|k| (k + r) as f32).sum::<f32>();
    assert_eq!(to_f32(&output), vec![expect; 5]);
    pg.barrier(&BarrierOptions::default()).unwrap();
}
