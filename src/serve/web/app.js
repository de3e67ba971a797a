// cosy's web page: the public API only (/v1/audio/speech with server-sent events, the WebSocket
// /v1/audio/speech/stream, /v1/audio/voices), as any client calls it. No framework, no build step,
// nothing fetched from elsewhere. The sample rate and the limits are the server's, from
// /v1/audio/info: the page assumes none. `window.cosyState` is the page's own state, which tests read;
// `window.cosyPlayer` the live player's (its buffering decisions and underruns).
"use strict";

const KEY_STORAGE = "cosy.apiKey";
// The server's content types of the formats (an event stream carries them as base64 deltas).
const CONTENT_TYPES = { mp3: "audio/mpeg", opus: "audio/opus", wav: "audio/wav", flac: "audio/flac", pcm: "audio/pcm" };
const $ = (id) => document.getElementById(id);

const state = {
  ready: false,
  audioContext: "none",
  speaking: false,
  mode: null, // "http" | "live"
  requests: 0,
  ttfaMs: null,
  rtf: null,
  audioSeconds: 0,
  chunks: 0,
  scheduledSamples: 0,
  playedSamples: 0,
  timing: null,
  error: null,
  cloneError: null,
  voices: [],
  defaultVoice: null,
  live: { sessions: 0, open: false, sentChars: 0, firstAudioMs: null, segments: 0, done: false },
  stopped: 0,
  download: null, // { bytes, type } of what Download gives
  recording: null, // { source, seconds, bytes } of the recording to clone from (a WAV)
  info: null, // GET /v1/audio/info: { sample_rate, max_prompt_seconds, max_text_chars, speed: { min, max } }
};
window.cosyState = state;
// Test hooks (`cosy_test`), sent with each request when a test sets them (page.evaluate); the
// server refuses them unless it runs with debug.test_hooks = true.
window.cosyTestHooks = null;

// --- errors: the server's one-line messages, as they are -----------------------------------------

function showError(message, where = "error") {
  const el = $(where);
  state[where === "error" ? "error" : "cloneError"] = message || null;
  el.textContent = message || "";
  el.hidden = !message;
}

async function errorOf(response) {
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) message = body.error.message;
  } catch (_) { /* not JSON: the status line says it */ }
  return message;
}

// --- the API key (kept for this tab only) ---------------------------------------------------------

