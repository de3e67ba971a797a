//! Typed model constants read from the manifest's `config`, `constants` and `sine_noise`
//! sections (docs/model-format.md). Nothing here has a built-in default: a missing key is a
//! model-folder error naming the key.

use serde_json::Value;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::flow::{CfmParams, StreamParams};
use crate::hift::SourceParams;
use crate::llm::{LlmConstants, SamplingParams};
use crate::model::ModelDir;

/// LLM graph geometry (manifest `config.llm`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LlmShape {
    pub hidden: usize,
    pub layers: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// Everything the pipeline needs to know about the model, typed.
#[derive(Debug, Clone)]
pub struct ModelConstants {
    pub llm: LlmConstants,
    pub llm_shape: LlmShape,
    /// The yaml's sampling (before any config override).
    pub sampling: SamplingParams,
    pub silent_tokens: Vec<i64>,
    pub max_silent_run: usize,
    pub stream: StreamParams,
    pub cfm: CfmParams,
    pub source: SourceParams,
    pub f0_look_right: usize,
    pub conv_pre_look_right: usize,
    /// Mel frames of left context that make a windowed `hift_decode` call exact (manifest
    /// `config.hift.decode_left_context_frames`); `None` for models exported before it existed,
    /// which then re-vocode the whole accumulated mel each streaming chunk.
    pub hift_decode_left_context: Option<usize>,
    pub sample_rate: u32,
    pub mel_dim: usize,
    pub max_prompt_seconds: f64,
    pub sine_noise_offset: u64,
}

struct Reader<'a> {
    dir: &'a ModelDir,
}

impl Reader<'_> {
    fn get<'v>(&self, root: &'v Value, section: &str, path: &str) -> Result<&'v Value> {
        let mut v = root;
        for part in path.split('.') {
            v = v.get(part).ok_or_else(|| {
                Error::model(&self.dir.root, format!("manifest.json: {section}.{path} is missing (re-export the model)"))
            })?;
        }
        Ok(v)
    }
    fn f64(&self, root: &Value, section: &str, path: &str) -> Result<f64> {
        self.get(root, section, path)?
            .as_f64()
            .ok_or_else(|| Error::model(&self.dir.root, format!("manifest.json: {section}.{path} is not a number")))
    }
    fn usize(&self, root: &Value, section: &str, path: &str) -> Result<usize> {
        self.get(root, section, path)?
            .as_u64()
            .map(|v| v as usize)
            .ok_or_else(|| Error::model(&self.dir.root, format!("manifest.json: {section}.{path} is not a count")))
    }
    fn i64(&self, root: &Value, section: &str, path: &str) -> Result<i64> {
        self.get(root, section, path)?
            .as_i64()
            .ok_or_else(|| Error::model(&self.dir.root, format!("manifest.json: {section}.{path} is not an integer")))
    }
}

