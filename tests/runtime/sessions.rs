//! Session factory on the CPU library: every graph opens and runs, provider errors and fallback,
//! IoBinding, and graph I/O validation.


use std::sync::Arc;

use crate::common::{config_for, fixture_model_dir, inputs_for};
use cosy::model::{check_graph_io, ModelDir};
use cosy::runtime::SessionFactory;
use cosy::Error;
use cosy::vocab::{Precision, ProviderKind};

fn factory(model: &std::path::Path, cache: &std::path::Path, edit: impl FnOnce(&mut cosy::config::Config)) -> SessionFactory {
    let mut cfg = config_for(model, cache);
    edit(&mut cfg);
    let dir = Arc::new(ModelDir::open(model).expect("model folder opens"));
    SessionFactory::new(&cfg, dir).expect("ONNX Runtime loads")
}

#[test]
fn every_graph_opens_and_runs_on_cpu() {
    let Some(model) = fixture_model_dir() else { return };
    let cache = tempfile::tempdir().unwrap();
    let f = factory(model.path(), cache.path(), |_| {});
    let stages: Vec<String> = f.model.manifest.graphs.keys().cloned().collect();
    assert!(stages.contains(&"campplus".to_string()) && stages.contains(&"speech_tokenizer".to_string()));
    for stage in stages {
        let spec = f.model.graph(&stage).unwrap().clone();
        let mut s = f.open_named(&stage).unwrap_or_else(|e| panic!("{stage}: {e}"));
        assert_eq!(s.provider_used, ProviderKind::Cpu, "{stage}");
        assert_eq!(s.precision, Precision::Fp32, "{stage}");
        assert!(s.fallbacks.is_empty());
        assert!(check_graph_io(&stage, &spec, s.session.inputs(), s.session.outputs()).is_empty());
        let inputs = inputs_for(&stage, &spec);
        let outputs = s.session.run(inputs).unwrap_or_else(|e| panic!("{stage} run: {e}"));
        for o in &spec.outputs {
            let v = outputs.get(&o.name).unwrap_or_else(|| panic!("{stage}: no output {}", o.name));
            let shape = v.dtype().tensor_shape().expect("tensor").to_vec();
            assert_eq!(shape.len(), o.shape.len(), "{stage} {} rank", o.name);
            for (d, want) in shape.iter().zip(&o.shape) {
                if let cosy::model::Dim::Fixed(n) = want {
                    assert_eq!(d, n, "{stage} {} fixed dim", o.name);
                }
            }
            if o.dtype == "float32" {
                let (_, data) = v.try_extract_tensor::<f32>().unwrap();
                assert!(!data.is_empty() && data.iter().all(|x| x.is_finite()), "{stage} {} finite", o.name);
            }
        }
        if stage == "campplus" {
            let out = outputs.get("output").unwrap().try_extract_array::<f32>().unwrap();
            assert_eq!(out.shape(), &[1, 192]);
            assert!(out.iter().any(|&x| x != 0.0), "campplus embedding is not all zeros");
        }
        if stage == "speech_tokenizer" {
            let (shape, ids) = outputs.get("indices").unwrap().try_extract_tensor::<i32>().unwrap();
            assert_eq!(shape[0], 1);
            assert!(shape[1] > 0);
            assert!(ids.iter().all(|&t| (0..6561).contains(&t)), "token ids in the codebook");
        }
    }
}

#[test]
fn cuda_on_the_cpu_library_is_a_clear_error() {
    let Some(model) = fixture_model_dir() else { return };
    let cache = tempfile::tempdir().unwrap();
    for kind in [ProviderKind::Cuda, ProviderKind::TensorRt] {
        let f = factory(model.path(), cache.path(), |c| c.runtime.providers = vec![kind, ProviderKind::Cpu]);
        if cosy::runtime::providers::compiled_in(kind) {
            eprintln!("SKIP: the loaded library has {kind}");
            return;
        }
        let err = f.open(cosy::vocab::Stage::Campplus).expect_err("asking for a GPU provider on the CPU library must fail");
        match &err {
            Error::Provider { provider, msg } => {
                assert_eq!(provider, kind.as_str());
                assert!(msg.contains("built without") && msg.contains(kind.ort_name()), "{msg}");
                assert!(msg.contains("setup-ort.sh --gpu") && msg.contains("allow_fallback"), "says how to fix: {msg}");
            }
            other => panic!("wrong error kind: {other}"),
        }
    }
}

