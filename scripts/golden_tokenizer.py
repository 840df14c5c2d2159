#!/usr/bin/env python3
"""Golden data for Ember's tokenizers (src/models/tokenizer*.c), from Hugging Face's `tokenizers`.

Run:  python3 -m venv /work/venv-tok && /work/venv-tok/bin/pip install tokenizers
      /work/venv-tok/bin/python scripts/golden_tokenizer.py [OUT_DIR]
      (default tests/data/tokenizer; nothing is installed or downloaded at run time)

It trains seven small BPE tokenizers (vocabularies of 0.6k-3k) on local text: the seeds' Korean
tutorials (tests/data/tokenizer/seeds_ko.txt, copied from ../shared/seeds), Debian's
`fortunes` (plain English) and code (tests/data/tokenizer/code_sample.txt: C and Python from
Ember), one per style that Ember reads:

  gpt2        byte-level BPE, GPT-2's pre-tokenizer (ByteLevel with its regex), added tokens
              with lstrip/rstrip and single_word
  llama3      byte-level BPE after a Split with Llama 3's regex ((?i:'s|...), \\p{N}{1,3}),
              ignore_merges, a TemplateProcessing that adds <|begin_of_text|>
  qwen2       byte-level BPE after Qwen2's regex, an NFC normalizer, chat special tokens
  llama2      SentencePiece-style BPE as transformers converts Llama 2 and Mistral: a
              Prepend("▁") + Replace(" ", "▁") normalizer, no pre-tokenizer, byte fallback
              (<0x00>..<0xFF>), the decoder Replace/ByteFallback/Fuse/Strip, <s> added; an
              added token that is normalized (matched as "▁ember")
  metaspace   SentencePiece-style BPE as tokenizers builds it: NFKC, a Metaspace
              pre-tokenizer (prepend_scheme "first", split), byte fallback, a template
              "<s> $A </s>" and a ByteFallback + Metaspace decoder
  misc        the rest of what Ember reads, for coverage: merges in the older "a b" form, a
              continuing-subword prefix and end-of-word suffix, an unknown token not fused,
              Strip and regex Replace normalizers, WhitespaceSplit, Digits and Split with
              each behavior (and invert), RobertaProcessing, no decoder (tokens joined by
              spaces)
  misc2       a legacy Metaspace (add_prefix_space), unknown tokens fused, the decoders
              Replace (regex), Strip per token and after Fuse, BertProcessing (Strip's `stop`
              is left at 0: tokenizers panics where a token is shorter than it)

For each it writes OUT_DIR/<name>/tokenizer.json (saved by tokenizers itself) and
OUT_DIR/<name>/golden.txt: what tokenizers answers for a corpus of strings (Korean, emoji,
runs of whitespace and newlines, digits, code, special tokens inside text, the empty string,
invalid UTF-8). tests/test_tokenizer.c replays every line; no Python is needed there.

golden.txt, one record per line, fields separated by tabs, text as lowercase hex of UTF-8:
  version  <tokenizers version>
  vocab    <get_vocab_size(with_added_tokens=True)>
  E  <input hex>  <ids, add_special_tokens=True>  <ids, add_special_tokens=False>
     <decode(first ids)>  <decode(first ids, skip_special_tokens=True)>  <roundtrip>
     (a decode is "=" where it equals the input as tokenizers read it)
  S  <input hex>  <ids with encode_special_tokens=True (special tokens read as text),
     add_special_tokens=False>
  D  <ids>  <decode(ids)>  <decode(ids, skip_special_tokens=True)>
  K  <id>  <id_to_token(id)>
Ids are space-separated decimal ("-" for none). An input that is not valid UTF-8 is given to
tokenizers as bytes.decode("utf-8", "replace") (U+FFFD for each maximal invalid subpart,
as Rust's String::from_utf8_lossy does), which is what Ember does with such bytes.
<roundtrip> is 1 when decode(encode(x, add_special_tokens=False)) == x in tokenizers.
"""
import json
import os
import random
import sys

import tokenizers
from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                        processors, trainers)

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "data", "tokenizer")

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                  r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN2_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                 r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")


# ---- the training text -------------------------------------------------------------------------
def read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def training_text():
    korean = read(os.path.join(OUT, "seeds_ko.txt"))
    fortunes = []
    for name in ("computers", "science", "literature", "linux", "wisdom"):
        p = os.path.join("/usr/share/games/fortunes", name)
        if os.path.exists(p):
            fortunes.append(read(p))
    if not fortunes:
        sys.exit("golden_tokenizer: Debian's fortunes are missing (apt-get install fortunes)")
    code = [read(os.path.join(OUT, "code_sample.txt"))]
    lines = []
    for text in [korean] * 3 + fortunes + code:   # the Korean text thrice: more Hangul merges
        lines.extend(line for line in text.split("\n") if line.strip())
    return lines