function apiKey() { return $("api-key").value.trim(); }
function authHeaders(extra = {}) {
  const key = apiKey();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

// --- the server's sample rate and limits (GET /v1/audio/info) ----------------------------------

/** The server's info, asked for once (it needs the model loaded, and the key when there is one). */
async function serverInfo() {
  if (state.info) return state.info;
  const response = await fetch("/v1/audio/info", { headers: authHeaders() });
  if (!response.ok) throw new Error(await errorOf(response));
  state.info = await response.json();
  showLimits();
  return state.info;
}

/** The rate of the server's pcm (s16le mono), known once speaking has begun. */
function sampleRate() { return state.info.sample_rate; }

function showLimits() {
  const info = state.info;
  $("prompt-limit").textContent = ` (at most ${info.max_prompt_seconds} s)`;
  $("speed").min = String(info.speed.min);
  $("speed").max = String(info.speed.max);
}

// --- playback: pcm chunks scheduled on one AudioContext as they arrive ----------------------------
//
// Speak's pcm follows `cosy say`'s buffering rule (CosyBuffering, web/buffering.js: a port of
// src/app/buffering.rs): playback starts, or resumes after running dry, only when what is buffered
// covers the rest at the measured arrival rate, else a whole sentence is buffered first (the
// event stream says where sentences end). "No buffering" plays each chunk as it comes, as the
// live mode does (there the text comes at the typist's pace: the arrival rate measures the typing,
// and a text-in streaming session tells no sentence ends to release up to).

// What the player did, for tests: per request, its buffering decisions and how often it ran dry
// while audio was still to come (an underrun: a stutter the listener hears).
const playerStats = window.cosyPlayer = {
  buffering: false, // the rule applies to this request
  decisions: [], // { gate, reason, rate, received, waiting, arrivals }: arrivals = pcm pieces so far
  sentenceEnds: [], // where sentences end, as the event stream told
  underruns: 0,
  underrunSeconds: 0,
  notice: false, // the buffering notice was shown
};

class Player {
  constructor() { this.ctx = null; this.reset(); }

  context() {
    if (!this.ctx) {
      this.ctx = new AudioContext();
      this.ctx.onstatechange = () => { state.audioContext = this.ctx.state; };
    }
    state.audioContext = this.ctx.state;
    return this.ctx;
  }

  reset() {
    this.sources = new Set();
    this.nextTime = 0;
    this.kept = []; // Float32Array pieces at the server's rate: the download
    this.odd = null; // a byte left over between pcm pieces
    this.encoded = null; // { bytes: [Uint8Array], type } for formats played once complete
    this.rule = null; // CosyBuffering of this request, when buffering
    this.held = []; // pcm pieces arrived but not yet let through the gate
    this.arrived = 0; // pcm samples arrived (the server's rate)
    this.released = 0; // pcm samples scheduled
    this.arrivals = 0;
    this.ended = false;
  }

  /** A new request: `buffering` applies the rule to its pcm, measured from now (as it is sent). */
  async begin(buffering = false) {
    this.stop();
    this.reset();
    Object.assign(playerStats, { buffering, decisions: [], sentenceEnds: [], underruns: 0, underrunSeconds: 0, notice: false });
    showBuffering(false);
    const ctx = this.context();
    if (ctx.state !== "running") await ctx.resume();
    state.audioContext = ctx.state;
    if (buffering) this.rule = new CosyBuffering(sampleRate(), performance.now());
  }

  /** pcm samples played so far (what is scheduled, less what is still ahead of the clock). */
  played() {
    if (!this.ctx) return 0;
    const ahead = Math.max(this.nextTime - this.ctx.currentTime, 0);
    return Math.max(this.released - Math.round(ahead * sampleRate()), 0);
  }

  /** A buffering decision: the gate moves (and what it lets through is scheduled). */
  apply(decision) {
    if (decision) {
      playerStats.decisions.push({ ...decision, arrivals: this.arrivals });
      if (decision.waiting && !playerStats.notice) {
        playerStats.notice = true;
        showBuffering(true);
      }
    }
    this.release();
  }

  /** Schedules the held pieces the gate lets through (split at a hold mark). */
  release() {
    const gate = this.rule ? this.rule.gate : "open";
    while (this.held.length) {
      const room = gate === "open" ? Infinity : gate - this.released;
      if (room <= 0) break;
      let piece = this.held[0];
      if (piece.length > room) {
        this.held[0] = piece.subarray(room);
        piece = piece.subarray(0, room);
      } else {
        this.held.shift();
      }
      this.released += piece.length;
      this.schedule(piece, sampleRate());
    }
  }

  /** Where a sentence's audio ends (samples from the start), as the event stream tells it. */
  sentenceEnd(end) {
    playerStats.sentenceEnds.push(end);
    if (this.rule) this.apply(this.rule.sentenceEnd(performance.now(), end, this.played()));
  }

  /** The request's audio is all here: whatever is held plays. */
  end() {
    if (this.ended) return;
    this.ended = true;
    if (this.rule) this.apply(this.rule.done(performance.now(), this.played()));
    else this.release();
    showBuffering(false);
  }

  /** s16le bytes (any split) → samples, scheduled right after what is queued. */
  pushPcm(bytes) {
    let data = bytes;
    if (this.odd !== null) {
      data = new Uint8Array(bytes.length + 1);
      data[0] = this.odd;
      data.set(bytes, 1);
      this.odd = null;
    }
    if (data.length % 2 === 1) {
      this.odd = data[data.length - 1];
      data = data.subarray(0, data.length - 1);
    }
    if (data.length === 0) return;
    const view = new DataView(data.buffer, data.byteOffset, data.length);
    const samples = new Float32Array(data.length / 2);
    for (let i = 0; i < samples.length; i++) samples[i] = view.getInt16(2 * i, true) / 32768;
    this.kept.push(samples);
    const now = performance.now();
    state.chunks += 1; // pieces of audio received (played now, or once the gate lets them through)
    this.arrivals += 1;
    this.arrived += samples.length;
    this.held.push(samples);
    // Ran dry while the gate was open, audio still to come: an underrun (a planned hold at a
    // sentence's end is not one). The rule then holds until it lets playback resume.
    const open = !this.rule || this.rule.gate === "open";
    if (open && this.released > 0 && this.ctx.currentTime > this.nextTime) {
      playerStats.underruns += 1;
      playerStats.underrunSeconds += this.ctx.currentTime - this.nextTime;
      if (this.rule) this.apply(this.rule.underrun(now, this.played()));
    }
    if (this.rule) this.apply(this.rule.audio(now, samples.length, this.played()));
    else this.release();
  }

  schedule(samples, rate) {
    const ctx = this.context();
    const buffer = ctx.createBuffer(1, samples.length, rate);
    buffer.copyToChannel(samples, 0);
    const source = ctx.createBufferSource();
    source.buffer = buffer;
    source.connect(ctx.destination);
    // A little lead for the first piece; later pieces follow without a gap.
    const when = Math.max(this.nextTime, ctx.currentTime + 0.05);
    source.start(when);
    this.nextTime = when + buffer.duration;
    this.sources.add(source);
    // Counted at the server's rate (a decoded file plays at the AudioContext's).
    const counted = Math.round(buffer.duration * sampleRate());
    state.scheduledSamples += counted;
    source.onended = () => {
      if (!this.sources.delete(source)) return;
      state.playedSamples += counted;
    };
  }

  /** Encoded audio (mp3, opus, flac, wav) is kept whole, then decoded and played. */
  pushEncoded(bytes, type) {
    if (!this.encoded) this.encoded = { bytes: [], type };
    this.encoded.bytes.push(bytes);
  }

  async playEncoded() {
    if (!this.encoded) return 0;
    const blob = new Blob(this.encoded.bytes, { type: this.encoded.type });
    const audio = await this.context().decodeAudioData(await blob.arrayBuffer());
    state.chunks += 1;
    this.schedule(audio.getChannelData(0), audio.sampleRate);
    return audio.duration;
  }

  stop() {
    for (const s of this.sources) { try { s.stop(); } catch (_) { /* not started */ } }
    this.sources.clear();
    this.nextTime = 0;
    this.held = [];
    this.ended = true;
    showBuffering(false);
  }

  /** What was played, as a file: the encoded bytes as received, or pcm as a WAV. */
  download() {
    if (this.encoded) return new Blob(this.encoded.bytes, { type: this.encoded.type });
    if (this.kept.length === 0) return null;
    return wavBlob(this.kept, sampleRate());
  }
}

/** 16-bit mono WAV of Float32Array pieces. */
function wavBlob(pieces, rate) {
  const n = pieces.reduce((a, p) => a + p.length, 0);
  const out = new DataView(new ArrayBuffer(44 + 2 * n));
  const text = (at, s) => { for (let i = 0; i < s.length; i++) out.setUint8(at + i, s.charCodeAt(i)); };
  text(0, "RIFF"); out.setUint32(4, 36 + 2 * n, true); text(8, "WAVE");
  text(12, "fmt "); out.setUint32(16, 16, true); out.setUint16(20, 1, true); out.setUint16(22, 1, true);
  out.setUint32(24, rate, true); out.setUint32(28, 2 * rate, true); out.setUint16(32, 2, true); out.setUint16(34, 16, true);
  text(36, "data"); out.setUint32(40, 2 * n, true);
  let at = 44;
  for (const p of pieces) {
    for (let i = 0; i < p.length; i++, at += 2) out.setInt16(at, Math.max(-32768, Math.min(32767, Math.round(p[i] * 32767))), true);
  }
  return new Blob([out.buffer], { type: "audio/wav" });
}

const player = new Player();

/** The one-line notice while playback waits for synthesis slower than real time. */
function showBuffering(on) {
  const el = document.getElementById("buffering");
  if (el) el.hidden = !on;
}

// --- the figures: first audio, real-time factor, where the time went -----------------------------

const STAGES = [["queue", "queue"], ["frontend", "frontend"], ["llm", "LLM"], ["flow", "flow"], ["hift", "HiFT"]];

function showFigures() {
  $("ttfa").textContent = state.ttfaMs === null ? "–" : `${Math.round(state.ttfaMs)} ms`;
  $("rtf").textContent = state.rtf === null ? "–" : state.rtf.toFixed(3);
  $("audio-len").textContent = state.audioSeconds ? `${state.audioSeconds.toFixed(2)} s` : "–";
  const bar = $("stage-bar");
  const legend = $("stage-legend");
  bar.replaceChildren();
  legend.replaceChildren();
  const t = state.timing;
  if (!t) { bar.setAttribute("aria-label", "where the time went: nothing yet"); return; }
  const total = STAGES.reduce((a, [k]) => a + (t[`${k}_s`] || 0), 0) || 1;
  const said = [];
  for (const [key, name] of STAGES) {
    const s = t[`${key}_s`] || 0;
    const part = document.createElement("span");
    part.className = `s-${key}`;
    part.style.width = `${(100 * s) / total}%`;
    part.title = `${name}: ${s.toFixed(3)} s`;
    bar.append(part);
    const item = document.createElement("li");
    item.className = `s-${key}`;
    item.textContent = `${name} ${s.toFixed(2)} s`;
    legend.append(item);
    said.push(`${name} ${s.toFixed(2)} s`);
  }
  bar.setAttribute("aria-label", `where the time went: ${said.join(", ")}`);
}

function setDownload() {
  const link = $("download");
  const blob = player.download();
  if (link.href) URL.revokeObjectURL(link.href);
  if (!blob) {
    state.download = null;
    link.removeAttribute("href");
    link.setAttribute("aria-disabled", "true");
    link.tabIndex = -1;
    return;
  }
  state.download = { bytes: blob.size, type: blob.type };
  link.href = URL.createObjectURL(blob);
  const ext = player.encoded ? $("format").value : "wav";
  link.download = `cosy.${ext}`;
  link.setAttribute("aria-disabled", "false");
  link.tabIndex = 0;
}

function setSpeaking(on, mode) {
  state.speaking = on;
  state.mode = on ? mode : state.mode;
  $("speak").disabled = on;
  $("stop").disabled = !on;
}

// --- Speak: POST /v1/audio/speech with server-sent events ----------------------------------------

let abort = null;

function requestBody(text, extra = {}) {
  const body = { model: "cosyvoice3", input: text, response_format: $("format").value, stream_format: "sse", ...extra };
  const voice = $("voice").value;
  if (voice && !("ref_audio" in extra)) body.voice = voice;
  const instruct = $("instruct").value.trim();
  if (instruct) body.instructions = instruct;
  const speed = parseFloat($("speed").value);
  if (Number.isFinite(speed) && speed !== 1) body.speed = speed;
  const seed = $("seed").value.trim();
  if (seed !== "") body.seed = Number(seed);
  if (window.cosyTestHooks) body.cosy_test = window.cosyTestHooks;
  return body;
}

async function speak(extra = {}) {
  if (state.speaking) return;
  showError(null);
  const text = $("text").value;
  try {
    await serverInfo();
  } catch (e) {
    showError(e.message || String(e));
    return;
  }
  const format = $("format").value;
  await player.begin(format === "pcm" && !$("no-buffering").checked);
  const body = requestBody(text, extra);
  state.requests += 1;
  Object.assign(state, { ttfaMs: null, rtf: null, audioSeconds: 0, timing: null, chunks: 0, scheduledSamples: 0, playedSamples: 0 });
  showFigures();
  setDownload();
  setSpeaking(true, "http");
  abort = new AbortController();
  const started = performance.now();
  try {
    const response = await fetch("/v1/audio/speech", {
      method: "POST", headers: authHeaders({ "Content-Type": "application/json" }), body: JSON.stringify(body), signal: abort.signal,
    });
    if (!response.ok) throw new Error(await errorOf(response));
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let pending = "";
    let done = null;
    for (;;) {
      const { value, done: end } = await reader.read();
      if (end) break;
      pending += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = pending.indexOf("\n\n")) >= 0) {
        const block = pending.slice(0, cut);
        pending = pending.slice(cut + 2);
        const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
        if (!data) continue;
        const event = JSON.parse(data);
        if (event.type === "speech.audio.delta") {
          const bytes = Uint8Array.from(atob(event.audio), (c) => c.charCodeAt(0));
          if (format === "pcm") {
            if (bytes.length) player.pushPcm(bytes);
            if (bytes.length && state.ttfaMs === null) { state.ttfaMs = performance.now() - started; showFigures(); }
            // cosy's extra field: where a sentence's audio ends (samples from the start).
            if (typeof event.sentence_end === "number") player.sentenceEnd(event.sentence_end);
          } else if (bytes.length) {
            player.pushEncoded(bytes, CONTENT_TYPES[format] || "application/octet-stream");
          }
        } else if (event.type === "speech.audio.done") {
          if (format === "pcm") player.end();
          done = event;
        } else if (event.type === "error") {
          throw new Error(event.error ? event.error.message : "the server ended the stream with an error");
        }
      }
    }
    if (!done) throw new Error("the stream ended before its last event (the server or the network broke it)");
    if (format !== "pcm") {
      await player.playEncoded();
      state.ttfaMs = performance.now() - started;
    }
    const wall = (performance.now() - started) / 1000;
    state.audioSeconds = done.audio_seconds || 0;
    state.rtf = state.audioSeconds > 0 ? wall / state.audioSeconds : null;
    state.timing = done.timing || null;
  } catch (e) {
    if (e.name === "AbortError") {
      state.stopped += 1;
    } else {
      showError(e.message || String(e));
    }
  } finally {
    // A stream that broke plays what came (a Stop has dropped it already).
    if (format === "pcm") player.end();
    abort = null;
    setSpeaking(false);
    showFigures();
    setDownload();
  }
}

