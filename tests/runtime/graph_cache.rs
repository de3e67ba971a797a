//! The optimised-graph cache of CPU sessions: a session loaded from a saved optimised graph gives
//! the same outputs as one that optimised the graph at load; broken entries are rebuilt without an
//! error; the key changes with each of its parts; an unwritable cache folder only warns; `cosy
//! engines list|clean` and `cosy doctor` show the entries. Every test uses a private temp folder.


use std::path::{Path, PathBuf};
use std::sync::Arc;

use assert_cmd::Command;
use crate::common::{config_for, fixture_model_dir, inputs_for};
use cosy::config::Config;
use cosy::model::{ModelDir, Variant};
use cosy::runtime::engine_cache::EngineCache;
use cosy::runtime::factory::build_graph_key;
use cosy::runtime::graph_cache::{file_digest, GraphCache, GraphMeta, DATA_FILE, META_FILE, MODEL_FILE};
use cosy::runtime::keyed_dir::EntryState;
use cosy::runtime::{GraphCacheUse, SessionFactory};
use cosy::vocab::{Precision, ProviderKind};
use predicates::prelude::*;

/// A stage's outputs: (name, shape, values as f32).
type Outputs = Vec<(String, Vec<i64>, Vec<f32>)>;

fn factory(config: &Config) -> SessionFactory {
    let dir = Arc::new(ModelDir::open(&config.model_dir).expect("model folder opens"));
    SessionFactory::new(config, dir).expect("ONNX Runtime loads")
}

/// The config for the tiny model with the caches in `cache` and `edit` applied.
fn config(model: &Path, cache: &Path, edit: impl FnOnce(&mut Config)) -> Config {
    let mut c = config_for(model, cache);
    edit(&mut c);
    c
}

/// Opens `stage`, runs it on the test inputs and returns how the cache was used and every output
/// (name, shape, values as f32; int outputs converted).
fn run_stage(f: &SessionFactory, stage: &str) -> (GraphCacheUse, Outputs) {
    let spec = f.model.graph(stage).unwrap().clone();
    let mut s = f.open_named(stage).unwrap_or_else(|e| panic!("{stage}: {e}"));
    let used = s.graph_cache;
    let outputs = s.session.run(inputs_for(stage, &spec)).unwrap_or_else(|e| panic!("{stage} run: {e}"));
    let mut out = Vec::new();
    for o in &spec.outputs {
        let v = outputs.get(&o.name).unwrap_or_else(|| panic!("{stage}: no output {}", o.name));
        let values: (Vec<i64>, Vec<f32>) = match o.dtype.as_str() {
            "float32" => {
                let (shape, d) = v.try_extract_tensor::<f32>().unwrap();
                (shape.to_vec(), d.to_vec())
            }
            "int32" => {
                let (shape, d) = v.try_extract_tensor::<i32>().unwrap();
                (shape.to_vec(), d.iter().map(|&x| x as f32).collect())
            }
            "int64" => {
                let (shape, d) = v.try_extract_tensor::<i64>().unwrap();
                (shape.to_vec(), d.iter().map(|&x| x as f32).collect())
            }
            other => panic!("{stage}: output dtype {other}"),
        };
        out.push((o.name.clone(), values.0, values.1));
    }
    (used, out)
}

/// Asserts bit-identical outputs. Exact equality is the right bar here, not a tolerance: the
/// cached graph is the very graph the optimising session built (its folded constants saved as
/// they were computed), run by the same kernels with the same single thread in the same process;
/// any difference would mean the cache changed the computation.
fn assert_same(stage: &str, what: &str, a: &Outputs, b: &Outputs) {
    assert_eq!(a.len(), b.len());
    for ((name, sa, va), (_, sb, vb)) in a.iter().zip(b) {
        assert_eq!(sa, sb, "{stage} {name}: shape ({what})");
        let max = va.iter().zip(vb).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        let same = va.iter().zip(vb).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "{stage} {name}: outputs differ ({what}), max |diff| {max:e}");
    }
}

