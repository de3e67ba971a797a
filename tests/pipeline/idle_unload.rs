//! `engine.idle_unload_s` (issue 34): after that long without requests the engine drops the model,
//! and the next request loads it again, waits for the load, says it paid one (`stages.load`) and
//! speaks the same samples. A request that arrives while the model is being dropped waits and
//! succeeds. The unload is held open by the engine's test hook (`EngineBuilder::unload_hook`), so
//! what "during the unload" means does not depend on timing, and the held unload is the engine's
//! first, before any request (a request made first could find the model already dropped on a
//! busy machine); every wait has a hang guard only.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{config_for, fixture_model, fixture_prompt};
use cosy::engine::{Engine, ModelState};
use cosy::request::{Request, Voice};

/// Hang guard of every wait below (the test never relies on it for ordering).
const GUARD: Duration = Duration::from_secs(120);

fn wait_until(what: &str, f: impl Fn() -> bool) {
    let started = Instant::now();
    while !f() {
        assert!(started.elapsed() < GUARD, "{what}: not within {GUARD:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn idle_unload_drops_the_model_and_a_request_during_the_unload_waits_and_succeeds() {
    let cache = tempfile::tempdir().expect("temp dir");
    let voice = Voice::CrossLingual { wav: fixture_prompt() };
    let mut request = Request::new("The model comes back when it is needed.", voice);
    request.seed = Some(7);
    request.stream = true;
    request.ignore_stop_until = Some(40);
    // The samples of a model never unloaded (an engine of its own, without the idle unload).
    let mut config = config_for(&fixture_model(), cache.path());
    let (first, summary) = {
        let engine = Engine::builder(&config).build().expect("engine loads the fixture");
        engine.submit(request.clone()).expect("submit").wait().expect("first request")
    };
    assert!(!first.is_empty());
    assert_eq!(summary.stages.load, 0.0, "the model was in memory");

    // The first unload (the engine idle since its load: no request is made before it, so no
    // request can race it) waits in the hook until the test has sent its request; later ones go on.
    config.engine.idle_unload_s = 1;
    let (unloading_tx, unloading_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let gate = Mutex::new(Some((unloading_tx, go_rx)));
    let hook: cosy::engine::UnloadHook = Arc::new(move || {
        if let Some((unloading, go)) = gate.lock().unwrap().take() {
            let _ = unloading.send(());
            let _ = go.recv_timeout(GUARD);
        }
    });
    let engine = Engine::builder(&config).unload_hook(hook).build().expect("engine loads the fixture");

    // Idle for engine.idle_unload_s: the unload starts and waits in the hook.
    unloading_rx.recv_timeout(GUARD).expect("the model is unloaded after the idle time");
    assert_eq!(engine.model_state(), ModelState::Unloading);
    let handle = engine.submit(request.clone()).expect("a request during the unload is taken");
    wait_until("the request waits for the model", || engine.waiting_for_model() == 1);
    assert_eq!(engine.model_state(), ModelState::Unloading, "nothing loads while the unload is under way");
    go_tx.send(()).expect("release the unload");

    let (second, summary) = handle.wait().expect("the request sent during the unload succeeds");
    assert!(summary.stages.load > 0.0, "it paid a load: {:?}", summary.stages);
    assert_eq!(engine.reloads(), 1);
    assert_eq!(second, first, "the same samples after the model was loaded again");

    // And again, without the hook holding anything: unloaded after the idle time, loaded on demand.
    wait_until("unloaded again", || engine.model_state() == ModelState::Unloaded);
    assert!(engine.load_times().is_empty(), "no sessions while unloaded");
    let (third, summary) = engine.submit(request).expect("submit").wait().expect("third request");
    assert!(summary.stages.load > 0.0);
    assert_eq!(engine.reloads(), 2);
    assert_eq!(third, first);
}
