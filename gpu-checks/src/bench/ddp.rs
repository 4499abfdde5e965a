//! DDP's host time per step over a one-rank NCCL group.

use crate::checks::nccl::{ConvStack, ddp_steps};
use crate::util::Ad;
use burn::prelude::*;
use burn::tensor::Distribution;
use burn_cuda::CudaDevice;

/// Host time per step of plain training, DDP on the device route and DDP with blocking
/// collectives (`BURN_DDP_NCCL_HOST_SYNC=1`), one-rank NCCL, 6 convolutions of 64 features at
/// 56², batch 32, f32.
pub(crate) fn bench_nccl_ddp(device: &CudaDevice, pg: std::sync::Arc<burn_ddp::Group>) {
    let model = ConvStack::<Ad>::new(device, &[64; 7]);
    let (x, g) = (
        Tensor::<Ad, 4>::random([32, 64, 56, 56], Distribution::Normal(0.0, 1.0), device),
        Tensor::<Ad, 4>::random([32, 64, 56, 56], Distribution::Normal(0.0, 1.0), device),
    );
    let config = burn_ddp::DdpConfig { bucket_bytes: 64 << 10, ..Default::default() };
    let ddp = burn_ddp::DistributedDataParallel::new(pg.clone(), config);
    let after_backward = burn_ddp::DistributedDataParallel::new(pg, burn_ddp::DdpConfig { overlap: false, ..config });
    for (name, with_ddp, host_sync) in [
        ("plain", None, false),
        ("ddp_device", Some(&ddp), false),
        ("ddp_device_after_backward", Some(&after_backward), false),
        ("ddp_host_sync", Some(&ddp), true),
        ("ddp_device", Some(&ddp), false),
    ] {
        // SAFETY: read by this thread only (the route is chosen per step on this thread).
        unsafe { std::env::set_var("BURN_DDP_NCCL_HOST_SYNC", if host_sync { "1" } else { "0" }) };
        let _ = ddp_steps(model.clone(), with_ddp, (&x, &g), 3);
        burn_ddp::trace::start();
        let [backward, optimizer, wall] = ddp_steps(model.clone(), with_ddp, (&x, &g), 20).1;
        let mut spans: std::collections::BTreeMap<String, (usize, f64)> = Default::default();
        for s in burn_ddp::trace::stop() {
            let e = spans.entry(s.name).or_default();
            (e.0, e.1) = (e.0 + 1, e.1 + s.dur_us / 1e3 / 20.0);
        }
        let spans: Vec<String> = spans.into_iter().map(|(k, (n, ms))| format!("{k}: {n}x {ms:.2} ms/step")).collect();
        println!(
            "RESULT bench=nccl_ddp run={name} host_ms_per_step backward={backward:.2} optimizer={optimizer:.2} wall_ms_per_step={wall:.2} | {}",
            spans.join("; ")
        );
    }
    unsafe { std::env::remove_var("BURN_DDP_NCCL_HOST_SYNC") };
}