fn entry_dir(f: &SessionFactory, stage: &str, precision: Precision) -> PathBuf {
    let spec = f.model.graph(stage).unwrap();
    let v = spec.variant(precision).unwrap();
    f.graph_cache.as_ref().unwrap().dir_for(&f.graph_key(stage, v, precision, &[ProviderKind::Cpu]))
}

#[test]
fn warm_sessions_match_cold_ones_on_every_stage_and_precision() {
    let Some(model) = fixture_model_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("engines");
    let off = factory(&config(model.path(), &cache, |c| c.runtime.graph_cache_enabled = false));
    let stages: Vec<String> = off.model.manifest.graphs.keys().cloned().collect();
    for precision in [Precision::Fp32, Precision::Fp16] {
        let cfg = config(model.path(), &cache, |c| c.runtime.precision = precision);
        let off = factory(&Config { runtime: cosy::config::RuntimeSettings { graph_cache_enabled: false, ..cfg.runtime.clone() }, ..cfg.clone() });
        let cold = factory(&cfg);
        let warm = factory(&cfg);
        for stage in &stages {
            // Stages without this precision run fp32, whose entry the fp32 pass already made.
            let has_variant = off.model.graph(stage).unwrap().variant(precision).is_some();
            let (used_off, without) = run_stage(&off, stage);
            assert_eq!(used_off, GraphCacheUse::Off, "{stage} {precision}: cache turned off");
            let (used_cold, first) = run_stage(&cold, stage);
            if has_variant || precision == Precision::Fp32 {
                assert_eq!(used_cold, GraphCacheUse::Saved, "{stage} {precision}: the first load saves the graph");
            } else {
                assert_eq!(used_cold, GraphCacheUse::Loaded, "{stage} {precision}: falls back to the fp32 entry");
            }
            let (used_warm, second) = run_stage(&warm, stage);
            assert_eq!(used_warm, GraphCacheUse::Loaded, "{stage} {precision}: the second load uses the saved graph");
            assert_same(stage, "no cache vs optimised-and-saved", &without, &first);
            assert_same(stage, "no cache vs loaded from the cache", &without, &second);
        }
    }
    // One entry per stage and graph variant, all sound, each with the optimised graph and its
    // external initializers.
    let entries = GraphCache::new(cache.join("graphs")).entries().unwrap();
    let variants: usize = off.model.manifest.graphs.values().map(|g| g.variants.len()).sum();
    assert_eq!(entries.len(), variants, "{entries:?}");
    for e in &entries {
        assert_eq!(e.state, EntryState::Valid, "{}", e.dir.display());
        assert!(e.dir.join(MODEL_FILE).is_file() && e.dir.join(META_FILE).is_file());
    }
    assert!(entries.iter().any(|e| e.dir.join(DATA_FILE).is_file()), "large initializers go to model.onnx.data");
    // The TensorRT cache does not take the graphs folder for one of its entries.
    assert!(EngineCache::new(&cache).excluding(&cache.join("graphs")).entries().unwrap().is_empty());
}