# ---- the five tokenizers ------------------------------------------------------------------------
def train_byte_level(lines, pre_tokenizer, specials, vocab_size, **bpe):
    tok = Tokenizer(models.BPE(**bpe))
    tok.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(lines, trainer)
    tok.decoder = decoders.ByteLevel()
    return tok


def make_gpt2(lines):
    tok = train_byte_level(lines, pre_tokenizers.ByteLevel(add_prefix_space=False), ["<|endoftext|>"], 2000)
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    # added tokens that are not special: lstrip/rstrip eat the spaces around, single_word only
    # matches between non-word characters
    tok.add_tokens([AddedToken("<tool>", lstrip=True, rstrip=True, normalized=False),
                    AddedToken("Ember", single_word=True, normalized=False)])
    return tok


def make_llama3(lines):
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok = train_byte_level(lines, pre, specials, 3000, ignore_merges=True)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    return tok


def make_qwen2(lines):
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok = train_byte_level(lines, pre, specials, 2500)
    tok.normalizer = normalizers.NFC()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def train_sentencepiece_style(lines, vocab_size, limit_alphabet):
    """A BPE over ▁-prefixed words with <unk>, <s>, </s> then <0x00>..<0xFF> as the first ids,
    as Llama 2's and Mistral's vocabularies are laid out. Returns (vocab, merges)."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=["<unk>", "<s>", "</s>"],
                                  limit_alphabet=limit_alphabet, show_progress=False)
    tok.train_from_iterator(lines, trainer)
    model = json.loads(tok.to_str())["model"]
    learned = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for piece, _ in learned:
        if piece not in vocab:
            vocab[piece] = len(vocab)
    return vocab, model["merges"]


def sentencepiece_json(vocab, merges, normalizer, pre_tokenizer, decoder, post_processor):
    added = [{"id": vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for t in ("<unk>", "<s>", "</s>")]
    return json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": normalizer, "pre_tokenizer": pre_tokenizer, "post_processor": post_processor,
        "decoder": decoder,
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": merges}})


def bos_template(with_eos):
    single = [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}]
    specials = {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}
    if with_eos:
        single.append({"SpecialToken": {"id": "</s>", "type_id": 0}})
        specials["</s>"] = {"id": "</s>", "ids": [2], "tokens": ["</s>"]}
    pair = single + [{"Sequence": {"id": "B", "type_id": 1}}]
    return {"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials}


def make_llama2(lines):
    vocab, merges = train_sentencepiece_style(lines, 2000, 300)
    text = sentencepiece_json(
        vocab, merges,
        normalizer={"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                                        {"type": "Replace", "pattern": {"String": " "},
                                                         "content": "▁"}]},
        pre_tokenizer=None,
        decoder={"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        post_processor=bos_template(False))
    tok = Tokenizer.from_str(text)
    # an added token that is normalized: matched, and decoded, as "▁ember"
    tok.add_tokens([AddedToken("ember", normalized=True)])
    return tok


def make_metaspace(lines):
    vocab, merges = train_sentencepiece_style(lines, 1500, 200)
    text = sentencepiece_json(
        vocab, merges,
        normalizer={"type": "NFKC"},
        pre_tokenizer={"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": True},
        decoder={"type": "Sequence", "decoders": [
            {"type": "ByteFallback"},
            {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": True}]},
        post_processor=bos_template(True))
    return Tokenizer.from_str(text)


def make_misc(lines):
    tok = Tokenizer(models.BPE(unk_token="[UNK]", fuse_unk=False, continuing_subword_prefix="##",
                               end_of_word_suffix="</w>"))
    tok.normalizer = normalizers.Sequence([normalizers.Strip(), normalizers.Replace(Regex("``|''"), '"')])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Digits(individual_digits=False),
        pre_tokenizers.Split("-", behavior="merged_with_previous"),
        pre_tokenizers.Split(Regex("[.,;:!?]"), behavior="merged_with_next"),
        pre_tokenizers.Split(Regex("_"), behavior="removed"),
        pre_tokenizers.Split(Regex("(?i)[aeiou]{2,}"), behavior="contiguous", invert=True),
        pre_tokenizers.Split(Regex("[xyz]"), behavior="merged_with_previous", invert=True),
        pre_tokenizers.Digits(individual_digits=True)])
    trainer = trainers.BpeTrainer(vocab_size=800, min_frequency=2, special_tokens=["[UNK]", "[CLS]", "[SEP]"],
                                  limit_alphabet=60, continuing_subword_prefix="##", end_of_word_suffix="</w>",
                                  show_progress=False)
    tok.train_from_iterator(lines, trainer)
    tok.post_processor = processors.RobertaProcessing(("[SEP]", tok.token_to_id("[SEP]")),
                                                      ("[CLS]", tok.token_to_id("[CLS]")))
    return tok


def legacy_merges(doc):
    """The merges in the older form, "a b" (no token of misc has a space)."""
    doc["model"]["merges"] = [" ".join(m) for m in doc["model"]["merges"]]


def legacy_metaspace(doc):
    """The older Metaspace, before prepend_scheme: add_prefix_space true means "always"."""
    doc["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "add_prefix_space": True}


def make_misc2(lines):
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    trainer = trainers.BpeTrainer(vocab_size=600, min_frequency=2, special_tokens=["<unk>", "<cls>", "<sep>"],
                                  limit_alphabet=70, show_progress=False)
    tok.train_from_iterator(lines, trainer)
    doc = json.loads(tok.to_str())
    doc["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"Regex": "▁+"}, "content": " "},
        {"type": "Strip", "content": "e", "start": 1, "stop": 0},
        {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 2, "stop": 0}]}
    doc["post_processor"] = {"type": "BertProcessing", "sep": ["<sep>", tok.token_to_id("<sep>")],
                             "cls": ["<cls>", tok.token_to_id("<cls>")]}
    return Tokenizer.from_str(json.dumps(doc))


# ---- the corpus --------------------------------------------------------------------------------
def corpus(korean, specials):
    paragraphs = [p for p in korean.split("\n") if p.strip()]
    texts = [
        "", " ", "  ", "\n", "\n\n\n", "\t", "\r\n", "a", "Hello", " Hello", "Hello world", "hello  world",
        "Hello, world! How are you?", "   leading spaces", "trailing spaces   ", "a  b   c\t\td\n\n\ne  \n  f",
        "line one\nline two\n\nline four\r\nwindows\r\n", "tab\tseparated\tvalues\t\t",
        "I'm sure it's fine, isn't it? We'll see; they've said you'd know. IT'S I'M YOU'RE",
        "1 12 123 1234 12345 1234567890 3.14159 1,000,000 -42 +7 0x1F 1e-9 2024-06-01",
        "٣٤٥ ²³ ½ Ⅻ 𝟘𝟙 一二三", "€100 £5 ¥1000 $3.50",
        "👍 👍🏽 👨‍👩‍👧‍👦 🇰🇷🇯🇵 😀😃😄 ❤️", "tokens🙂between🙂words",
        "Ember은 C11 라이브러리입니다. PyTorch의 torch.cuda.is_available() → True",
        "GPU는 단순한 연산을 수천 개의 코어가 동시에 병렬 처리합니다.",
        "한국어 텍스트와 English text가 섞인 문장 123개",
        "ﬁ ligature, Ａ fullwidth, e\u0301 vs é, Å vs A\u030a, ㈜ ㍿",
        "nbsp\u00a0\u00a0here, nel\u0085\u0085here, mvs\u180e\u180ehere, ideographic\u3000\u3000space, "
        "line\u2028sep, zwsp\u200b\u200b, bom\ufeff",
        "int main(void) {\n    printf(\"%d\\n\", 42);\n    return 0;\n}\n",
        "def f(x):\n    return [i ** 2 for i in range(x) if i % 2 == 0]  # squares\n",
        "if (a != b && c <= d) { x += y; } else { x -= y; } /* comment */ // more",
        "    indented\n        more indented\n\t\ttabs\n",
        "x" * 300, "ab" * 200, " " * 50 + "spaces" + " " * 50, "\n" * 20, "!!!???...;;;",
        "<html><body class=\"x\">&amp;&lt;</body></html>",
        "https://example.com/path?query=1&b=two#frag user@example.com",
        "Ember", "Ember's", "Embers", "use Ember now", "xEmber", "Ember_x", "<tool>", "a <tool> b", "a  <tool>  b",
        "▁ already ▁▁ metaspace", "<0x41> <unk> looks like a byte token", "ember rocks, embers and Ember; ember",
        "``quoted'' text -- dashes-and-hyphens, snake_case_name; a.b.c!? 12-34 x1y2z3 aaa eee IOU queue",
        "  strip me  ", "eeexe eee e  e", "<cls> [CLS] [UNK] <sep>",
    ]
    texts += paragraphs[:12]
    texts.append("\n".join(paragraphs[12:24]))
    texts.append(korean[:4000])
    for s in specials:
        texts += [s, s + s, "before" + s + "after", "a " + s + " b", s + "\n" + s + " text", "  " + s + "  "]
    if specials:
        texts.append("".join(f"{s}word{i} " for i, s in enumerate(specials)))
    invalid = [b"abc\xff\xfedef", b"\xe4\xb8", b"ok\xc3(", b"\xed\xa0\x80surrogate", b"\xf4\x90\x80\x80big",
               b"\xc0\xafoverlong", b"\xe2\x82", b"trail\xf0\x9f\x98", b"\x80\x80\x80", b"mid\xe4dle"]
    return [t.encode("utf-8") for t in texts] + invalid


def hexs(b):
    return b.hex() if b else "-"


def text_or_same(decoded, text):
    return "=" if decoded == text else hexs(decoded.encode())


def ids_text(ids):
    return " ".join(map(str, ids)) if ids else "-"


def write_golden(name, tok, korean, extra_files, rewrite=None):
    """rewrite(doc) edits the saved tokenizer.json into an older form that tokenizers still
    reads (but would not write); the answers are those of the file as rewritten."""
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "tokenizer.json")
    tok.save(path)
    if rewrite:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        rewrite(doc)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2, ensure_ascii=False)
        tok = Tokenizer.from_file(path)
    for fname, content in extra_files.items():
        with open(os.path.join(d, fname), "w", encoding="utf-8") as f:
            json.dump(content, f, indent=2, ensure_ascii=False)
            f.write("\n")
    added = tok.get_added_tokens_decoder()
    specials = [t.content for _, t in sorted(added.items()) if t.special]
    rng = random.Random(1234 + len(name))
    lines = [f"version\t{tokenizers.__version__}", f"vocab\t{tok.get_vocab_size(with_added_tokens=True)}"]
    for raw in corpus(korean, specials):
        text = raw.decode("utf-8", "replace")
        tok.encode_special_tokens = False
        with_special = tok.encode(text, add_special_tokens=True).ids
        plain = tok.encode(text, add_special_tokens=False).ids
        roundtrip = int(tok.decode(plain, skip_special_tokens=False) == text)
        lines.append("\t".join(["E", hexs(raw), ids_text(with_special), ids_text(plain),
                                text_or_same(tok.decode(with_special, skip_special_tokens=False), text),
                                text_or_same(tok.decode(with_special, skip_special_tokens=True), text),
                                str(roundtrip)]))
        if any(s in text for s in specials) or "<tool>" in text:
            tok.encode_special_tokens = True
            lines.append("\t".join(["S", hexs(raw), ids_text(tok.encode(text, add_special_tokens=False).ids)]))
            tok.encode_special_tokens = False
    n = tok.get_vocab_size(with_added_tokens=True)
    # decoding ids that no encode gives: random ids (byte-level pieces that split UTF-8
    # sequences, byte-fallback tokens that form invalid UTF-8, special tokens between)
    for k in range(60):
        length = rng.randint(1, 24)
        if k % 3 == 0 and name in ("llama2", "metaspace"):
            ids = [rng.choice([rng.randint(3, 258), rng.randint(0, n - 1)]) for _ in range(length)]
        else:
            ids = [rng.randint(0, n - 1) for _ in range(length)]
        lines.append("\t".join(["D", ids_text(ids), hexs(tok.decode(ids, skip_special_tokens=False).encode()),
                                hexs(tok.decode(ids, skip_special_tokens=True).encode())]))
    for i in range(0, n, 7):
        t = tok.id_to_token(i)
        if t is not None:
            lines.append(f"K\t{i}\t{hexs(t.encode())}")
    with open(os.path.join(d, "golden.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"golden_tokenizer: {d}: vocabulary {n}, {len(lines)} records")


def main():
    lines = training_text()
    korean = read(os.path.join(OUT, "seeds_ko.txt"))
    gpt2 = make_gpt2(lines)
    write_golden("gpt2", gpt2, korean, {})
    # a model folder's configs: the ids come from generation_config.json (a list of end ids)
    # over tokenizer_config.json's token names
    llama3 = make_llama3(lines)
    write_golden("llama3", llama3, korean, {
        "tokenizer_config.json": {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
                                  "add_bos_token": True, "model_max_length": 8192},
        "generation_config.json": {"bos_token_id": llama3.token_to_id("<|begin_of_text|>"),
                                   "eos_token_id": [llama3.token_to_id("<|end_of_text|>"),
                                                    llama3.token_to_id("<|eot_id|>")]}})
    qwen2 = make_qwen2(lines)
    write_golden("qwen2", qwen2, korean, {
        "tokenizer_config.json": {"bos_token": None, "eos_token": "<|im_end|>",
                                  "pad_token": {"content": "<|endoftext|>", "lstrip": False, "normalized": False,
                                                "rstrip": False, "single_word": False, "special": True}}})
    write_golden("llama2", make_llama2(lines), korean, {
        "tokenizer_config.json": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": None}})
    write_golden("metaspace", make_metaspace(lines), korean, {})
    write_golden("misc", make_misc(lines), korean, {}, rewrite=legacy_merges)
    write_golden("misc2", make_misc2(lines), korean, {}, rewrite=legacy_metaspace)


if __name__ == "__main__":
    main()
