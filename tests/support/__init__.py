"""Helpers shared by the test folders, imported as tests.support.NAME."""
