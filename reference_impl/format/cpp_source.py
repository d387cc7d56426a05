"""The generated C++ inside an AOTInductor package, read as text: comments and string literals blanked.

An AOTInductor package (the artifact a blob carries) holds the C++ its ``.so`` was compiled from. Two readers
look for calls in it: the lowering's fallback-kernel inventory (``lowering/fallback_kernels.py``: which
``aoti_torch_*`` kernels the program calls) and the native shim's router (``shims/native/routing.py``: how
many ``aoti_torch_cuda_mm_out`` call sites it patches). Both must skip commented-out code and names inside
strings in the same way, so the helpers live here, below both wings.
"""

from __future__ import annotations

import re

__all__ = ["strip_cpp_comments", "without_string_literals"]

_STRING_LITERAL = re.compile(r'"(?:[^"\\\n]|\\.)*"')


def strip_cpp_comments(text: str) -> str:
    """``text`` with ``//`` and ``/* */`` comments blanked; string and character literals are kept intact."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "/" and i + 1 < n and text[i + 1] == "/":
            j = text.find("\n", i)
            i = n if j < 0 else j  # keep the newline
        elif c == "/" and i + 1 < n and text[i + 1] == "*":
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
            out.append(" ")
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        elif c == "R" and text.startswith('R"', i):  # raw string: R"delim( ... )delim"
            open_paren = text.find("(", i + 2)
            if open_paren < 0:
                out.append(c)
                i += 1
                continue
            delim = text[i + 2 : open_paren]
            close = text.find(f'){delim}"', open_paren)
            end = n if close < 0 else close + len(delim) + 2
            out.append(text[i:end])
            i = end
        else:
            out.append(c)
            i += 1
    return "".join(out)


def without_string_literals(text: str) -> str:
    """``text`` with every one-line ``"..."`` literal emptied, so a name quoted in a string is no call."""
    return _STRING_LITERAL.sub('""', text)
