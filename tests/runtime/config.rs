//! Config precedence (defaults < file < env < flags) and refusal of unknown keys and bad values.

use std::path::PathBuf;

use cosy::config::{Config, LoadOptions};
use cosy::Error;
use cosy::vocab::{Precision, ProviderKind, StageGroup};


fn write(dir: &std::path::Path, text: &str) -> PathBuf {
    let p = dir.join("cosy.toml");
    std::fs::write(&p, text).unwrap();
    p
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn config_err(opts: &LoadOptions) -> String {
    match Config::load(opts) {
        Err(Error::Config(m)) => m,
        Err(other) => panic!("expected a config error, got {other}"),
        Ok(c) => panic!("expected a config error, got {c:?}"),
    }
}

#[test]
fn defaults_then_file_then_env_then_flags() {
    let d = tempfile::tempdir().unwrap();
    let file = write(
        d.path(),
        "[model]\ndir = \"m\"\n[runtime]\nprecision = \"fp16\"\nproviders = [\"cuda\", \"cpu\"]\nthreads = 3\n[stages.dit]\nprecision = \"bf16\"\n",
    );
    // Defaults only.
    let c = Config::load(&LoadOptions::default()).unwrap();
    assert_eq!(c.runtime.precision, Precision::Fp32);
    assert_eq!(c.runtime.providers, vec![ProviderKind::Cpu]);

    // File over defaults; relative paths resolve against the file's folder.
    let mut opts = LoadOptions { config_file: Some(file.clone()), ..Default::default() };
    let c = Config::load(&opts).unwrap();
    assert_eq!(c.model_dir, d.path().join("m"));
    assert_eq!(c.runtime.precision, Precision::Fp16);
    assert_eq!(c.runtime.threads, 3);
    assert_eq!(c.providers_for(StageGroup::Llm), vec![ProviderKind::Cuda, ProviderKind::Cpu]);
    assert_eq!(c.precision_for(StageGroup::Dit), Precision::Bf16);
    assert_eq!(c.precision_for(StageGroup::Llm), Precision::Fp16);
    assert_eq!(c.sampling.top_k, None, "untouched keys keep their defaults (the model's value)");

    // Env over file.
    opts.env = env(&[("COSY_PRECISION", "fp32"), ("COSY_MODEL", "/x/model"), ("COSY_PROVIDERS", "tensorrt,cuda,cpu")]);
    let c = Config::load(&opts).unwrap();
    assert_eq!(c.runtime.precision, Precision::Fp32);
    assert_eq!(c.model_dir, PathBuf::from("/x/model"));
    assert_eq!(c.runtime.providers, vec![ProviderKind::TensorRt, ProviderKind::Cuda, ProviderKind::Cpu]);
    assert_eq!(c.precision_for(StageGroup::Dit), Precision::Bf16, "a stage override is more specific");

    // Flags over env.
    opts.flags = vec![("runtime.precision".into(), "bf16".into()), ("stages.dit.precision".into(), "".into())];
    let c = Config::load(&opts).unwrap();
    assert_eq!(c.runtime.precision, Precision::Bf16);
    assert_eq!(c.precision_for(StageGroup::Dit), Precision::Bf16);
    opts.flags = vec![("runtime.precision".into(), "fp16".into()), ("stages.dit.precision".into(), "".into())];
    assert_eq!(Config::load(&opts).unwrap().precision_for(StageGroup::Dit), Precision::Fp16, "\"\" inherits again");

    // COSY_CONFIG names the file when no --config is given.
    let c = Config::load(&LoadOptions { env: env(&[("COSY_CONFIG", file.to_str().unwrap())]), ..Default::default() }).unwrap();
    assert_eq!(c.source_file.as_deref(), Some(file.as_path()));
}

#[test]
fn without_a_config_file_the_folders_are_the_users_never_the_current_one() {
    // The test process's own HOME/XDG: whatever they are, every default is absolute.
    let c = Config::load(&LoadOptions { default_file: Some(PathBuf::from("no-such-config.toml")), ..Default::default() }).unwrap();
    assert_eq!(c.source_file, None);
    assert!(c.sources.config_file.contains("looked for ./no-such-config.toml"), "{}", c.sources.config_file);
    for (what, p) in [("model.dir", &c.model_dir), ("voices.dir", &c.voices.dir), ("runtime.engine_cache", &c.runtime.engine_cache)] {
        assert!(p.is_absolute(), "{what} = {}: never relative to the current folder", p.display());
        assert!(!c.source_of(what).starts_with("set by"), "{what}: {}", c.source_of(what));
    }
    assert!(c.voices.dir.ends_with("cosy/voices"), "{}", c.voices.dir.display());
    assert!(c.sources.default_model.is_some());
}

#[test]
fn unknown_keys_are_refused_with_the_key_and_the_known_ones() {
    let d = tempfile::tempdir().unwrap();
    let file = write(d.path(), "[runtime]\nprovider = [\"cpu\"]\n");
    let m = config_err(&LoadOptions { config_file: Some(file), ..Default::default() });
    assert!(m.contains("runtime.provider") && m.contains("unknown key") && m.contains("runtime.providers"), "{m}");

    let file = write(d.path(), "[stages.vocoder]\nprecision = \"fp16\"\n");
    let m = config_err(&LoadOptions { config_file: Some(file), ..Default::default() });
    assert!(m.contains("stages.vocoder.precision") && m.contains("unknown key"), "{m}");

    let m = config_err(&LoadOptions { env: env(&[("COSY_PRECISON", "fp16")]), ..Default::default() });
    assert!(m.contains("COSY_PRECISON") && m.contains("COSY_PRECISION"), "{m}");
}

#[test]
fn bad_values_are_refused_with_key_value_and_allowed_set() {
    let d = tempfile::tempdir().unwrap();
    let cases: &[(&str, &str, &str)] = &[
        ("[runtime]\nprecision = \"fp8\"\n", "runtime.precision = \"fp8\"", "fp32, fp16, bf16, int8"),
        ("[runtime]\nproviders = [\"rocm\"]\n", "runtime.providers = [\"rocm\"]", "tensorrt, tensorrt-rtx, cuda, cpu"),
        ("[runtime]\nproviders = [\"cpu\", \"cpu\"]\n", "runtime.providers", "without repeats"),
        ("[runtime]\nthreads = -1\n", "runtime.threads = -1", "0..=1024"),
        ("[runtime]\nallow_fallback = \"maybe\"\n", "runtime.allow_fallback", "true, false"),
        ("[sampling]\ntop_p = 1.5\n", "sampling.top_p = 1.5", "(0, 1]"),
        ("[sampling]\ntop_k = 0\n", "sampling.top_k = 0", ">= 1"),
        ("[streaming]\ntoken_hop_len = 50\ntoken_max_hop_len = 10\n", "token_max_hop_len", "must be >="),
        ("[model]\ndir = 3\n", "model.dir = 3", "path"),
    ];
    for (text, key_value, allowed) in cases {
        let file = write(d.path(), text);
        let m = config_err(&LoadOptions { config_file: Some(file.clone()), ..Default::default() });
        assert!(m.contains(key_value), "{text}: message lacks {key_value:?}: {m}");
        assert!(m.contains(allowed), "{text}: message lacks {allowed:?}: {m}");
        assert!(m.contains(&file.display().to_string()), "names the file: {m}");
    }
    let m = config_err(&LoadOptions { env: env(&[("COSY_DEVICE_ID", "gpu0")]), ..Default::default() });
    assert!(m.contains("environment COSY_DEVICE_ID") && m.contains("\"gpu0\""), "{m}");
    let m = config_err(&LoadOptions { flags: vec![("runtime.precision".into(), "half".into())], ..Default::default() });
    assert!(m.contains("flag runtime.precision") && m.contains("fp32, fp16, bf16, int8"), "{m}");
    let m = config_err(&LoadOptions { config_file: Some(d.path().join("absent.toml")), ..Default::default() });
    assert!(m.contains("absent.toml") && m.contains("does not exist"), "{m}");
    let file = write(d.path(), "[runtime\nx=");
    let m = config_err(&LoadOptions { config_file: Some(file), ..Default::default() });
    assert!(m.contains("not valid TOML"), "{m}");
}

#[test]
fn int8_is_a_precision_from_every_source() {
    let d = tempfile::tempdir().unwrap();
    let file = write(d.path(), "[stages.dit]\nprecision = \"int8\"\n[stages.llm]\nprecision = \"INT8\"\n");
    let c = Config::load(&LoadOptions { config_file: Some(file), ..Default::default() }).unwrap();
    assert_eq!(c.precision_for(StageGroup::Dit), Precision::Int8);
    assert_eq!(c.precision_for(StageGroup::Llm), Precision::Int8);
    assert_eq!(c.precision_for(StageGroup::Hift), Precision::Fp32, "other stages inherit fp32");
    let c = Config::load(&LoadOptions { env: env(&[("COSY_PRECISION", "int8")]), ..Default::default() }).unwrap();
    assert_eq!(c.runtime.precision, Precision::Int8);
    let c = Config::load(&LoadOptions {
        flags: vec![("runtime.precision".into(), "int8".into()), ("stages.hift.precision".into(), "fp32".into())],
        ..Default::default()
    })
    .unwrap();
    assert_eq!(c.precision_for(StageGroup::Dit), Precision::Int8);
    assert_eq!(c.precision_for(StageGroup::Hift), Precision::Fp32);
    let m = config_err(&LoadOptions { flags: vec![("stages.dit.precision".into(), "int4".into())], ..Default::default() });
    assert!(m.contains("stages.dit.precision") && m.contains("int8") && m.contains("inherit"), "{m}");
}

#[test]
fn stage_threads_spinning_and_the_prompt_cache_bound() {
    let d = tempfile::tempdir().unwrap();
    let file = write(d.path(), "[runtime]\nthreads = 2\n[stages.llm]\nthreads = 1\nspinning = false\n[engine]\nprompt_cache_bytes = 0\n");
    let c = Config::load(&LoadOptions { config_file: Some(file), ..Default::default() }).unwrap();
    assert_eq!((c.threads_for(StageGroup::Llm), c.threads_for(StageGroup::Dit)), (1, 2), "dit inherits runtime.threads");
    assert_eq!((c.spinning_for(StageGroup::Llm), c.spinning_for(StageGroup::Dit)), (Some(false), None));
    assert_eq!(c.engine.prompt_cache_bytes, 0);
    let c = Config::load(&LoadOptions {
        flags: vec![("stages.dit.threads".into(), "3".into()), ("stages.dit.spinning".into(), "off".into())],
        ..Default::default()
    })
    .unwrap();
    assert_eq!((c.threads_for(StageGroup::Dit), c.spinning_for(StageGroup::Dit)), (3, Some(false)));
    assert_eq!(Config::default().engine.prompt_cache_bytes, 2 << 30);
    assert_eq!(Config::default().engine.prompt_cache_disk_bytes, 4 << 30);
    let c = Config::load(&LoadOptions {
        flags: vec![("engine.prompt_cache_disk_bytes".into(), "0".into()), ("runtime.engine_cache".into(), "/tmp/x".into())],
        ..Default::default()
    })
    .unwrap();
    assert_eq!(c.engine.prompt_cache_disk_bytes, 0);
    assert_eq!(c.prompt_cache_dir(), std::path::Path::new("/tmp/x/prompt-prefix"), "beside the engines, where tests and users point it");
    for (key, value, allowed) in [
        ("stages.dit.threads", "-1", "0 (ONNX Runtime chooses) to 1024"),
        ("stages.llm.spinning", "maybe", "true, false"),
        ("engine.prompt_cache_bytes", "-5", "0 (off)"),
        ("engine.prompt_cache", "sometimes", "auto, on, off"),
        ("engine.first_audio_priority", "first", "auto, on, off"),
        ("engine.prompt_cache_disk_bytes", "-1", "0 (off)"),
    ] {
        let m = config_err(&LoadOptions { flags: vec![(key.into(), value.into())], ..Default::default() });
        assert!(m.contains(key) && m.contains(allowed), "{key}: {m}");
    }
}

#[test]
fn the_prompt_cache_is_used_on_the_cpu_by_default_and_where_asked() {
    use cosy::vocab::ProviderKind::{Cpu, Cuda, TensorRt};
    let bound = |setting: &str| {
        let c = Config::load(&LoadOptions { flags: vec![("engine.prompt_cache".into(), setting.into())], ..Default::default() }).unwrap();
        [Cpu, Cuda, TensorRt].map(|p| c.engine.prompt_cache_bound(p))
    };
    let full = Config::default().engine.prompt_cache_bytes;
    assert_eq!(bound("auto"), [full, 0, 0], "auto: the CPU only (on a GPU the copy costs more than it saves)");
    assert_eq!(bound("on"), [full; 3]);
    assert_eq!(bound("off"), [0; 3]);
    let c = Config::load(&LoadOptions { flags: vec![("engine.prompt_cache_bytes".into(), "0".into())], ..Default::default() }).unwrap();
    assert_eq!(c.engine.prompt_cache_bound(Cpu), 0, "a bound of 0 is off whatever the mode");
}

#[test]
fn first_audio_priority_holds_the_llm_only_where_both_stages_share_the_cpu_by_default() {
    use cosy::vocab::ProviderKind::{Cpu, Cuda, TensorRt};
    let applies = |setting: &str| {
        let c = Config::load(&LoadOptions { flags: vec![("engine.first_audio_priority".into(), setting.into())], ..Default::default() })
            .unwrap();
        [(Cpu, Cpu), (Cuda, Cpu), (Cpu, TensorRt), (Cuda, Cuda)].map(|(llm, dit)| c.engine.first_audio_priority_applies(llm, dit))
    };
    assert_eq!(applies("auto"), [true, false, false, false], "auto: only when the LLM and the DiT both run on the CPU");
    assert_eq!(applies("on"), [true; 4]);
    assert_eq!(applies("off"), [false; 4]);
}

/// A copy of the bundled model whose manifest carries non-official sampling and streaming values,
/// and its constants.
fn model_with_unusual_values() -> (tempfile::TempDir, cosy::pipeline::constants::ModelConstants) {
    let dir = crate::common::writable_model_dir().expect("fixture model");
    crate::common::edit_manifest(dir.path(), |m| {
        let k = &mut m["constants"];
        k["sampling"]["top_p"] = 0.5.into();
        k["sampling"]["top_k"] = 7.into();
        k["sampling"]["win_size"] = 4.into();
        k["sampling"]["tau_r"] = 0.3.into();
        k["streaming"]["token_hop_len"] = 10.into();
        k["streaming"]["token_max_hop_len"] = 40.into();
        k["streaming"]["stream_scale_factor"] = 3.into();
    });
    let model = cosy::model::ModelDir::open(dir.path()).unwrap();
    let constants = cosy::pipeline::constants::ModelConstants::from_manifest(&model).unwrap();
    (dir, constants)
}

#[test]
fn a_value_the_user_set_wins_over_the_manifest_even_when_it_is_the_official_one() {
    let (_model, k) = model_with_unusual_values();
    // Unset keys take the model's values.
    let c = Config::load(&LoadOptions::default()).unwrap();
    let s = k.sampling_for(&c);
    assert_eq!((s.top_p, s.top_k, s.win_size, s.tau_r), (0.5, 7, 4, 0.3));
    let st = k.stream_for(&c).unwrap();
    assert_eq!((st.token_hop_len, st.token_max_hop_len, st.stream_scale_factor), (10, 40, 3));

    // The official values written in a file are the user's choice: they win. (Before, a value
    // equal to the built-in default was taken for "unset" and the manifest's kept.)
    let d = tempfile::tempdir().unwrap();
    let file = write(
        d.path(),
        "[sampling]\ntop_p = 0.8\ntop_k = 25\nwin_size = 10\ntau_r = 0.1\n[streaming]\ntoken_hop_len = 25\ntoken_max_hop_len = 100\nstream_scale_factor = 2\n",
    );
    let c = Config::load(&LoadOptions { config_file: Some(file.clone()), ..Default::default() }).unwrap();
    let s = k.sampling_for(&c);
    assert_eq!((s.top_p, s.top_k, s.win_size, s.tau_r), (0.8, 25, 10, 0.1));
    let st = k.stream_for(&c).unwrap();
    assert_eq!((st.token_hop_len, st.token_max_hop_len, st.stream_scale_factor), (25, 100, 2));

    // The same from a flag; and "" hands a key back to the model.
    let opts = LoadOptions {
        config_file: Some(file),
        flags: vec![("sampling.top_k".into(), "3".into()), ("sampling.top_p".into(), "".into())],
        ..Default::default()
    };
    let s = k.sampling_for(&Config::load(&opts).unwrap());
    assert_eq!((s.top_p, s.top_k, s.win_size), (0.5, 3, 10));
}

#[test]
fn a_users_hop_beyond_the_models_maximum_is_refused() {
    let (_model, k) = model_with_unusual_values();
    let opts = LoadOptions { flags: vec![("streaming.token_hop_len".into(), "50".into())], ..Default::default() };
    let c = Config::load(&opts).unwrap();
    match k.stream_for(&c) {
        Err(Error::Config(m)) => assert!(m.contains("token_max_hop_len") && m.contains("50"), "{m}"),
        other => panic!("expected a config error, got {other:?}"),
    }
}

/// One config key per limit: the server's old names for the engine's admission limits are still
/// read (from a file or a flag) and set the engine's keys.
#[test]
fn the_old_server_limit_keys_set_the_engines() {
    let d = tempfile::tempdir().unwrap();
    let file = write(d.path(), "[server]\nmax_concurrent = 3\nmax_queue = 0\n");
    let c = Config::load(&LoadOptions { config_file: Some(file), ..Default::default() }).unwrap();
    assert_eq!((c.engine.max_in_flight, c.engine.max_queue), (3, 0));
    let opts = LoadOptions { flags: vec![("server.max_queue".into(), "7".into())], ..Default::default() };
    assert_eq!(Config::load(&opts).unwrap().engine.max_queue, 7);
    let bad = LoadOptions { flags: vec![("server.max_concurrent".into(), "0".into())], ..Default::default() };
    assert!(config_err(&bad).contains("server.max_concurrent (now engine.max_in_flight)"));
}

/// Every error about a config file names the file, the line (and for a syntax error the column)
/// and the key or table: a duplicate table or key, a bad value, an unknown key, broken syntax.
#[test]
fn config_file_errors_name_the_file_the_line_and_the_key() {
    let d = tempfile::tempdir().unwrap();
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "[runtime]\nthreads = 2\n\n[runtime]\nprecision = \"fp16\"\n",
            "duplicate table",
            &["cosy.toml:4:", "table [runtime] appears twice", "first on line 1"],
        ),
        (
            "[runtime]\nthreads = 2\nprecision = \"fp32\"\nthreads = 3\n",
            "duplicate key",
            &["cosy.toml:4:1:", "key runtime.threads appears twice", "first on line 2"],
        ),
        ("# seeds\n[sampling]\nseed = -4\n", "bad value", &["cosy.toml:3:", "sampling.seed = -4", "an integer >= 0"]),
        ("\n\n[runtime]\nthread = 2\n", "unknown key", &["cosy.toml:4:", "runtime.thread", "unknown key"]),
        ("runtime.threads = \"many\"\n", "dotted key", &["cosy.toml:1:", "runtime.threads"]),
        ("[server]\nbind = \"x\n", "syntax", &["cosy.toml:2:", "not valid TOML"]),
    ];
    for (text, what, needles) in cases {
        let file = write(d.path(), text);
        let m = config_err(&LoadOptions { config_file: Some(file), ..Default::default() });
        for n in *needles {
            assert!(m.contains(n), "{what}: {m:?} lacks {n:?}");
        }
        assert!(!m.contains('\n'), "{what}: one line: {m:?}");
    }
}
