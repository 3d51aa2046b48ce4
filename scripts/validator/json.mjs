// Lossless JSON for Solana RPC.
//
// JSON.parse turns integers above 2^53 into doubles, and solana-go numbers
// its websocket requests with random 64-bit ids, so an id echoed through
// JSON.parse no longer matches and the client never sees its answer. The same
// loss would hit u64 values the validator sends (rentEpoch is u64::MAX on
// every account). parse keeps such integers as BigInt, stringify writes
// BigInt as bare digits, and so both directions are exact.

export class JSONError extends Error {}

export function parse(text) {
  let i = 0;
  const ws = () => {
    while (i < text.length && " \t\n\r".includes(text[i])) i++;
  };
  const fail = (what) => {
    throw new JSONError(`${what} at offset ${i}`);
  };
  const value = () => {
    ws();
    const c = text[i];
    if (c === "{") {
      i++;
      const obj = Object.create(null); // no prototype: "__proto__" is just a key
      ws();
      if (text[i] === "}") {
        i++;
        return obj;
      }
      for (;;) {
        ws();
        if (text[i] !== '"') fail("expected a key");
        const k = string();
        ws();
        if (text[i++] !== ":") fail("expected ':'");
        obj[k] = value();
        ws();
        const d = text[i++];
        if (d === "}") return obj;
        if (d !== ",") fail("expected ',' or '}'");
      }
    }
    if (c === "[") {
      i++;
      const arr = [];
      ws();
      if (text[i] === "]") {
        i++;
        return arr;
      }
      for (;;) {
        arr.push(value());
        ws();
        const d = text[i++];
        if (d === "]") return arr;
        if (d !== ",") fail("expected ',' or ']'");
      }
    }
    if (c === '"') return string();
    if (text.startsWith("true", i)) return (i += 4), true;
    if (text.startsWith("false", i)) return (i += 5), false;
    if (text.startsWith("null", i)) return (i += 4), null;
    const m = /^-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?/.exec(text.slice(i, i + 400));
    if (!m) fail("unexpected character");
    i += m[0].length;
    if (!m[2] && !m[3]) {
      const n = Number(m[0]);
      return Number.isSafeInteger(n) ? n : BigInt(m[0]);
    }
    return Number(m[0]);
  };
  const string = () => {
    // Reuse JSON.parse for escapes: find the closing quote first.
    let j = i + 1;
    while (j < text.length && text[j] !== '"') j += text[j] === "\\" ? 2 : 1;
    if (j >= text.length) fail("unterminated string");
    const s = JSON.parse(text.slice(i, j + 1));
    i = j + 1;
    return s;
  };
  const v = value();
  ws();
  if (i !== text.length) fail("trailing data");
  return v;
}

export function stringify(v) {
  if (typeof v === "bigint") return v.toString();
  if (v === undefined || v === null) return "null";
  if (typeof v === "number") {
    if (!Number.isFinite(v)) throw new TypeError("non-finite number");
    return JSON.stringify(v);
  }
  if (typeof v === "string" || typeof v === "boolean") return JSON.stringify(v);
  if (Array.isArray(v)) return "[" + v.map(stringify).join(",") + "]";
  const parts = [];
  for (const [k, x] of Object.entries(v)) {
    if (x !== undefined) parts.push(JSON.stringify(k) + ":" + stringify(x));
  }
  return "{" + parts.join(",") + "}";
}
