//! The library's configuration keys, one [`Key`] each: name, default, allowed values, variable,
//! doc and setter. The loader (`Config::load`), `--set`, the environment, `cosy doctor`'s sources
//! and the unknown-key refusal all read this table; config.toml documents every key in it (a test
//! checks). A front end adds its own table the same way (`cosy serve`: `[server]`, `[wyoming]`).

use super::key::{Key, Renamed, Setting, TRUE_FALSE};
use super::settings::{default_engine_cache, CodeBlocks, Config, CpuSwitch, CudaConvSearch, ShapeBuckets, LlmKv, NormalizerChoice, StageSettings, Symbols};
use crate::error::Result;
use crate::vocab::{check_voice_name, Precision, ProviderKind, StageGroup, OPENAI_VOICES};

const INT_OR_MODEL: &str = "an integer >= 1, or \"\" for the model's value";
const PROVIDERS_ALLOWED: &str =
    "a list of tensorrt, tensorrt-rtx, cuda, cpu in priority order (array, or comma-separated text), without repeats";

/// The entries of [`KEYS`].
type K = Key<Config>;

/// Every key of the library, in config.toml's order (the `stages.<group>.*` keys for each group).
pub static KEYS: &[Key<Config>] = &[
    K::found("model.dir", "the models folder's default model", "a path (string)", |c, v| {
        c.model_dir = v.path()?;
        Ok(())
    })
    .env("COSY_MODEL")
    .doc("The exported model folder (docs/model-format.md)."),
    K::new("runtime.ort_library", "\"\"", "a path (string); empty for the default", |c, v| {
        c.runtime.ort_library = v.path_or_default()?;
        Ok(())
    })
    .env("COSY_ORT_LIBRARY")
    .doc("libonnxruntime.so; \"\": $ORT_DYLIB_PATH, else the search (runtime::env::locate_library)."),
    K::new("runtime.tensorrt_rtx_library", "\"\"", "a path (string); empty for the default", |c, v| {
        c.runtime.tensorrt_rtx_library = v.path_or_default()?;
        Ok(())
    })
    .env("COSY_TENSORRT_RTX_LIBRARY")
    .doc("The TensorRT for RTX plugin (libonnxruntime_providers_nv_tensorrt_rtx.so); \"\": beside libonnxruntime.so."),
    K::new("runtime.providers", "[\"cpu\"]", PROVIDERS_ALLOWED, |c, v| {
        c.runtime.providers = providers_of(v).ok_or_else(|| v.invalid())?;
        Ok(())
    })
    .env("COSY_PROVIDERS")
    .doc("Execution providers in priority order."),
    K::new("runtime.allow_fallback", "false", TRUE_FALSE, |c, v| {
        c.runtime.allow_fallback = v.boolean()?;
        Ok(())
    })
    .env("COSY_ALLOW_FALLBACK")
    .doc("A provider that cannot be used is a warning (the next is used), not an error."),
    K::new("runtime.precision", "\"fp32\"", Precision::ALLOWED, |c, v| {
        c.runtime.precision = v.text().and_then(|s| Precision::parse(&s)).ok_or_else(|| v.invalid())?;
        Ok(())
    })
    .env("COSY_PRECISION")
    .doc("Precision of every stage (overridable per stage)."),
    K::new("runtime.device_id", "0", "an integer >= 0", |c, v| {
        c.runtime.device_id = v.int_in(0..=i64::from(u32::MAX))?;
        Ok(())
    })
    .env("COSY_DEVICE_ID")
    .doc("GPU index for CUDA and TensorRT."),
    K::new("runtime.threads", "0", "an integer 0..=1024 (0: ONNX Runtime's choice)", |c, v| {
        c.runtime.threads = v.int_in(0..=1024)?;
        Ok(())
    })
    .env("COSY_THREADS")
    .doc("Intra-op threads for CPU work."),
    K::new("runtime.engine_cache", "\"\"", "a path (string); \"\" for the user's cache folder", |c, v| {
        c.runtime.engine_cache = v.path_or_default()?.unwrap_or_else(default_engine_cache);
        Ok(())
    })
    .default_is("the user's cache folder ($XDG_CACHE_HOME/cosy/engines)")
    .env("COSY_ENGINE_CACHE")
    .doc("TensorRT engine and timing cache folder."),
    K::new("runtime.graph_cache", "\"\"", "a path (string); \"\" for <runtime.engine_cache>/graphs", |c, v| {
        c.runtime.graph_cache = v.path_or_default()?;
        Ok(())
    })
    .default_is("<runtime.engine_cache>/graphs")
    .env("COSY_GRAPH_CACHE")
    .doc("Optimised-graph cache folder of CPU sessions."),
    K::new("runtime.graph_cache_enabled", "true", TRUE_FALSE, |c, v| {
        c.runtime.graph_cache_enabled = v.boolean()?;
        Ok(())
    })
    .env("COSY_GRAPH_CACHE_ENABLED")
    .doc("Whether CPU sessions save and reuse their optimised graphs."),
    K::new("runtime.cuda_mem_limit", "0", "bytes as an integer >= 0 (0: no limit)", |c, v| {
        c.runtime.cuda_mem_limit = v.int_in(0..=i64::MAX)?;
        Ok(())
    })
    .doc("CUDA memory arena limit in bytes."),
    K::new("runtime.cuda_graphs", "false", TRUE_FALSE, |c, v| {
        c.runtime.cuda_graphs = v.boolean()?;
        Ok(())
    })
    .doc("CUDA graphs for stages whose shapes never change."),
    K::new("runtime.cuda_conv_search", "\"heuristic\"", CudaConvSearch::NAMES, |c, v| {
        c.runtime.cuda_conv_search = v.text().and_then(|s| CudaConvSearch::parse(&s)).ok_or_else(|| v.invalid())?;
        Ok(())
    })
    .doc("How cuDNN picks a convolution algorithm for each new input shape."),
    K::new("runtime.ort_profile", "\"\"", "a path prefix (string); \"\" for off", |c, v| {
        c.runtime.ort_profile = v.path_or_default()?;
        Ok(())
    })
    .env("COSY_ORT_PROFILE")
    .doc("ONNX Runtime's own per-node profile of every session, written to <prefix>-<stage>_<time>.json."),
    K::new("runtime.shape_buckets", "\"auto\"", ShapeBuckets::NAMES, |c, v| {
        c.runtime.shape_buckets = v.text().and_then(|s| ShapeBuckets::parse(&s)).ok_or_else(|| v.invalid())?;
        Ok(())
    })
    .env("COSY_SHAPE_BUCKETS")
    .doc("Pad DiT and HiFT calls to a few fixed lengths (auto: on CUDA/TensorRT, off on the CPU)."),
    K::new("stages.<llm|flow|dit|hift|frontend>.precision", "\"\"", "fp32, fp16, bf16, int8, or \"\" to inherit", |c, v| {
        let s = v.text_or_invalid()?;
        stage(c, v)?.precision = if s.is_empty() { None } else { Some(Precision::parse(&s).ok_or_else(|| v.invalid())?) };
        Ok(())
    })
    .doc("The group's precision (\"\": runtime.precision)."),
    K::new("stages.<llm|flow|dit|hift|frontend>.providers", "\"\"", PROVIDERS_ALLOWED, |c, v| {
        stage(c, v)?.providers = if v.is_blank() { None } else { Some(providers_of(v).ok_or_else(|| v.invalid())?) };
        Ok(())
    })
    .doc("The group's providers (\"\": runtime.providers)."),
    K::new(
        "stages.<llm|flow|dit|hift|frontend>.threads",
        "\"\"",
        "an integer from 0 (ONNX Runtime chooses) to 1024, or \"\" to inherit runtime.threads",
        |c, v| {
            stage(c, v)?.threads = if v.is_blank() { None } else { Some(v.int_in(0..=1024)?) };
            Ok(())
        },
    )
    .doc("The group's intra-op threads (\"\": runtime.threads)."),
    K::new("stages.<llm|flow|dit|hift|frontend>.spinning", "\"\"", "true, false, or \"\" for ONNX Runtime's default (on)", |c, v| {
        stage(c, v)?.spinning = if v.is_blank() { None } else { Some(v.boolean()?) };
        Ok(())
    })
    .doc("Whether the group's idle intra-op threads spin-wait."),
    K::new("sampling.seed", "0", "an integer >= 0", |c, v| {
        c.sampling.seed = v.int_in(0..=i64::MAX)?;
        Ok(())
    })
    .env("COSY_SEED")
    .doc("LLM sampling seed."),
    K::new("sampling.top_p", "\"\"", "a number in (0, 1], or \"\" for the model's value", |c, v| {
        c.sampling.top_p = v.model_backed(|v| v.float().filter(|&p| p > 0.0 && p <= 1.0))?;
        Ok(())
    })
    .doc("Nucleus sampling mass (\"\": the model's value)."),
    K::new("sampling.top_k", "\"\"", INT_OR_MODEL, |c, v| {
        c.sampling.top_k = v.model_backed(Setting::positive)?;
        Ok(())
    })
    .doc("Top-k of sampling (\"\": the model's value)."),
    K::new("sampling.win_size", "\"\"", INT_OR_MODEL, |c, v| {
        c.sampling.win_size = v.model_backed(Setting::positive)?;
        Ok(())
    })
    .doc("Repetition-aware sampling window (\"\": the model's value)."),
    K::new("sampling.tau_r", "\"\"", "a number >= 0, or \"\" for the model's value", |c, v| {
        // Above 1 the repetition rule never fires (the official greedy test configs use 2).
        c.sampling.tau_r = v.model_backed(|v| v.float().filter(|&t| t >= 0.0))?;
        Ok(())
    })
    .doc("Repetition threshold (\"\": the model's value)."),
    K::new("streaming.enabled", "false", TRUE_FALSE, |c, v| {
        c.streaming.enabled = v.boolean()?;
        Ok(())
    })
    .doc("Whether `cosy file` and `cosy profile` stream by default."),
    K::new("streaming.token_hop_len", "\"\"", INT_OR_MODEL, |c, v| {
        c.streaming.token_hop_len = v.model_backed(Setting::positive)?;
        check_hops(c, v)
    })
    .doc("Tokens of the first chunk (\"\": the model's value)."),
    K::new("streaming.token_max_hop_len", "\"\"", INT_OR_MODEL, |c, v| {
        c.streaming.token_max_hop_len = v.model_backed(Setting::positive)?;
        check_hops(c, v)
    })
    .doc("Most tokens of a chunk (\"\": the model's value)."),
    K::new("streaming.stream_scale_factor", "\"\"", INT_OR_MODEL, |c, v| {
        c.streaming.stream_scale_factor = v.model_backed(Setting::positive)?;
        Ok(())
    })
    .doc("Growth of the hop from chunk to chunk (\"\": the model's value)."),
    K::new("output.device", "\"default\"", "\"default\", \"none\" or a device name", |c, v| {
        c.output.device = v.text().filter(|s| !s.is_empty()).ok_or_else(|| v.invalid())?;
        Ok(())
    })
    .env("COSY_OUTPUT_DEVICE")
    .doc("Playback device of `cosy say`."),
    K::found("voices.dir", "the user's data folder ($XDG_DATA_HOME/cosy/voices)", "a path (string)", |c, v| {
        c.voices.dir = v.path()?;
        Ok(())
    })
    .env("COSY_VOICES")
    .doc("Folder of the saved voices."),
    K::new("voices.default", "\"\"", "a saved voice's name, or \"\" for the voices folder's default", |c, v| {
        let s = v.text_or_invalid()?;
        if !s.is_empty() {
            check_voice_name(&s).map_err(|_| {
                v.invalid_as("a saved voice's name (letters, digits, '.', '_', '-'), or \"\" for the voices folder's default")
            })?;
        }
        c.voices.default = (!s.is_empty()).then_some(s);
        Ok(())
    })
    .env("COSY_VOICE")
    .doc("The voice used when a command names none (\"\": the voices folder's default)."),
    K::new("voices.aliases.<name>", "\"\"", "a saved voice's name (string), or \"\" to remove the alias", set_alias)
        .doc("Another name for a saved voice (an OpenAI voice name or any voice name)."),
    K::new("limits.max_text_chars", "5000", "an integer >= 1", |c, v| {
        c.limits.max_text_chars = v.int_in(1..=i64::MAX)?;
        Ok(())
    })
    .doc("Longest text, in characters, one command synthesises."),
    K::new("limits.max_prompt_text_chars", "2000", "an integer >= 1", |c, v| {
        c.limits.max_prompt_text_chars = v.int_in(1..=i64::MAX)?;
        Ok(())
    })
    .doc("Longest prompt transcript or instruction, in characters (a prompt recording is seconds long)."),
    K::new("engine.max_batch", "16", "an integer from 1 to 256", |c, v| {
        c.engine.max_batch = v.int_in(1..=256)?;
        Ok(())
    })
    .doc("Most sentences whose LLM decode steps run as one call."),
    K::new("engine.max_in_flight", "16", "an integer from 1 to 65536", |c, v| {
        c.engine.max_in_flight = v.int_in(1..=65_536)?;
        Ok(())
    })
    .doc("Most requests synthesising at once."),
    K::new("engine.max_queue", "64", "an integer from 0 to 1048576", |c, v| {
        c.engine.max_queue = v.int_in(0..=1 << 20)?;
        Ok(())
    })
    .doc("Most requests waiting for a slot; more are refused (Busy, HTTP 429)."),
    K::new("engine.dit_max_batch", "8", "an integer from 1 to 64", |c, v| {
        c.engine.dit_max_batch = v.int_in(1..=64)?;
        Ok(())
    })
    .doc("Most requests whose flow (DiT) calls run as one call."),
    K::new("engine.prompt_cache_bytes", "2147483648", "a number of bytes from 0 (off) to 1099511627776", |c, v| {
        c.engine.prompt_cache_bytes = v.int_in(0..=1 << 40)?;
        Ok(())
    })
    .doc("Bound of the in-memory DiT prompt-prefix cache."),
    K::new("engine.prompt_cache", "\"auto\"", CpuSwitch::NAMES, |c, v| {
        c.engine.prompt_cache = v.text().and_then(|s| CpuSwitch::parse(&s)).ok_or_else(|| v.invalid())?;
        Ok(())
    })
    .doc("Where the prompt-prefix cache is used (auto: a DiT on the CPU)."),
    K::new("engine.prompt_cache_disk_bytes", "4294967296", "a number of bytes from 0 (off) to 17592186044416", |c, v| {
        c.engine.prompt_cache_disk_bytes = v.int_in(0..=1 << 44)?;
        Ok(())
    })
    .doc("Bound of the prompt-prefix cache on disk (<runtime.engine_cache>/prompt-prefix)."),
    K::new("engine.first_audio_priority", "\"auto\"", CpuSwitch::NAMES, |c, v| {
        c.engine.first_audio_priority = v.text().and_then(|s| CpuSwitch::parse(&s)).ok_or_else(|| v.invalid())?;
        Ok(())
    })
    .doc("Whether LLM decoding waits while a stream's first chunk runs (auto: both on the CPU)."),
    K::new("engine.llm_kv", "\"growing\"", LlmKv::NAMES, |c, v| {
        c.engine.llm_kv = v.text().and_then(|s| LlmKv::parse(&s)).ok_or_else(|| v.invalid())?;
        Ok(())
    })
    .doc("LLM key/value cache: static slots written in place (graph llm_step) or growing (auto: static on CUDA/TensorRT)."),
    K::new("engine.llm_max_positions", "2048", "an integer from 16 to 1048576", |c, v| {
        c.engine.llm_max_positions = v.int_in(16..=1 << 20)?;
        Ok(())
    })
    .doc("Static LLM cache: positions per slot to start with (doubled when a sentence needs more)."),
    K::new("engine.file_concurrency", "4", "an integer from 1 to 256", |c, v| {
        c.engine.file_concurrency = v.int_in(1..=256)?;
        Ok(())
    })
    .doc("`cosy file --input`: lines synthesised at once."),
    K::new("engine.idle_unload_s", "0", "a number of seconds from 0 (never) to 31536000", |c, v| {
        c.engine.idle_unload_s = v.int_in(0..=31_536_000)?;
        Ok(())
    })
    .env("COSY_IDLE_UNLOAD_S")
    .doc("Seconds without requests after which the model is dropped until the next one (0 = never)."),
    K::new("text.normalizer", "\"auto\"", NormalizerChoice::ALLOWED, |c, v| {
        c.text.normalizer = v.text().and_then(|s| NormalizerChoice::parse(&s)).ok_or_else(|| v.invalid())?;
        Ok(())
    })
    .doc("The frontend's text normaliser."),
    K::new("text.markdown", "true", TRUE_FALSE, |c, v| {
        c.text.markdown.enabled = v.boolean()?;
        Ok(())
    })
    .doc("Read Markdown and chat text as a person would (docs/text.md); false: the text as written."),
    K::new("text.code_blocks", "\"stand-in\"", CodeBlocks::ALLOWED, |c, v| {
        c.text.markdown.code_blocks = v.text().and_then(|s| CodeBlocks::parse(&s)).ok_or_else(|| v.invalid())?;
        Ok(())
    })
    .doc("What a fenced code block becomes in speech (with text.markdown)."),
    K::new("text.symbols", "\"drop\"", Symbols::ALLOWED, |c, v| {
        c.text.markdown.symbols = v.text().and_then(|s| Symbols::parse(&s)).ok_or_else(|| v.invalid())?;
        Ok(())
    })
    .doc("What emoji become in speech (with text.markdown)."),
    K::new("text.urls", "true", TRUE_FALSE, |c, v| {
        c.text.markdown.urls = v.boolean()?;
        Ok(())
    })
    .doc("Read bare URLs, e-mail addresses and file paths out (with text.markdown); false: as written."),
    K::new("text.phone", "false", TRUE_FALSE, |c, v| {
        c.text.markdown.phone = v.boolean()?;
        Ok(())
    })
    .doc("Read phone numbers digit by digit in groups (with text.markdown); false: left to the normaliser."),
    K::new("text.units", "true", TRUE_FALSE, |c, v| {
        c.text.markdown.units = v.boolean()?;
        Ok(())
    })
    .doc("Read unit abbreviations after a number as words, \"5 km\" as \"5 kilometers\" (with text.markdown)."),
    K::new("text.numbers", "true", TRUE_FALSE, |c, v| {
        c.text.numbers = v.boolean()?;
        Ok(())
    })
    .doc("Spell numbers out (the official normaliser); false: the digits reach the model as written."),
    K::new("text.lexicon", "\"\"", "a path (string), or \"\" for none", |c, v| {
        c.text.lexicon = v.path_or_default()?;
        Ok(())
    })
    .doc("The pronunciation lexicon: a TOML file of words and what to say for them (docs/text.md)."),
    K::new("debug.test_hooks", "false", TRUE_FALSE, |c, v| {
        c.debug.test_hooks = v.boolean()?;
        Ok(())
    })
    .doc("Accept requests with test hooks (tests only)."),
    K::new("debug.model_text", "false", TRUE_FALSE, |c, v| {
        c.debug.model_text = v.boolean()?;
        Ok(())
    })
    .doc("The server tells each sentence's text as the model gets it (WebSocket and Wyoming events; docs/server.md)."),
];