#[test]
fn broken_entries_are_rebuilt_transparently() {
    let Some(model) = fixture_model_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(model.path(), tmp.path(), |_| {});
    let stage = "dit";
    let (used, reference) = run_stage(&factory(&cfg), stage);
    assert_eq!(used, GraphCacheUse::Saved);
    let f = factory(&cfg);
    let dir = entry_dir(&f, stage, Precision::Fp32);
    assert!(dir.is_dir());

    let meta_path = dir.join(META_FILE);
    let read_meta = || -> GraphMeta { serde_json::from_str(&std::fs::read_to_string(&meta_path).unwrap()).unwrap() };
    let good_meta = read_meta();
    let data_len = std::fs::metadata(dir.join(DATA_FILE)).unwrap().len();
    let model_len = std::fs::metadata(dir.join(MODEL_FILE)).unwrap().len();

    type Breakage<'a> = (&'a str, Box<dyn Fn() + 'a>);
    let breakages: Vec<Breakage> = vec![
        ("truncated weights", Box::new(|| {
            let file = std::fs::OpenOptions::new().write(true).open(dir.join(DATA_FILE)).unwrap();
            file.set_len(data_len / 2).unwrap();
        })),
        ("empty graph file", Box::new(|| std::fs::write(dir.join(MODEL_FILE), b"").unwrap())),
        ("missing weights", Box::new(|| std::fs::remove_file(dir.join(DATA_FILE)).unwrap())),
        ("garbage metadata", Box::new(|| std::fs::write(&meta_path, b"{\"key\": garbage").unwrap())),
        ("missing metadata", Box::new(|| std::fs::remove_file(&meta_path).unwrap())),
        ("metadata of another entry", Box::new(|| {
            let mut m = read_meta();
            m.key.precision = "fp16".into();
            std::fs::write(&meta_path, serde_json::to_string(&m).unwrap()).unwrap();
        })),
        ("graph file altered, same size", Box::new(|| std::fs::write(dir.join(MODEL_FILE), vec![0x5a; model_len as usize]).unwrap())),
        ("weights zeroed, same size", Box::new(|| std::fs::write(dir.join(DATA_FILE), vec![0; data_len as usize]).unwrap())),
        // Sizes and hashes check out, but ONNX Runtime cannot load the graph: discarded at load.
        ("unloadable graph with matching metadata", Box::new(|| {
            let junk = vec![0x5a; model_len as usize];
            std::fs::write(dir.join(MODEL_FILE), &junk).unwrap();
            let mut m = read_meta();
            m.files.insert(MODEL_FILE.into(), file_digest(&dir.join(MODEL_FILE)).unwrap());
            std::fs::write(&meta_path, serde_json::to_string(&m).unwrap()).unwrap();
        })),
    ];
    for (what, breakage) in &breakages {
        breakage();
        let f = factory(&cfg);
        let (used, out) = run_stage(&f, stage);
        assert_eq!(used, GraphCacheUse::Saved, "{what}: the entry is made again, not an error");
        assert_same(stage, what, &reference, &out);
        assert_eq!(f.graph_cache.as_ref().unwrap().check(&dir, None), EntryState::Valid, "{what}: rebuilt");
        assert_eq!(read_meta(), good_meta, "{what}: the rebuilt entry is the same");
        let (used, out) = run_stage(&f, stage);
        assert_eq!(used, GraphCacheUse::Loaded, "{what}: and loads next time");
        assert_same(stage, what, &reference, &out);
    }
    // Nothing is left behind: no temporary or half-removed folders.
    let names: Vec<String> = std::fs::read_dir(dir.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec![dir.file_name().unwrap().to_string_lossy().into_owned()]);
}

#[test]
fn large_files_are_checked_by_a_sampled_hash() {
    use cosy::runtime::graph_cache::{FULL_HASH_MAX, SAMPLE_BLOCKS, SAMPLE_BYTES};
    let tmp = tempfile::tempdir().unwrap();
    let small = tmp.path().join("small");
    std::fs::write(&small, b"weights").unwrap();
    let d = file_digest(&small).unwrap();
    assert!(!d.sampled && d.bytes == 7 && d.sha256 == cosy::model::sha256_file(&small).unwrap());

    let big = tmp.path().join("big");
    let len = FULL_HASH_MAX + 12345;
    let content: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
    std::fs::write(&big, &content).unwrap();
    let d = file_digest(&big).unwrap();
    assert!(d.sampled && d.bytes == len);
    assert_eq!(d, file_digest(&big).unwrap(), "deterministic");
    let digest_with = |edit: &dyn Fn(&mut Vec<u8>)| {
        let mut c = content.clone();
        edit(&mut c);
        std::fs::write(&big, &c).unwrap();
        file_digest(&big).unwrap()
    };
    let last = len - SAMPLE_BYTES;
    // The first and last bytes, and a zeroed middle block, are seen.
    assert_ne!(digest_with(&|c| c[0] ^= 1), d);
    assert_ne!(digest_with(&|c| *c.last_mut().unwrap() ^= 1), d);
    let mid = (last * (SAMPLE_BLOCKS / 2) / (SAMPLE_BLOCKS - 1)) as usize;
    assert_ne!(digest_with(&|c| c[mid..mid + SAMPLE_BYTES as usize].fill(0)), d);
    assert_ne!(digest_with(&|c| c.truncate(c.len() - 1)), d);
    // A byte between two samples is not (the documented limit of the sampled hash).
    let gap = (last / (SAMPLE_BLOCKS - 1) + SAMPLE_BYTES + 10) as usize;
    assert_eq!(digest_with(&|c| c[gap] ^= 1), d);
}

