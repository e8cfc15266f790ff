#!/usr/bin/env python3
"""Tokenizes tests/fixtures/fortunes-qwen3-moe/eval.txt with that fixture's tokenizer.json into
fortunes_eval_ids.txt (one id per line), for the engine's perplexity test, so the model tests do
not depend on the C++ tokenizer. A small byte-level BPE (NFC, the pre-tokenizer's split regex,
GPT-2 byte mapping, merges by rank); it first checks itself against the fixture's tokenizer_cases
and the reference token count, and refuses to write anything if they differ."""
import json
import os
import sys
import unicodedata

import regex

here = os.path.dirname(os.path.abspath(__file__))
fixture = os.path.join(here, "..", "..", "fixtures", "fortunes-qwen3-moe")
tok = json.load(open(os.path.join(fixture, "tokenizer.json"), encoding="utf-8"))
ref = json.load(open(os.path.join(fixture, "reference.json"), encoding="utf-8"))

vocab = tok["model"]["vocab"]
merges = tok["model"]["merges"]
rank = {}
for i, m in enumerate(merges):
    a, b = m.split(" ") if isinstance(m, str) else m
    rank[(a, b)] = i
pattern = None
for p in tok["pre_tokenizer"]["pretokenizers"]:
    if p["type"] == "Split":
        pattern = regex.compile(p["pattern"]["Regex"])
specials = {t["content"]: t["id"] for t in tok["added_tokens"]}


def byte_map():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTES = byte_map()


def bpe(word):
    parts = list(word)
    while len(parts) > 1:
        best = None
        for i in range(len(parts) - 1):
            r = rank.get((parts[i], parts[i + 1]))
            if r is not None and (best is None or r < best[0]):
                best = (r, i)
        if best is None:
            break
        i = best[1]
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return [vocab[p] for p in parts]


def encode_text(text):
    ids = []
    for piece in pattern.findall(unicodedata.normalize("NFC", text)):
        ids += bpe("".join(BYTES[b] for b in piece.encode("utf-8")))
    return ids


def encode(text, parse_specials):
    if not parse_specials:
        return encode_text(text)
    out = []
    split = regex.compile("(" + "|".join(regex.escape(s) for s in specials) + ")")
    for chunk in split.split(text):
        if chunk in specials:
            out.append(specials[chunk])
        elif chunk:
            out += encode_text(chunk)
    return out


for case in ref["tokenizer_cases"]:
    got = encode(case["text"], True)
    if got != case["ids"]:
        sys.exit("tokenizer case %r: got %s, want %s" % (case["text"], got, case["ids"]))
text = open(os.path.join(fixture, "eval.txt"), encoding="utf-8").read()
ids = encode(text, False)
if len(ids) != ref["eval"]["tokens"]:
    sys.exit("eval.txt: %d tokens, reference %d" % (len(ids), ref["eval"]["tokens"]))
with open(os.path.join(here, "fortunes_eval_ids.txt"), "w") as f:
    f.write("\n".join(str(i) for i in ids) + "\n")
print("wrote %d ids" % len(ids))
