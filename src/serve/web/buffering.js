// When the page's live player may play, so that it never stutters: a port of the one rule every
// player fed by a synthesis uses, `Buffering` in src/app/buffering.rs (its module docs say the
// rule and why). The two are kept the same by one table of cases, tests/data/buffering_cases.json,
// which the Rust unit tests and tests/clients/node/buffering.test.mjs both replay: a change to the
// rule is a change there, in the table and here together.
//
// Sans I/O, as the Rust: the caller feeds events with its own timestamps (milliseconds from any
// origin, the same for every call) and positions in samples at the request's rate, and applies
// the gate it gets back. A gate is "open" (play whatever arrives) or a number (play up to that
// many samples from the start, then wait there). Every method returns a decision
// ({ gate, reason, rate, received, waiting }) when the gate moves or playback starts waiting,
// else null. A plain script: a global in the page, `module.exports` under Node.
"use strict";

class CosyBuffering {
  /** A request of `sampleRate` audio sent at `sentAtMs`. Playback holds until audio arrives. */
  constructor(sampleRate, sentAtMs) {
    this.sampleRate = Math.max(sampleRate, 1);
    this.sentAtMs = sentAtMs;
    this.received = 0;
    this.lastSentenceEnd = 0; // where the last finished sentence ends (samples from the start)
    this.total = null; // the request's whole length, when the caller knows it
    this.isDone = false;
    this.gate = 0;
    this.reason = "no_audio";
    this.waiting = false;
  }

  /** The arrival rate at `atMs`, × real time. */
  rate(atMs) {
    const elapsed = Math.max(atMs - this.sentAtMs, 0) / 1000;
    if (elapsed <= 0) return this.received > 0 ? Infinity : 0;
    return this.received / this.sampleRate / elapsed;
  }

  /** The whole length of the request is known to be `samples`. */
  totalKnown(atMs, samples, played) {
    this.total = samples;
    return this.decide(this.gate, atMs, played);
  }

  /** `samples` more arrived at `atMs`; the player has played `played` samples so far. */
  audio(atMs, samples, played) {
    this.received += samples;
    return this.decide(this.gate, atMs, played);
  }

  /** A sentence ended at position `end` (audio up to there may still be on its way). */
  sentenceEnd(atMs, end, played) {
    this.lastSentenceEnd = Math.max(this.lastSentenceEnd, end);
    return this.decide(this.gate, atMs, played);
  }

  /** The player ran dry at `played` while the gate was open: hold there, resume as the rule says. */
  underrun(atMs, played) {
    const from = this.gate === "open" && !this.isDone ? Math.min(played, this.received) : this.gate;
    return this.decide(from, atMs, played);
  }

  /** The request ended: everything that arrived plays. */
  done(atMs, played) {
    this.isDone = true;
    return this.decide(this.gate, atMs, played);
  }

  decide(from, atMs, played) {
    const rate = this.rate(atMs);
    let gate;
    let reason;
    if (this.isDone) [gate, reason] = ["open", "done"];
    else if (from === "open") [gate, reason] = ["open", this.reason]; // only an underrun closes it again
    else [gate, reason] = this.holdOrRelease(from, rate, played);
    const waiting = gate !== "open" && this.received > gate;
    const changed = gate !== this.gate || (waiting && !this.waiting);
    this.gate = gate;
    this.reason = reason;
    this.waiting = waiting;
    return changed ? { gate, reason, rate, received: this.received, waiting } : null;
  }

  holdOrRelease(mark, rate, played) {
    if (this.received === 0) return [mark, "no_audio"];
    if (rate >= 1) return ["open", "keeps_up"];
    if (this.total !== null) {
      const buffered = Math.max(this.received - played, 0);
      const rest = Math.max(this.total - this.received, 0);
      if (rate > 0 && buffered >= rest * (1 / rate - 1)) return ["open", "covered"];
    }
    // Only audio that has arrived can be released.
    const sentence = Math.min(this.lastSentenceEnd, this.received);
    return sentence > mark ? [sentence, "sentence_buffered"] : [mark, "slow"];
  }
}

if (typeof module !== "undefined" && module.exports) module.exports = { CosyBuffering };
