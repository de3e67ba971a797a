//! The static LLM key/value cache (`engine.llm_kv = "static"`, graph `llm_step`,
//! docs/model-format.md): every sentence (a *row*) of the scheduler in [`super::llm_batch`] keeps
//! its keys and values in a slot of buffers allocated once on the session's device, and each call
//! writes its new columns into them in place.
//!
//! Per layer the buffers are `[num_slots, max_positions, kv_heads, head_dim]` (`cache.{i}.key` /
//! `.value`); each `cache_out.*` output is bound to the very value of its `cache.*` input, so ONNX
//! Runtime's ScatterND writes the new columns where they are instead of copying the buffer (checked
//! with onnxruntime in `onnx/tests/test_llm.py::test_llm_step_matches_llm`, which compares the
//! output addresses with the input ones). Compared with the growing cache of the `llm` graph:
//! * nothing is reallocated or copied per step, and a row joining or leaving copies nobody's cache
//!   (it takes or frees a slot);
//! * a decode call's shapes depend only on its batch-size bucket ([`bucket`]; padding rows point at
//!   a scratch slot that no real row uses) and `max_positions`, so a GPU sees a few fixed shapes;
//! * but every call attends over all `max_positions` columns of each row's slot (masked), which
//!   is why `engine.llm_kv = "auto"` keeps the growing cache on the CPU.
//!
//! Slot `num_slots - 1` is the scratch slot. The graph never reads a column a row has not written
//! (masked keys, zeroed values), so the buffers need no initialisation; they are zeroed anyway
//! where it is free (on the CPU).

use ort::memory::{AllocationDevice, Allocator, MemoryInfo};
use ort::value::Tensor;

use crate::error::{Error, Result};
use crate::pipeline::constants::LlmShape;
use crate::pipeline::stages::tensor;
use crate::runtime::{StageBinding, StageSession};
use crate::vocab::ProviderKind;

/// Batch sizes a decode call is padded to, so a GPU sees a few fixed shapes (beyond the last,
/// the row count itself).
pub const BUCKETS: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];

/// The rows a decode call of `rows` real rows runs with.
pub fn bucket(rows: usize) -> usize {
    BUCKETS.iter().copied().find(|&b| b >= rows).unwrap_or(rows)
}

/// The slot buffers and which slots are free.
pub(super) struct SlotCache {
    input_names: Vec<String>,
    output_names: Vec<String>,
    /// `[num_slots, max_positions, kv_heads, head_dim]` per input name, on the session's device.
    buffers: Vec<Tensor<f32>>,
    allocator: Allocator,
    on_host: bool,
    shape: LlmShape,
    num_slots: usize,
    max_positions: usize,
    /// Free real slots (the scratch slot is never handed out).
    free: Vec<usize>,
    grows: u64,
    /// Whether `buffers` are bound, as inputs and as outputs, in the binding [`SlotCache::run`] is
    /// given (the batch's one binding, which only this cache uses in static mode): bound once, and
    /// again only after growth (new buffers), so a step binds just its three small inputs (on a
    /// GPU: no per-step work for 2 × layers buffers, and fixed addresses, as CUDA graphs need).
    bound: bool,
}

impl SlotCache {
    /// Buffers for `max_batch` rows plus the scratch slot, `max_positions` columns each.
    pub fn new(session: &StageSession, shape: LlmShape, max_batch: usize, max_positions: usize) -> Result<SlotCache> {
        let allocator = Allocator::new(&session.session, session.device_memory()?)?;
        let mut input_names = Vec::with_capacity(2 * shape.layers);
        let mut output_names = Vec::with_capacity(2 * shape.layers);
        for i in 0..shape.layers {
            for kind in ["key", "value"] {
                input_names.push(format!("cache.{i}.{kind}"));
                output_names.push(format!("cache_out.{i}.{kind}"));
            }
        }
        let mut cache = SlotCache {
            input_names,
            output_names,
            buffers: Vec::new(),
            allocator,
            on_host: session.provider_used == ProviderKind::Cpu,
            shape,
            num_slots: max_batch + 1,
            max_positions: max_positions.max(1),
            free: (0..max_batch).rev().collect(),
            grows: 0,
            bound: false,
        };
        cache.buffers = (0..cache.input_names.len()).map(|_| cache.allocate(cache.max_positions, None)).collect::<Result<_>>()?;
        Ok(cache)
    }

