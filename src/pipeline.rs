//! TODO(owner): see docs/model-format.md
