"""Assistant relay: pick the few relevant tools in a crowded toolbox to look up and send a value.

The task is either "email a contact the temperature in a city, in Fahrenheit" or "text a contact
a stock price in euros". Weather, stock, currency, unit, contact, email, SMS, reminder and
calendar tools are all offered, but each task needs only a lookup, possibly a conversion, the
contact directory and one messaging channel. Checks: a message on the right channel to the right
address, the correct value in it, and no other messages, reminders or events.
"""

import random
import re

from spadekit.envs.actions import format_tool_call
from spadekit.envs.tooluse import ToolEnv, ToolError

SKILL = "Tool_Selection"
SETTING = "tooluse"
HINT = (
    "Read the tool descriptions and use only the ones the task needs: look up the raw value, "
    "convert it as asked, find the contact's address, and send exactly one message."
)
TAGS = ["tool-choice", "distractor-tools", "unit-conversion"]

CONTACTS = ["Maya Brooks", "Omar Haddad", "Lena Fischer", "Raj Patel", "Sofia Marin", "Tom Okafor"]
CITIES = ["Reykjavik", "Cairo", "Quito", "Hanoi", "Montreal", "Seville"]
TICKERS = ["ACME", "GLOBX", "INITECH", "UMBRA", "VANDL", "WAYNE"]