impl ModelConstants {
    pub fn from_manifest(dir: &ModelDir) -> Result<ModelConstants> {
        let r = Reader { dir };
        let m = &dir.manifest;
        let (cfg, k) = (&m.config, &m.constants);
        let c = |p: &str| r.usize(cfg, "config", p);
        let kf = |p: &str| r.f64(k, "constants", p);
        let ki = |p: &str| r.i64(k, "constants", p);
        let ku = |p: &str| r.usize(k, "constants", p);
        let llm = LlmConstants {
            sos: ki("sos")?,
            task_id: ki("task_id")?,
            endofprompt_id: ki("endofprompt_id")?,
            stop_token_min: ki("stop_token_min")?,
            stop_token_end: ki("stop_token_end")?,
            ignore_eos_masked_id: ki("ignore_eos_masked_id")?,
            min_token_text_ratio: kf("min_token_text_ratio")?,
            max_token_text_ratio: kf("max_token_text_ratio")?,
        };
        let llm_shape = LlmShape {
            hidden: c("llm.hidden_size")?,
            layers: c("llm.num_layers")?,
            kv_heads: c("llm.num_kv_heads")?,
            head_dim: c("llm.head_dim")?,
        };
        let sampling = SamplingParams {
            top_p: kf("sampling.top_p")? as f32,
            top_k: ku("sampling.top_k")?,
            win_size: ku("sampling.win_size")?,
            tau_r: kf("sampling.tau_r")?,
        };
        let silent_tokens = r
            .get(k, "constants", "silent_tokens")?
            .as_array()
            .and_then(|a| a.iter().map(Value::as_i64).collect::<Option<Vec<i64>>>())
            .ok_or_else(|| Error::model(&dir.root, "manifest.json: constants.silent_tokens is not a list of ids"))?;
        let stream = StreamParams {
            token_hop_len: ku("streaming.token_hop_len")?,
            token_max_hop_len: ku("streaming.token_max_hop_len")?,
            stream_scale_factor: ku("streaming.stream_scale_factor")?,
            pre_lookahead_len: ku("streaming.pre_lookahead_len")?,
            token_mel_ratio: c("flow.token_mel_ratio")?,
            dit_block_frames: ku("streaming.dit_block_frames")?,
        };
        let cfm = CfmParams { n_timesteps: ku("cfm.n_timesteps")?, cfg_rate: kf("cfm.cfg_rate")? as f32 };
        let source = SourceParams {
            sample_rate: c("sample_rate")? as u32,
            samples_per_frame: ku("samples_per_frame")?,
            nb_harmonics: c("hift.nb_harmonics")?,
            nsf_alpha: r.f64(cfg, "config", "hift.nsf_alpha")? as f32,
            nsf_sigma: r.f64(cfg, "config", "hift.nsf_sigma")? as f32,
            nsf_voiced_threshold: r.f64(cfg, "config", "hift.nsf_voiced_threshold")? as f32,
        };
        Ok(ModelConstants {
            llm,
            llm_shape,
            sampling,
            silent_tokens,
            max_silent_run: ku("max_silent_run")?,
            stream,
            cfm,
            source,
            f0_look_right: c("hift.f0_look_right")?,
            conv_pre_look_right: c("hift.conv_pre_look_right")?,
            hift_decode_left_context: cfg
                .pointer("/hift/decode_left_context_frames")
                .map(|_| c("hift.decode_left_context_frames"))
                .transpose()?,
            sample_rate: c("sample_rate")? as u32,
            mel_dim: c("flow.mel_dim")?,
            max_prompt_seconds: kf("max_prompt_seconds")?,
            sine_noise_offset: r.get(&m.sine_noise, "sine_noise", "offset")?.as_u64().ok_or_else(|| {
                Error::model(&dir.root, "manifest.json: sine_noise.offset is not a count")
            })?,
        })
    }

    /// The sampling actually used: the manifest's (the yaml's) values, except keys that the
    /// configuration changed from its built-in defaults (config.toml, COSY_*, `--set`).
    pub fn sampling_for(&self, config: &Config) -> SamplingParams {
        let d = Config::default().sampling;
        let s = &config.sampling;
        let mut p = self.sampling;
        if s.top_p != d.top_p {
            p.top_p = s.top_p as f32;
        }
        if s.top_k != d.top_k {
            p.top_k = s.top_k;
        }
        if s.win_size != d.win_size {
            p.win_size = s.win_size;
        }
        if s.tau_r != d.tau_r {
            p.tau_r = s.tau_r;
        }
        p
    }

    /// The streaming schedule: the manifest's hops, except those the configuration changed.
    pub fn stream_for(&self, config: &Config) -> StreamParams {
        let d = Config::default().streaming;
        let s = &config.streaming;
        let mut p = self.stream;
        if s.token_hop_len != d.token_hop_len {
            p.token_hop_len = s.token_hop_len;
        }
        if s.token_max_hop_len != d.token_max_hop_len {
            p.token_max_hop_len = s.token_max_hop_len;
        }
        if s.stream_scale_factor != d.stream_scale_factor {
            p.stream_scale_factor = s.stream_scale_factor;
        }
        p
    }
}
