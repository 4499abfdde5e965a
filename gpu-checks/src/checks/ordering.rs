//! Every cuDNN call the checks before it made was ordered on the device (burn's stream), not
//! waited for on the host — unless the host wait was asked for (`CudnnOptions::host_sync`).

use burn_cuda::CudaDevice;
use burn_ddp::nn::{CudnnTimes, options};

/// Judges the cuDNN calls made so far in this process: it runs last, after the checks that
/// call cuDNN, and fails when there were none to judge.
pub(crate) fn check_cudnn_ordering(_device: &CudaDevice) -> bool {
    let t = CudnnTimes::now();
    let ordered = options::get().host_sync || (t.calls > 0 && t.device_ordered == t.calls);
    println!(
        "RESULT cuDNN calls={} ordered_on_device={} {}{}",
        t.calls,
        t.device_ordered,
        if ordered { "ok" } else { "FAIL" },
        if t.calls == 0 { " (no cuDNN call was made: run this check after the convolution checks)" } else { "" }
    );
    ordered
}
