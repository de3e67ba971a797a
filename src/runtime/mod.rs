//! Sessions, execution providers and the TensorRT engine cache.
