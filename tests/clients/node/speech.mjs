// Drives `cosy serve` with the official openai Node SDK as an application would, with the SDK's
// defaults: node speech.mjs BASE_URL API_KEY PLAN.json. The plan is a list of
// {"name", "params": {...audio.speech.create params...}, "out": PATH}; each request's body goes to
// `out` as it streams in, and one JSON line per request is printed:
// {"name", "ok", "status", "content_type", "voice", "chunks", "bytes", "error"}.
import fs from "node:fs";
import OpenAI from "openai";

const [baseURL, apiKey, planPath] = process.argv.slice(2);
const plan = JSON.parse(fs.readFileSync(planPath, "utf8"));
// No retries: an error must surface as it is. The SDK's own timeout bounds every read.
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120_000 });

for (const { name, params, out } of plan) {
  const line = { name, ok: false };
  try {
    const response = await client.audio.speech.create(params);
    line.status = response.status;
    line.content_type = response.headers.get("content-type");
    line.voice = response.headers.get("x-cosy-voice");
    const sink = fs.openSync(out, "w");
    let chunks = 0;
    let bytes = 0;
    for await (const chunk of response.body) {
      chunks += 1;
      bytes += chunk.length;
      fs.writeSync(sink, chunk);
    }
    fs.closeSync(sink);
    Object.assign(line, { ok: true, chunks, bytes });
  } catch (e) {
    line.status = e?.status ?? null;
    line.error = String(e?.message ?? e);
  }
  console.log(JSON.stringify(line));
}
