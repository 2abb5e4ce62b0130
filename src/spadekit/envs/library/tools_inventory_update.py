"""Inventory update: apply a batch of requested changes to a warehouse inventory.

The request names items, not SKUs, and states targets ("restock everything below 10 units to
exactly 25") rather than deltas, so the agent must list the inventory, read quantities, and then
modify the right records. Checks: low items restocked, price updated, discontinued item removed,
and every other item left untouched (credited only once something was changed).
"""

import random

from spadekit.envs.actions import format_tool_call
from spadekit.envs.tooluse import ToolEnv, ToolError

SKILL = "State_Modification"
SETTING = "tooluse"
HINT = (
    "Read the current state before writing: map names to SKUs, check every quantity against the "
    "threshold, compute each delta, and change nothing that was not requested."
)
TAGS = ["inventory", "crud", "state-tracking"]

NAMES = ["bolt", "washer", "hinge", "bracket", "spring", "gasket", "valve", "rivet", "clamp",
         "pulley", "sprocket", "bearing"]


class InventoryUpdateEnv(ToolEnv):
    """Restock, reprice and delist items in a small inventory."""

    def setup(self, rng: random.Random) -> str:
        self.threshold, self.level = rng.randint(8, 12), rng.choice([20, 25, 30])
        while True:
            names = rng.sample(NAMES, 7)
            skus = [f"SKU-{n}" for n in rng.sample(range(100, 1000), 7)]
            self.items = {s: {"name": n, "quantity": rng.randint(0, 40),
                              "price": round(rng.uniform(0.5, 20.0), 2)}
                          for s, n in zip(skus, names)}
            low = [s for s, it in self.items.items() if it["quantity"] < self.threshold]
            if 2 <= len(low) <= 3:
                break
        others = [s for s in skus if s not in low]
        self.reprice_sku, self.removed_sku = rng.sample(others, 2)
        factor = rng.choice([0.8, 1.1, 1.25])
        self.new_price = round(self.items[self.reprice_sku]["price"] * factor, 2)
        self.original = {s: dict(it) for s, it in self.items.items()}
        self.low = low
        return (f"Apply these inventory changes: (1) restock every item with fewer than "
                f"{self.threshold} units to exactly {self.level} units; (2) set the price of "
                f"'{self.items[self.reprice_sku]['name']}' to {self.new_price:.2f}; (3) remove "
                f"the discontinued item '{self.items[self.removed_sku]['name']}'. Leave everything "
                "else unchanged.")

    def _item(self, sku):
        item = self.items.get(sku.strip().upper())
        if item is None:
            raise ToolError(f"unknown SKU {sku!r}; use list_items to see SKUs")
        return item

    def tool_list_items(self) -> list:
        """List every SKU with its item name (no quantities or prices)."""
        return [{"sku": s, "name": it["name"]} for s, it in sorted(self.items.items())]

    def tool_get_item(self, sku: str) -> dict:
        """Quantity and price of one item.

        Args:
            sku: The item's SKU, e.g. "SKU-123".
        """
        return {"sku": sku.strip().upper(), **self._item(sku)}

    def tool_adjust_stock(self, sku: str, delta: int) -> dict:
        """Add (positive) or remove (negative) units of an item.

        Args:
            sku: The item's SKU.
            delta: Change in quantity; the result may not go below zero.
        """
        item = self._item(sku)
        if item["quantity"] + delta < 0:
            raise ToolError(f"only {item['quantity']} units in stock")
        item["quantity"] += delta
        return {"sku": sku.strip().upper(), "quantity": item["quantity"]}

    def tool_set_price(self, sku: str, price: float) -> dict:
        """Set the unit price of an item.

        Args:
            sku: The item's SKU.
            price: New price, greater than zero.
        """
        if price <= 0:
            raise ToolError("price must be positive")
        item = self._item(sku)
        item["price"] = round(price, 2)
        return {"sku": sku.strip().upper(), "price": item["price"]}

    def tool_remove_item(self, sku: str) -> str:
        """Delete an item from the inventory.

        Args:
            sku: The item's SKU.
        """
        self._item(sku)
        del self.items[sku.strip().upper()]
        return f"removed {sku.strip().upper()}"

    def criteria(self) -> dict:
        touched = self.low + [self.reprice_sku, self.removed_sku]
        untouched = [s for s in self.original if s not in touched]
        repriced = self.items.get(self.reprice_sku)
        return {
            "low_items_restocked": all(s in self.items and self.items[s]["quantity"] == self.level
                                       for s in self.low),
            "price_updated": repriced is not None
            and abs(repriced["price"] - self.new_price) < 0.005
            and repriced["quantity"] == self.original[self.reprice_sku]["quantity"],
            "discontinued_removed": self.removed_sku not in self.items,
            # not credited for doing nothing at all
            "others_untouched": self.items != self.original
            and all(self.items.get(s) == self.original[s] for s in untouched),
        }

    def solution(self) -> list:
        reads = "".join(format_tool_call("get_item", {"sku": s}) for s in sorted(self.original))
        writes = [format_tool_call("adjust_stock",
                                   {"sku": s, "delta": self.level - self.original[s]["quantity"]})
                  for s in self.low]
        writes.append(format_tool_call("set_price",
                                       {"sku": self.reprice_sku, "price": self.new_price}))
        writes.append(format_tool_call("remove_item", {"sku": self.removed_sku}))
        return [format_tool_call("list_items", {}), reads, "".join(writes), "<answer>done</answer>"]