    /// The slot every padding row reads and writes.
    pub fn scratch(&self) -> usize {
        self.num_slots - 1
    }

    /// Times [`SlotCache::ensure_positions`] grew the buffers.
    pub fn grows(&self) -> u64 {
        self.grows
    }

    /// A free slot for a new row.
    pub fn take(&mut self) -> Result<usize> {
        self.free.pop().ok_or_else(|| Error::Runtime("llm: no free cache slot (more rows than engine.max_batch)".into()))
    }

    /// Gives a row's slot back (its stale columns stay; the next row overwrites what it reads).
    pub fn give(&mut self, slot: usize) {
        if slot < self.scratch() && !self.free.contains(&slot) {
            self.free.push(slot);
        }
    }

    /// One buffer of `positions` columns: `data` (host values in that layout) or zeros.
    fn allocate(&self, positions: usize, data: Option<Vec<f32>>) -> Result<Tensor<f32>> {
        let (kv, hd) = (self.shape.kv_heads, self.shape.head_dim);
        let dims = [self.num_slots, positions, kv, hd];
        let mut buffer = Tensor::<f32>::new(&self.allocator, dims)?;
        match (data, self.on_host) {
            (data, true) => {
                let dst = buffer.try_extract_tensor_mut()?.1;
                match data {
                    Some(d) => dst.copy_from_slice(&d),
                    None => dst.fill(0.0),
                }
            }
            // On a device: uninitialised is safe (see the module comment); only growth copies in.
            (Some(d), false) => {
                let host = Tensor::from_array((dims.map(|d| d as i64).to_vec(), d.into_boxed_slice()))?;
                host.copy_into(&mut buffer)?;
            }
            (None, false) => {}
        }
        Ok(buffer)
    }

    /// Makes every slot hold at least `needed` columns, doubling `max_positions` as often as it
    /// takes and copying each slot's columns into the new buffers. Returns whether it grew.
    ///
    /// What growth costs on a GPU: the whole cache goes to the host and back (4 bytes × num_slots
    /// × max_positions × kv_heads × head_dim × 2 × layers; full size, 24 layers of 2 × 64, 17 slots
    /// × 2048 columns: 0.86 GB each way, a fraction of a second over PCIe), a new device
    /// allocation, and new shapes for every bucket (a new CUDA graph or TensorRT profile). Set `engine.llm_max_positions` high enough that it does not
    /// happen in steady state.
    pub fn ensure_positions(&mut self, needed: usize) -> Result<bool> {
        if needed <= self.max_positions {
            return Ok(false);
        }
        let mut positions = self.max_positions;
        while positions < needed {
            positions *= 2;
        }
        let block = self.shape.kv_heads * self.shape.head_dim;
        let old_cols = self.max_positions * block;
        let new_cols = positions * block;
        let mut grown = Vec::with_capacity(self.buffers.len());
        for old in &self.buffers {
            let old = if self.on_host { old.try_extract_tensor::<f32>()?.1.to_vec() } else { old.to(AllocationDevice::CPU, 0)?.try_extract_tensor::<f32>()?.1.to_vec() };
            let mut data = vec![0f32; self.num_slots * new_cols];
            for slot in 0..self.num_slots {
                data[slot * new_cols..slot * new_cols + old_cols].copy_from_slice(&old[slot * old_cols..(slot + 1) * old_cols]);
            }
            grown.push(self.allocate(positions, Some(data))?);
        }
        tracing::info!("llm: static KV cache grown from {} to {positions} positions per slot (engine.llm_max_positions)", self.max_positions);
        self.buffers = grown;
        self.bound = false;
        self.max_positions = positions;
        self.grows += 1;
        Ok(true)
    }

