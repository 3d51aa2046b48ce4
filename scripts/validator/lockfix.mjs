// npm's lockfile leaves out litesvm 1.5.0's optional native packages for
// other platforms, because litesvm 1.5.0 was published without them (only
// litesvm-linux-x64-gnu exists at 1.5.0). `npm ci` then refuses the lockfile
// as out of sync with litesvm's optionalDependencies. This adds them as
// optional, platform-restricted entries, which npm skips on every other
// platform; on those platforms the validator has no native runtime anyway.
//
//   npm install --package-lock-only && node lockfix.mjs
import fs from "node:fs";

const lock = JSON.parse(fs.readFileSync("package-lock.json", "utf8"));
const platforms = {
  "litesvm-darwin-x64": { os: ["darwin"], cpu: ["x64"] },
  "litesvm-darwin-arm64": { os: ["darwin"], cpu: ["arm64"] },
  "litesvm-linux-arm64-gnu": { os: ["linux"], cpu: ["arm64"], libc: ["glibc"] },
  "litesvm-linux-arm64-musl": { os: ["linux"], cpu: ["arm64"], libc: ["musl"] },
  "litesvm-linux-x64-musl": { os: ["linux"], cpu: ["x64"], libc: ["musl"] },
};
const version = lock.packages["node_modules/litesvm"].version;
for (const [name, platform] of Object.entries(platforms)) {
  const key = `node_modules/${name}`;
  if (!lock.packages[key]) lock.packages[key] = { version, optional: true, ...platform };
}
lock.packages = Object.fromEntries(Object.entries(lock.packages).sort(([a], [b]) => (a === "" ? -1 : b === "" ? 1 : a < b ? -1 : 1)));
fs.writeFileSync("package-lock.json", JSON.stringify(lock, null, 2) + "\n");