function stop() {
  if (abort) abort.abort();
  if (live.socket || live.opening) live.stop();
  player.stop();
}

// --- Live: text-in streaming over the WebSocket while typing --------------------------------------

const live = {
  socket: null,
  opening: null,
  finishing: false,
  sent: "", // the text handed to the server (this session and the ones before)
  queue: [], // messages waiting for the socket to open
  started: 0,
  samples: 0,

  url() {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    return `${scheme}//${location.host}/v1/audio/speech/stream`;
  },

  generation: 0, // a Stop while a session opens ends it before it starts

  async open() {
    const generation = this.generation;
    showError(null);
    try {
      await serverInfo();
    } catch (e) {
      // Nothing was sent: the text typed so far is said by the next session.
      showError(e.message || String(e));
      this.queue = [];
      this.sent = "";
      return;
    }
    await player.begin();
    if (generation !== this.generation) return;
    Object.assign(state, { ttfaMs: null, rtf: null, audioSeconds: 0, timing: null, chunks: 0, scheduledSamples: 0, playedSamples: 0 });
    Object.assign(state.live, { sessions: state.live.sessions + 1, open: false, firstAudioMs: null, segments: 0, done: false });
    showFigures();
    setDownload();
    setSpeaking(true, "live");
    const key = apiKey();
    // A browser's WebSocket cannot send Authorization: the key goes as a subprotocol.
    const socket = new WebSocket(this.url(), key ? ["cosy", `cosy-key.${key}`] : ["cosy"]);
    socket.binaryType = "arraybuffer";
    this.socket = socket;
    this.samples = 0;
    this.started = performance.now();
    const config = { type: "session.config" };
    const voice = $("voice").value;
    if (voice) config.voice = voice;
    const instruct = $("instruct").value.trim();
    if (instruct) config.instructions = instruct;
    const seed = $("seed").value.trim();
    if (seed !== "") config.seed = Number(seed);
    if (window.cosyTestHooks) config.cosy_test = window.cosyTestHooks;
    socket.onopen = () => {
      state.live.open = true;
      socket.send(JSON.stringify(config));
      for (const m of this.queue) socket.send(m);
      this.queue = [];
    };
    socket.onmessage = (m) => this.message(m);
    socket.onerror = () => { if (this.socket === socket) showError("the WebSocket failed (is the server reachable, and the key right?)"); };
    socket.onclose = () => {
      if (this.socket !== socket) return;
      this.ended();
      // Words typed while the last session was finishing start the next one.
      if ($("live").checked && document.activeElement === $("text")) this.typed();
    };
  },

  ended() {
    this.socket = null;
    this.finishing = false;
    this.queue = [];
    state.live.open = false;
    setSpeaking(false);
    setDownload();
  },

  send(message) {
    const text = JSON.stringify(message);
    if (this.socket && this.socket.readyState === WebSocket.OPEN) this.socket.send(text);
    else this.queue.push(text);
  },

  /** Hands over the whole words typed since the last call (all of it when `end`), opening a
   *  session for the first. Synchronous up to the hand-over, so pieces keep their order. */
  typed(end = false) {
    if (this.finishing) return; // the session is saying its last words; the next one takes these
    const value = $("text").value;
    if (!value.startsWith(this.sent)) {
      if (this.socket || this.opening) {
        // Text already sent was changed: the server has it as it was. Say so.
        showError("live mode speaks text as it is typed: changes to text already sent are not spoken again");
        return;
      }
      this.sent = ""; // new text after a finished session: all of it is new
    }
    const fresh = value.slice(this.sent.length);
    // A word is complete once a space or a line break follows it.
    const cut = end ? fresh.length : Math.max(fresh.lastIndexOf(" "), fresh.lastIndexOf("\n")) + 1;
    if (cut <= 0 || !fresh.slice(0, cut).trim()) return;
    const piece = fresh.slice(0, cut);
    this.sent += piece;
    state.live.sentChars = this.sent.length;
    if (!this.socket && !this.opening) this.opening = this.open().finally(() => { this.opening = null; });
    this.send({ type: "input.text", text: piece });
  },

  /** The text box was left (or Ctrl+Enter): the rest of the text, then the end of it. */
  finish() {
    if (!this.socket && !this.opening) return;
    this.typed(true);
    if (this.finishing) return;
    this.finishing = true;
    this.send({ type: "input.done" });
  },

  stop() {
    const socket = this.socket;
    this.generation += 1;
    this.ended();
    this.sent = $("text").value; // what is there now is not spoken later
    if (socket) socket.close();
    state.stopped += 1;
  },

  message(m) {
    if (m.data instanceof ArrayBuffer) {
      player.pushPcm(new Uint8Array(m.data));
      this.samples += m.data.byteLength / 2;
      if (state.live.firstAudioMs === null) {
        state.live.firstAudioMs = performance.now() - this.started;
        state.ttfaMs = state.live.firstAudioMs;
      }
      state.audioSeconds = this.samples / sampleRate();
      showFigures();
      return;
    }
    const event = JSON.parse(m.data);
    if (event.type === "audio.done") {
      state.live.segments += 1;
      if (event.timing) state.timing = event.timing;
      showFigures();
    } else if (event.type === "session.done") {
      state.live.done = true;
      const wall = (performance.now() - this.started) / 1000;
      state.audioSeconds = event.audio_seconds || this.samples / sampleRate();
      state.rtf = state.audioSeconds > 0 ? wall / state.audioSeconds : null;
      showFigures();
    } else if (event.type === "error") {
      showError(event.error ? event.error.message : "the session failed");
    }
  },
};

