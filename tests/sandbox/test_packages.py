"""The sandbox's package allowlist (``spadekit.sandbox.packages.resolve``): import names and
distribution names resolve to the closure of what they require, a name that is not installed is
reported, and a requirement that is not installed costs no scan of every installed package."""

from __future__ import annotations

import pytest

from spadekit.sandbox import packages


@pytest.fixture
def fresh(monkeypatch):
    """``resolve`` and the import-name scan uncached, the scan counted."""
    calls = []
    real = packages._owners.__wrapped__

    def counted():
        calls.append(1)
        return real()

    packages.resolve.cache_clear()
    monkeypatch.setattr(packages, "_owners", counted)
    yield calls
    packages.resolve.cache_clear()


def test_the_default_allowlist_resolves_with_its_requirements_and_no_scan(fresh):
    found = packages.resolve(("numpy", "math_verify"))
    assert {"numpy", "math_verify", "sympy", "mpmath"} <= set(found.roots)
    assert not found.missing and fresh == []
    assert all(p.endswith(".dist-info") or "/" in p for p in found.paths)


def test_an_import_name_is_found_through_its_distribution(fresh):
    found = packages.resolve(("yaml",))  # PyYAML
    assert "yaml" in found.roots and not found.missing and len(fresh) == 1


def test_a_name_that_is_not_installed_is_reported(fresh):
    found = packages.resolve(("numpy", "no_such_package_here"))
    assert found.missing == ("no_such_package_here",) and "numpy" in found.roots


def test_a_requirement_that_is_not_installed_is_skipped_without_a_scan(fresh, monkeypatch):
    real = packages._requirements
    monkeypatch.setattr(packages, "_requirements",
                        lambda dist: real(dist) + ["not-installed-requirement"])
    found = packages.resolve(("numpy",))
    assert "numpy" in found.roots and not found.missing and fresh == []
