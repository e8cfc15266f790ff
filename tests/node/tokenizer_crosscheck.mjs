// Cross-checks the engine's tokenizer against an implementation we did not write: Hugging Face's
// pure-JS @huggingface/tokenizers (tokenizers.js). For each fixture tokenizer.json and a few
// synthetic variants (other pre-tokenizers, GLM-4.5's, DeepSeek-V3's and Kimi K2's split patterns,
// ignore_merges, added tokens with every flag), it encodes a few thousand seeded random strings
// and 16 KiB runs of one class (a letter, a CJK character, digits, spaces, punctuation, newlines,
// an emoji, base64) both ways and compares the ids:
//   - special tokens parsed: ours encode(text, true) against tokenizers.js encode();
//   - not parsed: ours encode(text, false) against tokenizers.js with no added tokens at all
//     (edgeserve encodes chat message content this way so that no added token, special or not,
//     can be injected; Hugging Face's split_special_tokens would still match non-special ones);
//   - decode: ours against tokenizers.js decode() of the same ids (encoded and random ones);
//   - the pre-tokenizer's pieces of the normalised text (a divergent split can hide behind a
//     small vocabulary that encodes both splits alike).
// On a mismatch it shrinks the string to a small failing case, prints the first few (string as
// JSON, both id lists) and exits 1.
//
// Known tokenizers.js departures from the Rust `tokenizers` crate (the reference both follow),
// skipped narrowly and checked by the C++ unit tests instead:
//   - single_word is ignored by tokenizers.js (AddedToken keeps the flag, encode_text never reads
//     it); Rust drops a match that has a word character (regex \w) right before or after it.
//     Cases where a single_word token touches a word character are skipped.
//   - lstrip/rstrip strip with String.trimEnd/trimStart, whose whitespace includes U+FEFF and
//     excludes U+0085; Rust strips Unicode White_Space (U+0085 yes, U+FEFF no). Cases with either
//     character in the whitespace next to a stripping token are skipped.
//   - a Split regex's `(?i:...)` is translated with ASCII case folding only ([sS]); Oniguruma
//     (Rust) and PCRE2 (ours) fold by Unicode, so `(?i:'s)` also matches "'\u017f" (long s) and
//     a `k` would match U+212A (Kelvin). Cases with either character are skipped where a Split
//     regex has `(?i`.
//   - tokenizers.js reads a Split regex's \p{Han} as Script=Han; PCRE2 (ours) reads it as
//     Script_Extensions=Han, which also holds CJK punctuation such as U+3008 and U+3002 (Kimi K2's
//     pattern). Cases with a character of that difference are skipped where a Split regex has
//     \p{Han}; which reading Kimi K2's tiktoken regex engine takes is not checked here.
//   - the ByteLevel pre-tokenizer's GPT-2 regex (use_regex) is a native JS RegExp, whose \s
//     includes U+FEFF and excludes U+0085, unlike the Oniguruma \s (Unicode White_Space) Rust
//     uses (Split patterns are translated and do agree). Cases with either character are skipped
//     where that regex is used.
//
// Usage: node tokenizer_crosscheck.mjs TOKENIZE_TOOL [CASES_PER_TOKENIZER]

import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Tokenizer } from "@huggingface/tokenizers";

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, "../..");
const toolPath = process.argv[2];
const casesPer = Number(process.argv[3] ?? 2500);
if (!toolPath) {
    console.error("usage: node tokenizer_crosscheck.mjs TOKENIZE_TOOL [CASES_PER_TOKENIZER]");
    process.exit(2);
}

// ---- seeded randomness ----------------------------------------------------------------------

