"""Hugging Face's tokenizers (the Rust library, through its Python package)
as a reference for the Go tokenizer (trainer/tokenizer), beside
reference.mjs (transformers.js): the Go test TestMatchesTokenizers starts it
with the torch engine's pinned python (bash scripts/setup-torch, whose
requirements pin tokenizers).

  python reference.py encode TOKENIZER.json IN.json
      IN.json is [{"text": "...", "add_special_tokens": true|false}, ...];
      prints one JSON array of id arrays, in order.
  python reference.py train KIND CORPUS OUT.json
      trains a BPE tokenizer of KIND on the text file CORPUS with tokenizers'
      own trainer and writes its tokenizer.json to OUT.json: a tokenizer
      file made here, from the repository's corpus, rather than fetched.
      KIND is bytelevel (GPT-2's byte-level pre-tokenizer, a template
      adding <|endoftext|> in front) or metaspace (Llama 2's layout: ▁ for
      spaces, an <unk> for characters the corpus never had, <s> in front).

Training is deterministic for a given corpus and tokenizers version (ties
between equally frequent pairs are broken by the pair, not by order of
discovery), so the files are the same on every run.
"""

import json
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

VOCAB = 2000


def train(kind, corpus, out):
    if kind == "bytelevel":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        special = ["<|endoftext|>"]
        tr = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=special,
                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train([corpus], tr)
        tok.post_processor = processors.TemplateProcessing(
            single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", tok.token_to_id("<|endoftext|>"))])
    elif kind == "metaspace":
        tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
        tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first")
        special = ["<unk>", "<s>", "</s>"]
        tr = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=special, show_progress=False)
        tok.train([corpus], tr)
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    else:
        raise SystemExit("unknown kind %r (want bytelevel or metaspace)" % kind)
    tok.save(out)


def encode(path, cases_path):
    tok = Tokenizer.from_file(path)
    with open(cases_path, encoding="utf-8") as f:
        cases = json.load(f)
    out = [tok.encode(c["text"], add_special_tokens=c["add_special_tokens"]).ids for c in cases]
    sys.stdout.write(json.dumps(out))


def main(argv):
    if len(argv) == 4 and argv[1] == "encode":
        encode(argv[2], argv[3])
    elif len(argv) == 5 and argv[1] == "train":
        train(argv[2], argv[3], argv[4])
    else:
        sys.stderr.write(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
