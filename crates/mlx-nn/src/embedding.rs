//! `Embedding` and `QuantizedEmbedding` (mlx.nn), and [`EmbeddingLayer`], which is either.
use crate::error::Result as NnResult;
use crate::module::Param;
use crate::quantize::QuantSpec;
use crate::variants::{pack, unpack};
use mlx_array::quant::dequantize;
use mlx_array::{ops, Array, Dtype, Result};

/// A lookup table `[num_embeddings, dims]`.
#[derive(Debug, Clone)]
pub struct Embedding {
    /// `[num_embeddings, dims]`.
    pub weight: Param,
}

crate::impl_module!(Embedding { weight });

impl Embedding {
    /// A table of zero placeholders (lazy) to be loaded.
    pub fn new(num_embeddings: i32, dims: i32) -> NnResult<Embedding> {
        Ok(Embedding {
            weight: Param::new(ops::zeros(&[num_embeddings, dims], Dtype::Float32)?),
        })
    }

    /// `weight[x]`.
    #[track_caller]
    pub fn forward(&self, x: &Array) -> Result<Array> {
        self.weight.take(x, Some(0))
    }

    /// `x @ weight.T`, for heads tied to the embeddings.
    #[track_caller]
    pub fn as_linear(&self, x: &Array) -> Result<Array> {
        x.matmul(&self.weight.transposed()?)
    }

    /// The quantized version (mlx.nn `QuantizedEmbedding.from_embedding`).
    pub fn to_quantized(&self, spec: QuantSpec) -> Result<QuantizedEmbedding> {
        let p = pack(&self.weight, spec)?;
        Ok(QuantizedEmbedding {
            weight: p.weight,
            scales: p.scales,
            biases: p.biases,
            spec,
        })
    }
}

/// An embedding table with quantized rows (mlx.nn `QuantizedEmbedding`).
#[derive(Debug, Clone)]
pub struct QuantizedEmbedding {
    /// Packed rows.
    pub weight: Param,
    /// Per-group scales.
    pub scales: Param,
    /// Per-group biases (affine mode only).
    pub biases: Option<Param>,
    /// Group size, bits and mode.
    pub spec: QuantSpec,
}

crate::impl_module!(QuantizedEmbedding {
    weight,
    scales,
    biases
});

impl QuantizedEmbedding {
    /// `dequantize(weight[x], scales[x], biases[x])`.
    #[track_caller]
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let b = match &self.biases {
            Some(b) => Some(b.take(x, Some(0))?),
            None => None,
        };
        dequantize(
            &self.weight.take(x, Some(0))?,
            &self.scales.take(x, Some(0))?,
            b.as_ref(),
            Some(self.spec.group_size),
            Some(self.spec.bits),
            self.spec.mode,
            None,
        )
    }

    /// The table used as a quantized linear layer (tied heads).
    #[track_caller]
    pub fn as_linear(&self, x: &Array) -> Result<Array> {
        crate::quantized_params_matmul(
            x,
            &self.weight,
            &self.scales,
            self.biases.as_ref(),
            true,
            self.spec,
        )
    }

    /// The dense table.
    pub fn to_dense(&self, dtype: Option<Dtype>) -> Result<Embedding> {
        let w = unpack(
            &self.weight,
            &self.scales,
            self.biases.as_ref(),
            self.spec,
            dtype,
        )?;
        Ok(Embedding {
            weight: Param::new(w),
        })
    }
}

/// An embedding that is dense or quantized (see [`crate::LinearLayer`]).
#[derive(Debug, Clone)]
pub enum EmbeddingLayer {
    /// Dense table.
    Dense(Embedding),
    /// Quantized table.
    Quantized(QuantizedEmbedding),
    /// Either, with a low-rank adapter (mlx-lm's `LoRAEmbedding`).
    Lora(Box<crate::lora::LoraEmbedding>),
}

impl EmbeddingLayer {
    /// A dense table of zero placeholders.
    pub fn new(num_embeddings: i32, dims: i32) -> NnResult<EmbeddingLayer> {
        Ok(EmbeddingLayer::Dense(Embedding::new(num_embeddings, dims)?))
    }

    /// Looks up rows.
    #[track_caller]
    pub fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            EmbeddingLayer::Dense(e) => e.forward(x),
            EmbeddingLayer::Quantized(e) => e.forward(x),
            EmbeddingLayer::Lora(e) => e.forward(x),
        }
    }

    /// Uses the table as the output projection.
    #[track_caller]
    pub fn as_linear(&self, x: &Array) -> Result<Array> {
        match self {
            EmbeddingLayer::Dense(e) => e.as_linear(x),
            EmbeddingLayer::Quantized(e) => e.as_linear(x),
            EmbeddingLayer::Lora(e) => e.as_linear(x),
        }
    }

    /// Puts a low-rank adapter on the table (see [`crate::lora::LoraEmbedding`]): `a`
    /// `[num_embeddings, rank]`, `b` `[rank, dims]`; an adapter already there is replaced.
    pub fn add_adapter(&mut self, a: Array, b: Array, scale: f64) {
        let placeholder = EmbeddingLayer::Dense(Embedding {
            weight: Param::frozen(a.clone()),
        });
        let base = match std::mem::replace(self, placeholder) {
            EmbeddingLayer::Lora(l) => l.base,
            other => other,
        };
        *self = EmbeddingLayer::Lora(Box::new(crate::lora::LoraEmbedding {
            base,
            lora_a: Param::new(a),
            lora_b: Param::new(b),
            scale,
            dropout: 0.0,
        }));
    }
}

layer_variants!(
    EmbeddingLayer,
    |q| {
        let s = q.weight.shape();
        vec![s[0], s.last().copied().unwrap_or(0) * 32 / q.spec.bits]
    },
    as_embedding_layer_mut
);
