//! TensorRT engine cache: the key changes with each of its parts; corrupt, truncated or
//! unfinished entries are detected and rebuilt, never loaded.

use std::collections::BTreeMap;

use cosy::model::{Dim, GraphSpec, ProfileShapes, TensorSpec, Variant};
use cosy::runtime::engine_cache::{CacheKey, EngineCache, KEY_FILE};
use cosy::runtime::factory::{build_cache_key, profile_strings};
use cosy::runtime::keyed_dir::EntryState;
use cosy::vocab::Precision;

fn spec() -> (GraphSpec, Variant) {
    let v = Variant { file: "dit.fp32.onnx".into(), sha256: "ab".repeat(32), bytes: 10, data: None };
    let mut prof = BTreeMap::new();
    prof.insert("x".to_string(), ProfileShapes { min: vec![2, 80, 4], opt: vec![2, 80, 500], max: vec![2, 80, 3000] });
    let spec = GraphSpec {
        inputs: vec![TensorSpec { name: "x".into(), dtype: "float32".into(), shape: vec![Dim::Named("batch".into()), Dim::Fixed(80), Dim::Named("frames".into())] }],
        outputs: vec![],
        variants: [("fp32".to_string(), v.clone())].into_iter().collect(),
        trt_profile: prof,
        batching: "padded_frames".into(),
    };
    (spec, v)
}

fn base_key() -> CacheKey {
    let (s, v) = spec();
    build_cache_key("dit", &s, &v, Precision::Fp16, "NVIDIA H200", "1.31.1", "10.9.0")
}

#[test]
fn key_changes_when_any_part_changes() {
    let (s, v) = spec();
    let base = base_key();
    assert_eq!(base.dir_name(), base_key().dir_name(), "the key is deterministic");
    assert!(base.dir_name().starts_with("dit-") && base.dir_name().len() == 4 + 16);
    assert!(base.options.contains(&"layer_norm_fp32_fallback".to_string()), "dit at fp16 keeps LayerNorm fp32");

    let mut other_graph = v.clone();
    other_graph.sha256 = "cd".repeat(32);
    let mut other_profile = s.clone();
    other_profile.trt_profile.get_mut("x").unwrap().max = vec![2, 80, 4000];
    let variants = [
        ("graph", build_cache_key("dit", &s, &other_graph, Precision::Fp16, "NVIDIA H200", "1.31.1", "10.9.0")),
        ("precision", build_cache_key("dit", &s, &v, Precision::Bf16, "NVIDIA H200", "1.31.1", "10.9.0")),
        ("gpu", build_cache_key("dit", &s, &v, Precision::Fp16, "NVIDIA A100", "1.31.1", "10.9.0")),
        ("ort", build_cache_key("dit", &s, &v, Precision::Fp16, "NVIDIA H200", "1.32.0", "10.9.0")),
        ("trt", build_cache_key("dit", &s, &v, Precision::Fp16, "NVIDIA H200", "1.31.1", "10.10.0")),
        ("profile", build_cache_key("dit", &other_profile, &v, Precision::Fp16, "NVIDIA H200", "1.31.1", "10.9.0")),
        ("stage", build_cache_key("llm", &s, &v, Precision::Fp16, "NVIDIA H200", "1.31.1", "10.9.0")),
    ];
    for (part, k) in &variants {
        assert_ne!(k.hash16(), base.hash16(), "changing the {part} must change the key");
    }
    let (min, opt, max) = profile_strings(&s).unwrap();
    assert_eq!((min.as_str(), opt.as_str(), max.as_str()), ("x:2x80x4", "x:2x80x500", "x:2x80x3000"));
}

