"""Checks a model directory imported from GGUF by mlx-gguf.

    python gguf_check.py <model_dir> [--gguf FILE] [--expect WORD] [--max-tokens N]

1. mlx-lm loads the directory (`mlx_lm.load`) and greedily generates for a chat prompt
   ("What is the capital of France?"); the answer must contain --expect (default Paris),
   and the plain prompt "The capital of France is" must continue with it too.
2. With --gguf, the produced tokenizer.json is checked against an independent byte-level
   BPE written here from the GGUF's own vocabulary and merges, splitting text the way
   llama.cpp does for the file's `tokenizer.ggml.pre`: every test text must tokenize to the
   same ids through (a) the `tokenizers` library on tokenizer.json, (b) the tokenizer
   mlx-lm loads, and (c) the reference; decode(encode(text)) must give the text back; a
   chat prompt must contain the special tokens as single ids.
3. With --rope-check (llama): re-applying llama.cpp's Q/K row permutation and switching to
   interleaved RoPE (the GGUF's own formulation) must reproduce the logits.

Helpers for the mlx-gguf SentencePiece test:
    python gguf_check.py spm-fixture <dir>        # train a small SPM BPE model, write spm.json
    python gguf_check.py spm-compare <model_dir> <dir>/spm.json
    python gguf_check.py kquant-goldens goldens/gguf/blocks.json  # needs the `gguf` package

Prints one JSON summary line and exits non-zero on the first failed check.
"""

import argparse
import json
import sys
from pathlib import Path

import regex

TEXTS = [
    "Hello world",
    "The capital of France is",
    "  leading and trailing spaces  ",
    "multiple   internal    spaces",
    "tabs\tand\nnewlines\r\nmixed\n\n\n",
    "I'm sure they'll say it's fine, don't you think? We've seen it.",
    "Numbers 12345 and 3.14159 and 1,000,000",
    "Café naïve résumé façade Ångström",
    "你好，世界！这是一个测试。",
    "Россия и Українa",
    "Emoji: 😀👍🏽🇺🇸 and ❤️",
    "def foo(x):\n    return x ** 2  # comment",
    "Punctuation!!! ??? ... --- (parens) [brackets] {braces}",
    "ABC123def456",
    "<|im_start|> is a special token, <|im_end|> too",
    "x" * 50 + " " + "ab" * 30,
]

# llama.cpp's split expressions per `tokenizer.ggml.pre` (applied in sequence; text that
# no expression matches stays a piece of its own).
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
SPLITS = {
    "smollm": [r"\p{N}", GPT2],
    "starcoder": [r"\p{N}", GPT2],
    "refact": [r"\p{N}", GPT2],
    "gpt-2": [GPT2],
    "qwen2": [
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)"
    ],
    "llama-bpe": [
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)"
    ],
}


def byte_alphabet():
    printable = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


class ReferenceBpe:
    """Byte-level BPE as llama.cpp runs it, from the GGUF vocabulary alone."""

    def __init__(self, tokens, merges, token_types, pre):
        if pre not in SPLITS:
            raise SystemExit(f"no reference split for pre-tokenizer {pre!r}")
        self.splits = [regex.compile(p) for p in SPLITS[pre]]
        self.ids = {}
        for i, t in enumerate(tokens):
            self.ids.setdefault(t, i)
        self.ranks = {tuple(m.split(" ", 1)): r for r, m in enumerate(merges)}
        self.bytes = byte_alphabet()
        self.specials = sorted(
            (t for t, ty in zip(tokens, token_types) if ty in (3, 4)), key=len, reverse=True
        )

    def _pieces(self, text):
        pieces = [text]
        for rx in self.splits:
            out = []
            for p in pieces:
                pos = 0
                for m in rx.finditer(p):
                    if m.start() > pos:
                        out.append(p[pos : m.start()])
                    if m.end() > m.start():
                        out.append(m.group())
                    pos = m.end()
                if pos < len(p):
                    out.append(p[pos:])
            pieces = out
        return pieces

    def _bpe(self, word):
        parts = list(word)
        while len(parts) > 1:
            best = min(
                range(len(parts) - 1),
                key=lambda i: self.ranks.get((parts[i], parts[i + 1]), float("inf")),
            )
            if (parts[best], parts[best + 1]) not in self.ranks:
                break
            parts[best : best + 2] = [parts[best] + parts[best + 1]]
        return [self.ids[p] for p in parts]

    def encode(self, text):
        ids = []
        segments = [text]
        for sp in self.specials:
            nxt = []
            for s in segments:
                if isinstance(s, int):
                    nxt.append(s)
                    continue
                chunks = s.split(sp)
                for j, c in enumerate(chunks):
                    if j:
                        nxt.append(self.ids[sp])
                    if c:
                        nxt.append(c)
            segments = nxt
        for s in segments:
            if isinstance(s, int):
                ids.append(s)
                continue
            for piece in self._pieces(s):
                word = "".join(self.bytes[b] for b in piece.encode("utf-8"))
                ids.extend(self._bpe(word))
        return ids


