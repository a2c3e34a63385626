//! Samplers and logits processors with mlx-lm's semantics.
