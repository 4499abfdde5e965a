//! cuDNN through its FFI, on raw device addresses: convolutions (legacy entry points and
//! graph-API plans), batch norm, layer norm and fused attention graphs, the shared vocabulary and
//! backend plumbing, and finalized plans kept on disk.

pub mod attention;
pub(crate) mod backend;
pub mod batch_norm;
pub(crate) mod conv_graph;
pub mod convolution;
pub(crate) mod current_stream;
pub(crate) mod graph;
pub mod layer_norm;
pub(crate) mod plan_store;
pub(crate) mod types;
