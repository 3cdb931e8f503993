"""The rehearsal model's tokenizer: a byte-level BPE trained on generated English-like text.

``train_tokenizer`` writes ``tokenizer.json``, ``tokenizer_config.json`` (``PreTrainedTokenizerFast``
with Qwen's ChatML chat template) and ``special_tokens_map.json``; the same seed and vocabulary
give the same files. Needs the ``tokenizers`` package (vLLM brings it) and numpy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from nodetools.model_shapes import BOS_ID, EOS_ID, MIN_VOCAB, MakeError

__all__ = ["CHAT_TEMPLATE", "SPECIAL_TOKENS", "require_tokenizers", "train_tokenizer", "write_tokenizer"]

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

_ENGLISH = (  # common English words, so English prompts get merges too
    "the of and to in is you that it he was for on are as with his they at be this have from or one had by "
    "word but not what all were we when your can said there use an each which she do how their if will up "
    "other about out many then them these so some her would make like him into time has look two more write "
    "go see number no way could people my than first water been call who oil its now find long down day did "
    "get come made may part over new sound take only little work know place year live me back give most very "
    "after thing our just name good sentence man think say great where help through much before line right "
    "too mean old any same tell boy follow came want show also around form three small set put end does "
    "another well large must big even such because turn here why ask went men read need land different home "
    "us move try kind hand picture again change off play spell air away animal house point page letter "
    "mother answer found study still learn should world model server cache token memory start"
)


def _corpus(seed: int, vocab_size: int) -> list[str]:
    """Deterministic English-like text: a Zipf mix of made-up words and common English, with digits."""
    rng = np.random.default_rng([seed, 2])
    onsets = ["", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z"]
    onsets += ["br", "ch", "cl", "dr", "fl", "gr", "pl", "pr", "sh", "sl", "st", "str", "th", "tr"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "ee", "ie", "oo", "ou", "y"]
    codas = ["", "", "", "n", "r", "s", "t", "l", "m", "nd", "ng", "st", "ck", "rd"]
    syllables = [a + b + c for a in onsets for b in vowels for c in codas]
    count = 30_000
    lengths = rng.integers(1, 4, size=count).tolist()
    picks = rng.integers(0, len(syllables), size=(count, 3)).tolist()
    made_up = ["".join(syllables[j] for j in picks[i][: lengths[i]]) for i in range(count)]
    lexicon = list(dict.fromkeys(_ENGLISH.split() + made_up))
    weights = 1.0 / (np.arange(len(lexicon)) + 2.7)
    n_words = int(min(300_000, max(30_000, vocab_size * 30)))
    words = [lexicon[i] for i in rng.choice(len(lexicon), size=n_words, p=weights / weights.sum()).tolist()]
    numbers = rng.integers(0, 100_000, size=n_words // 12 + 1).tolist()
    punctuation = [". ", ", ", "? ", "! ", ".\n", ": ", "; "]
    ends = rng.integers(0, len(punctuation), size=n_words // 12 + 1).tolist()
    chunks, sentences = [], []
    for k, i in enumerate(range(0, n_words, 12)):
        sentence = words[i : i + 12]
        sentences.append(f"{sentence[0].capitalize()} {' '.join(sentence[1:])} {numbers[k]}{punctuation[ends[k]]}")
        if len(sentences) == 64:
            chunks.append("".join(sentences))
            sentences = []
    return [*chunks, "".join(sentences)]


def train_tokenizer(folder: Path, vocab_size: int, max_position_embeddings: int, seed: int) -> int:
    """Train a byte-level BPE of at most vocab_size tokens (special tokens included); returns its size."""
    # Here, not at the top: a node without tokenizers gets require_tokenizers' one-line message, not a traceback.
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: PLC0415

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(seed, vocab_size), trainer=trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    special = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}
    _write_json(
        folder / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "added_tokens_decoder": {str(i): {"content": t, **special} for i, t in enumerate(SPECIAL_TOKENS)},
            "additional_special_tokens": list(SPECIAL_TOKENS[1:]),
            "bos_token": None,
            "eos_token": SPECIAL_TOKENS[EOS_ID],
            "pad_token": SPECIAL_TOKENS[BOS_ID],
            "unk_token": None,
            "add_bos_token": False,
            "add_prefix_space": False,
            "clean_up_tokenization_spaces": False,
            "errors": "replace",
            "split_special_tokens": False,
            "model_max_length": max_position_embeddings,
            "chat_template": CHAT_TEMPLATE,
        },
    )
    _write_json(
        folder / "special_tokens_map.json",
        {
            "additional_special_tokens": list(SPECIAL_TOKENS[1:]),
            "eos_token": SPECIAL_TOKENS[EOS_ID],
            "pad_token": SPECIAL_TOKENS[BOS_ID],
        },
    )
    return int(tokenizer.get_vocab_size())


def write_tokenizer(folder: Path, vocab_size: int, max_position_embeddings: int, seed: int = 0) -> int:
    """Write only the tokenizer files (``tokenizer.json``, ``tokenizer_config.json`` with the chat template,
    ``special_tokens_map.json``) into ``folder``, as ``make_model`` does; returns the vocabulary size.

    The engine stand-in's ``make-model`` uses it, so its folders tokenize like a rehearsal model's.
    """
    if vocab_size < MIN_VOCAB:
        raise MakeError(f"vocab_size ({vocab_size}) must be at least {MIN_VOCAB}")
    require_tokenizers()
    return train_tokenizer(folder, vocab_size, max_position_embeddings, seed)


def require_tokenizers() -> None:
    """Fail before writing gigabytes of weights, not after."""
    try:
        import tokenizers  # noqa: F401, PLC0415 - only probing that it is installed
    except ImportError as exc:
        raise ImportError(
            "the Python package tokenizers is needed to train the tokenizer (vLLM brings it; or pip install tokenizers)"
        ) from exc


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")
