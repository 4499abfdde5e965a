//! Timings beside the checks (`--bench KIND`): they print figures and judge nothing.

pub(crate) mod attention;
pub(crate) mod batch_norm;
pub(crate) mod convolution;
pub(crate) mod ddp;
pub(crate) mod decode_wait;
pub(crate) mod products;
