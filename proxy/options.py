"""Click parameter types the commands share."""

from __future__ import annotations

import math

import click


class Finite(click.FloatRange):
    """A number within a range, and finite: click's FloatRange takes `inf` and `nan`
    (a NaN is in every range), which then fail far from the command line."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number
