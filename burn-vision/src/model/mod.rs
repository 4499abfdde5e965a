//! Image classifiers: the abstraction the pipeline knows them by (`classifier`), ResNet
//! (BasicBlock / Bottleneck) laid out like torchvision, and the model registry.

pub mod classifier;
pub mod registry;
pub mod resnet;

pub use classifier::{Classifier, ClassifierRecord, ImageClassifier, ModelConfig, load_model_record};
pub use registry::{create, list_models, model_config};
pub use resnet::{Block, BlockKind, ResNet, ResNetConfig};
