//! The element type a model computes its activations in — PyTorch's autocast, as a model
//! setting. Parameters, optimizer state, batch-norm statistics, the classifier head and the loss
//! stay f32; convolutions cast their weights to the activations' type, and their weight
//! gradients come back in f32.

use crate::error::{Error, Result};
use burn::tensor::FloatDType;
use serde::{Deserialize, Serialize};

/// Activation precision of a model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Everything in f32 (convolutions may use TF32 tensor cores, see
    /// [`super::CudnnOptions::allow_tf32`]).
    #[default]
    F32,
    /// Activations in bfloat16 (f32's exponent range: no loss scaling needed).
    Bf16,
    /// Activations in IEEE half (training scales the loss: see `train::grad_scaler`).
    F16,
}

impl Precision {
    /// The activations' element type.
    pub fn dtype(self) -> FloatDType {
        match self {
            Precision::F32 => FloatDType::F32,
            Precision::Bf16 => FloatDType::BF16,
            Precision::F16 => FloatDType::F16,
        }
    }

    /// The name used on the command line and in configs.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
            Precision::F16 => "f16",
        }
    }
}

impl std::str::FromStr for Precision {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "fp32" | "float32" => Ok(Precision::F32),
            "bf16" | "bfloat16" => Ok(Precision::Bf16),
            "f16" | "fp16" | "half" | "float16" => Ok(Precision::F16),
            other => Err(Error::InvalidValue {
                name: "--precision",
                value: other.into(),
                reason: "use f32, bf16 or f16".into(),
            }),
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_and_rejects_others() {
        assert_eq!("bf16".parse::<Precision>().unwrap(), Precision::Bf16);
        assert_eq!("FP32".parse::<Precision>().unwrap(), Precision::F32);
        assert_eq!("half".parse::<Precision>().unwrap(), Precision::F16);
        let err = "int8".parse::<Precision>().unwrap_err().to_string();
        assert!(err.contains("f32, bf16 or f16"), "{err}");
    }
}
