// The consumer app every bundler test builds (copied into each app as its entry): what a
// site writes, nothing bundler-specific. The test page passes the model URL, its sha256, the
// prompt, the thread count, `worker=false`, where the package's files are (if self-hosted)
// and `choices` (a constrained request: the constraint module, loaded on first use) in the
// query string; the outcome lands in window.kerzeResult.
import { createEngine } from 'kerze';

export async function run() {
  const q = new URLSearchParams(globalThis.location.search);
  const out = document.getElementById('out');
  try {
    const engine = await createEngine({
      model: { url: q.get('model'), sha256: q.get('sha256') },
      threads: Number(q.get('threads') ?? 1),
      worker: q.get('worker') !== 'false',
      // Where the package's files are self-hosted, if the test serves them (see the README).
      assetsUrl: q.get('assets') ?? undefined,
      onProgress: (p) => { out.textContent = `${p.phase} ${p.loaded}/${p.total}`; },
    });
    const r = await engine.complete(q.get('prompt'), { maxTokens: Number(q.get('maxTokens') ?? 16), temperature: 0 });
    out.textContent = r.text;
    const choices = q.get('choices')?.split(',');
    const choice = choices ? (await engine.complete(q.get('prompt'), { maxTokens: 4, temperature: 0, choices })).text : null;
    globalThis.kerzeResult = { ids: r.ids, text: r.text, choice, info: engine.info, isolated: globalThis.crossOriginIsolated };
    await engine.dispose();
  } catch (e) {
    out.textContent = `${e?.name}: ${e?.message}`;
    globalThis.kerzeResult = { error: { name: e?.name, message: e?.message } };
  }
}
