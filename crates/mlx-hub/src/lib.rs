//! Model resolution and the default model.
