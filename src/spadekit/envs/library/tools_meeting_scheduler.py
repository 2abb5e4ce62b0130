"""Meeting scheduler: combine a weather API and calendar API to book an outdoor meeting.

The agent must find a weekday on which it does not rain in the target city and an hour at which
every attendee is free, then book it. Forecasts and calendars are hidden behind the tools; the
score is the fraction of booking checks that hold (booked, right city and people, dry day,
everyone free).
"""

import random

from spadekit.envs.actions import format_tool_call
from spadekit.envs.tooluse import ToolEnv, ToolError

SKILL = "API_Orchestration"
SETTING = "tooluse"
HINT = (
    "Query the forecast for every candidate day first, then check each attendee's calendar only "
    "on the dry days, and book an hour that is free for everyone."
)
TAGS = ["weather-api", "calendar-api", "scheduling"]

DAYS = ["Mon", "Tue", "Wed", "Thu", "Fri"]
HOURS = list(range(9, 17))
CITIES = ["Lisbon", "Oslo", "Denver", "Osaka", "Nairobi", "Lima", "Dublin", "Perth"]
PEOPLE = ["Ana", "Bo", "Chen", "Dara", "Eli", "Farah", "Gus", "Hana"]
WET = ("rain", "storm")


def _day(day):
    key = day.strip()[:3].title()
    if key not in DAYS:
        raise ToolError(f"unknown day {day!r}; use one of {', '.join(DAYS)}")
    return key


class MeetingSchedulerEnv(ToolEnv):
    """Book a dry-weather meeting slot free for all attendees."""

    def setup(self, rng: random.Random) -> str:
        self.city = rng.choice(CITIES)
        self.people = rng.sample(PEOPLE, 3)
        self.salt = rng.randrange(10**9)
        while True:
            self.weather = {d: rng.choice(["sunny", "cloudy", "rain", "storm"]) for d in DAYS}
            self.busy = {p: {d: sorted(rng.sample(HOURS, rng.randint(3, 6))) for d in DAYS}
                         for p in self.people}
            if self._valid_slots() and any(w in WET for w in self.weather.values()):
                break
        self.booking = None
        names = ", ".join(self.people)
        return (f"Book a one-hour outdoor meeting for {names} in {self.city} this week "
                f"(Mon-Fri), starting on the hour between 9 and 16. It must not rain or storm in "
                f"{self.city} that day, and every attendee must be free at that hour. Book it "
                "with book_meeting.")

    def _valid_slots(self):
        return [(d, h) for d in DAYS if self.weather[d] not in WET for h in HOURS
                if all(h not in self.busy[p][d] for p in self.people)]

    def tool_get_forecast(self, city: str, day: str) -> dict:
        """Weather forecast for a city on a weekday.

        Args:
            city: City name, e.g. "Oslo".
            day: Weekday, one of Mon, Tue, Wed, Thu, Fri.
        """
        day = _day(day)
        if city.strip().lower() == self.city.lower():
            condition = self.weather[day]
        else:  # other cities get stable but irrelevant weather
            condition = random.Random(f"{self.salt}:{city.lower()}:{day}").choice(["sunny", "rain"])
        return {"city": city, "day": day, "condition": condition}

    def tool_get_calendar(self, person: str, day: str) -> dict:
        """Busy hours (meeting start times 9-16) of a person on a weekday.

        Args:
            person: The attendee's name.
            day: Weekday, one of Mon, Tue, Wed, Thu, Fri.
        """
        match = [p for p in self.people if p.lower() == person.strip().lower()]
        if not match:
            raise ToolError(f"no calendar for {person!r}")
        return {"person": match[0], "day": _day(day), "busy_hours": self.busy[match[0]][_day(day)]}

    def tool_book_meeting(self, day: str, hour: int, city: str, attendees: list[str]) -> dict:
        """Book the meeting (replaces any earlier booking).

        Args:
            day: Weekday, one of Mon, Tue, Wed, Thu, Fri.
            hour: Start hour, 9-16.
            city: City where the meeting takes place.
            attendees: Names of everyone attending.
        """
        if hour not in HOURS:
            raise ToolError("hour must be between 9 and 16")
        replaced = self.booking is not None
        self.booking = {"day": _day(day), "hour": hour, "city": city.strip(),
                        "attendees": sorted(a.strip().lower() for a in attendees)}
        return {"status": "booked", "replaced_previous": replaced, **self.booking}

    def criteria(self) -> dict:
        b = self.booking
        return {
            "booked": b is not None,
            "right_city_and_people": b is not None and b["city"].lower() == self.city.lower()
            and b["attendees"] == sorted(p.lower() for p in self.people),
            "dry_day": b is not None and self.weather[b["day"]] not in WET,
            "everyone_free": b is not None
            and all(b["hour"] not in self.busy[p][b["day"]] for p in self.people),
        }

    def solution(self) -> list:
        day, hour = self._valid_slots()[0]
        forecasts = "".join(format_tool_call("get_forecast", {"city": self.city, "day": d})
                            for d in DAYS)
        calendars = "".join(format_tool_call("get_calendar", {"person": p, "day": day})
                            for p in self.people)
        book = format_tool_call("book_meeting", {"day": day, "hour": hour, "city": self.city,
                                                 "attendees": self.people})
        return [forecasts, calendars, book, "<answer>done</answer>"]
