// This module's own URL, for index.js to tell whether a bundler merged the package into one
// script (then this URL and index.js's are the same): see packageLayout() there.
export const HERE = import.meta.url;