#[test]
fn fallback_runs_on_cpu_and_says_so() {
    let Some(model) = fixture_model_dir() else { return };
    let cache = tempfile::tempdir().unwrap();
    if cosy::runtime::providers::compiled_in(ProviderKind::Cuda) {
        eprintln!("SKIP: the loaded library has CUDA");
        return;
    }
    let f = factory(model.path(), cache.path(), |c| {
        c.runtime.providers = vec![ProviderKind::TensorRt, ProviderKind::Cuda];
        c.runtime.allow_fallback = true;
        c.runtime.precision = Precision::Fp16;
    });
    let mut s = f.open(cosy::vocab::Stage::Campplus).expect("fallback opens on CPU");
    assert_eq!(s.provider_used, ProviderKind::Cpu);
    assert_eq!(s.fallbacks.len(), 2, "{:?}", s.fallbacks);
    assert!(s.fallbacks[0].contains("tensorrt") && s.fallbacks[1].contains("cuda"), "{:?}", s.fallbacks);
    // No fp16 campplus graph: CPU runs the fp32 one and the session says so.
    assert_eq!(s.precision, Precision::Fp32);
    let spec = f.model.graph("campplus").unwrap().clone();
    let out = s.session.run(inputs_for("campplus", &spec)).expect("runs");
    assert_eq!(out.get("output").unwrap().try_extract_array::<f32>().unwrap().shape(), &[1, 192]);
}

#[test]
fn per_stage_provider_override_applies() {
    let Some(model) = fixture_model_dir() else { return };
    let cache = tempfile::tempdir().unwrap();
    if cosy::runtime::providers::compiled_in(ProviderKind::Cuda) {
        return;
    }
    let f = factory(model.path(), cache.path(), |c| {
        c.stages.get_mut(&cosy::vocab::StageGroup::Frontend).unwrap().providers = Some(vec![ProviderKind::Cuda]);
    });
    assert!(matches!(f.open(cosy::vocab::Stage::Campplus), Err(Error::Provider { .. })));
}

#[test]
fn io_binding_matches_a_plain_run() {
    let Some(model) = fixture_model_dir() else { return };
    let cache = tempfile::tempdir().unwrap();
    let f = factory(model.path(), cache.path(), |_| {});
    let spec = f.model.graph("campplus").unwrap().clone();
    let mut s = f.open(cosy::vocab::Stage::Campplus).unwrap();
    let plain: Vec<f32> = {
        let out = s.session.run(inputs_for("campplus", &spec)).unwrap();
        out.get("output").unwrap().try_extract_tensor::<f32>().unwrap().1.to_vec()
    };
    let mut b = s.binding().unwrap();
    for (name, v) in inputs_for("campplus", &spec) {
        b.bind_input(&name, &v).unwrap();
    }
    b.bind_all_outputs_on_device(&s).unwrap();
    // Twice: a binding is reused across steps.
    for _ in 0..2 {
        let out = b.run(&mut s).unwrap();
        let (shape, data) = out.get("output").unwrap().try_extract_tensor::<f32>().unwrap();
        assert_eq!(&shape[..], &[1, 192]);
        // Exact: the same session (same kernels, same thread count) on the same inputs.
        assert_eq!(data, &plain[..]);
    }
}

#[test]
fn wrong_input_name_is_caught_against_the_graph() {
    let Some(model) = fixture_model_dir() else { return };
    let cache = tempfile::tempdir().unwrap();
    let f = factory(model.path(), cache.path(), |_| {});
    let mut spec = f.model.graph("speech_tokenizer").unwrap().clone();
    let s = f.open(cosy::vocab::Stage::SpeechTokenizer).unwrap();
    spec.inputs[0].name = "speech_feats".into();
    spec.outputs[0].dtype = "int64".into();
    let problems = check_graph_io("speech_tokenizer", &spec, s.session.inputs(), s.session.outputs());
    assert!(problems.iter().any(|p| p.contains("\"speech_feats\" is not in the graph")), "{problems:?}");
    assert!(problems.iter().any(|p| p.contains("\"feats\" is not in the manifest")), "{problems:?}");
    assert!(problems.iter().any(|p| p.contains("indices has dtype int32 in the graph, manifest says int64")), "{problems:?}");
}