def fail(msg, **data):
    print(json.dumps({"ok": False, "error": msg, **data}, ensure_ascii=False))
    sys.exit(1)


def check_tokenizer(model_dir, gguf, summary):
    import mlx.core as mx
    from tokenizers import Tokenizer
    from mlx_lm import load as _  # noqa: F401  (import check)
    from mlx_lm.utils import load_tokenizer

    _, md = mx.load(str(gguf), return_metadata=True)
    tokens = md["tokenizer.ggml.tokens"]
    merges = md["tokenizer.ggml.merges"]
    types = md["tokenizer.ggml.token_type"].tolist()
    pre = md.get("tokenizer.ggml.pre", "default")
    ref = ReferenceBpe(tokens, merges, types, pre)
    fast = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    wrapper = load_tokenizer(model_dir)
    hf = wrapper._tokenizer
    for text in TEXTS:
        want = ref.encode(text)
        got_fast = fast.encode(text, add_special_tokens=False).ids
        got_hf = hf.encode(text, add_special_tokens=False)
        if got_fast != want or got_hf != want:
            fail("tokenization differs", text=text, reference=want, tokenizers=got_fast, mlx_lm=got_hf)
        back = fast.decode(got_fast, skip_special_tokens=False)
        if back != text:
            fail("decode(encode(text)) != text", text=text, decoded=back)
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    ids = hf.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    start, end = hf.convert_tokens_to_ids("<|im_start|>"), hf.convert_tokens_to_ids("<|im_end|>")
    if start is not None and ids.count(start) != 3 or end is not None and ids.count(end) != 2:
        fail("chat prompt does not hold the expected special tokens", ids=ids)
    summary["tokenizer_texts"] = len(TEXTS)
    summary["chat_prompt_ids"] = ids[:8]


