//! A batch of images, and its labels, from host memory to the training device: through
//! page-locked memory on burn-cuda (see `upload`), `Tensor::from_data` elsewhere.

use burn::prelude::*;

/// `images` (`n·c·h·w` values, NCHW) as a tensor on `device`.
///
/// # Shapes
/// `images.len() == shape.iter().product()`; returns `shape`.
pub fn images_to_device<B: Backend>(images: Vec<f32>, shape: [usize; 4], device: &B::Device) -> Tensor<B, 4> {
    assert_eq!(images.len(), shape.iter().product::<usize>(), "Got {} values for shape {shape:?}", images.len());
    #[cfg(feature = "cuda")]
    if let Some(t) = crate::nn::cuda::runtime::upload::try_upload::<B>(&images, shape, device) {
        return t;
    }
    Tensor::from_data(TensorData::new(images, shape), device)
}

/// Class labels as a `[n]` integer tensor on `device`. On burn-cuda they travel as the images
/// do (page-locked, queued behind nothing; as f32, exact for labels below 2^24, made integers on
/// the device): `Tensor::from_data` copies from pageable memory there, and CUDA makes such a
/// copy wait until the stream has run everything queued before it — a pause of the GPU every
/// training step while the host queues the next one.
pub fn labels_to_device<B: Backend>(labels: Vec<i64>, device: &B::Device) -> Tensor<B, 1, Int> {
    let n = labels.len();
    #[cfg(feature = "cuda")]
    if n > 0 && labels.iter().all(|l| (0..1 << 24).contains(l)) {
        let values: Vec<f32> = labels.iter().map(|&l| l as f32).collect();
        if let Some(t) = crate::nn::cuda::runtime::upload::try_upload::<B>(&values, [n, 1, 1, 1], device) {
            return t.reshape([n]).int();
        }
    }
    Tensor::from_data(TensorData::new(labels, [n]), device)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_flex::Flex;

    #[test]
    fn labels_arrive_in_order() {
        let labels = vec![3, 0, 7, 1 << 25];
        let t = labels_to_device::<Flex>(labels.clone(), &Default::default());
        assert_eq!(t.into_data().convert::<i64>().into_vec::<i64>().unwrap(), labels);
    }

    #[test]
    fn values_arrive_in_order() {
        let device = Default::default();
        let values: Vec<f32> = (0..2 * 3 * 4 * 5).map(|v| v as f32 * 0.5).collect();
        let t = images_to_device::<Flex>(values.clone(), [2, 3, 4, 5], &device);
        assert_eq!(t.dims(), [2, 3, 4, 5]);
        assert_eq!(t.into_data().into_vec::<f32>().unwrap(), values);
    }
}
