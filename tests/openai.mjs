// pkg/openai.js against the cases in tests/fixtures/openai/, which src/openai/ is checked
// against too (tests/openai.rs): one request mapping and one response shape for the browser
// and `kerze serve`. Run: node tests/openai.mjs
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import {
  chatOptions, chatTemplateOptions, streamOptions, chatCompletion, ChatStream, embeddingsOptions, embeddingsResponse,
  CallSplitter,
} from '../pkg/openai.js';

const fixture = (name) => JSON.parse(readFileSync(new URL(`./fixtures/openai/${name}`, import.meta.url), 'utf8'));
const plain = (v) => JSON.parse(JSON.stringify(v));
let n = 0;

for (const c of fixture('requests.json')) {
  if (c.endpoint === 'embeddings') {
    const run = () => plain(embeddingsOptions(c.body));
    if (c.error) {
      assert.throws(run, (e) => e.name === 'InvalidArgumentError' && e.message.includes(c.error), c.name);
    } else {
      assert.deepEqual(run(), c.expect, c.name);
    }
    n += 1;
    continue;
  }
  if (c.endpoint !== 'chat') continue; // the package has chat completions and embeddings
  const run = () => plain({
    options: chatOptions(c.body),
    chat: chatTemplateOptions(c.body),
    stream: c.body.stream === true,
    includeUsage: streamOptions(c.body).includeUsage,
  });
  if (c.checkedBy === 'sampler') {
    // The package passes these through; the engine's sampler refuses them (the same Rust check).
    assert.deepEqual(run().options, c.expect.options, c.name);
  } else if (c.error) {
    assert.throws(run, (e) => e.name === 'InvalidArgumentError' && e.message.includes(c.error), c.name);
  } else {
    assert.deepEqual(run(), c.expect, c.name);
  }
  n += 1;
}

for (const c of fixture('responses.json')) {
  const tools = c.toolCalls === true;
  assert.deepEqual(plain(chatCompletion(c.meta, c.pieces.join(''), c.finishReason, c.usage, tools)), c.completion, c.name);
  const s = new ChatStream(c.meta, c.includeUsage, tools);
  const chunks = [s.start(), ...c.pieces.flatMap((p) => s.push(p)), ...s.finish(c.finishReason, c.usage)];
  assert.deepEqual(plain(chunks), c.chunks, c.name);
  n += 1;
}
// The call splitter: every cut of a reply in two gives what the whole reply gives.
for (const text of [
  'Sure.\n<tool_call>\n{"name": "f", "arguments": {"a": "}"}}\n</tool_call>\n<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>\n',
  'a <tool_call> b', '<tool_call>\n{"name": "f", "arguments": {"q": 1', 'text <tool_cal',
  '<tool_call>\n{"name": "f", "arguments": {"q": "a}</tool_call>b\\"}", "n": [1, {"m": 2}]}}\n</tool_call>\nAfter.',
  '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_',
]) {
  const run = (pieces) => {
    const s = new CallSplitter();
    const parts = [...pieces.flatMap((p) => s.push(p)), ...s.end()];
    let content = '';
    const calls = [];
    for (const p of parts) {
      if ('content' in p) content += p.content;
      else if ('name' in p) calls.push([p.name, '']);
      else calls[p.index][1] += p.arguments;
    }
    return { content, calls };
  };
  const whole = run([text]);
  // A brace or the closing tag inside a string is the arguments'; a call cut after its
  // arguments has no stray brace.
  if (text.includes('a}</tool_call>b')) assert.deepEqual(whole.calls, [['f', '{"q": "a}</tool_call>b\\"}", "n": [1, {"m": 2}]}']], text);
  if (text.endsWith('</tool_')) assert.deepEqual(whole.calls, [['f', '{"a": 1}']], text);
  for (let cut = 0; cut <= text.length; cut++) assert.deepEqual(run([text.slice(0, cut), text.slice(cut)]), whole, `${text} cut at ${cut}`);
  n += 1;
}
for (const c of fixture('embeddings.json')) {
  const vectors = c.vectors.map((v) => Float32Array.from(v));
  assert.deepEqual(plain(embeddingsResponse(c.model, vectors, c.promptTokens, c.encodingFormat)), c.response, c.name);
  n += 1;
}
console.log(`openai.mjs: ${n} cases agree with tests/fixtures/openai/`);
