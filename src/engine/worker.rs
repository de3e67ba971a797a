//! A thread that owns a stage session and serves messages from many requests (the LLM scheduler,
//! the DiT batcher): its channel, its counters, and a clean stop when the owner is dropped.

use std::sync::{Arc, Mutex};

use crossbeam_channel::{Receiver, Sender};

use crate::error::{Error, Result};

/// The serving thread, the sender that reaches it, and the counters it keeps.
pub(crate) struct Worker<M, S> {
    name: &'static str,
    tx: Option<Sender<M>>,
    thread: Option<std::thread::JoinHandle<()>>,
    stats: Arc<Mutex<S>>,
}

impl<M: Send + 'static, S: Default + Clone + Send + 'static> Worker<M, S> {
    /// Starts `serve(messages, counters)` on a thread called `name`. It ends when every sender
    /// (the worker's own and its clients') is gone.
    pub(crate) fn spawn(
        name: &'static str,
        serve: impl FnOnce(Receiver<M>, &Mutex<S>) + Send + 'static,
    ) -> Result<Worker<M, S>> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let stats = Arc::new(Mutex::new(S::default()));
        let thread_stats = stats.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || serve(rx, &thread_stats))
            .map_err(|e| Error::Runtime(format!("cannot start the {name} thread: {e}")))?;
        Ok(Worker { name, tx: Some(tx), thread: Some(thread), stats })
    }

    /// A sender for a new client.
    pub(crate) fn sender(&self) -> Result<Sender<M>> {
        self.tx.clone().ok_or_else(|| Error::Runtime(format!("the {} thread has stopped", self.name)))
    }

    /// A copy of the counters so far.
    pub(crate) fn stats(&self) -> S {
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl<M, S> Drop for Worker<M, S> {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
