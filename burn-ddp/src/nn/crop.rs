//! What a batch made on the device is made of: each image's pixels (JPEG bytes or decoded RGB),
//! the region cut from it, the pixel operations after the cut, and the normalisation
//! (`nn::decode` makes the batch).

use crate::nn::pixel_ops::PixelOps;

/// One image's pixels as they reach the decoder.
#[derive(Debug, Clone, PartialEq)]
pub enum Pixels {
    /// A baseline JPEG file's bytes (8-bit, three components): decoded on the device.
    Jpeg(Vec<u8>),
    /// Decoded RGB bytes, rows of `width · 3` bytes, top to bottom.
    Rgb(Vec<u8>),
}

impl Pixels {
    /// The bytes either way (the device decoder's input).
    #[cfg(feature = "cuda")]
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Pixels::Jpeg(b) | Pixels::Rgb(b) => b,
        }
    }
}

/// An image and what to cut from it: `region` `[x, y, width, height]` in its pixels
/// (fractions allowed), resized to the batch's size and mirrored left-right when `flip`.
#[derive(Debug, Clone, PartialEq)]
pub struct CropResize {
    /// The image.
    pub pixels: Pixels,
    /// `[width, height]` of the image.
    pub size: [u32; 2],
    /// `[x, y, width, height]` of the region, inside the image.
    pub region: [f32; 4],
    /// Mirror the result left-right.
    pub flip: bool,
    /// What augmentation does to the crop's pixels afterwards (nothing by default).
    pub ops: PixelOps,
}

/// Per-channel normalisation: `(v / 255 − mean) / std`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Normalize {
    /// Channel means (R, G, B).
    pub mean: [f32; 3],
    /// Channel standard deviations (R, G, B).
    pub std: [f32; 3],
}
