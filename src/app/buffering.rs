//! When live playback may play, so that it never stutters: the one rule every player fed by a
//! synthesis uses (`cosy say` today; any player that may be fed slower than real time).
//!
//! The rule: the rate the audio arrives at is measured (samples per wall second over everything
//! that has arrived since the request was sent). Playback starts, or resumes after an underrun,
//! only when what is buffered covers the rest at that rate: with `B` seconds buffered, `R` seconds
//! still to come and the audio arriving at `r` × real time, the rest takes `R / r` to arrive while
//! `B + R` plays, so nothing runs dry when `B ≥ R · (1/r − 1)`. At or above real time (`r ≥ 1`) that
//! holds with nothing buffered: the first chunk plays at once, as without the rule. Below real time
//! with the rest of unknown length (a sentence still being made), a whole sentence is buffered
//! first: playback is released up to the end of the last finished sentence and holds there, a
//! planned gap between sentences instead of a stutter inside one.
//!
//! Sans I/O: the caller feeds events with its own timestamps (a [`Duration`] from any origin, the
//! same for every call) and positions in samples at the request's rate, and applies the [`Gate`]
//! it gets back to its player. Every method returns a [`Decision`] when the gate moves or when
//! playback starts waiting, so the caller can log it and tell the listener once.
//!
//! The web page's player follows the same rule through a port, `src/serve/web/buffering.js`;
//! the table of cases `tests/data/buffering_cases.json` is replayed against both (here and in
//! `tests/clients/node/buffering.test.mjs`), so a change to the rule changes the three together.

use std::time::Duration;

/// How far playback may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Play whatever arrives; running dry is an underrun.
    Open,
    /// Play up to this many samples from the start, then wait there (a planned gap).
    HoldAt(u64),
}

/// Why the gate is where it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Nothing has arrived yet.
    NoAudio,
    /// The audio arrives at least as fast as it plays.
    KeepsUp,
    /// Below real time, but what is buffered covers the known rest.
    Covered,
    /// Below real time and the rest's length unknown: released up to the last finished sentence.
    SentenceBuffered,
    /// Below real time: waiting for the sentence under way to finish.
    Slow,
    /// The request ended: everything plays.
    Done,
}

impl Reason {
    /// One word for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NoAudio => "no_audio",
            Reason::KeepsUp => "keeps_up",
            Reason::Covered => "covered",
            Reason::SentenceBuffered => "sentence_buffered",
            Reason::Slow => "slow",
            Reason::Done => "done",
        }
    }
}

/// What the rule decided, returned when the gate moves or playback starts waiting.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    pub gate: Gate,
    pub reason: Reason,
    /// The measured arrival rate, × real time (0 before any audio).
    pub rate: f64,
    /// Samples arrived so far.
    pub received: u64,
    /// Whether audio is held back: arrived beyond the gate, not allowed to play yet.
    pub waiting: bool,
}

/// The buffering rule of one request's playback. See the module docs.
#[derive(Debug, Clone)]
pub struct Buffering {
    sample_rate: f64,
    sent_at: Duration,
    received: u64,
    /// The position where the last finished sentence ends (samples from the start).
    last_sentence_end: u64,
    /// The request's whole length, when the caller knows it.
    total: Option<u64>,
    done: bool,
    gate: Gate,
    reason: Reason,
    waiting: bool,
}

impl Buffering {
    /// A request of `sample_rate` audio sent at `sent_at`. Playback holds until audio arrives.
    pub fn new(sample_rate: u32, sent_at: Duration) -> Buffering {
        Buffering {
            sample_rate: f64::from(sample_rate.max(1)),
            sent_at,
            received: 0,
            last_sentence_end: 0,
            total: None,
            done: false,
            gate: Gate::HoldAt(0),
            reason: Reason::NoAudio,
            waiting: false,
        }
    }

    /// The gate now.
    pub fn gate(&self) -> Gate {
        self.gate
    }