function mulberry32(seed) {
    let a = seed >>> 0;
    return () => {
        a = (a + 0x6d2b79f5) >>> 0;
        let t = a;
        t = Math.imul(t ^ (t >>> 15), t | 1);
        t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
        return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
}

// ---- the engine's tokenizer, through tokenize_tool --------------------------------------------

class Tool {
    constructor(modelDir) {
        this.child = spawn(toolPath, [modelDir], { stdio: ["pipe", "pipe", "inherit"] });
        this.waiting = [];
        this.exited = new Promise((resolve) => this.child.on("exit", resolve));
        createInterface({ input: this.child.stdout }).on("line", (line) => {
            this.waiting.shift()(JSON.parse(line));
        });
    }
    ask(request) {
        return new Promise((resolve) => {
            this.waiting.push(resolve);
            this.child.stdin.write(JSON.stringify(request) + "\n");
        });
    }
    async encode(text, special) {
        const r = await this.ask({ op: "encode", text, special });
        if (r.error) throw new Error(`tokenize_tool encode ${JSON.stringify(text)}: ${r.error}`);
        return r.ids;
    }
    async split(text) {
        const r = await this.ask({ op: "split", text });
        if (r.error) throw new Error(`tokenize_tool split ${JSON.stringify(text)}: ${r.error}`);
        return r.pieces;
    }
    async decode(ids) {
        const r = await this.ask({ op: "decode", ids });
        if (r.error) throw new Error(`tokenize_tool decode: ${r.error}`);
        // Invalid UTF-8 is replaced as tokenizers.js's TextDecoder does (one U+FFFD per maximal
        // subpart).
        return r.text ?? new TextDecoder().decode(Uint8Array.from(r.bytes));
    }
    async close() {
        this.child.stdin.end();
        const code = await this.exited;
        if (code !== 0) throw new Error(`tokenize_tool exited ${code}`);
    }
}

// ---- random text -------------------------------------------------------------------------------

const cp = (...points) => String.fromCodePoint(...points);
const WHITESPACE = [" ", "  ", "\n", "\n\n", "\t", "\r\n", "\n\n  \t", "   \n", "\u00a0", "\u3000",
    "\u2028", "\u0085", "\u000b", "\u000c", "\u200b", "\ufeff", "\u2009", " \u00a0 "];
const PUNCT = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
const CONTRACTIONS = ["'s", "'S", "'t", "'T", "'re", "'RE", "'ve", "'Ve", "'m", "'M", "'ll",
    "'LL", "'lL", "'d", "'D", "'\u017f", "'\u212a", "’s", "''s", "'"];
const EMOJI = ["😀", "🙂", "👍🏽", "👋🏿", "👨‍👩‍👧‍👦", "🧑🏻‍💻", "🏳️‍🌈", "❤️", "1️⃣", "🇯🇵", "🇺🇸",
    "👩‍❤️‍💋‍👨", "🫠", "✨", "☃", "🦀"];
const WORDS = ["the", "The", "THE", "hello", "world", "don't", "we'll", "I'm", "naïve", "café",
    "Straße", "İstanbul", "ﬁne", "Ⅻ", "½", "x²", "١٢٣", "１２３", "ǅ", "ᾼ", "Ω", "Å", "ﬃ"];

function randomText(rng, specials, evalLines) {
    const pick = (list) => list[Math.floor(rng() * list.length)];
    const range = (lo, hi) => lo + Math.floor(rng() * (hi - lo + 1));
    const run = (n, f) => Array.from({ length: n }, f).join("");
    const pieces = {
        ascii: () => run(range(1, 9), () => {
            const c = String.fromCharCode(range(97, 122));
            return rng() < 0.2 ? c.toUpperCase() : c;
        }),
        word: () => pick(WORDS),
        punct: () => run(range(1, 4), () => pick(PUNCT)),
        digits: () => run(range(1, 12), () => String(range(0, 9))),
        space: () => pick(WHITESPACE),
        contraction: () => pick(CONTRACTIONS),
        cjk: () => run(range(1, 5), () => pick([
            () => cp(range(0x4e00, 0x9fff)), () => cp(range(0x3041, 0x3096)),
            () => cp(range(0x30a1, 0x30fa)), () => cp(range(0xac00, 0xd7a3)),
            () => cp(range(0x3001, 0x3011))])()),
        emoji: () => pick(EMOJI) + (rng() < 0.3 ? pick(EMOJI) : ""),
        combining: () => run(range(1, 3), () =>
            pick(["a", "e", "o", "n", "u", "ᄀ", "α", " "]) + cp(range(0x300, 0x36f)) +
            (rng() < 0.3 ? cp(range(0x300, 0x36f)) : "")),
        jamo: () => cp(range(0x1100, 0x1112), range(0x1161, 0x1175)) +
            (rng() < 0.5 ? cp(range(0x11a8, 0x11c2)) : ""),
        scripts: () => run(range(1, 6), () => cp(pick([
            () => range(0x410, 0x44f), () => range(0x3b1, 0x3c9), () => range(0x627, 0x64a),
            () => range(0x915, 0x939), () => range(0xe01, 0xe2e), () => range(0x5d0, 0x5ea),
            () => range(0xc0, 0xff), () => range(0x1d400, 0x1d433), () => range(0xe000, 0xe010),
            () => range(0x2200, 0x22ff), () => pick([0xfffd, 0x10ffff, 0x2060, 0xad, 0x200d]),
        ])())),
        special: () => {
            if (specials.length === 0) return "<|x|>";
            const s = pick(specials);
            if (rng() < 0.15) return s.slice(0, range(1, s.length - 1));
            const pad = () => (rng() < 0.3 ? pick(WHITESPACE) : "");
            return pad() + s + pad();
        },
        eval: () => {
            if (evalLines.length === 0) return "plain text";
            const line = pick(evalLines);
            const from = range(0, line.length);
            return line.slice(from, from + range(1, 60));
        },
    };
    const kinds = Object.keys(pieces);
    const n = range(1, 8);
    let s = "";
    for (let i = 0; i < n; ++i) s += pieces[pick(kinds)]();
    // Slices of eval lines can cut a surrogate pair; keep the string well formed.
    return s.toWellFormed ? s.toWellFormed() : s.replace(/[\ud800-\udfff]/gu, "\ufffd");
}

// ---- the tokenizers under test ---------------------------------------------------------------

function writeModel(dir, tokenizerJson, config) {
    fs.mkdirSync(dir, { recursive: true });
    fs.writeFileSync(path.join(dir, "tokenizer.json"), JSON.stringify(tokenizerJson));
    fs.writeFileSync(path.join(dir, "tokenizer_config.json"), JSON.stringify(config));
}

// Synthetic tokenizer.json files derived from the fortunes tokenizer.
function variants(tmp) {
    const base = JSON.parse(fs.readFileSync(
        path.join(root, "tests/fixtures/fortunes-qwen3-moe/tokenizer.json"), "utf8"));
    const clone = () => structuredClone(base);
    let nextId = Math.max(...base.added_tokens.map((t) => t.id)) + 1;
    const added = (content, flags) => ({
        id: nextId++, content, single_word: false, lstrip: false, rstrip: false,
        normalized: false, special: false, ...flags,
    });
    const flagTokens = [
        added("<L>", { lstrip: true, special: true }),
        added("<R>", { rstrip: true }),
        added("<LR>", { lstrip: true, rstrip: true, special: true }),
        added("[W]", { single_word: true }),
        added("wd", { single_word: true, normalized: true }),
        added("h\u00e9llo", { normalized: true }),
        added("e\u0301x", { normalized: true }),
        added("<N>", { normalized: true, lstrip: true }),
        added("<S>", { special: true, normalized: true, rstrip: true }),
        added("ab", {}),
        added("abc", {}),
        added("bcd", { special: true }),
        added("🙂", {}),
        added("Ω", { normalized: true }),
    ];
    const out = [];
    const cfg = { clean_up_tokenization_spaces: false };

    const gpt2 = clone();
    gpt2.normalizer = null;
    gpt2.pre_tokenizer = { type: "ByteLevel", add_prefix_space: false, trim_offsets: true,
        use_regex: true };
    out.push({ name: "variant: ByteLevel GPT-2 regex, no normalizer", json: gpt2, config: cfg });

    // The other supported models' split patterns (GLM-4.5's tokenizer.json, DeepSeek-V3's, and
    // Kimi K2's as engine/tokenizer/tiktoken.cc writes it for PCRE2).
    const split = (regex) => ({ type: "Split", pattern: { Regex: regex }, behavior: "Isolated",
        invert: false });
    const byteLevel = { type: "ByteLevel", add_prefix_space: false, trim_offsets: false,
        use_regex: false };
    const contraction = "(?i:'s|'t|'re|'ve|'m|'ll|'d)";
    const upper = "[^\\p{Ll}\\p{N}\\p{P}\\p{S}\\p{Z}\\p{C}\\p{Han}]";
    const lower = "[^\\p{Lu}\\p{Lt}\\p{N}\\p{P}\\p{S}\\p{Z}\\p{C}\\p{Han}]";
    const splitPatterns = {
        "GLM-4.5": [contraction + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
            + "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"],
        "DeepSeek-V3": ["\\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
            "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?"
            + "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"],
        "Kimi K2": ["[\\p{Han}]+|[^\\r\\n\\p{L}\\p{N}]?" + upper + "*" + lower + "+" + contraction
            + "?|[^\\r\\n\\p{L}\\p{N}]?" + upper + "+" + lower + "*" + contraction
            + "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"],
    };
    for (const [family, patterns] of Object.entries(splitPatterns)) {
        const v = clone();
        v.pre_tokenizer = { type: "Sequence", pretokenizers: [...patterns.map(split), byteLevel] };
        out.push({ name: `variant: ${family} split pattern`, json: v, config: cfg });
    }

    const ignore = clone();
    ignore.model.ignore_merges = true;
    out.push({ name: "variant: ignore_merges", json: ignore, config: cfg });

    const literal = clone();
    literal.pre_tokenizer.pretokenizers.unshift({ type: "Split", pattern: { String: ". " },
        behavior: "Isolated", invert: false });
    out.push({ name: "variant: Split on a literal string first", json: literal, config: cfg });

    const flags = clone();
    flags.added_tokens.push(...structuredClone(flagTokens));
    out.push({ name: "variant: added-token flags, NFC", json: flags, config: cfg, strips: true });

    const flagsRaw = clone();
    flagsRaw.normalizer = null;
    flagsRaw.added_tokens.push(...structuredClone(flagTokens));
    out.push({ name: "variant: added-token flags, no normalizer", json: flagsRaw, config: cfg,
        strips: true });

    for (const [i, v] of out.entries()) {
        v.dir = path.join(tmp, `variant${i}`);
        writeModel(v.dir, v.json, v.config);
    }
    return out;
}

function fixtures() {
    const seen = new Map();  // tokenizer.json text -> its entry in `out`
    const out = [];
    const dir = path.join(root, "tests/fixtures");
    for (const name of fs.readdirSync(dir).sort()) {
        const file = path.join(dir, name, "tokenizer.json");
        if (!fs.existsSync(file)) continue;
        const text = fs.readFileSync(file, "utf8");
        if (seen.has(text)) {  // The micro fixtures share one tokenizer.json.
            seen.get(text).name += ` = ${name}`;
            continue;
        }
        const cfgFile = path.join(dir, name, "tokenizer_config.json");
        const config = fs.existsSync(cfgFile) ? JSON.parse(fs.readFileSync(cfgFile, "utf8")) : {};
        out.push({ name: `fixture: ${name}`, dir: path.join(dir, name), json: JSON.parse(text),
            config });
        seen.set(text, out.at(-1));
    }
    return out;
}

// ---- comparison ------------------------------------------------------------------------------

const WORD_CHAR = /[\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}]/u;
const ANY_SPACE = /[\p{White_Space}\ufeff]/u;

