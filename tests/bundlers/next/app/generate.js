'use client';

import { useEffect } from 'react';
import { run } from './app.js';

export default function Generate() {
  useEffect(() => {
    run();
  }, []);
  return <pre id="out" />;
}
