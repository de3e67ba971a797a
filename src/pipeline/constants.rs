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
    /// Mel frames of the flow noise as the manifest states them (`constants.noise_frames`;
    /// `None` in folders exported without it): the side file's `flow.noise` must have exactly
    /// these ([`super::limits::check_noise_frames`]).
    pub noise_frames: Option<usize>,
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
            sample_rate: u32::try_from(c("sample_rate")?).unwrap_or(u32::MAX),
            samples_per_frame: ku("samples_per_frame")?,
            nb_harmonics: c("hift.nb_harmonics")?,
            nsf_alpha: r.f64(cfg, "config", "hift.nsf_alpha")? as f32,
            nsf_sigma: r.f64(cfg, "config", "hift.nsf_sigma")? as f32,
            nsf_voiced_threshold: r.f64(cfg, "config", "hift.nsf_voiced_threshold")? as f32,
        };
        let constants = ModelConstants {
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
            sample_rate: u32::try_from(c("sample_rate")?).unwrap_or(u32::MAX),
            mel_dim: c("flow.mel_dim")?,
            max_prompt_seconds: kf("max_prompt_seconds")?,
            noise_frames: k.get("noise_frames").map(|_| ku("noise_frames")).transpose()?,
            sine_noise_offset: r.get(&m.sine_noise, "sine_noise", "offset")?.as_u64().ok_or_else(|| {
                Error::model(&dir.root, "manifest.json: sine_noise.offset is not a count")
            })?,
        };
        constants.validate(dir)?;
        Ok(constants)
    }

    /// The sampling actually used: each key the user set (config file, `COSY_*`, `--set`) wins;
    /// keys left unset take the manifest's (the yaml's) value.
    pub fn sampling_for(&self, config: &Config) -> SamplingParams {
        let s = &config.sampling;
        let m = self.sampling;
        SamplingParams {
            top_p: s.top_p.map_or(m.top_p, |v| v as f32),
            top_k: s.top_k.unwrap_or(m.top_k),
            win_size: s.win_size.unwrap_or(m.win_size),
            tau_r: s.tau_r.unwrap_or(m.tau_r),
        }
    }

    /// The streaming schedule: the hops the user set, the manifest's for the rest. The mix is
    /// checked again here, since a user's hop may exceed the model's maximum hop.
    pub fn stream_for(&self, config: &Config) -> Result<StreamParams> {
        let s = &config.streaming;
        let mut p = self.stream;
        p.token_hop_len = s.token_hop_len.unwrap_or(p.token_hop_len);
        p.token_max_hop_len = s.token_max_hop_len.unwrap_or(p.token_max_hop_len);
        p.stream_scale_factor = s.stream_scale_factor.unwrap_or(p.stream_scale_factor);
        if p.token_max_hop_len < p.token_hop_len {
            return Err(Error::Config(format!(
                "streaming.token_hop_len ({}) is larger than streaming.token_max_hop_len ({}) (the model's value unless set); \
                 set streaming.token_max_hop_len too",
                p.token_hop_len, p.token_max_hop_len
            )));
        }
        Ok(p)
    }

    /// Refuses values no inference can run with (a zero rate, zero flow steps, inverted bounds):
    /// each would otherwise panic or loop deep in a stage. One message naming the key and value.
    fn validate(&self, dir: &ModelDir) -> Result<()> {
        let bad = |key: &str, value: String, want: &str| {
            Err(Error::model(&dir.root, format!("manifest.json: {key} = {value} is invalid ({want}); re-export the model")))
        };
        let counts: [(&str, usize); 15] = [
            ("config.llm.hidden_size", self.llm_shape.hidden),
            ("config.llm.num_layers", self.llm_shape.layers),
            ("config.llm.num_kv_heads", self.llm_shape.kv_heads),
            ("config.llm.head_dim", self.llm_shape.head_dim),
            ("config.sample_rate", self.sample_rate as usize),
            ("constants.samples_per_frame", self.source.samples_per_frame),
            ("config.flow.mel_dim", self.mel_dim),
            ("config.flow.token_mel_ratio", self.stream.token_mel_ratio),
            ("constants.cfm.n_timesteps", self.cfm.n_timesteps),
            ("constants.sampling.top_k", self.sampling.top_k),
            ("constants.sampling.win_size", self.sampling.win_size),
            ("constants.streaming.token_hop_len", self.stream.token_hop_len),
            ("constants.streaming.token_max_hop_len", self.stream.token_max_hop_len),
            ("constants.streaming.stream_scale_factor", self.stream.stream_scale_factor),
            ("constants.streaming.dit_block_frames", self.stream.dit_block_frames),
        ];
        for (key, v) in counts {
            if v == 0 {
                return bad(key, v.to_string(), "must be at least 1");
            }
        }
        // A count read as u64 and narrowed: a rate past u32 wrapped to something else above.
        if self.sample_rate > 384_000 {
            return bad("config.sample_rate", self.sample_rate.to_string(), "at most 384000 Hz");
        }
        if self.source.samples_per_frame as u64 > u64::from(self.sample_rate) {
            return bad(
                "constants.samples_per_frame",
                self.source.samples_per_frame.to_string(),
                "at most one second of samples (config.sample_rate)",
            );
        }
        if self.stream.token_max_hop_len < self.stream.token_hop_len {
            return bad(
                "constants.streaming.token_max_hop_len",
                self.stream.token_max_hop_len.to_string(),
                "must be >= constants.streaming.token_hop_len",
            );
        }
        let (lo, hi) = (self.llm.min_token_text_ratio, self.llm.max_token_text_ratio);
        if !(lo.is_finite() && hi.is_finite() && lo >= 0.0 && hi > 0.0 && lo <= hi && hi <= 1000.0) {
            return bad(
                "constants.min_token_text_ratio/max_token_text_ratio",
                format!("{lo}/{hi}"),
                "finite, 0 <= min <= max <= 1000, max > 0",
            );
        }
        if !(self.sampling.top_p > 0.0 && self.sampling.top_p <= 1.0) {
            return bad("constants.sampling.top_p", self.sampling.top_p.to_string(), "in (0, 1]");
        }
        // tau_r scales the repetition window: above 1 the repetition rule never fires (the
        // official greedy test configs use 2), so only a negative or non-finite value is wrong.
        if !(self.sampling.tau_r.is_finite() && self.sampling.tau_r >= 0.0) {
            return bad("constants.sampling.tau_r", self.sampling.tau_r.to_string(), "a number >= 0");
        }
        if !(self.cfm.cfg_rate.is_finite() && self.cfm.n_timesteps <= 1000) {
            return bad(
                "constants.cfm",
                format!("n_timesteps {} cfg_rate {}", self.cfm.n_timesteps, self.cfm.cfg_rate),
                "n_timesteps 1..=1000, finite cfg_rate",
            );
        }
        // The noise must hold a prompt and a sentence: without frames every request would fail.
        if self.noise_frames == Some(0) {
            return bad("constants.noise_frames", "0".into(), "the flow noise's mel frames, at least 1");
        }
        if !(self.max_prompt_seconds.is_finite() && self.max_prompt_seconds > 0.0) {
            return bad("constants.max_prompt_seconds", self.max_prompt_seconds.to_string(), "a positive number");
        }
        let source = &self.source;
        if !(source.nsf_alpha.is_finite() && source.nsf_sigma.is_finite() && source.nsf_voiced_threshold.is_finite()) {
            return bad("config.hift.nsf_*", format!("{source:?}"), "finite numbers");
        }
        Ok(())
    }
}
