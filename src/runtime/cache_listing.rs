//! Which cache entries the current setup would use: the folder names of the TensorRT engines and
//! optimised graphs that this model folder, hardware and ONNX Runtime library key to. `cosy
//! doctor` and `cosy engines list|clean` compare the folders on disk with these to tell current
//! entries from stale ones.

use std::collections::BTreeSet;

use crate::runtime::factory::SessionFactory;
use crate::vocab::{Precision, ProviderKind, StageGroup};

/// Optimised-graph cache folder names the current model, CPU and library would use: every stage
/// and graph variant, on the CPU provider (the only one the cache serves).
pub fn current_graph_keys(factory: &SessionFactory) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (stage, spec) in &factory.model.manifest.graphs {
        for p in Precision::ALL {
            if let Some(v) = spec.variant(p) {
                out.insert(factory.graph_key(stage, v, p, &[ProviderKind::Cpu]).dir_name());
            }
        }
    }
    out
}

/// TensorRT engine cache folder names (and TensorRT for RTX runtime-cache folder names) the
/// current model, hardware and library would use, for every stage and precision.
pub fn current_engine_keys(factory: &SessionFactory) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for stage in factory.model.manifest.graphs.keys() {
        if StageGroup::of_graph(stage).is_none() {
            continue;
        }
        // int8 never builds a TensorRT engine (refused in the factory), so it has no cache key.
        for p in Precision::ALL.into_iter().filter(|p| *p != Precision::Int8) {
            if let Ok(k) = factory.cache_key(stage, p) {
                out.insert(k.dir_name());
            }
            // TensorRT for RTX's runtime cache for the same stage and precision.
            if let Ok(k) = factory.rtx_cache_key(stage, p) {
                out.insert(k.dir_name());
            }
        }
    }
    out
}
