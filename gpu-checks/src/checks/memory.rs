//! Page-locked image uploads: every value arrives, also when buffers are reused while copies are queued.

use crate::util::Ad;
use burn::prelude::*;
use burn_cuda::CudaDevice;

/// Batches uploaded through page-locked memory arrive bit-exact, also when several are in
/// flight and a buffer is reused (more uploads than the ring has buffers), and the model's
/// first layer reads them in order with the uploads.
pub(crate) fn check_upload(device: &CudaDevice) -> bool {
    use burn_ddp::nn::images_to_device;
    let mut ok = true;
    // Five uploads each followed by an operation on them, then a burst of eight with nothing
    // in between (every buffer reused while its copy may still be queued).
    let mut shapes = vec![[4, 3, 17, 19], [2, 3, 224, 224], [4, 3, 17, 19], [1, 1, 5, 5], [2, 3, 224, 224]];
    shapes.extend([[4, 3, 17, 19]; 8]);
    let uploads: Vec<(Vec<f32>, Tensor<Ad, 4>)> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let v: Vec<f32> =
                (0..s.iter().product::<usize>()).map(|j| ((j * 7 + i * 13) % 1000) as f32 * 0.01 - 5.0).collect();
            let t = images_to_device::<Ad>(v.clone(), *s, device);
            (v, if i < 5 { t.mul_scalar(1.0) } else { t })
        })
        .collect();
    for (i, (v, t)) in uploads.into_iter().enumerate() {
        let got = t.into_data().into_vec::<f32>().unwrap();
        let exact = got == v;
        println!(
            "RESULT check=upload n={i} shape={:?} values={} exact={exact} {}",
            shapes[i],
            v.len(),
            if exact { "ok" } else { "FAIL" }
        );
        ok &= exact;
    }
    ok
}
