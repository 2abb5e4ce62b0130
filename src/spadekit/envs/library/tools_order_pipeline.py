"""Order pipeline: take one order through reservation, payment, shipment and confirmation.

Each stage needs the previous one (payment needs every line reserved, shipment needs payment,
confirmation needs shipment). Stock is split over two warehouses and one line only fits in one
of them; the charge must be the order total after the customer's tier discount plus shipping.
Checks: lines reserved, correct amount charged, shipment created, confirmation sent.
"""

import random

from spadekit.envs.actions import format_tool_call
from spadekit.envs.tooluse import ToolEnv, ToolError

SKILL = "Multi-Step_Workflows"
SETTING = "tooluse"
HINT = (
    "Gather everything first (order lines, customer discount, stock per warehouse), compute the "
    "total once, then run the stages strictly in order: reserve, charge, ship, confirm."
)
TAGS = ["order-processing", "dependencies", "arithmetic"]

PRODUCTS = {"MUG": 8.5, "LAMP": 34.0, "DESK": 189.0, "CHAIR": 92.75, "PLANT": 14.2, "RUG": 61.3}
TIERS = {"standard": 0, "silver": 5, "gold": 10}
WAREHOUSES = ["north", "south"]


class OrderPipelineEnv(ToolEnv):
    """Process one customer order end to end."""

    def setup(self, rng: random.Random) -> str:
        self.order_id = f"ORD-{rng.randint(1000, 9999)}"
        self.customer_id = f"C-{rng.randint(100, 999)}"
        skus = rng.sample(sorted(PRODUCTS), rng.randint(2, 3))
        self.lines = {sku: rng.randint(1, 4) for sku in skus}
        self.tier, self.shipping = rng.choice(sorted(TIERS)), rng.choice([4.99, 9.5, 12.0])
        self.stock = {}
        tight = rng.choice(sorted(self.lines))  # this line fits in only one warehouse
        for sku, qty in self.lines.items():
            full, other = rng.sample(WAREHOUSES, 2)
            short = rng.randint(0, qty - 1) if sku == tight else qty + rng.randint(0, 5)
            self.stock[sku] = {full: qty + rng.randint(0, 6), other: short}
        self.initial_stock = {sku: dict(units) for sku, units in self.stock.items()}
        subtotal = sum(PRODUCTS[s] * q for s, q in self.lines.items())
        self.total = round(subtotal * (100 - TIERS[self.tier]) / 100 + self.shipping, 2)
        self.reserved, self.charged, self.shipment, self.confirmed = {}, None, None, False
        return (f"Process order {self.order_id}: reserve stock for every line, charge the customer "
                "the order total (subtotal minus their tier discount, plus shipping), create the "
                "shipment and send the confirmation.")

    def _order(self, order_id):
        if order_id.strip().upper() != self.order_id:
            raise ToolError(f"no order {order_id!r}")

    def tool_get_order(self, order_id: str) -> dict:
        """Order details: customer, lines with unit prices, shipping fee.

        Args:
            order_id: Order ID such as "ORD-1234".
        """
        self._order(order_id)
        lines = [{"sku": s, "quantity": q, "unit_price": PRODUCTS[s]}
                 for s, q in self.lines.items()]
        return {"order_id": self.order_id, "customer_id": self.customer_id, "lines": lines,
                "shipping_fee": self.shipping}

    def tool_get_customer(self, customer_id: str) -> dict:
        """Customer profile including loyalty tier and its discount on the subtotal.

        Args:
            customer_id: Customer ID such as "C-123".
        """
        if customer_id.strip().upper() != self.customer_id:
            raise ToolError(f"no customer {customer_id!r}")
        return {"customer_id": self.customer_id, "tier": self.tier,
                "discount_percent": TIERS[self.tier]}

    def tool_check_stock(self, sku: str) -> dict:
        """Units available per warehouse for a product.

        Args:
            sku: Product SKU, e.g. "MUG".
        """
        if sku.strip().upper() not in self.stock:
            raise ToolError(f"unknown or irrelevant SKU {sku!r}")
        return {"sku": sku.strip().upper(), "available": dict(self.stock[sku.strip().upper()])}

    def tool_reserve_stock(self, sku: str, quantity: int, warehouse: str) -> dict:
        """Reserve units of one order line in one warehouse.

        Args:
            sku: Product SKU.
            quantity: Units to reserve (the line's full quantity).
            warehouse: "north" or "south".
        """
        sku, warehouse = sku.strip().upper(), warehouse.strip().lower()
        if sku not in self.lines:
            raise ToolError(f"{sku!r} is not on this order")
        if warehouse not in WAREHOUSES:
            raise ToolError("warehouse must be 'north' or 'south'")
        if quantity != self.lines[sku] or sku in self.reserved:
            raise ToolError(f"reserve the line quantity ({self.lines[sku]}) exactly once")
        if self.stock[sku][warehouse] < quantity:
            raise ToolError(f"only {self.stock[sku][warehouse]} units of {sku} in {warehouse}")
        self.stock[sku][warehouse] -= quantity
        self.reserved[sku] = warehouse
        return {"sku": sku, "reserved": quantity, "warehouse": warehouse}

    def tool_charge_payment(self, order_id: str, amount: float) -> dict:
        """Charge the customer's card once for the order (needs all lines reserved).

        Args:
            order_id: Order ID.
            amount: Amount to charge.
        """
        self._order(order_id)
        if set(self.reserved) != set(self.lines):
            raise ToolError("reserve stock for every line before charging")
        if self.charged is not None:
            raise ToolError("order already charged")
        self.charged = round(amount, 2)
        return {"order_id": self.order_id, "charged": self.charged}

    def tool_create_shipment(self, order_id: str) -> dict:
        """Create the shipment for a paid order.

        Args:
            order_id: Order ID.
        """
        self._order(order_id)
        if self.charged is None:
            raise ToolError("order is not paid yet")
        self.shipment = f"SHP-{self.order_id[4:]}"
        return {"order_id": self.order_id, "shipment_id": self.shipment}

    def tool_send_confirmation(self, order_id: str) -> str:
        """Email the order confirmation (needs a shipment).

        Args:
            order_id: Order ID.
        """
        self._order(order_id)
        if self.shipment is None:
            raise ToolError("create the shipment first")
        self.confirmed = True
        return "confirmation sent"

    def criteria(self) -> dict:
        return {
            "lines_reserved": set(self.reserved) == set(self.lines),
            # within a cent: hand rounding of half-cent totals may differ from float rounding
            "correct_charge": self.charged is not None and abs(self.charged - self.total) <= 0.0101,
            "shipment_created": self.shipment is not None,
            "confirmation_sent": self.confirmed,
        }

    def solution(self) -> list:
        oid = {"order_id": self.order_id}
        look = format_tool_call("get_customer", {"customer_id": self.customer_id}) + "".join(
            format_tool_call("check_stock", {"sku": s}) for s in self.lines)
        reserve = ""
        for sku, qty in self.lines.items():
            warehouse = next(w for w in WAREHOUSES if self.initial_stock[sku][w] >= qty)
            reserve += format_tool_call("reserve_stock",
                                        {"sku": sku, "quantity": qty, "warehouse": warehouse})
        return [format_tool_call("get_order", oid), look, reserve,
                format_tool_call("charge_payment", {**oid, "amount": self.total}),
                format_tool_call("create_shipment", oid)
                + format_tool_call("send_confirmation", oid),
                "<answer>done</answer>"]
