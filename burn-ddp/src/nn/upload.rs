//! A batch of images from host memory to the training device: through page-locked memory on
//! burn-cuda (see `upload`), `Tensor::from_data` elsewhere.

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

#[cfg(test)]
mod tests {
    use super::*;
    use burn_flex::Flex;

    #[test]
    fn values_arrive_in_order() {
        let device = Default::default();
        let values: Vec<f32> = (0..2 * 3 * 4 * 5).map(|v| v as f32 * 0.5).collect();
        let t = images_to_device::<Flex>(values.clone(), [2, 3, 4, 5], &device);
        assert_eq!(t.dims(), [2, 3, 4, 5]);
        assert_eq!(t.into_data().into_vec::<f32>().unwrap(), values);
    }
}