def llama_cpp_permute(w, heads):
    """convert_hf_to_gguf's permutation of Q/K rows (HF half-split -> interleaved RoPE)."""
    shape = w.shape
    return w.reshape(heads, 2, shape[0] // heads // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def check_rope_layout(model_dir, summary):
    """Re-applying llama.cpp's Q/K permutation and switching to interleaved (traditional)
    RoPE is the GGUF's own formulation of the same model: its logits must match the
    imported model's, while the permuted weights with half-split RoPE must not."""
    import mlx.core as mx
    from mlx_lm import load

    model, tok = load(str(model_dir))
    cfg = json.loads((model_dir / "config.json").read_text())
    if cfg["model_type"] != "llama":
        return
    ids = mx.array([tok.encode("The quick brown fox jumps over the lazy dog. " * 3)])
    base = model(ids).astype(mx.float32)

    def permuted(traditional):
        m, _ = load(str(model_dir), model_config={"rope_traditional": traditional})
        heads = {"q_proj": cfg["num_attention_heads"], "k_proj": cfg["num_key_value_heads"]}
        for layer in m.model.layers:
            for name, h in heads.items():
                proj = getattr(layer.self_attn, name)
                for leaf in ("weight", "scales", "biases", "bias"):
                    if leaf in proj:
                        proj[leaf] = llama_cpp_permute(proj[leaf], h)
            if traditional:
                assert layer.self_attn.rope.traditional
        return m(ids).astype(mx.float32)

    same = mx.abs(permuted(True) - base).max().item()
    wrong = mx.abs(permuted(False) - base).max().item()
    summary["rope_check"] = {"interleaved_max_diff": same, "unpermuted_max_diff": wrong}
    if not (same < 1e-2 and wrong > 1.0):
        fail("Q/K rows are not in the Hugging Face order", **summary["rope_check"])


def check_generation(model_dir, expect, max_tokens, summary):
    from mlx_lm import generate, load

    model, tok = load(str(model_dir))
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    answer = generate(model, tok, prompt, max_tokens=max_tokens, verbose=False)
    plain = generate(model, tok, "The capital of France is", max_tokens=max_tokens, verbose=False)
    summary["chat_answer"] = answer
    summary["plain_continuation"] = plain
    if expect not in answer or expect not in plain:
        fail(f"generation does not mention {expect!r}", chat=answer, plain=plain)


SPM_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Sphinx of black quartz, judge my vow!",
    "Pack my box with five dozen liquor jugs; then they were lost.",
    "How vexingly quick daft zebras jump, and how the river flows!",
    "In 2024 the model read 12,345 tokens at 3.5 tokens per second.",
    "def hello(name):\n    return 'hello ' + name\n",
    "Les élèves étudient à l'école; naïve café résumé.",
    "Tokenizers split text into pieces, then merge the pieces again.",
]
SPM_TEXTS = [
    "Hello world",
    "The quick brown fox",
    " leading space and  double  spaces ",
    "line one\nline two\n\n",
    "numbers 1234567 and 3.14",
    "unicode: 你好 ✓ Ωmega",
    "quartz jugs zebras",
    "tab\tseparated",
]


def spm_fixture(out_dir):
    """Trains a small SentencePiece BPE model (llama-style settings) and writes its
    pieces, scores and types plus the ids SentencePiece itself gives for SPM_TEXTS."""
    import sentencepiece as spm

    out_dir.mkdir(parents=True, exist_ok=True)
    corpus = out_dir / "corpus.txt"
    corpus.write_text("\n".join(SPM_CORPUS * 20) + "\n")
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(out_dir / "spm"),
        model_type="bpe",
        vocab_size=480,
        byte_fallback=True,
        character_coverage=1.0,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=True,
        user_defined_symbols=["<think>"],
        num_threads=1,
        minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_file=str(out_dir / "spm.model"))
    types = []
    for i in range(sp.get_piece_size()):
        if sp.is_unknown(i):
            types.append(2)
        elif sp.is_control(i):
            types.append(3)
        elif sp.is_byte(i):
            types.append(6)
        elif sp.is_unused(i):
            types.append(5)
        elif sp.id_to_piece(i) == "<think>":
            types.append(4)
        else:
            types.append(1)
    fixture = {
        "tokens": [sp.id_to_piece(i) for i in range(sp.get_piece_size())],
        "scores": [sp.get_score(i) for i in range(sp.get_piece_size())],
        "types": types,
        "texts": SPM_TEXTS,
        "ids": [sp.encode(t) for t in SPM_TEXTS],
    }
    (out_dir / "spm.json").write_text(json.dumps(fixture, ensure_ascii=False))
    print(json.dumps({"ok": True, "pieces": len(types)}))