// Where `content` occurs in `text`: the characters just before and just after each occurrence,
// and the whitespace runs (by either definition) on each side.
function* occurrences(text, content) {
    for (let at = text.indexOf(content); at >= 0; at = text.indexOf(content, at + 1)) {
        const left = Array.from(text.slice(0, at));
        const right = Array.from(text.slice(at + content.length));
        let l = left.length;
        while (l > 0 && ANY_SPACE.test(left[l - 1])) l -= 1;
        let r = 0;
        while (r < right.length && ANY_SPACE.test(right[r])) r += 1;
        yield { before: left.at(-1) ?? "", after: right[0] ?? "",
            spaceBefore: left.slice(l).join(""), spaceAfter: right.slice(0, r).join("") };
    }
}

function usesCaselessSplit(pre) {
    if (!pre) return false;
    if (pre.type === "Sequence") return pre.pretokenizers.some(usesCaselessSplit);
    return pre.type === "Split" && (pre.pattern.Regex ?? "").includes("(?i");
}

function usesHanSplit(pre) {
    if (pre?.type === "Sequence") return pre.pretokenizers.some(usesHanSplit);
    return pre?.type === "Split" && (pre.pattern.Regex ?? "").includes("\\p{Han}");
}

function usesByteLevelRegex(pre) {
    if (!pre) return false;
    if (pre.type === "Sequence") return pre.pretokenizers.some(usesByteLevelRegex);
    return pre.type === "ByteLevel" && (pre.use_regex ?? true);
}