    /// One `llm_step` call: `rows` rows of `seq` new positions each (`embeds` row-major
    /// `[rows, seq, hidden]`), row r in slot `slots[r]` from column `starts[r]`; the buffers are
    /// bound as both inputs and outputs (written in place). Returns the logits `[rows, vocab]`.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &mut self,
        session: &mut StageSession,
        binding: &mut StageBinding,
        host: &MemoryInfo<'static>,
        embeds: Vec<f32>,
        rows: usize,
        seq: usize,
        slots: Vec<i64>,
        starts: Vec<i64>,
    ) -> Result<Vec<f32>> {
        if let Some(&last) = starts.iter().max() {
            if last as usize + seq > self.max_positions {
                return Err(Error::Runtime(format!("llm: positions {last}+{seq} beyond the static cache's {}", self.max_positions)));
            }
        }
        if !self.bound {
            binding.clear_inputs();
            for ((input, output), buffer) in self.input_names.iter().zip(&self.output_names).zip(self.buffers.iter_mut()) {
                binding.bind_input(input, buffer)?;
                binding.inner_mut().bind_output(output.as_str(), &mut *buffer)?;
            }
            self.bound = true;
        }
        // Bound again each step, each in place of the last (a binding holds one value a name).
        let x = tensor(&[rows, seq, self.shape.hidden], embeds)?;
        let slots = tensor(&[rows], slots)?;
        let starts = tensor(&[rows], starts)?;
        binding.bind_input("inputs_embeds", &x)?;
        binding.bind_input("slots", &slots)?;
        binding.bind_input("start", &starts)?;
        // The logits too: bound once, the last step's logits would be handed back as the next
        // step's output buffer, whose shape changes with the rows (ONNX Runtime refuses: "has
        // shape {1,V} but the computed output shape for this run is {4,V}"; tried).
        binding.inner_mut().bind_output_to_device("logits", host)?;
        let outputs = binding.run(session)?;
        let logits = outputs
            .get("logits")
            .ok_or_else(|| Error::Runtime("llm_step: the graph returned no logits".into()))?
            .try_extract_tensor::<f32>()?
            .1
            .to_vec();
        Ok(logits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_round_up_and_pass_beyond_the_last() {
        assert_eq!([1, 2, 3, 4, 5, 9, 33, 64].map(bucket), [1, 2, 4, 4, 8, 16, 64, 64]);
        assert_eq!(bucket(65), 65);
    }

    #[test]
    fn static_kv_on_a_model_without_llm_step_names_the_key_and_the_fix() {
        use crate::config::{Config, LlmKv};
        let mut engine = Config::default().engine;
        engine.llm_kv = LlmKv::Static;
        let err = engine.llm_kv_static(ProviderKind::Cuda, false).expect_err("no llm_step graph");
        let msg = err.to_string();
        assert!(msg.contains("engine.llm_kv") && msg.contains("re-export") && !msg.contains('\n'), "{msg}");
        assert!(engine.llm_kv_static(ProviderKind::Cpu, true).expect("static with the graph"));
        engine.llm_kv = LlmKv::Auto;
        assert!(!engine.llm_kv_static(ProviderKind::Cpu, true).expect("auto on the CPU"), "auto keeps the growing cache on the CPU");
        assert!(engine.llm_kv_static(ProviderKind::Cuda, true).expect("auto on CUDA"));
        assert!(!engine.llm_kv_static(ProviderKind::Cuda, false).expect("auto without the graph"), "an older export keeps today's path");
        engine.llm_kv = LlmKv::Growing;
        assert!(!engine.llm_kv_static(ProviderKind::TensorRt, true).expect("growing"));
    }
}