class AssistantRelayEnv(ToolEnv):
    """Look up, convert and relay one value with a crowded toolbox."""

    def setup(self, rng: random.Random) -> str:
        self.contact = rng.choice(CONTACTS)
        self.directory = {n: {"email": n.split()[0].lower() + "@example.com",
                              "phone": f"+1-555-{rng.randint(1000, 9999)}"} for n in CONTACTS}
        self.temps = {c: round(rng.uniform(-10, 35), 1) for c in CITIES}
        self.prices = {t: round(rng.uniform(10, 400), 2) for t in TICKERS}
        self.usd_eur = round(rng.uniform(0.85, 0.98), 4)
        self.outbox, self.side_effects = [], []
        if rng.random() < 0.5:
            self.city, self.channel = rng.choice(CITIES), "email"
            self.target, self.tolerance = self.temps[self.city] * 9 / 5 + 32, 0.051
            return (f"Email {self.contact} the current temperature in {self.city} in degrees "
                    "Fahrenheit, rounded to one decimal.")
        self.ticker, self.channel = rng.choice(TICKERS), "sms"
        self.target, self.tolerance = self.prices[self.ticker] * self.usd_eur, 0.011
        return (f"Text (SMS) {self.contact} the current price of {self.ticker} stock in euros, "
                "rounded to 2 decimals.")

    def tool_get_weather(self, city: str) -> dict:
        """Current weather in a city (temperature in Celsius).

        Args:
            city: City name.
        """
        match = [c for c in CITIES if c.lower() == city.strip().lower()]
        if not match:
            raise ToolError(f"no weather station for {city!r}")
        return {"city": match[0], "temperature_c": self.temps[match[0]]}

    def tool_get_stock_quote(self, symbol: str) -> dict:
        """Latest stock price in US dollars.

        Args:
            symbol: Ticker symbol.
        """
        if symbol.strip().upper() not in self.prices:
            raise ToolError(f"unknown symbol {symbol!r}")
        return {"symbol": symbol.strip().upper(), "price_usd": self.prices[symbol.strip().upper()]}

    def tool_get_exchange_rate(self, base: str, quote: str) -> dict:
        """Units of `quote` currency per 1 unit of `base` (supports USD and EUR).

        Args:
            base: Currency code, e.g. "USD".
            quote: Currency code, e.g. "EUR".
        """
        pair = (base.strip().upper(), quote.strip().upper())
        rates = {("USD", "EUR"): self.usd_eur, ("EUR", "USD"): round(1 / self.usd_eur, 4)}
        if pair not in rates:
            raise ToolError("only USD/EUR and EUR/USD are available")
        return {"base": pair[0], "quote": pair[1], "rate": rates[pair]}

    def tool_convert_units(self, value: float, from_unit: str, to_unit: str) -> dict:
        """Convert between units: C/F (temperature), km/mi (distance), kg/lb (mass).

        Args:
            value: The number to convert.
            from_unit: Source unit: C, F, km, mi, kg or lb.
            to_unit: Target unit.
        """
        table = {("c", "f"): lambda v: v * 9 / 5 + 32, ("f", "c"): lambda v: (v - 32) * 5 / 9,
                 ("km", "mi"): lambda v: v / 1.609344, ("mi", "km"): lambda v: v * 1.609344,
                 ("kg", "lb"): lambda v: v / 0.45359237, ("lb", "kg"): lambda v: v * 0.45359237}
        key = (from_unit.strip().lower(), to_unit.strip().lower())
        if key not in table:
            raise ToolError(f"cannot convert {from_unit} to {to_unit}")
        return {"value": round(table[key](value), 4), "unit": to_unit}

    def tool_search_contacts(self, name: str) -> list:
        """Find contacts whose name contains the query; returns email and phone.

        Args:
            name: Part of the contact's name.
        """
        query = name.strip().lower()
        return [{"name": n, **d} for n, d in self.directory.items() if query in n.lower()]

    def tool_send_email(self, to: str, subject: str, body: str) -> str:
        """Send an email.

        Args:
            to: Recipient email address.
            subject: Subject line.
            body: Message text.
        """
        self.outbox.append(("email", to.strip().lower(), subject + " " + body))
        return "email sent"

    def tool_send_sms(self, phone: str, message: str) -> str:
        """Send a text message.

        Args:
            phone: Recipient phone number.
            message: Message text.
        """
        self.outbox.append(("sms", phone.strip(), message))
        return "sms sent"

    def tool_set_reminder(self, text: str, when: str) -> str:
        """Create a reminder for the user.

        Args:
            text: What to be reminded of.
            when: When, e.g. "tomorrow 9:00".
        """
        self.side_effects.append(("reminder", text))
        return "reminder set"

    def tool_create_event(self, title: str, day: str, hour: int) -> str:
        """Add an event to the user's calendar.

        Args:
            title: Event title.
            day: Day of the event.
            hour: Start hour (0-23).
        """
        self.side_effects.append(("event", title))
        return "event created"

    def criteria(self) -> dict:
        info = self.directory[self.contact]
        address = info["email"] if self.channel == "email" else info["phone"]
        sent = [m for m in self.outbox if m[0] == self.channel and m[1] == address]
        found = [re.findall(r"-?[0-9]+(?:\.[0-9]+)?", m[2]) for m in sent]
        numbers = [float(x) for xs in found if len(xs) <= 3 for x in xs]  # no number spraying
        return {
            "sent_to_contact": bool(sent),
            "value_correct": any(abs(x - self.target) <= self.tolerance for x in numbers),
            "nothing_else_sent": len(self.outbox) == 1 and not self.side_effects,
        }

    def solution(self) -> list:
        info = self.directory[self.contact]
        value = f"{self.target:.1f}" if self.channel == "email" else f"{self.target:.2f}"
        if self.channel == "email":
            lookup = format_tool_call("get_weather", {"city": self.city})
            send = format_tool_call("send_email", {
                "to": info["email"], "subject": f"Temperature in {self.city}",
                "body": f"It is {value} F in {self.city} right now."})
        else:
            lookup = (format_tool_call("get_stock_quote", {"symbol": self.ticker})
                      + format_tool_call("get_exchange_rate", {"base": "USD", "quote": "EUR"}))
            send = format_tool_call("send_sms", {"phone": info["phone"],
                                                 "message": f"{self.ticker}: {value} EUR"})
        contact = format_tool_call("search_contacts", {"name": self.contact.split()[0]})
        return [lookup + contact, send, "<answer>done</answer>"]