/// Old names still read: the server's admission limits became the engine's (one limit for every
/// front end); a stage's `provider` is read as `providers`.
pub static RENAMED: &[Renamed] = &[
    Renamed { old: "server.max_concurrent", new: "engine.max_in_flight", why: Some("one limit for every front end") },
    Renamed { old: "server.max_queue", new: "engine.max_queue", why: Some("one limit for every front end") },
    Renamed { old: "stages.<llm|flow|dit|hift|frontend>.provider", new: "stages.<llm|flow|dit|hift|frontend>.providers", why: None },
];

/// The `[stages.<group>]` settings a stage key names.
fn stage<'c>(c: &'c mut Config, v: &Setting<'_>) -> Result<&'c mut StageSettings> {
    let group = v.name(0).and_then(StageGroup::parse).ok_or_else(|| v.refuse_value("unknown key; not a stage group"))?;
    Ok(c.stages.entry(group).or_default())
}

/// `streaming.token_max_hop_len` must be at least `streaming.token_hop_len`.
fn check_hops(c: &Config, v: &Setting<'_>) -> Result<()> {
    match (c.streaming.token_hop_len, c.streaming.token_max_hop_len) {
        (Some(hop), Some(max)) if max < hop => Err(v.refuse_value(&format!(
            "streaming.token_max_hop_len ({max}) must be >= streaming.token_hop_len ({hop})"
        ))),
        _ => Ok(()),
    }
}

