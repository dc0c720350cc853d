from decimal import Decimal

import pytest

from ledgerly import Account, InsufficientFunds


def test_deposit_and_withdraw():
    acct = Account("alice")
    acct.deposit("100")
    acct.withdraw("30.25")
    assert acct.balance == Decimal("69.75")
    assert acct.history == [("deposit", Decimal("100.00")), ("withdrawal", Decimal("-30.25"))]


def test_amounts_are_rounded_to_cents():
    acct = Account("alice", "0.005")
    assert acct.balance == Decimal("0.01")
    with pytest.raises(TypeError):
        acct.deposit(1.5)


def test_cannot_overdraw():
    acct = Account("alice", "10")
    with pytest.raises(InsufficientFunds):
        acct.withdraw("10.01")
    assert acct.balance == Decimal("10.00")


def test_non_positive_amounts_rejected():
    acct = Account("alice", "10")
    with pytest.raises(ValueError):
        acct.deposit("0")
    with pytest.raises(ValueError):
        acct.withdraw("-5")


def test_transfer():
    alice, bob = Account("alice", "100"), Account("bob")
    alice.transfer(bob, "25.50")
    assert alice.balance == Decimal("74.50")
    assert bob.balance == Decimal("25.50")
    assert bob.history == [("transfer from alice", Decimal("25.50"))]


def test_statement():
    acct = Account("bob", "5")
    acct.deposit("2")
    text = acct.statement()
    assert text.splitlines()[0] == "Statement for bob"
    assert text.splitlines()[-1].split() == ["balance", "7.00"]
