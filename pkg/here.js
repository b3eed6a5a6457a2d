// This module's own URL, for transport.js to tell whether a bundler merged the package into
// one script (then this URL and transport.js's are the same): see packageLayout() there.
export const HERE = import.meta.url;
