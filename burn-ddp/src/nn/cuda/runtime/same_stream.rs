//! With `CudnnOptions::same_stream` (on by default; `BURN_DDP_SAME_STREAM=0` turns it off):
//! which computations run on burn's own CUDA stream, with no fence, instead of on burn-ddp's
//! stream behind `stream_bridge`'s four fence kernels.
//!
//! Per device, the first burn stream (thread) whose computation of an already proven kind
//! (`device_thread`: the first of each kind measures algorithms and builds plans on burn-ddp's
//! stream, the host waiting) comes through [`order`] has its CUDA stream found through CUPTI
//! (`burn_stream`, around that call's fence store on burn's stream) and owns the device's
//! same-stream path from then on; every other stream, and every device where CUPTI is missing
//! or taken (a profiler), keeps the fences. The cuDNN state orders its streams at every switch
//! (`cudnn::current_stream`), so both paths can share one workspace.

use crate::error::{Error, Result};
use crate::nn::cuda::cudnn::convolution::Order;
use crate::nn::cuda::runtime::burn_stream;
use crate::nn::cuda::runtime::stream_bridge::Fence;
use cubecl::stream_id::StreamId;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// A device's same-stream path.
#[derive(Clone, Copy)]
enum Owner {
    /// Not looked for yet.
    Untried,
    /// The burn stream that owns it, and its CUDA stream.
    Found(StreamId, usize),
    /// CUPTI could not name the stream: fences for good.
    Unavailable,
}

fn owners() -> &'static Mutex<HashMap<usize, Owner>> {
    static OWNERS: OnceLock<Mutex<HashMap<usize, Owner>>> = OnceLock::new();
    OWNERS.get_or_init(Default::default)
}

/// Burn's CUDA stream on `device` when the current burn stream owns the device's same-stream
/// path (found by an earlier computation through [`order`]) and both `same_stream` and
/// `direct_fences` are on: where a collective's ordering may be recorded directly (CUDA events,
/// `side_stream`), in order with burn's kernels. `None` otherwise.
pub(crate) fn direct_fence_stream(device: usize) -> Option<usize> {
    let o = crate::nn::settings::options::get();
    if !(o.same_stream && o.direct_fences) {
        return None;
    }
    match owners().lock().unwrap_or_else(|p| p.into_inner()).get(&device) {
        Some(&Owner::Found(id, stream)) if id == StreamId::current() => Some(stream),
        _ => None,
    }
}

/// How a computation on `device` from the current burn stream is ordered: on burn's stream
/// when `allowed` (the option is on and the kind proven) and this stream owns the device's
/// same-stream path; otherwise behind the fence `fenced` stores (and, the first time, with
/// CUPTI watching that store to find burn's stream).
///
/// # Errors
/// `fenced`'s.
pub(crate) fn order(device: usize, allowed: bool, fenced: impl FnOnce() -> Result<Fence>) -> Result<Order> {
    if !allowed {
        return fenced().map(Order::Device);
    }
    let owner = *owners().lock().unwrap_or_else(|p| p.into_inner()).entry(device).or_insert(Owner::Untried);
    match owner {
        Owner::Found(id, stream) if id == StreamId::current() => Ok(Order::Same(stream)),
        Owner::Found(..) | Owner::Unavailable => fenced().map(Order::Device),
        Owner::Untried => {
            let (fence, found) = match burn_stream::ready() {
                Ok(()) => {
                    let (fence, seen) = burn_stream::capture(fenced)?;
                    let found = burn_stream::only_stream_of_this_thread(&seen).ok_or_else(|| Error::Cuda {
                        op: "finding burn's CUDA stream through CUPTI".into(),
                        reason: format!("{} launches seen around burn's fence store, not one stream", seen.len()),
                    });
                    (fence, found)
                }
                Err(e) => (fenced(), Err(e)),
            };
            let next = match found {
                Ok(stream) => {
                    log::info!(
                        "cuDNN, cuBLAS and burn-ddp's kernels run on burn's own stream on GPU {device} (no fences)"
                    );
                    Owner::Found(StreamId::current(), stream)
                }
                Err(e) => {
                    // Once per device: it is marked unavailable for good below.
                    log::warn!(
                        "running cuDNN and cuBLAS on burn's own stream on GPU {device}: {e}; they keep burn-ddp's stream and its fences"
                    );
                    Owner::Unavailable
                }
            };
            owners().lock().unwrap_or_else(|p| p.into_inner()).insert(device, next);
            fence.map(Order::Device)
        }
    }
}
