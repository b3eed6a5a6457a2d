// Reading a stored model file (a Cache API Blob, in the worker) into the engine while it
// unpacks the weights: windows through one byte stream, read ahead by a second worker where
// the page allows one. Not here: storing or downloading the file (download.js).

/** Bytes per window the reader hands the engine, and windows read ahead of the one in use. */
const AHEAD_WINDOW = 4 << 20;
const AHEAD_DEPTH = 2;
/** How long the reader may take to say it started before its windows are read here instead. */
const READER_START_MS = 3000;

/**
 * Reads windows of `blob` in the order asked, through one byte stream (BYOB) into buffers the
 * engine gives back: `read(start, end)` resolves to a Uint8Array of the window, `giveBack(buf)`
 * returns a window's buffer once the engine is done with it. In Chromium 156 a cached 253 MB
 * model read so in 113–130 ms, against 330–440 ms through FileReaderSync or `arrayBuffer()`
 * (a fresh buffer per window: the time goes to faulting in new pages). Where the stream has
 * no BYOB reader, each window is read with `arrayBuffer()`. Self-contained: it is also the
 * source of the reader worker (READER_SOURCE).
 */
export function windowReader(blob, windowBytes) {
  let reader = null;
  let pos = -1;
  let byob = true;
  let closed = false;
  const spare = [];
  let chain = Promise.resolve();
  const readWindow = async (start, end) => {
    if (closed) throw new Error('the model reader was closed');
    const n = end - start;
    if (byob && start !== pos) {
      reader?.cancel().catch(() => {});
      reader = null;
      try {
        reader = blob.slice(start).stream().getReader({ mode: 'byob' });
        pos = start;
      } catch {
        byob = false;
      }
    }
    if (!byob) return new Uint8Array(await blob.slice(start, end).arrayBuffer());
    let buf = spare.pop() ?? new ArrayBuffer(Math.max(n, windowBytes));
    if (buf.byteLength < n) buf = new ArrayBuffer(n);
    pos = -1;
    let off = 0;
    while (off < n) {
      const { value, done } = await reader.read(new Uint8Array(buf, off, n - off));
      if (done || !value) throw new Error(`the stored model ended at ${start + off} of ${blob.size} bytes`);
      buf = value.buffer;
      off += value.byteLength;
    }
    pos = end;
    return new Uint8Array(buf, 0, n);
  };
  return {
    read(start, end) {
      const got = chain.then(() => readWindow(start, end));
      chain = got.catch(() => {});
      return got;
    },
    giveBack(buf) {
      if (byob && !closed && buf.byteLength >= windowBytes && spare.length < 4) spare.push(buf);
    },
    close() {
      closed = true;
      reader?.cancel().catch(() => {});
      reader = null;
      pos = -1;
      spare.length = 0;
    },
  };
}

// The reader worker: windowReader in a second worker, each window's buffer handed over and
// given back (transferred, not copied).
const READER_SOURCE = `let r = null;
onmessage = (e) => {
  const d = e.data;
  if (d.blob) { r = (${windowReader})(d.blob, d.windowBytes); postMessage({ started: true }); return; }
  if (d.giveBack) { r.giveBack(d.giveBack); return; }
  r.read(d.start, d.end)
    .then((v) => postMessage({ id: d.id, bytes: v }, [v.buffer]))
    .catch((err) => postMessage({ id: d.id, error: String((err && err.message) || err) }));
};`;

/**
 * What the engine's load from a stored Blob reads through (Engine.loadAsync's `readAhead`):
 * `readAhead(offset)` resolves to `{ start, bytes }`, the window of the file that holds
 * `offset`, while the next AHEAD_DEPTH windows are being read by a second worker; a window
 * the load has passed goes back to the reader to be filled again. The load unpacks one
 * window while the next is read. Where no worker starts (a page's policy), or it does not
 * say so within READER_START_MS, or it fails, the windows are read here, asynchronously.
 * `close()` ends the reader.
 */
export function readAheadOf(blob) {
  const size = blob.size;
  const pending = new Map();
  let worker = null;
  let url = null;
  let nextId = 0;
  let used = false;
  let startTimer = null;
  let local = null;
  const inThread = (start, end) => (local ??= windowReader(blob, AHEAD_WINDOW)).read(start, end);
  // The worker is dropped for good: what it was asked for is read here.
  const giveUpWorker = () => {
    clearTimeout(startTimer);
    worker?.terminate();
    worker = null;
    for (const [id, p] of pending) {
      pending.delete(id);
      inThread(p.start, p.end).then(p.resolve, p.reject);
    }
  };
  // Started at the first window asked for: a load onto the GPU reads plainly and asks none.
  const startWorker = () => {
    try {
      url = URL.createObjectURL(new Blob([READER_SOURCE], { type: 'text/javascript' }));
      worker = new Worker(url, { name: 'kerze-reader' });
      worker.onmessage = (e) => {
        if (e.data.started) {
          clearTimeout(startTimer);
          return;
        }
        if (e.data.error) {
          giveUpWorker();
          return;
        }
        const p = pending.get(e.data.id);
        if (!p) return;
        pending.delete(e.data.id);
        p.resolve(e.data.bytes);
      };
      worker.onerror = (e) => {
        e.preventDefault?.();
        giveUpWorker();
      };
      worker.onmessageerror = giveUpWorker;
      // A worker the page's policy blocks fires `error`; one that neither starts nor fails
      // (seen nowhere, but a load must not hang on it) is given up after a while.
      startTimer = setTimeout(giveUpWorker, READER_START_MS);
      worker.postMessage({ blob, windowBytes: AHEAD_WINDOW });
    } catch {
      worker = null;
    }
  };
  const read = (start, end) => {
    if (!worker) return inThread(start, end);
    const id = nextId++;
    return new Promise((resolve, reject) => {
      pending.set(id, { start, end, resolve, reject });
      worker.postMessage({ id, start, end });
    });
  };
  // A window the load is done with: its buffer goes back to whoever reads.
  const giveBack = (bytes) => {
    const buf = bytes.buffer;
    if (worker) worker.postMessage({ giveBack: buf }, [buf]);
    else local?.giveBack(buf);
  };
  // The windows asked for, in the file's order: the first holds the load's position.
  let queue = [];
  const issue = (start) => {
    const end = Math.min(size, start + AHEAD_WINDOW);
    const promise = read(start, end);
    promise.catch(() => {});
    queue.push({ start, end, promise });
  };
  const drop = (w) => w.promise.then(giveBack, () => {});
  return {
    readAhead(offset) {
      if (!used) startWorker();
      used = true;
      while (queue.length && queue[0].end <= offset) drop(queue.shift());
      if (!queue.length || queue[0].start > offset) {
        // Not where the reading went on (the load went back or far ahead): start over here.
        queue.forEach(drop);
        queue = [];
        issue(offset);
      }
      while (queue.length <= AHEAD_DEPTH && queue[queue.length - 1].end < size) issue(queue[queue.length - 1].end);
      const w = queue[0];
      return w.promise.then((bytes) => ({ start: w.start, bytes }));
    },
    /**
     * null if the engine read nothing through it (a GPU load reads plainly), else 'worker'
     * while the second worker reads, 'thread' where it could not start or failed.
     */
    mode() {
      if (!used) return null;
      return worker ? 'worker' : 'thread';
    },
    close() {
      clearTimeout(startTimer);
      worker?.terminate();
      worker = null;
      local?.close();
      if (url) URL.revokeObjectURL(url);
      for (const p of pending.values()) p.reject(new Error('the model reader was closed'));
      pending.clear();
      queue = [];
    },
  };
}