/// `voices.aliases.<name>`: the alias must be a name a request can give (OpenAI's or a voice
/// name, not `default`); the value a saved voice's name, not the alias itself; `""` removes it.
fn set_alias(c: &mut Config, v: &Setting<'_>) -> Result<()> {
    let Some(alias) = v.name(0) else {
        return Err(v.invalid_as("a table of aliases: [voices.aliases] then alloy = \"anna\" (or --set voices.aliases.alloy=anna)"));
    };
    if alias == "default" || check_voice_name(alias).is_err() {
        return Err(v.refuse(&format!(
            "the alias {alias:?} is not a voice name a request can give; use one of OpenAI's voice names ({}) or 1-64 letters, \
             digits, '.', '_', '-' (not \"default\")",
            OPENAI_VOICES.join(", ")
        )));
    }
    let s = v.text_or_invalid()?;
    if s.is_empty() {
        c.voices.aliases.remove(alias);
        return Ok(());
    }
    check_voice_name(&s).map_err(|_| v.invalid_as("a saved voice's name (letters, digits, '.', '_', '-'), or \"\" to remove the alias"))?;
    if s == alias {
        return Err(v.invalid_as("another voice's name (an alias of itself means nothing)"));
    }
    c.voices.aliases.insert(alias.to_string(), s);
    Ok(())
}

