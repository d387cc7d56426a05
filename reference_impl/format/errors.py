"""Errors of the program format's containers: compile specs, processed blobs and program files.

Every error is a ``LoweringFormatError`` (a ``ValueError``, the suite's *invalid-argument* error), so a caller
can catch one class for "this input is not acceptable" and never sees ``struct.error``, ``KeyError``,
``json.JSONDecodeError`` or ``UnicodeDecodeError`` leaking out of a parser. Each message names what is wrong
and the rule it broke.
"""

from __future__ import annotations


class LoweringFormatError(ValueError):
    """Base class: a compile spec, blob or program file breaks a rule of its format."""


# --- method names and compile specs -------------------------------------------------------------------


class InvalidMethodNameError(LoweringFormatError):
    """A method name breaks a naming rule (empty, NUL, not UTF-8, too long, not a string)."""


class EmptyMethodNameError(InvalidMethodNameError):
    """A method name is the empty string."""


class MethodNameNulError(InvalidMethodNameError):
    """A method name contains a NUL character (C consumers would silently cut it there)."""


class MethodNameEncodingError(InvalidMethodNameError):
    """A method name is not valid UTF-8 (bytes that do not decode, or a str with lone surrogates)."""


class MethodNameTooLongError(InvalidMethodNameError):
    """A method name is longer than the limit in UTF-8 bytes."""


class MethodNameTypeError(InvalidMethodNameError, TypeError):
    """A method name (or a compile spec value) has the wrong Python type."""


class MissingMethodNameError(LoweringFormatError):
    """No ``method_name`` compile spec was given where one is required."""


class MethodNameMismatchError(LoweringFormatError):
    """Two sources of a method name disagree (compile spec, blob header, program manifest, caller)."""


class DuplicateMethodError(LoweringFormatError):
    """A program would hold two methods with the same name."""


class UnknownMethodError(LoweringFormatError, LookupError):
    """A program has no method of the requested name."""


class EmptyProgramError(LoweringFormatError):
    """A program needs at least one method."""


# --- container structure --------------------------------------------------------------------------------


class BadMagicError(LoweringFormatError):
    """The data does not start with the format's magic bytes: not a blob / program of this format."""


class UnsupportedFormatVersionError(LoweringFormatError):
    """The format version is not one this reader supports."""


class TruncatedError(LoweringFormatError):
    """The data ends before the structure it declares."""


class TruncatedBlobError(TruncatedError):
    """A processed blob ends before its header or artifact does."""


class TruncatedProgramError(TruncatedError):
    """A program file ends before its manifest or method blobs do."""


class TrailingDataError(LoweringFormatError):
    """Bytes follow the declared end of a blob or program (nothing may carry no meaning)."""


class MalformedHeaderError(LoweringFormatError):
    """A blob header is not valid UTF-8 JSON, or its fields break the schema."""


class MalformedManifestError(LoweringFormatError):
    """A program manifest is not valid UTF-8 JSON, or its fields break the schema."""


class TamperedError(LoweringFormatError):
    """Content does not match its recorded SHA-256: corrupted or tampered with."""


class HeaderChecksumError(TamperedError):
    """A blob header or program manifest does not match its own SHA-256 checksum."""


class ContentHashMismatchError(TamperedError):
    """An artifact or a method blob does not match the SHA-256 recorded for it."""


class ManifestMismatchError(LoweringFormatError):
    """A program manifest disagrees with a method blob's own header (device, torch or CUDA version)."""


# --- compatibility with the runtime -----------------------------------------------------------------------


class WrongTargetError(LoweringFormatError):
    """The artifact was built for another device type than the runtime's."""


class ToolchainMismatchError(LoweringFormatError):
    """The artifact was built with another torch version (major.minor) than the runtime's."""
