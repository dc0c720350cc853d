from .money import to_money


class InsufficientFunds(Exception):
    pass


class Account:
    def __init__(self, owner, opening_balance="0"):
        self.owner = owner
        self._balance = to_money(opening_balance)
        self.history = []

    @property
    def balance(self):
        return self._balance

    def _positive(self, amount):
        amount = to_money(amount)
        if amount <= 0:
            raise ValueError("amount must be positive")
        return amount

    def deposit(self, amount, memo="deposit"):
        amount = self._positive(amount)
        self._balance += amount
        self.history.append((memo, amount))
        return self._balance

    def withdraw(self, amount, memo="withdrawal"):
        amount = self._positive(amount)
        if amount > self._balance:
            raise InsufficientFunds(
                f"{self.owner} has {self._balance}, cannot withdraw {amount}"
            )
        self._balance -= amount
        self.history.append((memo, -amount))
        return self._balance

    def transfer(self, other, amount):
        """Move ``amount`` from this account to ``other``."""
        if other is self:
            raise ValueError("cannot transfer to the same account")
        other.deposit(amount, memo=f"transfer from {self.owner}")
        self.withdraw(amount, memo=f"transfer to {other.owner}")

    def statement(self):
        lines = [f"Statement for {self.owner}"]
        lines += [f"{memo:<30} {amount:>10}" for memo, amount in self.history]
        lines.append(f"{'balance':<30} {self._balance:>10}")
        return "\n".join(lines)
