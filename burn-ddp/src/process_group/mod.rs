//! Collectives over buffers: one object-safe trait, [`ProcessGroup`], with a TCP implementation
//! (CPU memory, always built, the reference) and an NCCL one (CUDA memory, `feature = "cuda"`).

pub mod buffer;
pub mod nccl;
#[cfg(feature = "cuda")]
mod nccl_watch;
pub mod reduce;
pub mod tcp;

pub use buffer::{Buffer, DType, Memory, ReduceOp};
pub use nccl::NcclProcessGroup;
pub use tcp::TcpProcessGroup;

use crate::error::Result;
use std::time::Duration;

/// Default time-out of every collective (as PyTorch's 30 minutes would hide hangs for too long,
/// ours is 5 minutes; set `BURN_DDP_TIMEOUT_S` or the options to change it).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Options of [`ProcessGroup::all_reduce`].
#[derive(Debug, Clone, Copy)]
pub struct AllReduceOptions {
    /// The reduction.
    pub op: ReduceOp,
    /// Give up (with an error naming the peer) after this long; `None` = the group's default.
    pub timeout: Option<Duration>,
}

impl Default for AllReduceOptions {
    fn default() -> Self {
        Self { op: ReduceOp::Sum, timeout: None }
    }
}

/// Options of [`ProcessGroup::broadcast`].
#[derive(Debug, Clone, Copy, Default)]
pub struct BroadcastOptions {
    /// The rank whose buffer is sent.
    pub root: usize,
    /// Time-out; `None` = the group's default.
    pub timeout: Option<Duration>,
}

/// Options of [`ProcessGroup::all_gather`].
#[derive(Debug, Clone, Copy, Default)]
pub struct AllGatherOptions {
    /// Time-out; `None` = the group's default.
    pub timeout: Option<Duration>,
}

/// Options of [`ProcessGroup::reduce_scatter`].
#[derive(Debug, Clone, Copy)]
pub struct ReduceScatterOptions {
    /// The reduction.
    pub op: ReduceOp,
    /// Time-out; `None` = the group's default.
    pub timeout: Option<Duration>,
}

impl Default for ReduceScatterOptions {
    fn default() -> Self {
        Self { op: ReduceOp::Sum, timeout: None }
    }
}

/// Options of [`ProcessGroup::barrier`].
#[derive(Debug, Clone, Copy, Default)]
pub struct BarrierOptions {
    /// Time-out; `None` = the group's default.
    pub timeout: Option<Duration>,
}

/// A group of ranks that run collectives together. Every rank must call the same collectives in
/// the same order with buffers of the same type and size; a mismatch is detected and reported.
pub trait ProcessGroup: Send + Sync {
    /// This process's rank, `0..world_size`.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world_size(&self) -> usize;
    /// `"tcp"` or `"nccl"`.
    fn backend(&self) -> &'static str;
    /// Whether buffers must be host ([`Memory::Host`]) or CUDA device memory.
    fn memory(&self) -> buffer::MemoryKind;
    /// The NCCL group behind this one, for what only NCCL offers (collectives the host does not
    /// wait for, ordered on the device); `None` for every other group.
    fn as_nccl(&self) -> Option<&NcclProcessGroup> {
        None
    }
    /// Reduces `buf` element-wise across ranks, in place; every rank ends with the result.
    ///
    /// # Errors
    /// Time-out, dead peer (named), or mismatched buffers.
    fn all_reduce(&self, buf: Buffer<'_>, opts: &AllReduceOptions) -> Result<()>;
    /// Copies the root's `buf` into every rank's `buf`.
    ///
    /// # Errors
    /// As [`ProcessGroup::all_reduce`].
    fn broadcast(&self, buf: Buffer<'_>, opts: &BroadcastOptions) -> Result<()>;
    /// Concatenates every rank's `input` (same length on all ranks) into `output`, in rank order.
    ///
    /// # Errors
    /// As [`ProcessGroup::all_reduce`]; also if `output` is not `world_size ×` the input.
    fn all_gather(&self, input: Buffer<'_>, output: Buffer<'_>, opts: &AllGatherOptions) -> Result<()>;
    /// Reduces `input` (length `world_size × output`) across ranks and leaves block `rank` of the
    /// result in `output`.
    ///
    /// # Errors
    /// As [`ProcessGroup::all_gather`].
    fn reduce_scatter(&self, input: Buffer<'_>, output: Buffer<'_>, opts: &ReduceScatterOptions) -> Result<()>;
    /// Returns once every rank has called it.
    ///
    /// # Errors
    /// Time-out naming the ranks that did not arrive, or a dead peer.
    fn barrier(&self, opts: &BarrierOptions) -> Result<()>;
}
