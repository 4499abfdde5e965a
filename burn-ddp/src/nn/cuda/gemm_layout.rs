//! Matrix products as a column-major BLAS library sees burn's row-major tensors: operands
//! (row- or column-major matrices one stride apart in a batch), the products cuBLAS takes, and
//! the checks — plain arithmetic on shapes and strides, tested without a GPU
//! (`cublas` and `cuda::ops::matmul` hand the results to cuBLAS).
//!
//! Products are described row-major, as burn's tensors are: `C[M, N] = A[M, K] · B[K, N]` per
//! batch. A column-major library computes `Cᵀ = Bᵀ · Aᵀ`, and a row-major matrix read
//! column-major is its transpose, so no data moves; a transposed view (`row_stride == 1`) is
//! read with the library's transpose flag.

use crate::error::{Error, Result};
use burn::tensor::{DType, Shape};

/// The element type of all three matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GemmType {
    F32,
    Bf16,
    F16,
}

/// One operand as stored: `rows × cols` per batch, element `(i, j)` at
/// `batch · batch_stride + i · row_stride + j · col_stride` (elements, not bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Operand {
    pub rows: usize,
    pub cols: usize,
    pub row_stride: usize,
    pub col_stride: usize,
    pub batch_stride: usize,
}

impl Operand {
    /// The same memory read as the transposed matrix.
    pub fn t(self) -> Self {
        Operand { rows: self.cols, cols: self.rows, row_stride: self.col_stride, col_stride: self.row_stride, ..self }
    }

    /// Whether cuBLAS reads it as it lies (row- or column-major, no gaps inside a row).
    pub fn is_readable(&self) -> bool {
        self.column_major().is_some()
    }

    /// How a column-major library reads this operand as its transpose (see the module
    /// documentation): `(transposed, leading dimension)` — not transposed with the row stride
    /// for a row-major matrix, transposed with the column stride for a column-major one —
    /// or `None` when neither layout fits.
    pub fn column_major(&self) -> Option<(bool, usize)> {
        if self.col_stride == 1 && self.row_stride >= self.cols.max(1) {
            Some((false, self.row_stride))
        } else if self.row_stride == 1 && self.col_stride >= self.rows.max(1) {
            Some((true, self.col_stride))
        } else {
            None
        }
    }
}

/// `C = A · B` for `batch` matrices; `c` must be row-major.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Gemm {
    pub dtype: GemmType,
    pub a: Operand,
    pub b: Operand,
    pub c: Operand,
    pub batch: usize,
}

impl Gemm {
    /// Errors unless the shapes chain, every operand has a layout cuBLAS reads, and every size
    /// fits cuBLAS's 32-bit arguments.
    pub fn validate(&self) -> Result<()> {
        let (a, b, c) = (self.a, self.b, self.c);
        let bad = |reason: String| Err(Error::Cudnn { op: "cuBLAS matrix product", reason });
        if a.cols != b.rows || c.rows != a.rows || c.cols != b.cols {
            return bad(format!(
                "shapes {}x{} · {}x{} → {}x{} do not chain",
                a.rows, a.cols, b.rows, b.cols, c.rows, c.cols
            ));
        }
        if c.col_stride != 1 || !a.is_readable() || !b.is_readable() {
            return bad(format!("unsupported strides {a:?} {b:?} {c:?}"));
        }
        let fits = |v: usize| v <= i32::MAX as usize;
        let all =
            [a.rows, a.cols, b.cols, a.row_stride, a.col_stride, b.row_stride, b.col_stride, c.row_stride, self.batch];
        if !all.into_iter().all(fits)
            || [a.batch_stride, b.batch_stride, c.batch_stride].iter().any(|&s| s > i64::MAX as usize)
        {
            return bad(format!("sizes beyond cuBLAS's 32-bit arguments: {self:?}"));
        }
        Ok(())
    }
}

/// One matrix as a column-major library with layout descriptors (cuBLASLt) takes it: stored
/// `rows × cols` with leading dimension `ld`, read through its transpose when `transposed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stored {
    pub rows: usize,
    pub cols: usize,
    pub ld: usize,
    pub transposed: bool,
}

