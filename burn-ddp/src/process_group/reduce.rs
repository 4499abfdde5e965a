//! Element-wise reduction of byte buffers by dtype (the arithmetic of the TCP backend).

use super::buffer::{DType, ReduceOp};
use half::{bf16, f16};

fn fold<T: Copy>(
    acc: &mut [u8],
    other: &[u8],
    size: usize,
    read: impl Fn(&[u8]) -> T,
    write: impl Fn(T, &mut [u8]),
    f: impl Fn(T, T) -> T,
) {
    for (a, b) in acc.chunks_exact_mut(size).zip(other.chunks_exact(size)) {
        let v = f(read(a), read(b));
        write(v, a);
    }
}

macro_rules! float_fold {
    ($acc:expr, $other:expr, $op:expr, $t:ty, $n:expr, $from:expr, $to:expr) => {{
        let f = |x: $t, y: $t| -> $t {
            match $op {
                ReduceOp::Sum | ReduceOp::Mean => x + y,
                ReduceOp::Max => {
                    if y > x || x.is_nan() {
                        y
                    } else {
                        x
                    }
                }
                ReduceOp::Min => {
                    if y < x || x.is_nan() {
                        y
                    } else {
                        x
                    }
                }
            }
        };
        fold($acc, $other, $n, |b| $from(b.try_into().unwrap()), |v, b: &mut [u8]| b.copy_from_slice(&$to(v)), f)
    }};
}

/// `acc[i] = acc[i] ⊕ other[i]` for the element type. Mean accumulates a sum (see [`finish`]).
/// Half types are reduced in their own precision, element by element, like NCCL.
///
/// # Panics
/// If the slices differ in length.
pub fn accumulate(dtype: DType, op: ReduceOp, acc: &mut [u8], other: &[u8]) {
    assert_eq!(acc.len(), other.len(), "Got {} and {} bytes", acc.len(), other.len());
    match dtype {
        DType::F32 => float_fold!(acc, other, op, f32, 4, f32::from_le_bytes, f32::to_le_bytes),
        DType::F64 => float_fold!(acc, other, op, f64, 8, f64::from_le_bytes, f64::to_le_bytes),
        DType::BF16 => {
            float_fold!(acc, other, op, f32, 2, |b: [u8; 2]| bf16::from_le_bytes(b).to_f32(), |v: f32| bf16::from_f32(
                v
            )
            .to_le_bytes())
        }
        DType::F16 => {
            float_fold!(acc, other, op, f32, 2, |b: [u8; 2]| f16::from_le_bytes(b).to_f32(), |v: f32| f16::from_f32(v)
                .to_le_bytes())
        }
        DType::I64 => fold(
            acc,
            other,
            8,
            |b| i64::from_le_bytes(b.try_into().unwrap()),
            |v, b: &mut [u8]| b.copy_from_slice(&v.to_le_bytes()),
            |x, y| match op {
                ReduceOp::Sum | ReduceOp::Mean => x.wrapping_add(y),
                ReduceOp::Max => x.max(y),
                ReduceOp::Min => x.min(y),
            },
        ),
    }
}

/// Finishes a reduction: divides by `world` for [`ReduceOp::Mean`]; nothing otherwise.
pub fn finish(dtype: DType, op: ReduceOp, buf: &mut [u8], world: usize) {
    if op != ReduceOp::Mean || world == 1 {
        return;
    }
    let w = world as f64;
    match dtype {
        DType::F32 => buf.chunks_exact_mut(4).for_each(|b| {
            let v = f32::from_le_bytes(b.try_into().unwrap()) / world as f32;
            b.copy_from_slice(&v.to_le_bytes());
        }),
        DType::F64 => buf.chunks_exact_mut(8).for_each(|b| {
            let v = f64::from_le_bytes(b.try_into().unwrap()) / w;
            b.copy_from_slice(&v.to_le_bytes());
        }),
        DType::BF16 => buf.chunks_exact_mut(2).for_each(|b| {
            let v = bf16::from_f32(bf16::from_le_bytes(b.try_into().unwrap()).to_f32() / world as f32);
            b.copy_from_slice(&v.to_le_bytes());
        }),
        DType::F16 => buf.chunks_exact_mut(2).for_each(|b| {
            let v = f16::from_f32(f16::from_le_bytes(b.try_into().unwrap()).to_f32() / world as f32);
            b.copy_from_slice(&v.to_le_bytes());
        }),
        DType::I64 => buf.chunks_exact_mut(8).for_each(|b| {
            let v = i64::from_le_bytes(b.try_into().unwrap()) / world as i64;
            b.copy_from_slice(&v.to_le_bytes());
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes<T: Copy>(v: &[T], f: impl Fn(T) -> Vec<u8>) -> Vec<u8> {
        v.iter().flat_map(|x| f(*x)).collect()
    }

    #[test]
    fn every_dtype_and_op() {
        let a = bytes(&[1.0f32, -2.0, 3.5], |x| x.to_le_bytes().to_vec());
        let b = bytes(&[4.0f32, 5.0, -1.5], |x| x.to_le_bytes().to_vec());
        for (op, expect) in [
            (ReduceOp::Sum, [5.0, 3.0, 2.0]),
            (ReduceOp::Max, [4.0, 5.0, 3.5]),
            (ReduceOp::Min, [1.0, -2.0, -1.5]),
            (ReduceOp::Mean, [2.5, 1.5, 1.0]),
        ] {
            let mut acc = a.clone();
            accumulate(DType::F32, op, &mut acc, &b);
            finish(DType::F32, op, &mut acc, 2);
            let got: Vec<f32> = acc.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
            assert_eq!(got, expect, "{op:?}");
        }
        let mut i = bytes(&[7i64, -3], |x| x.to_le_bytes().to_vec());
        accumulate(DType::I64, ReduceOp::Mean, &mut i, &bytes(&[2i64, 0], |x| x.to_le_bytes().to_vec()));
        finish(DType::I64, ReduceOp::Mean, &mut i, 2);
        assert_eq!(i64::from_le_bytes(i[..8].try_into().unwrap()), 4);
        let mut h = bytes(&[bf16::from_f32(1.5)], |x| x.to_le_bytes().to_vec());
        accumulate(DType::BF16, ReduceOp::Sum, &mut h, &bytes(&[bf16::from_f32(2.0)], |x| x.to_le_bytes().to_vec()));
        assert_eq!(bf16::from_le_bytes(h[..2].try_into().unwrap()).to_f32(), 3.5);
        let mut d = bytes(&[1.0f64], |x| x.to_le_bytes().to_vec());
        accumulate(DType::F64, ReduceOp::Max, &mut d, &bytes(&[-1.0f64], |x| x.to_le_bytes().to_vec()));
        assert_eq!(f64::from_le_bytes(d[..8].try_into().unwrap()), 1.0);
    }
}
