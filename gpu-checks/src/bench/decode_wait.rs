//! `--bench decode-wait`: how long nvJPEG's calls keep the submitting thread, with the GPU idle
//! and with burn's stream queued full of matrix products — do they wait for other streams'
//! work? On an H100 with CUDA's 8 hardware queues they waited 133 ms behind about 250 ms of
//! products, with 32 queues 29 ms, with 1 queue 159 ms (and 35 ms with nothing queued):
//! work on a shared hardware queue runs in order (2026-12-07; `CUDA_DEVICE_MAX_CONNECTIONS`
//! set for the process picks the count, which `use_all_cuda_queues` makes 32 by default).

use crate::checks::decode::{Busy, batch_of_photos};
use burn::tensor::backend::Backend;
use burn_cuda::{Cuda, CudaDevice};
use burn_ddp::nn::crop::Normalize;
use burn_ddp::nn::decode::{DeviceDecoder, device_decode_times};
use std::time::Instant;

const UNIT: Normalize = Normalize { mean: [0.0; 3], std: [1.0; 3] };

/// `iters` batches of 256 each way: the GPU idle, then with about 60 and 240 ms of products
/// queued on burn's stream before each submission. Prints nvJPEG's time a batch on this thread
/// (the loader's measure) and the submission's wall time.
pub(crate) fn bench_decode_wait(device: &CudaDevice, iters: usize) {
    let decoder = match DeviceDecoder::for_device::<Cuda>(device) {
        Ok(d) => d,
        Err(reason) => {
            println!("RESULT bench=decode-wait no decoder: {reason}");
            return;
        }
    };
    let batch = batch_of_photos(256);
    let busy = Busy::new(device);
    let submit = |queue: usize| -> Result<(f64, f64), String> {
        for _ in 0..queue {
            busy.queue();
        }
        let before = device_decode_times();
        let started = Instant::now();
        let decoding = decoder.start(batch.clone(), [224, 224], UNIT).map_err(|e| e.to_string())?;
        let wall_ms = started.elapsed().as_secs_f64() * 1e3;
        let nvjpeg_ms = device_decode_times().since(&before).submit_s * 1e3;
        drop(decoding.to_device::<Cuda>(device).map_err(|e| e.to_string())?);
        <Cuda as Backend>::sync(device).map_err(|e| format!("{e:?}"))?;
        Ok((nvjpeg_ms, wall_ms))
    };
    for _ in 0..3 {
        if let Err(e) = submit(0) {
            println!("RESULT bench=decode-wait warm-up error: {e}");
            return;
        }
    }
    for queue in [0, 1, 4, 0] {
        let runs: Result<Vec<(f64, f64)>, String> = (0..iters.max(1)).map(|_| submit(queue)).collect();
        match runs {
            Ok(mut r) => {
                r.sort_by(|a, b| a.0.total_cmp(&b.0));
                let (lo, mid, hi) = (r[0].0, r[r.len() / 2].0, r[r.len() - 1].0);
                println!(
                    "RESULT bench=decode-wait images=256 queued_ms={:.0} nvjpeg_ms median={mid:.1} min={lo:.1} max={hi:.1} wall_ms median={:.1}",
                    queue as f64 * busy.count as f64 * busy.product_ms,
                    r[r.len() / 2].1
                );
            }
            Err(e) => println!("RESULT bench=decode-wait error: {e}"),
        }
    }
}
