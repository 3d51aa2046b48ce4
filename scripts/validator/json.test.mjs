// node --test: the lossless JSON the validator's answers depend on.
import assert from "node:assert/strict";
import test from "node:test";
import { JSONError, parse, stringify } from "./json.mjs";

test("ids above 2^53 survive a round trip digit for digit", () => {
  for (const id of ["18446744073709551615", "9007199254740993", "-9223372036854775808"]) {
    const text = `{"jsonrpc":"2.0","id":${id},"method":"accountSubscribe","params":[]}`;
    assert.equal(stringify(parse(text)), text);
  }
});

test("safe integers and fractions stay numbers", () => {
  assert.deepEqual(parse('[0,-1,9007199254740991,1.5,2e3]'), [0, -1, 9007199254740991, 1.5, 2000]);
});

test("strings, escapes and literals", () => {
  assert.deepEqual(parse('{"a":"x\\"y\\u0041\\\\","b":[true,false,null]}'), Object.assign(Object.create(null), {
    a: 'x"yA\\',
    b: [true, false, null],
  }));
});

test("u64::MAX is written exactly", () => {
  assert.equal(stringify({ rentEpoch: 18446744073709551615n }), '{"rentEpoch":18446744073709551615}');
});

test("__proto__ is an ordinary key", () => {
  const v = parse('{"__proto__":{"polluted":1}}');
  assert.equal({}.polluted, undefined);
  assert.equal(v.__proto__.polluted, 1);
});

test("malformed input is rejected", () => {
  for (const bad of ["", "{", "[1,]", '{"a" 1}', "1 2", '"abc', "tru", "01", "{'a':1}"]) {
    assert.throws(() => parse(bad), JSONError, bad);
  }
});
