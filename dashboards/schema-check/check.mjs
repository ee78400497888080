// Type-checks every dashboard in ../ against Grafana's `Dashboard` type from @grafana/schema:
// each JSON file is embedded as an object literal annotated `Dashboard` and compiled with
// `tsc --noEmit --strict`, so wrong field types, missing required fields and unknown properties
// (TypeScript's excess-property check on literals) all fail.
import { execFileSync } from 'node:child_process';
import { readdirSync, readFileSync, writeFileSync, mkdirSync } from 'node:fs';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const dashboards = join(here, '..');
const out = join(here, 'generated');
mkdirSync(out, { recursive: true });
const files = readdirSync(dashboards).filter((f) => f.endsWith('.json'));
if (files.length === 0) {
  console.error('no dashboards found in', dashboards);
  process.exit(1);
}
const checked = files.map((f) => {
  const json = JSON.parse(readFileSync(join(dashboards, f), 'utf8'));
  const ts = join(out, f.replace(/\.json$/, '.ts'));
  writeFileSync(
    ts,
    `import type { Dashboard } from '@grafana/schema';\n` +
      `const dashboard: Dashboard = ${JSON.stringify(json, null, 2)};\nexport default dashboard;\n`,
  );
  return ts;
});
const tsc = join(here, 'node_modules', 'typescript', 'bin', 'tsc');
try {
  execFileSync(
    process.execPath,
    [tsc, '--noEmit', '--strict', '--skipLibCheck', '--moduleResolution', 'bundler', '--module', 'esnext', '--target', 'es2022', ...checked],
    { stdio: 'inherit' },
  );
} catch {
  console.error(`dashboards do not match @grafana/schema's Dashboard type (errors above)`);
  process.exit(1);
}
console.log(`${files.length} dashboard(s) match @grafana/schema's Dashboard type: ${files.join(', ')}`);
