"""siunitx quantities as printed: \\SI{9.81}{\\metre\\per\\second\\squared} -> "9.81 m/s²".

Why its own: the unit macros (\\metre, \\kilo...) are unknown to pylatexenc, so the converter
dropped them and a quantity lost its unit; this is the table and reader of units it uses.
"""

from __future__ import annotations

import re

# siunitx: \SI{3}{\metre\per\second} -> "3 m/s". Command -> (its {numbers}, whether a {unit}
# follows them); ranges join their numbers with "–". Options ([per-mode=symbol],
# [group-separator={,}]) are dropped: the numbers as written and units as symbols (m/s) read
# right whatever they ask for. Unit macros by name (a prefix joins the unit after it); literal
# units ({m/s}, {km.h^{-1}}) are kept as written.
SI_COMMANDS = {"SI": (1, True), "qty": (1, True), "si": (0, True), "unit": (0, True),
               "SIrange": (2, True), "qtyrange": (2, True), "num": (1, False), "tablenum": (1, False),
               "numrange": (2, False), "ang": (1, False), "numlist": (1, False), "SIlist": (1, True),
               "qtylist": (1, True)}
SI_LISTS = frozenset({"numlist", "SIlist", "qtylist"})  # {1;2;3}: "1, 2 and 3", the unit after each
ANGLE_MARKS = ("°", "′", "″")  # \ang{degrees;minutes;seconds}
SI_PREFIXES = {"yocto": "y", "zepto": "z", "atto": "a", "femto": "f", "pico": "p", "nano": "n",
               "micro": "µ", "milli": "m", "centi": "c", "deci": "d", "deca": "da", "deka": "da",
               "hecto": "h", "kilo": "k", "mega": "M", "giga": "G", "tera": "T", "peta": "P",
               "exa": "E", "zetta": "Z", "yotta": "Y"}
SI_UNITS = {"metre": "m", "meter": "m", "second": "s", "gram": "g", "kilogram": "kg",
            "ampere": "A", "kelvin": "K", "mole": "mol", "candela": "cd", "hertz": "Hz",
            "newton": "N", "pascal": "Pa", "joule": "J", "watt": "W", "coulomb": "C",
            "volt": "V", "farad": "F", "ohm": "Ω", "siemens": "S", "weber": "Wb", "tesla": "T",
            "henry": "H", "lumen": "lm", "lux": "lx", "becquerel": "Bq", "gray": "Gy",
            "sievert": "Sv", "katal": "kat", "degreeCelsius": "°C", "celsius": "°C",
            "radian": "rad", "steradian": "sr", "minute": "min", "hour": "h", "day": "d",
            "degree": "°", "arcminute": "′", "arcsecond": "″", "hectare": "ha", "litre": "L",
            "liter": "L", "tonne": "t", "electronvolt": "eV", "dalton": "Da", "atomicmassunit": "u",
            "astronomicalunit": "au", "bar": "bar", "angstrom": "Å", "barn": "b", "bel": "B",
            "decibel": "dB", "neper": "Np", "percent": "%", "byte": "B", "bit": "bit",
            "parsec": "pc", "lightyear": "ly", "gauss": "G", "erg": "erg", "mmHg": "mmHg",
            "m": "m", "s": "s", "g": "g", "kg": "kg", "Hz": "Hz", "K": "K", "J": "J", "W": "W",
            "V": "V", "A": "A", "N": "N", "eV": "eV", "cm": "cm", "mm": "mm", "km": "km",
            "nm": "nm", "um": "µm", "ms": "ms", "us": "µs", "ns": "ns", "ps": "ps", "kHz": "kHz",
            "MHz": "MHz", "GHz": "GHz", "THz": "THz", "mW": "mW", "kW": "kW", "MW": "MW",
            "mV": "mV", "kV": "kV", "mA": "mA", "uA": "µA", "meV": "meV", "keV": "keV",
            "MeV": "MeV", "GeV": "GeV", "TeV": "TeV", "L": "L", "mL": "mL", "mol": "mol"}
SI_POWERS = {"squared": "²", "cubed": "³", "square": "²", "cubic": "³"}  # after / before a unit
SI_TOKEN = re.compile(r"\\([a-zA-Z]+)|([^\\]+)")


def si_items(base: str, source: str, unit: str) -> str | None:
    """The text of a list's or angle's plain {a;b;c} argument (\\numlist, \\SIlist, \\ang), or
    None when it holds macros or groups (then it is converted as an ordinary number)."""
    if "\\" in source or "{" in source:
        return None
    items = [item.strip() for item in source.split(";")]
    if base == "ang":
        return "".join(item + mark for item, mark in zip(items, ANGLE_MARKS) if item)
    items = [f"{item} {unit}" if unit else item for item in items if item]
    return "".join(items) if len(items) < 2 else ", ".join(items[:-1]) + " and " + items[-1]


def si_unit(source: str) -> str:
    """A siunitx unit argument as printed: ``\\kilo\\metre\\per\\second\\squared`` -> "km/s²"."""
    parts: list[str] = []
    prefix = power = ""
    for m in SI_TOKEN.finditer(source):
        name, literal = m.groups()
        if literal is not None:
            if literal.strip():
                parts.append(literal.strip())
        elif name in SI_PREFIXES:
            prefix += SI_PREFIXES[name]
        elif name in ("squared", "cubed") and parts:
            parts[-1] += SI_POWERS[name]
        elif name in SI_POWERS:
            power = SI_POWERS[name]
        elif name == "per":
            parts.append("/")
        elif name in SI_UNITS:
            parts.append(prefix + SI_UNITS[name] + power)
            prefix = power = ""
    return re.sub(r"\s*/\s*", "/", " ".join(parts))
