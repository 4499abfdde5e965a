//! Image classifiers: the abstraction the pipeline knows them by (`classifier`), ResNet
//! (BasicBlock / Bottleneck) laid out like torchvision, and the model registry.

pub mod classifier;
pub mod image_classifier;
pub mod registry;
pub mod resnet;
pub mod vit;

pub use classifier::{Classifier, ClassifierRecord, ModelConfig, load_model_record};
pub use image_classifier::{ImageClassifier, NameScheme};
pub use registry::{create, list_models, model_config};
pub use resnet::{Block, BlockKind, ResNet, ResNetConfig};
pub use vit::{VisionTransformer, VitConfig};
