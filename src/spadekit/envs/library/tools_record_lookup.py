"""Record lookup: search a generated employee directory and submit the one record that matches.

Search results are paginated and omit start years, so the agent must filter with the search tool,
open the candidate records one by one and compare them before submitting an employee ID. The
score counts three checks on the submitted record: right department, right city, earliest start.
"""

import random

from spadekit.envs.actions import format_tool_call
from spadekit.envs.tooluse import ToolEnv, ToolError

SKILL = "Data_Retrieval"
SETTING = "tooluse"
HINT = (
    "Narrow the search with both filters, read every page of results, then open each candidate "
    "record to compare the field the search results do not show."
)
TAGS = ["database-search", "pagination", "record-comparison"]

FIRST = ["Ada", "Ben", "Cleo", "Dev", "Esme", "Finn", "Gia", "Hugo", "Ines", "Jon", "Kira", "Leo"]
LAST = ["Ng", "Ortiz", "Park", "Quinn", "Rossi", "Sato", "Tran", "Uddin", "Vega", "Weber"]
DEPARTMENTS = ["Finance", "Legal", "Marketing", "Research", "Support"]
CITIES = ["Austin", "Berlin", "Chennai", "Toronto"]
PAGE_SIZE = 5


class RecordLookupEnv(ToolEnv):
    """Find the longest-serving employee of a department at one site."""

    def setup(self, rng: random.Random) -> str:
        while True:
            ids = rng.sample(range(100, 1000), 36)
            self.records = {
                f"E{i}": {"id": f"E{i}", "name": f"{rng.choice(FIRST)} {rng.choice(LAST)}",
                          "department": rng.choice(DEPARTMENTS), "city": rng.choice(CITIES),
                          "start_year": rng.randint(2004, 2023)}
                for i in ids}
            self.dept, self.city = rng.choice(DEPARTMENTS), rng.choice(CITIES)
            matches = self._matches(self.dept, self.city)
            years = sorted(r["start_year"] for r in matches)
            if 2 <= len(matches) <= 4 and years[0] < years[1]:
                break
        self.target = min(matches, key=lambda r: r["start_year"])["id"]
        self.submitted = None
        return (f"Find the employee in the {self.dept} department based in {self.city} who has "
                "been with the company longest (earliest start year), and submit their employee ID "
                "with submit_employee.")

    def _matches(self, department, city):
        return [r for r in sorted(self.records.values(), key=lambda r: r["id"])
                if (not department or r["department"].lower() == department.strip().lower())
                and (not city or r["city"].lower() == city.strip().lower())]

    def tool_search_employees(self, department: str | None = None, city: str | None = None,
                              page: int = 1) -> dict:
        """Search the directory; results show id, name, department and city only.

        Args:
            department: Filter by department name (optional).
            city: Filter by office city (optional).
            page: Results page, starting at 1 (5 results per page).
        """
        found = self._matches(department, city)
        pages = max(1, -(-len(found) // PAGE_SIZE))
        if not 1 <= page <= pages:
            raise ToolError(f"page must be between 1 and {pages}")
        rows = found[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]
        return {"total": len(found), "page": page, "pages": pages,
                "results": [{k: r[k] for k in ("id", "name", "department", "city")} for r in rows]}

    def tool_get_employee(self, employee_id: str) -> dict:
        """Full record of one employee, including start year.

        Args:
            employee_id: Employee ID such as "E123".
        """
        record = self.records.get(employee_id.strip().upper())
        if record is None:
            raise ToolError(f"no employee with id {employee_id!r}")
        return dict(record)

    def tool_submit_employee(self, employee_id: str) -> str:
        """Submit the ID of the employee you found (a later submission replaces an earlier one).

        Args:
            employee_id: Employee ID such as "E123".
        """
        key = employee_id.strip().upper()
        if key not in self.records:
            raise ToolError(f"no employee with id {employee_id!r}")
        self.submitted = key
        return f"submitted {key}"

    def criteria(self) -> dict:
        record = self.records.get(self.submitted or "")
        return {
            "right_department": record is not None and record["department"] == self.dept,
            "right_city": record is not None and record["city"] == self.city,
            "earliest_start": self.submitted == self.target,
        }

    def solution(self) -> list:
        matches = self._matches(self.dept, self.city)
        search = format_tool_call("search_employees", {"department": self.dept, "city": self.city})
        opens = "".join(format_tool_call("get_employee", {"employee_id": r["id"]}) for r in matches)
        submit = format_tool_call("submit_employee", {"employee_id": self.target})
        return [search, opens, submit + "\n<answer>done</answer>"]
