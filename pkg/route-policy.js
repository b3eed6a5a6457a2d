// The page's routing policy: whether an answer comes from the model on this device ('local')
// or from the fallback endpoint ('cloud'), and why. Every decision is a pure function of what
// the caller passes in; the Engine (engine.js) and createEngine (index.js) ask and act. Each
// reason holds only where the fallback's `when` lists it:
//
//   reason       when                                                        decided by
//   unsupported  the device check says this device cannot run the model     afterCheck
//   loading      first visit: the model downloads; the fallback answers      whileLoading
//                meanwhile, the model once it is ready
//   context      a prompt, or an answer midway, passes the context window    takeOver
//   error        the file cannot be had, the engine's worker did not start,  afterCheck, startFailed,
//                the load failed, or a local answer failed (also midway)     loadFailed, takeOver
//   slow         the local model decodes under `slowTokensPerS`: the rest    slowMidway, slowAfter
//                of the answer and every later one go to the fallback
//
// `decide` gives each request its route from these (or the route the request asks for). Where
// the fallback takes over midway, the endpoint continues the text so far: only a text prompt
// or a chat can go there, and not a constrained answer already begun. Not here: the
// endpoint's transport (route.js RemoteTransport) and the `fallback` option's check (route.js
// fallbackOptions).

import { KerzeError } from './protocol.js';

/** The reasons the fallback can cover: its `when` (default: all). */
export const WHEN = Object.freeze(['unsupported', 'loading', 'context', 'error', 'slow']);

/** Whether the endpoint can continue a generation of `input` (token ids cannot go there). */
export function canContinue(input) {
  return Boolean(input.messages) || typeof input.prompt === 'string';
}

/**
 * Where a request goes, and why: `{ route, reason }` (`asked`: the request's route). `cloud`:
 * the fallback (null: none); `local`: whether the local model is there at all; `notLocal`:
 * why it does not answer ('unsupported: …', 'error: …', 'loading: …'), or null; `slow`: the
 * `slow` reason once found, or null; `backend`: the local backend.
 */
export function decide(asked = 'auto', { cloud, local, notLocal, slow, backend }) {
  if (!['auto', 'local', 'cloud'].includes(asked)) {
    throw new KerzeError('InvalidArgumentError', `route must be 'auto', 'local' or 'cloud', not '${asked}'`);
  }
  if (asked === 'cloud') {
    if (!cloud) throw new KerzeError('InvalidArgumentError', "route 'cloud' needs a fallback endpoint (createEngine({ fallback }))");
    return { route: 'cloud', reason: "route 'cloud' was asked for" };
  }
  if (asked === 'local') {
    if (!local) throw new KerzeError('UnsupportedDeviceError', `route 'local': ${notLocal}`);
    return { route: 'local', reason: "route 'local' was asked for" };
  }
  if (!local) return { route: 'cloud', reason: notLocal };
  if (notLocal && cloud?.when.has('loading')) return { route: 'cloud', reason: notLocal };
  if (slow && cloud?.when.has('slow')) return { route: 'cloud', reason: slow };
  return { route: 'local', reason: `on this device (${backend})` };
}

function slowReason(tps, cloud) {
  return `slow: the local model decoded ${tps.toFixed(1)} tokens/s here (under ${cloud.slowTokensPerS})`;
}

/**
 * While a local answer streams, `n` pieces so far, the first `ms` ago: the `slow` reason that
 * sends the rest of it (and later answers) to the fallback, or null. The rate counts from the
 * second piece on, once there are more than 8.
 */
export function slowMidway(cloud, n, ms, input, opts) {
  if (!cloud?.when.has('slow')) return null;
  const tps = n > 8 ? (n - 1) / (ms / 1000) : Infinity;
  return tps < cloud.slowTokensPerS && canContinue(input) && opts.constraint == null ? slowReason(tps, cloud) : null;
}

/** After a local answer (its `usage`): the `slow` reason that sends the next ones away, or null. */
export function slowAfter(cloud, usage) {
  const tps = usage?.decodeTokensPerS;
  if (cloud?.when.has('slow') && usage?.completionTokens >= 8 && tps != null && tps < cloud.slowTokensPerS) {
    return slowReason(tps, cloud);
  }
  return null;
}

/**
 * Why the fallback takes over from a local failure `e` (before or midway through an answer of
 * `input`, `text` so far), or null when it does not and `e` stands.
 */
export function takeOver(cloud, e, input, opts, text) {
  // A constrained answer cut midway cannot be continued elsewhere: the endpoint's
  // constraint would start over on the partial output.
  const resumable = canContinue(input) && !(opts.constraint != null && text);
  if (!cloud || !resumable) return null;
  if (['AbortError', 'InvalidArgumentError', 'DisposedError'].includes(e?.name)) return null;
  if (e?.name === 'ContextFullError') return cloud.when.has('context') ? `context: ${e.message}` : null;
  return cloud.when.has('error') ? `error: the local answer failed (${e?.name}: ${e?.message})` : null;
}

/**
 * After the device check (`check`: probe.js probeSpec's answer, null when bytes were given):
 * the reason the fallback answers everything (`unsupported`, or `error` when the file cannot be
 * had), or null: go on with the local load. Throws DownloadError or UnsupportedDeviceError
 * where the fallback does not cover it.
 */
export function afterCheck(cloud, check) {
  if (check?.unreachable) {
    // The file cannot be had: a download error, whatever the device.
    if (cloud?.when.has('error')) return `error: the model cannot be downloaded (DownloadError: ${check.unreachable})`;
    throw new KerzeError('DownloadError', `the model cannot be downloaded: ${check.unreachable}`);
  }
  if (check?.canRun === 'no') {
    if (cloud?.when.has('unsupported')) return `unsupported: ${check.problems.join('; ')}`;
    const e = new KerzeError('UnsupportedDeviceError', `this device cannot run the model: ${check.problems.join('; ')}`);
    e.probe = check;
    throw e;
  }
  return null;
}

/** The engine's worker did not start (`error`): the `error` reason, or null (`error` stands). */
export function startFailed(cloud, error) {
  return cloud?.when.has('error') ? `error: the engine did not start (${error?.name}: ${error?.message})` : null;
}

/**
 * First visit (the device check found the model not cached): the `loading` reason under which
 * the fallback answers while the model downloads, or null (wait for the load).
 */
export function whileLoading(cloud, check) {
  if (!(cloud?.when.has('loading') && check && !check.cached)) return null;
  const mb = check.downloadBytes != null ? ` (${Math.round(check.downloadBytes / 1e6)} MB)` : '';
  return `loading: the model is downloading${mb}`;
}

/** Why the local model does not answer after its load failed (`e`). */
export function didNotLoad(e) {
  return `error: the model did not load (${e?.name}: ${e?.message})`;
}

/** The load failed (`e`): the `error` reason, or null (`e` stands; an abort always does). */
export function loadFailed(cloud, e) {
  return e?.name !== 'AbortError' && cloud?.when.has('error') ? didNotLoad(e) : null;
}