// Cases where tokenizers.js is known to depart from Rust `tokenizers` (see the header).
function knownJsDeparture(model, text) {
    if (usesByteLevelRegex(model.json.pre_tokenizer) && /[\u0085\ufeff]/u.test(text)) {
        return "ByteLevel regex \\s";
    }
    if (usesCaselessSplit(model.json.pre_tokenizer) && /[\u017f\u212a]/u.test(text)) {
        return "ASCII-only (?i:)";
    }
    if (usesHanSplit(model.json.pre_tokenizer) &&
        /(?=\p{Script_Extensions=Han})\P{Script=Han}/u.test(text)) {
        return "\\p{Han} by Script";
    }
    for (const t of model.json.added_tokens) {
        for (const o of occurrences(text, t.content)) {
            if (t.single_word && (WORD_CHAR.test(o.before) || WORD_CHAR.test(o.after))) {
                return "single_word";
            }
            if ((t.lstrip && /[\u0085\ufeff]/u.test(o.spaceBefore)) ||
                (t.rstrip && /[\u0085\ufeff]/u.test(o.spaceAfter))) {
                return "strip whitespace set";
            }
        }
    }
    return null;
}

// Decoding exactly: keep special tokens, no clean-up of spaces before punctuation.
const DECODE_OPTIONS = { skip_special_tokens: false, clean_up_tokenization_spaces: false };

