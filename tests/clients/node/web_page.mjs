// Drives cosy's own web page (GET /) in Debian's headless Chromium through playwright-core (pinned
// in package.json; it drives the installed browser, it downloads none), as a person would with the
// keyboard and the mouse: node web_page.mjs ORIGIN API_KEY PROMPT_WAV PROMPT_TEXT OUT_DIR.
// Prints one JSON object: what the page showed and did at each step (its own state,
// window.cosyState), the console errors, any request outside ORIGIN and the server's in-flight count
// around Stop. tests/clients/python/test_web_page.py asserts on it. Every wait is bounded.
import fs from "node:fs";
import path from "node:path";
import { chromium } from "playwright-core";

const [origin, apiKey, promptWav, promptText, outDir] = process.argv.slice(2);
const WAIT = { timeout: 120_000 };
// Three long sentences (the text of tests/cli/say_playback.rs's buffering test).
const SENTENCES = "The old lighthouse keeper walked along the narrow path every single evening, carrying a lantern, a notebook and a small loaf of bread for the gulls that waited for him on the rocks, and he wrote down the colour of the sky and the strength of the wind. "
  + "The fishermen who came back late in the autumn storms said that his light was the last thing they saw before the harbour, a steady yellow eye above the black water that never blinked, never faltered and never once went out in forty years of service. "
  + "When he finally retired, the village gathered on the pier with music and lanterns of their own, and the children sang the old songs about the sea while the new electric lamp turned above them for the very first time.";
const result = { steps: {}, console_errors: [], outside_requests: [], failed_responses: [] };
let phase = "load";

async function metric(name) {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), 10_000);
  try {
    const text = await (await fetch(`${origin}/metrics`, { signal: controller.signal })).text();
    const line = text.split("\n").find((l) => l.startsWith(`${name} `));
    return line ? Number(line.split(" ")[1]) : null;
  } finally {
    clearTimeout(timer);
  }
}

