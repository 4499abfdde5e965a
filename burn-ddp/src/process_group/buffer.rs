//! Typed views of the memory a collective works on.

use crate::error::{Error, Result};

/// Element types the collectives understand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 64-bit float.
    F64,
    /// 64-bit signed integer.
    I64,
    /// bfloat16 (reduced in f32).
    BF16,
    /// IEEE half (reduced in f32).
    F16,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::BF16 | DType::F16 => 2,
        }
    }
    /// Stable wire code.
    pub fn code(self) -> u8 {
        self as u8
    }
}

/// Element-wise reductions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Sum divided by the number of ranks (integer division for I64).
    Mean,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
}

/// Where a process group's buffers live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryKind {
    /// CPU memory.
    Host,
    /// CUDA device memory.
    Cuda,
}

/// The memory behind a [`Buffer`].
#[derive(Debug)]
pub enum Memory<'a> {
    /// CPU bytes, borrowed for the call.
    Host(&'a mut [u8]),
    /// CUDA device memory: a raw pointer on GPU `device`; the caller guarantees it stays valid
    /// and unused by other streams until the call returns.
    Cuda {
        /// Device pointer.
        ptr: u64,
        /// Ordinal of the GPU that owns it.
        device: usize,
    },
}

/// A typed, sized view of memory for one collective.
#[derive(Debug)]
pub struct Buffer<'a> {
    /// Element type.
    pub dtype: DType,
    /// Number of elements.
    pub len: usize,
    /// The memory.
    pub memory: Memory<'a>,
}

impl<'a> Buffer<'a> {
    /// A host buffer over `bytes`.
    ///
    /// # Panics
    /// If the byte length is not a multiple of the element size.
    pub fn host(dtype: DType, bytes: &'a mut [u8]) -> Self {
        assert!(
            bytes.len().is_multiple_of(dtype.size()),
            "Got {} bytes, not a multiple of {dtype:?}'s {} bytes",
            bytes.len(),
            dtype.size()
        );
        Self { dtype, len: bytes.len() / dtype.size(), memory: Memory::Host(bytes) }
    }

    /// A host buffer over `f32` values.
    pub fn f32(values: &'a mut [f32]) -> Self {
        Self::host(DType::F32, bytemuck_f32(values))
    }

    /// The host bytes, or an error for device memory.
    ///
    /// # Errors
    /// [`Error::Store`]-free: returns [`Error::Cuda`] when the buffer is on a GPU.
    pub fn host_bytes(&mut self, backend: &str) -> Result<&mut [u8]> {
        match &mut self.memory {
            Memory::Host(b) => Ok(b),
            Memory::Cuda { .. } => Err(Error::Cuda {
                op: format!("{backend} process group"),
                reason: "got CUDA device memory; the tcp backend works on host memory (use nccl, or copy to the host)"
                    .into(),
            }),
        }
    }
}

fn bytemuck_f32(values: &mut [f32]) -> &mut [u8] {
    // SAFETY: f32 has no invalid bit patterns and u8 has alignment 1; the length is scaled.
    unsafe { std::slice::from_raw_parts_mut(values.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(values)) }
}