// --- voices: list, save a clone, delete, make default ---------------------------------------------

async function loadVoices() {
  try {
    const response = await fetch("/v1/audio/voices", { headers: authHeaders() });
    if (!response.ok) throw new Error(await errorOf(response));
    const listing = await response.json();
    state.voices = listing.data || [];
    state.defaultVoice = listing.default || null;
    renderVoices();
  } catch (e) {
    $("voice-list").replaceChildren(Object.assign(document.createElement("li"), { className: "hint", textContent: e.message }));
  }
}

function renderVoices() {
  const select = $("voice");
  const chosen = select.value;
  const first = document.createElement("option");
  first.value = "";
  first.textContent = state.defaultVoice ? `the default (${state.defaultVoice})` : "the server's default";
  const options = [first];
  const items = [];
  for (const v of state.voices) {
    const option = document.createElement("option");
    option.value = v.name;
    option.textContent = v.name + (v.default ? " (default)" : "") + (v.usable === false ? " (unusable)" : "");
    option.disabled = v.usable === false;
    options.push(option);

    const li = document.createElement("li");
    li.dataset.voice = v.name;
    const name = Object.assign(document.createElement("span"), { className: "name", textContent: v.name });
    li.append(name);
    if (v.default) li.append(Object.assign(document.createElement("span"), { className: "badge", textContent: "default" }));
    if (typeof v.seconds === "number") li.append(Object.assign(document.createElement("span"), { className: "hint", textContent: `${v.seconds.toFixed(1)} s` }));
    if (v.error) li.append(Object.assign(document.createElement("span"), { className: "hint", textContent: v.error }));
    if (!v.default && v.usable !== false) {
      const make = Object.assign(document.createElement("button"), { type: "button", className: "secondary", textContent: "Make default" });
      make.setAttribute("aria-label", `make ${v.name} the default voice`);
      make.onclick = () => voiceAction("POST", `/v1/audio/voices/${encodeURIComponent(v.name)}/default`);
      li.append(make);
    }
    const del = Object.assign(document.createElement("button"), { type: "button", className: "secondary", textContent: "Delete" });
    del.setAttribute("aria-label", `delete the voice ${v.name}`);
    del.onclick = () => { if (confirm(`Delete the voice ${v.name}?`)) voiceAction("DELETE", `/v1/audio/voices/${encodeURIComponent(v.name)}`); };
    li.append(del);
    items.push(li);
  }
  select.replaceChildren(...options);
  if ([...select.options].some((o) => o.value === chosen)) select.value = chosen;
  const list = $("voice-list");
  if (items.length === 0) items.push(Object.assign(document.createElement("li"), { className: "hint", textContent: "no saved voices yet: clone one below" }));
  list.replaceChildren(...items);
}

