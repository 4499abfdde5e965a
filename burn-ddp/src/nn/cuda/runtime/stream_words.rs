//! Words of device memory that one CUDA stream writes and another waits for
//! (`cuStreamWriteValue32` / `cuStreamWaitValue32`: stream memory operations, no kernel, no
//! multiprocessor held), so that a stream can be made to wait for work that the host has not
//! enqueued yet — what a CUDA event cannot do: a wait on an event sees only the records made
//! before it.
//!
//! Each piece of work takes its own word ([`Words::take`]) and its own value, written once; the
//! waiter waits for equality, so words shared by several streams, or reused after
//! [`SLOTS`] pieces of work, never release a wait early (a word is reused only once the wait on
//! its previous value has passed: that wait sits on burn's stream, ahead of everything that
//! could start the work that takes the word next).
//!
//! The words are a plain `cuMemAlloc` allocation of the device's primary context:
//! `cuStreamWaitValue32` refuses memory from cubecl's pools and from stream-ordered allocators.

use crate::error::Result;
use crate::nn::cuda::cudnn::types::fail;
use cudarc::driver::{CudaContext, sys as driver};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Words per device: far more pieces of work than are ever in flight at once (a DDP step has
/// one per bucket).
pub const SLOTS: u32 = 4096;

/// One piece of work's word: where it lives and the value that says the work is done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Word {
    pub at: driver::CUdeviceptr,
    pub value: u32,
}

/// A device's words (allocated once, for the process's life) and the next value to hand out.
pub struct Words {
    base: driver::CUdeviceptr,
    next: u32,
}

impl Words {
    /// Allocates the words in `ctx` (bound on this thread) and proves that the driver runs
    /// stream memory operations on them: a wait on one stream holds it until another stream
    /// writes the value.
    ///
    /// # Errors
    /// When the driver refuses the operations (older drivers, some virtualised GPUs), or the
    /// wait did not hold its stream.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        let mut base = 0;
        // SAFETY: an out-pointer to a local; the context is bound on this thread.
        unsafe { driver::cuMemAlloc_v2(&mut base, SLOTS as usize * 4) }
            .result()
            .map_err(|e| fail("allocating the stream words", e))?;
        // SAFETY: the allocation above, SLOTS words long.
        unsafe { driver::cuMemsetD32_v2(base, 0, SLOTS as usize) }
            .result()
            .map_err(|e| fail("clearing the stream words", e))?;
        let words = Self { base, next: 0 };
        words.self_test(ctx)?;
        Ok(words)
    }

    /// A fresh word and value (never 0, the words' initial value).
    pub fn take(&mut self) -> Word {
        self.next = self.next.wrapping_add(1).max(1);
        Word { at: self.base + u64::from(self.next % SLOTS) * 4, value: self.next }
    }

    /// Stream `waiter` waits for a word that stream `writer` writes; `waiter` must still be
    /// waiting 20 ms later (`cuStreamQuery`), and finish once the value is written.
    fn self_test(&self, ctx: &Arc<CudaContext>) -> Result<()> {
        let streams = (ctx.new_stream(), ctx.new_stream());
        let (Ok(waiter), Ok(writer)) = streams else {
            return Err(fail("testing stream memory operations", "no stream"));
        };
        let (test, after) = (Word { at: self.base, value: 7 }, Word { at: self.base + 4, value: 9 });
        // SAFETY: live streams of the bound context; words of our allocation.
        unsafe {
            wait(waiter.cu_stream(), test)?;
            write(waiter.cu_stream(), after)?;
        }
        std::thread::sleep(Duration::from_millis(20));
        // SAFETY: a live stream.
        let held = unsafe { driver::cuStreamQuery(waiter.cu_stream()) } == driver::CUresult::CUDA_ERROR_NOT_READY;
        // SAFETY: as above.
        unsafe { write(writer.cu_stream(), test)? };
        waiter.synchronize().map_err(|e| fail("testing stream memory operations", e))?;
        let done = read(after.at)? == after.value;
        // SAFETY: our allocation, the two words the test used.
        unsafe { driver::cuMemsetD32_v2(self.base, 0, 2) }
            .result()
            .map_err(|e| fail("clearing the stream words", e))?;
        match (held, done) {
            (true, true) => Ok(()),
            _ => Err(fail(
                "testing stream memory operations",
                format!("a wait held its stream: {held}; the work after it ran once released: {done}"),
            )),
        }
    }
}

/// Enqueues on `stream` the write of `word`'s value, after everything enqueued before it.
///
/// # Safety
/// `stream` is a live stream of the context `word` was allocated in, bound on this thread.
///
/// # Errors
/// The driver's.
pub unsafe fn write(stream: driver::CUstream, word: Word) -> Result<()> {
    let flags = driver::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
    // SAFETY: the caller's.
    unsafe { driver::cuStreamWriteValue32_v2(stream, word.at, word.value, flags) }
        .result()
        .map_err(|e| fail("writing a stream word", e))
}

/// Enqueues on `stream` a wait until `word` holds its value: what follows on `stream` runs
/// after the write, whenever the write is enqueued.
///
/// # Safety
/// As [`write`].
///
/// # Errors
/// The driver's.
pub unsafe fn wait(stream: driver::CUstream, word: Word) -> Result<()> {
    let flags = driver::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_EQ as u32;
    // SAFETY: the caller's.
    unsafe { driver::cuStreamWaitValue32_v2(stream, word.at, word.value, flags) }
        .result()
        .map_err(|e| fail("waiting for a stream word", e))
}

/// The host waits until `word` holds its value (polling it), or 60 s: where a stream could not
/// be made to wait.
///
/// # Errors
/// When the word cannot be read, or the value did not come.
pub fn host_wait(word: Word) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while read(word.at)? != word.value {
        if Instant::now() > deadline {
            return Err(fail("waiting on the host for a stream word", "no value after 60 s"));
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    Ok(())
}

fn read(at: driver::CUdeviceptr) -> Result<u32> {
    let mut v = 0u32;
    // SAFETY: four bytes of our allocation into a local.
    unsafe { driver::cuMemcpyDtoH_v2((&mut v as *mut u32).cast(), at, 4) }
        .result()
        .map_err(|e| fail("reading a stream word", e))?;
    Ok(v)
}
