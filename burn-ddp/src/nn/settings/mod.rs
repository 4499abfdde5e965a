//! How the GPU layers compute: the activations' memory order, their element type, and the
//! process-wide switches of the cuDNN path.

pub mod layout;
pub mod options;
pub mod precision;