async function voiceAction(method, path) {
  showError(null, "clone-error");
  try {
    const response = await fetch(path, { method, headers: authHeaders() });
    if (!response.ok) throw new Error(await errorOf(response));
    const body = await response.json();
    if (body.overridden_by) showError(`saved as the folder's default, but the server's config (voices.default) still names ${body.overridden_by}`, "clone-error");
  } catch (e) {
    showError(e.message, "clone-error");
  }
  await loadVoices();
}

// The recording to clone from, as a WAV blob (the server does not decode webm/Opus).
let recording = null;

/** Any audio the browser can decode (a file, the microphone's webm/Opus) → 16-bit mono WAV. */
async function toWav(blob) {
  const audio = await player.context().decodeAudioData(await blob.arrayBuffer());
  const mono = new Float32Array(audio.length);
  for (let c = 0; c < audio.numberOfChannels; c++) {
    const data = audio.getChannelData(c);
    for (let i = 0; i < data.length; i++) mono[i] += data[i] / audio.numberOfChannels;
  }
  return { wav: wavBlob([mono], audio.sampleRate), seconds: audio.duration };
}

async function useFile() {
  showError(null, "clone-error");
  const file = $("clone-file").files[0];
  recording = null;
  state.recording = null;
  if (!file) return;
  try {
    const { wav, seconds } = await toWav(file);
    recording = wav;
    state.recording = { source: "file", seconds, bytes: wav.size };
    $("record-state").textContent = `${file.name}: ${seconds.toFixed(1)} s`;
  } catch (e) {
    showError(`${file.name}: the browser cannot decode it as audio (${e.message || e}); try a WAV file`, "clone-error");
  }
}