/// A copy of the fixture whose `dit` lists an `int8` variant (`dit.int8.onnx`). The file is a copy
/// of the fp32 graph: what is tested here is which file the factory loads and what it reports, not
/// the quantised numerics (the exporter's tests check those on real int8 graphs).
fn fixture_with_dit_int8(model: &std::path::Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(model).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
        }
    }
    std::fs::copy(model.join("dit.fp32.onnx"), dir.path().join("dit.int8.onnx")).unwrap();
    let path = dir.path().join("manifest.json");
    let mut m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut v = m["graphs"]["dit"]["variants"]["fp32"].clone();
    v["file"] = "dit.int8.onnx".into();
    m["graphs"]["dit"]["variants"]["int8"] = v;
    std::fs::write(&path, serde_json::to_string_pretty(&m).unwrap()).unwrap();
    dir
}

#[test]
fn int8_loads_the_int8_variant_on_cpu_and_falls_back_to_fp32_without_one() {
    let Some(model) = fixture_model_dir() else { return };
    if !model.path().join("dit.fp32.onnx").is_file() {
        return;
    }
    let with8 = fixture_with_dit_int8(model.path());
    let cache = tempfile::tempdir().unwrap();
    let f = factory(with8.path(), cache.path(), |c| c.runtime.precision = Precision::Int8);
    let mut s = f.open(cosy::vocab::Stage::Dit).expect("int8 dit opens on cpu");
    assert_eq!(s.precision, Precision::Int8);
    assert!(s.graph_file.ends_with("dit.int8.onnx"), "{}", s.graph_file.display());
    let spec = f.model.graph("dit").unwrap().clone();
    s.session.run(inputs_for("dit", &spec)).expect("runs");
    // llm has no int8 graph in this folder: fp32, with the reason recorded.
    let plan = f.plan("llm").unwrap();
    assert_eq!((plan.requested, plan.precision), (Precision::Int8, Precision::Fp32));
    assert_eq!(plan.variant_file, "llm.fp32.onnx");
    assert!(plan.note.as_deref().is_some_and(|n| n.contains("no int8 graph")), "{:?}", plan.note);
    let s = f.open(cosy::vocab::Stage::Llm).expect("llm opens in fp32");
    assert_eq!(s.precision, Precision::Fp32);
}

#[test]
fn tensorrt_refuses_int8_clearly_and_falls_back_when_allowed() {
    let Some(model) = fixture_model_dir() else { return };
    if !model.path().join("dit.fp32.onnx").is_file() {
        return;
    }
    let with8 = fixture_with_dit_int8(model.path());
    let cache = tempfile::tempdir().unwrap();
    let f = factory(with8.path(), cache.path(), |c| {
        c.runtime.providers = vec![ProviderKind::TensorRt, ProviderKind::Cpu];
        c.runtime.precision = Precision::Int8;
    });
    match f.open(cosy::vocab::Stage::Dit) {
        Err(Error::Provider { provider, msg }) => {
            assert_eq!(provider, "tensorrt");
            assert!(msg.contains("int8") && msg.contains("calibration") && msg.contains("stages.dit.providers"), "{msg}");
        }
        Err(other) => panic!("wrong error kind: {other}"),
        Ok(s) => panic!("TensorRT int8 must be refused, got {s:?}"),
    }
    // With fallback allowed, the next provider (CPU here) runs the int8 graph.
    let f = factory(with8.path(), cache.path(), |c| {
        c.runtime.providers = vec![ProviderKind::TensorRt, ProviderKind::Cpu];
        c.runtime.precision = Precision::Int8;
        c.runtime.allow_fallback = true;
    });
    let s = f.open(cosy::vocab::Stage::Dit).expect("falls back to cpu");
    assert_eq!(s.provider_used, ProviderKind::Cpu);
    assert_eq!(s.precision, Precision::Int8);
    assert!(s.graph_file.ends_with("dit.int8.onnx"));
    assert_eq!(s.fallbacks.len(), 1, "{:?}", s.fallbacks);
}

