"""Alert annotations expanded as Prometheus expands them, for the promtool cases' expected
annotations: the constructs the rules use (`$labels.x`; `if $labels.x` or `if eq $labels.x "v"`,
`else`, `end`; `$value` plain, `humanize`, `humanize1024`, `humanizePercentage`) and nothing else
(anything else is an error, so a new construct comes here with its cases)."""

from __future__ import annotations

import math
import re


def _go_float(value: float) -> str:
    """`{{ $value }}` as Go's text/template prints a float64 (%v: shortest, exponent from 1e21)."""
    if value == int(value) and abs(value) < 1e21:
        return str(int(value))
    return repr(value)


def _humanize(value: float, base: int, prefixes: tuple[str, ...]) -> str:
    """Prometheus's `humanize` (base 1000) and `humanize1024` (base 1024) for values >= 1."""
    if value == 0 or math.isnan(value) or math.isinf(value) or abs(value) < 1:
        return f"{value:.4g}"
    for prefix in prefixes[:-1]:
        if abs(value) < base:
            return f"{value:.4g}{prefix}"
        value /= base
    return f"{value:.4g}{prefixes[-1]}"


def expand(template: str, labels: dict[str, str], value: float) -> str:
    """The alert templates the mixin uses, expanded as Prometheus expands them."""

    def conditional(m: re.Match[str]) -> str:
        name, wanted, then, otherwise = m.group(1, 2, 3, 4)
        value = labels.get(name, "")
        holds = value == wanted if wanted is not None else bool(value)
        return then if holds else (otherwise or "")

    # Innermost conditionals first (a body without another `if`), until none is left: they nest.
    # `if $labels.x` holds when the label is not empty, `if eq $labels.x "v"` when it is v.
    body = r"((?:(?!\{\{ if ).)*?)"
    condition = r'\{\{ if (?:eq )?\$labels\.(\w+)(?: "([^"]*)")? \}\}'
    innermost = re.compile(condition + body + r"(?:\{\{ else \}\}" + body + r")?\{\{ end \}\}", re.S)
    text = template
    while (expanded := innermost.sub(conditional, text)) != text:
        text = expanded
    text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), text)
    text = text.replace("{{ $value | humanize }}", _humanize(value, 1000, ("", "k", "M", "G", "T", "P")))
    text = text.replace(
        "{{ $value | humanize1024 }}", _humanize(value, 1024, ("", "ki", "Mi", "Gi", "Ti", "Pi"))
    )
    text = text.replace("{{ $value | humanizePercentage }}", f"{value * 100:.4g}%")
    text = text.replace("{{ $value }}", _go_float(value))
    if "{{" in text:
        raise ValueError(f"a template construct the cases cannot expand: {text}")
    return text
