//! Image classifiers: ResNet (BasicBlock / Bottleneck) laid out like torchvision, and the
//! model registry.

pub mod registry;
pub mod resnet;

pub use registry::{create, list_models, model_config};
pub use resnet::{Block, BlockKind, ResNet, ResNetConfig};
