//! Which CUDA stream a device's cuDNN and cuBLAS work goes to: burn-ddp's own stream (ordered
//! with burn's by fences), or — with `CudnnOptions::same_stream` — burn's own stream for the
//! calling thread, found through CUPTI (`cuda::runtime::burn_stream`). Every switch orders the
//! new stream after everything enqueued on the old one (an event recorded there, waited for on
//! the new one), so the workspace, the cuBLAS pointer arrays and every buffer the two streams
//! share are never used by both at once.

use crate::error::Result;
use crate::nn::cuda::cudnn::types::fail;
use cudarc::driver::sys as driver;

/// The stream work goes to now, and the event a switch orders the streams with.
pub(crate) struct CurrentStream {
    own: driver::CUstream,
    current: driver::CUstream,
    handoff: Option<driver::CUevent>,
}

// SAFETY: raw handles of one context, used under the device state's mutex only.
unsafe impl Send for CurrentStream {}

impl CurrentStream {
    /// Work on `own` (burn-ddp's stream of the device).
    pub(crate) fn new(own: driver::CUstream) -> Self {
        Self { own, current: own, handoff: None }
    }

    /// The stream work goes to now.
    pub(crate) fn get(&self) -> driver::CUstream {
        self.current
    }

    /// burn-ddp's own stream of the device.
    pub(crate) fn own(&self) -> driver::CUstream {
        self.own
    }

    /// Sends later work to `to`, ordered after everything enqueued so far on the current stream;
    /// returns whether the stream changed (the caller re-binds its library handles then).
    ///
    /// # Errors
    /// When the event cannot be created, recorded or waited for.
    pub(crate) fn switch(&mut self, to: driver::CUstream) -> Result<bool> {
        if to == self.current {
            return Ok(false);
        }
        let event = match self.handoff {
            Some(e) => e,
            None => {
                let mut e = std::ptr::null_mut();
                // SAFETY: out-pointer to a local; the device's context is bound (caller).
                unsafe { driver::cuEventCreate(&mut e, driver::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) }
                    .result()
                    .map_err(|e| fail("creating the stream hand-over event", e))?;
                *self.handoff.insert(e)
            }
        };
        // SAFETY: live streams and event of the bound context.
        unsafe {
            driver::cuEventRecord(event, self.current).result().map_err(|e| fail("recording a stream hand-over", e))?;
            driver::cuStreamWaitEvent(to, event, 0).result().map_err(|e| fail("waiting for a stream hand-over", e))?;
        }
        self.current = to;
        Ok(true)
    }

    /// Waits on the host for the current stream (after a failed computation, before its
    /// buffers are reused).
    pub(crate) fn synchronize(&self) -> Result<()> {
        // SAFETY: a live stream of the bound context.
        unsafe { driver::cuStreamSynchronize(self.current) }.result().map_err(|e| fail("waiting for the stream", e))
    }
}

impl Drop for CurrentStream {
    fn drop(&mut self) {
        if let Some(e) = self.handoff.take() {
            // SAFETY: created above, destroyed once.
            let _ = unsafe { driver::cuEventDestroy_v2(e) };
        }
    }
}