/// `runtime.ort_profile`: a session writes ONNX Runtime's per-node profile when it closes, under
/// the prefix with the stage's name (bench/ort_profile.py reads it).
#[test]
fn ort_profile_writes_each_sessions_runs_and_nodes_when_it_closes() {
    let Some(model) = fixture_model_dir() else { return };
    let cache = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let prefix = out.path().join("p");
    let f = factory(model.path(), cache.path(), |c| c.runtime.ort_profile = Some(prefix.clone()));
    let spec = f.model.graph("flow_front").unwrap().clone();
    {
        let mut s = f.open_named("flow_front").unwrap();
        s.session.run(inputs_for("flow_front", &spec)).unwrap();
    }
    let files: Vec<_> = std::fs::read_dir(out.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(files.len(), 1, "one profile for one session: {files:?}");
    assert!(files[0].starts_with("p-flow_front") && files[0].ends_with(".json"), "{files:?}");
    let text = std::fs::read_to_string(out.path().join(&files[0])).unwrap();
    let events: serde_json::Value = serde_json::from_str(&text).expect("the profile is JSON");
    let events = events.as_array().expect("a list of trace events");
    assert!(events.iter().any(|e| e["name"] == "model_run"), "the run is in the profile");
    assert!(events.iter().any(|e| e["cat"] == "Node"), "its nodes are in the profile");
}

/// TensorRT for RTX builds strongly typed networks: it loads the precision's own graph (fp16 here),
/// where TensorRT builds from the fp32 graph with a precision flag; a stage without an fp16 graph
/// runs fp32 with a note. Its runtime cache is keyed by that graph and never shares TensorRT's
/// folder. (Only the plan and the key: no provider is registered, so this runs without a GPU.)
#[test]
fn tensorrt_rtx_plans_the_fp16_graph_and_keys_its_own_cache() {
    let Some(model) = fixture_model_dir() else { return };
    let cache = tempfile::tempdir().unwrap();
    let rtx = factory(model.path(), cache.path(), |c| {
        c.runtime.providers = vec![ProviderKind::TensorRtRtx, ProviderKind::Cpu];
        c.runtime.precision = Precision::Fp16;
    });
    let plan = rtx.plan("llm").unwrap();
    assert_eq!((plan.variant_file.as_str(), plan.precision, plan.note.as_deref()), ("llm.fp16.onnx", Precision::Fp16, None));
    let plan = rtx.plan("flow_front").unwrap();
    assert_eq!((plan.variant_file.as_str(), plan.precision), ("flow_front.fp32.onnx", Precision::Fp32));
    assert!(plan.note.as_deref().is_some_and(|n| n.contains("no fp16 graph for tensorrt-rtx")), "{:?}", plan.note);

    let trt = factory(model.path(), cache.path(), |c| {
        c.runtime.providers = vec![ProviderKind::TensorRt, ProviderKind::Cpu];
        c.runtime.precision = Precision::Fp16;
    });
    let plan = trt.plan("llm").unwrap();
    assert_eq!((plan.variant_file.as_str(), plan.precision), ("llm.fp32.onnx", Precision::Fp16));

    let spec = rtx.model.graph("llm").unwrap();
    let key = rtx.rtx_cache_key("llm", Precision::Fp16).unwrap();
    assert_eq!(key.graph_sha256, spec.variant(Precision::Fp16).unwrap().sha256.to_ascii_lowercase());
    assert_eq!(key.options, vec!["provider=tensorrt-rtx".to_string()]);
    assert_ne!(key.dir_name(), trt.cache_key("llm", Precision::Fp16).unwrap().dir_name());
    assert_ne!(key.dir_name(), rtx.rtx_cache_key("llm", Precision::Fp32).unwrap().dir_name());
    // `cosy engines list|clean` and `cosy doctor` take its folder for a current entry.
    assert!(cosy::runtime::cache_listing::current_engine_keys(&rtx).contains(&key.dir_name()));
}
