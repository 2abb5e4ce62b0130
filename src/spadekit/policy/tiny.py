"""A tiny, randomly initialised chat model built in code: for tests, benchmarks and ``--model tiny``.

Byte-level tokenizer (256 byte tokens plus four specials, so any text round-trips exactly), a
ChatML chat template like SmolLM2's, and a 2-layer Llama with a 64-wide residual stream (about
70k parameters). Deterministic for a given seed; needs no download.
"""

from __future__ import annotations

import json
from typing import Any

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>")

CHAT_TEMPLATE = (
    "{%- if tools %}{{ '<|im_start|>system\\nTools:\\n' }}"
    "{%- for tool in tools %}{{ tool | tojson }}{{ '\\n' }}{%- endfor %}"
    "{{ '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)


def tiny_tokenizer():
    """A byte-level ``PreTrainedTokenizerFast`` with a ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    alphabet = ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIALS))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>",
                                   eos_token="<|im_end|>", pad_token="<|pad|>",
                                   unk_token=None)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_model(seed: int = 0, vocab_size: int | None = None, hidden: int = 64, layers: int = 2):
    """A randomly initialised ``LlamaForCausalLM`` (fp32, eval mode), deterministic per seed."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok_size = vocab_size or len(tiny_tokenizer())
    config = LlamaConfig(vocab_size=tok_size, hidden_size=hidden, intermediate_size=hidden * 2,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=16384, tie_word_embeddings=True,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.eval()
    return model


def describe(model: Any) -> str:
    n = sum(p.numel() for p in model.parameters())
    return json.dumps({"parameters": n, "layers": model.config.num_hidden_layers,
                       "hidden": model.config.hidden_size, "vocab": model.config.vocab_size})


def load_tiny_policy(spec: str = "tiny", seed: int = 0, **_options: Any):
    """The registry's ``tiny`` backend: ``tiny`` or ``tiny:SEED``."""
    from spadekit.policy.hf import HFPolicy

    if ":" in spec:
        seed = int(spec.split(":", 1)[1])
    return HFPolicy(tiny_model(seed), tiny_tokenizer(), name="tiny", seed=seed)