const same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);

// GPT-2's byte-to-character table, in which tokenizers.js's ByteLevel step returns its pieces.
const BYTE_CHARS = (() => {
    const direct = [];
    for (let b = 0x21; b <= 0x7e; ++b) direct.push(b);
    for (let b = 0xa1; b <= 0xac; ++b) direct.push(b);
    for (let b = 0xae; b <= 0xff; ++b) direct.push(b);
    const table = new Array(256);
    let next = 256;
    for (let b = 0; b < 256; ++b) {
        table[b] = String.fromCodePoint(direct.includes(b) ? b : next++);
    }
    return table;
})();
const byteLevel = (piece) => Array.from(new TextEncoder().encode(piece), (b) => BYTE_CHARS[b])
    .join("");

async function check(model, tool, hf, hfPlain, text) {
    // The pre-tokenizer's split, compared directly: with a small vocabulary, two different splits
    // often encode to the same ids.
    const piecesOurs = (await tool.split(text)).map(byteLevel);
    const normalized = hf.normalizer ? hf.normalizer(text) : text;
    const piecesTheirs = hf.pre_tokenizer ? hf.pre_tokenizer(normalized) : [normalized];
    if (!same(piecesOurs, piecesTheirs)) {
        return { mode: "pre-tokenizer split", ours: piecesOurs, theirs: piecesTheirs };
    }
    const ours = await tool.encode(text, true);
    const theirs = hf.encode(text, { add_special_tokens: false }).ids;
    if (!same(ours, theirs)) return { mode: "encode, special tokens parsed", ours, theirs };
    const oursPlain = await tool.encode(text, false);
    const theirsPlain = hfPlain.encode(text, { add_special_tokens: false }).ids;
    if (!same(oursPlain, theirsPlain)) {
        return { mode: "encode, special tokens not parsed", ours: oursPlain, theirs: theirsPlain };
    }
    for (const ids of [ours, oursPlain]) {
        if (ids.length === 0) continue;
        const a = await tool.decode(ids);
        const b = hf.decode(ids, DECODE_OPTIONS);
        if (a !== b) return { mode: "decode", ids, ours: a, theirs: b };
    }
    return null;
}

// Greedily drops code points (in shrinking chunks) while the case still fails the same way.
async function shrink(model, tool, hf, hfPlain, text, failure) {
    let chars = Array.from(text);
    for (let chunk = Math.max(1, chars.length >> 1); chunk >= 1; chunk >>= 1) {
        for (let i = 0; i + chunk <= chars.length;) {
            const candidate = [...chars.slice(0, i), ...chars.slice(i + chunk)].join("");
            const f = candidate.length > 0 && !knownJsDeparture(model, candidate)
                ? await check(model, tool, hf, hfPlain, candidate) : null;
            if (f && f.mode === failure.mode) {
                chars = Array.from(candidate);
                failure = f;
            } else {
                i += 1;
            }
        }
    }
    return { text: chars.join(""), failure };
}