/// `gemm`'s matrices as a column-major library computes `Cᵀ = Bᵀ · Aᵀ` (see the module
/// documentation): `[its first operand (our b), its second (our a), its output (our c)]`,
/// `None` when an operand has no layout it reads.
pub fn column_major_layouts(gemm: &Gemm) -> Option<[Stored; 3]> {
    let (tb, ld_b) = gemm.b.column_major()?;
    let (ta, ld_a) = gemm.a.column_major()?;
    let (m, n, k) = (gemm.c.cols, gemm.c.rows, gemm.a.cols);
    let stored = |transposed: bool, rows: usize, cols: usize, ld: usize| {
        let (rows, cols) = if transposed { (cols, rows) } else { (rows, cols) };
        Stored { rows, cols, ld, transposed }
    };
    Some([stored(tb, m, k, ld_b), stored(ta, k, n, ld_a), stored(false, m, n, gemm.c.row_stride)])
}

/// The product's output shape, or why cuBLAS does not take it.
pub fn describe(a: &Shape, b: &Shape, ta: DType, tb: DType) -> Result<Shape> {
    let (da, db) = (a.as_slice(), b.as_slice());
    let bad = |reason: String| Err(Error::Cudnn { op: "cuBLAS matrix product", reason });
    if ta != tb || gemm_type(ta).is_none() {
        return bad(format!("element types {ta:?} and {tb:?}: needs one of f32, bf16, f16"));
    }
    let r = da.len();
    if r < 2 || da[..r - 2] != db[..r - 2] || da[r - 1] != db[r - 2] {
        return bad(format!("shapes {da:?} · {db:?}: needs rank ≥ 2, equal batch axes and chained inner sizes"));
    }
    let mut out = da.to_vec();
    out[r - 1] = db[r - 1];
    Ok(Shape::from(out))
}

pub fn gemm_type(dtype: DType) -> Option<GemmType> {
    match dtype {
        DType::F32 => Some(GemmType::F32),
        DType::BF16 => Some(GemmType::Bf16),
        DType::F16 => Some(GemmType::F16),
        _ => None,
    }
}

/// The one stride between consecutive matrices of the batch axes `dims` (row-major batch
/// order), or `None` when the axes cannot be walked with one stride.
pub fn batch_stride(dims: &[usize], strides: &[usize]) -> Option<usize> {
    let (mut step, mut next) = (None, None);
    for (&d, &s) in dims.iter().zip(strides).rev().filter(|(d, _)| **d != 1) {
        match next {
            None => step = Some(s),
            Some(n) if n == s => {}
            Some(_) => return None,
        }
        next = Some(s * d);
    }
    Some(step.unwrap_or(0))
}