let recorder = null;

async function toggleRecord() {
  showError(null, "clone-error");
  if (recorder) { recorder.stop(); return; }
  let limitSeconds;
  try {
    limitSeconds = (await serverInfo()).max_prompt_seconds;
  } catch (e) {
    showError(e.message || String(e), "clone-error");
    return;
  }
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({ audio: true });
  } catch (e) {
    showError(`the microphone is not available (${e.message || e.name})`, "clone-error");
    return;
  }
  const parts = [];
  recorder = new MediaRecorder(stream);
  const started = performance.now();
  // The recording stops at the longest prompt the model takes.
  const limit = setTimeout(() => recorder && recorder.stop(), limitSeconds * 1000);
  const tick = setInterval(() => { $("record-state").textContent = `recording… ${((performance.now() - started) / 1000).toFixed(0)} s`; }, 250);
  recorder.ondataavailable = (e) => { if (e.data.size) parts.push(e.data); };
  recorder.onstop = async () => {
    clearTimeout(limit);
    clearInterval(tick);
    for (const t of stream.getTracks()) t.stop();
    const type = recorder.mimeType;
    recorder = null;
    $("record").textContent = "Record from the microphone";
    try {
      const { wav, seconds } = await toWav(new Blob(parts, { type }));
      recording = wav;
      state.recording = { source: "microphone", type, seconds, bytes: wav.size };
      $("clone-file").value = "";
      $("record-state").textContent = `microphone: ${seconds.toFixed(1)} s`;
    } catch (e) {
      showError(`the recording could not be decoded (${e.message || e})`, "clone-error");
    }
  };
  recorder.start();
  $("record").textContent = "Stop recording";
}

