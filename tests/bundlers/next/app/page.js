// A server component: rendered on the server (at build time: a static page), with the
// client component below, whose module imports kerze there too.
import Generate from './generate.js';

export default function Page() {
  return (
    <main>
      <Generate />
    </main>
  );
}
