// Builds the explorer's page into dist/ (embedded by the Go binary with
// go:embed): esbuild bundles src/main.js with uPlot, and the CSS, minified.
// `node build.mjs --check` builds into a temporary directory instead and
// fails if dist/ differs from it (the committed bundle must be a fresh build
// of the committed sources and the locked packages).
import * as esbuild from "esbuild";
import { mkdtempSync, mkdirSync, readdirSync, readFileSync, rmSync, copyFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const check = process.argv.includes("--check");
const out = check ? mkdtempSync(join(tmpdir(), "explorer-dist-")) : join(here, "dist");

if (!check) rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });
await esbuild.build({
  entryPoints: { app: join(here, "src/main.js") },
  bundle: true,
  minify: true,
  format: "iife",
  target: ["es2020"],
  legalComments: "eof",
  outdir: out,
  logLevel: "warning",
});
copyFileSync(join(here, "src/index.html"), join(out, "index.html"));

if (check) {
  const want = readdirSync(out).sort();
  let have = [];
  try {
    have = readdirSync(join(here, "dist")).sort();
  } catch {}
  const bad = [];
  for (const f of new Set([...want, ...have])) {
    if (!want.includes(f) || !have.includes(f)) {
      bad.push(`${f}: only in ${want.includes(f) ? "a fresh build" : "dist/"}`);
    } else if (!readFileSync(join(out, f)).equals(readFileSync(join(here, "dist", f)))) {
      bad.push(`${f}: differs from a fresh build`);
    }
  }
  rmSync(out, { recursive: true, force: true });
  if (bad.length) {
    console.error("explorer/web/dist is not a fresh build of explorer/web/src:\n  " + bad.join("\n  ") +
      "\nrebuild it with: npm ci --prefix explorer/web && npm run --prefix explorer/web build, and commit dist/");
    process.exit(1);
  }
  console.log("explorer/web/dist matches a fresh build");
}