def spm_compare(model_dir, fixture_path):
    """The tokenizer mlx-lm loads from the imported directory gives SentencePiece's ids
    (plus BOS) and decodes them back."""
    from mlx_lm.utils import load_tokenizer

    fx = json.loads(Path(fixture_path).read_text())
    tok = load_tokenizer(model_dir)
    hf = tok._tokenizer
    for text, want in zip(fx["texts"], fx["ids"]):
        got = hf.encode(text, add_special_tokens=True)
        if got != [hf.bos_token_id] + want:
            fail("SentencePiece tokenization differs", text=text, sentencepiece=want, mlx_lm=got)
        back = hf.decode(got, skip_special_tokens=True)
        if back != text:
            fail("decode(encode(text)) != text", text=text, decoded=back)
    detok = tok.detokenizer
    detok.reset()
    for i in hf.encode(fx["texts"][0], add_special_tokens=False):
        detok.add_token(i)
    detok.finalize()
    if detok.text != fx["texts"][0]:
        fail("streaming detokenizer differs", text=fx["texts"][0], streamed=detok.text)
    print(json.dumps({"ok": True, "texts": len(fx["texts"]), "detokenizer": type(detok).__name__}))


# ggml block layouts: (type id, name, elements per block, bytes per block, offsets of f16 fields)
KQUANT_TYPES = [
    (2, "Q4_0", 32, 18, [0]),
    (3, "Q4_1", 32, 20, [0, 2]),
    (6, "Q5_0", 32, 22, [0]),
    (7, "Q5_1", 32, 24, [0, 2]),
    (8, "Q8_0", 32, 34, [0]),
    (10, "Q2_K", 256, 84, [80, 82]),
    (11, "Q3_K", 256, 110, [108]),
    (12, "Q4_K", 256, 144, [0, 2]),
    (13, "Q5_K", 256, 176, [0, 2]),
    (14, "Q6_K", 256, 210, [208]),
]


def kquant_goldens(out_path):
    """Random blocks of every block type and their values according to llama.cpp's own
    Python reference (the `gguf` package: `gguf.quants.dequantize`), for mlx-gguf's decoder
    tests. Needs `gguf` importable (e.g. PYTHONPATH of `pip install --target DIR gguf`)."""
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    rng = np.random.default_rng(20251130)
    out = {"source": "gguf.quants.dequantize (gguf-py)", "elements": 512, "types": []}
    for type_id, name, per_block, block_bytes, f16_fields in KQUANT_TYPES:
        blocks = 512 // per_block
        raw = bytearray(rng.integers(0, 256, size=blocks * block_bytes, dtype=np.uint8).tobytes())
        for b in range(blocks):
            for off in f16_fields:
                v = np.float16(rng.uniform(-0.05, 0.05) if off and name in ("Q4_1", "Q5_1") else rng.uniform(0.001, 0.05))
                raw[b * block_bytes + off : b * block_bytes + off + 2] = v.tobytes()
        data = np.frombuffer(bytes(raw), dtype=np.uint8).reshape(2, -1)
        values = dequantize(data, GGMLQuantizationType(type_id)).astype(np.float32).reshape(-1)
        out["types"].append(
            {"type": type_id, "name": name, "hex": bytes(raw).hex(), "values": [float(v) for v in values]}
        )
    Path(out_path).write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print(json.dumps({"ok": True, "types": [t[1] for t in KQUANT_TYPES]}))


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "kquant-goldens":
        return kquant_goldens(sys.argv[2])
    if len(sys.argv) == 3 and sys.argv[1] == "spm-fixture":
        return spm_fixture(Path(sys.argv[2]))
    if len(sys.argv) == 4 and sys.argv[1] == "spm-compare":
        return spm_compare(Path(sys.argv[2]), sys.argv[3])
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--gguf", type=Path)
    ap.add_argument("--expect", default="Paris")
    ap.add_argument("--max-tokens", type=int, default=12)
    ap.add_argument("--skip-generation", action="store_true")
    ap.add_argument("--rope-check", action="store_true")
    args = ap.parse_args()
    summary = {"ok": True, "model_dir": str(args.model_dir)}
    if args.gguf:
        check_tokenizer(args.model_dir, args.gguf, summary)
    if args.rope_check:
        check_rope_layout(args.model_dir, summary)
    if not args.skip_generation:
        check_generation(args.model_dir, args.expect, args.max_tokens, summary)
    print(json.dumps(summary, ensure_ascii=False))


if __name__ == "__main__":
    main()