    /// The arrival rate at `at`, × real time.
    pub fn rate(&self, at: Duration) -> f64 {
        let elapsed = at.saturating_sub(self.sent_at).as_secs_f64();
        if elapsed <= 0.0 {
            return if self.received > 0 { f64::INFINITY } else { 0.0 };
        }
        self.received as f64 / self.sample_rate / elapsed
    }

    /// The whole length of the request is known to be `samples` (lets playback start before a
    /// sentence ends when the buffer covers the rest).
    pub fn total_known(&mut self, at: Duration, samples: u64, played: u64) -> Option<Decision> {
        self.total = Some(samples);
        self.decide(at, played)
    }

    /// `samples` more arrived at `at`; the player has played `played` samples so far.
    pub fn audio(&mut self, at: Duration, samples: usize, played: u64) -> Option<Decision> {
        self.received += samples as u64;
        self.decide(at, played)
    }

    /// A sentence ended at position `end` (samples from the start; audio up to there may still be
    /// on its way to the caller: the gate never passes what has arrived).
    pub fn sentence_end(&mut self, at: Duration, end: u64, played: u64) -> Option<Decision> {
        self.last_sentence_end = self.last_sentence_end.max(end);
        self.decide(at, played)
    }

    /// The player ran dry at `played` while the gate was open: hold there, and resume only as
    /// the rule says.
    pub fn underrun(&mut self, at: Duration, played: u64) -> Option<Decision> {
        let from = match self.gate {
            Gate::Open if !self.done => Gate::HoldAt(played.min(self.received)),
            gate => gate,
        };
        self.decide_from(from, at, played)
    }

    /// The request ended: everything that arrived plays.
    pub fn done(&mut self, at: Duration, played: u64) -> Option<Decision> {
        self.done = true;
        self.decide(at, played)
    }

    fn decide(&mut self, at: Duration, played: u64) -> Option<Decision> {
        self.decide_from(self.gate, at, played)
    }

    /// The rule applied from gate `from`; a decision when the gate moves from where it was (an
    /// underrun that reopens at once changes nothing for the caller) or waiting starts.
    fn decide_from(&mut self, from: Gate, at: Duration, played: u64) -> Option<Decision> {
        let rate = self.rate(at);
        let (gate, reason) = match from {
            _ if self.done => (Gate::Open, Reason::Done),
            // Once playing, only an underrun closes the gate again.
            Gate::Open => (Gate::Open, self.reason),
            Gate::HoldAt(mark) => self.hold_or_release(mark, rate, played),
        };
        let waiting = matches!(gate, Gate::HoldAt(m) if self.received > m);
        let changed = gate != self.gate || (waiting && !self.waiting);
        self.gate = gate;
        self.reason = reason;
        self.waiting = waiting;
        changed.then_some(Decision { gate, reason, rate, received: self.received, waiting })
    }

