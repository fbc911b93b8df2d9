"""Alert annotations expanded as Prometheus expands them, for the promtool cases' expected
annotations: the constructs the rules use (`$labels.x`; `if $labels.x` or `if eq $labels.x "v"`,
`else`, `end`; `$value` plain, `humanize`, `humanize1024`, `humanizePercentage`; a recording rule
quoted with `lib.quote`, whose value the case gives) and nothing else (anything else is an error,
so a new construct comes here with its cases)."""

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


def expand(
    template: str, labels: dict[str, str], value: float, quoted: dict[str, float] | None = None
) -> str:
    """The alert templates the mixin uses, expanded as Prometheus expands them. `quoted` holds the
    value each recording rule quoted with `lib.quote` returns for the alert (absent: no result)."""
    found = quoted or {}

    def conditional(m: re.Match[str]) -> str:
        name, wanted, then, otherwise = m.group(1, 2, 3, 4)
        value = labels.get(name, "")
        holds = value == wanted if wanted is not None else bool(value)
        return then if holds else (otherwise or "")

    def query(m: re.Match[str]) -> str:
        record, then, otherwise = m.group(1, 2, 3)
        if record not in found:
            return otherwise or ""
        return VALUE.sub(lambda v: v.group(1) % found[record], then)

    # Innermost blocks first (a body without another `if` or `with`), until none is left: they
    # nest. `if $labels.x` holds when the label is not empty, `if eq $labels.x "v"` when it is v;
    # `with printf \`record{...}\` ... | query` when the query returns a series.
    body = r"((?:(?!\{\{ (?:if|with) ).)*?)"
    tail = r"(?:\{\{ else \}\}" + body + r")?\{\{ end \}\}"
    condition = re.compile(r'\{\{ if (?:eq )?\$labels\.(\w+)(?: "([^"]*)")? \}\}' + body + tail, re.S)
    with_query = re.compile(
        r"\{\{ with printf `([a-z_:]+)\{[^`]*\}`(?: \$labels\.\w+)* \| query \}\}" + body + tail, re.S
    )
    text = template
    while True:
        expanded = condition.sub(conditional, with_query.sub(query, text))
        if expanded == text:
            break
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


# A quoted series' value, printed with a Go format (printf's %.2f is Python's).
VALUE = re.compile(r'\{\{ \. \| first \| value \| printf "(%\.\d+f)" \}\}')
