//! Sessions, execution providers, the TensorRT engine cache and the optimised-graph cache.
//!
//! Start with [`env::init`] (or let [`SessionFactory::new`] do it), then
//! [`SessionFactory::open`] per stage; run the session directly (`stage.session.run(...)`) or
//! through an IoBinding ([`StageSession::binding`]) when values should stay on the device.

pub mod binding;
pub mod cache_listing;
pub mod engine_cache;
pub mod env;
pub mod factory;
pub mod graph_cache;
pub mod keyed_dir;
pub mod providers;
pub mod trt_rtx;
pub mod shapes;

pub use binding::StageBinding;
pub use engine_cache::{CacheKey, EngineCache};
pub use env::{init, OrtRuntime};
pub use factory::{GraphCacheUse, SessionFactory, StagePlan, StageSession};
pub use graph_cache::{GraphCache, GraphKey};
pub use keyed_dir::EntryState;