#[test]
fn key_changes_with_graph_precision_provider_library_and_cpu() {
    let v = Variant { file: "dit.fp32.onnx".into(), sha256: "ab".repeat(32), bytes: 10, data: None };
    let cpu = vec!["avx".to_string(), "avx2".to_string(), "fma".to_string()];
    let key = |v: &Variant, p: Precision, prov: &[ProviderKind], ort: &str, feats: &[String], stage: &str| {
        build_graph_key(stage, v, p, prov, ort, feats)
    };
    let base = key(&v, Precision::Fp32, &[ProviderKind::Cpu], "1.31.1", &cpu, "dit");
    assert_eq!(base, key(&v, Precision::Fp32, &[ProviderKind::Cpu], "1.31.1", &cpu, "dit"), "deterministic");
    assert!(base.dir_name().starts_with("dit-") && base.dir_name().len() == 4 + 16);
    assert!(base.options.iter().any(|o| o == "graph_optimization_level=all"));

    let mut other_graph = v.clone();
    other_graph.sha256 = "cd".repeat(32);
    let mut other_data = v.clone();
    other_data.data = Some(cosy::model::FileEntry { file: "dit.fp32.onnx.data".into(), sha256: "ef".repeat(32), bytes: 5 });
    let avx512: Vec<String> = cpu.iter().cloned().chain(["avx512f".to_string()]).collect();
    let vnni: Vec<String> = avx512.iter().cloned().chain(["avx512vnni".to_string()]).collect();
    let amx: Vec<String> = vnni.iter().cloned().chain(["amx-tile".to_string(), "amx-bf16".to_string()]).collect();
    let variants = [
        ("graph", key(&other_graph, Precision::Fp32, &[ProviderKind::Cpu], "1.31.1", &cpu, "dit")),
        ("external data", key(&other_data, Precision::Fp32, &[ProviderKind::Cpu], "1.31.1", &cpu, "dit")),
        ("precision", key(&v, Precision::Fp16, &[ProviderKind::Cpu], "1.31.1", &cpu, "dit")),
        ("precision int8", key(&v, Precision::Int8, &[ProviderKind::Cpu], "1.31.1", &cpu, "dit")),
        ("provider", key(&v, Precision::Fp32, &[ProviderKind::Cuda, ProviderKind::Cpu], "1.31.1", &cpu, "dit")),
        ("ort version", key(&v, Precision::Fp32, &[ProviderKind::Cpu], "1.32.0", &cpu, "dit")),
        ("avx512f", key(&v, Precision::Fp32, &[ProviderKind::Cpu], "1.31.1", &avx512, "dit")),
        ("avx512vnni", key(&v, Precision::Fp32, &[ProviderKind::Cpu], "1.31.1", &vnni, "dit")),
        ("amx", key(&v, Precision::Fp32, &[ProviderKind::Cpu], "1.31.1", &amx, "dit")),
        ("stage", key(&v, Precision::Fp32, &[ProviderKind::Cpu], "1.31.1", &cpu, "llm")),
    ];
    for (part, k) in &variants {
        assert_ne!(k.hash16(), base.hash16(), "changing the {part} must change the key");
    }
    // Through a real factory: the fp32 and fp16 graphs of a stage have different entries, and this
    // CPU's features (thread-independent) are in the key.
    let Some(model) = fixture_model_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let f = factory(&config(model.path(), tmp.path(), |_| {}));
    assert_ne!(entry_dir(&f, "dit", Precision::Fp32), entry_dir(&f, "dit", Precision::Fp16));
    let k = f.graph_key("dit", f.model.graph("dit").unwrap().variant(Precision::Fp32).unwrap(), Precision::Fp32, &[ProviderKind::Cpu]);
    assert_eq!(k.cpu_features, cosy::runtime::graph_cache::cpu_features());
    assert_eq!(k.arch, std::env::consts::ARCH);
    #[cfg(target_arch = "x86_64")]
    assert_eq!(k.cpu_features.contains(&"avx2".to_string()), std::arch::is_x86_feature_detected!("avx2"));
}

