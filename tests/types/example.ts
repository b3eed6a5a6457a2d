// Compiled by `tsc --noEmit -p tests/types` in `make test`: the types describe what a site
// writes. Not run.
import kerze, { createEngine, probe, cache, catalog, KerzeError, type Chunk, type Progress, type ChatTool } from 'kerze';
import 'kerze/embed';

async function main(out: HTMLElement): Promise<void> {
  const ctl = new AbortController();
  const p = await probe({ model: 'gemma-3-270m', overrides: { deviceMemory: 2 } });
  if (p.canRun === 'no') console.log(p.problems.join('; '), p.downloadBytes, p.storage?.quota);
  console.log((await window.kerze.probe()).backend, catalog['gemma-3-270m']?.peakBytes);
  const routed = await createEngine({
    model: 'gemma-3-270m',
    fallback: { baseURL: 'https://api.example/v1', model: 'big', getToken: async () => 'short-lived', when: ['unsupported', 'error'], budget: 20, consent: () => true },
    onRoute: (r) => console.log(r.route, r.reason),
  });
  const answer = await routed.chat.completions.create({ messages: [{ role: 'user', content: 'Hi' }], route: 'auto' });
  console.log(answer.kerze.route, answer.kerze.reason);
  const engine = await createEngine({
    model: 'gemma-3-270m',
    device: 'auto',
    onProgress: (p: Progress) => console.log(p.phase, p.loaded, p.total),
    signal: ctl.signal,
    simd: 'auto',
  });
  const simd: 'relaxed-simd' | 'simd128' | 'avx2' | 'portable' = engine.info.simd;
  console.log(simd);
  const backend: 'webgpu' | 'cpu-simd' | 'cpu-simd-threads' | 'cpu-native' | 'cloud' = engine.info.backend;
  const worker: 'script' | 'inline' | null = engine.info.worker;
  console.log(worker);
  console.log(backend, engine.info.nCtx, catalog['gemma-3-270m']?.sha256);

  for await (const chunk of engine.generate('Slogan for an e-bike:', { maxTokens: 48, temperature: 0.7, signal: ctl.signal })) {
    const c: Chunk = chunk;
    out.textContent += c.text;
  }
  const { text, usage, finishReason } = await engine.complete('Counting: one, two,', { temperature: 0, stop: ['\n'] });
  console.log(text, usage.decodeTokensPerS, finishReason);

  const done = await engine.chat.completions.create({
    messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hi' }],
    max_tokens: 32,
  });
  console.log(done.choices[0]?.message.content, done.usage.total_tokens);

  const stream = await engine.chat.completions.create({ messages: [{ role: 'user', content: 'Hi' }], stream: true });
  for await (const c of stream) out.textContent += c.choices[0]?.delta.content ?? '';

  const tools: ChatTool[] = [{ type: 'function', function: { name: 'get_weather', strict: true,
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
  const called = await engine.chat.completions.create({ messages: [{ role: 'user', content: 'Weather in Paris?' }], tools, tool_choice: 'required' });
  const call = called.choices[0]?.message.tool_calls?.[0];
  if (call && called.choices[0]?.finish_reason === 'tool_calls') {
    const result = await engine.chat.completions.create({
      messages: [{ role: 'user', content: 'Weather in Paris?' }, { role: 'assistant', content: null, tool_calls: [call] },
        { role: 'tool', tool_call_id: call.id, content: JSON.parse(call.function.arguments).city + ': 18 °C' }],
      tools, tool_choice: 'none',
    });
    console.log(result.choices[0]?.message.content);
  }
  for await (const c of await engine.chat.completions.create({ messages: [{ role: 'user', content: 'Hi' }], tools, stream: true })) {
    const d = c.choices[0]?.delta.tool_calls?.[0];
    if (d) console.log(d.index, d.function.name, d.function.arguments);
  }
  const picked = await engine.complete('Sentiment:', { choices: [' positive', ' negative'] });
  console.log(picked.choices?.map((c) => `${c.choice} ${c.prob}`), picked.usage.forcedTokens, picked.usage.compileMs);

  const ids: number[] = await engine.tokenize('hello', { bos: true });
  const top = await engine.logitsTopK(ids, { k: 5 });
  console.log(top[0]?.[0]?.[1]);

  try {
    await createEngine({ model: { url: '/models/x.gguf', sha256: 'a'.repeat(64) }, assetsUrl: 'https://cdn.example/kerze/' });
  } catch (e) {
    if (e instanceof KerzeError && e.name === 'IntegrityError') console.log(e.message);
  }
  const list = await cache.list();
  console.log(list.map((m) => m.bytes), await cache.delete('gemma-3-270m'), await cache.clear());
  await engine.dispose();

  const el = document.createElement('kerze-generate');
  el.setAttribute('model', 'gemma-3-270m');
  el.addEventListener('kerze-done', (ev) => console.log(ev.detail.text));
  await el.generate();
  el.labels = { generate: 'Los' };

  const minilm = await createEngine({ model: { url: '/models/all-minilm-l6-v2-q8_0.gguf' } });
  const scores = await minilm.classify('My parcel never arrived', { labels: ['billing', 'delivery'] });
  console.log(scores[0]?.label, scores[0]?.score, scores.usage.textsEncoded);
  const many = await minilm.classify(['a', 'b'], { labels: { yes: ['sure', 'ok'], no: ['never'] }, method: 'logistic' });
  console.log(many[1]?.[0]?.label);
  // An ONNX sequence-classification export: its own labels, no labels given.
  const sentiment = await createEngine({ model: { url: '/models/sst2/onnx/model_quantized.onnx', tokenizer: '/models/sst2/tokenizer.json', config: '/models/sst2/config.json' } });
  console.log((await sentiment.classify('What a film!'))[0]?.label);
  const fromBytes = await createEngine({ model: { data: new Uint8Array(8), tokenizer: {}, config: { model_type: 'bert' } } });
  console.log((await fromBytes.embed(['x'])).length);
  const ix = await minilm.index([{ text: 'Opening hours: 9 to 5', id: 'hours' }], { key: 'id' });
  const hits = await ix.search('when are you open?', { topK: 1 });
  console.log(hits[0]?.doc.id, hits[0]?.score, ix.size, ix.stats.cached, ix.remove('hours'));
  const search = document.createElement('kerze-search');
  search.addEventListener('kerze-search', (ev) => console.log(ev.detail.results[0]?.element));
  console.log((await search.search('price'))[0]?.score, search.stats?.encoded, search.language);
  const cls = document.createElement('kerze-classify');
  cls.strings = { classifying: '…' };
  cls.addEventListener('kerze-classify', (ev) => console.log(ev.detail.label, ev.detail.score));
  console.log((await cls.classify('hello'))[0]?.label, window.kerze.strings.de['generate']);
  await window.kerze.createEngine({ worker: false });
  await kerze.createEngine();
}

void main(document.body);