#[test]
fn entries_are_validated_and_broken_ones_rebuilt() {
    let root = tempfile::tempdir().unwrap();
    let cache = EngineCache::new(root.path());
    let key = base_key();

    let (dir, reused) = cache.prepare(&key).unwrap();
    assert!(!reused);
    assert_eq!(dir, root.path().join(key.dir_name()));
    assert_eq!(cache.check(&dir, Some(&key)), EntryState::Incomplete, "a build in progress is not loadable");
    // Nothing written yet: stays incomplete.
    assert!(!cache.finish(&key).unwrap());

    let engine = dir.join("dit_123.engine");
    std::fs::write(&engine, vec![7u8; 4096]).unwrap();
    std::fs::write(dir.join("dit.timing"), vec![1u8; 100]).unwrap();
    assert!(cache.finish(&key).unwrap());
    assert_eq!(cache.check(&dir, Some(&key)), EntryState::Valid);
    let (_, reused) = cache.prepare(&key).unwrap();
    assert!(reused, "a valid entry is loaded, not rebuilt");
    assert!(engine.exists());

    // A key for something else in this folder is refused.
    let mut other = key.clone();
    other.gpu = "NVIDIA A100".into();
    assert!(matches!(cache.check(&dir, Some(&other)), EntryState::Corrupt(_)));

    // Truncated engine: detected, removed, rebuilt from scratch.
    std::fs::write(&engine, vec![7u8; 100]).unwrap();
    match cache.check(&dir, Some(&key)) {
        EntryState::Corrupt(why) => assert!(why.contains("dit_123.engine") && why.contains("truncated"), "{why}"),
        s => panic!("truncation not detected: {s:?}"),
    }
    let (dir2, reused) = cache.prepare(&key).unwrap();
    assert_eq!(dir2, dir);
    assert!(!reused);
    assert!(!engine.exists(), "the broken engine is gone");

    // Same size, altered bytes.
    std::fs::write(&engine, vec![7u8; 4096]).unwrap();
    cache.finish(&key).unwrap();
    std::fs::write(&engine, vec![8u8; 4096]).unwrap();
    assert!(matches!(cache.check(&dir, Some(&key)), EntryState::Corrupt(w) if w.contains("sha256")));

    // Empty engine.
    std::fs::write(&engine, b"").unwrap();
    assert!(matches!(cache.check(&dir, Some(&key)), EntryState::Corrupt(w) if w.contains("empty")));

    // Garbage and missing key files.
    std::fs::write(dir.join(KEY_FILE), b"{ not json").unwrap();
    assert!(matches!(cache.check(&dir, Some(&key)), EntryState::Corrupt(w) if w.contains("unreadable")));
    std::fs::remove_file(dir.join(KEY_FILE)).unwrap();
    assert!(matches!(cache.check(&dir, Some(&key)), EntryState::Corrupt(w) if w.contains("missing")));
    let (_, reused) = cache.prepare(&key).unwrap();
    assert!(!reused);

    let entries = cache.entries().unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].key.as_ref(), Some(&key));
}

/// TensorRT for RTX's runtime cache: the plugin rewrites its files as it compiles kernels, so only
/// the key is checked; the folder is kept across sessions, listed with the engines, and a folder
/// holding another key is replaced.
#[test]
fn runtime_cache_folders_keep_what_the_provider_rewrites() {
    let root = tempfile::tempdir().unwrap();
    let cache = EngineCache::new(root.path());
    let mut key = base_key();
    key.trt_version = "rtx:onnxruntime-ep-nv-tensorrt-rtx-cu12==0.5.0".into();
    key.profiles.clear();
    key.options = vec!["provider=tensorrt-rtx".into()];
    assert_ne!(key.dir_name(), base_key().dir_name(), "never a TensorRT engine's folder");

    let (dir, held) = cache.prepare_runtime_cache(&key).unwrap();
    assert!(!held);
    assert_eq!(cache.check(&dir, Some(&key)), EntryState::Valid);
    std::fs::write(dir.join("runtime.cache"), vec![3u8; 512]).unwrap();
    let (again, held) = cache.prepare_runtime_cache(&key).unwrap();
    assert_eq!(again, dir);
    assert!(held, "the provider's files are kept");
    // Rewritten by the provider between sessions: still the same entry, not "altered".
    std::fs::write(dir.join("runtime.cache"), vec![4u8; 900]).unwrap();
    assert_eq!(cache.check(&dir, Some(&key)), EntryState::Valid);
    let listed = cache.entries().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].key.as_ref(), Some(&key));

    // A folder of that name holding another key is started afresh.
    let other = root.path().join("elsewhere");
    let other_cache = EngineCache::new(&other);
    let (odir, _) = other_cache.prepare(&base_key()).unwrap();
    std::fs::rename(&odir, other.join(key.dir_name())).unwrap();
    let (fresh, held) = other_cache.prepare_runtime_cache(&key).unwrap();
    assert!(!held);
    assert_eq!(other_cache.check(&fresh, Some(&key)), EntryState::Valid);
}