async function until(check, what, ms = 60_000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--autoplay-policy=no-user-gesture-required",
    "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream"],
});
try {
  const context = await browser.newContext({ viewport: { width: 1200, height: 1000 } });
  const page = await context.newPage();
  page.setDefaultTimeout(WAIT.timeout);
  page.on("console", (m) => { if (m.type() === "error") result.console_errors.push({ phase, text: m.text() }); });
  page.on("pageerror", (e) => result.console_errors.push({ phase, text: `uncaught: ${e.message}` }));
  page.on("request", (r) => { if (!r.url().startsWith(`${origin}/`) && !r.url().startsWith("blob:")) result.outside_requests.push(r.url()); });
  page.on("websocket", (ws) => { if (!ws.url().startsWith(origin.replace("http", "ws") + "/")) result.outside_requests.push(ws.url()); });
  page.on("dialog", (d) => d.accept());
  const state = () => page.evaluate(() => JSON.parse(JSON.stringify(window.cosyState)));
  const playerState = () => page.evaluate(() => JSON.parse(JSON.stringify(window.cosyPlayer)));
  const waitState = (fn, arg) => page.waitForFunction(fn, arg, WAIT);

  page.on("response", (r) => { if (r.status() >= 400) result.failed_responses.push({ phase, url: r.url(), status: r.status() }); });
  // The key, as a person typed it once in this tab (kept in sessionStorage across loads).
  await context.addInitScript((key) => { if (sessionStorage.getItem("cosy.apiKey") === null) sessionStorage.setItem("cosy.apiKey", key); }, apiKey);
  const response = await page.goto(`${origin}/`);
  result.steps.load = { status: response.status(), csp: response.headers()["content-security-policy"] || null };
  // Early: an AudioContext runs in headless Chromium without a sound device.
  result.steps.audio_context = await page.evaluate(async () => {
    const c = new AudioContext();
    await c.resume();
    const t0 = c.currentTime;
    await new Promise((r) => setTimeout(r, 200));
    const out = { state: c.state, advanced: c.currentTime > t0 };
    await c.close();
    return out;
  });
  await waitState(() => window.cosyState.ready && window.cosyState.voices.length > 0);
  result.steps.voices = {
    options: await page.$$eval("#voice option", (os) => os.map((o) => o.textContent)),
    key_field: await page.inputValue("#api-key"),
  };
  // The sample rate and the limits, as the server tells them (GET /v1/audio/info) once it is ready.
  await waitState(() => window.cosyState.info !== null);
  result.steps.info = {
    state: (await state()).info,
    hint: await page.textContent("#prompt-limit"),
    speed: { min: await page.getAttribute("#speed", "min"), max: await page.getAttribute("#speed", "max") },
  };

  // Speak with the default voice, keyboard only: Ctrl+Enter in the text box.
  phase = "speak";
  await page.focus("#text");
  await page.keyboard.press("Control+Enter");
  await waitState(() => window.cosyState.requests === 1 && !window.cosyState.speaking);
  await waitState(() => window.cosyState.playedSamples >= window.cosyState.scheduledSamples && window.cosyState.scheduledSamples > 0);
  const spoken = await state();
  const download = await page.evaluate(() => {
    const link = document.getElementById("download");
    return { name: link.download, href: link.href.startsWith("blob:"), enabled: link.getAttribute("aria-disabled") === "false" };
  });
  result.steps.speak = {
    state: spoken, player: await playerState(), download, ttfa_text: await page.textContent("#ttfa"), rtf_text: await page.textContent("#rtf"),
    legend: await page.$$eval("#stage-legend li", (ls) => ls.map((l) => l.textContent)),
    error_hidden: await page.isHidden("#error"),
  };
  fs.mkdirSync(outDir, { recursive: true });
  await page.screenshot({ path: path.join(outDir, "web-desktop.png") });
  await page.setViewportSize({ width: 390, height: 844 });
  result.steps.phone = { scroll_width: await page.evaluate(() => document.documentElement.scrollWidth) };
  await page.screenshot({ path: path.join(outDir, "web-phone.png") });
  await page.setViewportSize({ width: 1200, height: 1000 });

  // Another format (mp3): kept whole, decoded by the browser, played; Download gives the mp3.
  await page.selectOption("#format", "mp3");
  await page.click("#speak");
  await waitState(() => window.cosyState.requests === 2 && !window.cosyState.speaking);
  await waitState(() => window.cosyState.playedSamples >= window.cosyState.scheduledSamples && window.cosyState.scheduledSamples > 0);
  result.steps.mp3 = { state: await state(), download_name: await page.getAttribute("#download", "download") };
  await page.selectOption("#format", "pcm");

  // Buffering as `cosy say` does: with the test hook that slows synthesis to a third of real time
  // (each sentence 30 tokens), whole sentences are buffered and nothing runs dry; with "No
  // buffering" the same request plays chunk by chunk and the player counts the underruns.
  phase = "buffering";
  await page.fill("#text", SENTENCES);
  await page.evaluate(() => { window.cosyTestHooks = { slow_to_rtf: 3, min_tokens: 30 }; });
  for (const [name, requests, off] of [["buffered", 3, false], ["unbuffered", 4, true]]) {
    await page.setChecked("#no-buffering", off);
    await page.click("#speak");
    await waitState((n) => window.cosyState.requests === n && !window.cosyState.speaking, requests);
    await waitState(() => window.cosyState.playedSamples >= window.cosyState.scheduledSamples && window.cosyState.scheduledSamples > 0);
    result.steps[name] = { state: await state(), player: await playerState(), notice_hidden_after: await page.isHidden("#buffering") };
  }
  await page.setChecked("#no-buffering", false);
  await page.evaluate(() => { window.cosyTestHooks = null; });
  await page.fill("#text", "Hello, this is cosy speaking.");

  // Clone from an uploaded wav: saved, listed, made default, then the default is given back.
  phase = "clone";
  await page.setInputFiles("#clone-file", promptWav);
  await page.waitForFunction(() => /\d s$/.test(document.getElementById("record-state").textContent), null, WAIT);
  await page.fill("#clone-text", promptText);
  await page.fill("#clone-name", "uploaded");
  await page.click("#clone-save");
  await waitState(() => window.cosyState.voices.some((v) => v.name === "uploaded") || window.cosyState.cloneError);
  result.steps.clone = {
    state: (await state()).voices, error: (await state()).cloneError,
    listed: await page.$$eval("#voice-list li", (ls) => ls.map((l) => l.dataset.voice || l.textContent)),
    selected: await page.inputValue("#voice"),
  };
  await page.click('#voice-list li[data-voice="uploaded"] button:has-text("Make default")');
  await waitState(() => window.cosyState.defaultVoice === "uploaded");
  await page.click('#voice-list li[data-voice="uploaded"] button:has-text("Delete")');
  await waitState(() => !window.cosyState.voices.some((v) => v.name === "uploaded"));
  await page.click('#voice-list li[data-voice="me"] button:has-text("Make default")');
  await waitState(() => window.cosyState.defaultVoice === "me");
  // Clone from the microphone (Chromium's fake device: a tone): recorded as webm/Opus, decoded
  // in the page and uploaded as WAV.
  await page.focus("#record");
  await page.keyboard.press("Enter");
  await page.waitForFunction(() => /recording… [3-9]/.test(document.getElementById("record-state").textContent), null, WAIT);
  await page.keyboard.press("Enter");
  await waitState(() => window.cosyState.recording && window.cosyState.recording.source === "microphone" || window.cosyState.cloneError);
  await page.fill("#clone-text", "A tone from the fake microphone.");
  await page.fill("#clone-name", "mic");
  await page.click("#clone-save");
  await waitState(() => window.cosyState.voices.some((v) => v.name === "mic") || window.cosyState.cloneError);
  result.steps.mic = { recording: (await state()).recording, error: (await state()).cloneError,
    listed: await page.$$eval("#voice-list li", (ls) => ls.map((l) => l.dataset.voice || l.textContent)) };
  await page.click('#voice-list li[data-voice="mic"] button:has-text("Delete")');
  await waitState(() => !window.cosyState.voices.some((v) => v.name === "mic"));
  result.steps.voices_after = { state: await state().then((s) => ({ voices: s.voices.map((v) => v.name), default: s.defaultVoice })) };

  // Stop: a request held after its first audio (test hook) until the page hangs up.
  phase = "stop";
  await page.selectOption("#voice", "");
  await page.evaluate(() => { window.cosyTestHooks = { hold_after_first_audio: true }; });
  await page.click("#speak");
  await waitState(() => window.cosyState.chunks > 0);
  const held = await until(async () => (await metric("cosy_requests_in_flight")) >= 1 && (await metric("cosy_requests_in_flight")), "a request in flight");
  await page.keyboard.press("Escape");
  await waitState(() => !window.cosyState.speaking);
  const after = await until(async () => ((await metric("cosy_requests_in_flight")) === 0 ? "zero" : null), "in-flight back to 0");
  result.steps.stop = { in_flight_held: held, in_flight_after: after, stopped: (await state()).stopped,
    cancelled_total: await metric("cosy_requests_cancelled_total"), error: (await state()).error };
  await page.evaluate(() => { window.cosyTestHooks = null; });

  // Live: text-in streaming over the WebSocket while typing; audio comes before the box is left.
  phase = "live";
  await page.focus("#live");
  await page.keyboard.press("Space");
  await page.fill("#text", "");
  await page.focus("#text");
  const words = "Hello there, this is a test of the live mode, typed word by word while it speaks. ";
  await page.keyboard.type(words, { delay: 40 });
  let typed = 0;
  // Keep typing (bounded) until the first audio, as a person would go on writing.
  while ((await state()).live.firstAudioMs === null && typed < 6) {
    await page.keyboard.type("And it goes on speaking as more words arrive. ", { delay: 40 });
    typed += 1;
  }
  await waitState(() => window.cosyState.live.firstAudioMs !== null);
  const beforeBlur = { state: (await state()).live, focused: await page.evaluate(() => document.activeElement.id) };
  await page.keyboard.press("Tab");
  await waitState(() => window.cosyState.live.done && !window.cosyState.speaking);
  result.steps.live = { before_blur: beforeBlur, after: await state() };
  await page.focus("#live");
  await page.keyboard.press("Space");

  // Errors: the server's one-line message, shown as it is.
  phase = "errors";
  await page.fill("#text", "...");
  await page.click("#speak");
  await waitState(() => window.cosyState.error !== null && !window.cosyState.speaking);
  const direct = await fetch(`${origin}/v1/audio/speech`, {
    method: "POST", headers: { Authorization: `Bearer ${apiKey}`, "Content-Type": "application/json" },
    body: JSON.stringify({ model: "cosyvoice3", input: "...", response_format: "pcm", stream_format: "sse" }),
  });
  result.steps.errors = { shown: await page.textContent("#error"), server: (await direct.json()).error.message };
  await page.fill("#api-key", "not-the-key");
  await page.dispatchEvent("#api-key", "change");
  await page.fill("#text", "Hello, this is cosy speaking.");
  await page.click("#speak");
  await waitState(() => window.cosyState.error !== null && window.cosyState.error.includes("key") && !window.cosyState.speaking);
  result.steps.errors.bad_key = (await state()).error;
  result.steps.tab_order = await page.evaluate(() => [...document.querySelectorAll("input, select, textarea, button, a[href]")]
    .filter((e) => !e.disabled && e.tabIndex >= 0 && !e.hidden).map((e) => e.id || e.textContent));
  result.ok = true;
} catch (e) {
  result.failure = String(e && e.stack ? e.stack : e);
  result.phase = phase;
} finally {
  await browser.close();
}
console.log(JSON.stringify(result));
