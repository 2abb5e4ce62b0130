"""Flaky rates: convert money with a live exchange-rate API that fails in several ways.

The live API answers the first one or two calls with transient errors (rate limit, timeout) that
succeed on retry, and it permanently rejects pairs that do not involve USD, so those must be
converted through USD. A cache tool always answers but with stale rates, a tempting but wrong
fallback. Checks: exactly one submission, and the submitted amount matches the live-rate result.
"""

import random

from spadekit.envs.actions import format_tool_call
from spadekit.envs.tooluse import ToolEnv, ToolError

SKILL = "Error_Recovery"
SETTING = "tooluse"
HINT = (
    "Tell transient errors (retry them) from permanent ones (change the request); do not settle "
    "for stale fallback data when the task asks for live values, and submit only once."
)
TAGS = ["retries", "fallbacks", "currency-conversion"]

USD_RATES = {"EUR": 0.92, "GBP": 0.79, "JPY": 151.0, "CHF": 0.88, "CAD": 1.36, "AUD": 1.52}
TRANSIENT = ["HTTP 429 Too Many Requests: rate limit exceeded, retry shortly",
             "HTTP 503 Service Unavailable: upstream timeout, please retry"]


class FlakyRatesEnv(ToolEnv):
    """Currency conversion against an unreliable live API."""

    def setup(self, rng: random.Random) -> str:
        codes = sorted(USD_RATES)
        # live units of each currency per 1 USD, jittered per episode; the cache is a few % off
        self.live = {c: round(r * rng.uniform(0.95, 1.05), 4) for c, r in USD_RATES.items()}
        self.cache = {c: round(r * rng.choice([0.97, 0.98, 1.02, 1.03]), 4)
                      for c, r in self.live.items()}
        self.live["USD"] = self.cache["USD"] = 1.0
        self.base, self.quote = rng.sample(codes + ["USD"], 2)
        self.amount = rng.choice([120, 250, 480, 1000, 1500, 3200])
        self.failures_left = self.failures = rng.randint(1, 2)
        self.submissions = []
        self.legs = ([(self.base, self.quote)] if "USD" in (self.base, self.quote)
                     else [(self.base, "USD"), ("USD", self.quote)])
        rate = 1.0
        for base, quote in self.legs:
            rate *= self._rate(self.live, base, quote)
        self.expected = round(self.amount * rate, 2)
        return (f"Convert {self.amount} {self.base} to {self.quote} using LIVE exchange rates and "
                "submit the converted amount, rounded to 2 decimals, with submit_conversion.")

    @staticmethod
    def _rate(table, base, quote):
        """Units of `quote` per 1 unit of `base`, rounded as the APIs report it."""
        return round(table[quote] / table[base], 6)

    def _codes(self, base, quote):
        base, quote = base.strip().upper(), quote.strip().upper()
        for code in (base, quote):
            if code not in self.live:
                raise ToolError(f"unknown currency {code!r}; known: {', '.join(sorted(self.live))}")
        return base, quote

    def tool_get_live_rate(self, base: str, quote: str) -> dict:
        """Live exchange rate: units of `quote` per 1 `base`. Only pairs involving USD are quoted.

        Args:
            base: Currency code to convert from, e.g. "EUR".
            quote: Currency code to convert to, e.g. "USD".
        """
        base, quote = self._codes(base, quote)
        if self.failures_left > 0:
            self.failures_left -= 1
            raise ToolError(TRANSIENT[self.failures_left % len(TRANSIENT)])
        if "USD" not in (base, quote):
            raise ToolError(f"pair {base}/{quote} not supported: every live rate is quoted "
                            "against USD (request BASE/USD and USD/QUOTE)")
        rate = self._rate(self.live, base, quote)
        return {"base": base, "quote": quote, "rate": rate, "as_of": "live"}

    def tool_get_cached_rate(self, base: str, quote: str) -> dict:
        """Cached exchange rate for any pair; always available but may be out of date.

        Args:
            base: Currency code to convert from.
            quote: Currency code to convert to.
        """
        base, quote = self._codes(base, quote)
        return {"base": base, "quote": quote, "rate": self._rate(self.cache, base, quote),
                "as_of": "cached 3 days ago"}

    def tool_submit_conversion(self, amount: float) -> str:
        """Submit the converted amount.

        Args:
            amount: The converted amount in the target currency.
        """
        self.submissions.append(amount)
        return f"received {amount}"

    def criteria(self) -> dict:
        tolerance = max(0.01, abs(self.expected) * 1e-4)
        last = self.submissions[-1] if self.submissions else None
        return {
            "single_submission": len(self.submissions) == 1,
            "amount_correct": last is not None and abs(last - self.expected) <= tolerance,
        }

    def solution(self) -> list:
        calls = [format_tool_call("get_live_rate", {"base": b, "quote": q}) for b, q in self.legs]
        retries = [calls[0]] * self.failures  # each transient failure costs one call
        rates = "".join(calls)
        submit = format_tool_call("submit_conversion", {"amount": self.expected})
        return retries + [rates, submit, "<answer>done</answer>"]