async function saveClone() {
  showError(null, "clone-error");
  if (!recording) { showError("choose a recording file or record from the microphone first", "clone-error"); return; }
  const form = new FormData();
  form.append("name", $("clone-name").value.trim());
  form.append("ref_text", $("clone-text").value);
  form.append("default", $("clone-default").checked ? "true" : "false");
  form.append("audio_sample", recording, "recording.wav");
  try {
    const response = await fetch("/v1/audio/voices", { method: "POST", headers: authHeaders(), body: form });
    if (!response.ok) throw new Error(await errorOf(response));
    const saved = await response.json();
    await loadVoices();
    $("voice").value = saved.name;
    $("record-state").textContent = `saved as ${saved.name}`;
  } catch (e) {
    showError(e.message, "clone-error");
  }
}

async function tryClone() {
  showError(null, "clone-error");
  if (!recording) { showError("choose a recording file or record from the microphone first", "clone-error"); return; }
  const url = await new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(recording);
  });
  const extra = { ref_audio: url };
  const text = $("clone-text").value.trim();
  if (text) extra.ref_text = text;
  await speak(extra);
}

// --- wiring -----------------------------------------------------------------------------------

async function checkServer() {
  try {
    const response = await fetch("/ready");
    state.ready = response.ok;
    $("server-state").textContent = response.ok ? "ready" : await errorOf(response);
    if (!response.ok) setTimeout(checkServer, 2000);
    // Shown before the first request (a wrong key is said by the voices' list already).
    else serverInfo().catch(() => {});
  } catch (e) {
    $("server-state").textContent = "the server does not answer";
    setTimeout(checkServer, 5000);
  }
}

function init() {
  const key = $("api-key");
  key.value = sessionStorage.getItem(KEY_STORAGE) || "";
  key.addEventListener("change", () => {
    sessionStorage.setItem(KEY_STORAGE, key.value.trim());
    loadVoices();
  });
  $("speak").addEventListener("click", () => speak());
  $("stop").addEventListener("click", stop);
  const text = $("text");
  text.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); if ($("live").checked) live.finish(); else speak(); }
  });
  document.addEventListener("keydown", (e) => { if (e.key === "Escape" && state.speaking) stop(); });
  text.addEventListener("input", () => { if ($("live").checked) live.typed(); });
  text.addEventListener("blur", () => { if ($("live").checked) live.finish(); });
  $("live").addEventListener("change", (e) => {
    $("speak").hidden = e.target.checked;
    if (!e.target.checked && live.socket) live.finish();
  });
  $("clone-file").addEventListener("change", useFile);
  $("record").addEventListener("click", toggleRecord);
  $("clone-save").addEventListener("click", saveClone);
  $("clone-try").addEventListener("click", tryClone);
  if (!("MediaRecorder" in window) || !navigator.mediaDevices) $("record").disabled = true;
  showFigures();
  checkServer();
  loadVoices();
}

init();