#[test]
fn an_unwritable_cache_folder_only_warns() {
    let Some(model) = fixture_model_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    // A regular file where the folder would go: no one, not even root, can create it.
    let blocker = tmp.path().join("not-a-folder");
    std::fs::write(&blocker, b"x").unwrap();
    let cfg = config(model.path(), tmp.path(), |c| c.runtime.graph_cache = Some(blocker.join("graphs")));
    let f = factory(&cfg);
    let off = factory(&config(model.path(), tmp.path(), |c| c.runtime.graph_cache_enabled = false));
    for stage in ["dit", "llm"] {
        let (used, out) = run_stage(&f, stage);
        assert_eq!(used, GraphCacheUse::NotSaved, "{stage}: loads without the cache");
        let (_, reference) = run_stage(&off, stage);
        assert_same(stage, "unwritable cache", &reference, &out);
    }
    // Through the CLI: the run succeeds, and the warning is one line, once.
    let cwd = tempfile::tempdir().unwrap();
    let out = fill_cache(cosy(cwd.path()).env("COSY_GRAPH_CACHE", blocker.join("graphs")), model.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stderr.matches("optimised-graph cache").count(), 1, "{stderr}");
    assert!(stderr.contains("cannot write it"), "{stderr}");
}

#[test]
fn the_cache_can_be_turned_off() {
    let Some(model) = fixture_model_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(model.path(), tmp.path(), |c| c.runtime.graph_cache_enabled = false);
    let f = factory(&cfg);
    assert!(f.graph_cache.is_none());
    assert_eq!(run_stage(&f, "flow_front").0, GraphCacheUse::Off);
    assert!(!tmp.path().join("graphs").exists(), "nothing written");
    // Entries made while it was on stay listed (and cleanable), and the TensorRT cache never takes
    // the graphs folder for an entry of its own, on or off.
    assert_eq!(run_stage(&factory(&config(model.path(), tmp.path(), |_| {})), "flow_front").0, GraphCacheUse::Saved);
    assert!(f.cache.entries().unwrap().is_empty());
    let cwd = tempfile::tempdir().unwrap();
    cosy(cwd.path())
        .env("COSY_ENGINE_CACHE", tmp.path())
        .env("COSY_GRAPH_CACHE_ENABLED", "false")
        .args(["engines", "list", "--model"])
        .arg(model.path())
        .assert()
        .success()
        .stdout(predicate::str::contains("flow_front-").and(predicate::str::contains("optimised-graph")))
        .stdout(predicate::str::contains("tensorrt-engine").not());
    // The folder follows runtime.engine_cache unless runtime.graph_cache names one.
    let on = config(model.path(), tmp.path(), |_| {});
    assert_eq!(on.graph_cache_dir(), Some(tmp.path().join("graphs")));
    let named = config(model.path(), tmp.path(), |c| c.runtime.graph_cache = Some(PathBuf::from("/x/y")));
    assert_eq!(named.graph_cache_dir(), Some(PathBuf::from("/x/y")));
}

#[test]
fn concurrent_first_loads_both_succeed_and_leave_one_entry() {
    let Some(model) = fixture_model_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(model.path(), tmp.path(), |_| {});
    let (_, reference) = run_stage(&factory(&config(model.path(), tmp.path(), |c| c.runtime.graph_cache_enabled = false)), "dit");
    // Four factories racing on the same entry (one process: the temporary folders still differ).
    let results: Vec<(GraphCacheUse, Outputs)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let cfg = cfg.clone();
                s.spawn(move || run_stage(&factory(&cfg), "dit"))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (used, out) in &results {
        assert!(matches!(used, GraphCacheUse::Saved | GraphCacheUse::NotSaved | GraphCacheUse::Loaded), "{used:?}");
        assert_same("dit", "concurrent loads", &reference, out);
    }
    assert!(results.iter().any(|(u, _)| *u == GraphCacheUse::Saved), "one of them put the entry in place");
    let entries = GraphCache::new(tmp.path().join("graphs")).entries().unwrap();
    assert_eq!(entries.len(), 1, "one entry, no temporary folders left: {entries:?}");
    assert_eq!(entries[0].state, EntryState::Valid);
}

