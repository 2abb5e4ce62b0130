"""A scripted policy: answers come from a function, not a model.

For measuring the framework without model time (benchmarks), for end-to-end tests that need
meaningful answers (a designer that returns library programs, an agent that plays solutions),
and for replaying recorded conversations. It speaks the real protocol: answers are tokenised
with a real tokenizer (canonical ids, then the end-of-turn token), logprobs are reported as 0.0
(a deterministic policy), and the tokenizer's chat template renders prompts.
"""

from __future__ import annotations

from typing import Any, Callable

from spadekit.policy.base import (Generation, GenerationRequest, PolicyError, TemplatePolicy,
                                  cut_at_stop, encode_texts)

Responder = Callable[[list[int], str], str]
"""(prompt ids, decoded prompt text) -> the answer text."""


class ScriptedPolicy(TemplatePolicy):
    capabilities = frozenset({"token_ids", "logprobs"})

    def __init__(self, tokenizer: Any, respond: Responder, name: str = "scripted",
                 end_token: str | None = None, decode_prompt: bool = True) -> None:
        self.tokenizer = tokenizer
        self.respond = respond
        self.name = name
        end = end_token or tokenizer.eos_token
        if end is None or end not in tokenizer.get_vocab():
            raise PolicyError("the scripted policy needs an end-of-turn token in the vocabulary")
        self.end_id = tokenizer.get_vocab()[end]
        self.decode_prompt = decode_prompt
        """False: the responder gets "" instead of the decoded prompt (for benchmarks)."""
        self.calls = 0

    def generate(self, requests: list[GenerationRequest]) -> list[Generation]:
        from spadekit.policy.grammar import refuse_grammar

        refuse_grammar(self, requests)
        out = []
        answers = []
        for req in requests:
            prompt = list(req.prompt_ids) if req.prompt_ids is not None else self.render(
                req.messages, True, req.tools, req.chat_template_kwargs)
            text = self.respond(prompt, self.tokenizer.decode(prompt) if self.decode_prompt
                                else "")
            answers.append((req, prompt) + cut_at_stop(text, req.params.stop))
        encoded = encode_texts(self.tokenizer, [a[2] for a in answers])
        for (req, prompt, text, stopped), ids in zip(answers, encoded):
            finish = "stop"
            if len(ids) + 1 > req.params.max_new_tokens:
                ids, finish = ids[:req.params.max_new_tokens], "length"
                text = self.tokenizer.decode(ids, skip_special_tokens=True)
            elif not stopped:
                ids = ids + [self.end_id]
            self.calls += 1
            out.append(Generation(prompt_ids=prompt, token_ids=ids, logprobs=[0.0] * len(ids),
                                  text=text, finish_reason=finish))
        return out
