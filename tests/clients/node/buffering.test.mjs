// The web page's port of the buffering rule (src/serve/web/buffering.js) replays the shared table
// of cases (tests/data/buffering_cases.json) that the Rust rule (src/app/buffering.rs) replays in
// its unit tests: the two cannot drift. Explicit timestamps, no clock. Run with node's test
// runner: node --test tests/clients/node/buffering.test.mjs (tests/clients/python/test_web_buffering.py).
import { test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const { CosyBuffering } = require("../../../src/serve/web/buffering.js");
const table = JSON.parse(fs.readFileSync(new URL("../../data/buffering_cases.json", import.meta.url), "utf8"));

test("the table has its cases", () => {
  assert.ok(table.cases.length >= 10, `${table.cases.length} cases`);
});

for (const c of table.cases) {
  test(c.name, () => {
    const b = new CosyBuffering(c.sample_rate, c.sent_at_ms);
    c.steps.forEach((step, i) => {
      const where = `${c.name}, step ${i}`;
      const at = step.at_ms;
      let got;
      switch (step.event) {
        case "audio": got = b.audio(at, step.samples, step.played); break;
        case "sentence_end": got = b.sentenceEnd(at, step.end, step.played); break;
        case "underrun": got = b.underrun(at, step.played); break;
        case "done": got = b.done(at, step.played); break;
        case "total_known": got = b.totalKnown(at, step.samples, step.played); break;
        default: assert.fail(`${where}: unknown event ${step.event}`);
      }
      const expect = step.expect;
      if (expect === null) {
        assert.equal(got, null, `${where}: decided ${JSON.stringify(got)}, expected none`);
      } else {
        assert.notEqual(got, null, `${where}: no decision, expected ${JSON.stringify(expect)}`);
        assert.equal(got.gate, expect.gate, `${where}: gate`);
        assert.equal(got.reason, expect.reason, `${where}: reason`);
        assert.equal(got.waiting, expect.waiting, `${where}: waiting`);
        if ("rate" in expect) assert.ok(Math.abs(got.rate - expect.rate) < 1e-9, `${where}: rate ${got.rate} ≠ ${expect.rate}`);
        if ("received" in expect) assert.equal(got.received, expect.received, `${where}: received`);
      }
      if ("gate_after" in step) assert.equal(b.gate, step.gate_after, `${where}: gate after`);
    });
  });
}
