"""Rules for free text people type into names and references."""

import unicodedata

# Control and format characters, line and paragraph separators: exports, statements and tables
# would show them (QA: a newline in an invoice reference was accepted).
UNPRINTABLE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})


def has_control_characters(text: str) -> bool:
    return any(unicodedata.category(char) in UNPRINTABLE_CATEGORIES for char in text)