/// A `cosy file` run that loads every stage (and so fills the graph cache), its audio in the
/// working folder.
fn fill_cache(c: &mut Command, model: &Path) -> std::process::Output {
    let prompt = crate::common::fixture_prompt();
    c.arg("--model")
        .arg(model)
        .args(["file", "--min-tokens", "5", "-o", "out.wav", "--prompt-wav"])
        .arg(prompt)
        .arg("The lighthouse blinked twice.")
        .output()
        .unwrap()
}

/// `cosy` run in an empty folder with private caches (`./engines`).
fn cosy(cwd: &Path) -> Command {
    let mut c = Command::cargo_bin("cosy").unwrap();
    c.current_dir(cwd);
    for (k, _) in std::env::vars() {
        if k.starts_with("COSY_") {
            c.env_remove(k);
        }
    }
    c.env("COSY_ENGINE_CACHE", cwd.join("engines"));
    c
}

#[test]
fn engines_list_clean_and_doctor_show_optimised_graphs() {
    let Some(model) = fixture_model_dir() else { return };
    let cwd = tempfile::tempdir().unwrap();
    let graphs = cwd.path().join("engines/graphs");
    cosy(cwd.path())
        .args(["engines", "list", "--model"])
        .arg(model.path())
        .assert()
        .success()
        .stdout(predicate::str::contains("optimised-graph cache").and(predicate::str::contains("is empty")));
    // A run fills the cache; doctor lists it (and writes nothing itself).
    let out = fill_cache(&mut cosy(cwd.path()), model.path());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    cosy(cwd.path())
        .args(["doctor", "--model"])
        .arg(model.path())
        .assert()
        .success()
        .stdout(predicate::str::contains("optimised-graph cache (CPU sessions)"))
        .stdout(predicate::str::contains(graphs.display().to_string()))
        .stdout(predicate::str::contains("valid, matches this model/CPU/library"));
    let n = std::fs::read_dir(&graphs).unwrap().count();
    assert!(n >= 6, "one entry per stage: {n}");

    // A broken entry, an interrupted write (a process that no longer runs) and a stale entry.
    let some = std::fs::read_dir(&graphs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("campplus-"))
        .expect("campplus entry");
    std::fs::write(some.join(META_FILE), b"garbage").unwrap();
    let interrupted = graphs.join(".tmp-dit-0123456789abcdef-999999999-0");
    std::fs::create_dir_all(&interrupted).unwrap();
    std::fs::write(interrupted.join(MODEL_FILE), b"partial").unwrap();
    let out = cosy(cwd.path()).args(["engines", "list", "--model"]).arg(model.path()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(stdout.contains("optimised-graph") && stdout.contains("corrupt: graph.json is unreadable"), "{stdout}");
    assert!(stdout.contains(".tmp-dit-0123456789abcdef-999999999-0  optimised-graph") && stdout.contains("incomplete"), "{stdout}");
    assert!(stdout.lines().filter(|l| l.contains("  valid  [")).count() >= 5, "{stdout}");
    cosy(cwd.path())
        .args(["engines", "clean", "--model"])
        .arg(model.path())
        .assert()
        .success()
        .stdout(predicate::str::contains("2 entries removed"));
    assert!(!some.exists() && !interrupted.exists());
    // Entries for another model are stale: cleaned once the model they were made for is not the
    // configured one.
    let other = crate::common::writable_model_dir().expect("model copy");
    crate::common::edit_manifest(other.path(), |m| {
        m["graphs"]["dit"]["variants"]["fp32"]["sha256"] = serde_json::json!("00".repeat(32));
    });
    let out = cosy(cwd.path()).args(["engines", "clean", "--model"]).arg(other.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 entry removed"), "{}", String::from_utf8_lossy(&out.stdout));
    cosy(cwd.path()).args(["engines", "clean", "--all", "--model"]).arg(model.path()).assert().success();
    cosy(cwd.path())
        .args(["engines", "list", "--model"])
        .arg(model.path())
        .assert()
        .success()
        .stdout(predicate::str::contains("is empty"));
}