    fn hold_or_release(&self, mark: u64, rate: f64, played: u64) -> (Gate, Reason) {
        if self.received == 0 {
            return (Gate::HoldAt(mark), Reason::NoAudio);
        }
        if rate >= 1.0 {
            return (Gate::Open, Reason::KeepsUp);
        }
        if let Some(total) = self.total {
            let buffered = self.received.saturating_sub(played) as f64;
            let rest = total.saturating_sub(self.received) as f64;
            if rate > 0.0 && buffered >= rest * (1.0 / rate - 1.0) {
                return (Gate::Open, Reason::Covered);
            }
        }
        // Only audio that has arrived can be released.
        let sentence = self.last_sentence_end.min(self.received);
        if sentence > mark {
            (Gate::HoldAt(sentence), Reason::SentenceBuffered)
        } else {
            (Gate::HoldAt(mark), Reason::Slow)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RATE: u32 = 1000;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn audio_at_or_above_real_time_plays_from_the_first_chunk() {
        let mut b = Buffering::new(RATE, ms(0));
        assert_eq!(b.gate(), Gate::HoldAt(0));
        // 500 samples (0.5 s) after 0.1 s: 5× real time.
        let d = b.audio(ms(100), 500, 0).expect("the gate opens");
        assert_eq!((d.gate, d.reason, d.waiting), (Gate::Open, Reason::KeepsUp, false));
        assert!((d.rate - 5.0).abs() < 1e-9);
        // Exactly real time is enough.
        let mut b = Buffering::new(RATE, ms(0));
        assert_eq!(b.audio(ms(500), 500, 0).unwrap().gate, Gate::Open);
        // A slower chunk later does not close the gate by itself: only an underrun does.
        assert_eq!(b.audio(ms(5000), 10, 400), None);
        assert_eq!(b.gate(), Gate::Open);
    }

    #[test]
    fn below_real_time_a_whole_sentence_is_buffered_and_released_at_its_end() {
        let mut b = Buffering::new(RATE, ms(0));
        // 1/3 × real time: wait, and say so once.
        let d = b.audio(ms(1500), 500, 0).expect("starts waiting");
        assert_eq!((d.gate, d.reason, d.waiting), (Gate::HoldAt(0), Reason::Slow, true));
        assert_eq!(b.audio(ms(3000), 500, 0), None, "still waiting: nothing new to report");
        // The first sentence ended at 1000: it plays, the next one waits at its start.
        let d = b.sentence_end(ms(3000), 1000, 0).expect("released");
        assert_eq!((d.gate, d.reason, d.waiting), (Gate::HoldAt(1000), Reason::SentenceBuffered, false));
        // The second sentence's audio arrives beyond the mark: waiting again.
        let d = b.audio(ms(4500), 500, 1000).expect("waits for sentence 2");
        assert_eq!((d.gate, d.reason, d.waiting), (Gate::HoldAt(1000), Reason::Slow, true));
        // The end of the request releases everything.
        let d = b.done(ms(4600), 1000).expect("done");
        assert_eq!((d.gate, d.reason), (Gate::Open, Reason::Done));
    }

    #[test]
    fn a_sentence_end_beyond_what_arrived_releases_only_what_arrived() {
        let mut b = Buffering::new(RATE, ms(0));
        b.audio(ms(3000), 600, 0);
        let d = b.sentence_end(ms(3000), 1000, 0).expect("partial release");
        assert_eq!(d.gate, Gate::HoldAt(600));
        let d = b.audio(ms(4200), 400, 600).expect("the rest of the sentence");
        assert_eq!(d.gate, Gate::HoldAt(1000));
    }

    #[test]
    fn a_known_rest_starts_as_soon_as_the_buffer_covers_it() {
        // 0.5 × real time, 2000 samples in all: the rest R needs B ≥ R · (1/0.5 − 1) = R.
        let mut b = Buffering::new(RATE, ms(0));
        let d = b.total_known(ms(0), 2000, 0);
        assert_eq!(d, None);
        let d = b.audio(ms(1600), 800, 0).expect("waiting");
        assert_eq!((d.gate, d.reason), (Gate::HoldAt(0), Reason::Slow));
        // 1000 arrived at 2 s: B = 1000 ≥ R = 1000.
        let d = b.audio(ms(2000), 200, 0).expect("covered");
        assert_eq!((d.gate, d.reason), (Gate::Open, Reason::Covered));
    }

    #[test]
    fn an_underrun_holds_until_the_rule_allows_again() {
        let mut b = Buffering::new(RATE, ms(0));
        assert_eq!(b.audio(ms(100), 500, 0).unwrap().gate, Gate::Open);
        // Synthesis slowed down: 600 samples in 2 s, and the player ran dry at 600.
        b.audio(ms(2000), 100, 600);
        let d = b.underrun(ms(2000), 600).expect("holds");
        assert_eq!(d.gate, Gate::HoldAt(600));
        let d = b.audio(ms(2500), 100, 600).expect("waiting");
        assert!(d.waiting);
        let d = b.sentence_end(ms(2500), 700, 600).expect("the sentence is whole");
        assert_eq!((d.gate, d.reason), (Gate::HoldAt(700), Reason::SentenceBuffered));
        // While fast, an underrun reopens at once (the rule: nothing needs buffering).
        let mut b = Buffering::new(RATE, ms(0));
        b.audio(ms(100), 500, 0);
        assert_eq!(b.underrun(ms(200), 500), None);
        assert_eq!(b.gate(), Gate::Open);
    }

    #[test]
    fn nothing_arrived_or_no_time_passed() {
        let mut b = Buffering::new(RATE, ms(10));
        assert_eq!(b.rate(ms(10)), 0.0);
        assert_eq!(b.done(ms(10), 0).unwrap().gate, Gate::Open);
        let mut b = Buffering::new(RATE, ms(10));
        assert_eq!(b.audio(ms(10), 5, 0).unwrap().gate, Gate::Open, "an instant chunk is fast");
        assert_eq!(Reason::SentenceBuffered.as_str(), "sentence_buffered");
    }

    /// The shared table of cases (module docs), replayed step by step.
    #[test]
    fn the_shared_table_of_cases() {
        let table: serde_json::Value = serde_json::from_str(include_str!("../../tests/data/buffering_cases.json")).expect("the table is JSON");
        let cases = table["cases"].as_array().expect("cases");
        assert!(cases.len() >= 10, "{} cases", cases.len());
        let n = |v: &serde_json::Value, key: &str| v[key].as_u64().unwrap_or_else(|| panic!("{key} in {v}"));
        let gate_of = |v: &serde_json::Value| match v.as_str() {
            Some("open") => Gate::Open,
            _ => Gate::HoldAt(v.as_u64().unwrap_or_else(|| panic!("a gate: {v}"))),
        };
        for case in cases {
            let name = case["name"].as_str().expect("name");
            let rate = u32::try_from(n(case, "sample_rate")).expect("a rate");
            let mut b = Buffering::new(rate, ms(n(case, "sent_at_ms")));
            for (i, step) in case["steps"].as_array().expect("steps").iter().enumerate() {
                let (at, played) = (ms(n(step, "at_ms")), n(step, "played"));
                let got = match step["event"].as_str().expect("event") {
                    "audio" => b.audio(at, usize::try_from(n(step, "samples")).expect("samples"), played),
                    "sentence_end" => b.sentence_end(at, n(step, "end"), played),
                    "underrun" => b.underrun(at, played),
                    "done" => b.done(at, played),
                    "total_known" => b.total_known(at, n(step, "samples"), played),
                    other => panic!("{name}: unknown event {other}"),
                };
                let expect = &step["expect"];
                match got {
                    None => assert!(expect.is_null(), "{name}, step {i}: no decision, expected {expect}"),
                    Some(d) => {
                        assert!(!expect.is_null(), "{name}, step {i}: decided {d:?}, expected none");
                        assert_eq!(d.gate, gate_of(&expect["gate"]), "{name}, step {i}: gate");
                        assert_eq!(Some(d.reason.as_str()), expect["reason"].as_str(), "{name}, step {i}: reason");
                        assert_eq!(Some(d.waiting), expect["waiting"].as_bool(), "{name}, step {i}: waiting");
                        if let Some(r) = expect["rate"].as_f64() {
                            assert!((d.rate - r).abs() < 1e-9, "{name}, step {i}: rate {} ≠ {r}", d.rate);
                        }
                        if let Some(received) = expect["received"].as_u64() {
                            assert_eq!(d.received, received, "{name}, step {i}: received");
                        }
                    }
                }
                if !step["gate_after"].is_null() {
                    assert_eq!(b.gate(), gate_of(&step["gate_after"]), "{name}, step {i}: gate after");
                }
            }
        }
    }
}
