"""Helpers shared by the test packages (harnesses, fakes, fixtures' support data)."""