// Long runs of one class (a character repeated, a base64 blob): one long match for the regex
// and one long word for BPE, where a backtracking or stack limit would show.
function longRuns() {
    const bytes = 16 * 1024;
    const rng = mulberry32(7);
    const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let base64 = "";
    while (base64.length < bytes) base64 += alphabet[Math.floor(rng() * 64)];
    const units = ["a", "A", "\u00e9", "\u4e2d", "7", " ", "!", "\n", "\r\n", "\t", "\u{1f600}",
        "aB"];
    const runs = units.map((u) => u.repeat(Math.floor(bytes / Buffer.byteLength(u))));
    return [...runs, " " + "A".repeat(bytes), base64];
}

async function crosscheck(model, seed) {
    const hf = new Tokenizer(model.json, model.config);
    const plainJson = structuredClone(model.json);
    plainJson.added_tokens = [];
    const hfPlain = new Tokenizer(plainJson, model.config);
    const tool = new Tool(model.dir);
    const rng = mulberry32(seed);
    const specials = model.json.added_tokens.map((t) => t.content);
    const evalFile = path.join(root, "tests/fixtures/fortunes-qwen3-moe/eval.txt");
    const evalLines = fs.readFileSync(evalFile, "utf8").split("\n").filter((l) => l.length > 0);

    const texts = [];
    for (let i = 0; i < casesPer; ++i) texts.push(randomText(rng, specials, evalLines));
    texts.push(fs.readFileSync(evalFile, "utf8"));
    texts.push(...longRuns());
    const failures = [];
    const skipped = {};
    for (const text of texts) {
        const why = knownJsDeparture(model, text);
        if (why) {
            skipped[why] = (skipped[why] ?? 0) + 1;
            continue;
        }
        const f = await check(model, tool, hf, hfPlain, text);
        if (f) failures.push({ text, failure: f });
        if (failures.length >= 3) break;
    }
    // Random id sequences decode alike too (invalid UTF-8 replaced on both sides).
    const limit = hf.get_vocab(true).size;
    let decodeFailure = null;
    for (let i = 0; i < 300 && !decodeFailure; ++i) {
        const ids = Array.from({ length: 1 + Math.floor(rng() * 8) },
            () => Math.floor(rng() * limit));
        const a = await tool.decode(ids);
        const b = hf.decode(ids, DECODE_OPTIONS);
        if (a !== b) decodeFailure = { ids, ours: a, theirs: b };
    }
    const shrunk = [];
    for (const { text, failure } of failures) {
        shrunk.push(await shrink(model, tool, hf, hfPlain, text, failure));
    }
    await tool.close();
    return { checked: texts.length, skipped, failures: shrunk, decodeFailure };
}

async function main() {
    const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tokenizer-crosscheck-"));
    let bad = 0;
    try {
        const models = [...fixtures(), ...variants(tmp)];
        for (const [i, model] of models.entries()) {
            const r = await crosscheck(model, 1000 + i);
            const skips = Object.entries(r.skipped).map(([k, n]) => `${n} ${k}`).join(", ");
            console.log(`${model.name}: ${r.checked} strings`
                + (skips ? ` (skipped: ${skips})` : "")
                + (r.failures.length || r.decodeFailure ? " MISMATCH" : " ok"));
            for (const { text, failure } of r.failures) {
                bad += 1;
                console.log(`  ${failure.mode}: ${JSON.stringify(text)}`);
                if (failure.ids) console.log(`    ids:    ${JSON.stringify(failure.ids)}`);
                console.log(`    ours:   ${JSON.stringify(failure.ours)}`);
                console.log(`    theirs: ${JSON.stringify(failure.theirs)}`);
            }
            if (r.decodeFailure) {
                bad += 1;
                console.log(`  decode of random ids ${JSON.stringify(r.decodeFailure.ids)}`);
                console.log(`    ours:   ${JSON.stringify(r.decodeFailure.ours)}`);
                console.log(`    theirs: ${JSON.stringify(r.decodeFailure.theirs)}`);
            }
        }
    } finally {
        fs.rmSync(tmp, { recursive: true, force: true });
    }
    if (bad > 0) {
        console.log(`${bad} mismatching case(s)`);
        process.exit(1);
    }
    console.log("tokenizer agrees with tokenizers.js");
}

await main();