/// Providers in priority order, without repeats, at least one.
fn providers_of(v: &Setting<'_>) -> Option<Vec<ProviderKind>> {
    let mut out = Vec::new();
    for n in v.list()? {
        let p = ProviderKind::parse(&n)?;
        if out.contains(&p) {
            return None;
        }
        out.push(p);
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::key::{Origin, RawValue};

    fn providers(text: &str) -> Option<Vec<ProviderKind>> {
        let (value, origin) = (RawValue::Text(text.into()), Origin::Flag("runtime.providers".into()));
        providers_of(&Setting { shown: "runtime.providers", value: &value, origin: &origin, base: None, allowed: "", names: &[] })
    }

    #[test]
    fn providers_parse_lists_and_refuse_repeats() {
        assert_eq!(providers("tensorrt, CUDA,cpu"), Some(vec![ProviderKind::TensorRt, ProviderKind::Cuda, ProviderKind::Cpu]));
        assert_eq!(providers("tensorrt-rtx,cpu"), Some(vec![ProviderKind::TensorRtRtx, ProviderKind::Cpu]));
        assert_eq!(providers("cuda,cuda"), None);
        assert_eq!(providers("rocm"), None);
        assert_eq!(providers(""), None);
    }

    /// The stage keys name every group (and only those), and say the precisions there are.
    #[test]
    fn the_stage_keys_name_every_group_and_precision() {
        let groups: Vec<&str> = StageGroup::ALL.iter().map(|g| g.as_str()).collect();
        let family = format!("stages.<{}>.", groups.join("|"));
        let stage_keys: Vec<&str> = KEYS.iter().map(|k| k.about.name).filter(|n| n.starts_with("stages.")).collect();
        assert_eq!(stage_keys.len(), 4);
        for name in stage_keys.iter().copied().chain(RENAMED.iter().flat_map(|r| [r.old, r.new]).filter(|n| n.starts_with("stages."))) {
            assert!(name.starts_with(&family), "{name}");
        }
        let precision = KEYS.iter().find(|k| k.about.name.ends_with(".precision") && k.about.name.starts_with("stages.")).map(|k| k.about.allowed);
        assert_eq!(precision, Some(format!("{}, or \"\" to inherit", Precision::ALLOWED).as_str()));
    }
}
