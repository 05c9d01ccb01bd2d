"""Test target with a syntax error on line 4."""


def build_model(:
    pass
