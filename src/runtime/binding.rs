//! IoBinding over a stage session, so values that live across calls (the LLM's KV cache) stay
//! on the device the session runs on instead of being copied to the host and back every step.
//!
//! ```no_run
//! # fn demo(llm: &mut cosy::runtime::StageSession, embeds: ort::value::Tensor<f32>) -> cosy::Result<()> {
//! let mut binding = llm.binding()?;
//! binding.bind_input("inputs_embeds", &embeds)?;
//! binding.bind_all_outputs_on_device(llm)?;       // present.* stay on the GPU
//! let mut outputs = binding.run(llm)?;
//! let present0 = outputs.remove("present.0.key");   // feed back next step:
//! # let _ = present0; Ok(()) }
//! ```
//! Next step: `binding.bind_input("past_key_values.0.key", &present0)` (a device value is bound
//! without a copy), then `run` again.

use ort::memory::{AllocationDevice, AllocatorType, MemoryInfo, MemoryType};
use ort::session::{IoBinding, SessionOutputs};
use ort::value::{Value, ValueTypeMarker};

use crate::vocab::ProviderKind;
use crate::error::Result;
use crate::runtime::factory::StageSession;

/// An IoBinding tied to one stage session.
#[derive(Debug)]
pub struct StageBinding {
    binding: IoBinding,
    device_memory: MemoryInfo<'static>,
}

impl StageSession {
    /// Where this session's outputs live when they should stay on the device: CUDA memory of the
    /// configured GPU for CUDA/TensorRT, host memory for CPU.
    pub fn device_memory(&self) -> Result<MemoryInfo<'static>> {
        Ok(match self.provider_used {
            ProviderKind::Cuda | ProviderKind::TensorRt => {
                MemoryInfo::new(AllocationDevice::CUDA, self.device_id as i32, AllocatorType::Device, MemoryType::Default)?
            }
            // The plugin's own device memory is not what ONNX Runtime's CUDA allocator names;
            // host memory is always accepted (ONNX Runtime copies), so TensorRT for RTX's
            // outputs come back to the host.
            ProviderKind::Cpu | ProviderKind::TensorRtRtx => {
                MemoryInfo::new(AllocationDevice::CPU, 0, AllocatorType::Device, MemoryType::Default)?
            }
        })
    }

    /// A new binding for this session.
    pub fn binding(&self) -> Result<StageBinding> {
        Ok(StageBinding { binding: self.session.create_binding()?, device_memory: self.device_memory()? })
    }

    /// Input names in graph order.
    pub fn input_names(&self) -> Vec<String> {
        self.session.inputs().iter().map(|o| o.name().to_string()).collect()
    }

    /// Output names in graph order.
    pub fn output_names(&self) -> Vec<String> {
        self.session.outputs().iter().map(|o| o.name().to_string()).collect()
    }
}

impl StageBinding {
    /// Binds an input; a host value is copied to the device once, a device value is used as is.
    pub fn bind_input<T: ValueTypeMarker + ?Sized>(&mut self, name: &str, value: &Value<T>) -> Result<()> {
        Ok(self.binding.bind_input(name, value)?)
    }

    /// Lets ONNX Runtime allocate this output on the session's device.
    pub fn bind_output_on_device(&mut self, name: &str) -> Result<()> {
        Ok(self.binding.bind_output_to_device(name, &self.device_memory)?)
    }

    /// Binds every output of the session to its device.
    pub fn bind_all_outputs_on_device(&mut self, session: &StageSession) -> Result<()> {
        for name in session.output_names() {
            self.bind_output_on_device(&name)?;
        }
        Ok(())
    }

    /// Drops all bound inputs (outputs stay bound).
    pub fn clear_inputs(&mut self) {
        self.binding.clear_inputs();
    }

    /// Runs the session with the bound values.
    pub fn run<'s>(&'s self, session: &'s mut StageSession) -> Result<SessionOutputs<'s>> {
        Ok(session.session.run_binding(&self.binding)?)
    }

    /// The underlying ort binding, for anything not wrapped here.
    pub fn inner_mut(&mut self) -> &mut IoBinding {
        &mut self.binding
    }
}
