//! PyTorch weights in and out: torchvision's and timm's state dicts (`.pth`/`.pt`,
//! `.safetensors`, with `state_dict`/`model` wrappers and DDP's `module.` prefix) loaded into
//! the registry's models through burn-store, and models exported under the same names.
//!
//! Layers: `source` (the file's tensors) and `names` (our parameters under PyTorch's names) →
//! `import` / `export` (→ `torch_save`, the `.pth` writer).

pub mod export;
pub mod golden;
pub mod import;
pub mod names;
pub mod source;
pub mod torch_save;

pub use export::{WeightFormat, export, scheme_index};
pub use import::{ImportReport, load_pretrained};