/// The element offset of each matrix of the batch axes `dims` (row-major batch order), for
/// batches that cannot be walked with one stride (cuBLAS then gets an array of pointers).
pub fn batch_offsets(dims: &[usize], strides: &[usize]) -> Vec<usize> {
    let mut offsets = vec![0];
    for (&d, &s) in dims.iter().zip(strides) {
        offsets = offsets.iter().flat_map(|&o| (0..d).map(move |i| o + i * s)).collect();
    }
    offsets
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row_major(rows: usize, cols: usize) -> Operand {
        Operand { rows, cols, row_stride: cols, col_stride: 1, batch_stride: rows * cols }
    }

    #[test]
    fn a_transposed_view_is_read_with_op_t_and_no_copy() {
        let a = row_major(3, 5);
        assert_eq!(a.column_major(), Some((false, 5)));
        assert_eq!(a.t().column_major(), Some((true, 5)));
        assert_eq!(a.t().t(), a);
    }

    #[test]
    fn shapes_that_do_not_chain_or_strided_columns_are_refused() {
        let g = Gemm { dtype: GemmType::Bf16, a: row_major(4, 8), b: row_major(8, 2), c: row_major(4, 2), batch: 1 };
        assert!(g.validate().is_ok());
        assert!(Gemm { b: row_major(7, 2), ..g }.validate().is_err());
        let gappy = Operand { col_stride: 2, row_stride: 16, ..row_major(4, 8) };
        assert!(Gemm { a: gappy, ..g }.validate().is_err());
        assert!(Gemm { c: row_major(4, 2).t().t(), ..g }.validate().is_ok());
    }

    /// `C[4, 6] = A[4, 8] · B[8, 6]`, B as it lies and as the transposed view of a `[6, 8]`
    /// buffer (a linear layer's weight): the first operand is B as an `n × k` column-major
    /// matrix (or its `k × n` transpose), the second A as `k × m`, the output `n × m`; every
    /// leading dimension covers its column.
    #[test]
    fn column_major_layouts_read_the_row_major_product_in_place() {
        let (a, b, c) = (row_major(4, 8), row_major(8, 6), row_major(4, 6));
        let g = Gemm { dtype: GemmType::Bf16, a, b, c, batch: 1 };
        let s = |rows, cols, ld, transposed| Stored { rows, cols, ld, transposed };
        assert_eq!(column_major_layouts(&g), Some([s(6, 8, 6, false), s(8, 4, 8, false), s(6, 4, 6, false)]));
        let g = Gemm { b: row_major(6, 8).t(), ..g };
        assert_eq!(column_major_layouts(&g), Some([s(8, 6, 8, true), s(8, 4, 8, false), s(6, 4, 6, false)]));
        let g = Gemm { a: row_major(8, 4).t(), ..g };
        assert_eq!(column_major_layouts(&g).unwrap()[1], s(4, 8, 4, true));
        for l in column_major_layouts(&g).unwrap() {
            assert!(l.ld >= l.rows, "{l:?}");
        }
        let gappy = Operand { col_stride: 2, row_stride: 16, ..row_major(4, 8) };
        assert_eq!(column_major_layouts(&Gemm { a: gappy, ..g }), None);
    }

    #[test]
    fn batch_axes_walk_with_one_stride_only_when_nested() {
        assert_eq!(batch_stride(&[], &[]), Some(0));
        assert_eq!(batch_stride(&[4, 12], &[12 * 50, 50]), Some(50));
        assert_eq!(batch_stride(&[4, 1, 12], &[600, 7, 50]), Some(50));
        assert_eq!(batch_stride(&[1, 1], &[9, 9]), Some(0));
        // q of a ViT's qkv projection viewed [n, h, t, d]: heads are d apart, images 3·h·d·t.
        assert_eq!(batch_stride(&[4, 12], &[197 * 3 * 768, 64]), None);
    }

    #[test]
    fn batch_offsets_walk_the_batch_axes_in_row_major_order() {
        assert_eq!(batch_offsets(&[], &[]), vec![0]);
        assert_eq!(batch_offsets(&[2, 3], &[100, 7]), vec![0, 7, 14, 100, 107, 114]);
        // Where one stride does, the offsets are its multiples.
        assert_eq!(batch_offsets(&[2, 3], &[30, 10]), (0..6).map(|i| i * 10).collect::<Vec<_>>());
    }

    #[test]
    fn shapes_cublas_takes() {
        let s = |v: &[usize]| Shape::from(v.to_vec());
        assert_eq!(describe(&s(&[2, 3, 4]), &s(&[2, 4, 5]), DType::BF16, DType::BF16).unwrap(), s(&[2, 3, 5]));
        assert!(describe(&s(&[2, 3, 4]), &s(&[1, 4, 5]), DType::F32, DType::F32).is_err(), "broadcast batch");
        assert!(describe(&s(&[3, 4]), &s(&[5, 6]), DType::F32, DType::F32).is_err(), "inner sizes");
        assert!(describe(&s(&[3, 4]), &s(&[4, 6]), DType::F32, DType::BF16).is_err(), "mixed types");
        assert!(describe(&s(&[4]), &s(&[4]), DType::F32, DType::F32).is_err(), "rank 1");
    }
}
